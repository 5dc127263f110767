//! Each vision-language family's processor and tower behind one interface: Idefics3 / SmolVLM
//! and Gemma 3 (a SigLIP `VisionTower`), Qwen2-VL and Qwen2.5-VL (`Qwen2VlTower`).
//!
//! Invariants: the family is read once, from `config.json`'s `model_type` or an mmproj file's
//! `clip.projector_type`, and the processor and tower always come from the same family; the processor's shapes must be the tower's
//! (Qwen's patch, frame and merge sizes; Gemma 3's image size and tokens per image: checked at
//! load, `Error::ModelLoad` naming both); an image's `Processed` depends
//! only on its pixels, so its encoding can be cached by its bytes' hash.

use lmplex_core::{Error, Result};
use lmplex_image::{
    Gemma3Config, Gemma3Processor, Idefics3Config, Idefics3Processor, Qwen2VlConfig, Qwen2VlProcessor, RgbImage,
};
use lmplex_model::vision::{Mmproj, Qwen2VlTower, TowerArgs, VisionFamily, VisionTower};
use lmplex_model::{InputEmbeds, Tokenizer, WeightSource};
use std::path::Path;

/// A family's image processor (lmplex-image).
enum Processor {
    Idefics3(Idefics3Processor),
    Gemma3(Gemma3Processor),
    Qwen2Vl(Qwen2VlProcessor),
}

/// A family's tower (lmplex-model).
enum Tower {
    Siglip(VisionTower),
    Qwen2Vl(Qwen2VlTower),
}

/// One image as its processor leaves it: the tower's input and the text that stands for it.
pub(super) struct Processed {
    pixels: Vec<f32>,
    /// Tiles or crops of a SigLIP tower; 1 for Qwen2-VL (its grid says the rest).
    tiles: usize,
    /// Qwen2-VL's `image_grid_thw` in patches.
    grid: Option<[usize; 3]>,
    pub prompt: String,
}

/// One image encoded: its prompt text, its features `[tokens, hidden]`, and for M-RoPE its
/// grid in image tokens (temporal, height, width after merging).
pub(super) struct Encoded {
    pub prompt: String,
    pub features: Vec<f32>,
    pub grid: Option<[usize; 3]>,
}

/// A vision-language folder's processor and tower.
pub(super) struct Family {
    processor: Processor,
    tower: Tower,
}

impl Family {
    /// The family of `config` (`config.json`'s text), its processor from `dir` and its tower
    /// from `src`.
    pub fn load(dir: &Path, config: &str, src: &WeightSource) -> Result<Self> {
        let args = TowerArgs::from_hf_config(config)?;
        let processor = match &args {
            TowerArgs::Qwen2Vl(_) => Processor::Qwen2Vl(Qwen2VlProcessor::from_folder(dir)?),
            TowerArgs::Siglip(a) => match a.family {
                VisionFamily::Idefics3 { .. } => Processor::Idefics3(Idefics3Processor::from_folder(dir)?),
                VisionFamily::Gemma3 { .. } => Processor::Gemma3(Gemma3Processor::from_folder(dir)?),
            },
        };
        Self::assemble(args, processor, src)
    }

    /// The family of a llama.cpp multimodal projector file (`mmproj`): its tower (computing in
    /// `dtype`), and its processor from what the file records (mean, std, sizes) with
    /// transformers' defaults for the rest; the image token's id is `tokenizer`'s (the text
    /// model's).
    pub fn load_mmproj(path: &Path, tokenizer: &Tokenizer, dtype: lmplex_core::DType) -> Result<Self> {
        let token_id = |token: &str| {
            tokenizer.token_id(token).ok_or_else(|| {
                Error::model_load(format!(
                    "{}: the text model's vocabulary has no '{token}', the image token of this mmproj's family",
                    path.display()
                ))
            })
        };
        let mut mm = Mmproj::open(path, token_id)?;
        mm.weights.set_dtype(dtype);
        let (pre, post) = (mm.preprocessor_config.to_string(), mm.processor_config.to_string());
        let processor = match &mm.tower {
            TowerArgs::Qwen2Vl(_) => {
                Processor::Qwen2Vl(Qwen2VlProcessor::new(Qwen2VlConfig::from_json(&pre, Some(&post))?)?)
            }
            TowerArgs::Siglip(a) => match a.family {
                VisionFamily::Idefics3 { .. } => {
                    Processor::Idefics3(Idefics3Processor::new(Idefics3Config::from_json(&pre, Some(&post))?)?)
                }
                VisionFamily::Gemma3 { .. } => {
                    Processor::Gemma3(Gemma3Processor::new(Gemma3Config::from_json(&pre, Some(&post))?)?)
                }
            },
        };
        Self::assemble(mm.tower, processor, &mm.weights)
    }

