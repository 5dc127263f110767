//! Structured output: a request's `StructuredOutput` (JSON schema, JSON object, regex, choice,
//! Lark grammar) compiled by llguidance into a [`Guide`] that masks each logits row.
//!
//! Data flow: [`GuidedFactory::new`] turns the model's tokenizer into llguidance's token trie
//! once per engine (every token as the bytes it decodes to; special tokens marked so grammars
//! never produce them); [`GuidedFactory::guide`] compiles one request's constraint (bad
//! schemas and regexes are `InvalidRequest` here, before the request is queued); the
//! sequence asks [`Guide::mask`] before sampling and [`Guide::advance`] after.
//!
//! Invariants: the mask has one bit per logits column (the trie is padded to the model's
//! vocabulary with never-allowed placeholders); EOS is allowed exactly when the constraint is
//! satisfied; a guide depends only on its own request's tokens, so constrained requests stay
//! bit-exact whatever else is in the batch. JSON is compact unless the schema asks otherwise
//! (`"x-guidance": {"whitespace_flexible": true}`): small models given free whitespace tend to
//! spend their tokens on it. In a regex, `\d` and `\w` are ASCII (`[0-9]`, `[0-9A-Za-z_]`), as
//! in JSON Schema patterns, JavaScript and vLLM's default backend; `\s` stays Unicode.

use crate::Tokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use lmplex_core::{Error, Result, StructuredOutput, TokenId};
use std::collections::HashMap;
use std::sync::Arc;
use tokenizers::{normalizers, pre_tokenizers, DecoderWrapper, NormalizerWrapper, PreTokenizerWrapper};
use toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenizerEnv};

/// Compiles constraints for one model; cheap to share.
#[derive(Clone)]
pub struct GuidedFactory {
    factory: Arc<ParserFactory>,
    env: TokEnv,
}

/// `rx` with `\d`, `\D`, `\w` and `\W` spelled as their ASCII classes, inside and outside
/// brackets (the regex engine's own are Unicode: `\d` would let a model write `٣` or `🯰`).
/// Other escapes, and a backslash escaping a backslash, are kept as they are.
pub fn ascii_classes(rx: &str) -> String {
    let mut out = String::with_capacity(rx.len() + 16);
    let (mut depth, mut chars) = (0usize, rx.chars().peekable());
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e @ ('d' | 'D' | 'w' | 'W')) => {
                    let (set, negated) = match e {
                        'd' | 'D' => ("0-9", e == 'D'),
                        _ => ("0-9A-Za-z_", e == 'W'),
                    };
                    match (depth, negated) {
                        (0, false) => out.push_str(&format!("[{set}]")),
                        (0, true) => out.push_str(&format!("[^{set}]")),
                        (_, false) => out.push_str(set),
                        (_, true) => out.push_str(if e == 'D' { "[:^digit:]" } else { "[:^word:]" }),
                    }
                }
                Some(e) => {
                    out.push('\\');
                    out.push(e);
                }
                None => out.push('\\'),
            },
            '[' => {
                out.push('[');
                depth += 1;
                // A `]` first in a class (after an optional `^`) is a literal.
                if chars.peek() == Some(&'^') {
                    out.push('^');
                    chars.next();
                }
                if chars.peek() == Some(&']') {
                    out.push(']');
                    chars.next();
                }
            }
            ']' if depth > 0 => {
                out.push(']');
                depth -= 1;
            }
            c => out.push(c),
        }
    }
    out
}

/// One request's constraint state.
pub struct Guide {
    matcher: Matcher,
}

impl GuidedFactory {
    /// Builds the token trie of `tok` for a model whose logits have `vocab_size` columns.
    pub fn new(tok: &Tokenizer, vocab_size: usize) -> Result<Self> {
        let env = ByteEnv::new(tok, vocab_size)?;
        let env: TokEnv = Arc::new(env);
        let mut factory = ParserFactory::new_simple(&env).map_err(Error::internal)?;
        factory.quiet();
        Ok(Self { factory: Arc::new(factory), env })
    }

