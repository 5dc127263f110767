//! A PEFT `adapter_config.json` as lmplex reads it: which modules an adapter targets, and each
//! module's rank and scale.
//!
//! Matching follows PEFT (`peft.tuners.tuners_utils.check_target_module_exists`): a list entry
//! targets a module whose full name equals it or ends with `.` + it; a string is a regular
//! expression the full name must match whole, or `all-linear`; `rank_pattern` and
//! `alpha_pattern` keys match a name that ends with them at a `.` boundary (`(.*\.)?key$`), the
//! first matching key winning as in PEFT's dict order. The scale is `alpha / r`, or
//! `alpha / sqrt(r)` under `use_rslora`.
//!
//! Invariant: every field PEFT defines that would change what the adapter computes and that
//! lmplex does not implement (DoRA, `modules_to_save`, biases, layer selection, ...) is refused
//! with an error naming the field; fields that only matter to training are ignored.

use lmplex_core::{Error, Result};
use regex::Regex;
use serde_json::Value;
use std::path::Path;

/// Which modules a config targets.
enum Targets {
    /// Names matched as a suffix at a `.` boundary.
    List(Vec<String>),
    /// A regular expression matched against the whole name.
    Pattern(Regex),
    /// Every linear layer but the output head (PEFT's `all-linear`).
    AllLinear,
}

/// The parts of a PEFT LoRA config that decide what the adapter computes.
pub struct LoraConfig {
    /// The default rank (`r`).
    pub r: usize,
    /// The default `lora_alpha`.
    pub alpha: f64,
    /// `use_rslora`: scale by `alpha / sqrt(r)`.
    pub rslora: bool,
    targets: Targets,
    exclude: Vec<String>,
    rank_pattern: Vec<(Regex, usize)>,
    alpha_pattern: Vec<(Regex, f64)>,
}

/// Fields whose presence with a value other than their "off" value means a computation lmplex
/// does not implement: (field, why).
const REFUSED: [(&str, &str); 10] = [
    ("use_dora", "DoRA adapters are not supported"),
    ("modules_to_save", "fully trained modules (modules_to_save) are not supported"),
    ("layers_to_transform", "adapters on a subset of layers (layers_to_transform) are not supported"),
    ("layer_replication", "layer replication is not supported"),
    ("fan_in_fan_out", "fan_in_fan_out (Conv1D bases such as GPT-2) is not supported"),
    ("lora_bias", "LoRA biases are not supported"),
    ("trainable_token_indices", "trainable token embeddings are not supported"),
    ("alora_invocation_tokens", "activated LoRA (aLoRA) is not supported"),
    ("use_qalora", "QA-LoRA is not supported"),
    ("target_parameters", "adapting parameters directly (target_parameters, MoE experts) is not supported"),
];

fn err(path: &Path, what: impl std::fmt::Display) -> Error {
    Error::model_load(format!("{}: {what}", path.display()))
}

/// `(.*\.)?key$` as PEFT matches pattern keys against a module's name.
fn suffix_regex(path: &Path, field: &str, key: &str) -> Result<Regex> {
    Regex::new(&format!(r"^(?:.*\.)?(?:{key})$")).map_err(|e| err(path, format!("{field} key {key:?}: {e}")))
}

/// Whether `v` is a field's "off" value: absent, null, false, empty, or 0.
fn is_off(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        Value::String(s) => s.is_empty(),
        Value::Number(n) => n.as_f64() == Some(0.0),
    }
}

