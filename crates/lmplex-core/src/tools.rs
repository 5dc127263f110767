//! Tool calling: the tools a chat request offers, how the model may use them, and the calls it
//! made, in OpenAI's shapes (so the server's JSON and Python's dicts deserialize straight into
//! these types and serialize back unchanged).
//!
//! Invariants: a [`Tools`] that passed `validate()` has at least one tool, unique function
//! names of 1-64 characters from `[A-Za-z0-9_.-]`, parameter schemas that are JSON objects,
//! and a `tool_choice` naming one of its tools; a [`ToolCall`]'s `arguments` is JSON text (an
//! object) as the model wrote it, never re-serialized.

use crate::{Error, Result};
use serde::{Deserialize, Serialize};

/// One tool a request offers (OpenAI's `{"type": "function", "function": {...}}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Tool {
    /// Always `function`.
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    /// The function the model may call.
    pub function: FunctionDef,
}

fn function_kind() -> String {
    "function".into()
}

/// A callable function: its name, what it does, and the JSON schema of its arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct FunctionDef {
    /// The name the model calls it by.
    pub name: String,
    /// What it does, shown to the model by the chat template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON schema of its arguments (an object); absent means no arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<serde_json::Value>,
    /// OpenAI's `strict`: accepted; arguments always follow the schema when a call is enforced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// How the model may use the tools (OpenAI's `tool_choice`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ToolChoice {
    /// No tool calls: the tools are not shown to the model.
    None,
    /// The model decides; once it starts a call, the call follows the tools' schemas.
    #[default]
    Auto,
    /// At least one call, enforced by grammar.
    Required,
    /// Exactly this function, enforced by grammar.
    Function(String),
}

impl ToolChoice {
    /// `none`, `auto`, `required`, or `{"type": "function", "function": {"name": ...}}` (an
    /// `InvalidRequest` naming `tool_choice` otherwise).
    pub fn from_json(v: &serde_json::Value) -> Result<Self> {
        let bad = || {
            Error::invalid(format!(
                "tool_choice must be \"none\", \"auto\", \"required\" or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got {v}"
            ))
        };
        match v {
            serde_json::Value::String(s) => match s.as_str() {
                "none" => Ok(Self::None),
                "auto" => Ok(Self::Auto),
                "required" => Ok(Self::Required),
                _ => Err(bad()),
            },
            serde_json::Value::Object(o) => {
                let name = o.get("function").and_then(|f| f.get("name")).and_then(|n| n.as_str()).ok_or_else(bad)?;
                Ok(Self::Function(name.to_string()))
            }
            _ => Err(bad()),
        }
    }

    /// OpenAI's JSON for it.
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Self::None => "none".into(),
            Self::Auto => "auto".into(),
            Self::Required => "required".into(),
            Self::Function(n) => serde_json::json!({"type": "function", "function": {"name": n}}),
        }
    }
}

impl Serialize for ToolChoice {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        self.to_json().serialize(s)
    }
}

impl<'de> Deserialize<'de> for ToolChoice {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        Self::from_json(&v).map_err(serde::de::Error::custom)
    }
}

/// A request's tools: what is offered and how the model may use it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tools {
    /// The tools offered.
    pub tools: Vec<Tool>,
    /// How the model may use them.
    #[serde(default)]
    pub tool_choice: ToolChoice,
    /// Whether several calls may come in one reply (OpenAI's default: yes).
    #[serde(default = "yes")]
    pub parallel_tool_calls: bool,
}

fn yes() -> bool {
    true
}

impl Tools {
    /// `tools` with `tool_choice: auto` and parallel calls allowed.
    pub fn new(tools: Vec<Tool>) -> Self {
        Self { tools, tool_choice: ToolChoice::Auto, parallel_tool_calls: true }
    }

    /// Checks names, schemas and the choice; errors name the parameter (`tools[i]...`,
    /// `tool_choice`).
    pub fn validate(&self) -> Result<()> {
        if self.tools.is_empty() {
            return Err(Error::invalid("tools must not be empty (leave it out to offer none)"));
        }
        for (i, t) in self.tools.iter().enumerate() {
            if t.kind != "function" {
                return Err(Error::invalid(format!("tools[{i}].type must be \"function\", got \"{}\"", t.kind)));
            }
            let name = &t.function.name;
            let ok = (1..=64).contains(&name.len())
                && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
            if !ok {
                return Err(Error::invalid(format!(
                    "tools[{i}].function.name must be 1-64 characters of a-z, A-Z, 0-9, '_', '-' or '.', got {name:?}"
                )));
            }
            if self.tools[..i].iter().any(|o| &o.function.name == name) {
                return Err(Error::invalid(format!("tools[{i}].function.name {name:?} is given twice")));
            }
            if let Some(p) = &t.function.parameters {
                if !p.is_object() {
                    return Err(Error::invalid(format!(
                        "tools[{i}].function.parameters must be a JSON schema object, got {p}"
                    )));
                }
            }
        }
        if let ToolChoice::Function(n) = &self.tool_choice {
            if !self.tools.iter().any(|t| &t.function.name == n) {
                return Err(Error::invalid(format!("tool_choice names the function {n:?}, which is not in tools")));
            }
        }
        Ok(())
    }

    /// The tools the model may call under the choice (one for a named function).
    pub fn callable(&self) -> Vec<&Tool> {
        match &self.tool_choice {
            ToolChoice::None => Vec::new(),
            ToolChoice::Function(n) => self.tools.iter().filter(|t| &t.function.name == n).collect(),
            ToolChoice::Auto | ToolChoice::Required => self.tools.iter().collect(),
        }
    }
}

/// One call the model made (OpenAI's `{"id", "type": "function", "function": {"name", "arguments"}}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ToolCall {
    /// The call's id (`call_...`), which the tool's answer names as `tool_call_id`.
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    /// What was called, with what.
    pub function: FunctionCall,
}

/// The function and arguments of a [`ToolCall`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FunctionCall {
    /// The function's name.
    pub name: String,
    /// The arguments as JSON text.
    #[serde(default)]
    pub arguments: String,
}

impl ToolCall {
    /// A function call with id `id`.
    pub fn new(id: impl Into<String>, name: impl Into<String>, arguments: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            kind: function_kind(),
            function: FunctionCall { name: name.into(), arguments: arguments.into() },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tool(name: &str) -> Tool {
        serde_json::from_value(
            json!({"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}),
        )
        .unwrap()
    }

    #[test]
    fn choice_reads_openai_shapes() {
        assert_eq!(ToolChoice::from_json(&json!("required")).unwrap(), ToolChoice::Required);
        let named = json!({"type": "function", "function": {"name": "f"}});
        assert_eq!(ToolChoice::from_json(&named).unwrap(), ToolChoice::Function("f".into()));
        assert_eq!(ToolChoice::Function("f".into()).to_json(), named);
        assert!(ToolChoice::from_json(&json!("sometimes")).unwrap_err().to_string().contains("tool_choice"));
    }

    #[test]
    fn validate_names_the_bad_part() {
        let mut t = Tools::new(vec![tool("get_weather"), tool("get_weather")]);
        assert!(t.validate().unwrap_err().to_string().contains("tools[1].function.name"));
        t.tools.pop();
        t.tool_choice = ToolChoice::Function("nope".into());
        assert!(t.validate().unwrap_err().to_string().contains("tool_choice"));
        t.tool_choice = ToolChoice::Auto;
        t.tools[0].function.parameters = Some(json!("string"));
        assert!(t.validate().unwrap_err().to_string().contains("tools[0].function.parameters"));
        t.tools[0].function.parameters = None;
        t.validate().unwrap();
    }
}
