//! `POST /v1/responses`, and `GET`/`DELETE /v1/responses/{id}`: OpenAI's Responses API over the
//! chat path. The body becomes chat messages and tools (`api::ResponsesRequest`, after the
//! conversation of its `previous_response_id`), runs through the same submit path as chat (auth,
//! routing, its image URLs fetched once the call is authorized: `media`, quotas,
//! `Engine::submit_all`), and the chunks become output items (`output::Output`), answered whole
//! or as the Responses stream events; with `store` (the default) the finished response and its
//! conversation are kept (`crate::stored`).
//!
//! Invariants: a stream is `response.created`, `response.in_progress`, the items' events, then
//! `response.completed` or `response.incomplete` (or `error` and `response.failed` when the
//! engine fails mid-way), numbered from 0 by `sequence_number`, with no `[DONE]`; a client that
//! goes away drops the request, which the engine then aborts; the request is counted once in
//! the metrics however it ends; a response is stored once it has ended (completed or
//! incomplete, never failed), so `GET` never sees one in progress.

pub(crate) mod input_items;
mod output;

use crate::api::ResponsesRequest;
use crate::caller::Caller;
use crate::error::ApiError;
use crate::outcomes::{count_error, fail, Running, Tracker};
use crate::replies::Deleted;
use crate::replies::{ResponseObject, SseEvent};
use crate::reply::{add_headers, sse_response};
use crate::state::{now, AppState};
use crate::stored::{new_id, new_response_id, StoredResponse};
use crate::submit::submit;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use lmplex_engine::{ChatMessage, RequestHandle};
use output::{Head, Output};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Instant;

/// The handler: authenticate, parse, submit one request, answer whole or streamed.
#[utoipa::path(post, path = "/v1/responses", tag = "responses", request_body = ResponsesRequest, responses(
    (status = 200, description = "The response, or its server-sent events with `stream`",
        content((ResponseObject = "application/json"), (SseEvent = "text/event-stream"))),
))]
pub(crate) async fn create(State(st): State<Arc<AppState>>, Caller(tenant): Caller, body: Bytes) -> Response {
    let start = Instant::now();
    let mut req = match ResponsesRequest::parse(&body) {
        Ok(r) => r,
        Err(e) => return fail(&st, "", tenant.name(), e),
    };
    if let Some(id) = req.previous_response_id.clone() {
        match stored(&st, tenant.name(), &id).await {
            Ok(Some(prev)) => req.history.clone_from(&prev.conversation),
            Ok(None) => return fail(&st, "", tenant.name(), not_found(&id, Some("previous_response_id"))),
            Err(e) => return fail(&st, "", tenant.name(), e),
        }
    }
    let (call, handle) = match submit(&st, &mut req, tenant.clone(), start).await {
        Ok((call, handles)) => match handles.into_iter().next() {
            Some(h) => (call, h),
            None => return fail(&st, &call.model, tenant.name(), ApiError::invalid("the request made no prompt")),
        },
        Err((model, mut e)) => {
            // The engine checks the conversation as chat `messages`; here it is `input`.
            if e.param.as_deref() == Some("messages") {
                e.param = Some("input".into());
                e.message = e.message.replacen("messages", "input", 1);
            }
            return fail(&st, &model, tenant.name(), e);
        }
    };
    // What a stored response keeps: the turns it ran on (with the images fetched by `submit`,
    // whose prepared prompt already read them).
    let keep = match req.store.unwrap_or(true) && st.responses.is_on() {
        true => match req.turns() {
            Ok(turns) => Some(Keep { tenant: tenant.name().to_string(), turns, input_items: req.input_items(new_id) }),
            Err(e) => return fail(&st, &call.model, tenant.name(), e),
        },
        false => None,
    };
    let head = Head::new(new_response_id(), now(), &call.model, &req, keep.is_some());
    tracing::debug!(model = %call.model, response_id = %head.id, "generating");
    let mut r = if req.common.stream() {
        sse(st.clone(), &call, head, handle, keep)
    } else {
        whole(&st, &call, head, handle, keep).await
    };
    add_headers(&mut r, &call);
    r
}

/// What a stored response keeps besides its object: whose it is, the turns it ran on and its
/// own input items.
struct Keep {
    tenant: String,
    turns: Vec<ChatMessage>,
    input_items: Vec<Value>,
}

impl Keep {
    /// Stores the ended response `last` (`head`'s, built from `out`), before the reply goes out
    /// (so that a follow-up finds it).
    async fn store(self, st: &Arc<AppState>, head: &Head, out: &Output, last: &Value) {
        let mut conversation = self.turns;
        conversation.push(out.reply());
        let (st, id, response) = (st.clone(), head.id.clone(), last.clone());
        let stored = StoredResponse { response, conversation, input_items: self.input_items };
        let put = move || st.responses.put(&self.tenant, id, stored);
        if let Err(e) = tokio::task::spawn_blocking(put).await {
            tracing::warn!(error = %e, "a response was not stored");
        }
    }
}

/// The caller's stored response `id`, read off the async threads.
pub(super) async fn stored(
    st: &Arc<AppState>,
    tenant: &str,
    id: &str,
) -> Result<Option<Arc<StoredResponse>>, ApiError> {
    let (st, tenant, id) = (st.clone(), tenant.to_string(), id.to_string());
    tokio::task::spawn_blocking(move || st.responses.get(&tenant, &id))
        .await
        .map_err(|e| ApiError::from(lmplex_core::Error::internal(e.to_string())))?
}

