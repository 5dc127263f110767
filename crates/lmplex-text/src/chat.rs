//! Chat templates: the Jinja template shipped with a checkpoint, rendered with minijinja plus
//! its Python-compatibility methods (`.strip()`, `.startswith()`, ...), as transformers does
//! (`trim_blocks`, `lstrip_blocks`, `raise_exception`, `strftime_now`).
//!
//! Tools reach the template as transformers passes them (`tools`: OpenAI's tool objects), and
//! an assistant turn's `tool_calls` carry their `arguments` as a JSON object, as HF templates
//! expect; `tojson` writes JSON as Python's `json.dumps` does (`", "` and `": "`, key order
//! kept, no HTML escaping, `indent=`), so a prompt renders as it does in transformers.
//!
//! Invariant: a template is compiled once at load; a template error at render time is an
//! `InvalidRequest` naming the template's message.

use lmplex_core::{Error, Result, Tool, ToolCall};
use minijinja::value::Kwargs;
use minijinja::{Environment, ErrorKind, Value};
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;

/// Gemma's chat template (as Google ships it with Gemma 2 and 3, text parts only), for Gemma
/// GGUF files that carry none: a system message is folded into the first user turn, the
/// assistant's role is `model`, and turns end with `<end_of_turn>`.
pub const GEMMA_CHAT_TEMPLATE: &str = r#"{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"#;

/// One chat turn, as the template sees it (`message['role']`, `message['content']`, and for
/// tool use `message['tool_calls']`, `message['tool_call_id']`, `message['name']`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool`, ... (whatever the template accepts).
    pub role: String,
    /// The turn's text.
    pub content: String,
    /// An assistant turn's tool calls.
    pub tool_calls: Vec<ToolCall>,
    /// A `tool` turn: the call it answers.
    pub tool_call_id: Option<String>,
    /// A `tool` turn: the function's name (some templates show it).
    pub name: Option<String>,
    /// The content as parts, in order, when it holds an image (`with_parts`); empty when
    /// `content` is the whole turn.
    pub parts: Vec<ContentPart>,
}

/// One part of a turn's content, in order: what a vision-language model's template sees as
/// `{"type": "text", "text": ...}` or `{"type": "image"}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContentPart {
    /// Text.
    Text(String),
    /// An image, as its file's bytes (PNG, JPEG, WebP or GIF), decoded by the model's processor.
    Image(std::sync::Arc<[u8]>),
}

impl ChatMessage {
    /// A turn with `role` and `content` and no tool fields.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self { role: role.into(), content: content.into(), ..Self::default() }
    }

    /// A turn of content parts; `content` is their text joined. Without an image, the text alone.
    pub fn with_parts(role: impl Into<String>, parts: Vec<ContentPart>) -> Self {
        let text: String =
            parts.iter().filter_map(|p| if let ContentPart::Text(t) = p { Some(&**t) } else { None }).collect();
        let has_image = parts.iter().any(|p| matches!(p, ContentPart::Image(_)));
        Self { parts: if has_image { parts } else { Vec::new() }, ..Self::new(role, text) }
    }

    /// The turn's images, in order.
    pub fn images(&self) -> impl Iterator<Item = &std::sync::Arc<[u8]>> {
        self.parts.iter().filter_map(|p| if let ContentPart::Image(b) = p { Some(b) } else { None })
    }
}

impl Serialize for ChatMessage {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("role", &self.role)?;
        if self.parts.is_empty() {
            m.serialize_entry("content", &self.content)?;
        } else {
            let parts: Vec<serde_json::Value> = self
                .parts
                .iter()
                .map(|p| match p {
                    ContentPart::Text(t) => serde_json::json!({"type": "text", "text": t}),
                    ContentPart::Image(_) => serde_json::json!({"type": "image"}),
                })
                .collect();
            m.serialize_entry("content", &parts)?;
        }
        if !self.tool_calls.is_empty() {
            let calls: Vec<serde_json::Value> = self
                .tool_calls
                .iter()
                .map(|c| {
                    // Templates write `arguments | tojson`: they want the object, not its text.
                    let args = serde_json::from_str::<serde_json::Value>(&c.function.arguments)
                        .unwrap_or_else(|_| c.function.arguments.clone().into());
                    serde_json::json!({
                        "id": c.id, "type": "function",
                        "function": {"name": c.function.name, "arguments": args},
                    })
                })
                .collect();
            m.serialize_entry("tool_calls", &calls)?;
        }
        if let Some(id) = &self.tool_call_id {
            m.serialize_entry("tool_call_id", id)?;
        }
        if let Some(n) = &self.name {
            m.serialize_entry("name", n)?;
        }
        m.end()
    }
}

