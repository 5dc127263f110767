//! Tests of `tool_grammar` on llguidance's one-byte-per-token vocabulary: what each grammar
//! accepts, byte by byte.

use super::*;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};

fn tools(choice: ToolChoice, parallel: bool) -> Tools {
    let t: Vec<Tool> = serde_json::from_value(json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}, "unit": {"$ref": "#/$defs/unit"}},
            "required": ["city"], "$defs": {"unit": {"enum": ["c", "f"]}}}}},
        {"type": "function", "function": {"name": "now"}},
    ]))
    .unwrap();
    Tools { tools: t, tool_choice: choice, parallel_tool_calls: parallel }
}

/// How many bytes of `text` the grammar accepts, and whether it may end there.
fn accepts(format: ToolCallParser, t: &Tools, text: &str) -> (usize, bool) {
    let env = toktrie::ApproximateTokEnv::single_byte_env();
    let mut f = ParserFactory::new_simple(&env).unwrap();
    f.quiet();
    let lark = grammar(format, t, &|_| None).unwrap().unwrap();
    let parser = f.create_parser(TopLevelGrammar::from_lark(lark.clone())).unwrap_or_else(|e| panic!("{e}\n{lark}"));
    let mut m = Matcher::new(Ok(parser));
    let ids: Vec<u32> = text.bytes().map(u32::from).collect();
    let n = m.validate_tokens(&ids).unwrap();
    if n == ids.len() {
        m.consume_tokens(&ids).unwrap();
        return (n, m.is_accepting().unwrap());
    }
    (n, false)
}

const CALL: &str =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>";

#[test]
fn hermes_required_is_only_calls() {
    let h = ToolCallParser::Hermes;
    let t = tools(ToolChoice::Required, true);
    assert_eq!(accepts(h, &t, CALL), (CALL.len(), true));
    let two = format!("{CALL}\n<tool_call>\n{{\"name\": \"now\", \"arguments\": {{}}}}\n</tool_call>");
    assert_eq!(accepts(h, &t, &two), (two.len(), true));
    assert_eq!(accepts(h, &t, "Sure").0, 0, "no text before a required call");
    let bad = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": 3";
    assert!(accepts(h, &t, bad).0 < bad.len(), "arguments follow the schema");
    let t1 = tools(ToolChoice::Required, false);
    assert!(accepts(h, &t1, &two).0 < two.len(), "one call without parallel_tool_calls");
}

#[test]
fn hermes_named_calls_that_function() {
    let t = tools(ToolChoice::Function("now".into()), true);
    assert!(accepts(ToolCallParser::Hermes, &t, CALL).0 < CALL.len());
    let now = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
    assert_eq!(accepts(ToolCallParser::Hermes, &t, now), (now.len(), true));
}

#[test]
fn hermes_auto_is_free_until_a_call_starts() {
    let h = ToolCallParser::Hermes;
    let t = tools(ToolChoice::Auto, true);
    let prose = "It is sunny in <b>Paris</b>.\n";
    assert_eq!(accepts(h, &t, prose), (prose.len(), true));
    let mixed = format!("Let me check.\n{CALL}");
    assert_eq!(accepts(h, &t, &mixed), (mixed.len(), true));
    let bad = "Let me check.\n<tool_call>\nweather please";
    let n = accepts(h, &t, bad).0;
    assert!(n < bad.len() && n >= "Let me check.\n<tool_call>\n".len(), "accepted {n} bytes");
}

#[test]
fn llama3_and_mistral_formats() {
    let t = tools(ToolChoice::Required, true);
    let l =
        "{\"name\": \"now\", \"parameters\": {}}; {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}";
    assert_eq!(accepts(ToolCallParser::Llama3Json, &t, l), (l.len(), true));
    let auto = tools(ToolChoice::Auto, true);
    assert_eq!(accepts(ToolCallParser::Llama3Json, &auto, "Hi {x}"), (6, true));
    assert!(accepts(ToolCallParser::Llama3Json, &auto, "{\"x\": 1}").0 < 8);
    let m = "[TOOL_CALLS][{\"name\": \"now\", \"arguments\": {}}, {\"name\": \"now\", \"arguments\": {}}]";
    assert_eq!(accepts(ToolCallParser::Mistral, &t, m), (m.len(), true));
    let m_auto = format!("Sure. {m}");
    assert_eq!(accepts(ToolCallParser::Mistral, &auto, &m_auto), (m_auto.len(), true));
}

#[test]
fn choice_none_has_no_grammar_and_defs_must_agree() {
    assert!(grammar(ToolCallParser::Hermes, &tools(ToolChoice::None, true), &|_| None).unwrap().is_none());
    let mut t = tools(ToolChoice::Auto, true);
    t.tools[1].function.parameters = Some(json!({"type": "object", "$defs": {"unit": {"enum": ["k"]}}}));
    let e = grammar(ToolCallParser::Hermes, &t, &|_| None).unwrap_err().to_string();
    assert!(e.contains("unit"), "{e}");
    assert_eq!(lit("<tool_call>", &|_| Some(7)), ("<[7]>".to_string(), true));
}
