//! `lmplex-server`: the OpenAI-compatible server as a standalone binary.
//!
//! `lmplex-server --config models.toml` or `lmplex-server MODEL_PATH [--name NAME]
//! [--host H] [--port P] [--max-model-len N] [--max-model-concurrency N] [--api-key KEY]...
//! [--scheduling-policy fcfs|priority|fair] [--allowed-media-domains HOST[,HOST...]]...
//! [--media-fetch-timeout-s S] [--max-concurrent-media-fetches N]`. Model ids are paths here (the
//! Python `lmplex serve` also resolves aliases). `LMPLEX_API_KEY` adds a key as `--api-key` does.
//! Every option takes exactly one value, so none swallows `MODEL_PATH`: `--allowed-media-domains`
//! (vLLM's flag) takes one host or a comma-separated list, may be repeated, and the hosts of all
//! its uses replace the config's list; it and the two media settings apply with `--config` too.
//! Exit status 2 on a bad command line, config or model; 0 after a drained shutdown.
//! `--log-format json` writes JSON lines; the log filter comes from `LMPLEX_LOG` or `RUST_LOG`
//! (default `info`).

use lmplex_core::{ModelConfig, SchedulingPolicy};
use lmplex_server::logging::{self, LogFormat};
use lmplex_server::ServerConfig;

const USAGE: &str = "usage: lmplex-server (--config FILE.toml | MODEL_PATH [--name NAME]) \
[--host HOST] [--port PORT] [--max-model-len N] [--max-model-concurrency N] [--api-key KEY]... \
[--scheduling-policy fcfs|priority|fair] [--allowed-media-domains HOST[,HOST...]]... \
[--media-fetch-timeout-s S] [--max-concurrent-media-fetches N] [--log-format text|json]";

fn parse(args: &[String]) -> Result<(ServerConfig, LogFormat), String> {
    let mut it = args.iter();
    let mut log_format = LogFormat::Text;
    let (mut config, mut model, mut name) = (None, None, None);
    let (mut host, mut port, mut len, mut conc) = (None, None, None, None);
    let (mut keys, mut policy, mut media_hosts) = (Vec::new(), None, None::<Vec<String>>);
    let (mut media_timeout, mut media_fetches) = (None, None);
    while let Some(a) = it.next() {
        let mut value = || it.next().cloned().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--allowed-media-domains" => {
                let list = value()?;
                let hosts: Vec<String> =
                    list.split(',').map(str::trim).filter(|h| !h.is_empty()).map(String::from).collect();
                if hosts.is_empty() {
                    return Err(format!("{a} needs a host (or a comma-separated list), got '{list}'"));
                }
                media_hosts.get_or_insert_with(Vec::new).extend(hosts);
            }
            "--media-fetch-timeout-s" => {
                media_timeout = Some(value()?.parse::<f64>().map_err(|e| format!("--media-fetch-timeout-s: {e}"))?)
            }
            "--max-concurrent-media-fetches" => {
                let n = value()?.parse::<usize>().map_err(|e| format!("--max-concurrent-media-fetches: {e}"))?;
                media_fetches = Some(n)
            }
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
    cfg.media_fetch_timeout_s = media_timeout.or(cfg.media_fetch_timeout_s);
    cfg.max_concurrent_media_fetches = media_fetches.or(cfg.max_concurrent_media_fetches);
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

    /// `--allowed-media-domains` takes one value (a host or a comma-separated list) per use and
    /// never the model path after it; its uses add up and replace the config's list.
    #[test]
    fn media_hosts_take_one_value_each_and_leave_the_model_path() {
        let (cfg, _) = parse(&args(&["--allowed-media-domains", "A.example", "m.gguf", "--port", "0"])).unwrap();
        assert_eq!(cfg.models[0].model_id, "m.gguf");
        assert_eq!((cfg.allowed_media_domains.as_slice(), cfg.port), (&["A.example".to_string()][..], 0));
        let (cfg, _) = parse(&args(&[
            "--allowed-media-domains",
            "a.example, b.example",
            "m.gguf",
            "--allowed-media-domains",
            "127.0.0.1",
        ]))
        .unwrap();
        assert_eq!(cfg.allowed_media_domains, ["a.example", "b.example", "127.0.0.1"]);
        let e = parse(&args(&["m.gguf", "--allowed-media-domains", ","])).unwrap_err();
        assert!(e.contains("needs a host"), "{e}");
        let e = parse(&args(&["m.gguf", "--allowed-media-domains"])).unwrap_err();
        assert!(e.contains("needs a value"), "{e}");
        let e = parse(&args(&["m.gguf", "--allowed-media-domains", "http://a.example"])).unwrap_err();
        assert!(e.contains("allowed_media_domains: 'http://a.example'"), "{e}");
    }

    /// With `--config`, the media flags override the file's keys.
    #[test]
    fn media_flags_override_the_config_file() {
        let dir = std::env::temp_dir().join(format!("lmplex-server-main-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("media.toml");
        let toml =
            "allowed_media_domains = [\"old.example\"]\nmedia_fetch_timeout_s = 9\n[[models]]\nmodel_id = \"m\"\n";
        std::fs::write(&file, toml).unwrap();
        let path = file.to_str().unwrap();
        let (kept, _) = parse(&args(&["--config", path])).unwrap();
        assert_eq!(
            (kept.allowed_media_domains.as_slice(), kept.media_fetch_timeout_s),
            (&["old.example".into()][..], Some(9.0))
        );
        let flags = [
            "--config",
            path,
            "--allowed-media-domains",
            "new.example",
            "--media-fetch-timeout-s",
            "2.5",
            "--max-concurrent-media-fetches",
            "4",
        ];
        let (cfg, _) = parse(&args(&flags)).unwrap();
        assert_eq!(cfg.allowed_media_domains, ["new.example"]);
        assert_eq!((cfg.media_fetch_timeout_s, cfg.max_concurrent_media_fetches), (Some(2.5), Some(4)));
        let e = parse(&args(&["--config", path, "--max-concurrent-media-fetches", "0"])).unwrap_err();
        assert!(e.contains("max_concurrent_media_fetches must be at least 1"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
