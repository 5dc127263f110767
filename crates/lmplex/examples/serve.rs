//! Serves one checkpoint over the OpenAI-compatible API until Ctrl-C or SIGTERM:
//! `cargo run --release -p lmplex --example serve -- MODEL_PATH [PORT]`. Clients ask for the
//! model by its path (or see `GET /v1/models`).

use lmplex::server::{run, ServerConfig};
use lmplex::ModelConfig;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: serve MODEL_PATH [PORT]")?;
    let mut config = ServerConfig::new(vec![ModelConfig::new(path)]);
    if let Some(port) = args.next() {
        config.port = port.parse()?;
    }
    run(config, None)?;
    Ok(())
}
