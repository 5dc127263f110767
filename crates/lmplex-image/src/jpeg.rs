//! JPEG to RGB8 with Pillow's decoder, libjpeg-turbo, set up as Pillow sets it up: the same
//! bytes as `np.array(convert_to_rgb(PIL.Image.open(bytes)))`.
//!
//! The decoder is the libjpeg-turbo code inside MozJPEG (whose changes are to the encoder),
//! built from C by `mozjpeg-sys` with only a C compiler: no SIMD (that would need nasm), whose
//! results libjpeg-turbo keeps identical to its C code's for well-formed data. Pillow's `JpegDecode.c` keeps libjpeg's defaults (the ISLOW integer IDCT, fancy
//! upsampling of subsampled chroma, block smoothing) and asks for an output colour space by the
//! number of components: gray for 1 (replicated into R, G and B here), RGB for 3 (libjpeg's
//! fixed-point YCbCr conversion, or none for an RGB file), CMYK for 4 (libjpeg turns YCCK into
//! CMYK), which Pillow reads as Adobe-inverted (`CMYK;I`) and `convert_to_rgb` turns into
//! `c * k / 255` per channel, rounded. Arithmetic-coded files decode, as with Pillow. Refused:
//! other component counts and 12-bit samples (Pillow refuses them too), and lossless JPEG
//! (SOF3): MozJPEG's copy predates libjpeg-turbo 3's lossless mode.
//!
//! Same bytes as Pillow for the test JPEGs (`tests/hf_processor.rs`: the fixtures under
//! `tests/fixtures/images/` made by `scripts/make_image_fixtures.py`). Not for every corrupt
//! file: where damaged data gives coefficients out of
//! a real JPEG's range, Pillow's x86 SIMD IDCT (16-bit lanes) and the C one used here (32-bit)
//! give different pixels; libjpeg-turbo keeps the two identical only for in-range data.
//!
//! Errors: libjpeg's default error handler calls `exit()`. Here a fatal error unwinds instead
//! (`resume_unwind` through C built with `-fexceptions`: mozjpeg-sys's `unwinding` feature) to
//! a `catch_unwind` around each step, which returns it as a message; a build with
//! `panic = "abort"` would abort on a corrupt JPEG. Warnings (corrupt entropy data, say) are
//! ignored, as Pillow ignores them, so such a file decodes as Pillow decodes it (but for the
//! IDCT's overflow above); the one
//! warning that fails is the data ending before the last row, which Pillow refuses as "image
//! file is truncated". Beyond Pillow: a file of more than `MAX_SCANS` scans is refused, since
//! each scan of a progressive file walks the whole image (libjpeg-turbo's advice for untrusted
//! input; real files have about 10).
//!
//! Memory: the RGB output (3 bytes a pixel) and libjpeg's row buffers; a progressive or
//! multi-scan file also keeps every coefficient, 2 bytes per coded sample (3 a pixel for
//! 4:2:0 YCbCr, up to 8 for 4:4:4 CMYK).

use std::cell::Cell;
use std::marker::PhantomData;
use std::os::raw::{c_int, c_ulong};
use std::panic::{self, AssertUnwindSafe};
use std::ptr;

use mozjpeg_sys as ffi;

use crate::rgb::RgbImage;

/// Most scans a file may have (TurboJPEG's suggested limit for untrusted input).
const MAX_SCANS: c_int = 500;

/// The payload a fatal libjpeg error unwinds with.
struct Failure(String);

/// A JPEG whose header has been read: its dimensions are known, no pixel is decoded yet.
pub(crate) struct Decoder<'a> {
    state: Box<State>,
    /// libjpeg reads from the caller's bytes (`jpeg_mem_src`) until the state is destroyed.
    _bytes: PhantomData<&'a [u8]>,
}

/// libjpeg's objects, each boxed: `cinfo` points at the others, so none may move.
struct State {
    cinfo: Box<ffi::jpeg_decompress_struct>,
    err: Box<ffi::jpeg_error_mgr>,
    progress: Box<ffi::jpeg_progress_mgr>,
    /// Set once every row has been read: only then may the data end early (before EOI).
    rows_read: Box<Cell<bool>>,
}

impl Drop for State {
    fn drop(&mut self) {
        // SAFETY: `cinfo` was zeroed and then set up by `jpeg_create_decompress` (or that call
        // failed before allocating, leaving `mem` null); destroying it frees libjpeg's memory
        // whatever the step it stopped at.
        unsafe { ffi::jpeg_destroy_decompress(&mut self.cinfo) }
    }
}

/// Runs `f`, turning a libjpeg error that unwinds out of it into `Err(message)`.
fn catch<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    match panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(payload) => match payload.downcast::<Failure>() {
            Ok(failure) => Err(failure.0),
            // A panic of ours, not libjpeg's: a bug, left to unwind.
            Err(payload) => panic::resume_unwind(payload),
        },
    }
}

