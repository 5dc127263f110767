//! The OpenAI request bodies the server accepts (completions in `completions`, chat in `chat`,
//! responses in `responses`; the sampling fields they share here) and how they become engine
//! requests.
//!
//! Invariants: a body is parsed from bytes with serde, so malformed JSON and wrong types are a
//! 400 naming the problem, never an extractor's plain-text reply; fields OpenAI defines that
//! lmplex cannot honour are refused with a 400 that names them rather than ignored; unknown
//! extra fields are ignored, as OpenAI and vLLM do. At most one output constraint: `response_format` (`json_object`,
//! `json_schema`), vLLM's `structured_outputs` or its older `guided_*` fields. Defaults follow OpenAI: completions stop
//! after 16 tokens, chat runs to the context's end; temperature 1, top_p 1.

use crate::error::ApiError;
use lmplex_core::{SamplingParams, StructuredOutput, TokenId, MAX_LOGPROBS};

mod chat;
mod completions;
mod embeddings;
mod generation;
mod images;
mod messages;
mod responses;
mod tokenize;
pub use chat::{ChatRequest, ContentInput, ContentPart, ImageUrl, MessageInput};
pub use completions::{CompletionRequest, Extras, PromptInput};
pub use embeddings::{encode as encode_embedding, EmbeddingRequest, EncodingFormat};
pub(crate) use generation::GenerationRequest;
pub use messages::{AnthropicMessage, MessagesRequest};
pub use responses::{ResponsesInput, ResponsesRequest, TextConfig, TextFormat, INCLUDE_LOGPROBS};
use serde::Deserialize;
pub use tokenize::{DetokenizeRequest, TokenizeRequest};

/// Most samples one request may ask for per prompt (OpenAI's limit for chat).
pub const MAX_N: usize = 128;

/// OpenAI's `stop`: one stop string or a list of them.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum StopInput {
    /// A single stop string.
    One(String),
    /// Several stop strings; the first one generated ends the output.
    Many(Vec<String>),
}

/// OpenAI's `stream_options` object.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
pub struct StreamOptions {
    /// `include_usage`: end the stream with a chunk holding the call's usage and no choices.
    pub include_usage: Option<bool>,
    /// vLLM's `continuous_usage_stats`: with `include_usage`, every chunk also carries its
    /// choice's usage so far.
    pub continuous_usage_stats: Option<bool>,
}

/// What usage a stream reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamUsage {
    /// A last chunk with the call's usage and no choices (`include_usage`).
    pub last: bool,
    /// Every chunk with its choice's usage so far (vLLM's `continuous_usage_stats`).
    pub every_chunk: bool,
}

