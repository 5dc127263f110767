//! Images in a chat prompt, for a vision-language model (Idefics3 / SmolVLM, Gemma 3) on the
//! CPU: each image part's bytes decoded and processed as the family's transformers processor
//! does (lmplex-image), its placeholder in the rendered prompt (`<image>`, Gemma 3's
//! `<start_of_image>`) expanded to the processor's image prompt, its tiles encoded by the
//! vision tower (lmplex-model), and the features spliced at the image tokens in every pass
//! over them (`InputEmbeds` on the `Sequence`; for Gemma 3 each image's tokens a bidirectional
//! block, which the scheduler never splits across chunks).
//!
//! Invariants:
//! - A prompt is expanded and encoded once, on the caller's thread, before admission: a bad
//!   image is refused before anything is queued.
//! - An image's features depend only on its bytes (tile by tile, `VisionTower::encode`), so
//!   they are cached by the SHA-256 of those bytes, and the prompt's prefix-cache salt carries
//!   the hashes of its images in order: two prompts share cached K/V only when their images
//!   are the same bytes.
//! - The rendered prompt must hold one placeholder per image, in order, and at most
//!   `MAX_IMAGES_PER_PROMPT` images.

use lmplex_core::{Error, Result};
use lmplex_image::{decode, Gemma3Processor, Idefics3Processor, ImageLimits, RgbImage};
use lmplex_model::vision::{VisionArgs, VisionFamily, VisionTower};
use lmplex_model::{InputEmbeds, ModelArgs};
use sha2::{Digest, Sha256};
use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// Bytes of features the cache keeps (a SmolVLM image of 13 tiles takes about 2 MB).
const CACHE_BYTES: usize = 64 << 20;
/// Most images one prompt may hold (each is up to 17 tiles of 64 tokens with SmolVLM's settings).
pub(crate) const MAX_IMAGES_PER_PROMPT: usize = 8;

/// A prompt's images made ready: the text with each placeholder expanded, the features in
/// placeholder order, and the salt that keys their prefix-cache blocks.
pub(crate) struct Expanded {
    pub text: String,
    pub features: Vec<f32>,
    pub salt: String,
}

/// A family's image processor (lmplex-image).
enum Processor {
    Idefics3(Idefics3Processor),
    Gemma3(Gemma3Processor),
}

/// One image as the tower takes it: its tiles' pixel values and the text that stands for it.
struct Processed {
    pixels: Vec<f32>,
    tiles: usize,
    prompt: String,
}

impl Processor {
    fn from_folder(dir: &Path, family: VisionFamily) -> Result<Self> {
        Ok(match family {
            VisionFamily::Idefics3 { .. } => Self::Idefics3(Idefics3Processor::from_folder(dir)?),
            VisionFamily::Gemma3 { .. } => Self::Gemma3(Gemma3Processor::from_folder(dir)?),
        })
    }

    /// The placeholder the chat template renders for an image part.
    fn placeholder(&self) -> &str {
        match self {
            Self::Idefics3(_) => "<image>",
            Self::Gemma3(p) => p.placeholder(),
        }
    }

    fn process(&self, rgb: &RgbImage) -> Result<Processed> {
        match self {
            Self::Idefics3(p) => {
                let mut pixels = p.process(std::slice::from_ref(rgb))?;
                let i = pixels.images.pop().ok_or_else(|| Error::internal("the processor returned no image"))?;
                Ok(Processed { prompt: p.image_prompt(i.rows, i.cols), pixels: i.pixel_values, tiles: i.tiles })
            }
            Self::Gemma3(p) => {
                let i = p.process(rgb)?;
                Ok(Processed { prompt: p.image_prompt(&i), tiles: i.crops, pixels: i.pixel_values })
            }
        }
    }
}

/// A vision-language model's image side (`load`).
pub(crate) struct Vision {
    processor: Processor,
    tower: VisionTower,
    limits: ImageLimits,
    cache: Mutex<FeatureCache>,
}

/// What a model does with images: a vision tower, or a reason it takes none.
pub(crate) enum Images {
    Vision(Box<Vision>),
    Refused(String),
}

