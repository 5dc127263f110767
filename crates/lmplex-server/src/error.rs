//! `ApiError`: every failure the server answers, as an OpenAI-shaped error body.
//!
//! `{"error": {"message", "type", "param", "code"}}` with the status a client library maps to
//! its own exception: 400 `invalid_request_error` (bad JSON, wrong types, bad values, prompt
//! too long), 401 `invalid_api_key`, 404 (unknown model or route, or a model the caller may
//! not use), 429 (queue full, `rate_limit_exceeded` or `insufficient_quota`, with `Retry-After`
//! and OpenAI's `x-ratelimit-*` headers), 503 (loading, draining), 500 (a bug). Invariant: no
//! handler answers an error any other way.

use crate::replies::{AnthropicErrorBody, AnthropicErrorDetail, ErrorBody, ErrorDetail};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use lmplex_core::{Error, LimitKind, QuotaStatus};
use serde_json::json;

/// The header that repeats an error's `code` where a client acts on it whatever the body's
/// shape (Anthropic's has no `code`): `draining`, `request_in_progress`.
pub const CODE_HEADER: &str = "x-lmplex-error-code";

/// A failed request, answered as an OpenAI error body with `status`.
#[derive(Debug)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// The error body's `type`: `invalid_request_error`, `rate_limit_error`, ...
    pub kind: &'static str,
    /// The error body's `code` (e.g. `model_not_found`, `capacity`), or `null`.
    pub code: Option<&'static str>,
    /// The error body's `param`: the request field at fault, or `null`.
    pub param: Option<String>,
    /// The error body's `message`, for people.
    pub message: String,
    /// Headers the answer carries (`Retry-After`, `x-ratelimit-*`).
    pub headers: Vec<(&'static str, String)>,
}

impl ApiError {
    /// A 400 `invalid_request_error` with no `param`.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            code: None,
            param: None,
            message: message.into(),
            headers: Vec::new(),
        }
    }
    /// A 400 `invalid_request_error` naming the request field `param`.
    pub fn invalid_param(param: &str, message: impl Into<String>) -> Self {
        Self { param: Some(param.to_string()), ..Self::invalid(message) }
    }
    /// A 404 for a model this server does not serve (`code: model_not_found`, `param: model`).
    pub fn model_not_found(model: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            kind: "invalid_request_error",
            code: Some("model_not_found"),
            param: Some("model".into()),
            message: format!("The model `{model}` does not exist."),
            headers: Vec::new(),
        }
    }
    /// A 503 `service_unavailable`: the server is loading or draining.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: "service_unavailable",
            code: None,
            param: None,
            message: message.into(),
            headers: Vec::new(),
        }
    }
    /// A 503 `draining` with `Retry-After: 1`: the server is shutting down and runs nothing new,
    /// so the call can go to another server as it is.
    pub fn draining() -> Self {
        Self {
            code: Some("draining"),
            headers: vec![("retry-after", "1".into()), (CODE_HEADER, "draining".into())],
            ..Self::unavailable("the server is shutting down: retry on another replica")
        }
    }
    /// A 404 for a path no route matches.
    pub fn not_found_route(path: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            kind: "invalid_request_error",
            code: None,
            param: None,
            message: format!("no route {path}"),
            headers: Vec::new(),
        }
    }
    /// A 401 `invalid_api_key` (OpenAI's answer to a missing or wrong key).
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::UNAUTHORIZED,
            kind: "invalid_request_error",
            code: Some("invalid_api_key"),
            param: None,
            message: message.into(),
            headers: vec![("www-authenticate", "Bearer".into())],
        }
    }
}

/// OpenAI's spelling of a reset time: `20ms`, `1.5s`, `6m0s`.
pub fn reset_str(s: f64) -> String {
    if s < 1.0 {
        format!("{}ms", (s * 1e3).ceil() as u64)
    } else if s < 60.0 {
        format!("{}s", (s * 1e3).ceil() / 1e3)
    } else {
        let m = (s / 60.0).floor();
        format!("{m}m{}s", (s - m * 60.0).ceil() as u64)
    }
}

