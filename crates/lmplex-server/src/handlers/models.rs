//! `GET /v1/models` and `GET /v1/models/{id}`: the served models the caller may use, their LoRA
//! adapters (each with its `parent`, as vLLM lists them) and, with tiers, the routed names
//! (`lmplex:auto`, `tier:NAME`).

use crate::caller::Caller;
use crate::error::ApiError;
use crate::state::{now, AppState};
use crate::submit::routed_names;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::sync::Arc;

/// `GET /v1/models`: every served model the caller may use, then the routed names.
pub(crate) async fn list(State(st): State<Arc<AppState>>, Caller(tenant): Caller) -> Response {
    let mut data: Vec<Value> = st
        .host
        .names()
        .into_iter()
        .filter(|id| tenant.config().may_use(id))
        .map(|id| {
            let max_model_len = st.host.get(&id).map(|e| e.max_model_len());
            json!({"id": id, "object": "model", "created": now(), "owned_by": "lmplex", "max_model_len": max_model_len})
        })
        .collect();
    for (id, parent) in st.host.adapters().into_iter().filter(|(id, _)| tenant.config().may_use(id)) {
        let max_model_len = st.host.get(&parent).map(|e| e.max_model_len());
        data.push(json!({"id": id, "object": "model", "created": now(), "owned_by": "lmplex", "parent": parent,
            "max_model_len": max_model_len}));
    }
    for id in routed_names(&st, &tenant) {
        data.push(json!({"id": id, "object": "model", "created": now(), "owned_by": "lmplex"}));
    }
    Json(json!({"object": "list", "data": data})).into_response()
}

/// `GET /v1/models/{id}`: one model (or routed name) the caller may use, else 404.
pub(crate) async fn get(State(st): State<Arc<AppState>>, Caller(tenant): Caller, Path(id): Path<String>) -> Response {
    let parent = st.host.adapters().remove(&id);
    let served = (st.host.names().contains(&id) || parent.is_some()) && tenant.config().may_use(&id);
    if !served && !routed_names(&st, &tenant).contains(&id) {
        return ApiError::model_not_found(&id).into_response();
    }
    let mut object = json!({"id": id, "object": "model", "created": now(), "owned_by": "lmplex"});
    if let Some(e) = st.host.get(parent.as_deref().unwrap_or(&id)) {
        object["max_model_len"] = json!(e.max_model_len());
    }
    if let Some(p) = parent {
        object["parent"] = json!(p);
    }
    Json(object).into_response()
}