impl Images {
    /// `model_dir`'s image side when it is a vision-language folder and runs on the CPU;
    /// `device` names where the text model runs.
    pub fn load(model_dir: &Path, args: &ModelArgs, on_cpu: bool) -> Result<Self> {
        if args.text_prefix.is_none() {
            return Ok(Self::Refused("is a text model: it takes no images".into()));
        }
        if !on_cpu {
            return Ok(Self::Refused(
                "runs on CUDA, and images run on the CPU backend only: load it with device = \"cpu\"".into(),
            ));
        }
        let config = std::fs::read_to_string(model_dir.join("config.json"))
            .map_err(|e| Error::model_load(format!("{}: {e}", model_dir.display())))?;
        let vision_args = VisionArgs::from_hf_config(&config)?;
        let src = lmplex_model::weight_source(model_dir, args)?;
        let processor = Processor::from_folder(model_dir, vision_args.family)?;
        let tower = VisionTower::load(&src, vision_args)?;
        let cache = Mutex::new(FeatureCache::default());
        Ok(Self::Vision(Box::new(Vision { processor, tower, limits: ImageLimits::default(), cache })))
    }

    /// Bytes the tower's weights take (counted in the model's memory).
    pub fn bytes(&self) -> usize {
        match self {
            Self::Vision(v) => v.tower.size_in_bytes(),
            Self::Refused(_) => 0,
        }
    }
}

impl Vision {
    /// The image token whose embeddings the features replace.
    pub fn image_token_id(&self) -> u32 {
        self.tower.args().image_token_id
    }

    /// The features' width (the text model's hidden size).
    pub fn hidden(&self) -> usize {
        self.tower.args().text_hidden_size
    }

    /// `text` (a rendered prompt) with its `images`' placeholders expanded, and their features.
    pub fn expand(&self, text: &str, images: &[&Arc<[u8]>]) -> Result<Expanded> {
        if images.len() > MAX_IMAGES_PER_PROMPT {
            return Err(Error::invalid(format!(
                "a prompt may hold at most {MAX_IMAGES_PER_PROMPT} images, got {}",
                images.len()
            )));
        }
        let placeholder = self.processor.placeholder();
        let pieces: Vec<&str> = text.split(placeholder).collect();
        if pieces.len() - 1 != images.len() {
            return Err(Error::invalid(format!(
                "the chat template rendered {} image placeholders ({placeholder}) for {} images",
                pieces.len() - 1,
                images.len()
            )));
        }
        let mut out = String::from(pieces[0]);
        let (mut features, mut salt) = (Vec::new(), String::from("images"));
        for (i, (bytes, piece)) in images.iter().zip(&pieces[1..]).enumerate() {
            let digest: [u8; 32] = Sha256::digest(bytes).into();
            let image = self.image(bytes, digest).map_err(|e| Error::invalid(format!("image {i}: {e}")))?;
            out.push_str(&image.prompt);
            out.push_str(piece);
            features.extend_from_slice(&image.features);
            salt.push_str(&format!(":{}", digest.iter().map(|b| format!("{b:02x}")).collect::<String>()));
        }
        Ok(Expanded { text: out, features, salt })
    }

    /// The image's prompt text and features, from the cache or encoded now.
    fn image(&self, bytes: &[u8], digest: [u8; 32]) -> Result<Arc<Encoded>> {
        if let Some(hit) = self.cache.lock().unwrap_or_else(|p| p.into_inner()).get(&digest) {
            return Ok(hit);
        }
        let rgb = decode(bytes, &self.limits)?;
        let p = self.processor.process(&rgb)?;
        let features = self.tower.encode(&p.pixels, p.tiles)?;
        let encoded = Arc::new(Encoded { prompt: p.prompt, features });
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).insert(digest, encoded.clone());
        Ok(encoded)
    }
}

/// `InputEmbeds` for `ids`: `features` at the image token's positions (each image's tokens a
/// bidirectional block where the family's text model attends so).
pub(crate) fn embeds(vision: &Vision, ids: &[u32], features: Vec<f32>) -> Result<InputEmbeds> {
    let e = InputEmbeds::at_placeholders(ids, vision.image_token_id(), features, vision.hidden())?;
    Ok(if vision.tower.args().bidirectional_images() { e.bidirectional() } else { e })
}

/// One image as encoded: the text that stands for it and its features `[tiles *
/// image_seq_len, hidden]`.
struct Encoded {
    prompt: String,
    features: Vec<f32>,
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
