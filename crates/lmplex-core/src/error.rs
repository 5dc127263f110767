//! Typed errors shared by all lmplex crates.
//!
//! Each variant maps to one Python exception class (`ModelLoadError`, `InvalidRequest`,
//! `CapacityError`, `LmplexError`); messages name the offending file, field or value.

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
    /// A bug or an unexpected failure inside lmplex.
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    pub fn model_load(msg: impl Into<String>) -> Self {
        Self::ModelLoad(msg.into())
    }
    pub fn invalid(msg: impl Into<String>) -> Self {
        Self::InvalidRequest(msg.into())
    }
    pub fn capacity(msg: impl Into<String>) -> Self {
        Self::Capacity(msg.into())
    }
    pub fn internal(msg: impl std::fmt::Display) -> Self {
        Self::Internal(msg.to_string())
    }
    /// The same kind of error, its message prefixed by `ctx: `.
    pub fn with_context(self, ctx: &str) -> Self {
        match self {
            Self::ModelLoad(m) => Self::ModelLoad(format!("{ctx}: {m}")),
            Self::InvalidRequest(m) => Self::InvalidRequest(format!("{ctx}: {m}")),
            Self::Capacity(m) => Self::Capacity(format!("{ctx}: {m}")),
            Self::Internal(m) => Self::Internal(format!("{ctx}: {m}")),
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;
