//! Bytes to `RgbImage`: format sniffing, limits checked on the header, decoding, and the
//! conversion to RGB that transformers' `convert_to_rgb` applies to a PIL image.
//!
//! Order: the byte limit, then the format from the magic bytes (PNG, JPEG, WebP, GIF), then the
//! header's dimensions against `max_pixels`, and only then the pixels. The conversion matches
//! what `np.array(convert_to_rgb(PIL.Image.open(bytes)))` holds (Pillow 13):
//! - transparency (an alpha channel, a PNG `tRNS` chunk, a GIF transparent index) is
//!   composited onto opaque white with Pillow's `alpha_composite` integer arithmetic;
//! - grayscale is replicated into R, G and B;
//! - 16-bit RGB(A) and gray-alpha samples keep their high byte (Pillow's `;16B` raw modes);
//!   16-bit gray is Pillow's `I;16`, whose conversion to RGB clamps at 255;
//! - CMYK JPEGs (Adobe-inverted, as Pillow assumes for every 4-channel JPEG) become
//!   `c * k / 255` per channel, rounded, which is Pillow's `cmyk2rgb` on the inverted values;
//! - a GIF gives its first frame.
//!
//! Exactness: every format gives Pillow's bytes. PNG, GIF and WebP (lossless and lossy) are
//! decoded by the `image` crate; JPEG by Pillow's own decoder, libjpeg-turbo, with Pillow's
//! settings (the `jpeg` module: ISLOW IDCT, fancy upsampling, libjpeg's YCbCr conversion).
//! A truncated JPEG is refused, as Pillow refuses it; one with corrupt data decodes as Pillow
//! decodes it, but for blocks whose damaged coefficients overflow Pillow's SIMD IDCT (`jpeg`).
//!
//! Not applied, as in PIL's `Image.open` + `convert_to_rgb`: EXIF orientation, ICC profiles,
//! PNG gamma. (transformers' `load_image`, used for paths and URLs, differs: it applies EXIF
//! orientation and drops alpha instead of compositing.)

use std::io::Cursor;

use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader};
use lmplex_core::{Error, Result};

use crate::jpeg;
use crate::rgb::RgbImage;

/// What `decode` accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageLimits {
    /// Largest `width * height` of a decoded image (default 8192 x 8192 = 64 Mpx: a 48 Mpx phone
    /// photo fits; decoding peaks near 7 bytes a pixel, about 450 MiB at the limit; up to 11 for
    /// a progressive 4:4:4 CMYK JPEG).
    pub max_pixels: u64,
    /// Largest encoded image, in bytes (default 32 MiB).
    pub max_bytes: usize,
}

impl Default for ImageLimits {
    fn default() -> Self {
        Self { max_pixels: 8192 * 8192, max_bytes: 32 << 20 }
    }
}

/// Decodes a PNG, JPEG, WebP or GIF image into 8-bit RGB, as PIL + transformers'
/// `convert_to_rgb` would (see the module's header for each mode).
///
/// Errors with `InvalidRequest` when the bytes are over `limits.max_bytes`, in no supported
/// format, when the header's dimensions are over `limits.max_pixels` (checked before any pixel
/// is decoded), or when the data is corrupt or truncated; the message names the format and,
/// once known, the dimensions.
pub fn decode(bytes: &[u8], limits: &ImageLimits) -> Result<RgbImage> {
    if bytes.len() > limits.max_bytes {
        return Err(Error::InvalidRequest(format!(
            "image is {} bytes, over the limit of {} bytes",
            bytes.len(),
            limits.max_bytes
        )));
    }
    let format = image::guess_format(bytes)
        .ok()
        .filter(|f| matches!(f, ImageFormat::Png | ImageFormat::Jpeg | ImageFormat::WebP | ImageFormat::Gif))
        .ok_or_else(|| {
            let head: Vec<String> = bytes.iter().take(8).map(|b| format!("{b:02x}")).collect();
            Error::InvalidRequest(format!(
                "not a PNG, JPEG, WebP or GIF image ({} bytes, starting with [{}])",
                bytes.len(),
                head.join(" ")
            ))
        })?;
    let name = format_name(format);
    let header_error = |e: String| Error::InvalidRequest(format!("cannot read the {name} image's header: {e}"));
    if format == ImageFormat::Jpeg {
        let decoder = jpeg::Decoder::open(bytes).map_err(header_error)?;
        let (width, height) = decoder.dimensions();
        check_dimensions(name, width, height, limits)?;
        return decoder.decode().map_err(|e| decode_error(name, width, height, e));
    }
    let mut reader = ImageReader::with_format(Cursor::new(bytes), format);
    let mut decoder_limits = image::Limits::default();
    // Room for the decoder's own buffer at 16 bits x 4 channels, plus its working memory.
    decoder_limits.max_alloc = Some(limits.max_pixels.saturating_mul(8).saturating_add(64 << 20));
    reader.limits(decoder_limits);
    let decoder = reader.into_decoder().map_err(|e| header_error(e.to_string()))?;
    let (width, height) = decoder.dimensions();
    check_dimensions(name, width, height, limits)?;
    let decoded = DynamicImage::from_decoder(decoder).map_err(|e| decode_error(name, width, height, e.to_string()))?;
    to_rgb(decoded).ok_or_else(|| Error::InvalidRequest(format!("{name} image has an unsupported pixel format")))
}