/// Sampling fields shared by both endpoints (vLLM's extensions `top_k`, `min_p`,
/// `repetition_penalty`, `ignore_eos`, `stop_token_ids` included).
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
pub struct Common {
    /// `max_tokens`: most tokens per choice, >= 1; by default 16 (completions) or the context (chat).
    #[serde(default, deserialize_with = "whole_number")]
    #[schema(minimum = 0)]
    pub max_tokens: Option<i64>,
    /// lmplex's routing object: mode, tier and budgets (`docs/routing.md`).
    pub lmplex: Option<lmplex_core::Route>,
    /// `temperature`: softmax temperature, >= 0 (0 is greedy); default 1.
    #[schema(minimum = 0)]
    pub temperature: Option<f32>,
    /// `top_p`: nucleus sampling mass, in (0, 1]; default 1 (off).
    #[schema(exclusive_minimum = 0, maximum = 1)]
    pub top_p: Option<f32>,
    /// vLLM's `top_k`: keep only the `k` most likely tokens; -1 or 0 (the default) is off.
    #[serde(default, deserialize_with = "whole_number")]
    pub top_k: Option<i64>,
    /// vLLM's `min_p`: drop tokens below `min_p` times the top probability, in [0, 1); default 0.
    pub min_p: Option<f32>,
    /// `seed`: seeds the sampler, so output is reproducible; sample `i` of `n` uses `seed + i`;
    /// -1 (vLLM's convention) draws one.
    #[serde(default, deserialize_with = "whole_number")]
    pub seed: Option<i64>,
    /// `stop`: strings that end a choice's output (not included in it); none may be empty.
    pub stop: Option<StopInput>,
    /// vLLM's `stop_token_ids`: token ids that end the output, besides EOS.
    pub stop_token_ids: Option<Vec<TokenId>>,
    /// `stream`: answer with server-sent events as tokens are generated, ending in `[DONE]`.
    pub stream: Option<bool>,
    /// `stream_options`: only read when `stream` is true.
    pub stream_options: Option<StreamOptions>,
    /// `n`: samples per prompt, 1 to [`MAX_N`]; default 1.
    #[serde(default, deserialize_with = "whole_number")]
    #[schema(minimum = 1, maximum = 128)]
    pub n: Option<i64>,
    /// `presence_penalty`: subtracted once from each token already in the output, in [-2, 2].
    pub presence_penalty: Option<f32>,
    /// `frequency_penalty`: subtracted per occurrence of a token in the output, in [-2, 2].
    pub frequency_penalty: Option<f32>,
    /// vLLM's `repetition_penalty`: scales the logits of tokens in prompt or output, > 0 (1 is off).
    pub repetition_penalty: Option<f32>,
    /// vLLM's `ignore_eos`: keep generating past EOS until `max_tokens` or a stop (for benchmarks).
    pub ignore_eos: Option<bool>,
    /// vLLM's `min_tokens`: nothing but the length ends the output before this many tokens.
    #[serde(default, deserialize_with = "whole_number")]
    #[schema(minimum = 0)]
    pub min_tokens: Option<i64>,
    /// vLLM's `use_beam_search`: only `false` is accepted (lmplex does not search beams).
    pub use_beam_search: Option<bool>,
    /// `logit_bias`: token id (as a string key) -> bias in [-100, 100], added to its logit.
    pub logit_bias: Option<std::collections::HashMap<String, f32>>,
    /// `response_format`: `text`, or `json_object` / `json_schema`, which constrain the output.
    pub response_format: Option<ResponseFormat>,
    /// vLLM's `structured_outputs`: one constraint (JSON schema or object, regex, choice, grammar).
    pub structured_outputs: Option<StructuredOutputsBody>,
    /// vLLM's older `guided_json`: a JSON schema (object or JSON text) the output must match.
    pub guided_json: Option<serde_json::Value>,
    /// vLLM's older `guided_regex`: a regex the whole output must match.
    pub guided_regex: Option<String>,
    /// vLLM's older `guided_choice`: the output is exactly one of these strings.
    pub guided_choice: Option<Vec<String>>,
    /// vLLM's older `guided_grammar`: a grammar in llguidance's Lark dialect the output must match.
    pub guided_grammar: Option<String>,
}

/// vLLM's `structured_outputs` object.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StructuredOutputsBody {
    /// A JSON schema, as an object or as JSON text.
    pub json: Option<serde_json::Value>,
    /// `true` asks for any JSON object (`false` names no constraint).
    pub json_object: Option<bool>,
    /// A regex the whole output must match.
    pub regex: Option<String>,
    /// The output is exactly one of these strings.
    pub choice: Option<Vec<String>>,
    /// A grammar in llguidance's Lark dialect.
    pub grammar: Option<String>,
}

/// OpenAI's `response_format` object.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct ResponseFormat {
    /// `type`: `text` (no constraint), `json_object` or `json_schema`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `json_schema`, required when `type` is `json_schema`.
    pub json_schema: Option<JsonSchemaFormat>,
}

/// The `json_schema` object of `response_format`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct JsonSchemaFormat {
    /// `name`: accepted and ignored.
    pub name: Option<String>,
    /// `schema`: the JSON schema (object or JSON text) the output must match; required.
    pub schema: Option<serde_json::Value>,
}

/// A schema given as an object or as JSON text.
fn schema_text(v: &serde_json::Value) -> String {
    v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string())
}

/// A request's tools and how it may use them; `None` when it offers none (then only `none` or
/// `auto` may be asked for).
pub(crate) fn offered_tools(
    tools: Vec<lmplex_core::Tool>,
    choice: Option<lmplex_core::ToolChoice>,
    parallel_tool_calls: Option<bool>,
) -> Result<Option<lmplex_core::Tools>, ApiError> {
    use lmplex_core::ToolChoice;
    if tools.is_empty() {
        return match choice {
            None | Some(ToolChoice::None | ToolChoice::Auto) => Ok(None),
            Some(_) => Err(ApiError::invalid_param("tool_choice", "tool_choice needs tools")),
        };
    }
    let tool_choice = choice.unwrap_or_default();
    Ok(Some(lmplex_core::Tools { tools, tool_choice, parallel_tool_calls: parallel_tool_calls.unwrap_or(true) }))
}

/// A string field where `null` reads as left out (`"model": null`, as vLLM accepts it).
pub(crate) fn null_as_empty<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Option::<String>::deserialize(d).map(Option::unwrap_or_default)
}

