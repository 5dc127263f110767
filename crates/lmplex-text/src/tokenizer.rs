//! `Tokenizer`: text <-> token ids, the chat template and the special-token facts of a model,
//! from a GGUF file or an HF folder (`tokenizer.json`, `tokenizer_config.json`,
//! `generation_config.json`).
//!
//! Invariants: `encode(text, true)` adds BOS only when the checkpoint asks for it
//! (`add_bos_token`), never twice; chat prompts are rendered by the template (which writes its
//! own BOS) and encoded without adding special tokens. `eos_token_ids` is never empty after
//! loading (a model with no known EOS cannot stop) unless the checkpoint names none.

use crate::chat::{ChatMessage, ChatTemplate};
use crate::gguf_tokenizer::GgufTokenizer;
use lmplex_core::{Error, Result, TokenId};
use std::path::Path;

/// A model's tokenizer with its special tokens and chat template; see the module docs.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// Add BOS ourselves (GGUF); HF tokenizers do it in their post-processor.
    add_bos_manually: bool,
    /// The BOS token, if the checkpoint names one.
    pub bos_token_id: Option<TokenId>,
    /// Every token that ends generation: the checkpoint's EOS ids and its template's end-of-turn ones.
    pub eos_token_ids: Vec<TokenId>,
    chat_template: Option<ChatTemplate>,
}

fn tok_err(e: impl std::fmt::Display) -> Error {
    Error::invalid(format!("tokenizer: {e}"))
}

impl Tokenizer {
    /// From a GGUF file's tokenizer; `extra_eos` are EOS ids added to the GGUF's own.
    pub fn from_gguf(g: GgufTokenizer, extra_eos: &[TokenId]) -> Result<Self> {
        let bos_str = g.bos_token_id.and_then(|id| g.tokenizer.id_to_token(id));
        let mut eos_ids: Vec<TokenId> = g.eos_token_id.into_iter().collect();
        eos_ids.extend(extra_eos.iter().copied().filter(|e| Some(*e) != g.eos_token_id));
        let eos_str = g.eos_token_id.and_then(|id| g.tokenizer.id_to_token(id));
        let chat_template = g
            .chat_template
            .map(|t| ChatTemplate::new(t, bos_str.unwrap_or_default(), eos_str.unwrap_or_default()))
            .transpose()?;
        let mut tok = Self {
            inner: g.tokenizer,
            add_bos_manually: g.add_bos_token,
            bos_token_id: g.bos_token_id,
            eos_token_ids: eos_ids,
            chat_template,
        };
        tok.add_template_end_tokens();
        Ok(tok)
    }

