//! vLLM's `POST /v1/load_lora_adapter` (`{"lora_name", "lora_path"}`, and lmplex's `"model"`
//! naming the base when the server has several) and `POST /v1/unload_lora_adapter`
//! (`{"lora_name"}`): serve a PEFT adapter folder as a model at run time, or stop serving it.
//! Both answer vLLM's plain-text success line.
//!
//! Invariants: with API keys configured only the default tenant's keys (`api_keys`, the
//! administrators') may call them, anyone else gets a 403; a failed load changes nothing.

use crate::api;
use crate::caller::Caller;
use crate::error::ApiError;
use crate::outcomes::fail;
use crate::state::AppState;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use lmplex_engine::Tenant;
use serde::Deserialize;
use std::sync::Arc;

/// The body of `POST /v1/load_lora_adapter`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct LoadLora {
    lora_name: String,
    lora_path: String,
    /// The base model, when the server serves several.
    #[serde(default)]
    model: Option<String>,
    /// vLLM's: replace an adapter of the same name (lmplex always does).
    #[serde(default)]
    #[allow(dead_code)]
    load_inplace: Option<bool>,
}

/// The body of `POST /v1/unload_lora_adapter`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct UnloadLora {
    lora_name: String,
    /// vLLM's adapter id, unused: lmplex names adapters.
    #[serde(default)]
    #[allow(dead_code)]
    lora_int_id: Option<i64>,
}

/// A 403 unless the caller may change what is served.
fn admin(st: &AppState, tenant: &Tenant) -> Result<(), ApiError> {
    if !st.host.tenants().has_keys() || tenant.name().is_empty() {
        return Ok(());
    }
    Err(ApiError {
        status: StatusCode::FORBIDDEN,
        code: Some("permission_denied"),
        ..ApiError::invalid("only the server's api_keys may load or unload LoRA adapters")
    })
}

/// `POST /v1/load_lora_adapter`.
#[utoipa::path(post, path = "/v1/load_lora_adapter", tag = "lora", request_body = LoadLora, responses(
    (status = 200, description = "vLLM's success line", content_type = "text/plain", body = String),
))]
pub(crate) async fn load(State(st): State<Arc<AppState>>, Caller(tenant): Caller, body: Bytes) -> Response {
    let req: LoadLora = match api::parse(&body) {
        Ok(r) => r,
        Err(e) => return fail(&st, "", tenant.name(), e),
    };
    if let Err(e) = admin(&st, &tenant) {
        return fail(&st, "", tenant.name(), e);
    }
    let (host, name) = (st.clone(), req.lora_name.clone());
    let loaded = tokio::task::spawn_blocking(move || {
        host.host.load_lora_adapter(req.model.as_deref(), &req.lora_name, &req.lora_path)
    })
    .await;
    match loaded {
        Ok(Ok(())) => {
            tracing::info!(adapter = %name, "loaded LoRA adapter");
            format!("Success: LoRA adapter '{name}' added successfully.").into_response()
        }
        Ok(Err(e)) => fail(&st, "", tenant.name(), e.into()),
        Err(e) => fail(&st, "", tenant.name(), lmplex_core::Error::internal(e).into()),
    }
}

/// `POST /v1/unload_lora_adapter`.
#[utoipa::path(post, path = "/v1/unload_lora_adapter", tag = "lora", request_body = UnloadLora, responses(
    (status = 200, description = "vLLM's success line", content_type = "text/plain", body = String),
))]
pub(crate) async fn unload(State(st): State<Arc<AppState>>, Caller(tenant): Caller, body: Bytes) -> Response {
    let req: UnloadLora = match api::parse(&body) {
        Ok(r) => r,
        Err(e) => return fail(&st, "", tenant.name(), e),
    };
    if let Err(e) = admin(&st, &tenant) {
        return fail(&st, "", tenant.name(), e);
    }
    match st.host.unload_lora_adapter(&req.lora_name) {
        Ok(()) => {
            tracing::info!(adapter = %req.lora_name, "unloaded LoRA adapter");
            format!("Success: LoRA adapter '{}' removed successfully.", req.lora_name).into_response()
        }
        Err(e) => fail(&st, "", tenant.name(), e.into()),
    }
}
