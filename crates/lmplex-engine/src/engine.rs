//! `Engine`: one loaded model serving many requests as one continuous batch.
//!
//! The front validates and tokenizes a request on the caller's thread, reserves a place in the
//! bounded queue and sends it to the model's step loop (`step_loop::EngineCore`, on its own OS
//! thread), which owns the scheduler and the one shared KV pool. Each request gets its own
//! output channel (`RequestHandle`); `generate` is `submit` for each prompt, then collect.
//!
//! Invariants: a request's tokens depend only on its prompt, parameters and seed, whatever
//! else runs (see `core`); the KV pool is allocated once, at `new`, and sized from
//! `kv_cache_bytes` or `max_model_len x max_model_concurrency`; so is the swap space (the warm
//! tier preempted requests swap to: `kv_swap_bytes`, by default as large as the pool up to
//! 4 GiB, committed only as it is used); a request that could never fit it, or is invalid, is
//! refused here with `InvalidRequest` before it reaches the loop; more than `max_queue_len`
//! requests waiting for their first step is a `Capacity` error (`QueueSlots`).

use crate::handle::{Command, RequestHandle};
use crate::lora::LoraRegistry;
use crate::report::{MemoryReport, ModelInfo};
use crate::runner::{self, Loaded, Memory};
use crate::signals::LiveSignals;
use crate::step_loop::EngineCore;

mod admission;
mod batch;
mod load;
pub use admission::Prepared;
pub use batch::Batch;
mod for_router;
mod tools;
mod warm;
use crate::sizing::{KvSizing, BLOCK_SIZE};
use crate::stats::Stats;
use crate::tenants::Tenants;
use lmplex_core::{ModelConfig, Result, SamplingParams, TokenId};
use lmplex_kv::KvCacheManager;
use lmplex_model::{ChatMessage, GuidedFactory, Tokenizer};
use lmplex_sched::{CostModel, DeviceLedger, Scheduler};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, OnceLock};

/// A prompt: plain text (tokenized with the model's special-token rules), chat messages
/// (rendered by the chat template) or token ids (sent as they are, like vLLM's `TokensPrompt`).
#[derive(Debug, Clone)]
pub enum Prompt {
    /// Plain text, encoded with the tokenizer's special-token rules (BOS if the checkpoint wants it).
    Text(String),
    /// Chat messages (roles from `CHAT_ROLES`), rendered with the model's chat template.
    Messages(Vec<ChatMessage>),
    /// Token ids, used as they are; each must be inside the model's vocabulary.
    TokenIds(Vec<TokenId>),
    /// Fill in the middle: the text between `prefix` and `suffix`, for a code model with FIM
    /// tokens (`Tokenizer::infill`; others refuse it).
    Infill {
        /// The text before the gap.
        prefix: String,
        /// The text after the gap.
        suffix: String,
    },
}

/// What a user submits: a prompt and how to sample its reply. The scheduler's view of it is
/// `lmplex_sched::SchedulerRequest`.
#[derive(Debug, Clone)]
pub struct Request {
    /// Text, chat messages or token ids.
    pub prompt: Prompt,
    /// How to pick tokens.
    pub params: SamplingParams,
    /// Under `priority` and `fair`: lower runs first (vLLM's convention); 0 takes the
    /// tenant's priority.
    pub priority: i32,
    /// Prefix-cache salt: only requests with the same salt share cached blocks, so one caller
    /// cannot probe another's prompts by timing. A tenant's requests are salted by the tenant
    /// as well.
    pub cache_salt: Option<String>,
    /// The tenant by name, for callers that name it (`Call::by_name`, `Engine::submit_all`):
    /// its quotas admit the request, its share orders it under `fair`; `None` is the default
    /// tenant. A `Call` made for a resolved tenant does not read it.
    pub tenant: Option<String>,
    /// Tools offered to the model (chat prompts only), how it may call them, and so how its
    /// output is parsed into `tool_calls`.
    pub tools: Option<lmplex_core::Tools>,
    /// The LoRA adapter to run under, by its name in the model's `lora_modules` (or loaded
    /// since, `Engine::lora`); `None` runs the base.
    pub lora: Option<String>,
    /// More variables for the chat template (chat prompts), e.g. `{"enable_thinking": false}`.
    pub chat_template_kwargs: lmplex_model::chat::ChatTemplateKwargs,
    /// For an embedding model (`Task::Embed`): how the prompt's vector is shaped; such a
    /// request generates nothing (`params` are not read). `None` on an embedding model is
    /// refused, as `Some` on a generating one.
    pub pooling: Option<lmplex_core::PoolingParams>,
}