    /// `dir` holds `tokenizer.json` and optionally `tokenizer_config.json`; `eos_from_config`
    /// are the ids from `config.json`/`generation_config.json`.
    pub fn from_hf_dir(dir: &Path, eos_from_config: &[TokenId], bos_from_config: Option<TokenId>) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        if !path.exists() {
            return Err(Error::model_load(format!("{}: missing tokenizer.json", dir.display())));
        }
        let inner = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| Error::model_load(format!("{}: cannot read tokenizer: {e}", path.display())))?;
        let cfg: serde_json::Value = match std::fs::read_to_string(dir.join("tokenizer_config.json")) {
            Ok(s) => serde_json::from_str(&s)
                .map_err(|e| Error::model_load(format!("{}: tokenizer_config.json: {e}", dir.display())))?,
            Err(_) => serde_json::Value::Null,
        };
        // Special tokens may be strings or {"content": ...} objects.
        let token_str = |key: &str| -> Option<String> {
            match cfg.get(key)? {
                serde_json::Value::String(s) => Some(s.clone()),
                o => o.get("content").and_then(|c| c.as_str()).map(str::to_string),
            }
        };
        let bos_str = token_str("bos_token");
        let eos_str = token_str("eos_token");
        let mut eos_ids: Vec<TokenId> = eos_from_config.to_vec();
        if let Some(id) = eos_str.as_deref().and_then(|s| inner.token_to_id(s)) {
            if !eos_ids.contains(&id) {
                eos_ids.push(id);
            }
        }
        let bos_token_id = bos_from_config.or_else(|| bos_str.as_deref().and_then(|s| inner.token_to_id(s)));
        let template = crate::chat::folder_template(&cfg, dir);
        let chat_template = template
            .map(|t| ChatTemplate::new(t, bos_str.unwrap_or_default(), eos_str.unwrap_or_default()))
            .transpose()?;
        let mut tok = Self { inner, add_bos_manually: false, bos_token_id, eos_token_ids: eos_ids, chat_template };
        tok.add_template_end_tokens();
        Ok(tok)
    }

    /// Chat models end a turn with a token (`<|im_end|>`, `<|eot_id|>`, `<|end|>`) that the
    /// checkpoint does not always list as EOS; add it when the template uses it.
    fn add_template_end_tokens(&mut self) {
        let Some(t) = &self.chat_template else { return };
        for name in ["<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>"] {
            if t.source().contains(name) {
                if let Some(id) = self.inner.token_to_id(name) {
                    if !self.eos_token_ids.contains(&id) {
                        self.eos_token_ids.push(id);
                    }
                }
            }
        }
    }

    /// The underlying Hugging Face tokenizer.
    pub fn hf(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// An upper bound on the bytes of text one token can stand for: 4 UTF-8 bytes for each
    /// character of the longest vocabulary entry (byte-level tokens spell one byte per
    /// character), times 3 for a normalizer that shrinks text (NFKC maps a 3-byte full-width
    /// `Ａ` to `A`). A text longer than `max_model_len` times this cannot fit, whatever it says.
    pub fn max_bytes_per_token(&self) -> usize {
        let longest = self.inner.get_vocab(true).keys().map(|t| t.chars().count()).max().unwrap_or(1);
        12 * longest.max(1)
    }

    /// Tokens in the vocabulary, added tokens included (may differ from the model's `vocab_size`).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Token ids of `text`; `add_special_tokens` adds BOS where the checkpoint asks for it.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<TokenId>> {
        let enc = self.inner.encode(text, add_special_tokens && !self.add_bos_manually).map_err(tok_err)?;
        let mut ids = enc.get_ids().to_vec();
        if add_special_tokens && self.add_bos_manually {
            if let Some(bos) = self.bos_token_id {
                if ids.first() != Some(&bos) {
                    ids.insert(0, bos);
                }
            }
        }
        Ok(ids)
    }

    /// Text of `ids`; `skip_special_tokens` leaves special (control) tokens out.
    pub fn decode(&self, ids: &[TokenId], skip_special_tokens: bool) -> Result<String> {
        self.inner.decode(ids, skip_special_tokens).map_err(tok_err)
    }

    /// The token's own text, as shown in logprobs (byte-level pieces decoded).
    pub fn token_text(&self, id: TokenId) -> String {
        self.inner.decode(&[id], false).unwrap_or_default()
    }

    /// Whether `id` is a special (control) token; false for unknown ids.
    pub fn is_special(&self, id: TokenId) -> bool {
        self.inner.get_added_vocabulary().is_special_token(&self.inner.id_to_token(id).unwrap_or_default())
    }

    /// The id of `text` when it is one special (control) token of the vocabulary.
    pub fn special_token_id(&self, text: &str) -> Option<TokenId> {
        self.inner.token_to_id(text).filter(|&id| self.is_special(id))
    }

    /// A fill-in-the-middle prompt (prefix, suffix, middle order, after BOS if the model takes
    /// one) from the model's FIM tokens; an `InvalidRequest` naming `suffix` if it has none.
    pub fn infill(&self, prefix: &str, suffix: &str) -> Result<Vec<TokenId>> {
        let ids = |t: &[&str; 3]| -> Option<[TokenId; 3]> {
            Some([self.special_token_id(t[0])?, self.special_token_id(t[1])?, self.special_token_id(t[2])?])
        };
        let [pre, suf, mid] = FIM_TOKENS.iter().find_map(ids).ok_or_else(|| {
            Error::invalid(
                "suffix needs a fill-in-the-middle model (one with FIM tokens such as <|fim_prefix|>, \
                 e.g. Qwen2.5-Coder or StarCoder); this model has none",
            )
        })?;
        let mut out = self.encode("", true)?;
        out.push(pre);
        out.extend(self.encode(prefix, false)?);
        out.push(suf);
        out.extend(self.encode(suffix, false)?);
        out.push(mid);
        Ok(out)
    }

    /// The chat template's Jinja source, if the checkpoint ships one.
    pub fn chat_template_source(&self) -> Option<&str> {
        self.chat_template.as_ref().map(|t| t.source())
    }

    /// Whether the checkpoint ships a chat template.
    pub fn has_chat_template(&self) -> bool {
        self.chat_template.is_some()
    }

    /// Renders `messages` with the chat template; an `InvalidRequest` error if the model has none.
    pub fn apply_chat_template(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.apply_chat_template_with_tools(messages, &[], add_generation_prompt)
    }

    /// `apply_chat_template` with the `tools` offered to the model.
    pub fn apply_chat_template_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: &[lmplex_core::Tool],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let t = self
            .chat_template
            .as_ref()
            .ok_or_else(|| Error::invalid("this model has no chat template: send a plain text prompt"))?;
        t.render(messages, tools, add_generation_prompt)
    }

    /// `apply_chat_template_with_tools` with more template variables (`chat_template_kwargs`).
    pub fn apply_chat_template_with(
        &self,
        messages: &[ChatMessage],
        tools: &[lmplex_core::Tool],
        add_generation_prompt: bool,
        kwargs: &crate::chat::ChatTemplateKwargs,
    ) -> Result<String> {
        let t = self
            .chat_template
            .as_ref()
            .ok_or_else(|| Error::invalid("this model has no chat template: send a plain text prompt"))?;
        t.render_with(messages, tools, add_generation_prompt, kwargs)
    }

    /// The id of `text` when it is one token of the vocabulary (an added token such as
    /// `<think>`, whether special or not).
    pub fn token_id(&self, text: &str) -> Option<TokenId> {
        self.inner.token_to_id(text)
    }
}

