//! Server config parsing and OpenAI body checks, without a model: typos and duplicates are
//! refused, and unsupported or bad fields get a 400 that names them.

use lmplex_core::StructuredOutput;
use lmplex_server::api::{self, ChatRequest, CompletionRequest};
use lmplex_server::ServerConfig;

#[test]
fn config_fills_defaults_and_refuses_typos_and_duplicates() {
    let c = ServerConfig::from_toml(
        "port = 0\n[[models]]\nmodel_id = \"/m/a.gguf\"\nmax_model_len = 512\npreemption_mode = \"swap\"\n\
         kv_cache_dtype = \"float32\"\n[[models]]\nmodel_id = \"/m/b\"\nname = \"b\"\n",
    )
    .unwrap();
    assert_eq!((c.host.as_str(), c.port), ("127.0.0.1", 0));
    assert_eq!(c.models[0].served_name(), "/m/a.gguf");
    let m = &c.models[0];
    assert_eq!(m.max_model_len, Some(512));
    assert_eq!(m.preemption_mode, lmplex_core::PreemptionMode::Swap);
    assert_eq!(m.kv_cache_dtype, lmplex_core::KvCacheDtype::F32);
    assert_eq!(c.models[1].kv_cache_dtype, lmplex_core::KvCacheDtype::Auto);
    let err = ServerConfig::from_toml("[[models]]\nmodel_id = \"x\"\nkv_cache_dtype = \"fp8\"\n").unwrap_err();
    assert!(err.to_string().contains("kv_cache_dtype"), "{err}");
    let typo = ServerConfig::from_toml("[[models]]\nmodel_id = \"x\"\nmax_model_lenn = 5\n").unwrap_err();
    assert!(typo.to_string().contains("unknown field `max_model_lenn`"), "{typo}");
    assert!(typo.to_string().contains("line 3"), "the error names the line: {typo}");
    assert_eq!(c.models[1].served_name(), "b", "`name` is read as served_model_name");
    let dup = ServerConfig::from_toml("[[models]]\nmodel_id = \"x\"\n[[models]]\nmodel_id = \"x\"\n").unwrap_err();
    assert!(dup.to_string().contains("two models are named 'x'"), "{dup}");
    let bad = ServerConfig::from_toml("[[models]]\nmodel_id = \"x\"\nscheduling_policy = \"lottery\"\n").unwrap_err();
    assert!(bad.to_string().contains("scheduling_policy"), "{bad}");
    assert!(ServerConfig::from_toml("models = []\n").is_err());
    let keep = ServerConfig::from_toml("[[models]]\nmodel_id = \"x\"\nkeep_alive_s = 2.5\n").unwrap();
    assert_eq!(keep.models[0].keep_alive(), Some(std::time::Duration::from_millis(2500)));
    assert_eq!(c.models[0].keep_alive(), None);
    let neg = ServerConfig::from_toml("[[models]]\nmodel_id = \"x\"\nkeep_alive_s = -1\n").unwrap_err();
    assert!(neg.to_string().contains("keep_alive_s"), "{neg}");
}

#[test]
fn client_limits_default_and_must_be_positive() {
    let model = "[[models]]\nmodel_id = \"x\"\n";
    let l = ServerConfig::from_toml(model).unwrap().limits().unwrap();
    assert_eq!((l.max_request_body_bytes, l.max_connections), (32 << 20, 1024));
    assert_eq!(l.request_read_timeout, std::time::Duration::from_secs(30));
    let set = "max_request_body_bytes = 100\nrequest_read_timeout_s = 0.5\nmax_connections = 7\n";
    let l = ServerConfig::from_toml(&format!("{set}{model}")).unwrap().limits().unwrap();
    assert_eq!((l.max_request_body_bytes, l.max_connections), (100, 7));
    assert_eq!(l.request_read_timeout, std::time::Duration::from_millis(500));
    for bad in ["max_request_body_bytes = 0", "max_connections = 0", "request_read_timeout_s = -1.0"] {
        let e = ServerConfig::from_toml(&format!("{bad}\n{model}")).unwrap_err().to_string();
        assert!(e.contains(bad.split(' ').next().unwrap()), "{e}");
    }
}

fn completion(body: &str) -> Result<lmplex_core::SamplingParams, String> {
    let r: CompletionRequest = api::parse(body.as_bytes()).map_err(|e| e.message)?;
    r.common.n().map_err(|e| e.message)?;
    r.prompts().map_err(|e| e.message)?;
    r.sampling().map_err(|e| e.message)
}