    /// The tower of `args` from `src` beside `processor`, their shapes checked against each
    /// other (`Error::ModelLoad` naming both).
    fn assemble(args: TowerArgs, processor: Processor, src: &WeightSource) -> Result<Self> {
        let tower = match (args, &processor) {
            (TowerArgs::Qwen2Vl(args), Processor::Qwen2Vl(p)) => {
                let c = p.config();
                let (ours, theirs) = (
                    (c.patch_size, c.temporal_patch_size, c.merge_size),
                    (args.patch_size, args.temporal_patch_size, args.spatial_merge_size),
                );
                if ours != theirs {
                    return Err(Error::model_load(format!(
                        "the processor's (patch_size, temporal_patch_size, merge_size) {ours:?} are not the \
                         vision config's {theirs:?}"
                    )));
                }
                Tower::Qwen2Vl(Qwen2VlTower::load(src, args)?)
            }
            (TowerArgs::Siglip(args), Processor::Gemma3(p)) => {
                let VisionFamily::Gemma3 { mm_tokens_per_image } = args.family else {
                    return Err(Error::internal("a Gemma 3 processor beside another tower"));
                };
                let c = p.config();
                let side = args.image_size;
                let sized = !c.do_resize || c.size == lmplex_image::Size::Exact { height: side, width: side };
                if !sized || c.image_seq_length != mm_tokens_per_image {
                    return Err(Error::model_load(format!(
                        "the processor's size {:?} and image_seq_length {} are not the vision config's \
                         {side} x {side} images of mm_tokens_per_image {mm_tokens_per_image}",
                        c.size, c.image_seq_length
                    )));
                }
                Tower::Siglip(VisionTower::load(src, args)?)
            }
            (TowerArgs::Siglip(args), Processor::Idefics3(_)) => Tower::Siglip(VisionTower::load(src, args)?),
            _ => return Err(Error::internal("a processor of another family than its tower")),
        };
        Ok(Self { processor, tower })
    }

    /// Bytes the tower's weights take.
    pub fn size_in_bytes(&self) -> usize {
        match &self.tower {
            Tower::Siglip(t) => t.size_in_bytes(),
            Tower::Qwen2Vl(t) => t.size_in_bytes(),
        }
    }

    /// The token whose embeddings the features replace.
    pub fn image_token_id(&self) -> u32 {
        match &self.tower {
            Tower::Siglip(t) => t.args().image_token_id,
            Tower::Qwen2Vl(t) => t.args().image_token_id,
        }
    }

    /// The features' width (the text model's hidden size).
    pub fn hidden(&self) -> usize {
        match &self.tower {
            Tower::Siglip(t) => t.args().text_hidden_size,
            Tower::Qwen2Vl(t) => t.args().text_hidden_size,
        }
    }

    /// The placeholder the chat template renders for an image part.
    pub fn placeholder(&self) -> &str {
        match &self.processor {
            Processor::Idefics3(_) => "<image>",
            Processor::Gemma3(p) => p.placeholder(),
            Processor::Qwen2Vl(p) => p.placeholder(),
        }
    }

