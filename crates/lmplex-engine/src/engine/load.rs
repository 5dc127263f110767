//! What `Engine::with_tenants` derives once from a loaded checkpoint and its config: the
//! scheduler's settings, the model's description, the fingerprint, the chat features its
//! template implies, an embedding model's pooling, and the step loop's thread.
//!
//! Invariant: every value here is resolved once, at load, from the config and the checkpoint,
//! and carried by the `Engine`; nothing is looked up again per request.

use crate::handle::Command;
use crate::report::{ModelInfo, RuntimeInfo};
use crate::sizing::{KvSizing, BLOCK_SIZE};
use crate::step_loop::EngineCore;
use crate::tenants::Tenants;
use lmplex_core::{Error, ModelConfig, Result, SchedulingPolicy, TokenId};
use lmplex_model::{ModelArgs, Tokenizer};
use lmplex_sched::{BatchMode, Drafter, Policy, SchedulerConfig};
use std::sync::mpsc;
use std::time::Duration;

/// The scheduler's settings from `config` (`Fair` by default when tenants are configured).
pub(super) fn scheduler_config(config: &ModelConfig, tenants: &Tenants) -> SchedulerConfig {
    SchedulerConfig {
        max_num_seqs: config.max_model_concurrency,
        max_num_batched_tokens: config.batched_tokens(),
        // The bound is kept by `submit` (`max_queue_len`); preempted requests re-queue freely.
        max_waiting: usize::MAX,
        policy: match config.scheduling_policy {
            Some(SchedulingPolicy::Fcfs) => Policy::Fcfs,
            Some(SchedulingPolicy::Priority) => Policy::Priority,
            Some(SchedulingPolicy::Fair) => Policy::Fair,
            None if tenants.is_empty() => Policy::Fcfs,
            None => Policy::Fair,
        },
        batch_mode: match config.model_batch_execute_timeout_ms {
            0 => BatchMode::Single,
            ms => BatchMode::Batch { timeout: Duration::from_millis(ms) },
        },
        preemption_mode: config.preemption_mode,
        max_loras: config.max_loras.max(1),
        speculative: config.speculative.as_ref().map(Drafter::new),
    }
}

/// What was loaded and how (`Engine::info`).
pub(super) fn model_info(
    checkpoint: lmplex_model::CheckpointInfo,
    a: &ModelArgs,
    max_positions: usize,
    tokenizer: &Tokenizer,
    sizing: &KvSizing,
    runtime: RuntimeInfo,
) -> ModelInfo {
    ModelInfo {
        checkpoint,
        architecture: a.arch.name(),
        num_parameters: a.num_parameters(),
        num_hidden_layers: a.num_hidden_layers,
        hidden_size: a.hidden_size,
        intermediate_size: a.intermediate_size,
        num_attention_heads: a.num_attention_heads,
        num_key_value_heads: a.num_key_value_heads,
        head_dim: a.head_dim,
        vocab_size: a.vocab_size,
        context_length: a.max_position_embeddings,
        max_model_len: max_positions,
        has_chat_template: tokenizer.has_chat_template(),
        kv_block_size: BLOCK_SIZE,
        kv_num_blocks: sizing.num_blocks,
        kv_swap_num_blocks: sizing.num_swap_blocks,
        runtime,
    }
}

/// OpenAI's `system_fingerprint`: `fp_` and 10 hex digits of a digest of the lmplex version and
/// `info`.
pub(super) fn fingerprint(info: &ModelInfo) -> String {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(format!("lmplex {} {info:?}", env!("CARGO_PKG_VERSION")).as_bytes());
    format!("fp_{}", d.iter().take(5).map(|b| format!("{b:02x}")).collect::<String>())
}

/// How the model writes tool calls (the config's `tool_call_parser`, else the chat template's
/// format), and whether chat replies carry reasoning with its `<think>`/`</think>` tokens when
/// both are single tokens.
pub(super) fn chat_features(
    config: &ModelConfig,
    tokenizer: &Tokenizer,
) -> (Option<lmplex_core::ToolCallParser>, Option<Option<(TokenId, TokenId)>>) {
    let tool_format = config
        .tool_call_parser
        .or_else(|| tokenizer.chat_template_source().and_then(lmplex_model::tool_parser::detect));
    let reasoning = match config.reasoning_parser {
        Some(p) => p == lmplex_core::ReasoningParser::Think,
        None => tokenizer.chat_template_source().is_some_and(lmplex_model::reasoning::detect),
    };
    let think_tokens = || {
        use lmplex_model::reasoning::{CLOSE, OPEN};
        Some((tokenizer.token_id(OPEN)?, tokenizer.token_id(CLOSE)?))
    };
    (tool_format, reasoning.then(think_tokens))
}

/// An embedding model's pooling: the config's, else the folder's sentence-transformers
/// pooling, else `last`; `None` for a generating model.
pub(super) fn pooling(config: &ModelConfig) -> Result<Option<lmplex_core::Pooling>> {
    Ok(match config.task {
        lmplex_core::Task::Generate => None,
        lmplex_core::Task::Embed => Some(match config.pooling {
            Some(p) => p,
            None => {
                lmplex_model::pooling::sentence_transformers(config.checkpoint())?.unwrap_or(lmplex_core::Pooling::Last)
            }
        }),
    })
}

/// Starts `core`'s step loop on its own OS thread, named after the model, reading `rx`.
pub(super) fn spawn_loop(core: EngineCore, rx: mpsc::Receiver<Command>, config: &ModelConfig) -> Result<()> {
    std::thread::Builder::new()
        .name(format!("lmplex-engine-{}", config.served_name().rsplit('/').next().unwrap_or("model")))
        .spawn(move || {
            core.run(rx);
            // The engine is gone (its model and KV pool freed with the loop): hand the freed
            // heap back to the OS, so an unloaded model stops counting in RSS.
            #[cfg(all(target_os = "linux", target_env = "gnu"))]
            // SAFETY: malloc_trim only releases free heap pages; it has no preconditions.
            unsafe {
                libc::malloc_trim(0);
            }
        })
        .map(drop)
        .map_err(|e| Error::internal(format!("cannot start the engine thread: {e}")))
}