/// `GET /v1/responses/{id}`: the caller's stored response.
#[utoipa::path(get, path = "/v1/responses/{id}", tag = "responses",
    params(("id" = String, Path, description = "A stored response's id")),
    responses((status = 200, body = ResponseObject)))]
pub(crate) async fn get(State(st): State<Arc<AppState>>, Caller(tenant): Caller, Path(id): Path<String>) -> Response {
    match stored(&st, tenant.name(), &id).await {
        Ok(Some(r)) => Json(r.response.clone()).into_response(),
        Ok(None) => not_found(&id, None).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `DELETE /v1/responses/{id}`: forgets the caller's stored response.
#[utoipa::path(delete, path = "/v1/responses/{id}", tag = "responses",
    params(("id" = String, Path, description = "A stored response's id")),
    responses((status = 200, body = Deleted)))]
pub(crate) async fn delete(
    State(st): State<Arc<AppState>>,
    Caller(tenant): Caller,
    Path(id): Path<String>,
) -> Response {
    let (state, name, which) = (st.clone(), tenant.name().to_string(), id.clone());
    let deleted = tokio::task::spawn_blocking(move || state.responses.delete(&name, &which)).await;
    match deleted.map_err(|e| ApiError::from(lmplex_core::Error::internal(e.to_string()))) {
        Ok(Ok(true)) => Json(Deleted { id, object: "response", deleted: true }).into_response(),
        Ok(Ok(false)) => not_found(&id, None).into_response(),
        Ok(Err(e)) | Err(e) => e.into_response(),
    }
}

/// OpenAI's 404 for a response id that is not stored (or not the caller's).
pub(super) fn not_found(id: &str, param: Option<&str>) -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        param: param.map(str::to_string),
        ..ApiError::invalid(format!("Response with id '{id}' not found."))
    }
}

/// Collects every chunk into one response object.
async fn whole(st: &Arc<AppState>, call: &Running, head: Head, mut h: RequestHandle, keep: Option<Keep>) -> Response {
    let mut tracker = Tracker::new(st, call);
    let mut out = Output::new(&head.id);
    let mut events = Vec::new();
    while let Some(c) = h.next().await {
        match c {
            Ok(c) => {
                tracker.chunk(&c);
                out.add(&c, &mut events);
                events.clear();
            }
            Err(e) => {
                tracker.counted(); // counted once, by `fail`
                return fail(st, &call.model, call.tenant.name(), e.into());
            }
        }
    }
    out.finish(&mut events);
    let last = head.done(&out);
    if let Some(k) = keep {
        k.store(st, &head, &out, &last).await;
    }
    Json(last).into_response()
}

/// Sends numbered events into the response body's channel.
struct Emitter {
    tx: tokio::sync::mpsc::Sender<Event>,
    seq: u64,
}

impl Emitter {
    /// Sends one event; false when the client has gone.
    async fn send(&mut self, mut v: Value) -> bool {
        v["sequence_number"] = json!(self.seq);
        self.seq += 1;
        let kind = v["type"].as_str().unwrap_or("message").to_string();
        self.tx.send(Event::default().event(kind).data(v.to_string())).await.is_ok()
    }

    async fn send_all(&mut self, events: &mut Vec<Value>) -> bool {
        for v in events.drain(..) {
            if !self.send(v).await {
                return false;
            }
        }
        true
    }
}

/// Streams the response as the Responses API's server-sent events.
fn sse(st: Arc<AppState>, call: &Running, head: Head, mut h: RequestHandle, keep: Option<Keep>) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Event>(64);
    let mut tracker = Tracker::new(&st, call);
    let (model, tenant) = (call.model.clone(), call.tenant.name().to_string());
    tokio::spawn(async move {
        let mut em = Emitter { tx, seq: 0 };
        for status in ["created", "in_progress"] {
            let v = json!({"type": format!("response.{status}"), "response": head.object("in_progress", None)});
            if !em.send(v).await {
                return;
            }
        }
        let mut out = Output::new(&head.id);
        let mut events = Vec::new();
        while let Some(c) = h.next().await {
            match c {
                Ok(c) => {
                    tracker.chunk(&c);
                    out.add(&c, &mut events);
                    if !em.send_all(&mut events).await {
                        return; // client gone: dropping `h` aborts the request
                    }
                }
                Err(e) => {
                    let e = ApiError::from(e);
                    count_error(&st, &model, &tenant, &e);
                    tracker.counted();
                    let error = json!({"code": e.code.unwrap_or(e.kind), "message": e.message});
                    let v = json!({"type": "error", "code": error["code"], "message": e.message, "param": e.param});
                    if em.send(v).await {
                        let mut failed = head.object("failed", Some(&out));
                        failed["error"] = error;
                        em.send(json!({"type": "response.failed", "response": failed})).await;
                    }
                    return;
                }
            }
        }
        out.finish(&mut events);
        let last = head.done(&out);
        if let Some(k) = keep {
            k.store(&st, &head, &out, &last).await; // ended, whether or not the client stayed
        }
        if em.send_all(&mut events).await {
            let kind = format!("response.{}", out.status());
            em.send(json!({"type": kind, "response": last})).await;
        }
    });
    sse_response(rx)
}
