//! Typed errors shared by all lmplex crates.
//!
//! Each variant maps to one Python exception class (`ModelLoadError`, `InvalidRequest`,
//! `CapacityError` (also for `Unavailable`), `RateLimited`, `LmplexError`); messages name the
//! offending file, field or value.
//!
//! Invariant: messages are for users. A Rust backtrace that a dependency appends to its own
//! error's text (candle does, when `RUST_BACKTRACE` is set) is cut off by the constructors.

/// The one error type that crosses crate boundaries.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// A checkpoint could not be read or understood.
    #[error("{0}")]
    ModelLoad(String),
    /// The caller asked for something invalid (bad parameter, prompt too long, bad messages).
    #[error("{0}")]
    InvalidRequest(String),
    /// The engine cannot take the request now (queue full, out of memory budget).
    #[error("{0}")]
    Capacity(String),
    /// A tenant's quota refuses the request now: rate, concurrency or cost (`RateLimited`).
    #[error("{}", .0.message)]
    RateLimited(Box<RateLimit>),
    /// The prompt does not fit the model's context (`max_model_len`); the message gives both.
    #[error("{0}")]
    ContextLengthExceeded(String),
    /// No model can serve the request within its latency or cost budget (routing).
    #[error("{0}")]
    BudgetUnsatisfiable(String),
    /// Something lmplex depends on cannot answer now (a shared usage store that is down); the
    /// request may be retried.
    #[error("{0}")]
    Unavailable(String),
    /// A bug or an unexpected failure inside lmplex.
    #[error("internal error: {0}")]
    Internal(String),
}

/// Which quota refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    /// `requests_per_minute`.
    Requests,
    /// `tokens_per_minute`.
    Tokens,
    /// `max_concurrency`.
    Concurrency,
    /// `max_cost_per_day` (OpenAI's `insufficient_quota`).
    Cost,
}

/// One rate limit's state, as OpenAI's `x-ratelimit-*` headers give it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LimitStatus {
    /// The limit per window.
    pub limit: u64,
    /// What is left of it in the window now.
    pub remaining: u64,
    /// Seconds until the window holds nothing any more (the limit is whole again).
    pub reset_s: f64,
}

/// A tenant's request and token windows now (`None`: no such limit).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct QuotaStatus {
    /// `requests_per_minute`.
    pub requests: Option<LimitStatus>,
    /// `tokens_per_minute`.
    pub tokens: Option<LimitStatus>,
}

/// Why a tenant's request was refused and when to retry.
#[derive(Debug, Clone, PartialEq)]
pub struct RateLimit {
    /// For people: which limit, its value, when to retry.
    pub message: String,
    /// The limit that refused the request.
    pub kind: LimitKind,
    /// Seconds after which the same request would be admitted, if nothing else changes.
    pub retry_after_s: f64,
    /// The tenant's windows at the refusal.
    pub status: QuotaStatus,
}

/// `msg` up to a Rust backtrace in it: a line whose first non-blank text is frame `0: `.
fn without_backtrace(msg: String) -> String {
    let mut start = 0;
    for line in msg.split_inclusive('\n') {
        if start > 0 && line.trim_start().starts_with("0: ") {
            return msg[..start].trim_end().to_string();
        }
        start += line.len();
    }
    msg
}

impl Error {
    /// A checkpoint could not be read or understood.
    pub fn model_load(msg: impl Into<String>) -> Self {
        Self::ModelLoad(without_backtrace(msg.into()))
    }
    /// The caller asked for something invalid.
    pub fn invalid(msg: impl Into<String>) -> Self {
        Self::InvalidRequest(without_backtrace(msg.into()))
    }
    /// The engine cannot take the request now.
    pub fn capacity(msg: impl Into<String>) -> Self {
        Self::Capacity(without_backtrace(msg.into()))
    }
    /// A bug or an unexpected failure inside lmplex.
    pub fn internal(msg: impl std::fmt::Display) -> Self {
        Self::Internal(without_backtrace(msg.to_string()))
    }
    /// The same kind of error, its message prefixed by `ctx: `.
    pub fn with_context(self, ctx: &str) -> Self {
        match self {
            Self::ModelLoad(m) => Self::ModelLoad(format!("{ctx}: {m}")),
            Self::InvalidRequest(m) => Self::InvalidRequest(format!("{ctx}: {m}")),
            Self::Capacity(m) => Self::Capacity(format!("{ctx}: {m}")),
            Self::RateLimited(mut r) => {
                r.message = format!("{ctx}: {}", r.message);
                Self::RateLimited(r)
            }
            Self::BudgetUnsatisfiable(m) => Self::BudgetUnsatisfiable(format!("{ctx}: {m}")),
            Self::ContextLengthExceeded(m) => Self::ContextLengthExceeded(format!("{ctx}: {m}")),
            Self::Unavailable(m) => Self::Unavailable(format!("{ctx}: {m}")),
            Self::Internal(m) => Self::Internal(format!("{ctx}: {m}")),
        }
    }
}

/// A result with lmplex's one error type.
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backtrace_in_a_message_is_cut_off() {
        let candle =
            "f.gguf: corrupt GGUF header: unrecognized value-type 0xc4\n   0: candle_core::error::Error::bt\n   \
                      1: candle_core::quantized::gguf_file::ValueType::from_u32\n";
        assert_eq!(Error::model_load(candle).to_string(), "f.gguf: corrupt GGUF header: unrecognized value-type 0xc4");
        let plain = "line one\nline two: 0: not a frame";
        assert_eq!(Error::invalid(plain).to_string(), plain);
    }
}
