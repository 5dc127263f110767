//! The body of `POST /v1/embeddings` (OpenAI's, with vLLM's `add_special_tokens` and
//! `normalize`): inputs as text or token ids, one engine request each.
//!
//! Invariants: each input is one request of one call (admitted together, batched together),
//! in input order; `dimensions` and `normalize` become the requests' `PoolingParams`, checked
//! by the engine against the model's embedding size; the vectors are answered as JSON floats
//! or, with `encoding_format: "base64"`, as the base64 of their little-endian float32 bytes
//! (what the `openai` client asks for by default and decodes with numpy).

use super::completions::PromptInput;
use crate::error::ApiError;
use lmplex_core::PoolingParams;
use lmplex_engine::{Prompt, Request};
use serde::Deserialize;

/// How the vectors are written in the response.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum EncodingFormat {
    /// JSON arrays of numbers.
    #[default]
    Float,
    /// The base64 of the vector's little-endian float32 bytes.
    Base64,
}

/// The body of `POST /v1/embeddings`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct EmbeddingRequest {
    /// The served embedding model; may be left out when the server serves one.
    #[serde(default, deserialize_with = "super::null_as_empty")]
    pub model: String,
    /// One text, several, one token-id list or several; none may be empty.
    pub input: PromptInput,
    /// `float` (default) or `base64`.
    #[serde(default)]
    pub encoding_format: EncodingFormat,
    /// Keep the first `dimensions` elements of each vector (then normalize).
    #[serde(default, deserialize_with = "super::whole_number")]
    #[schema(minimum = 1)]
    pub dimensions: Option<i64>,
    /// OpenAI's end-user id: accepted, not used.
    pub user: Option<String>,
    /// vLLM's: add the tokenizer's special tokens to text inputs (default true).
    pub add_special_tokens: Option<bool>,
    /// vLLM's: scale each vector to unit length (default true).
    pub normalize: Option<bool>,
}

impl EmbeddingRequest {
    /// One engine request per input, in order, with its pooling; a 400 names a bad field.
    pub fn requests(
        &self,
        tokenize: impl Fn(&str, bool) -> lmplex_core::Result<Vec<u32>>,
    ) -> Result<Vec<Request>, ApiError> {
        let dimensions = match self.dimensions {
            None => None,
            Some(d) if d >= 1 => Some(d as usize),
            Some(d) => {
                return Err(ApiError::invalid_param("dimensions", format!("dimensions must be at least 1, got {d}")))
            }
        };
        let pooling = PoolingParams { dimensions, normalize: self.normalize.unwrap_or(true) };
        let special = self.add_special_tokens.unwrap_or(true);
        let text = |t: &String| -> Result<Prompt, ApiError> {
            if t.is_empty() {
                return Err(ApiError::invalid_param("input", "an input must not be empty"));
            }
            // The engine adds the special tokens to a text prompt; without them, tokenize here.
            if special {
                Ok(Prompt::Text(t.clone()))
            } else {
                Ok(Prompt::TokenIds(tokenize(t, false).map_err(ApiError::from)?))
            }
        };
        let ids = |v: &Vec<u32>| match v.is_empty() {
            true => Err(ApiError::invalid_param("input", "an input must not be empty")),
            false => Ok(Prompt::TokenIds(v.clone())),
        };
        let prompts: Vec<Prompt> = match &self.input {
            PromptInput::Text(t) => vec![text(t)?],
            PromptInput::Texts(v) => v.iter().map(text).collect::<Result<_, _>>()?,
            PromptInput::Ids(v) => vec![ids(v)?],
            PromptInput::IdLists(v) => v.iter().map(ids).collect::<Result<_, _>>()?,
        };
        if prompts.is_empty() {
            return Err(ApiError::invalid_param("input", "input must not be an empty list"));
        }
        Ok(prompts
            .into_iter()
            .map(|p| Request {
                pooling: Some(pooling.clone()),
                ..Request::new(p, lmplex_core::SamplingParams::greedy(0))
            })
            .collect())
    }
}

/// One vector as the response writes it.
pub fn encode(v: &[f32], format: EncodingFormat) -> serde_json::Value {
    match format {
        EncodingFormat::Float => serde_json::json!(v),
        EncodingFormat::Base64 => {
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            serde_json::Value::String(base64::encode(bytes))
        }
    }
}