/// OpenAI's `x-ratelimit-*` headers for the limits a tenant has.
pub fn rate_limit_headers(q: &QuotaStatus) -> Vec<(&'static str, String)> {
    let mut h = Vec::new();
    if let Some(r) = q.requests {
        h.push(("x-ratelimit-limit-requests", r.limit.to_string()));
        h.push(("x-ratelimit-remaining-requests", r.remaining.to_string()));
        h.push(("x-ratelimit-reset-requests", reset_str(r.reset_s)));
    }
    if let Some(t) = q.tokens {
        h.push(("x-ratelimit-limit-tokens", t.limit.to_string()));
        h.push(("x-ratelimit-remaining-tokens", t.remaining.to_string()));
        h.push(("x-ratelimit-reset-tokens", reset_str(t.reset_s)));
    }
    h
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        let (status, kind, code) = match &e {
            Error::InvalidRequest(_) | Error::ModelLoad(_) => (StatusCode::BAD_REQUEST, "invalid_request_error", None),
            Error::Capacity(_) => (StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", Some("capacity")),
            Error::RateLimited(r) if r.kind == LimitKind::Cost => {
                (StatusCode::TOO_MANY_REQUESTS, "insufficient_quota", Some("insufficient_quota"))
            }
            Error::RateLimited(r) => {
                let kind = if r.kind == LimitKind::Tokens { "tokens" } else { "requests" };
                (StatusCode::TOO_MANY_REQUESTS, kind, Some("rate_limit_exceeded"))
            }
            Error::ContextLengthExceeded(_) => {
                (StatusCode::BAD_REQUEST, "invalid_request_error", Some("context_length_exceeded"))
            }
            Error::BudgetUnsatisfiable(_) => {
                (StatusCode::BAD_REQUEST, "invalid_request_error", Some("budget_unsatisfiable"))
            }
            Error::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "service_unavailable", None),
            Error::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal_server_error", None),
        };
        let headers = match &e {
            Error::RateLimited(r) => {
                let mut h = rate_limit_headers(&r.status);
                h.push(("retry-after", (r.retry_after_s.ceil().max(1.0) as u64).to_string()));
                h
            }
            Error::Unavailable(_) => vec![("retry-after", "1".to_string())],
            _ => Vec::new(),
        };
        let message = e.to_string();
        let param = matches!(e, Error::InvalidRequest(_)).then(|| param_of(&message)).flatten();
        Self { status, kind, code, param, message, headers }
    }
}

/// The request field an engine error names first (`tools[1].function...` -> `tools`), among
/// those whose checks live in the engine (`SamplingParams::validate` among them).
fn param_of(message: &str) -> Option<String> {
    const CHECKED: &[&str] = &[
        "tools",
        "tool_choice",
        "messages",
        "suffix",
        "max_tokens",
        "min_tokens",
        "temperature",
        "top_p",
        "min_p",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "logprobs",
        "prompt_logprobs",
        "stop",
        "logit_bias",
    ];
    let head: String = message.chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect();
    CHECKED.contains(&head.as_str()).then_some(head)
}

impl ApiError {
    /// The JSON error body: `{"error": {"message", "type", "param", "code"}}`.
    pub fn body(&self) -> serde_json::Value {
        json!(ErrorBody {
            error: ErrorDetail {
                message: self.message.clone(),
                kind: self.kind.to_string(),
                param: self.param.clone(),
                code: self.code.map(str::to_string),
            }
        })
    }
}

impl ApiError {
    /// The answer in Anthropic's error shape (`/v1/messages`): `{"type": "error", "error":
    /// {"type", "message"}}`, its type from the status, with the same status and headers.
    pub fn into_anthropic(self) -> Response {
        let kind = match self.status.as_u16() {
            400 | 422 => "invalid_request_error",
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 | 529 => "overloaded_error",
            _ => "api_error",
        };
        let body = AnthropicErrorBody { kind: "error", error: AnthropicErrorDetail { kind, message: self.message } };
        let mut r = (self.status, Json(body)).into_response();
        for (k, v) in &self.headers {
            if let Ok(v) = HeaderValue::from_str(v) {
                r.headers_mut().insert(*k, v);
            }
        }
        r
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, Json(self.body())).into_response();
        for (k, v) in &self.headers {
            if let Ok(v) = HeaderValue::from_str(v) {
                r.headers_mut().insert(*k, v);
            }
        }
        r
    }
}
