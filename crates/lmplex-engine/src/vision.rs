//! Images in a chat prompt, for a vision-language model (Idefics3 / SmolVLM, Gemma 3, Qwen2-VL,
//! Qwen2.5-VL: an HF folder, or any text model with a llama.cpp `mmproj` file) on the CPU: each image part's bytes decoded and processed as the family's transformers processor
//! does (lmplex-image), its placeholder in the rendered prompt (`<image>`, Gemma 3's
//! `<start_of_image>`) expanded to the processor's image prompt, its tiles encoded by the
//! vision tower (lmplex-model) in the step loop (`pending.rs`), and the features spliced at
//! the image tokens in every pass over them (`InputEmbeds` on the `Sequence`; for Gemma 3 each
//! image's tokens a bidirectional block, which the scheduler never splits across chunks).
//!
//! Invariants:
//! - A prompt's images are decoded and processed once, on the caller's thread, before
//!   admission: a bad image is refused before anything is queued. The tower runs only in the
//!   step loop, between steps, on the images of every request waiting for it at once.
//! - An image's features depend only on its bytes (tile by tile, `VisionTower::encode`), so
//!   they are cached by the SHA-256 of those bytes, and the prompt's prefix-cache salt carries
//!   the hashes of its images in order: two prompts share cached K/V only when their images
//!   are the same bytes.
//! - The rendered prompt must hold one placeholder per image, in order, and at most
//!   `limit_mm_per_prompt.image` images (0: no tower is loaded and every image is refused).

mod families;
mod pending;

use families::{Encoded, Family, Processed};
use lmplex_core::{Error, ModelConfig, Result};
use lmplex_image::{decode, ImageLimits};
use lmplex_model::{ModelArgs, Tokenizer};
pub(crate) use pending::{encode_waiting, PromptImages};
use sha2::{Digest, Sha256};
use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// Bytes of features the cache keeps (a SmolVLM image of 13 tiles takes about 2 MB).
const CACHE_BYTES: usize = 64 << 20;

/// A prompt's images made ready for the tower: the text with each placeholder expanded, the
/// images in placeholder order, and the salt that keys their prefix-cache blocks.
pub(crate) struct Expanded {
    pub text: String,
    parts: Vec<Part>,
    pub salt: String,
}

/// One image of a prompt: encoded (found in the cache), or processed and waiting for the tower.
enum Part {
    Ready(Arc<Encoded>),
    Waiting { digest: [u8; 32], processed: Processed },
}

/// A vision-language model's image side (`load`).
pub(crate) struct Vision {
    family: Family,
    /// `limit_mm_per_prompt.image` (at least 1).
    limit: usize,
    limits: ImageLimits,
    cache: Mutex<FeatureCache>,
}

/// What a model does with images: a vision tower, or a reason it takes none.
pub(crate) enum Images {
    Vision(Arc<Vision>),
    Refused(String),
}

impl Images {
    /// The model's image side: its vision tower from `config.mmproj` when set, else from its
    /// folder when that is a vision-language folder; only on the CPU (`on_cpu`). `tokenizer`
    /// (the text model's) names an mmproj's image token.
    pub fn load(config: &ModelConfig, args: &ModelArgs, on_cpu: bool, tokenizer: &Tokenizer) -> Result<Self> {
        let mmproj = config.mmproj.as_deref().map(Path::new);
        if args.text_prefix.is_none() && mmproj.is_none() {
            return Ok(Self::Refused(
                "is a text model: it takes no images (a GGUF model takes them with an mmproj)".into(),
            ));
        }
        let limit = config.limit_mm_per_prompt.image;
        if limit == 0 {
            return Ok(Self::Refused("takes no images here: its limit_mm_per_prompt.image is 0".into()));
        }
        if !on_cpu {
            return Ok(Self::Refused(
                "runs on CUDA, and images run on the CPU backend only: load it with device = \"cpu\"".into(),
            ));
        }
        let dtype = config.dtype;
        let family = match mmproj {
            Some(path) => Family::load_mmproj(path, tokenizer, dtype)?,
            None => {
                let model_dir = config.checkpoint();
                let config = std::fs::read_to_string(model_dir.join("config.json"))
                    .map_err(|e| Error::model_load(format!("{}: {e}", model_dir.display())))?;
                // The tower computes as the text model does (an all-bf16 folder in bf16, as torch).
                let mut src = lmplex_model::weight_source(model_dir, args)?;
                src.set_dtype(dtype);
                Family::load(model_dir, &config, &src)?
            }
        };
        if family.hidden() != args.hidden_size {
            return Err(Error::model_load(format!(
                "the vision tower's features are {} wide, the text model's hidden size is {}",
                family.hidden(),
                args.hidden_size
            )));
        }
        let cache = Mutex::new(FeatureCache::default());
        Ok(Self::Vision(Arc::new(Vision { family, limit, limits: ImageLimits::default(), cache })))
    }

