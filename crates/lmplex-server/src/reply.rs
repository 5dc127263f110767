//! A submitted call's reply: every sample collected into one JSON response (`best_of`
//! keeps the likeliest), or the chunks streamed as SSE events as they come.
//!
//! Invariants: a streamed reply's events add up to the whole one (`render`); a client that goes
//! away drops the body, which ends the task and drops its `RequestHandle`s, so the engine aborts
//! those requests; each request is counted once in the metrics (`Tracker`); an answer carries
//! the tenant's rate-limit headers and, for a routed call, the `x-lmplex-*` headers.

use crate::api;
use crate::caller::add_rate_limit_headers;
use crate::error::ApiError;
use crate::outcomes::{count_error, fail, Running, Tracker};
use crate::render::{self, Kind};
use crate::state::{now, AppState};
use crate::submit::{add_overrun_header, add_route_headers};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, SelectAll, StreamExt};
use lmplex_core::{StreamChunk, Usage};
use lmplex_engine::{Engine, RequestHandle};
use serde_json::Value;
use std::convert::Infallible;
use std::sync::Arc;

/// How a call's samples become its choices: `extras.best_of` samples per prompt, of which the
/// `n` likeliest are kept (all of them when `best_of` is `n`).
#[derive(Clone, Copy)]
pub(crate) struct Shape {
    /// Choices per prompt.
    pub n: usize,
    /// The completions options (`best_of` among them).
    pub extras: api::Extras,
}

/// For a completions `echo`: each handle's prompt text and its first token's text.
fn echoes(engine: &Engine, handles: &[RequestHandle], echo: bool) -> Vec<Option<(String, String)>> {
    let first = |h: &RequestHandle| h.prompt_token_ids().first().map(|&t| engine.tokenizer().token_text(t));
    handles.iter().map(|h| echo.then(|| (h.prompt().to_string(), first(h).unwrap_or_default()))).collect()
}

/// Runs a submitted call to its JSON reply, or streams it as SSE; either way with the tenant's
/// rate-limit headers and, for a routed call, the `x-lmplex-*` headers.
pub(crate) async fn generate(
    st: &Arc<AppState>,
    kind: Kind,
    call: Running,
    handles: Vec<RequestHandle>,
    shape: Shape,
    stream: bool,
    usage: api::StreamUsage,
) -> Response {
    let (model, tenant) = (call.model.clone(), call.tenant.name().to_string());
    let id = st.new_id(&format!("{}-", kind.id_prefix()));
    tracing::debug!(%model, completion_id = %id, num_requests = handles.len(), "generating");
    let fp = call.engine.system_fingerprint().to_string();
    let extras = shape.extras;
    let head = render::Head { id, created: now(), model: model.clone(), kind, system_fingerprint: fp, extras };
    let echoes = echoes(&call.engine, &handles, extras.echo);
    let mut r = if stream {
        sse(st.clone(), &call, head, handles, echoes, usage)
    } else {
        match whole(st, &call, &head, handles, echoes, shape).await {
            Ok(v) => Json(v).into_response(),
            Err(e) => return fail(st, &model, &tenant, e),
        }
    };
    add_headers(&mut r, &call);
    r
}

/// Adds a call's headers to its answer: the tenant's rate limits, a budget overrun and, for a
/// routed call, the `x-lmplex-*` headers.
pub(crate) fn add_headers(r: &mut Response, call: &Running) {
    add_rate_limit_headers(r, &call.tenant);
    add_overrun_header(r, call);
    if let Some(routed) = &call.routed {
        add_route_headers(r, routed);
    }
}

/// Collects every sample, keeps the `n` likeliest of each prompt's (`best_of`), and renders
/// the whole response.
async fn whole(
    st: &Arc<AppState>,
    call: &Running,
    head: &render::Head,
    handles: Vec<RequestHandle>,
    echoes: Vec<Option<(String, String)>>,
    shape: Shape,
) -> Result<Value, ApiError> {
    let per_prompt = shape.extras.best_of.max(1);
    let mut samples = Vec::with_capacity(handles.len());
    let mut usage = Usage::default();
    for (i, (mut h, echo)) in handles.into_iter().zip(echoes).enumerate() {
        let mut tracker = Tracker::new(st, call);
        let mut acc = render::Choice { echo, ..Default::default() };
        while let Some(c) = h.next().await {
            match c {
                Ok(c) => {
                    tracker.chunk(&c);
                    acc.add(&c);
                }
                Err(e) => {
                    tracker.counted(); // counted once, by the caller's `fail`
                    return Err(e.into());
                }
            }
        }
        // A prompt's tokens count once, however many samples it has (OpenAI's usage).
        if i % per_prompt == 0 {
            usage.prompt_tokens += acc.usage.prompt_tokens;
            usage.cached_tokens += acc.usage.cached_tokens;
        }
        usage.completion_tokens += acc.usage.completion_tokens;
        usage.reasoning_tokens += acc.usage.reasoning_tokens;
        samples.push(acc);
    }
    let mut choices = Vec::with_capacity(samples.len());
    for group in samples.chunks(per_prompt) {
        let mut order: Vec<usize> = (0..group.len()).collect();
        if per_prompt > shape.n {
            // Highest summed logprob first; a stable sort keeps sample order on ties.
            order.sort_by(|&a, &b| group[b].cumulative_logprob().total_cmp(&group[a].cumulative_logprob()));
            order.truncate(shape.n);
        }
        choices.extend(order.into_iter().map(|k| &group[k]));
    }
    let prompt_logprobs = samples.first().and_then(|s| head.chat_prompt_logprobs(s));
    let choices = choices.into_iter().enumerate().map(|(i, c)| head.choice(i, c)).collect();
    Ok(head.response(choices, usage, prompt_logprobs))
}

