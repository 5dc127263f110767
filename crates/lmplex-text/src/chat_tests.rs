//! Tests of `chat.rs`.
use super::*;

#[test]
fn renders_chatml_with_python_methods() {
    let src = "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'].strip() + '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    let t = ChatTemplate::new(src.into(), String::new(), String::new()).unwrap();
    let msgs = [ChatMessage::new("user", " hi ")];
    assert_eq!(t.render(&msgs, &[], true).unwrap(), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
}

/// A turn with an image reaches the template as typed parts, in order; without one, as text.
#[test]
fn image_turns_render_as_typed_parts() {
    let src = "{% for m in messages %}{% if m.content is string %}[{{ m.content }}]{% else %}\
               {% for p in m.content %}{% if p.type == 'image' %}<image>{% else %}{{ p.text }}{% endif %}{% endfor %}\
               {% endif %};{% endfor %}";
    let t = ChatTemplate::new(src.into(), String::new(), String::new()).unwrap();
    let image = ContentPart::Image(std::sync::Arc::from(&b"png"[..]));
    let with =
        ChatMessage::with_parts("user", vec![ContentPart::Text("a ".into()), image, ContentPart::Text("b".into())]);
    assert_eq!((with.content.as_str(), with.images().count()), ("a b", 1));
    let without = ChatMessage::with_parts("user", vec![ContentPart::Text("only text".into())]);
    assert!(without.parts.is_empty());
    assert_eq!(t.render(&[with, without], &[], false).unwrap(), "a <image>b;[only text];");
}

#[test]
fn developer_reads_as_system_unless_the_template_knows_it() {
    let src = "{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}";
    let msgs = [ChatMessage::new("developer", "be brief"), ChatMessage::new("user", "hi")];
    let t = ChatTemplate::new(src.into(), String::new(), String::new()).unwrap();
    assert_eq!(t.render(&msgs, &[], false).unwrap(), "system:be brief;user:hi;");
    let knows = format!("{{# developer #}}{src}");
    let t = ChatTemplate::new(knows, String::new(), String::new()).unwrap();
    assert_eq!(t.render(&msgs, &[], false).unwrap(), "developer:be brief;user:hi;");
}

#[test]
fn kwargs_reach_the_template_but_never_replace_its_inputs() {
    // Qwen3's switch, as its template writes it.
    let src = "{{ messages[0].content }}|{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{{ add_generation_prompt }}";
    let t = ChatTemplate::new(src.into(), String::new(), String::new()).unwrap();
    let msgs = [ChatMessage::new("user", "hi")];
    let kwargs = |v: serde_json::Value| v.as_object().cloned().unwrap();
    assert_eq!(t.render(&msgs, &[], true).unwrap(), "hi|True");
    let off = kwargs(serde_json::json!({"enable_thinking": false}));
    assert_eq!(t.render_with(&msgs, &[], true, &off).unwrap(), "hi|<think>\n\n</think>\n\nTrue");
    let clash = kwargs(serde_json::json!({"add_generation_prompt": false, "messages": []}));
    assert_eq!(t.render_with(&msgs, &[], true, &clash).unwrap(), "hi|True");
}

#[test]
fn raise_exception_is_an_invalid_request() {
    let t = ChatTemplate::new("{{ raise_exception('roles must alternate') }}".into(), String::new(), String::new())
        .unwrap();
    let e = t.render(&[ChatMessage::new("user", "x")], &[], true).unwrap_err();
    assert!(matches!(e, Error::InvalidRequest(ref m) if m.contains("roles must alternate")), "{e}");
}

#[test]
fn tools_and_tool_calls_render_as_transformers_does() {
    let src = "{% if tools %}{% for t in tools %}{{ t | tojson }}\n{% endfor %}{% endif %}\
{% for m in messages %}{% for c in m.tool_calls %}{{ c.function.arguments | tojson }}|{{ c.function.arguments | tojson(indent=2) }}{% endfor %}\
{% if m.tool_call_id %}[{{ m.tool_call_id }}]{% endif %}{% endfor %}";
    let t = ChatTemplate::new(src.into(), String::new(), String::new()).unwrap();
    let tool: Tool = serde_json::from_value(serde_json::json!({"type": "function", "function": {
        "name": "f", "description": "<b>é</b>", "parameters": {"type": "object", "properties": {"z": {}, "a": {}}}}}))
    .unwrap();
    let call = ToolCall::new("call_1", "f", r#"{"z":1,"a":[1,2]}"#);
    let msgs = [
        ChatMessage { tool_calls: vec![call], ..ChatMessage::new("assistant", "") },
        ChatMessage { tool_call_id: Some("call_1".into()), ..ChatMessage::new("tool", "4") },
    ];
    let out = t.render(&msgs, &[tool], false).unwrap();
    let want = concat!(
        r#"{"type": "function", "function": {"name": "f", "description": "<b>é</b>", "parameters": {"type": "object", "properties": {"z": {}, "a": {}}}}}"#,
        "\n",
        r#"{"z": 1, "a": [1, 2]}|{"#,
        "\n  \"z\": 1,\n  \"a\": [\n    1,\n    2\n  ]\n}[call_1]"
    );
    assert_eq!(out, want);
}

#[test]
fn continuing_cuts_after_the_final_message() {
    let m = [ChatMessage::new("user", "Hi"), ChatMessage::new("assistant", " Sure, ")];
    let rendered = "<u>Hi</u><a>Sure,</a>\n";
    assert_eq!(continue_final_message(rendered, &m).unwrap(), "<u>Hi</u><a>Sure,");
    let e = continue_final_message("<u>Hi</u>", &m).unwrap_err().to_string();
    assert!(e.contains("does not write the final message"), "{e}");
    assert!(continue_final_message("x", &[]).is_err());
}

/// A folder's template: tokenizer_config.json's first, then `chat_template.jinja`, then a
/// processor's `chat_template.json`.
#[test]
fn folder_templates_are_found_where_transformers_keeps_them() {
    let dir = std::env::temp_dir().join(format!("lmplex-chat-template-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let none = serde_json::Value::Null;
    assert_eq!(folder_template(&none, &dir), None);
    std::fs::write(dir.join("chat_template.json"), r#"{"chat_template": "from json"}"#).unwrap();
    assert_eq!(folder_template(&none, &dir).as_deref(), Some("from json"));
    std::fs::write(dir.join("chat_template.jinja"), "from jinja").unwrap();
    assert_eq!(folder_template(&none, &dir).as_deref(), Some("from jinja"));
    let cfg = serde_json::json!({"chat_template": [{"name": "tool_use", "template": "t"}, {"name": "default", "template": "d"}]});
    assert_eq!(folder_template(&cfg, &dir).as_deref(), Some("d"));
    std::fs::remove_dir_all(&dir).unwrap();
}
