//! Tests of `tool_parser`: each format whole and split at every byte.

use super::*;

/// Content and calls (name, arguments) of `text` pushed in pieces of `step` bytes (0: whole).
fn parse(format: ToolCallParser, text: &str, step: usize) -> (String, Vec<(String, String)>) {
    let mut p = ToolStream::new(format);
    let mut all = Parsed::default();
    let mut add = |o: Parsed| {
        all.content.push_str(&o.content);
        all.calls.extend(o.calls);
    };
    if step == 0 {
        add(p.push(text));
    } else {
        let mut i = 0;
        while i < text.len() {
            let mut j = (i + step).min(text.len());
            while !text.is_char_boundary(j) {
                j += 1;
            }
            add(p.push(&text[i..j]));
            i = j;
        }
    }
    add(p.finish());
    assert_eq!(p.num_calls(), all.calls.len());
    (all.content, all.calls.into_iter().map(|c| (c.function.name, c.function.arguments)).collect())
}

fn check(format: ToolCallParser, text: &str, content: &str, calls: &[(&str, &str)]) {
    let want: Vec<(String, String)> = calls.iter().map(|(n, a)| (n.to_string(), a.to_string())).collect();
    for step in [0, 1, 2, 3, 7] {
        let got = parse(format, text, step);
        assert_eq!(got, (content.to_string(), want.clone()), "format {format}, step {step}, text {text:?}");
    }
}

#[test]
fn hermes_calls_with_text_around() {
    let h = ToolCallParser::Hermes;
    check(h, "Hello <b>world</b>", "Hello <b>world</b>", &[]);
    check(h, "plain\n\n", "plain\n\n", &[]);
    check(
        h,
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
        "",
        &[("get_weather", r#"{"city": "Paris"}"#)],
    );
    check(
        h,
        "Let me look. \n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": \"{\\\"x\\\": 1}\"}\n</tool_call>\n",
        "Let me look.",
        &[("a", "{}"), ("b", r#"{"x": 1}"#)],
    );
    // Not a call: given back unchanged.
    check(h, "<tool_call>\nnot json\n</tool_call> ok", "<tool_call>\nnot json\n</tool_call> ok", &[]);
    // Cut off before the closing tag: a complete object still counts, a broken one is content.
    check(h, "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"q\": 2}}", "", &[("a", r#"{"q": 2}"#)]);
    check(h, "<tool_call>\n{\"name\": \"a\", \"argu", "<tool_call>\n{\"name\": \"a\", \"argu", &[]);
}

#[test]
fn llama3_json_whole_reply() {
    let l = ToolCallParser::Llama3Json;
    check(l, "The answer is {x}.", "The answer is {x}.", &[]);
    check(l, " {\"name\": \"f\", \"parameters\": {\"a\": 1}}", "", &[("f", r#"{"a": 1}"#)]);
    check(
        l,
        "<|python_tag|>{\"name\": \"f\", \"parameters\": {}}; {\"name\": \"g\", \"arguments\": {\"b\": [1]}}",
        "",
        &[("f", "{}"), ("g", r#"{"b": [1]}"#)],
    );
    check(l, "{\"nom\": 1}", "{\"nom\": 1}", &[]);
}

#[test]
fn mistral_both_versions() {
    let m = ToolCallParser::Mistral;
    check(
        m,
        "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": 1}}, {\"name\": \"g\", \"arguments\": {}}]",
        "",
        &[("f", r#"{"a": 1}"#), ("g", "{}")],
    );
    // The trigger skipped as a special token.
    check(m, "[{\"name\": \"f\", \"arguments\": {}}]", "", &[("f", "{}")]);
    check(m, "Sure. [TOOL_CALLS]f[ARGS]{\"a\": 1}[TOOL_CALLS]g[ARGS]{}", "Sure.", &[("f", r#"{"a": 1}"#), ("g", "{}")]);
    check(m, "[1, 2] is a list", "[1, 2] is a list", &[]);
    check(m, "[TOOL_CALLS]oops", "[TOOL_CALLS]oops", &[]);
}

#[test]
fn ids_are_unique_and_shaped() {
    let mut p = ToolStream::new(ToolCallParser::Hermes);
    let call = "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>";
    let ids: Vec<String> = p.push(&call.repeat(3)).calls.into_iter().map(|c| c.id).collect();
    assert_eq!(ids.len(), 3);
    assert!(ids.iter().all(|i| i.len() == 29 && i.starts_with("call_")), "{ids:?}");
    assert!(ids[0] != ids[1] && ids[1] != ids[2]);
    let mut m = ToolStream::new(ToolCallParser::Mistral);
    m.push("[TOOL_CALLS]f[ARGS]{}");
    let id = m.finish().calls.pop().unwrap().id;
    assert!(id.len() == 9 && id.chars().all(|c| c.is_ascii_alphanumeric()), "{id}");
}

#[test]
fn detects_formats_from_templates() {
    assert_eq!(detect("{{ '<tool_call>' }}"), Some(ToolCallParser::Hermes));
    assert_eq!(detect("[TOOL_CALLS] {{ x }}"), Some(ToolCallParser::Mistral));
    assert_eq!(detect("<|start_header_id|>{% if tools %}"), Some(ToolCallParser::Llama3Json));
    assert_eq!(detect("<|im_start|>"), None);
}
