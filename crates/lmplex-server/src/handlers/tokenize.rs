//! vLLM's `POST /tokenize` and `POST /detokenize` on a served model the caller may use: no
//! quota is charged and nothing runs on the model (its tokenizer and chat template only). Image
//! URLs in `messages` are not fetched: counting renders the template's image marker, which needs
//! no bytes; each URL is checked as a chat call's fetch would check it (scheme, listed host, at
//! most the model's `limit_mm_per_prompt.image`), so both refuse the same (`media`).

use crate::api::{self, DetokenizeRequest, TokenizeRequest};
use crate::caller::Caller;
use crate::media::{check_images, ImageLimit};
use crate::outcomes::fail;
use crate::replies::{Detokenized, Tokenized};
use crate::state::AppState;
use crate::submit::named_engine;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use lmplex_engine::{Engine, Tenant};
use std::sync::Arc;

/// `POST /tokenize`: `{"count", "max_model_len", "tokens", "token_strs"}`.
#[utoipa::path(post, path = "/tokenize", tag = "tokenizer", request_body = TokenizeRequest,
    responses((status = 200, body = Tokenized)))]
pub(crate) async fn tokenize(State(st): State<Arc<AppState>>, Caller(tenant): Caller, body: Bytes) -> Response {
    let (mut req, model, engine) = match parse::<TokenizeRequest>(&st, &tenant, &body, |r| &r.model, "/tokenize").await
    {
        Ok(found) => found,
        Err(r) => return r,
    };
    let limit = ImageLimit { most: engine.config().limit_mm_per_prompt.image, of: format!("the model '{model}'") };
    if let Err(e) = check_images(&st.media, &mut req, &limit) {
        return fail(&st, &model, tenant.name(), e);
    }
    let tokenizer = engine.tokenizer();
    match req.tokenize(tokenizer) {
        Ok(ids) => {
            let strs = req
                .return_token_strs
                .unwrap_or(false)
                .then(|| ids.iter().map(|&t| tokenizer.token_text(t)).collect::<Vec<_>>());
            let max_model_len = engine.max_model_len();
            Json(Tokenized { count: ids.len(), max_model_len, tokens: ids, token_strs: strs }).into_response()
        }
        Err(e) => fail(&st, &model, tenant.name(), e),
    }
}

/// `POST /detokenize`: `{"prompt"}`.
#[utoipa::path(post, path = "/detokenize", tag = "tokenizer", request_body = DetokenizeRequest,
    responses((status = 200, body = Detokenized)))]
pub(crate) async fn detokenize(State(st): State<Arc<AppState>>, Caller(tenant): Caller, body: Bytes) -> Response {
    let (req, model, engine) = match parse::<DetokenizeRequest>(&st, &tenant, &body, |r| &r.model, "/detokenize").await
    {
        Ok(found) => found,
        Err(r) => return r,
    };
    match req.detokenize(engine.tokenizer()) {
        Ok(text) => Json(Detokenized { prompt: text }).into_response(),
        Err(e) => fail(&st, &model, tenant.name(), e),
    }
}

/// The body, and the served model it names with its engine; or the answer to a bad body or
/// model (counted).
async fn parse<R: serde::de::DeserializeOwned>(
    st: &Arc<AppState>,
    tenant: &Tenant,
    body: &[u8],
    model: fn(&R) -> &str,
    what: &str,
) -> Result<(R, String, Arc<Engine>), Response> {
    let req: R = api::parse(body).map_err(|e| fail(st, "", tenant.name(), e))?;
    let (name, engine) =
        named_engine(st, tenant, model(&req), what).await.map_err(|(m, e)| fail(st, &m, tenant.name(), e))?;
    Ok((req, name, engine))
}
