//! Tool calls out of a model's text, as it streams: a [`ToolStream`] per request takes the
//! decoded text deltas and gives back the content to show and the calls it completed.
//!
//! Formats (vLLM's parser names, `ToolCallParser`):
//! - `hermes`: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, any number, with
//!   text around them (Qwen2.5/3, Hermes).
//! - `llama3_json`: a reply that is `{"name": ..., "parameters": {...}}` (several joined by
//!   `;`), possibly after `<|python_tag|>` (Llama 3.1-3.3).
//! - `mistral`: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` or the newer
//!   `[TOOL_CALLS]name[ARGS]{...}`; the trigger may be missing when special tokens are skipped.
//!
//! Invariants: content is passed through as soon as it cannot be the start of a call (only a
//! possible trigger prefix and trailing whitespace are held back); text that looked like a call
//! but does not parse is given back as content, unchanged; pushing a text in any split gives
//! the same content and calls as pushing it whole; a call's `arguments` is the model's JSON
//! text for the arguments object, as written.

use lmplex_core::{ToolCall, ToolCallParser};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::hash::BuildHasher;

const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";
const PYTHON_TAG: &str = "<|python_tag|>";
const MISTRAL_TRIGGER: &str = "[TOOL_CALLS]";

/// The tool-call format a chat template teaches, read from its source; `None` if it names none.
pub fn detect(template: &str) -> Option<ToolCallParser> {
    if template.contains(HERMES_OPEN) {
        Some(ToolCallParser::Hermes)
    } else if template.contains(MISTRAL_TRIGGER) {
        Some(ToolCallParser::Mistral)
    } else if template.contains(PYTHON_TAG) || (template.contains("<|start_header_id|>") && template.contains("tools"))
    {
        Some(ToolCallParser::Llama3Json)
    } else {
        None
    }
}

/// What one push gave: content to show and completed calls.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Parsed {
    /// Text that is not part of a call.
    pub content: String,
    /// Calls completed by this push.
    pub calls: Vec<ToolCall>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Only whitespace so far (formats whose calls are recognised at the start).
    Start,
    /// Passing content through, watching for a trigger.
    Content,
    /// Inside `<tool_call>`, until `</tool_call>`.
    InCall,
    /// Everything to the end is calls (or, if it does not parse, content).
    Rest,
}

/// One request's tool-call parser.
pub struct ToolStream {
    format: ToolCallParser,
    state: State,
    buf: String,
    /// Whether `Rest` began at a trigger (given back with the text if it does not parse).
    trigger: &'static str,
    calls: usize,
    ids: std::hash::RandomState,
}

#[derive(Deserialize)]
struct RawCall<'a> {
    name: String,
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
    #[serde(borrow, default)]
    parameters: Option<&'a RawValue>,
}

/// The smallest index from which the rest of `buf` could still grow into `trigger`.
fn hold_from(buf: &str, trigger: &str) -> usize {
    let start = buf.len().saturating_sub(trigger.len() - 1);
    (start..buf.len()).find(|&i| buf.is_char_boundary(i) && trigger.starts_with(&buf[i..])).unwrap_or(buf.len())
}

impl ToolStream {
    /// A parser for `format`.
    pub fn new(format: ToolCallParser) -> Self {
        let state = if format == ToolCallParser::Hermes { State::Content } else { State::Start };
        Self { format, state, buf: String::new(), trigger: "", calls: 0, ids: std::hash::RandomState::new() }
    }

    /// Calls parsed so far.
    pub fn num_calls(&self) -> usize {
        self.calls
    }

    /// Takes the next text delta.
    pub fn push(&mut self, text: &str) -> Parsed {
        self.buf.push_str(text);
        let mut out = Parsed::default();
        loop {
            let before = (self.state, self.buf.len());
            match self.state {
                State::Start => self.start(&mut out),
                State::Content => self.content(&mut out),
                State::InCall => self.in_call(&mut out),
                State::Rest => {}
            }
            if (self.state, self.buf.len()) == before {
                break;
            }
        }
        out
    }

    /// Ends the text: whatever is held back is decided.
    pub fn finish(&mut self) -> Parsed {
        let mut out = Parsed::default();
        let rest = std::mem::take(&mut self.buf);
        match self.state {
            State::Start | State::Content => {
                if self.calls == 0 || !rest.trim().is_empty() {
                    out.content = rest;
                }
            }
            State::InCall => match self.call(rest.trim()) {
                Some(c) => out.calls.push(c),
                None => out.content = format!("{HERMES_OPEN}{rest}"),
            },
            State::Rest => match self.parse_rest(&rest) {
                Some(calls) => out.calls = calls,
                None => out.content = format!("{}{rest}", self.trigger),
            },
        }
        self.state = State::Content;
        out
    }

