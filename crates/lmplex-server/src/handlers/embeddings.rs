//! `POST /v1/embeddings` (OpenAI's): every input one request of one engine call on the named
//! embedding model, admitted against the caller's quotas once and batched together; the
//! response lists the vectors in input order with the prompt tokens they used.
//!
//! Data flow: the caller's tenant -> body -> the named model's engine (`named_engine`: a
//! routed name is a 400) -> `EmbeddingRequest::requests` -> `Call` -> `ModelHost::submit` ->
//! each handle's chunks (counted by a `Tracker`) -> `{"object": "list", "data", "model",
//! "usage"}`.

use crate::api::{self, EmbeddingRequest};
use crate::caller::Caller;
use crate::error::ApiError;
use crate::outcomes::{fail, Running, Tracker};
use crate::replies::{Embedding, EmbeddingList, EmbeddingUsage};
use crate::state::AppState;
use crate::submit::named_engine;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use lmplex_core::Route;
use lmplex_engine::{Call, Target};
use std::sync::Arc;
use std::time::Instant;

/// `POST /v1/embeddings`.
#[utoipa::path(post, path = "/v1/embeddings", tag = "embeddings", request_body = EmbeddingRequest,
    responses((status = 200, body = EmbeddingList)))]
pub(crate) async fn create(State(st): State<Arc<AppState>>, Caller(tenant): Caller, body: Bytes) -> Response {
    let start = Instant::now();
    let req: EmbeddingRequest = match api::parse(&body) {
        Ok(r) => r,
        Err(e) => return fail(&st, "", tenant.name(), e),
    };
    let (name, engine) = match named_engine(&st, &tenant, &req.model, "/v1/embeddings").await {
        Ok(found) => found,
        Err((m, e)) => return fail(&st, &m, tenant.name(), e),
    };
    let tokenizer = engine.tokenizer();
    let requests = match req.requests(|t, special| tokenizer.encode(t, special)) {
        Ok(r) => r,
        Err(e) => return fail(&st, &name, tenant.name(), e),
    };
    let call = match Call::new(tenant.clone(), &Route::default(), requests) {
        Ok(c) => c,
        Err(e) => return fail(&st, &name, tenant.name(), e.into()),
    };
    let submitted = match st.host.submit(&call, &Target::Named(name.clone())) {
        Ok(s) => s,
        Err(e) => return fail(&st, &name, tenant.name(), e.into()),
    };
    let running = Running { model: name.clone(), engine, tenant, routed: None, max_latency: None, start };
    let mut data = Vec::with_capacity(submitted.handles.len());
    let mut prompt_tokens = 0;
    for (index, mut h) in submitted.handles.into_iter().enumerate() {
        let mut tracker = Tracker::new(&st, &running);
        let mut vector = None;
        while let Some(c) = h.next().await {
            match c {
                Ok(c) => {
                    tracker.chunk(&c);
                    if let Some(u) = &c.usage {
                        prompt_tokens += u.prompt_tokens;
                    }
                    vector = c.embedding.or(vector);
                }
                Err(e) => {
                    tracker.counted();
                    return fail(&st, &name, running.tenant.name(), e.into());
                }
            }
        }
        let Some(v) = vector else {
            return fail(
                &st,
                &name,
                running.tenant.name(),
                ApiError::from(lmplex_core::Error::internal("no embedding")),
            );
        };
        let embedding = api::encode_embedding(&v, req.encoding_format);
        data.push(Embedding { object: "embedding", index, embedding });
    }
    let usage = EmbeddingUsage { prompt_tokens, total_tokens: prompt_tokens };
    Json(EmbeddingList { object: "list", data, model: name, usage }).into_response()
}