type Tagged = std::pin::Pin<Box<dyn futures_util::Stream<Item = (usize, lmplex_core::Result<StreamChunk>)> + Send>>;

/// Streams every prompt's chunks as SSE events (interleaved, tagged by choice index; a choice's
/// first chunk carries its `echo`), then the usage chunk if asked for, then `[DONE]`. Samples
/// are choices one to one: `best_of` above `n` is refused for streams.
fn sse(
    st: Arc<AppState>,
    call: &Running,
    head: render::Head,
    handles: Vec<RequestHandle>,
    mut echoes: Vec<Option<(String, String)>>,
    report: api::StreamUsage,
) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Event>(64);
    let trackers: Vec<Tracker> = (0..handles.len()).map(|_| Tracker::new(&st, call)).collect();
    let tenant = call.tenant.name().to_string();
    let per_prompt = head.extras.best_of.max(1);
    // Each choice's usage so far, for `continuous_usage_stats`.
    let mut so_far: Vec<Usage> =
        handles.iter().map(|h| Usage { prompt_tokens: h.num_prompt_tokens(), ..Usage::default() }).collect();
    let with_usage = move |mut v: Value, u: Usage| {
        if report.every_chunk {
            v["usage"] = render::usage_json(u);
        }
        v
    };
    tokio::spawn(async move {
        let n = handles.len();
        let mut merged: SelectAll<Tagged> = SelectAll::new();
        for (i, h) in handles.into_iter().enumerate() {
            merged.push(Box::pin(stream::unfold(h, move |mut h| async move { h.next().await.map(|c| ((i, c), h)) })));
        }
        let mut trackers = trackers;
        let mut usage = Usage::default();
        let mut offsets = vec![0usize; n];
        let mut calls = vec![0usize; n];
        if head.kind == Kind::Chat {
            for (i, &u) in so_far.iter().enumerate() {
                if tx.send(event(&with_usage(head.role_chunk(i), u))).await.is_err() {
                    return;
                }
            }
        }
        while let Some((i, c)) = merged.next().await {
            let ev = match c {
                Ok(c) => {
                    trackers[i].chunk(&c);
                    so_far[i].completion_tokens += c.token_ids.len();
                    if let Some(u) = c.usage {
                        so_far[i] = u;
                        if i % per_prompt == 0 {
                            usage.prompt_tokens += u.prompt_tokens;
                            usage.cached_tokens += u.cached_tokens;
                        }
                        usage.completion_tokens += u.completion_tokens;
                        usage.reasoning_tokens += u.reasoning_tokens;
                    }
                    let one = render::Choice { echo: echoes[i].take(), ..render::Choice::of(&c) };
                    let ev = event(&with_usage(head.chunk(i, &one, offsets[i], calls[i]), so_far[i]));
                    offsets[i] += one.echo.as_ref().map_or(0, |e| e.0.chars().count()) + c.text.chars().count();
                    calls[i] += c.tool_calls.len();
                    ev
                }
                Err(e) => {
                    let e = ApiError::from(e);
                    count_error(&st, &head.model, &tenant, &e);
                    trackers[i].counted();
                    event(&e.body())
                }
            };
            if tx.send(ev).await.is_err() {
                return; // client gone: dropping `merged` aborts the requests
            }
        }
        if report.last {
            let _ = tx.send(event(&head.usage_chunk(usage))).await;
        }
        let _ = tx.send(Event::default().data("[DONE]")).await;
    });
    sse_response(rx)
}

/// A server-sent-events answer of the events a task sends into `rx`, ending when it drops its
/// sender.
pub(crate) fn sse_response(rx: tokio::sync::mpsc::Receiver<Event>) -> Response {
    let body = stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|e| (Ok::<_, Infallible>(e), rx)) });
    Sse::new(body).into_response()
}

fn event(v: &Value) -> Event {
    Event::default().data(v.to_string())
}
