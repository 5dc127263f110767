//! Model configuration as the user gives it (`ModelConfig`), before any checkpoint is read.
//!
//! `ModelConfig` is the one type for this concept: the Rust API takes it as is, the server's
//! TOML `[[models]]` entries deserialize straight into it, Python's `lmplex.ModelConfig` wraps
//! it (keyword arguments are deserialized by the same serde derive), and `LMLiteBlock` sends it
//! to its replicas serialized. A field added here therefore appears in all four at once.
//!
//! Invariants: a `ModelConfig` that passed `validate()` has positive limits, a known dtype and
//! device and a finite keep-alive; an unknown key is an error naming it (`deny_unknown_fields`);
//! defaults live in `Default` only. Fields the checkpoint decides (`max_model_len` when `None`)
//! are resolved at load time.

use crate::{Error, Result};
use serde::{Deserialize, Serialize};

/// An enum read from and written as one of a fixed set of lower-case names (case-insensitive,
/// with aliases), so TOML, Python and Rust spell its values the same way.
macro_rules! named_enum {
    ($(#[$m:meta])* $name:ident, $what:literal {
        $($(#[$vm:meta])* $var:ident = $canon:literal $(| $alias:literal)*,)+
    }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "&'static str")]
        #[allow(missing_docs)] // variants named after their values (`F32` is `float32`)
        pub enum $name {
            $($(#[$vm])* $var,)+
        }

        impl $name {
            /// The canonical names, in declaration order.
            pub const NAMES: &'static [&'static str] = &[$($canon),+];

            /// The canonical name (the one `NAMES` lists).
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$var => $canon,)+
                }
            }

            /// Reads a name or an alias, ignoring case.
            pub fn parse(s: &str) -> Result<Self> {
                match s.to_ascii_lowercase().as_str() {
                    $($canon $(| $alias)* => Ok(Self::$var),)+
                    other => Err(Error::invalid(format!(
                        "unknown {} '{other}': expected one of {}",
                        $what,
                        Self::NAMES.join(", ")
                    ))),
                }
            }
        }

        impl TryFrom<String> for $name {
            type Error = Error;
            fn try_from(s: String) -> Result<Self> {
                Self::parse(&s)
            }
        }

        impl From<$name> for &'static str {
            fn from(v: $name) -> Self {
                v.as_str()
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

named_enum! {
    /// Activation / dense-weight dtype requested for the model.
    DType, "dtype" {
        /// Let the backend choose: on the CPU the checkpoint's element type, computed in f32;
        /// bf16 on CUDA. An explicit dtype on the CPU stores dense matrices in it, and
        /// `bfloat16` also rounds prompt rows' activations to bf16 (docs/config.md).
        Auto = "auto",
        F32 = "float32" | "f32",
        F16 = "float16" | "f16" | "half",
        BF16 = "bfloat16" | "bf16",
    }
}

named_enum! {
    /// Element type of the CPU backend's KV cache (vLLM's `kv_cache_dtype`).
    KvCacheDtype, "kv_cache_dtype" {
        /// float32 for a checkpoint whose weights are all float32, else float16 (a 16-bit or
        /// quantized checkpoint; llama.cpp's default); with an explicit `dtype`, float32 for
        /// float32 and float16 otherwise. On CUDA the cache takes the compute dtype.
        Auto = "auto",
        F32 = "float32" | "f32",
        F16 = "float16" | "f16" | "half",
        /// Signed bytes with one scale per token, KV head and 32 dimensions, Hadamard-rotated
        /// (as llama.cpp's q8_0 cache); CPU only.
        Int8 = "int8" | "i8",
    }
}

/// Device requested for the model: `auto`, `cpu`, or `cuda` / `cuda:N` (`gpu` / `gpu:N`), N
/// the CUDA device ordinal (`cuda` is `cuda:0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum DeviceKind {
    /// CUDA device 0 when it is usable and the device tests have passed on its architecture,
    /// else the CPU (docs/cuda.md).
    Auto,
    /// The CPU.
    Cpu,
    /// The CUDA device of this ordinal.
    Cuda(u32),
}