impl LoraConfig {
    /// Parses `adapter_config.json` (its text `json`, read from `path`).
    pub fn parse(path: &Path, json: &str) -> Result<Self> {
        let v: Value = serde_json::from_str(json).map_err(|e| err(path, format!("not valid JSON: {e}")))?;
        let o = v.as_object().ok_or_else(|| err(path, "not a JSON object"))?;
        match o.get("peft_type").and_then(Value::as_str) {
            Some("LORA") => {}
            Some(other) => return Err(err(path, format!("peft_type {other:?}: only LORA adapters are supported"))),
            None => return Err(err(path, "peft_type is missing (expected \"LORA\")")),
        }
        for (field, why) in REFUSED {
            if let Some(x) = o.get(field).filter(|x| !is_off(x)) {
                return Err(err(path, format!("{field} = {x}: {why}")));
            }
        }
        match o.get("bias").and_then(Value::as_str) {
            None | Some("none") => {}
            Some(other) => return Err(err(path, format!("bias = {other:?}: only \"none\" is supported"))),
        }
        let r = o
            .get("r")
            .and_then(Value::as_u64)
            .filter(|&r| r > 0)
            .ok_or_else(|| err(path, "r must be a positive integer"))? as usize;
        let alpha = match o.get("lora_alpha") {
            None | Some(Value::Null) => 8.0,
            Some(a) => a.as_f64().ok_or_else(|| err(path, "lora_alpha must be a number"))?,
        };
        let rslora = o.get("use_rslora").and_then(Value::as_bool).unwrap_or(false);
        let targets = match o.get("target_modules") {
            Some(Value::Array(a)) if !a.is_empty() => Targets::List(
                a.iter()
                    .map(|x| x.as_str().map(str::to_string).ok_or_else(|| err(path, "target_modules: not a string")))
                    .collect::<Result<_>>()?,
            ),
            Some(Value::String(s)) if s == "all-linear" => Targets::AllLinear,
            Some(Value::String(s)) => Targets::Pattern(
                Regex::new(&format!("^(?:{s})$")).map_err(|e| err(path, format!("target_modules {s:?}: {e}")))?,
            ),
            _ => return Err(err(path, "target_modules must list the adapted modules")),
        };
        let exclude = match o.get("exclude_modules") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect(),
            Some(Value::String(s)) => vec![s.clone()],
            Some(other) => return Err(err(path, format!("exclude_modules = {other}: expected names"))),
        };
        let pattern = |field: &str| -> Result<Vec<(Regex, f64)>> {
            match o.get(field) {
                None | Some(Value::Null) => Ok(Vec::new()),
                Some(Value::Object(m)) => m
                    .iter()
                    .map(|(k, x)| {
                        let n = x.as_f64().ok_or_else(|| err(path, format!("{field}[{k:?}] is not a number")))?;
                        Ok((suffix_regex(path, field, k)?, n))
                    })
                    .collect(),
                Some(other) => Err(err(path, format!("{field} = {other}: expected an object"))),
            }
        };
        let rank_pattern = pattern("rank_pattern")?
            .into_iter()
            .map(|(k, n)| {
                if n >= 1.0 && n.fract() == 0.0 {
                    Ok((k, n as usize))
                } else {
                    Err(err(path, format!("rank_pattern: rank {n} is not a positive integer")))
                }
            })
            .collect::<Result<_>>()?;
        let alpha_pattern = pattern("alpha_pattern")?;
        Ok(Self { r, alpha, rslora, targets, exclude, rank_pattern, alpha_pattern })
    }

    /// Whether the module named `name` (`model.layers.0.self_attn.q_proj`) is adapted.
    pub fn targets(&self, name: &str) -> bool {
        let ends = |key: &str| name == key || name.ends_with(&format!(".{key}"));
        if self.exclude.iter().any(|e| ends(e)) {
            return false;
        }
        match &self.targets {
            Targets::List(keys) => keys.iter().any(|k| ends(k)),
            Targets::Pattern(re) => re.is_match(name),
            Targets::AllLinear => !name.ends_with("lm_head"),
        }
    }

    /// The module's rank and scale.
    pub fn rank_and_scale(&self, name: &str) -> (usize, f32) {
        let r = self.rank_pattern.iter().find(|(k, _)| k.is_match(name)).map_or(self.r, |(_, r)| *r);
        let alpha = self.alpha_pattern.iter().find(|(k, _)| k.is_match(name)).map_or(self.alpha, |(_, a)| *a);
        let scale = if self.rslora { alpha / (r as f64).sqrt() } else { alpha / r as f64 };
        (r, scale as f32)
    }

    /// The names the config lists as targets, when it lists them (for errors).
    pub fn listed_targets(&self) -> Option<&[String]> {
        match &self.targets {
            Targets::List(keys) => Some(keys),
            _ => None,
        }
    }
}
