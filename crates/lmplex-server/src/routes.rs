//! The router: every route lmplex serves, to its handler (`crate::handlers`), an OpenAI-shaped
//! 404 for anything else, the `Idempotency-Key` middleware, and the request-id middleware around
//! them all.
//!
//! Invariant: a route is registered with `utoipa_axum::routes!`, which adds its OpenAPI
//! operation with it (`crate::openapi`). The one exception is `GET /v1/models/{*id}`: a model
//! id may hold slashes (`org/name`), which an OpenAPI path parameter cannot; its operation is
//! the same handler's, documented as `/v1/models/{id}`.

use crate::error::ApiError;
use crate::handlers::{embeddings, generate, lora, messages, models, ops, responses, tokenize, usage};
use crate::openapi::{self, ApiDoc};
use crate::state::AppState;
use axum::http::Uri;
use axum::routing::get;
use axum::{Extension, Router};
use std::sync::Arc;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// The routes and their OpenAPI operations, before the state is given.
fn documented() -> OpenApiRouter<Arc<AppState>> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(ops::health))
        .routes(routes!(ops::ready))
        .routes(routes!(ops::metrics))
        .routes(routes!(ops::openapi))
        .routes(routes!(models::list))
        .routes(routes!(generate::completions))
        .routes(routes!(generate::chat))
        .routes(routes!(embeddings::create))
        .routes(routes!(responses::create))
        .routes(routes!(responses::get, responses::delete))
        .routes(routes!(responses::input_items::list))
        .routes(routes!(messages::create))
        .routes(routes!(messages::count_tokens))
        .routes(routes!(usage::usage))
        .routes(routes!(lora::load))
        .routes(routes!(lora::unload))
        .routes(routes!(tokenize::tokenize))
        .routes(routes!(tokenize::detokenize))
}

/// The OpenAPI document of every route (`/openapi.json`).
pub fn document() -> utoipa::openapi::OpenApi {
    let (_, mut doc) = documented().split_for_parts();
    let models = utoipa::openapi::path::Paths::builder().path_from::<models::__path_get>().build();
    doc.paths.paths.extend(models.paths);
    openapi::finish(doc)
}

/// The server's routes over `state`, with the request-id middleware.
pub fn router(state: Arc<AppState>) -> Router {
    let doc: Arc<str> = serde_json::to_string(&document()).unwrap_or_default().into();
    let (routes, _) = documented().split_for_parts();
    routes
        .route("/v1/models/{*id}", get(models::get))
        .fallback(|uri: Uri| async move { ApiError::not_found_route(uri.path()) })
        .layer(axum::middleware::from_fn_with_state(state.clone(), crate::idempotency::with_idempotency))
        .layer(Extension(doc))
        .layer(axum::middleware::from_fn(crate::request_id::with_request_id))
        .with_state(state)
}