impl DeviceKind {
    /// The names `parse` accepts, `N` standing for an ordinal.
    pub const NAMES: &'static [&'static str] = &["auto", "cpu", "cuda", "cuda:N"];

    /// Reads `auto`, `cpu`, `cuda`, `cuda:N`, `gpu` or `gpu:N`, ignoring case.
    pub fn parse(s: &str) -> Result<Self> {
        let lower = s.trim().to_ascii_lowercase();
        let (kind, ordinal) = match lower.split_once(':') {
            Some((k, n)) => (k, Some(n)),
            None => (lower.as_str(), None),
        };
        let bad = || Error::invalid(format!("unknown device '{s}': expected one of {}", Self::NAMES.join(", ")));
        match (kind, ordinal) {
            ("auto", None) => Ok(Self::Auto),
            ("cpu", None) => Ok(Self::Cpu),
            ("cuda" | "gpu", None) => Ok(Self::Cuda(0)),
            ("cuda" | "gpu", Some(n)) => n.parse().map(Self::Cuda).map_err(|_| bad()),
            _ => Err(bad()),
        }
    }
}

impl TryFrom<String> for DeviceKind {
    type Error = Error;
    fn try_from(s: String) -> Result<Self> {
        Self::parse(&s)
    }
}

impl From<DeviceKind> for String {
    fn from(v: DeviceKind) -> Self {
        v.to_string()
    }
}

