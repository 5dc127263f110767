//! What the processor fixture tests share: paths, hashes, and the comparison of pixel values
//! with transformers' record (`pixel_record` in scripts/make_image_fixtures.py).

#![allow(dead_code)] // each test crate uses its part

use std::path::{Path, PathBuf};

use lmplex_image::{decode, ImageLimits, RgbImage};
use serde::Deserialize;
use sha2::{Digest, Sha256};

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/images")
}

/// A fixture JSON file, parsed.
pub fn read_json<T: serde::de::DeserializeOwned>(name: &str) -> T {
    let text = std::fs::read_to_string(fixtures().join(name)).unwrap();
    serde_json::from_str(&text).unwrap()
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// The RGB bytes a processor case starts from: our decoding of the fixture (JPEGs included:
/// they decode to Pillow's bytes, `tests/hf_processor.rs`).
pub fn processor_input(name: &str) -> RgbImage {
    let bytes = std::fs::read(fixtures().join(name)).unwrap();
    decode(&bytes, &ImageLimits::default()).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// transformers' pixel values, as hashes and samples.
#[derive(Deserialize)]
pub struct Pixels {
    pub shape: Vec<usize>,
    pub sha256: String,
    pub first: Vec<f32>,
    pub tile_sha256: Vec<String>,
    pub sample_stride: usize,
    pub samples: Vec<f32>,
}

/// A prompt text as recorded: itself, or its sha256 when long.
#[derive(Deserialize)]
pub struct Prompt {
    pub prompt: Option<String>,
    pub prompt_sha256: Option<String>,
}

impl Prompt {
    pub fn check(&self, what: &str, got: &str) {
        match (&self.prompt, &self.prompt_sha256) {
            (Some(want), _) => assert_eq!(got, want, "{what}: prompt"),
            (None, Some(sha)) => assert_eq!(&sha256_hex(got.as_bytes()), sha, "{what}: prompt:\n{got}"),
            (None, None) => panic!("{what}: no prompt recorded"),
        }
    }
}

/// Compares `got` with transformers' record, `tile_len` values a tile; on a mismatch, says where.
pub fn check_pixels(what: &str, got: &[f32], tile_len: usize, want: &Pixels) -> Result<(), String> {
    if sha256_hex(&f32_bytes(got)) == want.sha256 {
        return Ok(());
    }
    let mut msg = format!("{what}: pixel values differ from transformers'");
    let sampled =
        want.first.iter().enumerate().chain(want.samples.iter().enumerate().map(|(i, v)| (i * want.sample_stride, v)));
    if let Some((i, v)) = sampled.clone().find(|&(i, v)| got.get(i).map(|g| g.to_bits()) != Some(v.to_bits())) {
        msg += &format!("; first differing recorded value: index {i}: lmplex {:?}, transformers {v:?}", got.get(i));
    }
    let tiles: Vec<String> = got.chunks(tile_len).map(|t| sha256_hex(&f32_bytes(t))[..16].to_string()).collect();
    if let Some(t) = (0..want.tile_sha256.len()).find(|&t| tiles.get(t) != Some(&want.tile_sha256[t])) {
        msg += &format!("; first differing tile: {t} of {}", want.tile_sha256.len());
    }
    Err(msg)
}
