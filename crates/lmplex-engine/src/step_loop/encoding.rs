//! Requests whose images wait for the vision tower. They wait here in arrival order, out of
//! the scheduler, until a turn of the loop runs their images through the tower
//! (`vision::encode_waiting`): a batch of requests at a time, up to the encoder budget in image
//! tokens (vLLM's `max_num_encoder_input_tokens`, which is `max_num_batched_tokens`). Then they
//! join the scheduler like any request.
//!
//! Invariants:
//! - A request waiting here keeps its place in the bounded queue: it counts as queued.
//! - Each turn encodes at least the oldest request, however many tokens its images hold, so
//!   no request waits forever; one turn's tower work is bounded by the budget otherwise, so a
//!   burst of images delays the running requests' steps by about one budget each turn.
//! - An aborted or dropped request leaves without running the tower; a failed pass fails
//!   the requests of its batch, not the loop.

use super::EngineCore;
use crate::handle::NewRequest;
use crate::vision::{encode_waiting, PromptImages};
use lmplex_core::Error;
use lmplex_kv::manager::ReqId;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::Instant;

impl EngineCore {
    /// One turn's tower pass, if requests wait for it: they then join the scheduler.
    pub(super) fn encode(&mut self) {
        if self.encoding.is_empty() {
            return;
        }
        let (ready, images) = self.encoding.next_batch();
        if images > 0 {
            self.stats.num_encoder_passes.fetch_add(1, Ordering::Relaxed);
            self.stats.num_images_encoded.fetch_add(images as u64, Ordering::Relaxed);
        }
        ready.into_iter().for_each(|r| self.add(r));
    }
}

pub(super) struct Encoding {
    queue: VecDeque<NewRequest>,
    /// Image tokens one pass may encode (the oldest request's pass whatever their count).
    budget: usize,
}

impl Encoding {
    pub fn new(budget: usize) -> Self {
        Self { queue: VecDeque::new(), budget }
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Queues `r`, whose sequence has images waiting.
    pub fn push(&mut self, r: NewRequest) {
        self.queue.push_back(r);
    }

    /// Takes the request `id` out, if it waits here.
    pub fn take(&mut self, id: ReqId) -> Option<NewRequest> {
        let i = self.queue.iter().position(|r| r.id == id)?;
        self.queue.remove(i)
    }

    /// Drops the requests whose callers are gone (their queue places are given back).
    pub fn drop_closed(&mut self) {
        self.queue.retain(|r| !r.tx.is_closed());
    }

    /// The next batch, its images encoded and each sequence's features set, and the images the
    /// pass encoded; the requests of a failed pass are sent its error and left out.
    pub fn next_batch(&mut self) -> (Vec<NewRequest>, usize) {
        let mut batch = Vec::new();
        let mut tokens = 0;
        while let Some(front) = self.queue.front() {
            let t = front.seq.images.as_ref().map_or(0, |i| i.waiting_tokens());
            if !batch.is_empty() && tokens + t > self.budget {
                break;
            }
            tokens += t;
            batch.extend(self.queue.pop_front());
        }
        let started = Instant::now();
        let jobs: Vec<(&[u32], &PromptImages)> =
            batch.iter().filter_map(|r| Some((&r.seq.prompt_ids[..], r.seq.images.as_deref()?))).collect();
        let result = encode_waiting(&jobs);
        let images = *result.as_ref().unwrap_or(&0);
        let elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
        tracing::debug!(requests = batch.len(), tokens, elapsed_ms, "encoded images");
        let mut ready = Vec::with_capacity(batch.len());
        for mut r in batch {
            // Every request here has images; a pass that succeeded made every prompt's features.
            match (&result, r.seq.images.take().and_then(|i| i.embeds())) {
                (Ok(_), Some(e)) => {
                    r.seq.embeds = Some(e);
                    ready.push(r);
                }
                (Ok(_), None) => drop(r.tx.send(Err(Error::internal("an image prompt was left unencoded")))),
                (Err(e), _) => drop(r.tx.send(Err(e.clone()))),
            }
        }
        (ready, images)
    }
}
