//! `GET /v1/responses/{id}/input_items`: a stored response's own input items, as OpenAI lists
//! them: `{"object": "list", "data", "first_id", "last_id", "has_more"}`, newest first by default
//! (`order=asc` oldest first), `limit` items (1 to 100, default 20) after the item `after` (or
//! before the item `before`) in that order.
//!
//! Invariant: the listing reads the stored response alone (what the caller sent with it, not
//! the conversation of its `previous_response_id`), so another tenant's id is a 404 as for `GET`.

use super::{not_found, stored};
use crate::caller::Caller;
use crate::error::ApiError;
use crate::replies::InputItemList;
use crate::state::AppState;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

/// The listing's query.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct Page {
    limit: Option<i64>,
    order: Option<String>,
    after: Option<String>,
    before: Option<String>,
    /// OpenAI's `include` (extra fields of items): accepted; the items hold what was sent.
    #[allow(dead_code)]
    include: Option<String>,
}

/// The handler; see the module docs.
#[utoipa::path(get, path = "/v1/responses/{id}/input_items", tag = "responses",
    params(("id" = String, Path, description = "A stored response's id"), Page),
    responses((status = 200, body = InputItemList)))]
pub(crate) async fn list(
    State(st): State<Arc<AppState>>,
    Caller(tenant): Caller,
    Path(id): Path<String>,
    page: Result<Query<Page>, QueryRejection>,
) -> Response {
    let page = match page {
        Ok(Query(p)) => p,
        Err(e) => return ApiError::invalid(format!("invalid query: {}", e.body_text())).into_response(),
    };
    match stored(&st, tenant.name(), &id).await {
        Ok(Some(r)) => match listing(&r.input_items, &page) {
            Ok(v) => Json(v).into_response(),
            Err(e) => e.into_response(),
        },
        Ok(None) => not_found(&id, None).into_response(),
        Err(e) => e.into_response(),
    }
}

/// One page of `items` (oldest first) as `page` asks.
fn listing(items: &[Value], page: &Page) -> Result<Value, ApiError> {
    let limit = match page.limit {
        None => 20,
        Some(l @ 1..=100) => l as usize,
        Some(l) => return Err(ApiError::invalid_param("limit", format!("limit must be between 1 and 100, got {l}"))),
    };
    let mut ordered: Vec<&Value> = items.iter().collect();
    match page.order.as_deref() {
        None | Some("desc") => ordered.reverse(),
        Some("asc") => {}
        Some(o) => return Err(ApiError::invalid_param("order", format!("order must be 'asc' or 'desc', got '{o}'"))),
    }
    let at = |id: &str, param: &str| {
        ordered
            .iter()
            .position(|v| v["id"] == id)
            .ok_or_else(|| ApiError::invalid_param(param, format!("no input item '{id}' in this response")))
    };
    let (from, to) = match (&page.after, &page.before) {
        (Some(a), _) => (at(a, "after")? + 1, ordered.len()),
        (None, Some(b)) => (0, at(b, "before")?),
        (None, None) => (0, ordered.len()),
    };
    let window = &ordered[from..to];
    let data: Vec<&Value> = match page.before {
        Some(_) if page.after.is_none() => window[window.len().saturating_sub(limit)..].to_vec(),
        _ => window.iter().take(limit).copied().collect(),
    };
    let has_more = data.len() < window.len();
    let id = |v: Option<&&Value>| v.map_or(Value::Null, |v| v["id"].clone());
    Ok(json!({
        "object": "list",
        "data": data,
        "first_id": id(data.first()),
        "last_id": id(data.last()),
        "has_more": has_more,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(limit: Option<i64>, order: Option<&str>, after: Option<&str>, before: Option<&str>) -> Page {
        let s = |v: Option<&str>| v.map(str::to_string);
        Page { limit, order: s(order), after: s(after), before: s(before), include: None }
    }

    #[test]
    fn pages_go_newest_first_by_default() {
        let items: Vec<Value> = (0..5).map(|i| json!({"id": format!("m{i}")})).collect();
        let ids = |v: &Value| v["data"].as_array().unwrap().iter().map(|d| d["id"].clone()).collect::<Vec<_>>();
        let all = listing(&items, &page(None, None, None, None)).unwrap();
        assert_eq!(ids(&all), vec!["m4", "m3", "m2", "m1", "m0"]);
        assert_eq!(
            (all["first_id"].clone(), all["last_id"].clone(), all["has_more"].clone()),
            ("m4".into(), "m0".into(), false.into())
        );
        let first = listing(&items, &page(Some(2), Some("asc"), None, None)).unwrap();
        assert_eq!((ids(&first), first["has_more"].clone()), (vec![json!("m0"), json!("m1")], true.into()));
        let next = listing(&items, &page(Some(2), Some("asc"), Some("m1"), None)).unwrap();
        assert_eq!(ids(&next), vec!["m2", "m3"]);
        let before = listing(&items, &page(Some(2), Some("asc"), None, Some("m3"))).unwrap();
        assert_eq!(ids(&before), vec!["m1", "m2"]);
        let e = listing(&items, &page(Some(0), None, None, None)).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("limit"));
        assert_eq!(listing(&items, &page(None, None, Some("x"), None)).unwrap_err().param.as_deref(), Some("after"));
        assert_eq!(listing(&items, &page(None, Some("up"), None, None)).unwrap_err().param.as_deref(), Some("order"));
        let empty = listing(&[], &page(None, None, None, None)).unwrap();
        assert_eq!((empty["first_id"].clone(), empty["has_more"].clone()), (Value::Null, false.into()));
    }
}
