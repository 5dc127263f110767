//! Pillow's `Image.resize` for 8-bit RGB images, ported from `src/libImaging/Resample.c`.
//!
//! The same steps in the same order as Pillow (`ImagingResampleInner`), so the bytes are the
//! same:
//! 1. per output pixel of each axis, `precompute_coeffs`: the source window `[xmin, xmin + n)`
//!    (support = filter support x max(1, scale), rounded by C's `(int)(v + 0.5)`) and the
//!    filter's weights, in `f64`, divided by their sum;
//! 2. the weights turned into fixed point with `PRECISION_BITS = 32 - 8 - 2 = 22`, rounded half
//!    away from zero;
//! 3. two passes, each only when its side changes: horizontal first (over just the source rows
//!    the vertical pass will read), unless the height shrinks by more than twice as many
//!    pixels as the width (Pillow 13); each output value is `clip8((1 << 21) + sum(pixel *
//!    weight))`, i.e. `clamp(sum >> 22, 0, 255)`, on `i32`, rounded to 8 bits between passes.
//!
//! Pillow's `resize` of an image to its own size is a copy, and so is ours. NEAREST is a
//! different code path in Pillow (an affine transform) and is not ported. Sizes are exact up
//! to 2^24 pixels a side (Pillow's box is `float`).

use crate::rgb::RgbImage;

/// Pillow's resampling filters that go through `ImagingResample` (`PIL.Image.Resampling`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    /// `LANCZOS` (1): windowed sinc, a = 3.
    Lanczos,
    /// `BILINEAR` (2): triangle, support 1.
    Bilinear,
    /// `BICUBIC` (3): Keys cubic, a = -0.5, support 2.
    Bicubic,
    /// `BOX` (4): support 0.5.
    Box,
    /// `HAMMING` (5): Hamming-windowed sinc, support 1.
    Hamming,
}

impl Filter {
    /// The filter for Pillow's integer code (`resample` in HF's image processor configs);
    /// `None` for NEAREST (0) and unknown codes.
    pub fn from_pil(code: i64) -> Option<Self> {
        match code {
            1 => Some(Self::Lanczos),
            2 => Some(Self::Bilinear),
            3 => Some(Self::Bicubic),
            4 => Some(Self::Box),
            5 => Some(Self::Hamming),
            _ => None,
        }
    }

    fn support(self) -> f64 {
        match self {
            Self::Box => 0.5,
            Self::Bilinear | Self::Hamming => 1.0,
            Self::Bicubic => 2.0,
            Self::Lanczos => 3.0,
        }
    }

    /// The filter at `x`, written as Pillow's C functions are (same operations, same order).
    fn weight(self, x: f64) -> f64 {
        match self {
            Self::Box => {
                if x > -0.5 && x <= 0.5 {
                    1.0
                } else {
                    0.0
                }
            }
            Self::Bilinear => {
                let x = x.abs();
                if x < 1.0 {
                    1.0 - x
                } else {
                    0.0
                }
            }
            Self::Hamming => {
                let x = x.abs();
                if x == 0.0 {
                    1.0
                } else if x >= 1.0 {
                    0.0
                } else {
                    let x = x * std::f64::consts::PI;
                    // Pillow writes `0.54f + 0.46f * cos(x)`: float constants, double maths.
                    x.sin() / x * (f64::from(0.54f32) + f64::from(0.46f32) * x.cos())
                }
            }
            Self::Bicubic => {
                const A: f64 = -0.5;
                let x = x.abs();
                if x < 1.0 {
                    ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    (((x - 5.0) * x + 8.0) * x - 4.0) * A
                } else {
                    0.0
                }
            }
            Self::Lanczos => {
                if (-3.0..3.0).contains(&x) {
                    sinc(x) * sinc(x / 3.0)
                } else {
                    0.0
                }
            }
        }
    }
}

fn sinc(x: f64) -> f64 {
    if x == 0.0 {
        return 1.0;
    }
    let x = x * std::f64::consts::PI;
    x.sin() / x
}

const PRECISION_BITS: u32 = 32 - 8 - 2;

/// One axis' windows and fixed-point weights (`bounds` and `kk` in Pillow).
struct Coeffs {
    /// Weights per output pixel (the longest window).
    ksize: usize,
    /// Per output pixel: first source index and number of source pixels.
    bounds: Vec<(usize, usize)>,
    /// `ksize` weights per output pixel, the unused ones 0.
    kk: Vec<i32>,
}