impl std::fmt::Display for DeviceKind {
    /// `auto`, `cpu`, `cuda` for ordinal 0, else `cuda:N`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda(0) => f.write_str("cuda"),
            Self::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

named_enum! {
    /// Order in which waiting requests are admitted (and running ones preempted).
    SchedulingPolicy, "scheduling_policy" {
        /// First come, first served.
        Fcfs = "fcfs",
        /// Lower `priority` first, then arrival (vLLM's convention).
        Priority = "priority",
        /// Lower `priority` first, then the tenant with the least weighted service (the Virtual
        /// Token Counter of Sheng et al., OSDI 2024), then arrival.
        Fair = "fair",
    }
}

named_enum! {
    /// What a running request loses when the KV pool runs out of blocks (vLLM's
    /// `preemption_mode`).
    PreemptionMode, "preemption_mode" {
        /// Swap when the warm tier has room and the cost rule says copying out and back is
        /// cheaper than recomputing; recompute otherwise.
        Auto = "auto",
        /// Swap whenever the warm tier has room.
        Swap = "swap",
        /// Always free the blocks and recompute later.
        Recompute = "recompute",
    }
}

named_enum! {
    /// How a model writes tool calls (vLLM's `--tool-call-parser` names); the chat template
    /// tells when unset.
    ToolCallParser, "tool_call_parser" {
        /// `<tool_call>{"name": ..., "arguments": ...}</tool_call>` (Qwen2.5/3, Hermes).
        Hermes = "hermes" | "qwen",
        /// `{"name": ..., "parameters": ...}`, after `<|python_tag|>` or alone (Llama 3.1-3.3).
        Llama3Json = "llama3_json" | "llama3" | "llama",
        /// `[TOOL_CALLS][{"name": ..., "arguments": ...}]` (Mistral).
        Mistral = "mistral",
    }
}

named_enum! {
    /// How a model's chat replies separate reasoning from the answer (vLLM's
    /// `--reasoning-parser` names); the chat template tells when unset.
    ReasoningParser, "reasoning_parser" {
        /// `<think>...</think>` before the answer (Qwen3, QwQ, DeepSeek-R1 and its distills),
        /// opened by the model or by the template's generation prompt.
        Think = "think" | "qwen3" | "deepseek_r1",
        /// No reasoning: the whole reply is the answer.
        Off = "none",
    }
}

named_enum! {
    /// What a model serves (vLLM's `task`): text generation, or embeddings of its inputs.
    Task, "task" {
        /// Completions, chat, Responses and Messages.
        Generate = "generate",
        /// `/v1/embeddings` (`Engine::embed`): a prompt's final hidden states, pooled.
        Embed = "embed",
    }
}

named_enum! {
    /// How an embedding model (`Task::Embed`) pools a prompt's final hidden states (after the
    /// final norm) into one vector (vLLM's pooling types).
    Pooling, "pooling" {
        /// The last token's state (decoder embedders: Qwen3-Embedding, e5-mistral, gte-Qwen2).
        Last = "last" | "lasttoken",
        /// The mean over every prompt token's state.
        Mean = "mean",
    }
}

/// `ModelConfig::max_num_batched_tokens` when left unset.
pub const DEFAULT_MAX_NUM_BATCHED_TOKENS: usize = 2048;

/// One model to load: where it is, what it is called and how much work it may take at once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// Local HF folder, `.gguf` path or known alias (aliases are resolved by the Python layer).
    pub model_id: String,
    /// The Hub revision (branch, tag or commit) of a Hub id `model_id`; `None` is the default
    /// branch. Read by the Python resolver only.
    pub revision: Option<String>,
    /// The name clients ask for (`"model"` in the OpenAI API); `None` means `model_id` as
    /// written. The server TOML also accepts `name`.
    #[serde(alias = "name")]
    pub served_model_name: Option<String>,
    /// Longest prompt plus completion; `None` means the checkpoint's context length.
    pub max_model_len: Option<usize>,
    /// Most sequences run together in one step.
    pub max_model_concurrency: usize,
    /// Batch mode window: 0 runs a step at once (single mode).
    pub model_batch_execute_timeout_ms: u64,
    /// Activation and dense-weight dtype.
    pub dtype: DType,
    /// Where the model runs.
    pub device: DeviceKind,
    /// On CUDA, run every step kernel by kernel instead of replaying captured CUDA graphs for
    /// decode steps (vLLM's `enforce_eager`).
    pub enforce_eager: bool,
    /// Element type of the KV cache (`Auto`: see `KvCacheDtype`).
    pub kv_cache_dtype: KvCacheDtype,
    /// KV pool size in bytes; `None` sizes it for `max_model_concurrency` sequences of
    /// `max_model_len` tokens.
    pub kv_cache_bytes: Option<usize>,
    /// Most tokens in one forward pass (prefill chunks plus decodes); `None` means
    /// `DEFAULT_MAX_NUM_BATCHED_TOKENS` (`batched_tokens` resolves it).
    pub max_num_batched_tokens: Option<usize>,
    /// Most requests waiting for their first step; one more is a `Capacity` error.
    pub max_queue_len: usize,
    /// Reuse the KV blocks of earlier prompts that share a prefix.
    pub enable_prefix_caching: bool,
    /// Admission order of waiting requests; `None` is `fair` when tenants are configured,
    /// else `fcfs`.
    pub scheduling_policy: Option<SchedulingPolicy>,
    /// Warm (host) tier for preempted requests' KV blocks, in bytes; `None` is as large as the
    /// KV pool, at most 4 GiB; `Some(0)` turns swapping off. Pages are committed when used.
    pub kv_swap_bytes: Option<usize>,
    /// What a preempted request loses.
    pub preemption_mode: PreemptionMode,
    /// Seconds of idleness after which a host (`lmplex serve`, `LMLiteBlock`) unloads the model,
    /// reloading it on its next request; `None` keeps it loaded. A lone `Engine` ignores it.
    pub keep_alive_s: Option<f64>,
    /// What a million prompt tokens cost (any currency; tenants' `max_cost_per_day` uses it).
    pub price_per_million_input_tokens: f64,
    /// What a million generated tokens cost.
    pub price_per_million_output_tokens: f64,
    /// How good the model is for routing by tier (higher is better, e.g. a benchmark score;
    /// only the order between models matters).
    pub quality: f64,
    /// How the model writes tool calls; `None` reads it from the chat template.
    pub tool_call_parser: Option<ToolCallParser>,
    /// How chat replies carry reasoning (`reasoning_content`); `None` reads it from the chat
    /// template (`think` when it writes `<think>`).
    pub reasoning_parser: Option<ReasoningParser>,
    /// LoRA adapters of this model by the name clients use (vLLM's `--lora-modules`): a local
    /// PEFT folder each (Python and the server resolve Hub ids first). An adapter is served as
    /// a model whose parent is this one.
    pub lora_modules: std::collections::BTreeMap<String, String>,
    /// Most distinct adapters in one step, and most kept in memory while no request holds them
    /// (vLLM's `max_loras`): a request under another adapter waits until one ends; an idle
    /// adapter, least recently used first, makes room for another (read again from its folder).
    pub max_loras: usize,
    /// Highest rank an adapter may have (vLLM's `max_lora_rank`).
    pub max_lora_rank: usize,
    /// What the model serves: generation, or embeddings (`Task`).
    pub task: Task,
    /// How an embedding model pools (`Task::Embed` only); `None` reads a sentence-transformers
    /// folder's `1_Pooling/config.json`, else `last`.
    pub pooling: Option<Pooling>,
    /// Speculative decoding (vLLM's `speculative_config`); `None` decodes one token a step.
    /// It never changes a token, only how many a step may produce.
    pub speculative: Option<crate::SpeculativeConfig>,
    /// Most images one prompt may hold (vLLM's `limit_mm_per_prompt`); 0 loads no vision tower.
    pub limit_mm_per_prompt: MmLimits,
    /// A llama.cpp multimodal projector file (llama-server's `--mmproj`, a local path): the
    /// vision tower and image preprocessing of a GGUF text model (or any text model).
    pub mmproj: Option<String>,
}