/// The header's dimensions against `limits.max_pixels`, before any pixel is decoded.
fn check_dimensions(name: &str, width: u32, height: u32, limits: &ImageLimits) -> Result<()> {
    let pixels = u64::from(width) * u64::from(height);
    if pixels > limits.max_pixels {
        return Err(Error::InvalidRequest(format!(
            "{name} image is {width}x{height} = {pixels} pixels, over the limit of {} pixels",
            limits.max_pixels
        )));
    }
    if pixels == 0 {
        return Err(Error::InvalidRequest(format!("{name} image is {width}x{height}: it has no pixels")));
    }
    Ok(())
}

fn decode_error(name: &str, width: u32, height: u32, e: String) -> Error {
    Error::InvalidRequest(format!("cannot decode the {width}x{height} {name} image: {e}"))
}

fn format_name(format: ImageFormat) -> &'static str {
    match format {
        ImageFormat::Png => "PNG",
        ImageFormat::Jpeg => "JPEG",
        ImageFormat::WebP => "WebP",
        ImageFormat::Gif => "GIF",
        _ => "image",
    }
}

/// Each decoded pixel format to RGB8 the way Pillow's modes convert (see the module header).
fn to_rgb(img: DynamicImage) -> Option<RgbImage> {
    let (w, h) = (img.width() as usize, img.height() as usize);
    let high = |v: u16| (v >> 8) as u8;
    let pixels: Vec<u8> = match img {
        DynamicImage::ImageRgb8(b) => b.into_raw(),
        DynamicImage::ImageLuma8(b) => b.into_raw().iter().flat_map(|&l| [l; 3]).collect(),
        DynamicImage::ImageLumaA8(b) => b.into_raw().chunks_exact(2).flat_map(|p| composite([p[0]; 3], p[1])).collect(),
        DynamicImage::ImageRgba8(b) => {
            b.into_raw().chunks_exact(4).flat_map(|p| composite([p[0], p[1], p[2]], p[3])).collect()
        }
        DynamicImage::ImageRgb16(b) => b.into_raw().into_iter().map(high).collect(),
        DynamicImage::ImageRgba16(b) => b
            .into_raw()
            .chunks_exact(4)
            .flat_map(|p| composite([high(p[0]), high(p[1]), high(p[2])], high(p[3])))
            .collect(),
        DynamicImage::ImageLuma16(b) => b.into_raw().iter().flat_map(|&l| [l.min(255) as u8; 3]).collect(),
        DynamicImage::ImageLumaA16(b) => {
            b.into_raw().chunks_exact(2).flat_map(|p| composite([high(p[0]); 3], high(p[1]))).collect()
        }
        _ => return None,
    };
    Some(RgbImage::from_parts(w, h, pixels))
}

/// Pillow's `ImagingAlphaComposite` (`AlphaComposite.c`) of one pixel over opaque white, then
/// the alpha dropped: `PIL.Image.alpha_composite(white, rgba).convert("RGB")`.
pub(crate) fn composite(rgb: [u8; 3], alpha: u8) -> [u8; 3] {
    const PRECISION_BITS: u32 = 7;
    const DST: u32 = 255; // white, and its alpha
    if alpha == 0 {
        return [255; 3];
    }
    let a = u32::from(alpha);
    let shift_div_255 = |v: u32| ((v >> 8) + v) >> 8;
    let blend = DST * (255 - a);
    let outa255 = a * 255 + blend;
    let coef1 = a * 255 * 255 * (1 << PRECISION_BITS) / outa255;
    let coef2 = 255 * (1 << PRECISION_BITS) - coef1;
    rgb.map(|c| {
        let tmp = u32::from(c) * coef1 + DST * coef2;
        (shift_div_255(tmp + (0x80 << PRECISION_BITS)) >> PRECISION_BITS) as u8
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values read from Pillow 13: `alpha_composite(white, RGBA(r, ., ., a))`.
    #[test]
    fn composite_matches_pillow() {
        assert_eq!(composite([0, 10, 200], 255), [0, 10, 200]);
        assert_eq!(composite([0, 10, 200], 0), [255, 255, 255]);
        // LA(30, 36) and LA(60, 72) from Pillow's LA -> RGB through convert_to_rgb.
        assert_eq!(composite([30; 3], 36), [223; 3]);
        assert_eq!(composite([60; 3], 72), [200; 3]);
        // P with tRNS alpha 128 over palette colour (40, 50, 60).
        assert_eq!(composite([40, 50, 60], 128), [147, 152, 157]);
        assert_eq!(composite([100, 110, 120], 7), [251, 251, 251]);
    }

    #[test]
    fn refuses_before_looking_at_the_format() {
        let limits = ImageLimits { max_pixels: 100, max_bytes: 4 };
        let err = decode(&[0x89, b'P', b'N', b'G', 0], &limits).unwrap_err();
        assert!(err.to_string().contains("over the limit of 4 bytes"), "{err}");
    }
}