/// An optional integer field that may also be written as a float with no fractional part
/// (`16.0`), as vLLM (pydantic) and JSON Schema's `integer` accept it; `16.5` is an error.
pub(crate) fn whole_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    use serde::de::Error;
    let Some(n) = Option::<serde_json::Number>::deserialize(d)? else { return Ok(None) };
    if let Some(i) = n.as_i64() {
        return Ok(Some(i));
    }
    match n.as_f64() {
        Some(f) if f.fract() == 0.0 && f.abs() < 9.2e18 => Ok(Some(f as i64)),
        _ => Err(D::Error::custom(format!("invalid type: `{n}`, expected an integer"))),
    }
}

/// Parses a JSON body into `T`: malformed JSON and wrong types are 400s naming the problem,
/// and a wrong type names its field (in the message, e.g. `logit_bias.abc`, and as `param`).
pub fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let e = match path_parse::<T>(body) {
        Ok(v) => return Ok(v),
        Err(e) => e,
    };
    let (path, inner) = (e.path().to_string(), e.into_inner());
    if matches!(inner.classify(), serde_json::error::Category::Syntax | serde_json::error::Category::Eof) {
        return Err(ApiError::invalid(format!("the body is not valid JSON: {inner}")));
    }
    // A field of the flattened `Common` loses its path (serde buffers flattened fields): parse
    // the body as `Common` alone to find it.
    let path = match named(&path) {
        Some(_) => path,
        None => path_parse::<Common>(body).err().map(|e| e.path().to_string()).unwrap_or_default(),
    };
    match named(&path) {
        Some(field) => {
            let e = ApiError::invalid(format!("invalid request body: {path}: {inner}"));
            Err(ApiError { param: Some(field), ..e })
        }
        None => Err(ApiError::invalid(format!("invalid request body: {inner}"))),
    }
}

fn path_parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, serde_path_to_error::Error<serde_json::Error>> {
    serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(body))
}

/// The top-level field a serde path starts with, if it names one.
fn named(path: &str) -> Option<String> {
    let field: String = path.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
    (!field.is_empty()).then_some(field)
}