impl Coeffs {
    /// `precompute_coeffs` followed by `normalize_coeffs_8bpc`, for the box `[0, in_size)`.
    fn new(in_size: usize, out_size: usize, filter: Filter) -> Self {
        let scale = in_size as f64 / out_size as f64;
        let filterscale = scale.max(1.0);
        let support = filter.support() * filterscale;
        let ksize = support.ceil() as usize * 2 + 1;
        let mut bounds = Vec::with_capacity(out_size);
        let mut kk = vec![0i32; out_size * ksize];
        let mut k = vec![0f64; ksize];
        for xx in 0..out_size {
            let center = (xx as f64 + 0.5) * scale;
            let ss = 1.0 / filterscale;
            // C's `(int)` truncates toward zero, as `as i64` does.
            let xmin = ((center - support + 0.5) as i64).max(0);
            let xmax = ((center + support + 0.5) as i64).min(in_size as i64) - xmin;
            let (xmin, n) = (xmin as usize, xmax.max(0) as usize);
            let mut ww = 0.0;
            for (x, w) in k.iter_mut().enumerate().take(n) {
                *w = filter.weight(((x + xmin) as f64 - center + 0.5) * ss);
                ww += *w;
            }
            for (x, w) in k.iter().enumerate().take(n) {
                let w = if ww != 0.0 { w / ww } else { *w };
                let fixed = w * f64::from(1u32 << PRECISION_BITS);
                kk[xx * ksize + x] = if w < 0.0 { (-0.5 + fixed) as i32 } else { (0.5 + fixed) as i32 };
            }
            bounds.push((xmin, n));
        }
        Self { ksize, bounds, kk }
    }

    fn weights(&self, i: usize) -> &[i32] {
        &self.kk[i * self.ksize..i * self.ksize + self.bounds[i].1]
    }
}

/// `clip8`: the top bits of the fixed-point sum, clamped to `0..=255`.
#[inline]
fn clip8(v: i32) -> u8 {
    (v >> PRECISION_BITS).clamp(0, 255) as u8
}

/// Resizes `image` to `width x height` as Pillow's `Image.resize(size, filter)` does on an
/// RGB image, to the bit. Both sides must be at least 1.
pub fn resize(image: &RgbImage, width: usize, height: usize, filter: Filter) -> RgbImage {
    assert!(width > 0 && height > 0, "resize to {width}x{height}");
    let (in_w, in_h) = (image.width(), image.height());
    if (width, height) == (in_w, in_h) {
        return image.clone();
    }
    let horiz = Coeffs::new(in_w, width, filter);
    let mut vert = Coeffs::new(in_h, height, filter);
    if vertical_first(in_w, in_h, width, height) {
        let rows = vertical(image, &vert);
        return if width != in_w { horizontal(&rows, 0, height, &horiz) } else { rows };
    }
    if width == in_w {
        return vertical(image, &vert);
    }
    // Only the rows the vertical pass reads; its windows are shifted to match.
    let first = vert.bounds[0].0;
    let (last_min, last_n) = vert.bounds[height - 1];
    for b in &mut vert.bounds {
        b.0 -= first;
    }
    let rows = horizontal(image, first, last_min + last_n - first, &horiz);
    if height != in_h {
        vertical(&rows, &vert)
    } else {
        rows
    }
}

/// Pillow 13's pass order (python-pillow/Pillow#9549): vertical first when the height shrinks
/// by more than twice as many pixels as the width does; otherwise horizontal first. (Pillow 12
/// and older always go horizontal first, so their bytes differ in those cases.)
fn vertical_first(in_w: usize, in_h: usize, width: usize, height: usize) -> bool {
    let shrink = |from: usize, to: usize| from as i64 - to as i64;
    height < in_h && shrink(in_h, height) > 2 * shrink(in_w, width)
}

