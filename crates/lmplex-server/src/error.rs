//! `ApiError`: every failure the server answers, as an OpenAI-shaped error body.
//!
//! `{"error": {"message", "type", "param", "code"}}` with the status a client library maps to
//! its own exception: 400 `invalid_request_error` (bad JSON, wrong types, bad values, prompt
//! too long), 404 (unknown model or route), 429 (queue full: retry), 503 (loading, draining),
//! 500 (a bug). Invariant: no handler answers an error any other way.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use lmplex_core::Error;
use serde_json::json;

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
        }
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        let (status, kind, code) = match &e {
            Error::InvalidRequest(_) | Error::ModelLoad(_) => (StatusCode::BAD_REQUEST, "invalid_request_error", None),
            Error::Capacity(_) => (StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", Some("capacity")),
            Error::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal_server_error", None),
        };
        Self { status, kind, code, param: None, message: e.to_string() }
    }
}

impl ApiError {
    /// The JSON error body: `{"error": {"message", "type", "param", "code"}}`.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}