fn fail(message: String) -> ! {
    // `resume_unwind`, unlike `panic!`, does not run the panic hook: nothing is printed.
    panic::resume_unwind(Box::new(Failure(message)))
}

/// libjpeg's message for its current `msg_code`.
///
/// # Safety
/// `cinfo.err` points at the error manager `jpeg_std_error` set up.
unsafe fn message(cinfo: &mut ffi::jpeg_common_struct) -> String {
    // The binding types the buffer as `&[u8; 80]`; libjpeg's `format_message(cinfo, char
    // *buffer)` writes up to JMSG_LENGTH_MAX = 200 bytes, NUL included.
    type Bound = unsafe extern "C-unwind" fn(&mut ffi::jpeg_common_struct, &[u8; 80]);
    type FormatMessage = unsafe extern "C-unwind" fn(&mut ffi::jpeg_common_struct, *mut u8);
    let mut buffer = [0u8; 200];
    // SAFETY: per the caller, `format_message` is libjpeg's, whose C signature is the one
    // transmuted to, and the buffer has the room it writes into.
    unsafe {
        if let Some(format) = (*cinfo.err).format_message {
            std::mem::transmute::<Bound, FormatMessage>(format)(cinfo, buffer.as_mut_ptr());
        }
    }
    let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
    String::from_utf8_lossy(&buffer[..end]).into_owned()
}

unsafe extern "C-unwind" fn error_exit(cinfo: &mut ffi::jpeg_common_struct) {
    // SAFETY: this handler is only installed on an error manager from `jpeg_std_error`.
    fail(unsafe { message(cinfo) })
}

/// Warnings (`level` -1) and trace messages: all ignored, as Pillow ignores them, except the
/// data ending before the last row has been read.
unsafe extern "C-unwind" fn emit_message(cinfo: &mut ffi::jpeg_common_struct, level: c_int) {
    // SAFETY: `err` is our error manager, and `client_data` our `rows_read` flag, which lives
    // as long as `cinfo`.
    let (code, rows_read) = unsafe { ((*cinfo.err).msg_code, (*cinfo.client_data.cast::<Cell<bool>>()).get()) };
    if level < 0 && code == ffi::JWRN_JPEG_EOF && !rows_read {
        fail("the data ends before the image does (truncated)".into());
    }
}

/// Called while libjpeg reads the scans of a multi-scan file, and for each row it outputs.
unsafe extern "C-unwind" fn progress_monitor(cinfo: &mut ffi::jpeg_common_struct) {
    // SAFETY: this monitor is only installed on a `jpeg_decompress_struct`, whose first field is
    // `common`.
    let scans = unsafe { (*ptr::from_mut(cinfo).cast::<ffi::jpeg_decompress_struct>()).input_scan_number };
    if scans > MAX_SCANS {
        fail(format!("it has more than {MAX_SCANS} scans"));
    }
}

impl<'a> Decoder<'a> {
    /// Reads the header (markers up to the first scan): no pixel is decoded.
    pub(crate) fn open(bytes: &'a [u8]) -> Result<Self, String> {
        // SAFETY: all-zero is a valid value of each of these C structs (integers, null
        // pointers, `None` function pointers), and libjpeg initializes them before use.
        let mut state = unsafe {
            Box::new(State {
                cinfo: Box::new(std::mem::zeroed()),
                err: Box::new(std::mem::zeroed()),
                progress: Box::new(std::mem::zeroed()),
                rows_read: Box::new(Cell::new(false)),
            })
        };
        // SAFETY: `jpeg_std_error` fills in the error manager's defaults.
        unsafe { ffi::jpeg_std_error(&mut state.err) };
        state.err.error_exit = Some(error_exit);
        state.err.emit_message = Some(emit_message);
        state.progress.progress_monitor = Some(progress_monitor);
        state.cinfo.common.err = ptr::from_mut(&mut *state.err);
        state.cinfo.common.client_data = ptr::from_ref(&*state.rows_read).cast_mut().cast();
        catch(|| {
            // SAFETY: `cinfo` has its error manager; `bytes` outlives the decoder (`'a`).
            let header = unsafe {
                ffi::jpeg_create_decompress(&mut *state.cinfo);
                ffi::jpeg_mem_src(&mut state.cinfo, bytes.as_ptr(), bytes.len() as c_ulong);
                // Pillow skips tables-only datastreams (JPEG_HEADER_TABLES_ONLY) before the image.
                let mut header = ffi::jpeg_read_header(&mut state.cinfo, 0);
                while header == 2 {
                    header = ffi::jpeg_read_header(&mut state.cinfo, 0);
                }
                header
            };
            // JPEG_HEADER_OK; a memory source never suspends.
            if header != 1 {
                return Err(format!("unexpected jpeg_read_header result {header}"));
            }
            Ok(())
        })?;
        state.cinfo.common.progress = ptr::from_mut(&mut *state.progress);
        let components = state.cinfo.num_components;
        if !matches!(components, 1 | 3 | 4) {
            return Err(format!("it has {components} components (1, 3 or 4 are read)"));
        }
        Ok(Self { state, _bytes: PhantomData })
    }