    fn start(&mut self, out: &mut Parsed) {
        let t = self.buf.trim_start();
        if t.is_empty() {
            return;
        }
        let (calls_start, partial): (&[&str], &[&str]) = match self.format {
            ToolCallParser::Llama3Json => (&[PYTHON_TAG, "{"], &[PYTHON_TAG]),
            _ => (&["[{"], &["[{"]),
        };
        if calls_start.iter().any(|p| t.starts_with(p)) {
            self.state = State::Rest;
        } else if !partial.iter().any(|p| p.starts_with(t)) {
            self.state = State::Content;
            if self.format == ToolCallParser::Llama3Json {
                out.content.push_str(&std::mem::take(&mut self.buf));
            }
        }
    }

    fn content(&mut self, out: &mut Parsed) {
        let trigger = match self.format {
            ToolCallParser::Hermes => HERMES_OPEN,
            ToolCallParser::Mistral => MISTRAL_TRIGGER,
            ToolCallParser::Llama3Json => {
                out.content.push_str(&std::mem::take(&mut self.buf));
                return;
            }
        };
        if let Some(i) = self.buf.find(trigger) {
            out.content.push_str(self.buf[..i].trim_end());
            self.buf.drain(..i + trigger.len());
            if self.format == ToolCallParser::Hermes {
                self.state = State::InCall;
            } else {
                (self.state, self.trigger) = (State::Rest, MISTRAL_TRIGGER);
            }
            return;
        }
        // Trailing whitespace stays held too: it may precede a call.
        let keep = self.buf[..hold_from(&self.buf, trigger)].trim_end().len();
        out.content.push_str(&self.buf[..keep]);
        self.buf.drain(..keep);
    }

    fn in_call(&mut self, out: &mut Parsed) {
        let Some(i) = self.buf.find(HERMES_CLOSE) else { return };
        let inner = self.buf[..i].to_string();
        self.buf.drain(..i + HERMES_CLOSE.len());
        match self.call(inner.trim()) {
            Some(c) => out.calls.push(c),
            None => out.content.push_str(&format!("{HERMES_OPEN}{inner}{HERMES_CLOSE}")),
        }
        self.state = State::Content;
    }

    /// All calls of a `Rest` text, or `None` if any part is not a call.
    fn parse_rest(&mut self, rest: &str) -> Option<Vec<ToolCall>> {
        let mut s = rest.trim();
        if self.format == ToolCallParser::Llama3Json {
            s = s.strip_prefix(PYTHON_TAG).unwrap_or(s);
        }
        let mut calls = Vec::new();
        if self.format == ToolCallParser::Mistral && !s.starts_with('[') {
            // `name[ARGS]{...}`, repeated after further triggers.
            for part in s.split(MISTRAL_TRIGGER) {
                let (name, args) = part.trim().split_once("[ARGS]")?;
                let args: &RawValue = serde_json::from_str(args.trim()).ok()?;
                calls.push(self.make(name.trim(), args.get())?);
            }
            return (!calls.is_empty()).then_some(calls);
        }
        if self.format == ToolCallParser::Mistral {
            let list: Vec<&RawValue> = serde_json::from_str(s).ok()?;
            for v in list {
                calls.push(self.call(v.get())?);
            }
            return (!calls.is_empty()).then_some(calls);
        }
        loop {
            s = s.trim_start_matches(|c: char| c.is_whitespace() || c == ';');
            if s.is_empty() {
                break;
            }
            let mut it = serde_json::Deserializer::from_str(s).into_iter::<&RawValue>();
            let v = it.next()?.ok()?;
            let end = it.byte_offset();
            calls.push(self.call(v.get())?);
            s = &s[end..];
        }
        (!calls.is_empty()).then_some(calls)
    }

    /// One call from its JSON object (`name` and `arguments` or `parameters`).
    fn call(&mut self, obj: &str) -> Option<ToolCall> {
        let r: RawCall = serde_json::from_str(obj).ok()?;
        let args = r.arguments.or(r.parameters).map_or("{}", |a| a.get());
        self.make(&r.name, args)
    }

    fn make(&mut self, name: &str, args: &str) -> Option<ToolCall> {
        // Some models write the arguments object as a JSON string holding it.
        let args = match serde_json::from_str::<String>(args) {
            Ok(inner) => inner,
            Err(_) => args.to_string(),
        };
        let valid = serde_json::from_str::<serde_json::Value>(&args).is_ok_and(|v| v.is_object());
        if name.is_empty() || !valid {
            return None;
        }
        self.calls += 1;
        Some(ToolCall::new(self.new_id(), name, args))
    }

    /// `call_` and 24 random letters and digits; Mistral's templates want exactly 9.
    fn new_id(&self) -> String {
        const ABC: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        let len = if self.format == ToolCallParser::Mistral { 9 } else { 24 };
        let mut id = String::with_capacity(len + 5);
        let mut n = 0u64;
        for i in 0..len {
            if i % 10 == 0 {
                n = self.ids.hash_one((self.calls, i, std::time::Instant::now()));
            }
            id.push(ABC[(n % 62) as usize] as char);
            n /= 62;
        }
        if self.format == ToolCallParser::Mistral {
            id
        } else {
            format!("call_{id}")
        }
    }
}

#[cfg(test)]
#[path = "tool_parser_tests.rs"]
mod tests;
