//! The router: every route lmplex serves, to its handler (`crate::handlers`), an OpenAI-shaped
//! 404 for anything else, and the request-id middleware around them all.

use crate::error::ApiError;
use crate::handlers::{embeddings, generate, lora, messages, models, ops, responses, tokenize, usage};
use crate::state::AppState;
use axum::http::Uri;
use axum::routing::{get, post};
use axum::Router;
use std::sync::Arc;

/// The server's routes over `state`, with the request-id middleware.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(ops::health))
        .route("/ready", get(ops::ready))
        .route("/metrics", get(ops::metrics))
        .route("/v1/models", get(models::list))
        .route("/v1/models/{*id}", get(models::get))
        .route("/v1/completions", post(generate::completions))
        .route("/v1/chat/completions", post(generate::chat))
        .route("/v1/embeddings", post(embeddings::create))
        .route("/v1/responses", post(responses::create))
        .route("/v1/responses/{id}", get(responses::get).delete(responses::delete))
        .route("/v1/responses/{id}/input_items", get(responses::input_items))
        .route("/v1/messages", post(messages::create))
        .route("/v1/messages/count_tokens", post(messages::count_tokens))
        .route("/v1/usage", get(usage::usage))
        .route("/v1/load_lora_adapter", post(lora::load))
        .route("/v1/unload_lora_adapter", post(lora::unload))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .fallback(|uri: Uri| async move { ApiError::not_found_route(uri.path()) })
        .layer(axum::middleware::from_fn(crate::request_id::with_request_id))
        .with_state(state)
}
