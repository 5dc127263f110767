//! A prompt's images between admission and the vision tower: `PromptImages`, made on the
//! caller's thread, and `encode_waiting`, which the step loop calls to run the images of many
//! requests through the tower in one pass.
//!
//! Invariants:
//! - An image's features do not depend on the images beside it in a pass (`Family::encode`),
//!   so a request's tokens do not depend on what arrived with it.
//! - The prompt's image tokens are as many as the rows its images give (checked when it is
//!   made, so a mismatch is refused before anything is queued).
//! - A prompt's `InputEmbeds` are made once and shared by its samples; a prompt whose images
//!   were all cached has them from the start and never waits for the tower.

use super::families::{Encoded, Family, Processed};
use super::{Expanded, Part, Vision};
use lmplex_core::{Error, Result};
use lmplex_model::InputEmbeds;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

/// A prompt's images: each cached or waiting for the tower, and once encoded, the prompt's
/// `InputEmbeds`.
pub(crate) struct PromptImages {
    vision: Arc<Vision>,
    parts: Vec<Part>,
    embeds: OnceLock<Arc<InputEmbeds>>,
}

impl PromptImages {
    /// The images of `e` for the prompt `ids` (`e.text` tokenized), checked against the
    /// prompt's image tokens.
    pub fn new(vision: &Arc<Vision>, ids: &[u32], e: Expanded) -> Result<Self> {
        let family = &vision.family;
        let tokens: usize = e.parts.iter().map(|p| p.tokens(family)).sum();
        let token = family.image_token_id();
        let placeholders = ids.iter().filter(|&&t| t == token).count();
        if placeholders != tokens {
            return Err(Error::invalid(format!(
                "the prompt has {placeholders} image placeholder tokens (id {token}) but its images stand for {tokens}"
            )));
        }
        let images = Self { vision: vision.clone(), parts: e.parts, embeds: OnceLock::new() };
        if images.waiting_tokens() == 0 {
            images.finish(ids, &HashMap::new())?;
        }
        Ok(images)
    }

    /// Image tokens still to run through the tower (0 once the prompt's features are made).
    pub fn waiting_tokens(&self) -> usize {
        if self.embeds.get().is_some() {
            return 0;
        }
        let waiting = self.parts.iter().filter(|p| matches!(p, Part::Waiting { .. }));
        waiting.map(|p| p.tokens(&self.vision.family)).sum()
    }

    /// The prompt's features, once made.
    pub fn embeds(&self) -> Option<Arc<InputEmbeds>> {
        self.embeds.get().cloned()
    }

    /// Makes the prompt's features from its cached images and `fresh` ones (by digest).
    fn finish(&self, ids: &[u32], fresh: &HashMap<[u8; 32], Arc<Encoded>>) -> Result<()> {
        if self.embeds.get().is_some() {
            return Ok(());
        }
        let (mut features, mut grids) = (Vec::new(), Vec::new());
        for p in &self.parts {
            let e = match p {
                Part::Ready(e) => e,
                Part::Waiting { digest, .. } => {
                    fresh.get(digest).ok_or_else(|| Error::internal("an image was left out of its pass"))?
                }
            };
            features.extend_from_slice(&e.features);
            grids.extend(e.grid);
        }
        let embeds = self.vision.family.embeds(ids, features, &grids)?;
        let _ = self.embeds.set(Arc::new(embeds));
        Ok(())
    }
}

/// Runs the waiting images of `batch` (each request's prompt ids and images, all of one model)
/// through the tower in one pass, each distinct image once and none cached since admission,
/// then makes every prompt's features; the images it ran. An error fails the whole batch.
pub(crate) fn encode_waiting(batch: &[(&[u32], &PromptImages)]) -> Result<usize> {
    let Some((_, first)) = batch.first() else { return Ok(0) };
    let vision = &first.vision;
    let mut fresh: HashMap<[u8; 32], Arc<Encoded>> = HashMap::new();
    let mut todo: Vec<([u8; 32], &Processed)> = Vec::new();
    for (_, images) in batch {
        if images.embeds.get().is_some() {
            continue;
        }
        for p in &images.parts {
            let Part::Waiting { digest, processed } = p else { continue };
            if fresh.contains_key(digest) || todo.iter().any(|(d, _)| d == digest) {
                continue;
            }
            match vision.cached(digest) {
                Some(hit) => drop(fresh.insert(*digest, hit)),
                None => todo.push((*digest, processed)),
            }
        }
    }
    if !todo.is_empty() {
        let processed: Vec<&Processed> = todo.iter().map(|(_, p)| *p).collect();
        let encoded = vision.family.encode(&processed)?;
        for ((digest, _), e) in todo.iter().zip(encoded) {
            let e = Arc::new(e);
            vision.remember(*digest, e.clone());
            fresh.insert(*digest, e);
        }
    }
    batch.iter().try_for_each(|(ids, images)| images.finish(ids, &fresh))?;
    Ok(todo.len())
}

impl Part {
    /// Image tokens the image stands for (rows of its features).
    fn tokens(&self, family: &Family) -> usize {
        match self {
            Part::Ready(e) => e.features.len() / family.hidden(),
            Part::Waiting { processed, .. } => family.tokens(processed),
        }
    }
}
