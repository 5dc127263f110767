//! The llguidance grammar (Lark with inline `%json`) that holds a model's tool calls to the
//! tools' JSON schemas, in the format its chat template teaches (see `tool_parser`).
//!
//! - `required`: the reply is one call, or several when `parallel_tool_calls`.
//! - a named function: the reply is one call of it.
//! - `auto`: free text, until the format's trigger (`<tool_call>`, `[TOOL_CALLS]`, or a reply
//!   that opens with `{` for Llama 3): from there on only calls follow.
//!
//! Invariants: each call is `{"name": <const>, "arguments" | "parameters": <the tool's
//! schema>}` with no other keys, written as Python's `json.dumps` does (`", "`, `": "`), the
//! form the templates show the model; `$defs` of each schema move to the root so `#/$defs/...`
//! references still resolve; a trigger that is a special token is matched as that token.

use lmplex_core::{Error, Result, TokenId, Tool, ToolCallParser, ToolChoice, Tools};
use serde_json::{json, Map, Value};

/// The call object's schema for one tool, with its `$defs` moved into `defs`.
fn call_schema(format: ToolCallParser, tool: &Tool, defs: &mut Map<String, Value>) -> Result<Value> {
    let mut params = tool
        .function
        .parameters
        .clone()
        .unwrap_or_else(|| json!({"type": "object", "properties": {}, "additionalProperties": false}));
    if let Some(obj) = params.as_object_mut() {
        for key in ["$defs", "definitions"] {
            if let Some(Value::Object(d)) = obj.remove(key) {
                for (k, v) in d {
                    if defs.get(&k).is_some_and(|old| old != &v) {
                        return Err(Error::invalid(format!(
                            "tools: two functions define ${key} `{k}` differently; rename one of them"
                        )));
                    }
                    defs.insert(k, v);
                }
            }
        }
    }
    let args = if format == ToolCallParser::Llama3Json { "parameters" } else { "arguments" };
    Ok(json!({
        "type": "object",
        "properties": {"name": {"const": tool.function.name}, args: params},
        "required": ["name", args],
        "additionalProperties": false,
    }))
}

/// The `%json {...}` of one call of any of `tools`.
fn calls_json(format: ToolCallParser, tools: &[&Tool]) -> Result<String> {
    let mut defs = Map::new();
    let calls = tools.iter().map(|t| call_schema(format, t, &mut defs)).collect::<Result<Vec<_>>>()?;
    let mut schema = match <[Value; 1]>::try_from(calls) {
        Ok([one]) => one,
        Err(all) => json!({"anyOf": all}),
    };
    if !defs.is_empty() {
        schema["$defs"] = Value::Object(defs);
    }
    schema["x-guidance"] = json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "});
    Ok(format!("%json {schema}"))
}

/// A literal or special token in Lark: `<[id]>` for a special token, else a quoted string.
fn lit(text: &str, special: &dyn Fn(&str) -> Option<TokenId>) -> (String, bool) {
    match special(text) {
        Some(id) => (format!("<[{id}]>"), true),
        None => (Value::from(text).to_string(), false),
    }
}

/// The grammar for `tools` in `format`, or `None` when the choice is `none`; `special` gives
/// the id of a text that is one special token of the model's vocabulary.
pub fn grammar(
    format: ToolCallParser,
    tools: &Tools,
    special: &dyn Fn(&str) -> Option<TokenId>,
) -> Result<Option<String>> {
    let callable = tools.callable();
    if callable.is_empty() {
        return Ok(None);
    }
    let forced = tools.tool_choice != ToolChoice::Auto;
    // Several calls: `required` or `auto` with parallel calls (a named function is called once).
    let more = tools.parallel_tool_calls && matches!(tools.tool_choice, ToolChoice::Required | ToolChoice::Auto);
    let args = calls_json(format, &callable)?;
    let mut g = String::from("%llguidance {}\nTEXT: /(.|\\n)*/\n");
    g += &format!("args: {args}\n");
    match format {
        ToolCallParser::Hermes | ToolCallParser::Mistral => {
            let hermes = format == ToolCallParser::Hermes;
            let (open, open_special) = lit(if hermes { "<tool_call>" } else { "[TOOL_CALLS]" }, special);
            let calls = if hermes {
                let one = format!("\"\\n\" args \"\\n\" {}", lit("</tool_call>", special).0);
                if more {
                    format!("{one} (\"\\n\" {open} {one})*")
                } else {
                    one
                }
            } else {
                format!("\"[\" {} \"]\"", if more { "args (\", \" args)*" } else { "args" })
            };
            g += &if forced {
                format!("start: {open} {calls}\n")
            } else if open_special {
                // Text cannot hold a special token, so it ends where the trigger comes.
                format!("start: TEXT | TEXT {open} {calls}\n")
            } else {
                format!("start: TEXT | call_hd {calls}\ncall_hd[lazy]: TEXT {open}\n")
            };
        }
        ToolCallParser::Llama3Json => {
            let more = if more { " (\"; \" args)*" } else { "" };
            g += &if forced {
                format!("start: args{more}\n")
            } else {
                format!("start: PROSE | args{more}\nPROSE: /([^{{](.|\\n)*)?/\n")
            };
        }
    }
    Ok(Some(g))
}

#[cfg(test)]
#[path = "tool_grammar_tests.rs"]
mod tests;
