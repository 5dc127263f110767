//! Tool calling on a real checkpoint whose chat template teaches the Hermes format
//! (Qwen2.5-Coder-0.5B-Instruct, GGUF): the tools reach the prompt, `required` and a named
//! function always yield calls whose arguments follow the schema, the streamed chunks add up to
//! the whole output, a request with tools is bit-identical alone and in a batch, and bad tool
//! input is refused at submit.

#[path = "../../lmplex-model/tests/common.rs"]
mod model_common;

use lmplex_core::{Error, FinishReason, ModelConfig, SamplingParams, ToolCall, ToolCallParser, ToolChoice, Tools};
use lmplex_engine::{ChatMessage, Engine, Prompt, Request};
use serde_json::{json, Value};

fn engine() -> Option<Engine> {
    let path = model_common::qwen05_gguf()?;
    let mut cfg = ModelConfig::new(path.to_string_lossy());
    cfg.max_model_len = Some(2048);
    cfg.max_model_concurrency = 8;
    Some(Engine::new(cfg).unwrap())
}

fn tools(choice: ToolChoice) -> Tools {
    let tools = serde_json::from_value(json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 40},
                "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}}},
        {"type": "function", "function": {"name": "get_time", "description": "Current time in a timezone",
            "parameters": {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 40}},
                "required": ["timezone"]}}},
    ]))
    .unwrap();
    Tools { tools, tool_choice: choice, parallel_tool_calls: true }
}

fn ask(messages: Vec<ChatMessage>, choice: ToolChoice) -> Request {
    let p = SamplingParams { max_tokens: 80, temperature: 0.0, ..Default::default() };
    Request { tools: Some(tools(choice)), ..Request::new(Prompt::Messages(messages), p) }
}

fn user(text: &str) -> Vec<ChatMessage> {
    vec![ChatMessage::new("user", text)]
}

fn args(c: &ToolCall) -> Value {
    serde_json::from_str(&c.function.arguments).unwrap_or_else(|e| panic!("arguments not JSON: {e}: {c:?}"))
}

#[test]
fn required_and_named_calls_follow_the_schema() {
    let Some(e) = engine() else { return };
    assert_eq!(e.tool_call_parser(), Some(ToolCallParser::Hermes));
    let outs = e
        .generate(&[
            ask(user("What is the weather like in Paris right now?"), ToolChoice::Required),
            ask(user("Tell me a joke."), ToolChoice::Function("get_time".into())),
        ])
        .unwrap();
    let (weather, time) = (&outs[0], &outs[1]);
    assert!(weather.prompt.contains("\"name\": \"get_weather\""), "tools are in the prompt: {}", weather.prompt);
    for o in &outs {
        assert_eq!(o.finish_reason, FinishReason::ToolCalls, "{o:?}");
        assert!(!o.tool_calls.is_empty() && o.text.is_empty(), "{o:?}");
        assert!(o.tool_calls.iter().all(|c| c.id.starts_with("call_") && c.kind == "function"));
    }
    let w = &weather.tool_calls[0];
    assert_eq!(w.function.name, "get_weather");
    let a = args(w);
    assert!(a["city"].as_str().is_some_and(|c| c.contains("Paris")), "{a}");
    assert!(["celsius", "fahrenheit"].contains(&a["unit"].as_str().unwrap()), "{a}");
    assert_eq!(time.tool_calls.len(), 1);
    assert_eq!(time.tool_calls[0].function.name, "get_time");
    assert!(args(&time.tool_calls[0])["timezone"].is_string());
}

#[test]
fn auto_streams_and_batches_like_the_whole_output() {
    let Some(e) = engine() else { return };
    let req = ask(user("What's the weather in Oslo, in celsius?"), ToolChoice::Auto);
    let alone = e.generate(std::slice::from_ref(&req)).unwrap().remove(0);
    if alone.tool_calls.is_empty() {
        assert_eq!(alone.finish_reason, FinishReason::Stop);
        assert!(!alone.text.is_empty());
    } else {
        assert_eq!(alone.finish_reason, FinishReason::ToolCalls);
        alone.tool_calls.iter().for_each(|c| assert!(args(c).is_object()));
    }
    // Alone vs among other requests: the same tokens.
    let mut batch = vec![req.clone()];
    batch.extend((0..3).map(|i| {
        Request::new(Prompt::Text(format!("Count to {i}:")), SamplingParams { max_tokens: 30, ..Default::default() })
    }));
    let together = e.generate(&batch).unwrap().remove(0);
    assert_eq!(alone.token_ids, together.token_ids);
    // Streamed: the chunks' text and calls add up to the whole.
    let mut h = e.stream(&req).unwrap();
    let (mut text, mut calls, mut finish) = (String::new(), Vec::new(), None);
    while let Some(c) = h.next_blocking() {
        let c = c.unwrap();
        text.push_str(&c.text);
        calls.extend(c.tool_calls);
        finish = c.finish_reason.or(finish);
    }
    assert_eq!(text, alone.text);
    let names =
        |v: &[ToolCall]| v.iter().map(|c| (c.function.name.clone(), c.function.arguments.clone())).collect::<Vec<_>>();
    assert_eq!(names(&calls), names(&alone.tool_calls));
    assert_eq!(finish, Some(alone.finish_reason));
}

#[test]
fn tool_results_round_trip_through_the_template() {
    let Some(e) = engine() else { return };
    let call = ToolCall::new("call_1", "get_weather", r#"{"city": "Paris", "unit": "celsius"}"#);
    let msgs = vec![
        ChatMessage::new("user", "Weather in Paris?"),
        ChatMessage { tool_calls: vec![call], ..ChatMessage::new("assistant", "") },
        ChatMessage { tool_call_id: Some("call_1".into()), ..ChatMessage::new("tool", "18 degrees, sunny") },
    ];
    let out = e.generate(&[ask(msgs, ToolChoice::Auto)]).unwrap().remove(0);
    assert!(
        out.prompt.contains(
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>"
        ),
        "{}",
        out.prompt
    );
    assert!(out.prompt.contains("<tool_response>\n18 degrees, sunny\n</tool_response>"), "{}", out.prompt);
}

#[test]
fn bad_tool_input_is_refused_at_submit() {
    let Some(e) = engine() else { return };
    let refused = |r: Request, what: &str| match e.submit(&r) {
        Err(Error::InvalidRequest(m)) => assert!(m.contains(what), "{what}: {m}"),
        other => panic!("{what}: expected InvalidRequest, got {:?}", other.map(|h| h.id())),
    };
    refused(ask(user("hi"), ToolChoice::Function("nope".into())), "tool_choice");
    let mut bad = ask(user("hi"), ToolChoice::Auto);
    bad.tools.as_mut().unwrap().tools[1].function.parameters = Some(json!({"type": "strnig"}));
    refused(bad, "tools[1].function.parameters");
    let orphan = vec![
        ChatMessage::new("user", "hi"),
        ChatMessage { tool_call_id: Some("x".into()), ..ChatMessage::new("tool", "1") },
    ];
    refused(ask(orphan, ToolChoice::Auto), "messages[1]");
    let mut text = ask(user("hi"), ToolChoice::Auto);
    text.prompt = Prompt::Text("hi".into());
    refused(text, "chat prompt");
    let mut both = ask(user("hi"), ToolChoice::Required);
    both.params.structured_outputs = Some(lmplex_core::StructuredOutput::JsonObject);
    refused(both, "cannot be combined");
}
