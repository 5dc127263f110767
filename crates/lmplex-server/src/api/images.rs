//! Where each body gives images by URL (`media::WithImages`): chat's and `/tokenize`'s
//! `image_url` parts, the Responses API's `input_image` parts and Anthropic's `image` blocks with
//! a `url` source. Completions take no image.
//!
//! Invariant: a URL listed here is one the body's conversion to chat messages reads (the same
//! parts, the same fields), so every fetched image is used and every `http(s)` image URL the
//! conversion meets was fetched (for counting: checked, `media::check_images`) or refused first.

use super::{ChatRequest, CompletionRequest, ContentInput, MessageInput, MessagesRequest, ResponsesRequest};
use super::{ResponsesInput, TokenizeRequest};
use crate::media::{is_fetched_scheme, Fetched, WithImages};
use serde_json::Value;

/// The `http(s)` URLs of `messages`' `image_url` parts.
fn chat_image_urls(messages: &[MessageInput]) -> Vec<&str> {
    let parts = messages.iter().filter_map(|m| match &m.content {
        Some(ContentInput::Parts(parts)) => Some(parts),
        _ => None,
    });
    let urls = parts.flatten().filter(|p| p.kind == "image_url").filter_map(|p| p.image_url.as_ref());
    urls.map(|u| u.url.as_str()).filter(|u| is_fetched_scheme(u)).collect()
}

impl WithImages for ChatRequest {
    fn image_urls(&self) -> Vec<&str> {
        chat_image_urls(&self.messages)
    }
    fn set_images(&mut self, images: Fetched) {
        self.images = images;
    }
}

impl WithImages for TokenizeRequest {
    fn image_urls(&self) -> Vec<&str> {
        self.messages.as_deref().map(chat_image_urls).unwrap_or_default()
    }
    fn set_images(&mut self, images: Fetched) {
        self.images = images;
    }
}

impl WithImages for CompletionRequest {}

impl WithImages for ResponsesRequest {
    const PARAM: &'static str = "input";
    const PART: &'static str = "input_image";

    fn image_urls(&self) -> Vec<&str> {
        let ResponsesInput::Items(items) = &self.input else { return Vec::new() };
        let messages = items.iter().filter(|i| i.get("type").and_then(Value::as_str).unwrap_or("message") == "message");
        let parts = messages.filter_map(|m| m.get("content").and_then(Value::as_array)).flatten();
        let images = parts.filter(|p| p.get("type").and_then(Value::as_str) == Some("input_image"));
        images.filter_map(|p| p.get("image_url").and_then(Value::as_str)).filter(|u| is_fetched_scheme(u)).collect()
    }
    fn set_images(&mut self, images: Fetched) {
        self.images = images;
    }
}

impl WithImages for MessagesRequest {
    const PART: &'static str = "image";

    fn image_urls(&self) -> Vec<&str> {
        let user = self.messages.iter().filter(|m| m.role == "user");
        let blocks = user.filter_map(|m| m.content.as_array()).flatten();
        let images = blocks.filter(|b| b.get("type").and_then(Value::as_str) == Some("image"));
        let sources = images.filter_map(|b| b.get("source"));
        let urls = sources.filter(|s| s.get("type").and_then(Value::as_str) == Some("url"));
        urls.filter_map(|s| s.get("url").and_then(Value::as_str)).filter(|u| is_fetched_scheme(u)).collect()
    }
    fn set_images(&mut self, images: Fetched) {
        self.images = images;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each body lists the `http(s)` URLs of its image parts, and no other URL or part.
    #[test]
    fn each_body_lists_its_image_urls() {
        let chat: ChatRequest = serde_json::from_value(serde_json::json!({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://h/a.png"}},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGk="}},
            {"type": "text", "text": "http://not/an/image"},
            {"type": "image_url", "image_url": {"url": "HTTP://h/b.png"}},
        ]}]}))
        .unwrap();
        assert_eq!(chat.image_urls(), ["https://h/a.png", "HTTP://h/b.png"]);
        let responses = ResponsesRequest::parse(
            br#"{"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://h/c"},
                {"type": "input_text", "text": "hi"}]},
                {"type": "function_call_output", "call_id": "x",
                 "output": [{"type": "input_image", "image_url": "http://h/d"}]}]}"#,
        )
        .unwrap();
        assert_eq!(responses.image_urls(), ["http://h/c"]);
        let messages = MessagesRequest::parse(
            br#"{"max_tokens": 4, "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "url", "url": "https://h/e"}},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "aGk="}}]}]}"#,
            true,
        )
        .unwrap();
        assert_eq!(messages.image_urls(), ["https://h/e"]);
    }
}
