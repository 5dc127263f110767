//! Tool calling in the engine: a chat request's tools go into the chat template, its
//! `tool_choice` becomes a grammar (`lmplex_text::tool_grammar`) that guides sampling, and a
//! per-request `ToolStream` turns the output text into content and tool calls.
//!
//! Invariants: the format is the config's `tool_call_parser`, else the one the chat template
//! teaches; a request whose tools cannot work (no chat prompt, no known format, a schema
//! llguidance cannot compile, an output constraint as well) is refused here, before it is
//! queued; a `tool` message must answer a call an earlier assistant message made.

use super::{Engine, Prompt, Request};
use crate::sequence::Sequence;
use lmplex_core::{Error, Result, StructuredOutput, ToolCallParser, ToolChoice, Tools};
use lmplex_model::tool_grammar;
use lmplex_model::{ChatMessage, GuidedFactory, ToolStream};

impl Engine {
    /// How this model writes tool calls: the config's `tool_call_parser`, else the chat
    /// template's format; `None` when neither says.
    pub fn tool_call_parser(&self) -> Option<ToolCallParser> {
        self.tool_format
    }

    /// The tools a request shows the model (none under `tool_choice: none`), checked.
    pub(super) fn offered_tools<'a>(&self, req: &'a Request) -> Result<Option<&'a Tools>> {
        let Some(t) = &req.tools else { return Ok(None) };
        t.validate()?;
        if !matches!(req.prompt, Prompt::Messages(_)) {
            return Err(Error::invalid("tools need a chat prompt (a list of messages)"));
        }
        if t.tool_choice == ToolChoice::None {
            return Ok(None);
        }
        if self.tool_format.is_none() {
            return Err(Error::invalid(format!(
                "model `{}` has no tool-call format in its chat template: set tool_call_parser ({})",
                self.config.served_name(),
                ToolCallParser::NAMES.join(", ")
            )));
        }
        if req.params.structured_outputs.is_some() {
            return Err(Error::invalid(
                "tools (unless tool_choice is \"none\") and an output constraint (response_format, structured_outputs) \
                 cannot be combined",
            ));
        }
        Ok(Some(t))
    }

    /// Sets up `seq` for the request's tools: the grammar of its `tool_choice` and the parser.
    pub(super) fn tool_sequence(&self, seq: &mut Sequence, tools: &Tools, factory: &GuidedFactory) -> Result<()> {
        let format = self.tool_format.ok_or_else(|| Error::internal("tool format checked before"))?;
        let special = |s: &str| self.tokenizer.special_token_id(s);
        if let Some(lark) = tool_grammar::grammar(format, tools, &special)? {
            match factory.guide(&StructuredOutput::Grammar(lark)) {
                Ok(g) => seq.guide = Some(g),
                Err(e) => return Err(blame_tool(format, tools, factory, &special).unwrap_or(e)),
            }
        }
        seq.tools = Some(ToolStream::new(format));
        Ok(())
    }
}

/// The first tool whose schema alone does not compile, as an error naming it.
fn blame_tool(
    format: ToolCallParser,
    tools: &Tools,
    factory: &GuidedFactory,
    special: &dyn Fn(&str) -> Option<lmplex_core::TokenId>,
) -> Option<Error> {
    tools.tools.iter().enumerate().find_map(|(i, t)| {
        let one = Tools { tools: vec![t.clone()], tool_choice: ToolChoice::Required, parallel_tool_calls: false };
        let lark = tool_grammar::grammar(format, &one, special).ok()??;
        let e = factory.guide(&StructuredOutput::Grammar(lark)).err()?;
        Some(Error::invalid(format!("tools[{i}].function.parameters is not a JSON schema lmplex can enforce: {e}")))
    })
}

/// Checks that every `tool` message answers a call an earlier assistant message made.
pub(super) fn check_tool_messages(messages: &[ChatMessage]) -> Result<()> {
    let mut called: Vec<&str> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        called.extend(m.tool_calls.iter().map(|c| c.id.as_str()));
        if m.role != "tool" {
            continue;
        }
        if called.is_empty() {
            return Err(Error::invalid(format!(
                "messages[{i}]: a tool message must answer a tool call of an earlier assistant message, and there is none"
            )));
        }
        if let Some(id) = &m.tool_call_id {
            if !called.contains(&id.as_str()) {
                return Err(Error::invalid(format!(
                    "messages[{i}]: tool_call_id {id:?} matches no tool call of an earlier assistant message"
                )));
            }
        }
    }
    Ok(())
}
