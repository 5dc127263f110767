//! RGB8 tiles to `f32` channel-first tensors: transformers' `rescale` then `normalize`, in the
//! dtypes numpy uses, so each value has the same bits.
//!
//! numpy's steps, per value `u` of channel `c`: `rescale` computes `f32(f64(u) * factor)`;
//! `normalize` computes `(x - f32(mean[c])) / f32(std[c])` in `f32` (on `f32(u)` when there was
//! no rescale). A value depends only on `u` and `c`, so the 3 x 256 results are computed once
//! into a table.

use crate::rgb::RgbImage;

/// Rescale and normalize settings, as in an HF image processor config.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Normalization {
    /// `rescale_factor` when `do_rescale`.
    pub rescale: Option<f64>,
    /// `(image_mean, image_std)` when `do_normalize`.
    pub mean_std: Option<([f64; 3], [f64; 3])>,
}

impl Normalization {
    /// The value of each byte in each channel.
    pub fn table(&self) -> [[f32; 256]; 3] {
        let mut table = [[0f32; 256]; 3];
        for (c, channel) in table.iter_mut().enumerate() {
            for (u, out) in channel.iter_mut().enumerate() {
                let mut x = match self.rescale {
                    Some(factor) => (u as f64 * factor) as f32,
                    None => u as f32,
                };
                if let Some((mean, std)) = self.mean_std {
                    x = (x - mean[c] as f32) / std[c] as f32;
                }
                *out = x;
            }
        }
        table
    }
}

/// Appends `image` to `out` as `[3, height, width]` values from `table`, padded with zeros on
/// the bottom and right to `height x width` (transformers pads after normalizing, with 0).
pub(crate) fn push_chw(image: &RgbImage, table: &[[f32; 256]; 3], height: usize, width: usize, out: &mut Vec<f32>) {
    assert!(image.height() <= height && image.width() <= width, "padding smaller than the image");
    let start = out.len();
    out.resize(start + 3 * height * width, 0.0);
    let (w, px) = (image.width(), image.pixels());
    for (c, lut) in table.iter().enumerate() {
        let plane = &mut out[start + c * height * width..start + (c + 1) * height * width];
        for (y, row) in px.chunks_exact(w * 3).enumerate() {
            for (o, p) in plane[y * width..y * width + w].iter_mut().zip(row.chunks_exact(3)) {
                *o = lut[usize::from(p[c])];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_follows_numpy_dtypes() {
        let n = Normalization { rescale: Some(1.0 / 255.0), mean_std: Some(([0.5; 3], [0.5; 3])) };
        let t = n.table();
        assert_eq!(t[0][0], -1.0);
        assert_eq!(t[0][255], 1.0);
        // numpy: (np.float32(np.float64(128) / 255) - np.float32(0.5)) / np.float32(0.5)
        assert_eq!(t[1][128].to_bits(), 0x3b80_8100);
        let raw = Normalization { rescale: None, mean_std: None }.table();
        assert_eq!(raw[2][7], 7.0);
    }

    #[test]
    fn push_chw_pads_bottom_right_with_zeros() {
        let img = RgbImage::new(1, 1, vec![1, 2, 3]).unwrap();
        let t = Normalization { rescale: None, mean_std: None }.table();
        let mut out = vec![];
        push_chw(&img, &t, 1, 2, &mut out);
        assert_eq!(out, [1.0, 0.0, 2.0, 0.0, 3.0, 0.0]);
    }
}
