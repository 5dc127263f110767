//! Images in, for vision-language models; no model inside.
//!
//! Data flow: encoded bytes (PNG, JPEG, WebP, GIF) -> `decode` (limits checked on the header,
//! then the pixels, converted to RGB8 as PIL + transformers' `convert_to_rgb` do) -> a family's
//! processor (resizes with a port of Pillow's resampler, then `Idefics3Processor` tiles,
//! `Gemma3Processor` adds pan-and-scan crops, `Qwen2VlProcessor` cuts patches; each rescales
//! and normalizes) -> `f32` pixel values, plus the prompt layout (the text that stands for the
//! image: its tiles, views or patches).
//!
//! Invariants:
//! - deterministic: a pixel value depends only on the image and the processor's config (no
//!   threads, no SIMD reordering, no global state);
//! - the same bits as Hugging Face transformers' PIL-backend processor (Pillow 13): `decode`
//!   gives Pillow's RGB8 bytes for PNG, GIF, WebP and JPEG (JPEG through libjpeg-turbo, Pillow's
//!   own decoder, with its settings), and everything after it is exact. Checked against fixtures
//!   from transformers and Pillow, `tests/hf_processor*.rs`;
//! - untrusted input is refused with `Error::InvalidRequest` (never a panic), before its
//!   pixels are decoded when it is too large; a bad processor config is `Error::ModelLoad`.
//!
//! Files: `rgb` (the image type), `data_url` (inline images' bytes), `decode` (bytes to RGB8),
//! `jpeg` (libjpeg-turbo's decoder, set up as Pillow sets it up), `resample` (Pillow's resize),
//! `pixels` (rescale, normalize, channel-first, padding), `config` (the Idefics3 config and what
//! every family's config shares) and `idefics3` (the Idefics3 / SmolVLM family), `gemma3_config`
//! and `gemma3` (Gemma 3), `qwen2vl_config` and `qwen2vl` (Qwen2-VL / Qwen2.5-VL).

mod config;
mod data_url;
mod decode;
mod gemma3;
mod gemma3_config;
mod idefics3;
mod jpeg;
mod pixels;
mod qwen2vl;
mod qwen2vl_config;
mod resample;
mod rgb;

pub use config::{Idefics3Config, Size};
pub use data_url::data_url;
pub use decode::{decode, ImageLimits};
pub use gemma3::{Gemma3Image, Gemma3Processor};
pub use gemma3_config::Gemma3Config;
pub use idefics3::{prompt_string, Idefics3Image, Idefics3Pixels, Idefics3Processor};
pub use qwen2vl::{smart_resize, Qwen2VlImage, Qwen2VlProcessor};
pub use qwen2vl_config::Qwen2VlConfig;
pub use resample::{resize, Filter};
pub use rgb::RgbImage;
