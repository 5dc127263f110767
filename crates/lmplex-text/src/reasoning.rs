//! Reasoning out of a thinking model's chat reply, as it streams: a [`ReasoningStream`] per
//! request splits the decoded text into the reasoning, between `<think>` and `</think>`, and the
//! answer after it, as vLLM's reasoning parsers (`qwen3`, `deepseek_r1`) do.
//!
//! A reply starts inside the reasoning when the prompt left a `<think>` open (the generation
//! prompt of DeepSeek-R1's and Qwen3 thinking templates; [`prompt_opens_reasoning`]), else in
//! the answer, where a `<think>` at its very start (after whitespace) opens the reasoning (Qwen3).
//! A reply that never writes `</think>` is all reasoning.
//!
//! Invariants: pushing a text in any split gives the same reasoning and answer as pushing it
//! whole; text is passed on as soon as it cannot be part of a tag (only a possible tag prefix,
//! and whitespace that may yet turn out to end the reasoning, are held back); the tags, the
//! whitespace that opens and ends the reasoning and the whitespace that opens the answer after
//! it are in neither part; a reply that does not open with `<think>` passes unchanged.
//!
//! A constraint on the reply (structured output, a tool grammar) is the answer's: a
//! [`ThinkGate`] follows the same rule token by token (where both tags are single tokens), so
//! the constraint lets the reply open its reasoning, then waits until the reasoning ends.

use lmplex_core::TokenId;

/// The tag that opens the reasoning.
pub const OPEN: &str = "<think>";
/// The tag that ends it.
pub const CLOSE: &str = "</think>";

/// Whether a chat template writes reasoning (`<think>` and `</think>`).
pub fn detect(template: &str) -> bool {
    template.contains(OPEN) && template.contains(CLOSE)
}

/// Whether a rendered chat prompt ends inside a `<think>` that it opened (its last `<think>`
/// comes after its last `</think>`): the reply then starts with reasoning.
pub fn prompt_opens_reasoning(prompt: &str) -> bool {
    prompt.rfind(OPEN).is_some_and(|o| prompt.rfind(CLOSE).is_none_or(|c| c < o))
}

/// What one push gives: reasoning and answer text new since the last.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Split {
    /// Reasoning text.
    pub reasoning: String,
    /// Answer text.
    pub content: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace yet: a `<think>` may still open the reasoning.
    Start,
    Reasoning,
    Content,
}

/// One reply's splitter; see the module docs.
#[derive(Debug, Clone)]
pub struct ReasoningStream {
    state: State,
    /// Text not given out yet.
    held: String,
    /// At the start of the current part: its leading whitespace is dropped.
    lead: bool,
}

impl ReasoningStream {
    /// A splitter for a reply that starts inside the reasoning (`in_reasoning`: the prompt
    /// opened it) or may open it.
    pub fn new(in_reasoning: bool) -> Self {
        let state = if in_reasoning { State::Reasoning } else { State::Start };
        Self { state, held: String::new(), lead: true }
    }

    /// Whether the reply is inside its reasoning now (as far as the text pushed shows).
    pub fn in_reasoning(&self) -> bool {
        self.state == State::Reasoning
    }

    /// Splits the next piece of the reply.
    pub fn push(&mut self, text: &str) -> Split {
        self.held.push_str(text);
        let mut out = Split::default();
        loop {
            match self.state {
                State::Start => {
                    let rest = self.held.trim_start();
                    if let Some(after) = rest.strip_prefix(OPEN) {
                        self.held = after.to_string();
                        (self.state, self.lead) = (State::Reasoning, true);
                    } else if OPEN.starts_with(rest) {
                        return out; // whitespace, or the start of the tag
                    } else {
                        (self.state, self.lead) = (State::Content, false);
                    }
                }
                State::Reasoning => {
                    if self.lead && !self.drop_lead() {
                        return out;
                    }
                    if let Some(i) = self.held.find(CLOSE) {
                        out.reasoning.push_str(self.held[..i].trim_end());
                        self.held.drain(..i + CLOSE.len());
                        (self.state, self.lead) = (State::Content, true);
                        continue;
                    }
                    let end = self.held.len() - hold_len(&self.held);
                    out.reasoning.push_str(&self.held[..end]);
                    self.held.drain(..end);
                    return out;
                }
                State::Content => {
                    if self.lead && !self.drop_lead() {
                        return out;
                    }
                    out.content.push_str(&self.held);
                    self.held.clear();
                    return out;
                }
            }
        }
    }

