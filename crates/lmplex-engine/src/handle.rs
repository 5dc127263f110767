//! What passes between the `Engine` front and its step loop: `Command`s in, one output channel
//! per request out, and the `RequestHandle` a caller holds.
//!
//! Invariants: every request the loop accepts ends with exactly one terminal item on its
//! channel (a chunk with `finish_reason`, or an error), unless its handle was dropped or
//! aborted first; dropping an unfinished handle sends `Command::Abort`, so its KV blocks are
//! freed at the loop's next turn, not when the request would have ended. An abort (from the
//! handle or its `Aborter`, on any thread) is sent once, and a reader waiting on the handle
//! then sees the end of the stream, not an error.

use crate::sequence::Sequence;
use crate::stats::QueueSlot;
use lmplex_core::{Error, RequestOutput, Result, StreamChunk, TokenId};
use lmplex_kv::manager::ReqId;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Instant;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

/// A validated, tokenized request ready for the step loop.
pub(crate) struct NewRequest {
    pub id: ReqId,
    pub seq: Sequence,
    pub arrival: Instant,
    pub tx: UnboundedSender<Result<StreamChunk>>,
    /// Its place in the bounded queue, given back when it is first scheduled or leaves.
    pub slot: QueueSlot,
}

pub(crate) enum Command {
    /// Requests that join the loop in the same turn.
    Add(Vec<NewRequest>),
    Abort(ReqId),
}

/// The caller's end of one request: its chunks, in order, as they are produced.
///
/// `next_blocking` (threads) and `next` (async) give chunks until the one with
/// `finish_reason`; dropping the handle before that aborts the request.
pub struct RequestHandle {
    pub(crate) id: ReqId,
    pub(crate) prompt: String,
    pub(crate) prompt_token_ids: Vec<TokenId>,
    pub(crate) rx: UnboundedReceiver<Result<StreamChunk>>,
    pub(crate) aborter: Aborter,
    pub(crate) done: bool,
}

/// Aborts one request from any thread, also while another thread waits on its handle.
#[derive(Clone)]
pub struct Aborter {
    id: ReqId,
    cmd: mpsc::Sender<Command>,
    aborted: Arc<AtomicBool>,
}

impl Aborter {
    pub(crate) fn new(id: ReqId, cmd: mpsc::Sender<Command>) -> Self {
        Self { id, cmd, aborted: Arc::new(AtomicBool::new(false)) }
    }

    /// Stops the request (once); its blocks are freed at the loop's next turn.
    pub fn abort(&self) {
        if !self.aborted.swap(true, Ordering::AcqRel) {
            let _ = self.cmd.send(Command::Abort(self.id));
        }
    }

    fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }
}

impl RequestHandle {
    /// The engine's id of the request (for `Engine::abort`).
    pub fn id(&self) -> ReqId {
        self.id
    }

    /// Tokens in the request's prompt after tokenization (or templating).
    pub fn num_prompt_tokens(&self) -> usize {
        self.prompt_token_ids.len()
    }

    /// The prompt as text (rendered by the chat template for messages).
    pub fn prompt(&self) -> &str {
        &self.prompt
    }

    /// The prompt's token ids.
    pub fn prompt_token_ids(&self) -> &[TokenId] {
        &self.prompt_token_ids
    }

    /// Whether the last chunk (or an error) has been received.
    pub fn is_finished(&self) -> bool {
        self.done
    }

    fn on_item(&mut self, item: Option<Result<StreamChunk>>) -> Option<Result<StreamChunk>> {
        if self.done {
            return None;
        }
        let Some(item) = item.or_else(|| {
            let stopped = Error::internal("the engine stopped before the request finished");
            (!self.aborter.is_aborted()).then_some(Err(stopped))
        }) else {
            self.done = true; // aborted: the loop dropped the request's sender
            return None;
        };
        if item.as_ref().map_or(true, |c| c.finish_reason.is_some()) {
            self.done = true;
        }
        Some(item)
    }

    /// The next chunk, waiting on this thread; `None` after the last one. Must not be called
    /// from inside an async runtime (use `next` there).
    pub fn next_blocking(&mut self) -> Option<Result<StreamChunk>> {
        if self.done {
            return None;
        }
        let item = self.rx.blocking_recv();
        self.on_item(item)
    }

    /// The next chunk if one is ready now, without waiting; `None` if none is (or after the
    /// last one).
    pub fn try_next(&mut self) -> Option<Result<StreamChunk>> {
        use tokio::sync::mpsc::error::TryRecvError;
        if self.done {
            return None;
        }
        match self.rx.try_recv() {
            Ok(item) => self.on_item(Some(item)),
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => self.on_item(None),
        }
    }

    /// The next chunk; `None` after the last one.
    pub async fn next(&mut self) -> Option<Result<StreamChunk>> {
        if self.done {
            return None;
        }
        let item = self.rx.recv().await;
        self.on_item(item)
    }

    /// Stops the request now; its blocks are freed at the loop's next turn.
    pub fn abort(&mut self) {
        if !self.done {
            self.done = true;
            self.aborter.abort();
        }
    }

    /// A handle that aborts this request from another thread.
    pub fn aborter(&self) -> Aborter {
        self.aborter.clone()
    }

    /// Adds one chunk to an output being assembled (the invariant of `lmplex_core::output`).
    pub(crate) fn fold(out: &mut RequestOutput, c: StreamChunk) {
        out.text.push_str(&c.text);
        out.reasoning.push_str(&c.reasoning);
        out.token_ids.extend(c.token_ids);
        out.tool_calls.extend(c.tool_calls);
        if c.prompt_logprobs.is_some() {
            out.prompt_logprobs = c.prompt_logprobs;
        }
        if let Some(l) = c.logprobs {
            out.logprobs.get_or_insert_with(Vec::new).extend(l);
        }
        if let Some(f) = c.finish_reason {
            out.finish_reason = f;
            out.stop_reason = c.stop_reason;
        }
        if let Some(u) = c.usage {
            out.usage = u;
        }
        if c.embedding.is_some() {
            out.embedding = c.embedding;
        }
    }

    fn empty_output(&self) -> RequestOutput {
        RequestOutput {
            prompt: self.prompt.clone(),
            text: String::new(),
            reasoning: String::new(),
            token_ids: Vec::<TokenId>::new(),
            finish_reason: lmplex_core::FinishReason::Length,
            stop_reason: None,
            usage: lmplex_core::Usage { prompt_tokens: self.prompt_token_ids.len(), ..Default::default() },
            logprobs: None,
            tool_calls: Vec::new(),
            prompt_logprobs: None,
            embedding: None,
        }
    }

    /// Waits for the whole output on this thread.
    pub fn collect_blocking(mut self) -> Result<RequestOutput> {
        let mut out = self.empty_output();
        while let Some(c) = self.next_blocking() {
            Self::fold(&mut out, c?);
        }
        Ok(out)
    }

    /// Waits for the whole output.
    pub async fn collect(mut self) -> Result<RequestOutput> {
        let mut out = self.empty_output();
        while let Some(c) = self.next().await {
            Self::fold(&mut out, c?);
        }
        Ok(out)
    }
}

impl Drop for RequestHandle {
    fn drop(&mut self) {
        self.abort();
    }
}
