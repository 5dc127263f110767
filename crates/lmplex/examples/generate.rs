//! Prints the completion of a prompt: `cargo run --release -p lmplex --example generate --
//! MODEL_PATH "prompt" [MAX_TOKENS]`, MODEL_PATH a `.gguf` file or a Hugging Face folder. A model
//! with a chat template gets the prompt as one user message; greedy decoding.

use lmplex::{ChatMessage, Engine, ModelConfig, Prompt, Request, SamplingParams};
use std::io::Write;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [path, prompt, rest @ ..] = args.as_slice() else {
        return Err("usage: generate MODEL_PATH PROMPT [MAX_TOKENS]".into());
    };
    let max_tokens = rest.first().map(|n| n.parse()).transpose()?.unwrap_or(128);
    let engine = Engine::new(ModelConfig::new(path.clone()))?;
    let message = ChatMessage::new("user", prompt.clone());
    let prompt = if engine.tokenizer().has_chat_template() {
        Prompt::Messages(vec![message])
    } else {
        Prompt::Text(prompt.clone())
    };
    let mut out = std::io::stdout().lock();
    for chunk in engine.stream(&Request::new(prompt, SamplingParams::greedy(max_tokens)))? {
        out.write_all(chunk?.text.as_bytes())?;
        out.flush()?;
    }
    writeln!(out)?;
    Ok(())
}