    /// Compiles one request's constraint; a schema, regex or grammar that llguidance cannot
    /// compile is `InvalidRequest` with its message.
    pub fn guide(&self, s: &StructuredOutput) -> Result<Guide> {
        let grammar = match s {
            StructuredOutput::JsonSchema(text) => {
                let mut schema: serde_json::Value = serde_json::from_str(text)
                    .map_err(|e| Error::invalid(format!("structured output: the JSON schema is not JSON: {e}")))?;
                if let Some(obj) = schema.as_object_mut() {
                    let opts = obj.entry("x-guidance").or_insert_with(|| serde_json::json!({}));
                    if let Some(o) = opts.as_object_mut() {
                        o.entry("whitespace_flexible").or_insert(false.into());
                    }
                }
                TopLevelGrammar::from_json_schema(schema)
            }
            StructuredOutput::JsonObject => TopLevelGrammar::from_json_schema(
                serde_json::json!({"type": "object", "x-guidance": {"whitespace_flexible": false}}),
            ),
            StructuredOutput::Regex(rx) => TopLevelGrammar::from_regex(&ascii_classes(rx)),
            StructuredOutput::Choice(options) => {
                let trie = self.env.tok_trie();
                // A vocabulary may lack a byte (SmolLM2's has no 0xF1): such a choice cannot be written.
                if let Some((i, o)) = options.iter().enumerate().find(|(_, o)| {
                    let b = o.as_bytes();
                    trie.decode_raw(&trie.greedy_tokenize(b)) != b
                }) {
                    return Err(Error::invalid(format!(
                        "structured output (choice): choice {i} ({o:?}) holds bytes no token of this model spells"
                    )));
                }
                let alts: Vec<String> =
                    options.iter().map(|o| serde_json::Value::from(o.as_str()).to_string()).collect();
                TopLevelGrammar::from_lark(format!("start: {}", alts.join(" | ")))
            }
            StructuredOutput::Grammar(lark) => TopLevelGrammar::from_lark(lark.clone()),
        };
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| Error::invalid(format!("structured output ({}): {e}", s.kind())))?;
        Ok(Guide { matcher: Matcher::new(Ok(parser)) })
    }
}

impl Guide {
    /// Tokens allowed next (EOS among them once the output is complete).
    pub fn mask(&mut self) -> Result<SimpleVob> {
        self.matcher.compute_mask_or_eos().map_err(unfollowable)
    }

    /// Records the sampled token.
    pub fn advance(&mut self, id: TokenId) -> Result<()> {
        self.matcher.consume_token(id).map_err(unfollowable)
    }

    /// True once the output is complete and nothing more can follow.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }
}

/// A constraint the model's tokens cannot follow (llguidance stops: a byte the grammar forces
/// that no token spells, a parser too complex); its first line, without llguidance's state dump.
fn unfollowable(e: impl std::fmt::Display) -> Error {
    let e = e.to_string();
    let why = e.lines().next().unwrap_or_default();
    Error::invalid(format!("structured output cannot be followed with this model's tokens: {why}"))
}

/// llguidance's view of the tokenizer: token bytes plus a tokenizer for grammar literals.
struct ByteEnv {
    trie: TokTrie,
    hf: tokenizers::Tokenizer,
}

impl ByteEnv {
    fn new(tok: &Tokenizer, vocab_size: usize) -> Result<Self> {
        let hf = for_fragments(tok.hf().clone());
        let n = hf.get_vocab_size(true);
        let (byte_level, space) = decoder_kind(hf.get_decoder())
            .ok_or_else(|| Error::invalid("structured output needs a byte-level or byte-fallback tokenizer"))?;
        let byte_map = byte_level_map();
        let mut words: Vec<Vec<u8>> = vec![Vec::new(); n.max(vocab_size)];
        for (id, w) in words.iter_mut().enumerate().take(n) {
            let id = id as TokenId;
            let Some(name) = hf.id_to_token(id) else { continue };
            *w = if tok.is_special(id) {
                special(&name)
            } else if byte_level {
                match name.chars().map(|c| byte_map.get(&c).copied()).collect::<Option<Vec<u8>>>() {
                    Some(b) => b,
                    // An added (non-special) token stored as plain text.
                    None => name.into_bytes(),
                }
            } else if let Some(b) = byte_fallback(&name) {
                vec![b]
            } else {
                name.replace(space, " ").into_bytes()
            };
        }
        for (id, w) in words.iter_mut().enumerate().skip(n) {
            *w = special(&format!("<[{id}]>"));
        }
        let eos = tok.eos_token_ids.first().copied().unwrap_or(0);
        let info = TokRxInfo::new(words.len() as u32, eos);
        let mut trie = TokTrie::from(&info, &words);
        if tok.eos_token_ids.len() > 1 {
            trie = trie.with_eos_tokens(&tok.eos_token_ids);
        }
        Ok(Self { trie, hf })
    }
}

impl TokenizerEnv for ByteEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// The tokenizer's own split of `s` where its tokens spell `s` byte for byte; else (an
    /// unassigned code point or a control character the tokenizer maps to another piece) the
    /// longest-match split over the token bytes, which always spells `s`. llguidance forces
    /// these tokens, so a split that spells other bytes would break the grammar mid-output.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        let ids = self.trie.tokenize_with_greedy_fallback(s, |s| {
            self.hf.encode(s, false).map(|e| e.get_ids().to_vec()).unwrap_or_default()
        });
        if s.contains(&TokTrie::SPECIAL_TOKEN_MARKER) || self.trie.decode_raw(&ids) == s {
            ids
        } else {
            self.trie.greedy_tokenize(s)
        }
    }
}