impl Request {
    /// A request for `prompt` sampled by `params`, priority 0, no cache salt, no tenant, no tools.
    pub fn new(prompt: Prompt, params: SamplingParams) -> Self {
        Self {
            prompt,
            params,
            priority: 0,
            cache_salt: None,
            tenant: None,
            tools: None,
            lora: None,
            chat_template_kwargs: Default::default(),
            pooling: None,
        }
    }
}

/// The next `Engine::serial`.
static NEXT_SERIAL: AtomicU64 = AtomicU64::new(1);

/// The message roles a chat prompt may use (OpenAI's).
pub const CHAT_ROLES: &[&str] = &["system", "developer", "user", "assistant", "tool"];

/// One loaded model and its step-loop thread, serving many requests as one continuous batch.
pub struct Engine {
    vocab_size: usize,
    mem: Memory,
    tokenizer: Arc<Tokenizer>,
    config: ModelConfig,
    max_model_len: usize,
    info: ModelInfo,
    sizing: KvSizing,
    stats: Arc<Stats>,
    signals: Arc<LiveSignals>,
    /// The service ledger of its device, shared with the other models on it.
    ledger: Arc<DeviceLedger>,
    /// Its scheduler's seat on `ledger`.
    seat: usize,
    cmd: mpsc::Sender<Command>,
    next_id: AtomicU64,
    /// Tells this engine's `Prepared` calls from another's.
    serial: u64,
    /// Prompts rendered and tokenized (`num_prompt_renders`).
    renders: AtomicU64,
    tenants: Arc<Tenants>,
    /// Built on the first structured-output request (the token trie takes a moment).
    guided: OnceLock<Result<GuidedFactory>>,
    /// How the model writes tool calls: the config's `tool_call_parser`, else the format the
    /// chat template teaches (read once, at load).
    tool_format: Option<lmplex_core::ToolCallParser>,
    /// Whether chat replies carry reasoning (`ModelConfig::reasoning_parser`, else the chat
    /// template), and the `<think>`/`</think>` tokens when both are single tokens.
    reasoning: Option<Option<(TokenId, TokenId)>>,
    /// OpenAI's `system_fingerprint`: `fp_` and 10 hex digits of a digest of the lmplex version
    /// and what was loaded and how (`ModelInfo`).
    fingerprint: String,
    /// The LoRA adapters served on this model.
    lora: LoraRegistry,
    /// An embedding model's pooling (`Task::Embed`: the config's `pooling`, else the folder's
    /// sentence-transformers pooling, else `last`; resolved at load); `None` generates.
    pooling: Option<lmplex_core::Pooling>,
    /// The model's hidden size: an embedding's length.
    hidden_size: usize,
    /// What the model does with a prompt's images (`vision.rs`).
    images: crate::vision::Images,
    /// Longest prompt text, in bytes, that `max_model_len` tokens could hold
    /// (`Tokenizer::max_bytes_per_token`): a longer one is refused before it is tokenized.
    max_prompt_bytes: usize,
}

impl Engine {
    /// Loads the model at `config.checkpoint()` (a `.gguf` file or Hugging Face folder),
    /// reserves its KV pool and starts its step loop; no tenants are configured (any tenant
    /// name is a fairness group without quotas).
    pub fn new(config: ModelConfig) -> Result<Self> {
        Self::with_tenants(config, Arc::default())
    }

