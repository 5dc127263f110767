//! Chat templates: the Jinja template shipped with a checkpoint, rendered with minijinja plus
//! its Python-compatibility methods (`.strip()`, `.startswith()`, ...), as transformers does
//! (`trim_blocks`, `lstrip_blocks`, `raise_exception`, `strftime_now`).
//!
//! Invariant: a template is compiled once at load; a template error at render time is an
//! `InvalidRequest` naming the template's message.

use lmplex_core::{Error, Result};
use minijinja::{Environment, ErrorKind, Value};
use serde::Serialize;

/// One chat turn, as the template sees it (`message['role']`, `message['content']`).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, ... (whatever the template accepts).
    pub role: String,
    /// The turn's text.
    pub content: String,
}

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
        env.add_template_owned("chat", source.clone())
            .map_err(|e| Error::model_load(format!("the checkpoint's chat template does not compile: {e}")))?;
        Ok(Self { env, source, bos_token, eos_token })
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages` (an `InvalidRequest` error if empty or if the template raises);
    /// `add_generation_prompt` opens the assistant's turn.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        if messages.is_empty() {
            return Err(Error::invalid("messages must not be empty"));
        }
        let tmpl = self.env.get_template("chat").map_err(Error::internal)?;
        tmpl.render(minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token,
            eos_token => self.eos_token,
        })
        .map_err(|e| Error::invalid(format!("chat template: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_chatml_with_python_methods() {
        let src = "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'].strip() + '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
        let t = ChatTemplate::new(src.into(), String::new(), String::new()).unwrap();
        let msgs = [ChatMessage { role: "user".into(), content: " hi ".into() }];
        assert_eq!(t.render(&msgs, true).unwrap(), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    }

    #[test]
    fn raise_exception_is_an_invalid_request() {
        let t = ChatTemplate::new("{{ raise_exception('roles must alternate') }}".into(), String::new(), String::new())
            .unwrap();
        let e = t.render(&[ChatMessage { role: "user".into(), content: "x".into() }], true).unwrap_err();
        assert!(matches!(e, Error::InvalidRequest(ref m) if m.contains("roles must alternate")), "{e}");
    }
}
