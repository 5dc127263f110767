//! `POST /v1/completions` and `POST /v1/chat/completions`.
//!
//! Data flow: the caller's tenant (`Caller`) -> body bytes -> `api` parse and checks -> the call
//! submitted where its `model` names (`submit`: the model authorized, chat's image URLs fetched
//! (`media`), one engine `Call`, one quota admission, every prompt and sample queued at once, so
//! they batch) -> `reply`: one JSON reply, or SSE events.

use crate::api::{self, ChatRequest, CompletionRequest, GenerationRequest};
use crate::caller::Caller;
use crate::media::WithImages;
use crate::outcomes::fail;
use crate::render::Kind;
use crate::replies::{ChatCompletion, Completion, SseEvent};
use crate::reply::{self, Shape};
use crate::state::AppState;
use crate::submit::submit;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use std::sync::Arc;
use std::time::Instant;

/// `POST /v1/completions`.
#[utoipa::path(post, path = "/v1/completions", tag = "generation", request_body = CompletionRequest, responses(
    (status = 200, description = "The completion, or its server-sent events with `stream`",
        content((Completion = "application/json"), (SseEvent = "text/event-stream"))),
))]
pub(crate) async fn completions(st: State<Arc<AppState>>, caller: Caller, body: Bytes) -> Response {
    endpoint::<CompletionRequest>(st, caller, body, Kind::Completion).await
}

/// `POST /v1/chat/completions`.
#[utoipa::path(post, path = "/v1/chat/completions", tag = "generation", request_body = ChatRequest, responses(
    (status = 200, description = "The chat completion, or its server-sent events with `stream`",
        content((ChatCompletion = "application/json"), (SseEvent = "text/event-stream"))),
))]
pub(crate) async fn chat(st: State<Arc<AppState>>, caller: Caller, body: Bytes) -> Response {
    endpoint::<ChatRequest>(st, caller, body, Kind::Chat).await
}

/// Parses, submits and answers one call of either endpoint.
async fn endpoint<R: GenerationRequest + WithImages + serde::de::DeserializeOwned>(
    State(st): State<Arc<AppState>>,
    Caller(tenant): Caller,
    body: Bytes,
    kind: Kind,
) -> Response {
    let start = Instant::now();
    let mut req: R = match api::parse(&body) {
        Ok(r) => r,
        Err(e) => return fail(&st, "", tenant.name(), e),
    };
    let shape = match req.common().n().and_then(|n| Ok(Shape { n, extras: req.extras()? })) {
        Ok(s) => s,
        Err(e) => return fail(&st, "", tenant.name(), e),
    };
    let (stream, usage) = (req.common().stream(), req.common().stream_usage());
    match submit(&st, &mut req, tenant.clone(), start).await {
        Ok((call, handles)) => reply::generate(&st, kind, call, handles, shape, stream, usage).await,
        Err((model, e)) => fail(&st, &model, tenant.name(), e),
    }
}
