//! `GET /v1/models` and `GET /v1/models/{id}`: the served models the caller may use, their LoRA
//! adapters (each with its `parent`, as vLLM lists them) and, with tiers, the routed names
//! (`lmplex:auto`, `tier:NAME`).

use crate::caller::Caller;
use crate::error::ApiError;
use crate::replies::{ModelCard, ModelList};
use crate::state::{now, AppState};
use crate::submit::routed_names;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use std::sync::Arc;

/// `GET /v1/models`: every served model the caller may use, then the routed names.
#[utoipa::path(get, path = "/v1/models", tag = "models", responses((status = 200, body = ModelList)))]
pub(crate) async fn list(State(st): State<Arc<AppState>>, Caller(tenant): Caller) -> Response {
    let mut data: Vec<ModelCard> = st
        .host
        .names()
        .into_iter()
        .filter(|id| tenant.config().may_use(id))
        .map(|id| {
            let max_model_len = st.host.get(&id).map(|e| e.max_model_len());
            ModelCard { max_model_len, ..card(id) }
        })
        .collect();
    for (id, parent) in st.host.adapters().into_iter().filter(|(id, _)| tenant.config().may_use(id)) {
        let max_model_len = st.host.get(&parent).map(|e| e.max_model_len());
        data.push(ModelCard { parent: Some(parent), max_model_len, ..card(id) });
    }
    data.extend(routed_names(&st, &tenant).into_iter().map(card));
    Json(ModelList { object: "list", data }).into_response()
}

/// A model entry with no parent and no context length.
fn card(id: String) -> ModelCard {
    ModelCard { id, object: "model", created: now(), owned_by: "lmplex", parent: None, max_model_len: None }
}

/// `GET /v1/models/{id}`: one model (or routed name) the caller may use, else 404.
#[utoipa::path(get, path = "/v1/models/{id}", tag = "models",
    params(("id" = String, Path, description = "A served model, LoRA adapter or routed name")),
    responses((status = 200, body = ModelCard)))]
pub(crate) async fn get(State(st): State<Arc<AppState>>, Caller(tenant): Caller, Path(id): Path<String>) -> Response {
    let parent = st.host.adapters().remove(&id);
    let served = (st.host.names().contains(&id) || parent.is_some()) && tenant.config().may_use(&id);
    if !served && !routed_names(&st, &tenant).contains(&id) {
        return ApiError::model_not_found(&id).into_response();
    }
    let max_model_len = st.host.get(parent.as_deref().unwrap_or(&id)).map(|e| e.max_model_len());
    Json(ModelCard { parent, max_model_len, ..card(id) }).into_response()
}
