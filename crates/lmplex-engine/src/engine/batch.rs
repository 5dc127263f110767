//! Running a batch of requests to completion: `Engine::batch` admits a prepared call first,
//! then `generate` (or `generate_async`) feeds it into the bounded queue as room appears and
//! collects the outputs.
//!
//! Invariant: one bad or refused request fails the whole batch before any is queued; outputs
//! come back in request order.

use super::{Engine, Prepared, Request};
use crate::handle::RequestHandle;
use crate::sequence::Sequence;
use lmplex_core::{RequestOutput, Result};
use std::collections::VecDeque;
use std::time::Duration;

impl Engine {
    /// Admits a prepared call (one admission per tenant); nothing is queued yet, and a
    /// refusal fails the whole batch.
    pub fn batch(&self, p: Prepared) -> Result<Batch> {
        let pending: VecDeque<Sequence> = self.admitted(p)?.into();
        Ok(Batch { n: pending.len(), pending, running: VecDeque::new(), outs: Vec::new() })
    }

    /// Queues what the queue has room for; true when nothing of the batch is in flight and
    /// some is still pending (the caller waits a little and tries again).
    fn feed(&self, b: &mut Batch) -> Result<bool> {
        let mut slotted = Vec::new();
        while let Some(slot) = b.pending.front().and_then(|seq| self.reserve(seq).ok()) {
            slotted.extend(b.pending.pop_front().map(|seq| (seq, slot)));
        }
        if !slotted.is_empty() {
            b.running.extend(self.send(slotted)?);
        }
        Ok(b.running.is_empty())
    }

    /// Runs every request to completion as one continuous batch; outputs in request order.
    /// A batch larger than the free queue is fed in as room appears.
    pub fn generate(&self, reqs: &[Request]) -> Result<Vec<RequestOutput>> {
        let mut b = self.batch(self.prepare_requests(reqs)?)?;
        while b.outs.len() < b.n {
            if self.feed(&mut b)? {
                std::thread::sleep(QUEUE_FULL_RETRY);
                continue;
            }
            let h = b.running.pop_front().expect("fed");
            b.outs.push(h.collect_blocking()?);
        }
        Ok(b.outs)
    }

    /// `generate` for async callers, over a batch from `batch`.
    pub async fn generate_async(&self, mut b: Batch) -> Result<Vec<RequestOutput>> {
        while b.outs.len() < b.n {
            if self.feed(&mut b)? {
                tokio::time::sleep(QUEUE_FULL_RETRY).await;
                continue;
            }
            let h = b.running.pop_front().expect("fed");
            b.outs.push(h.collect().await?);
        }
        Ok(b.outs)
    }
}

/// How long `generate` waits before retrying when the queue is full of other callers' work.
const QUEUE_FULL_RETRY: Duration = Duration::from_millis(2);

/// Requests prepared and admitted by `Engine::batch`, fed to the engine by `generate`/`generate_async`.
pub struct Batch {
    n: usize,
    pending: VecDeque<Sequence>,
    running: VecDeque<RequestHandle>,
    outs: Vec<RequestOutput>,
}

impl Batch {
    /// Requests in the batch.
    pub fn len(&self) -> usize {
        self.n
    }
    /// Whether the batch has no requests.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
}