    /// The end of the reply: whatever was held back.
    pub fn finish(&mut self) -> Split {
        let mut out = Split::default();
        let held = std::mem::take(&mut self.held);
        match self.state {
            State::Start => out.content = held,
            State::Reasoning if self.lead => out.reasoning = held.trim().to_string(),
            State::Reasoning => out.reasoning = held.trim_end().to_string(),
            State::Content if self.lead => out.content = held.trim_start().to_string(),
            State::Content => out.content = held,
        }
        out
    }

    /// Drops the held text's leading whitespace; whether anything is left (the part has begun).
    fn drop_lead(&mut self) -> bool {
        let n = self.held.len() - self.held.trim_start().len();
        self.held.drain(..n);
        self.lead = self.held.is_empty();
        !self.lead
    }
}

/// Where a reply stands for a constraint that applies to its answer only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gate {
    /// The first token: it may be `<think>`.
    First,
    /// Inside the reasoning: the constraint waits.
    Inside,
    /// In the answer: the constraint applies.
    Answer,
}

/// The token-level rule of the module docs for a constraint on the answer: `<think>` may open
/// the reply, and the constraint waits until `</think>`.
#[derive(Debug, Clone, Copy)]
pub struct ThinkGate {
    open: TokenId,
    close: TokenId,
    state: Gate,
}

impl ThinkGate {
    /// The gate of a reply whose tags are the tokens `open` and `close`, starting inside the
    /// reasoning when the prompt opened it.
    pub fn new(open: TokenId, close: TokenId, in_reasoning: bool) -> Self {
        Self { open, close, state: if in_reasoning { Gate::Inside } else { Gate::First } }
    }

    /// Whether the constraint waits now (the reply is inside its reasoning): sample freely.
    pub fn waits(&self) -> bool {
        self.state == Gate::Inside
    }

    /// A token to allow beside the constraint's now: `<think>`, as the reply's first token.
    pub fn also_allowed(&self) -> Option<TokenId> {
        (self.state == Gate::First).then_some(self.open)
    }

    /// Whether the constraint would take `id` now (it is part of the answer), as `record`
    /// says, without recording it.
    pub fn takes(&self, id: TokenId) -> bool {
        match self.state {
            Gate::First => id != self.open,
            Gate::Inside => false,
            Gate::Answer => true,
        }
    }

    /// Records a sampled token; whether the constraint takes it (it is part of the answer).
    pub fn record(&mut self, id: TokenId) -> bool {
        let answer = self.takes(id);
        self.state = match self.state {
            Gate::First if !answer => Gate::Inside,
            Gate::Inside if id != self.close => Gate::Inside,
            _ => Gate::Answer,
        };
        answer
    }
}

