//! `RgbImage`: an 8-bit RGB image, rows top to bottom, pixels interleaved (`R G B R G B ...`).
//!
//! Invariant: `pixels.len() == width * height * 3` and both sides are at least 1; every
//! constructor checks it, so the rest of the crate indexes without checks of its own.

use lmplex_core::{Error, Result};

/// An 8-bit RGB image in row-major, channel-last order (what `np.array(pil_image)` holds).
#[derive(Clone, PartialEq, Eq)]
pub struct RgbImage {
    width: usize,
    height: usize,
    pixels: Vec<u8>,
}

impl RgbImage {
    /// An image from interleaved RGB bytes, `width * height * 3` of them.
    ///
    /// Errors with `InvalidRequest` when a side is 0 or the length does not match.
    pub fn new(width: usize, height: usize, pixels: Vec<u8>) -> Result<Self> {
        if width == 0 || height == 0 {
            return Err(Error::InvalidRequest(format!("image is {width}x{height}: both sides must be at least 1")));
        }
        let want = width.checked_mul(height).and_then(|n| n.checked_mul(3));
        if want != Some(pixels.len()) {
            return Err(Error::InvalidRequest(format!(
                "a {width}x{height} RGB image needs {} bytes, got {}",
                want.map_or_else(|| "too many".to_string(), |n| n.to_string()),
                pixels.len()
            )));
        }
        Ok(Self { width, height, pixels })
    }

    /// An image whose sides and length the caller has already checked.
    pub(crate) fn from_parts(width: usize, height: usize, pixels: Vec<u8>) -> Self {
        debug_assert!(width > 0 && height > 0 && pixels.len() == width * height * 3);
        Self { width, height, pixels }
    }

    /// Width in pixels.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Height in pixels.
    pub fn height(&self) -> usize {
        self.height
    }

    /// The interleaved RGB bytes, row after row.
    pub fn pixels(&self) -> &[u8] {
        &self.pixels
    }

    /// The bytes, consuming the image.
    pub fn into_pixels(self) -> Vec<u8> {
        self.pixels
    }

    /// The `width x height` region whose top-left corner is `(x, y)`; it must lie inside.
    pub(crate) fn crop(&self, x: usize, y: usize, width: usize, height: usize) -> Self {
        assert!(x + width <= self.width && y + height <= self.height, "crop outside the image");
        let mut pixels = Vec::with_capacity(width * height * 3);
        for row in y..y + height {
            let start = (row * self.width + x) * 3;
            pixels.extend_from_slice(&self.pixels[start..start + width * 3]);
        }
        Self::from_parts(width, height, pixels)
    }
}

impl std::fmt::Debug for RgbImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RgbImage({}x{})", self.width, self.height)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_checks_sides_and_length() {
        assert!(RgbImage::new(2, 1, vec![0; 6]).is_ok());
        assert!(matches!(RgbImage::new(2, 1, vec![0; 5]), Err(Error::InvalidRequest(_))));
        assert!(matches!(RgbImage::new(0, 1, vec![]), Err(Error::InvalidRequest(_))));
    }

    #[test]
    fn crop_takes_the_region() {
        let img = RgbImage::new(3, 2, (0..18).collect()).unwrap();
        let c = img.crop(1, 1, 2, 1);
        assert_eq!((c.width(), c.height()), (2, 1));
        assert_eq!(c.pixels(), &[12, 13, 14, 15, 16, 17]);
    }
}