impl Common {
    /// The engine's sampling parameters; `max_tokens` falls back to `default_max_tokens`.
    pub fn sampling(&self, max_tokens: Option<i64>, default_max_tokens: usize) -> Result<SamplingParams, ApiError> {
        if self.stream_options.is_some() && !self.stream() {
            return Err(ApiError::invalid_param(
                "stream_options",
                "`stream_options` is only allowed when `stream` is true",
            ));
        }
        let max_tokens = match max_tokens.or(self.max_tokens) {
            None => default_max_tokens,
            Some(n) if n >= 1 => n as usize,
            Some(n) => {
                return Err(ApiError::invalid_param("max_tokens", format!("max_tokens must be at least 1, got {n}")))
            }
        };
        if self.use_beam_search == Some(true) {
            let e = "beam search is not supported by lmplex: use n or best_of to sample several outputs";
            return Err(ApiError::invalid_param("use_beam_search", e));
        }
        let d = SamplingParams::default();
        let top_k = match self.top_k {
            None | Some(-1) | Some(0) => 0,
            Some(k) if k > 0 => k as usize,
            Some(k) => {
                return Err(ApiError::invalid_param("top_k", format!("top_k must be -1, 0 or positive, got {k}")))
            }
        };
        let p = SamplingParams {
            max_tokens,
            temperature: self.temperature.unwrap_or(d.temperature),
            top_p: self.top_p.unwrap_or(d.top_p),
            top_k,
            min_p: self.min_p.unwrap_or(d.min_p),
            presence_penalty: self.presence_penalty.unwrap_or(d.presence_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(d.frequency_penalty),
            repetition_penalty: self.repetition_penalty.unwrap_or(d.repetition_penalty),
            seed: match self.seed {
                None | Some(-1) => None,
                Some(s) if s >= 0 => Some(s as u64),
                Some(s) => return Err(ApiError::invalid_param("seed", format!("seed must be >= 0 or -1, got {s}"))),
            },
            logit_bias: self.logit_bias()?,
            stop: match &self.stop {
                None => Vec::new(),
                Some(StopInput::One(s)) => vec![s.clone()],
                Some(StopInput::Many(v)) => v.clone(),
            },
            stop_token_ids: self.stop_token_ids.clone().unwrap_or_default(),
            ignore_eos: self.ignore_eos.unwrap_or(false),
            min_tokens: match self.min_tokens {
                None => 0,
                Some(n) if n >= 0 => n as usize,
                Some(n) => {
                    return Err(ApiError::invalid_param("min_tokens", format!("min_tokens must be >= 0, got {n}")))
                }
            },
            structured_outputs: self.structured()?,
            ..d
        };
        p.validate()?;
        Ok(p)
    }

    /// `logit_bias` by token id; keys that are not token ids are a 400 listing all of them.
    fn logit_bias(&self) -> Result<std::collections::BTreeMap<TokenId, f32>, ApiError> {
        let Some(m) = &self.logit_bias else { return Ok(Default::default()) };
        let mut bad: Vec<&str> =
            m.keys().filter(|k| k.trim().parse::<TokenId>().is_err()).map(String::as_str).collect();
        if !bad.is_empty() {
            bad.sort_unstable();
            let e = format!("logit_bias keys are token ids; these are not: {}", bad.join(", "));
            return Err(ApiError::invalid_param("logit_bias", e));
        }
        Ok(m.iter().filter_map(|(k, v)| Some((k.trim().parse().ok()?, *v))).collect())
    }

    /// The one output constraint named by `response_format`, `structured_outputs` or `guided_*`.
    fn structured(&self) -> Result<Option<StructuredOutput>, ApiError> {
        let mut found: Vec<(&str, StructuredOutput)> = Vec::new();
        if let Some(f) = &self.response_format {
            match f.kind.as_str() {
                "text" => {}
                "json_object" => found.push(("response_format", StructuredOutput::JsonObject)),
                "json_schema" => {
                    let schema = f.json_schema.as_ref().and_then(|j| j.schema.as_ref()).ok_or_else(|| {
                        ApiError::invalid_param(
                            "response_format",
                            "response_format json_schema needs json_schema.schema",
                        )
                    })?;
                    found.push(("response_format", StructuredOutput::JsonSchema(schema_text(schema))));
                }
                other => {
                    return Err(ApiError::invalid_param(
                        "response_format",
                        format!("response_format type must be text, json_object or json_schema, got '{other}'"),
                    ))
                }
            }
        }
        if let Some(s) = &self.structured_outputs {
            let n = found.len();
            found.extend(s.json.as_ref().map(|j| ("structured_outputs", StructuredOutput::JsonSchema(schema_text(j)))));
            if s.json_object == Some(true) {
                found.push(("structured_outputs", StructuredOutput::JsonObject));
            }
            found.extend(s.regex.clone().map(|r| ("structured_outputs", StructuredOutput::Regex(r))));
            found.extend(s.choice.clone().map(|c| ("structured_outputs", StructuredOutput::Choice(c))));
            found.extend(s.grammar.clone().map(|g| ("structured_outputs", StructuredOutput::Grammar(g))));
            if found.len() == n {
                return Err(ApiError::invalid_param("structured_outputs", "structured_outputs names no constraint"));
            }
        }
        found.extend(self.guided_json.as_ref().map(|j| ("guided_json", StructuredOutput::JsonSchema(schema_text(j)))));
        found.extend(self.guided_regex.clone().map(|r| ("guided_regex", StructuredOutput::Regex(r))));
        found.extend(self.guided_choice.clone().map(|c| ("guided_choice", StructuredOutput::Choice(c))));
        found.extend(self.guided_grammar.clone().map(|g| ("guided_grammar", StructuredOutput::Grammar(g))));
        match found.len() {
            0 => Ok(None),
            1 => Ok(found.pop().map(|f| f.1)),
            _ => Err(ApiError::invalid_param(
                found[1].0,
                format!(
                    "only one output constraint per request; got {}",
                    found.iter().map(|f| format!("{} ({})", f.0, f.1.kind())).collect::<Vec<_>>().join(", ")
                ),
            )),
        }
    }

    /// Samples per prompt (`n`, 1 to `MAX_N`).
    pub fn n(&self) -> Result<usize, ApiError> {
        match self.n {
            None => Ok(1),
            Some(n) if (1..=MAX_N as i64).contains(&n) => Ok(n as usize),
            Some(n) => Err(ApiError::invalid_param("n", format!("n must be between 1 and {MAX_N}, got {n}"))),
        }
    }

    /// Whether to answer with server-sent events (`stream`, default false).
    pub fn stream(&self) -> bool {
        self.stream.unwrap_or(false)
    }
    /// What usage a streamed answer reports (`stream_options`).
    pub fn stream_usage(&self) -> StreamUsage {
        let o = self.stream_options.as_ref();
        let last = o.and_then(|o| o.include_usage).unwrap_or(false);
        StreamUsage { last, every_chunk: last && o.and_then(|o| o.continuous_usage_stats).unwrap_or(false) }
    }
}

/// A logprobs count field (`logprobs`, `top_logprobs`, `prompt_logprobs`): 0 to `MAX_LOGPROBS`.
pub fn logprobs_count(n: Option<i64>, param: &str) -> Result<Option<usize>, ApiError> {
    match n {
        None => Ok(None),
        Some(n) if (0..=MAX_LOGPROBS as i64).contains(&n) => Ok(Some(n as usize)),
        Some(n) => {
            Err(ApiError::invalid_param(param, format!("{param} must be between 0 and {MAX_LOGPROBS}, got {n}")))
        }
    }
}