    /// `rgb` through the processor.
    pub fn process(&self, rgb: &RgbImage) -> Result<Processed> {
        Ok(match &self.processor {
            Processor::Idefics3(p) => {
                let mut pixels = p.process(std::slice::from_ref(rgb))?;
                let i = pixels.images.pop().ok_or_else(|| Error::internal("the processor returned no image"))?;
                let prompt = p.image_prompt(i.rows, i.cols);
                Processed { prompt, pixels: i.pixel_values, tiles: i.tiles, grid: None }
            }
            Processor::Gemma3(p) => {
                let i = p.process(rgb)?;
                Processed { prompt: p.image_prompt(&i), tiles: i.crops, pixels: i.pixel_values, grid: None }
            }
            Processor::Qwen2Vl(p) => {
                let i = p.process(rgb)?;
                Processed { prompt: p.image_prompt(&i), tiles: 1, grid: Some(i.grid_thw), pixels: i.pixel_values }
            }
        })
    }

    /// Image tokens (rows of features) `p` stands for.
    pub fn tokens(&self, p: &Processed) -> usize {
        match (&self.tower, self.grid(p)) {
            (Tower::Siglip(t), _) => p.tiles * t.args().image_seq_len(),
            (Tower::Qwen2Vl(_), Some([t, h, w])) => t * h * w,
            (Tower::Qwen2Vl(_), None) => 0,
        }
    }

    /// `p`'s grid in image tokens after merging (temporal, height, width), for M-RoPE.
    pub fn grid(&self, p: &Processed) -> Option<[usize; 3]> {
        match (&self.tower, p.grid) {
            (Tower::Qwen2Vl(t), Some([gt, gh, gw])) => {
                let m = t.args().spatial_merge_size;
                Some([gt, gh / m, gw / m])
            }
            _ => None,
        }
    }

    /// The features of `images` through the tower in one pass: their tiles (or patches) one
    /// batch, the features split back image by image. Each tile's (each Qwen image's) rows
    /// depend on it alone, so an image's features are the same bits in any batch.
    pub fn encode(&self, images: &[&Processed]) -> Result<Vec<Encoded>> {
        let pixels: std::borrow::Cow<[f32]> = match images {
            [one] => (&one.pixels[..]).into(),
            _ => images.iter().flat_map(|p| p.pixels.iter().copied()).collect::<Vec<f32>>().into(),
        };
        let features = match &self.tower {
            Tower::Siglip(t) => t.encode(&pixels, images.iter().map(|p| p.tiles).sum())?,
            Tower::Qwen2Vl(t) => {
                let grids = images
                    .iter()
                    .map(|p| p.grid.ok_or_else(|| Error::internal("a Qwen2-VL image without its grid")))
                    .collect::<Result<Vec<_>>>()?;
                t.encode(&pixels, &grids)?
            }
        };
        let hidden = self.hidden();
        let mut rest = &features[..];
        let mut out = Vec::with_capacity(images.len());
        for p in images {
            let n = self.tokens(p) * hidden;
            if n > rest.len() {
                return Err(Error::internal("the tower gave fewer features than its images' tokens"));
            }
            let (mine, tail) = rest.split_at(n);
            rest = tail;
            out.push(Encoded { prompt: p.prompt.clone(), features: mine.to_vec(), grid: self.grid(p) });
        }
        Ok(out)
    }

    /// `InputEmbeds` for a prompt of `ids`: `features` at the image tokens, each image's tokens
    /// a bidirectional block (Gemma 3), or M-RoPE positions from the images' `grids` (Qwen2-VL).
    pub fn embeds(&self, ids: &[u32], features: Vec<f32>, grids: &[[usize; 3]]) -> Result<InputEmbeds> {
        let e = InputEmbeds::at_placeholders(ids, self.image_token_id(), features, self.hidden())?;
        match &self.tower {
            Tower::Siglip(t) if t.args().bidirectional_images() => Ok(e.bidirectional()),
            Tower::Siglip(_) => Ok(e),
            Tower::Qwen2Vl(_) => e.with_mrope(ids.len(), grids),
        }
    }
}