/// Most multimodal items one prompt may hold, by modality (vLLM's `limit_mm_per_prompt`,
/// `{"image": 8}`): a prompt with more is `InvalidRequest`; 0 refuses the modality, and a
/// vision-language model then loads no vision tower (its text model alone takes memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MmLimits {
    /// Images per prompt (default 8).
    pub image: usize,
}

impl Default for MmLimits {
    fn default() -> Self {
        Self { image: 8 }
    }
}

impl Default for ModelConfig {
    /// Every default, with an empty `model_id` (which `validate()` rejects).
    fn default() -> Self {
        Self {
            model_id: String::new(),
            revision: None,
            served_model_name: None,
            max_model_len: None,
            max_model_concurrency: 8,
            model_batch_execute_timeout_ms: 0,
            dtype: DType::Auto,
            device: DeviceKind::Auto,
            enforce_eager: false,
            kv_cache_dtype: KvCacheDtype::Auto,
            kv_cache_bytes: None,
            max_num_batched_tokens: None,
            max_queue_len: 1024,
            enable_prefix_caching: true,
            scheduling_policy: None,
            kv_swap_bytes: None,
            preemption_mode: PreemptionMode::Auto,
            keep_alive_s: None,
            price_per_million_input_tokens: 0.0,
            price_per_million_output_tokens: 0.0,
            quality: 0.0,
            tool_call_parser: None,
            reasoning_parser: None,
            lora_modules: std::collections::BTreeMap::new(),
            max_loras: 8,
            max_lora_rank: 64,
            task: Task::Generate,
            pooling: None,
            speculative: None,
            limit_mm_per_prompt: MmLimits::default(),
            mmproj: None,
        }
    }
}

impl ModelConfig {
    /// The defaults for `model_id`.
    pub fn new(model_id: impl Into<String>) -> Self {
        Self { model_id: model_id.into(), ..Self::default() }
    }

    /// This config loading from `path` (a local `.gguf` file or Hugging Face folder: an alias
    /// or Hub id resolved at the edge), still served under its name: the edge resolves
    /// `model_id` once and the engine reads the checkpoint from it (`checkpoint`).
    pub fn at(mut self, path: impl Into<String>) -> Self {
        let path = path.into();
        if path != self.model_id && self.served_model_name.is_none() {
            self.served_model_name = Some(std::mem::take(&mut self.model_id));
        }
        self.model_id = path;
        self
    }

    /// The checkpoint to load: `model_id` as a local path (the Rust API takes paths; Python and
    /// the server resolve aliases and Hub ids first, with `at`).
    pub fn checkpoint(&self) -> &std::path::Path {
        std::path::Path::new(&self.model_id)
    }

    /// The name clients use in `"model"`: `served_model_name`, else `model_id`.
    pub fn served_name(&self) -> &str {
        self.served_model_name.as_deref().unwrap_or(&self.model_id)
    }

    /// What `prompt` input and `completion` output tokens cost at this model's prices.
    pub fn cost(&self, prompt: usize, completion: usize) -> f64 {
        (prompt as f64 * self.price_per_million_input_tokens + completion as f64 * self.price_per_million_output_tokens)
            / 1e6
    }

    /// Most tokens in one forward pass: `max_num_batched_tokens`, or its default.
    pub fn batched_tokens(&self) -> usize {
        self.max_num_batched_tokens.unwrap_or(DEFAULT_MAX_NUM_BATCHED_TOKENS)
    }

    /// `keep_alive_s` as a duration.
    pub fn keep_alive(&self) -> Option<std::time::Duration> {
        self.keep_alive_s.map(std::time::Duration::from_secs_f64)
    }

