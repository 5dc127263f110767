//! Structured output on a real checkpoint (SmolLM2-135M-Instruct, GGUF): every kind of
//! constraint yields output that satisfies it, greedy and sampled; a guided request is
//! bit-identical alone and in a batch with unguided ones; bad constraints are refused at submit.

mod common;
#[path = "../../lmplex-model/tests/common.rs"]
mod model_common;

use lmplex_core::{Error, FinishReason, ModelConfig, SamplingParams, StructuredOutput};
use lmplex_engine::{ChatMessage, Engine, Prompt, Request};

fn engine() -> Option<Engine> {
    let path = model_common::smollm2_gguf()?;
    let mut cfg = ModelConfig::new(path.to_string_lossy());
    cfg.max_model_len = Some(1024);
    cfg.max_model_concurrency = 16;
    Some(Engine::new(cfg).unwrap())
}

fn ask(text: &str, s: StructuredOutput, temperature: f32, seed: u64) -> Request {
    let msgs = vec![ChatMessage::new("user", text)];
    let p = SamplingParams {
        max_tokens: 96,
        temperature,
        seed: Some(seed),
        structured_outputs: Some(s),
        ..Default::default()
    };
    Request::new(Prompt::Messages(msgs), p)
}

const PERSON: &str = r#"{
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 20},
    "age": {"type": "integer", "minimum": 0, "maximum": 130},
    "city": {"enum": ["Paris", "Lima", "Oslo"]},
    "pets": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3}
  },
  "required": ["name", "age", "city", "pets"],
  "additionalProperties": false
}"#;

/// Checks a value against `PERSON` by hand (no schema library on the Rust side).
fn check_person(text: &str) {
    let v: serde_json::Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    let o = v.as_object().unwrap_or_else(|| panic!("not an object: {text}"));
    let mut keys: Vec<&str> = o.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["age", "city", "name", "pets"], "{text}");
    assert!(o["name"].as_str().is_some_and(|s| s.chars().count() <= 20), "{text}");
    assert!(o["age"].as_u64().is_some_and(|a| a <= 130), "{text}");
    assert!(["Paris", "Lima", "Oslo"].contains(&o["city"].as_str().unwrap_or("")), "{text}");
    let pets = o["pets"].as_array().unwrap_or_else(|| panic!("pets: {text}"));
    assert!(pets.len() <= 3 && pets.iter().all(|p| p.as_str().is_some_and(|s| s.chars().count() <= 10)), "{text}");
}

#[test]
fn every_constraint_is_satisfied_and_batching_changes_nothing() {
    let Some(engine) = engine() else { return };
    let mut reqs = Vec::new();
    for (i, t) in [0.0f32, 0.7, 1.0, 1.3].into_iter().enumerate() {
        let who = ["a baker", "a pilot", "a child", "a poet"][i];
        reqs.push(ask(&format!("Describe {who} as JSON."), StructuredOutput::JsonSchema(PERSON.into()), t, i as u64));
        reqs.push(ask(
            "Give me a phone number.",
            StructuredOutput::Regex(r"\(\d{3}\) \d{3}-\d{4}".into()),
            t,
            10 + i as u64,
        ));
        reqs.push(ask(
            "Is the sky green?",
            StructuredOutput::Choice(vec!["yes".into(), "no".into(), "maybe not".into()]),
            t,
            20 + i as u64,
        ));
        reqs.push(ask(
            "Add two small numbers.",
            StructuredOutput::Grammar("start: num \" + \" num \" = \" num\nnum: /[0-9]{1,2}/".into()),
            t,
            30 + i as u64,
        ));
        if t == 0.0 {
            // Sampled free-form JSON may well run past max_tokens (at 0.7, seed 41 does).
            reqs.push(ask("Any JSON object, please.", StructuredOutput::JsonObject, t, 40 + i as u64));
        }
    }
    // Unguided neighbours share the batch.
    for i in 0..4 {
        let p = SamplingParams { max_tokens: 40, temperature: 0.9, seed: Some(i), ..Default::default() };
        reqs.push(Request::new(Prompt::Text(format!("Story {i}: once upon a time")), p));
    }
    let alone: Vec<_> = reqs.iter().map(|r| common::solo(&engine, r)).collect();
    let phone = |s: &str| {
        let b = s.as_bytes();
        b.len() == 14
            && b[0] == b'('
            && b[4..6] == *b") "
            && b[9] == b'-'
            && [1, 2, 3, 6, 7, 8, 10, 11, 12, 13].iter().all(|&i| b[i].is_ascii_digit())
    };
    for (r, o) in reqs.iter().zip(&alone) {
        let Some(s) = &r.params.structured_outputs else { continue };
        assert_eq!(o.finish_reason, FinishReason::Stop, "{s:?} ran out of tokens: {:?}", o.text);
        match s {
            StructuredOutput::JsonSchema(_) => check_person(&o.text),
            StructuredOutput::Regex(_) => assert!(phone(&o.text), "{:?}", o.text),
            StructuredOutput::Choice(c) => assert!(c.contains(&o.text), "{:?}", o.text),
            StructuredOutput::Grammar(_) => {
                let parts: Vec<&str> = o.text.split([' ', '+', '=']).filter(|p| !p.is_empty()).collect();
                assert_eq!(parts.len(), 3, "{:?}", o.text);
                assert!(parts.iter().all(|p| p.len() <= 2 && p.bytes().all(|b| b.is_ascii_digit())), "{:?}", o.text);
            }
            StructuredOutput::JsonObject => {
                let v: serde_json::Value =
                    serde_json::from_str(&o.text).unwrap_or_else(|e| panic!("{e}: {:?}", o.text));
                assert!(v.is_object(), "{:?}", o.text);
            }
        }
    }
    let together = engine.generate(&reqs).unwrap();
    for (i, (a, b)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(a.token_ids, b.token_ids, "request {i} differs in the batch");
    }
    common::wait_until_idle(&engine);
}

#[test]
fn bad_constraints_are_refused_before_queueing() {
    let Some(engine) = engine() else { return };
    for (s, needle) in [
        (StructuredOutput::JsonSchema("{not json".into()), "not JSON"),
        (StructuredOutput::JsonSchema(r#"{"type": "frobnicate"}"#.into()), "json"),
        (StructuredOutput::Regex("(unclosed".into()), "regex"),
        (StructuredOutput::Grammar("start: undefined_rule".into()), "grammar"),
        (StructuredOutput::Choice(vec![]), "choice"),
    ] {
        match engine.submit(&ask("hi", s.clone(), 0.0, 0)) {
            Err(Error::InvalidRequest(m)) => assert!(m.contains(needle), "{s:?}: {m}"),
            Err(e) => panic!("{s:?}: wrong error {e:?}"),
            Ok(_) => panic!("{s:?} was accepted"),
        }
    }
    // The engine still serves.
    let ok = engine.generate(&[ask("Yes or no?", StructuredOutput::Choice(vec!["yes".into(), "no".into()]), 0.0, 0)]);
    assert!(["yes", "no"].contains(&ok.unwrap()[0].text.as_str()));
}