/// How much of the end of `s` to hold back in the reasoning: a suffix that may begin `</think>`
/// and the whitespace before it.
fn hold_len(s: &str) -> usize {
    let tag = (1..CLOSE.len()).rev().find(|&k| s.ends_with(&CLOSE[..k])).unwrap_or(0);
    let body = &s[..s.len() - tag];
    tag + (body.len() - body.trim_end().len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split_whole(in_reasoning: bool, text: &str) -> Split {
        let mut s = ReasoningStream::new(in_reasoning);
        let mut out = s.push(text);
        let last = s.finish();
        out.reasoning.push_str(&last.reasoning);
        out.content.push_str(&last.content);
        out
    }

    fn split_by_char(in_reasoning: bool, text: &str) -> Split {
        let mut s = ReasoningStream::new(in_reasoning);
        let mut out = Split::default();
        for c in text.chars() {
            let p = s.push(&c.to_string());
            out.reasoning.push_str(&p.reasoning);
            out.content.push_str(&p.content);
        }
        let last = s.finish();
        out.reasoning.push_str(&last.reasoning);
        out.content.push_str(&last.content);
        out
    }

    fn split(r: &str, c: &str) -> Split {
        Split { reasoning: r.into(), content: c.into() }
    }

    #[test]
    fn replies_split_the_same_whole_or_char_by_char() {
        let cases = [
            // Qwen3 thinking: the model opens the reasoning.
            (false, "<think>\nLet me add: 2+2=4.\n</think>\n\nIt is 4.", split("Let me add: 2+2=4.", "It is 4.")),
            // DeepSeek-R1: the prompt opened it.
            (true, "\nOkay, 2+2.\n\n</think>\n\n**4**", split("Okay, 2+2.", "**4**")),
            // Qwen3 with enable_thinking false (the prompt closed an empty block): all answer.
            (false, "It is 4.", split("", "It is 4.")),
            (false, "  leading <think> later", split("", "  leading <think> later")),
            // No end tag: all reasoning; an unfinished tag at the end is reasoning too.
            (true, "still thinking </thi", split("still thinking </thi", "")),
            (false, "<think>a < b, c</ d</think>x", split("a < b, c</ d", "x")),
            (false, "<thin", split("", "<thin")),
            (false, "\n\n", split("", "\n\n")),
            (true, "日本語 </think> ok", split("日本語", "ok")),
        ];
        for (in_reasoning, text, want) in cases {
            assert_eq!(split_whole(in_reasoning, text), want, "whole: {text:?}");
            assert_eq!(split_by_char(in_reasoning, text), want, "by char: {text:?}");
        }
    }

    #[test]
    fn text_is_passed_on_once_it_cannot_be_a_tag() {
        let mut s = ReasoningStream::new(false);
        assert_eq!(s.push("<th"), split("", ""));
        assert_eq!(s.push("ink>a b"), split("a b", ""));
        assert!(s.in_reasoning());
        assert_eq!(s.push(" \n</"), split("", ""), "a possible end is held");
        assert_eq!(s.push("x"), split(" \n</x", ""));
        assert_eq!(s.push("</think>\n"), split("", ""));
        assert_eq!(s.push("\nyes"), split("", "yes"));
        assert!(!s.in_reasoning());
    }

    #[test]
    fn the_gate_lets_the_reasoning_open_then_waits_for_its_end() {
        let (open, close) = (7, 8);
        let mut g = ThinkGate::new(open, close, false);
        assert_eq!((g.waits(), g.also_allowed()), (false, Some(open)));
        assert!(!g.takes(open) && g.takes(1));
        assert!(!g.record(open));
        assert!(g.waits() && g.also_allowed().is_none() && !g.takes(close));
        assert!(!g.record(1) && !g.record(open) && !g.record(close), "reasoning and its end are not the answer's");
        assert!(!g.waits() && g.record(1) && g.record(close));
        let mut direct = ThinkGate::new(open, close, false);
        assert!(direct.record(1) && direct.record(open), "after the first token <think> is text");
        let mut opened = ThinkGate::new(open, close, true);
        assert!(opened.waits() && !opened.record(close) && opened.record(2));
    }

    #[test]
    fn prompts_and_templates() {
        assert!(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
        assert!(!prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
        assert!(!prompt_opens_reasoning("<|im_start|>assistant\n"));
        assert!(detect("{{ '<think>\\n\\n</think>\\n\\n' }}"));
        assert!(!detect("{{ messages }}"));
    }
}