/// The fill-in-the-middle special tokens (prefix, suffix, middle) of the code models that have
/// them, in the order `Tokenizer::infill` tries them.
const FIM_TOKENS: [[&str; 3]; 3] = [
    ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"], // Qwen2.5-Coder, Qwen3-Coder
    ["<fim_prefix>", "<fim_suffix>", "<fim_middle>"],       // StarCoder, SantaCoder
    ["<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"], // DeepSeek-Coder
];

/// Turns a growing list of token ids into text deltas, never splitting a UTF-8 character
/// (vLLM's prefix/read offsets: text is emitted only once it no longer ends in U+FFFD).
pub struct IncrementalDecoder {
    ids: Vec<TokenId>,
    prefix_offset: usize,
    read_offset: usize,
    skip_special_tokens: bool,
}

impl IncrementalDecoder {
    /// An empty decoder; `skip_special_tokens` as in `Tokenizer::decode`.
    pub fn new(skip_special_tokens: bool) -> Self {
        Self { ids: Vec::new(), prefix_offset: 0, read_offset: 0, skip_special_tokens }
    }

    /// Adds one token; returns the text it completes (possibly empty).
    pub fn step(&mut self, tok: &Tokenizer, id: TokenId) -> Result<String> {
        self.ids.push(id);
        let prefix = tok.decode(&self.ids[self.prefix_offset..self.read_offset], self.skip_special_tokens)?;
        let full = tok.decode(&self.ids[self.prefix_offset..], self.skip_special_tokens)?;
        if full.len() > prefix.len() && !full.ends_with('\u{FFFD}') {
            if let Some(delta) = full.get(prefix.len()..) {
                let delta = delta.to_string();
                self.prefix_offset = self.read_offset;
                self.read_offset = self.ids.len();
                return Ok(delta);
            }
        }
        Ok(String::new())
    }

    /// Whatever is still held back (an incomplete character at the very end).
    pub fn flush(&mut self, tok: &Tokenizer) -> Result<String> {
        let prefix = tok.decode(&self.ids[self.prefix_offset..self.read_offset], self.skip_special_tokens)?;
        let full = tok.decode(&self.ids[self.prefix_offset..], self.skip_special_tokens)?;
        self.prefix_offset = self.ids.len();
        self.read_offset = self.ids.len();
        Ok(full.get(prefix.len()..).unwrap_or_default().to_string())
    }
}