    /// Checks every rule the type does not: positive limits, a non-empty id and name, a
    /// keep-alive that is a finite number of seconds >= 0.
    pub fn validate(&self) -> Result<()> {
        if self.model_id.trim().is_empty() {
            return Err(Error::invalid("model_id must not be empty"));
        }
        if self.served_model_name.as_deref().is_some_and(|n| n.trim().is_empty()) {
            return Err(Error::invalid("served_model_name must not be empty"));
        }
        let positive = [
            ("max_model_len", self.max_model_len),
            ("max_model_concurrency", Some(self.max_model_concurrency)),
            ("kv_cache_bytes", self.kv_cache_bytes),
            ("max_num_batched_tokens", self.max_num_batched_tokens),
            ("max_queue_len", Some(self.max_queue_len)),
            ("max_loras", Some(self.max_loras)),
            ("max_lora_rank", Some(self.max_lora_rank)),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == Some(0)) {
            return Err(Error::invalid(format!("{name} must be at least 1, got 0")));
        }
        for (name, p) in [
            ("price_per_million_input_tokens", self.price_per_million_input_tokens),
            ("price_per_million_output_tokens", self.price_per_million_output_tokens),
        ] {
            if !(p.is_finite() && p >= 0.0) {
                return Err(Error::invalid(format!("{name} must be a number >= 0, got {p}")));
            }
        }
        if !self.quality.is_finite() {
            return Err(Error::invalid(format!("quality must be a finite number, got {}", self.quality)));
        }
        if let Some(name) = self.lora_modules.keys().find(|n| n.trim().is_empty() || *n == self.served_name()) {
            return Err(Error::invalid(format!(
                "lora_modules: the adapter name {name:?} must be non-empty and differ from the model's"
            )));
        }
        if self.task == Task::Embed && matches!(self.device, DeviceKind::Cuda(_)) {
            return Err(Error::invalid(format!(
                "embedding models (task = \"embed\") run on the CPU: device must be \"cpu\" or \"auto\", got \"{}\"",
                self.device
            )));
        }
        if self.pooling.is_some() && self.task != Task::Embed {
            return Err(Error::invalid("pooling applies to embedding models only: set task = \"embed\""));
        }
        if let Some(spec) = &self.speculative {
            spec.validate()?;
            if self.task == Task::Embed {
                return Err(Error::invalid(
                    "speculative decoding applies to generation: an embedding model decodes nothing",
                ));
            }
        }
        if let Some(k) = self.keep_alive_s.filter(|k| !k.is_finite() || *k < 0.0) {
            return Err(Error::invalid(format!("keep_alive_s must be a number of seconds >= 0, got {k}")));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_aliases_read() {
        for name in DType::NAMES {
            assert_eq!(DType::parse(name).unwrap().as_str(), *name);
        }
        assert_eq!(DType::parse("BF16").unwrap(), DType::BF16);
        assert_eq!(DeviceKind::parse("gpu").unwrap(), DeviceKind::Cuda(0));
        assert_eq!(DeviceKind::parse("CUDA:1").unwrap(), DeviceKind::Cuda(1));
        assert_eq!(DeviceKind::Cuda(1).to_string(), "cuda:1");
        assert_eq!(DeviceKind::Cuda(0).to_string(), "cuda");
        for bad in ["cuda:", "cuda:-1", "cpu:0", "tpu"] {
            let e = DeviceKind::parse(bad).unwrap_err().to_string();
            assert!(e.contains("unknown device") && e.contains("cuda:N"), "{e}");
        }
        let e = PreemptionMode::parse("lottery").unwrap_err().to_string();
        assert_eq!(e, "unknown preemption_mode 'lottery': expected one of auto, swap, recompute");
    }

    #[test]
    fn validate_names_the_field() {
        let zero = ModelConfig { max_queue_len: 0, ..ModelConfig::new("m") };
        assert_eq!(zero.validate().unwrap_err().to_string(), "max_queue_len must be at least 1, got 0");
        let keep = ModelConfig { keep_alive_s: Some(f64::NAN), ..ModelConfig::new("m") };
        assert!(keep.validate().unwrap_err().to_string().contains("keep_alive_s"));
        assert!(ModelConfig::default().validate().is_err(), "an empty model_id is refused");
        ModelConfig::new("m").validate().unwrap();
    }
}