/// A Hugging Face folder's chat template: `tokenizer_config.json`'s `chat_template` (`cfg`; of a
/// list of named templates, "default"), else transformers' own files in `dir`:
/// `chat_template.jinja`, or a processor's `chat_template.json` (`{"chat_template": ...}`), which
/// vision-language folders ship.
pub fn folder_template(cfg: &serde_json::Value, dir: &std::path::Path) -> Option<String> {
    match cfg.get("chat_template") {
        Some(serde_json::Value::String(s)) => Some(s.clone()),
        Some(serde_json::Value::Array(list)) => {
            list.iter().find(|t| t["name"] == "default").and_then(|t| t["template"].as_str()).map(str::to_string)
        }
        _ => std::fs::read_to_string(dir.join("chat_template.jinja")).ok().or_else(|| {
            let json = std::fs::read_to_string(dir.join("chat_template.json")).ok()?;
            let v: serde_json::Value = serde_json::from_str(&json).ok()?;
            v.get("chat_template")?.as_str().map(str::to_string)
        }),
    }
}

/// `json.dumps`' default separators: `", "` between items, `": "` after keys.
struct PyCompact;

impl serde_json::ser::Formatter for PyCompact {
    fn begin_array_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
}

/// transformers' `tojson` filter: `json.dumps(x, ensure_ascii=False, indent=indent)`.
fn tojson(value: Value, kwargs: Kwargs) -> std::result::Result<Value, minijinja::Error> {
    let err = |e: serde_json::Error| minijinja::Error::new(ErrorKind::InvalidOperation, e.to_string());
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let mut out = Vec::new();
    match indent {
        Some(n) => {
            let pad = vec![b' '; n];
            let mut ser =
                serde_json::Serializer::with_formatter(&mut out, serde_json::ser::PrettyFormatter::with_indent(&pad));
            value.serialize(&mut ser).map_err(err)?;
        }
        None => value.serialize(&mut serde_json::Serializer::with_formatter(&mut out, PyCompact)).map_err(err)?,
    }
    Ok(Value::from_safe_string(String::from_utf8(out).unwrap_or_default()))
}

/// More variables for a chat template (a request's `chat_template_kwargs`), by name.
pub type ChatTemplateKwargs = serde_json::Map<String, serde_json::Value>;

/// A checkpoint's Jinja chat template, compiled once, with the BOS and EOS strings it may use.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
}

fn raise_exception(msg: String) -> std::result::Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
}

fn strftime_now(_fmt: String) -> String {
    // Templates use it for "Today Date"; a fixed format keeps prompts reproducible per day.
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let days = (secs / 86_400) as i64;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    format!("{:02} {} {}", d, MONTHS[(m - 1) as usize], y)
}

impl ChatTemplate {
    /// Compiles `source` (a `ModelLoad` error if it does not); `bos_token`/`eos_token` are the
    /// strings the template sees.
    pub fn new(source: String, bos_token: String, eos_token: String) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned("chat", source.clone())
            .map_err(|e| Error::model_load(format!("the checkpoint's chat template does not compile: {e}")))?;
        Ok(Self { env, source, bos_token, eos_token })
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages` (an `InvalidRequest` error if empty or if the template raises) with
    /// the `tools` offered (none: `tools` is `None` to the template); `add_generation_prompt`
    /// opens the assistant's turn.
    pub fn render(&self, messages: &[ChatMessage], tools: &[Tool], add_generation_prompt: bool) -> Result<String> {
        self.render_with(messages, tools, add_generation_prompt, &ChatTemplateKwargs::new())
    }

    /// `render` with `kwargs` as more template variables (a request's `chat_template_kwargs`,
    /// e.g. Qwen3's `enable_thinking`); they never replace `messages`, `tools`,
    /// `add_generation_prompt` or the special tokens.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        tools: &[Tool],
        add_generation_prompt: bool,
        kwargs: &ChatTemplateKwargs,
    ) -> Result<String> {
        if messages.is_empty() {
            return Err(Error::invalid("messages must not be empty"));
        }
        // OpenAI's `developer` role is its newer name for `system`; a template that does not
        // know it gets `system`, which it was trained with.
        let renamed: Vec<ChatMessage>;
        let messages = if messages.iter().any(|m| m.role == "developer") && !self.source.contains("developer") {
            renamed = messages
                .iter()
                .map(|m| match m.role.as_str() {
                    "developer" => ChatMessage { role: "system".into(), ..m.clone() },
                    _ => m.clone(),
                })
                .collect();
            &renamed[..]
        } else {
            messages
        };
        let tmpl = self.env.get_template("chat").map_err(Error::internal)?;
        tmpl.render(minijinja::context! {
            messages => messages,
            tools => (!tools.is_empty()).then_some(tools),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token,
            eos_token => self.eos_token,
            ..minijinja::Value::from_serialize(kwargs)
        })
        .map_err(|e| Error::invalid(format!("chat template: {e}")))
    }
}

/// `rendered` (messages rendered without a generation prompt) cut right after the final
/// message's content, so the model continues that message (Hugging Face's and vLLM's
/// `continue_final_message`); an error when the template did not write that content.
pub fn continue_final_message(rendered: &str, messages: &[ChatMessage]) -> Result<String> {
    let last = messages.last().ok_or_else(|| Error::invalid("continue_final_message needs a message to continue"))?;
    let content = last.content.trim();
    match rendered.rfind(content) {
        Some(at) if !content.is_empty() => Ok(rendered[..at + content.len()].to_string()),
        _ => {
            Err(Error::invalid("continue_final_message: the chat template does not write the final message's content"))
        }
    }
}

#[cfg(test)]
#[path = "chat_tests.rs"]
mod tests;