/// Pillow's `ImagingResampleHorizontal_8bpc`, 3 bands: `rows` source rows from `first`.
fn horizontal(image: &RgbImage, first: usize, rows: usize, c: &Coeffs) -> RgbImage {
    let (in_w, out_w) = (image.width(), c.bounds.len());
    let mut out = Vec::with_capacity(out_w * rows * 3);
    for y in first..first + rows {
        let row = &image.pixels()[y * in_w * 3..(y + 1) * in_w * 3];
        for (xx, &(xmin, _)) in c.bounds.iter().enumerate() {
            let mut ss = [1i32 << (PRECISION_BITS - 1); 3];
            for (x, &k) in c.weights(xx).iter().enumerate() {
                let p = &row[(xmin + x) * 3..(xmin + x) * 3 + 3];
                for b in 0..3 {
                    ss[b] = ss[b].wrapping_add(i32::from(p[b]).wrapping_mul(k));
                }
            }
            out.extend(ss.map(clip8));
        }
    }
    RgbImage::from_parts(out_w, rows, out)
}

/// Pillow's `ImagingResampleVertical_8bpc`, 3 bands.
fn vertical(image: &RgbImage, c: &Coeffs) -> RgbImage {
    let (w, out_h) = (image.width(), c.bounds.len());
    let stride = w * 3;
    let src = image.pixels();
    let mut out = vec![0u8; stride * out_h];
    let mut ss = vec![0i32; stride];
    for (yy, &(ymin, _)) in c.bounds.iter().enumerate() {
        ss.fill(1 << (PRECISION_BITS - 1));
        for (y, &k) in c.weights(yy).iter().enumerate() {
            let row = &src[(ymin + y) * stride..(ymin + y + 1) * stride];
            for (s, &p) in ss.iter_mut().zip(row) {
                *s = s.wrapping_add(i32::from(p).wrapping_mul(k));
            }
        }
        for (o, &s) in out[yy * stride..(yy + 1) * stride].iter_mut().zip(&ss) {
            *o = clip8(s);
        }
    }
    RgbImage::from_parts(w, out_h, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 4x3 image and Pillow 13's `Image.resize` of it (values read off `np.asarray`).
    fn source() -> RgbImage {
        let px = vec![
            0, 50, 255, 10, 200, 30, 255, 0, 128, 90, 90, 90, 255, 255, 255, 0, 0, 0, 30, 60, 90, 200, 100, 0, 12, 34,
            56, 78, 90, 12, 34, 56, 78, 255, 128, 1,
        ];
        RgbImage::new(4, 3, px).unwrap()
    }

    #[test]
    fn lanczos_upscale_matches_pillow() {
        let out = resize(&source(), 7, 5, Filter::Lanczos);
        let want: Vec<u8> = vec![
            0, 0, 249, 0, 100, 178, 0, 221, 43, 175, 123, 56, 255, 0, 136, 158, 41, 120, 47, 109, 91, 114, 125, 255,
            74, 145, 192, 0, 131, 31, 102, 66, 39, 185, 23, 120, 154, 62, 88, 110, 102, 55, 255, 255, 255, 180, 176,
            172, 17, 14, 12, 0, 0, 21, 45, 68, 91, 156, 96, 37, 218, 103, 0, 111, 125, 126, 103, 101, 80, 60, 45, 8, 7,
            36, 37, 24, 69, 77, 176, 106, 24, 255, 125, 0, 0, 0, 42, 17, 39, 23, 84, 103, 12, 43, 82, 54, 53, 56, 76,
            189, 102, 31, 254, 141, 3,
        ];
        assert_eq!((out.width(), out.height()), (7, 5));
        assert_eq!(out.pixels(), &want[..]);
    }

    #[test]
    fn bicubic_and_bilinear_downscale_match_pillow() {
        let out = resize(&source(), 2, 2, Filter::Bicubic);
        assert_eq!(out.pixels(), &[63, 117, 141, 135, 62, 72, 66, 81, 71, 123, 84, 32]);
        let out = resize(&source(), 3, 3, Filter::Bilinear);
        let want = [
            3, 95, 188, 133, 100, 79, 139, 63, 101, 179, 179, 179, 15, 30, 45, 149, 88, 27, 32, 51, 43, 56, 73, 45,
            189, 106, 24,
        ];
        assert_eq!(out.pixels(), &want);
    }

    #[test]
    fn same_size_is_a_copy_and_filter_codes_are_pillows() {
        assert_eq!(resize(&source(), 4, 3, Filter::Lanczos), source());
        assert_eq!(Filter::from_pil(1), Some(Filter::Lanczos));
        assert_eq!(Filter::from_pil(3), Some(Filter::Bicubic));
        assert_eq!(Filter::from_pil(0), None);
    }
}
