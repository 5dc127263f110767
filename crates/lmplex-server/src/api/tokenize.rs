//! The bodies of vLLM's `POST /tokenize` and `POST /detokenize`: a prompt (text, or chat
//! messages rendered with the model's template) to token ids, and token ids back to text.
//!
//! Invariant: the defaults are vLLM's and the engine's: a text prompt gets the tokenizer's
//! special tokens (`add_special_tokens` true); chat messages get none beyond what the template
//! writes (`add_special_tokens` false) and end with the generation prompt
//! (`add_generation_prompt` true), so the ids are the ones a chat call would run on.

use super::chat::{chat_messages, MessageInput};
use crate::error::ApiError;
use lmplex_core::{TokenId, Tool};
use lmplex_engine::{ChatMessage, Tokenizer};
use serde::Deserialize;

/// The body of `POST /tokenize`: `prompt` or `messages`, not both.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct TokenizeRequest {
    /// The served model whose tokenizer to use; may be left out when the server serves one.
    #[serde(default, deserialize_with = "super::null_as_empty")]
    pub model: String,
    /// Text to tokenize as it is.
    pub prompt: Option<String>,
    /// Chat messages, rendered with the model's chat template first.
    pub messages: Option<Vec<MessageInput>>,
    /// Add the tokenizer's special tokens (BOS); default true for `prompt`, false for `messages`.
    pub add_special_tokens: Option<bool>,
    /// End the rendered messages with the assistant's turn (default true).
    pub add_generation_prompt: Option<bool>,
    /// vLLM's: end the rendered messages inside the final one, right after its content, so the
    /// model would continue it (with `add_generation_prompt: false`).
    pub continue_final_message: Option<bool>,
    /// Tools shown to the template, as a chat call's `tools`.
    pub tools: Option<Vec<Tool>>,
    /// Also return each token's text (`token_strs`).
    pub return_token_strs: Option<bool>,
    /// The images fetched for `messages`' image URLs, as for chat; not a field of the body.
    #[serde(skip)]
    pub images: crate::media::Fetched,
}

/// The body of `POST /detokenize`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct DetokenizeRequest {
    /// The served model whose tokenizer to use; may be left out when the server serves one.
    #[serde(default, deserialize_with = "super::null_as_empty")]
    pub model: String,
    /// The token ids to turn into text.
    pub tokens: Vec<TokenId>,
}

/// What a tokenize body asks for, checked.
enum Input {
    Text(String),
    Chat(Vec<ChatMessage>),
}

impl TokenizeRequest {
    /// The token ids `tokenizer` gives this body's prompt or messages.
    pub fn tokenize(&self, tokenizer: &Tokenizer) -> Result<Vec<TokenId>, ApiError> {
        let input = match (&self.prompt, &self.messages) {
            (Some(p), None) => Input::Text(p.clone()),
            (None, Some(m)) => Input::Chat(chat_messages(m, &self.images)?),
            (Some(_), Some(_)) => return Err(ApiError::invalid_param("messages", "give prompt or messages, not both")),
            (None, None) => return Err(ApiError::invalid_param("prompt", "give prompt (text) or messages (chat)")),
        };
        let ids = match input {
            Input::Text(text) => tokenizer.encode(&text, self.add_special_tokens.unwrap_or(true)),
            Input::Chat(messages) => {
                let tools = self.tools.as_deref().unwrap_or_default();
                let generation = self.add_generation_prompt.unwrap_or(true);
                let continuing = self.continue_final_message.unwrap_or(false);
                if generation && continuing {
                    return Err(ApiError::invalid_param(
                        "continue_final_message",
                        "continue_final_message and add_generation_prompt cannot both be true",
                    ));
                }
                tokenizer
                    .apply_chat_template_with_tools(&messages, tools, generation)
                    .and_then(|text| match continuing {
                        true => lmplex_engine::continue_final_message(&text, &messages),
                        false => Ok(text),
                    })
                    .and_then(|text| tokenizer.encode(&text, self.add_special_tokens.unwrap_or(false)))
            }
        };
        ids.map_err(ApiError::from)
    }
}

impl DetokenizeRequest {
    /// The text of `tokens` (special tokens kept, as vLLM's `/detokenize` gives them).
    pub fn detokenize(&self, tokenizer: &Tokenizer) -> Result<String, ApiError> {
        let vocab = tokenizer.vocab_size();
        if let Some(bad) = self.tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(ApiError::invalid_param(
                "tokens",
                format!("token id {bad} is outside the vocabulary (size {vocab})"),
            ));
        }
        tokenizer.decode(&self.tokens, false).map_err(ApiError::from)
    }
}