    /// `new`, with the tenants whose quotas admit its requests (shared with other engines).
    pub fn with_tenants(config: ModelConfig, tenants: Arc<Tenants>) -> Result<Self> {
        config.validate()?;
        let started = std::time::Instant::now();
        let Loaded { runner, tokenizer, args, max_positions, checkpoint, runtime, sizing, mut memory } =
            runner::load(&config)?;
        let max_model_len = max_positions;
        let lora = LoraRegistry::new(runner.lora_base(), runtime.device, &config)?;
        let a = &args;
        let info = load::model_info(checkpoint, a, max_positions, &tokenizer, &sizing, runtime);
        let manager = KvCacheManager::new(sizing.num_blocks, BLOCK_SIZE, config.enable_prefix_caching)
            .with_warm_tier(sizing.num_swap_blocks);
        let ledger = tenants.ledger(crate::placement::place_model(&config));
        let mut sched = Scheduler::new(load::scheduler_config(&config, &tenants), manager).with_ledger(&ledger);
        let seat = sched.fairness().seat().id();
        // Prior for the copy cost until the loop measures it: 5 GB/s.
        sched.set_cost_model(CostModel {
            swap_s_per_token: (sizing.bytes_per_block / BLOCK_SIZE) as f64 / 5e9,
            ..sched.cost_model()
        });
        let draft = crate::draft::load(&config, &tokenizer, a.vocab_size, sizing.num_blocks)?;
        if let Some((bytes, live)) = draft.as_ref().map(crate::draft::DraftModel::memory) {
            (memory.other, memory.draft_live) = (memory.other + bytes, live);
        }
        let on_cpu = info.runtime.device == "cpu";
        let images = crate::vision::Images::load(&config, a, on_cpu, &tokenizer)?;
        memory.other += images.bytes();
        let tokenizer = Arc::new(tokenizer);
        let stats = Arc::new(Stats::default());
        let signals = Arc::new(LiveSignals::default());
        let core =
            EngineCore::new(runner, tokenizer.clone(), sched, a.vocab_size, stats.clone(), signals.clone(), draft);
        let (cmd, rx) = mpsc::channel();
        load::spawn_loop(core, rx, &config)?;
        tracing::info!(
            model = %config.served_name(),
            architecture = a.arch.name(),
            device = info.runtime.device,
            weight_bytes = memory.weights,
            kv_cache_bytes = sizing.kv_cache_bytes(),
            seconds = format!("{:.2}", started.elapsed().as_secs_f64()),
            "loaded model"
        );
        let (tool_format, reasoning) = load::chat_features(&config, &tokenizer);
        Ok(Self {
            pooling: load::pooling(&config)?,
            hidden_size: args.hidden_size,
            images,
            max_prompt_bytes: max_model_len.saturating_mul(tokenizer.max_bytes_per_token()),
            tool_format,
            reasoning,
            fingerprint: load::fingerprint(&info),
            max_model_len,
            vocab_size: args.vocab_size,
            mem: memory,
            tokenizer,
            config,
            info,
            sizing,
            stats,
            signals,
            ledger,
            seat,
            cmd,
            next_id: AtomicU64::new(1),
            serial: NEXT_SERIAL.fetch_add(1, Ordering::Relaxed),
            renders: AtomicU64::new(0),
            tenants,
            guided: OnceLock::new(),
            lora,
        })
    }

    /// How this embedding model pools (`None`: it generates).
    pub fn pooling(&self) -> Option<lmplex_core::Pooling> {
        self.pooling
    }
    /// An embedding's length: the model's hidden size.
    pub fn hidden_size(&self) -> usize {
        self.hidden_size
    }
    /// The configuration the engine was loaded with.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }
    /// Most tokens a sequence may reach, prompt and output (the context window as configured).
    pub fn max_model_len(&self) -> usize {
        self.max_model_len
    }
    /// OpenAI's `system_fingerprint` for this model as loaded (changes with the lmplex version,
    /// the checkpoint and how it runs).
    pub fn system_fingerprint(&self) -> &str {
        &self.fingerprint
    }
    /// The model's tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }
    /// The LoRA adapters served on this model: their names, and loading and unloading them.
    pub fn lora(&self) -> &LoraRegistry {
        &self.lora
    }
    /// What was loaded and how it runs.
    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// Counters published by the step loop after every turn.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Blocks in the KV pool.
    pub fn num_kv_blocks(&self) -> usize {
        self.sizing.num_blocks
    }

