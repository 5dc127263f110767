//! `lmplex-server`: the OpenAI-compatible server as a standalone binary.
//!
//! `lmplex-server --config models.toml` or `lmplex-server MODEL_PATH [--name NAME]
//! [--host H] [--port P] [--max-model-len N] [--max-model-concurrency N] [--api-key KEY]...
//! [--scheduling-policy fcfs|priority|fair] [--allowed-media-domains HOST...]`. Model ids are
//! paths here (the Python `lmplex serve` also resolves aliases). `LMPLEX_API_KEY` adds a key as
//! `--api-key` does; `--allowed-media-domains` (vLLM's flag) takes the hosts up to the next option
//! and replaces the config's list. Exit status 2 on a bad command line, config or model; 0 after a
//! drained shutdown. `--log-format json` writes JSON lines; the log filter comes from `LMPLEX_LOG`
//! or `RUST_LOG` (default `info`).

use lmplex_core::{ModelConfig, SchedulingPolicy};
use lmplex_server::logging::{self, LogFormat};
use lmplex_server::ServerConfig;

const USAGE: &str = "usage: lmplex-server (--config FILE.toml | MODEL_PATH [--name NAME]) \
[--host HOST] [--port PORT] [--max-model-len N] [--max-model-concurrency N] [--api-key KEY]... \
[--scheduling-policy fcfs|priority|fair] [--allowed-media-domains HOST...] [--log-format text|json]";

fn parse(args: &[String]) -> Result<(ServerConfig, LogFormat), String> {
    let mut it = args.iter().peekable();
    let mut log_format = LogFormat::Text;
    let (mut config, mut model, mut name) = (None, None, None);
    let (mut host, mut port, mut len, mut conc) = (None, None, None, None);
    let (mut keys, mut policy, mut media_hosts) = (Vec::new(), None, None);
    while let Some(a) = it.next() {
        if a == "--allowed-media-domains" {
            let hosts: Vec<String> = std::iter::from_fn(|| it.next_if(|h| !h.starts_with('-'))).cloned().collect();
            if hosts.is_empty() {
                return Err(format!("{a} needs at least one host"));
            }
            media_hosts = Some(hosts);
            continue;
        }
        let mut value = || it.next().cloned().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--config" => config = Some(value()?),
            "--name" => name = Some(value()?),
            "--host" => host = Some(value()?),
            "--api-key" => keys.push(value()?),
            "--scheduling-policy" => policy = Some(SchedulingPolicy::parse(&value()?).map_err(|e| e.to_string())?),
            "--log-format" => log_format = LogFormat::parse(&value()?).map_err(|e| e.to_string())?,
            "--port" => port = Some(value()?.parse::<u16>().map_err(|e| format!("--port: {e}"))?),
            "--max-model-len" => len = Some(value()?.parse::<usize>().map_err(|e| format!("--max-model-len: {e}"))?),
            "--max-model-concurrency" => {
                conc = Some(value()?.parse::<usize>().map_err(|e| format!("--max-model-concurrency: {e}"))?)
            }
            "-h" | "--help" => return Err(USAGE.into()),
            s if s.starts_with('-') => return Err(format!("unknown option {s}\n{USAGE}")),
            s => model = Some(s.to_string()),
        }
    }
    let mut cfg = match (config, model) {
        (Some(path), None) => {
            let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
            ServerConfig::from_toml(&text).map_err(|e| e.to_string())?
        }
        (None, Some(model_id)) => {
            let mut m = ModelConfig::new(model_id);
            m.served_model_name = name;
            m.max_model_len = len;
            if let Some(n) = conc {
                m.max_model_concurrency = n;
            }
            ServerConfig::new(vec![m])
        }
        _ => return Err(USAGE.into()),
    };
    if let Some(h) = host {
        cfg.host = h;
    }
    if let Some(p) = port {
        cfg.port = p;
    }
    keys.extend(std::env::var("LMPLEX_API_KEY").ok().filter(|k| !k.is_empty()));
    cfg.api_keys.extend(keys);
    cfg.scheduling_policy = policy.or(cfg.scheduling_policy);
    if let Some(hosts) = media_hosts {
        cfg.allowed_media_domains = hosts;
    }
    cfg.validate().map_err(|e| e.to_string())?;
    Ok((cfg, log_format))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (cfg, log_format) = match parse(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = logging::init(log_format) {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
    if let Err(e) = lmplex_server::run(cfg, None) {
        tracing::error!("{e}");
        std::process::exit(2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    /// `--allowed-media-domains` takes the hosts up to the next option, and at least one.
    #[test]
    fn media_hosts_run_to_the_next_option() {
        let (cfg, _) =
            parse(&args(&["m.gguf", "--allowed-media-domains", "A.example", "b.example", "--port", "0"])).unwrap();
        assert_eq!(
            (cfg.allowed_media_domains.as_slice(), cfg.port),
            (&["A.example".into(), "b.example".into()][..], 0)
        );
        let e = parse(&args(&["m.gguf", "--allowed-media-domains", "--port", "0"])).unwrap_err();
        assert!(e.contains("needs at least one host"), "{e}");
        let e = parse(&args(&["m.gguf", "--allowed-media-domains", "http://a.example"])).unwrap_err();
        assert!(e.contains("allowed_media_domains: 'http://a.example'"), "{e}");
    }
}
