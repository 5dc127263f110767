//! The OpenAPI 3.1 document of every route the server serves, served at `/openapi.json`.
//!
//! Data flow: each handler carries a `#[utoipa::path]` attribute naming its method, path,
//! request body type (`crate::api`) and reply types (`crate::replies`); `crate::routes`
//! registers the handlers through `utoipa_axum::routes!`, which adds a route and its
//! operation together, so a route cannot be served without an entry here. `finish` then adds
//! what every operation shares: the error replies (`4XX`, `5XX`), the two ways to send an API
//! key, and on every `POST` the optional `Idempotency-Key` header.
//!
//! Invariants: request schemas come from the serde types the handlers parse, reply schemas
//! from the types they serialize; the document is built once, when the router is.

use crate::replies::ErrorBody;
use utoipa::openapi::path::{Operation, Parameter, ParameterBuilder, ParameterIn};
use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{
    ContentBuilder, OpenApi as Document, Ref, RefOr, Required, Response, ResponseBuilder, SecurityRequirement,
};
use utoipa::{OpenApi, ToSchema};

/// The document's fixed parts; the paths come from the router.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "lmplex",
        description = "OpenAI- and Anthropic-compatible API of an lmplex server: many models on one device, \
            tenants, routing (docs/serving.md, docs/routing.md).",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    components(schemas(ErrorBody))
)]
pub struct ApiDoc;

/// The document for `paths`: the error replies every operation may answer, and the security
/// schemes (`Authorization: Bearer KEY` or `x-api-key: KEY`, optional when no keys are set).
pub fn finish(mut doc: Document) -> Document {
    let components = doc.components.get_or_insert_with(Default::default);
    let bearer = HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build();
    components.add_security_scheme("bearer", SecurityScheme::Http(bearer));
    let header = ApiKey::Header(ApiKeyValue::new("x-api-key"));
    components.add_security_scheme("x_api_key", SecurityScheme::ApiKey(header));
    // Any of the two keys, or none (a server without `api_keys` asks for none).
    doc.security = Some(vec![
        SecurityRequirement::new("bearer", Vec::<String>::new()),
        SecurityRequirement::new("x_api_key", Vec::<String>::new()),
        SecurityRequirement::default(),
    ]);
    for item in doc.paths.paths.values_mut() {
        if let Some(op) = &mut item.post {
            op.parameters.get_or_insert_with(Vec::new).push(RefOr::T(idempotency_key()));
        }
        let ops = [&mut item.get, &mut item.post, &mut item.delete];
        for op in ops.into_iter().flatten() {
            add_errors(op);
        }
    }
    doc
}

/// The optional `Idempotency-Key` header every `POST` takes (`crate::idempotency`).
fn idempotency_key() -> Parameter {
    let schema = ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(Some(1))
        .max_length(Some(255))
        .pattern(Some("^[!-~]+$"))
        .build();
    ParameterBuilder::new()
        .name("Idempotency-Key")
        .parameter_in(ParameterIn::Header)
        .required(Required::False)
        .description(Some(
            "Sent again with the same body, the call is answered with its first reply (header \
             `idempotent-replayed: true`) instead of running again; 409 while the first still runs.",
        ))
        .schema(Some(schema))
        .build()
}

/// The `4XX` and `5XX` replies of `op`, OpenAI's error body unless it names its own.
fn add_errors(op: &mut Operation) {
    let error = || -> RefOr<Response> {
        let content = ContentBuilder::new().schema(Some(Ref::from_schema_name(ErrorBody::name()))).build();
        ResponseBuilder::new().description("An error: `{\"error\": {...}}`").content("application/json", content).into()
    };
    for range in ["4XX", "5XX"] {
        op.responses.responses.entry(range.to_string()).or_insert_with(error);
    }
}

#[cfg(test)]
mod tests {
    /// Every route the router serves, by method and OpenAPI path.
    const ROUTES: &[(&str, &str)] = &[
        ("get", "/health"),
        ("get", "/ready"),
        ("get", "/metrics"),
        ("get", "/openapi.json"),
        ("get", "/v1/models"),
        ("get", "/v1/models/{id}"),
        ("post", "/v1/completions"),
        ("post", "/v1/chat/completions"),
        ("post", "/v1/embeddings"),
        ("post", "/v1/responses"),
        ("get", "/v1/responses/{id}"),
        ("delete", "/v1/responses/{id}"),
        ("get", "/v1/responses/{id}/input_items"),
        ("post", "/v1/messages"),
        ("post", "/v1/messages/count_tokens"),
        ("get", "/v1/usage"),
        ("post", "/v1/load_lora_adapter"),
        ("post", "/v1/unload_lora_adapter"),
        ("post", "/tokenize"),
        ("post", "/detokenize"),
    ];

    #[test]
    fn the_document_lists_every_route_with_its_replies() {
        let doc = crate::routes::document();
        let json = serde_json::to_value(&doc).unwrap();
        assert!(json["openapi"].as_str().unwrap().starts_with("3.1"), "{}", json["openapi"]);
        let paths = json["paths"].as_object().unwrap();
        let mut listed: Vec<(String, String)> = paths
            .iter()
            .flat_map(|(p, item)| {
                item.as_object().unwrap().keys().filter(|k| *k != "parameters").map(|m| (m.clone(), p.clone()))
            })
            .collect();
        listed.sort();
        let mut want: Vec<(String, String)> = ROUTES.iter().map(|(m, p)| (m.to_string(), p.to_string())).collect();
        want.sort();
        assert_eq!(listed, want);
        for (method, path) in ROUTES {
            let op = &paths[*path][*method];
            let replies = op["responses"].as_object().unwrap();
            assert!(replies.contains_key("200"), "{method} {path} has no 200 reply");
            assert!(replies.contains_key("4XX") && replies.contains_key("5XX"), "{method} {path}: no error replies");
            if *method == "post" {
                assert!(op["requestBody"]["content"].is_object(), "{method} {path} has no request body schema");
            }
        }
        // The chat body: the shared sampling fields (serde's `flatten`) and its own, `messages` required.
        let chat = &json["components"]["schemas"]["ChatRequest"]["allOf"];
        assert_eq!(chat[0]["$ref"], "#/components/schemas/Common", "{chat}");
        assert!(chat[1]["required"].as_array().unwrap().iter().any(|f| f == "messages"), "{chat}");
        assert!(chat[1]["properties"]["tools"]["items"]["$ref"] == "#/components/schemas/Tool", "{chat}");
    }
}