    /// Bytes by category: `weights` (of which `expert_weights`: MoE experts); `kv_cache` (the whole pool, reserved at load) split into
    /// `kv_cache_used` (held by requests), `kv_cache_cached` (free, still holding reusable
    /// prefixes) and `kv_cache_free`; `kv_swap` (the warm tier, host memory committed as it is
    /// used) and `kv_swap_used` (held by swapped-out requests); `workspace` (the CUDA backend's
    /// step buffers; 0 on the CPU); `graphs` (captured CUDA graphs, as the driver counts them);
    /// `other` (rope tables, a draft model, a vision tower); `lora_adapters` (the adapters held now, and on CUDA their device pool); `total` (all of these). On CUDA also
    /// `device_used` and `device_total`: the whole device's usage now (`cuMemGetInfo`: every
    /// process, the CUDA context and cuBLAS included).
    pub fn memory(&self) -> MemoryReport {
        let w = self.mem.weights;
        let KvSizing { bytes_per_block: bpb, num_blocks, num_swap_blocks } = self.sizing;
        let free = self.stats.num_free_kv_blocks.load(Ordering::Relaxed);
        let cached = self.stats.num_cached_free_kv_blocks.load(Ordering::Relaxed).min(free);
        let kv = self.sizing.kv_cache_bytes();
        let live = |f: fn(&lmplex_cuda::LiveBytes) -> &std::sync::atomic::AtomicUsize| {
            self.mem.live.as_ref().map(|l| f(l).load(Ordering::Relaxed))
        };
        let workspace = live(|l| &l.workspace).unwrap_or(self.mem.workspace);
        let draft = self
            .mem
            .draft_live
            .as_ref()
            .map_or(0, |l| l.workspace.load(Ordering::Relaxed) + l.graphs.load(Ordering::Relaxed));
        let (other, graphs) = (self.mem.other + draft, live(|l| &l.graphs).unwrap_or(0));
        let swap = self.sizing.kv_swap_bytes();
        let swap_free = self.stats.num_free_swap_blocks.load(Ordering::Relaxed).min(num_swap_blocks);
        let device = self.mem.device.as_ref().and_then(|f| f().ok());
        let lora_adapters = self.lora.held_bytes() + live(|l| &l.lora).unwrap_or(0);
        MemoryReport {
            weights: w,
            expert_weights: self.mem.expert_weights,
            kv_cache: kv,
            kv_cache_used: (num_blocks - free) * bpb,
            kv_cache_cached: cached * bpb,
            kv_cache_free: (free - cached) * bpb,
            kv_swap: swap,
            kv_swap_used: (num_swap_blocks - swap_free) * bpb,
            workspace,
            graphs,
            other,
            lora_adapters,
            total: w + kv + swap + workspace + graphs + other + lora_adapters,
            device_used: device.map(|(free, total)| total - free),
            device_total: device.map(|(_, total)| total),
        }
    }

    /// The tenants whose quotas admit this engine's requests.
    pub fn tenants(&self) -> &Arc<Tenants> {
        &self.tenants
    }

    /// Queues one request; its chunks arrive on the returned handle (dropping it aborts the
    /// request). `InvalidRequest` for a bad request, `RateLimited` when its tenant's quota
    /// refuses it, `Capacity` when `max_queue_len` requests already wait.
    pub fn submit(&self, req: &Request) -> Result<RequestHandle> {
        Ok(self.submit_all(std::slice::from_ref(req))?.remove(0))
    }

    /// Queues the requests of one call (e.g. an API request's prompts and samples): all are
    /// validated and admitted (one admission per tenant) before any is queued, so a refusal
    /// queues nothing; errors as for `submit`. Handles in request order. A `Call` does the
    /// same with its tenant resolved once: `prepare`, then `submit_prepared`.
    pub fn submit_all(&self, reqs: &[Request]) -> Result<Vec<RequestHandle>> {
        self.submit_prepared(self.prepare_requests(reqs)?)
    }

    /// Prompts rendered and tokenized so far (chat template and tokenizer; token-id prompts
    /// checked): one per request of each call this engine prepared, for tests and diagnostics.
    pub fn num_prompt_renders(&self) -> u64 {
        self.renders.load(Ordering::Relaxed)
    }

    /// Stops request `id` (as dropping its handle does); unknown ids are ignored.
    pub fn abort(&self, id: u64) {
        let _ = self.cmd.send(Command::Abort(id));
    }

    /// A request whose output arrives chunk by chunk; dropping the stream aborts it.
    pub fn stream(&self, req: &Request) -> Result<RequestHandle> {
        self.submit(req)
    }
}

impl Iterator for RequestHandle {
    type Item = Result<lmplex_core::StreamChunk>;

    /// `next_blocking`: a `RequestHandle` is a blocking iterator of chunks.
    fn next(&mut self) -> Option<Self::Item> {
        self.next_blocking()
    }
}