#[test]
fn completion_bodies_map_to_sampling_params_or_clear_400s() {
    let p = completion(r#"{"model":"m","prompt":"a","temperature":0,"stop":"x","logprobs":2,"seed":3}"#).unwrap();
    assert_eq!((p.max_tokens, p.temperature, p.logprobs, p.seed), (16, 0.0, Some(2), Some(3)));
    assert_eq!(p.stop, vec!["x".to_string()]);
    // `echo` with `max_tokens: 0` scores the prompt: its logprobs, no output token.
    let p = completion(r#"{"prompt":"a","echo":true,"max_tokens":0,"logprobs":1}"#).unwrap();
    assert_eq!((p.max_tokens, p.logprobs, p.prompt_logprobs), (0, Some(1), Some(1)));
    let p = completion(r#"{"prompt":"a","echo":true,"prompt_logprobs":3}"#).unwrap();
    assert_eq!((p.max_tokens, p.logprobs, p.prompt_logprobs), (16, None, Some(3)));
    // `best_of` ranks samples by logprob, so the engine computes them.
    let p = completion(r#"{"prompt":"a","best_of":3}"#).unwrap();
    assert_eq!(p.logprobs, Some(0));
    for (body, needle) in [
        (r#"{"model":"m","prompt":"a","n":0}"#, "n must be between 1 and 128"),
        (r#"{"model":"m","prompt":"a","best_of":0}"#, "best_of must be between n (1) and 128"),
        (r#"{"model":"m","prompt":"a","n":2,"best_of":3,"stream":true}"#, "cannot be streamed"),
        (r#"{"model":"m","prompt":[1,2],"suffix":"x"}"#, "suffix needs a text prompt"),
        (r#"{"model":"m","prompt":"a","max_tokens":0}"#, "at least 1"),
        (r#"{"model":"m","prompt":"a","logprobs":99}"#, "logprobs"),
        (r#"{"model":"m","prompt":"a","temperature":-1}"#, "temperature"),
        (r#"{"model":"m"}"#, "prompt"),
        (r#"{"model":"m","prompt":"a""#, "not valid JSON"),
    ] {
        let e = completion(body).unwrap_err();
        assert!(e.contains(needle), "{body}: {e}");
    }
}

#[test]
fn chat_bodies_take_text_parts() {
    let r: ChatRequest = api::parse(
        br#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi "},{"type":"text","text":"there"}]}],
            "logprobs":true,"top_logprobs":3,"max_completion_tokens":7}"#,
    )
    .unwrap();
    assert_eq!(r.messages().unwrap()[0].content, "hi there");
    let p = r.sampling(100).unwrap();
    assert_eq!((p.max_tokens, p.logprobs), (7, Some(3)));
    let r: ChatRequest = api::parse(br#"{"model":"m","messages":[]}"#).unwrap();
    assert!(r.messages().is_err());
}

fn chat_constraint(extra: &str) -> Result<Option<StructuredOutput>, String> {
    let body = format!(r#"{{"model":"m","messages":[{{"role":"user","content":"x"}}]{extra}}}"#);
    let r: ChatRequest = api::parse(body.as_bytes()).map_err(|e| e.message)?;
    r.sampling(100).map(|p| p.structured_outputs).map_err(|e| e.message)
}

#[test]
fn every_way_of_asking_for_structured_output_maps_to_one_constraint() {
    use StructuredOutput::*;
    let schema = r#"{"type":"object","properties":{"a":{"type":"integer"}}}"#;
    let cases: Vec<(String, StructuredOutput)> = vec![
        (r#","response_format":{"type":"json_object"}"#.into(), JsonObject),
        (
            format!(
                r#","response_format":{{"type":"json_schema","json_schema":{{"name":"x","schema":{schema},"strict":true}}}}"#
            ),
            JsonSchema(schema.into()),
        ),
        (format!(r#","structured_outputs":{{"json":{schema}}}"#), JsonSchema(schema.into())),
        (r#","structured_outputs":{"regex":"[a-z]+"}"#.into(), Regex("[a-z]+".into())),
        (r#","structured_outputs":{"json_object":true}"#.into(), JsonObject),
        (r#","guided_choice":["yes","no"]"#.into(), Choice(vec!["yes".into(), "no".into()])),
        (r#","guided_grammar":"start: \"a\"""#.into(), Grammar("start: \"a\"".into())),
        (format!(r#","guided_json":{}"#, serde_json::Value::from(schema)), JsonSchema(schema.into())),
    ];
    for (extra, want) in cases {
        assert_eq!(chat_constraint(&extra).unwrap(), Some(want), "{extra}");
    }
    assert_eq!(chat_constraint(r#","response_format":{"type":"text"}"#).unwrap(), None);
    for (extra, needle) in [
        (r#","response_format":{"type":"json_schema"}"#, "json_schema.schema"),
        (r#","response_format":{"type":"xml"}"#, "text, json_object or json_schema"),
        (r#","structured_outputs":{}"#, "names no constraint"),
        (r#","structured_outputs":{"yaml":"x"}"#, "yaml"),
        (r#","guided_regex":"a","guided_choice":["b"]"#, "only one output constraint"),
        (r#","guided_choice":[]"#, "choice"),
    ] {
        let e = chat_constraint(extra).unwrap_err();
        assert!(e.contains(needle), "{extra}: {e}");
    }
}

#[test]
fn tiers_and_tenant_routes_are_read_and_checked_at_start() {
    let models = "[[models]]\nmodel_id = \"/m/a\"\nname = \"a\"\n[[models]]\nmodel_id = \"/m/b\"\nname = \"b\"\n";
    let tenant = "[[tenants]]\nname = \"t\"\nroute = { mode = \"deep\", max_cost = 0.01 }\n";
    let c =
        ServerConfig::from_toml(&format!("{models}{tenant}[tiers]\nfast = [\"a\"]\ndeep = [\"b\", \"a\"]\n")).unwrap();
    assert_eq!((c.tiers.fast.clone(), c.tiers.deep.clone()), (vec!["a".to_string()], vec!["b".into(), "a".into()]));
    let route = c.tenants[0].route.unwrap();
    assert_eq!((route.mode, route.max_cost), (Some(lmplex_core::Mode::Deep), Some(0.01)));
    for (extra, needle) in [
        ("[tiers]\nmax = [\"c\"]\n", "tiers.max: 'c' is not a served model"),
        ("[tiers]\nslow = [\"a\"]\n", "unknown field `slow`"),
        ("[tiers]\nfast = [\"a\", \"a\"]\n", "tiers.fast: 'a' is listed twice"),
        ("[[tenants]]\nname = \"u\"\nroute = { max_latency_ms = -1 }\n", "route: max_latency_ms must be a number >= 0"),
        ("[[tenants]]\nname = \"u\"\nroute = { mode = \"cheap\" }\n", "unknown variant `cheap`"),
    ] {
        let e = ServerConfig::from_toml(&format!("{models}{extra}")).unwrap_err().to_string();
        assert!(e.contains(needle), "{extra}: {e}");
    }
}

#[test]
fn cors_is_off_by_default_and_bad_values_are_named() {
    let models = "[[models]]\nmodel_id = \"/m/a\"\n";
    assert!(ServerConfig::from_toml(models).unwrap().cors().unwrap().is_none());
    let on = format!("allowed_origins = [\"https://a.example\"]\nallowed_methods = [\"GET\"]\n{models}");
    assert!(ServerConfig::from_toml(&on).unwrap().cors().unwrap().is_some());
    let bad = format!("allowed_origins = [\"*\"]\nallowed_headers = [\"bad header\"]\n{models}");
    let e = ServerConfig::from_toml(&bad).unwrap_err().to_string();
    assert!(e.contains("allowed_headers 'bad header' is not valid"), "{e}");
}

#[test]
fn a_wrong_type_names_its_field() {
    for (body, param) in [
        (r#"{"model":"m","prompt":"a","seed":1e30}"#, "seed"),
        (r#"{"model":"m","prompt":"a","logit_bias":{"5":"x"}}"#, "logit_bias"),
        (r#"{"model":"m","prompt":"a","max_tokens":"many"}"#, "max_tokens"),
        (r#"{"model":"m","prompt":"a","echo":3}"#, "echo"),
    ] {
        let e = api::parse::<CompletionRequest>(body.as_bytes()).unwrap_err();
        assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
        assert!(e.message.contains(param), "{body}: {}", e.message);
    }
}

#[test]
fn media_hosts_default_to_none_and_bad_entries_are_named() {
    let model = "[[models]]\nmodel_id = \"x\"\n";
    let off = ServerConfig::from_toml(model).unwrap().media_policy().unwrap();
    assert!(off.is_off());
    assert_eq!(off.timeout, std::time::Duration::from_secs(5));
    assert_eq!((off.max_bytes, off.max_concurrent), (32 << 20, 16));
    let set = "allowed_media_domains = [\"Images.Example.com\"]\nmedia_fetch_timeout_s = 2\nmax_concurrent_media_fetches = 3\n";
    let on = ServerConfig::from_toml(&format!("{set}{model}")).unwrap().media_policy().unwrap();
    assert!(!on.is_off());
    assert_eq!((on.timeout, on.max_concurrent), (std::time::Duration::from_secs(2), 3));
    for (bad, want) in [
        ("allowed_media_domains = [\"https://a.example\"]", "'https://a.example' is not a host name"),
        ("allowed_media_domains = [\"*.example.com\"]", "wildcard"),
        ("media_fetch_timeout_s = 0", "media_fetch_timeout_s must be positive"),
        ("max_concurrent_media_fetches = 0", "max_concurrent_media_fetches must be at least 1"),
    ] {
        let e = ServerConfig::from_toml(&format!("{bad}\n{model}")).unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
    }
}