    /// Width and height, from the header.
    pub(crate) fn dimensions(&self) -> (u32, u32) {
        (self.state.cinfo.image_width, self.state.cinfo.image_height)
    }

    /// Decodes every row and converts it to RGB8 as Pillow + `convert_to_rgb` do.
    pub(crate) fn decode(mut self) -> Result<RgbImage, String> {
        let state = &mut *self.state;
        let components = state.cinfo.num_components as usize;
        state.cinfo.out_color_space = match components {
            1 => ffi::J_COLOR_SPACE::JCS_GRAYSCALE,
            3 => ffi::J_COLOR_SPACE::JCS_RGB,
            _ => ffi::J_COLOR_SPACE::JCS_CMYK,
        };
        let (width, height) = (state.cinfo.image_width as usize, state.cinfo.image_height as usize);
        let mut rgb = vec![0u8; width * height * 3];
        let mut row = vec![0u8; if components == 3 { 0 } else { width * components }];
        catch(|| {
            // SAFETY: the header has been read; each row pointer handed to
            // `jpeg_read_scanlines` addresses `width * components` writable bytes, and libjpeg
            // writes one row of `output_components` (= `components`: no scaling, no
            // quantizing) samples per pixel.
            unsafe {
                ffi::jpeg_start_decompress(&mut state.cinfo);
                let cinfo = &mut *state.cinfo;
                if (cinfo.output_width as usize, cinfo.output_height as usize) != (width, height)
                    || cinfo.output_components as usize != components
                {
                    return Err("libjpeg's output differs from the header".into());
                }
                for out in rgb.chunks_exact_mut(width * 3) {
                    let mut target = if components == 3 { out.as_mut_ptr() } else { row.as_mut_ptr() };
                    if ffi::jpeg_read_scanlines(cinfo, &mut target, 1) != 1 {
                        return Err("libjpeg returned no row".into());
                    }
                    match components {
                        1 => out.chunks_exact_mut(3).zip(&row).for_each(|(px, &l)| px.fill(l)),
                        4 => out.chunks_exact_mut(3).zip(row.chunks_exact(4)).for_each(|(px, cmyk)| {
                            px.copy_from_slice(&cmyk_to_rgb([cmyk[0], cmyk[1], cmyk[2], cmyk[3]]));
                        }),
                        _ => {}
                    }
                }
                state.rows_read.set(true);
                ffi::jpeg_finish_decompress(cinfo);
            }
            Ok(())
        })?;
        Ok(RgbImage::from_parts(width, height, rgb))
    }
}

/// One pixel of libjpeg's CMYK output to RGB, as Pillow does it: read as Adobe-inverted
/// (`CMYK;I`: each value `255 - v`), then `cmyk2rgb` on the inverted values (`nk - MULDIV255(c,
/// nk)`, `nk = 255 - k`), which comes to `round(v * k / 255)` on libjpeg's values `v` and `k`
/// (the test below checks every pair).
fn cmyk_to_rgb([c, m, y, k]: [u8; 4]) -> [u8; 3] {
    let k = u32::from(k);
    [c, m, y].map(|v| {
        let t = u32::from(v) * k + 128;
        (((t >> 8) + t) >> 8) as u8
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pillow's `CMYK;I` unpacking and `cmyk2rgb` (`Convert.c`), written as they are.
    fn pillow_cmyk_inverted_to_rgb(raw: [u8; 4]) -> [u8; 3] {
        let [c, m, y, k] = raw.map(|v| 255 - i32::from(v));
        let nk = 255 - k;
        let muldiv255 = |a: i32, b: i32| {
            let t = a * b + 128;
            ((t >> 8) + t) >> 8
        };
        [c, m, y].map(|v| (nk - muldiv255(v, nk)).clamp(0, 255) as u8)
    }

    #[test]
    fn cmyk_conversion_is_pillows_for_every_value_pair() {
        for v in 0..=255u8 {
            for k in 0..=255u8 {
                let raw = [v, 255 - v, v / 3, k];
                assert_eq!(cmyk_to_rgb(raw), pillow_cmyk_inverted_to_rgb(raw), "{raw:?}");
            }
        }
    }

    #[test]
    fn errors_are_messages_not_exits() {
        let err = Decoder::open(&[0xFF, 0xD8, 0xFF, 0x00, 1, 2, 3]).err().unwrap();
        assert!(!err.is_empty(), "{err}");
        // Not a JPEG at all: libjpeg's own message.
        let err = Decoder::open(b"GIF89a").err().unwrap();
        assert!(err.contains("Not a JPEG file"), "{err}");
    }
}