fn special(name: &str) -> Vec<u8> {
    let mut b = vec![TokTrie::SPECIAL_TOKEN_MARKER];
    b.extend_from_slice(name.as_bytes());
    b
}

/// `<0xAB>` pieces of SentencePiece byte fallback.
fn byte_fallback(name: &str) -> Option<u8> {
    let hex = name.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok()).flatten()
}

/// (is byte-level, the character that stands for a space in byte-fallback vocabularies).
fn decoder_kind(d: Option<&DecoderWrapper>) -> Option<(bool, char)> {
    fn walk(d: &DecoderWrapper, level: &mut bool, fallback: &mut bool, space: &mut char) {
        match d {
            DecoderWrapper::ByteLevel(_) => *level = true,
            DecoderWrapper::ByteFallback(_) => *fallback = true,
            DecoderWrapper::Metaspace(m) => *space = m.get_replacement(),
            DecoderWrapper::Replace(r) if r.content == " " => {
                // The pattern is private; its serialized form names it.
                if let Ok(v) = serde_json::to_value(r) {
                    if let Some(c) = v["pattern"]["String"].as_str().and_then(|s| s.chars().next()) {
                        *space = c;
                    }
                }
            }
            DecoderWrapper::Sequence(seq) => seq.get_decoders().iter().for_each(|d| walk(d, level, fallback, space)),
            _ => {}
        }
    }
    let (mut level, mut fallback, mut space) = (false, false, '\u{2581}');
    walk(d?, &mut level, &mut fallback, &mut space);
    (level || fallback).then_some((level, space))
}

/// GPT-2's byte-to-character table, inverted.
fn byte_level_map() -> HashMap<char, u8> {
    let direct = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 0x100u32;
    let mut m = HashMap::new();
    for b in 0..=255u8 {
        let c = if direct(b) {
            b as char
        } else {
            next += 1;
            char::from_u32(next - 1).expect("valid code point")
        };
        m.insert(c, b);
    }
    m
}

/// A copy of the tokenizer that encodes fragments in the middle of a text: no prepended space.
fn for_fragments(mut hf: tokenizers::Tokenizer) -> tokenizers::Tokenizer {
    fn norm(n: NormalizerWrapper) -> Option<NormalizerWrapper> {
        match n {
            NormalizerWrapper::Prepend(_) => None,
            NormalizerWrapper::Sequence(s) => {
                let kept: Vec<_> = s.as_ref().iter().filter_map(|n| norm(n.clone())).collect();
                (!kept.is_empty()).then(|| NormalizerWrapper::Sequence(normalizers::Sequence::new(kept)))
            }
            n => Some(n),
        }
    }
    fn pre(p: PreTokenizerWrapper) -> PreTokenizerWrapper {
        match p {
            PreTokenizerWrapper::Metaspace(mut m) => {
                m.prepend_scheme = pre_tokenizers::metaspace::PrependScheme::Never;
                PreTokenizerWrapper::Metaspace(m)
            }
            PreTokenizerWrapper::Sequence(s) => PreTokenizerWrapper::Sequence(pre_tokenizers::sequence::Sequence::new(
                s.as_ref().iter().map(|p| pre(p.clone())).collect(),
            )),
            p => p,
        }
    }
    if let Some(n) = hf.get_normalizer().cloned() {
        // Only a normalizer that cannot be set fails here; the original one then stays.
        let _ = hf.with_normalizer(norm(n));
    }
    if let Some(p) = hf.get_pre_tokenizer().cloned() {
        hf.with_pre_tokenizer(Some(pre(p)));
    }
    hf
}

#[cfg(test)]
mod tests {
    use super::ascii_classes;

    #[test]
    fn perl_digit_and_word_classes_become_ascii_in_and_out_of_brackets() {
        let cases = [
            (r"\(\d{3}\) \d{3}-\d{4}", r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}"),
            (r"\w+\W\D", r"[0-9A-Za-z_]+[^0-9A-Za-z_][^0-9]"),
            (r"[\d.-]+", r"[0-9.-]+"),
            (r"[^\w\s]", r"[^0-9A-Za-z_\s]"),
            (r"[a\D]", r"[a[:^digit:]]"),
            (r"\\d\s\p{L}", r"\\d\s\p{L}"),
            (r"[]\d]", r"[]0-9]"),
            (r"[[:alpha:]\d]x", r"[[:alpha:]0-9]x"),
            (r"\[\d\]", r"\[[0-9]\]"),
        ];
        for (rx, want) in cases {
            assert_eq!(ascii_classes(rx), want, "{rx}");
        }
    }
}