    /// Bytes the tower's weights take (counted in the model's memory).
    pub fn bytes(&self) -> usize {
        match self {
            Self::Vision(v) => v.family.size_in_bytes(),
            Self::Refused(_) => 0,
        }
    }
}

impl Vision {
    /// `text` (a rendered prompt) with its `images`' placeholders expanded, and their features.
    pub fn expand(&self, text: &str, images: &[&Arc<[u8]>]) -> Result<Expanded> {
        if images.len() > self.limit {
            return Err(Error::invalid(format!(
                "a prompt may hold at most {} images (limit_mm_per_prompt), got {}",
                self.limit,
                images.len()
            )));
        }
        let placeholder = self.family.placeholder();
        let pieces: Vec<&str> = text.split(placeholder).collect();
        if pieces.len() - 1 != images.len() {
            return Err(Error::invalid(format!(
                "the chat template rendered {} image placeholders ({placeholder}) for {} images",
                pieces.len() - 1,
                images.len()
            )));
        }
        let mut out = String::from(pieces[0]);
        let (mut parts, mut salt) = (Vec::new(), String::from("images"));
        for (i, (bytes, piece)) in images.iter().zip(&pieces[1..]).enumerate() {
            let digest: [u8; 32] = Sha256::digest(bytes).into();
            let part = self.prepare(bytes, digest).map_err(|e| Error::invalid(format!("image {i}: {e}")))?;
            out.push_str(match &part {
                Part::Ready(e) => &e.prompt,
                Part::Waiting { processed, .. } => &processed.prompt,
            });
            out.push_str(piece);
            parts.push(part);
            salt.push_str(&format!(":{}", digest.iter().map(|b| format!("{b:02x}")).collect::<String>()));
        }
        Ok(Expanded { text: out, parts, salt })
    }

    /// The image encoded, from the cache, or decoded and processed for the tower.
    fn prepare(&self, bytes: &[u8], digest: [u8; 32]) -> Result<Part> {
        if let Some(hit) = self.cached(&digest) {
            return Ok(Part::Ready(hit));
        }
        let rgb = decode(bytes, &self.limits)?;
        Ok(Part::Waiting { digest, processed: self.family.process(&rgb)? })
    }

    fn cached(&self, digest: &[u8; 32]) -> Option<Arc<Encoded>> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).get(digest)
    }

    fn remember(&self, digest: [u8; 32], encoded: Arc<Encoded>) {
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).insert(digest, encoded);
    }
}

/// Encoded images by the SHA-256 of their bytes, the oldest dropped past `CACHE_BYTES`.
#[derive(Default)]
struct FeatureCache {
    map: HashMap<[u8; 32], Arc<Encoded>>,
    order: VecDeque<[u8; 32]>,
    bytes: usize,
}

impl FeatureCache {
    fn get(&self, key: &[u8; 32]) -> Option<Arc<Encoded>> {
        self.map.get(key).cloned()
    }

    fn insert(&mut self, key: [u8; 32], value: Arc<Encoded>) {
        let size = value.features.len() * 4 + value.prompt.len();
        if size > CACHE_BYTES || self.map.contains_key(&key) {
            return;
        }
        while self.bytes + size > CACHE_BYTES {
            let Some(old) = self.order.pop_front() else { break };
            if let Some(v) = self.map.remove(&old) {
                self.bytes -= v.features.len() * 4 + v.prompt.len();
            }
        }
        self.order.push_back(key);
        self.map.insert(key, value);
        self.bytes += size;
    }
}
