//! Pooling a prompt's final hidden states (after the final norm: what a Hugging Face
//! `AutoModel` returns as `last_hidden_state`) into one embedding, chunk by chunk as the
//! prompt is prefilled.
//!
//! Invariants: each prompt position is added once, in position order, whatever the chunking
//! (a chunk computed again after a preemption adds nothing), so the vector depends on the
//! prompt alone, never on the batch or the step budget; `Mean` sums in f64.

use lmplex_core::{Error, Pooling, Result};
use std::path::Path;

/// The pooling a sentence-transformers folder declares: its `modules.json`'s `Pooling` module
/// (`1_Pooling` when there is no `modules.json`), whose `config.json` sets one
/// `pooling_mode_*`; `None` when `dir` is not such a folder (or is a file). A mode lmplex does
/// not pool by (`cls`, `max`, weighted mean) is an error naming it.
pub fn sentence_transformers(dir: &Path) -> Result<Option<Pooling>> {
    let read = |p: &Path| -> Result<Option<serde_json::Value>> {
        match std::fs::read_to_string(p) {
            Ok(t) => serde_json::from_str(&t)
                .map(Some)
                .map_err(|e| Error::ModelLoad(format!("{}: not valid JSON: {e}", p.display()))),
            Err(_) => Ok(None),
        }
    };
    if !dir.is_dir() {
        return Ok(None);
    }
    let module = read(&dir.join("modules.json"))?
        .and_then(|m| {
            m.as_array()?.iter().find_map(|m| {
                let t = m.get("type")?.as_str()?;
                t.ends_with("models.Pooling").then(|| m.get("path")?.as_str().map(str::to_string))?
            })
        })
        .unwrap_or_else(|| "1_Pooling".to_string());
    let path = dir.join(&module).join("config.json");
    let Some(config) = read(&path)? else { return Ok(None) };
    let on = |key: &str| config.get(key).and_then(serde_json::Value::as_bool).unwrap_or(false);
    if on("pooling_mode_lasttoken") {
        return Ok(Some(Pooling::Last));
    }
    if on("pooling_mode_mean_tokens") {
        return Ok(Some(Pooling::Mean));
    }
    let other = ["pooling_mode_cls_token", "pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens"];
    match other.iter().find(|k| on(k)) {
        Some(k) => Err(Error::ModelLoad(format!(
            "{}: {k} is not a pooling lmplex has (last or mean): set pooling in the model's config",
            path.display()
        ))),
        None => Ok(None),
    }
}

/// One prompt's pooling state; see the module docs.
#[derive(Debug, Clone)]
pub struct Pooler {
    mode: Pooling,
    hidden: usize,
    /// `Mean`: the sum of positions `0..next`.
    sum: Vec<f64>,
    /// The next position `add` expects.
    next: usize,
    /// `Last`: the last position's state.
    last: Vec<f32>,
}

impl Pooler {
    /// Pools `hidden`-wide states by `mode`.
    pub fn new(mode: Pooling, hidden: usize) -> Self {
        let sum = if mode == Pooling::Mean { vec![0.0; hidden] } else { Vec::new() };
        Self { mode, hidden, sum, next: 0, last: Vec::new() }
    }

    /// How it pools.
    pub fn mode(&self) -> Pooling {
        self.mode
    }

    /// Adds the states of positions `start..start + rows.len() / hidden` (`Mean`: every row of
    /// a chunk; `Last`: the prompt's last row, any earlier rows ignored).
    pub fn add(&mut self, start: usize, rows: &[f32]) {
        let h = self.hidden;
        match self.mode {
            Pooling::Last => {
                if let Some(row) = rows.chunks_exact(h).last() {
                    self.last = row.to_vec();
                }
            }
            Pooling::Mean => {
                for (i, row) in rows.chunks_exact(h).enumerate() {
                    if start + i != self.next {
                        continue; // computed before (a recomputed chunk), or out of order
                    }
                    self.sum.iter_mut().zip(row).for_each(|(s, &v)| *s += f64::from(v));
                    self.next += 1;
                }
            }
        }
    }

    /// The pooled vector (`hidden` elements) of a prompt whose every position was added.
    pub fn pooled(&self) -> Vec<f32> {
        match self.mode {
            Pooling::Last => self.last.clone(),
            Pooling::Mean => {
                let n = self.next.max(1) as f64;
                self.sum.iter().map(|&s| (s / n) as f32).collect()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_counts_each_position_once_whatever_the_chunks() {
        let rows: Vec<f32> = (0..8).map(|v| v as f32).collect(); // 4 positions of width 2
        let mut whole = Pooler::new(Pooling::Mean, 2);
        whole.add(0, &rows);
        let mut chunked = Pooler::new(Pooling::Mean, 2);
        chunked.add(0, &rows[..4]);
        chunked.add(0, &rows[..4]); // recomputed after a preemption
        chunked.add(2, &rows[4..]);
        assert_eq!(whole.pooled(), vec![3.0, 4.0]);
        assert_eq!(chunked.pooled(), whole.pooled());
        let mut last = Pooler::new(Pooling::Last, 2);
        last.add(3, &rows[6..]);
        assert_eq!(last.pooled(), vec![6.0, 7.0]);
    }

    #[test]
    fn sentence_transformers_folders_say_how_they_pool() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        assert_eq!(sentence_transformers(d).unwrap(), None, "not a sentence-transformers folder");
        std::fs::create_dir(d.join("1_Pooling")).unwrap();
        std::fs::write(d.join("1_Pooling/config.json"), r#"{"pooling_mode_mean_tokens": true}"#).unwrap();
        assert_eq!(sentence_transformers(d).unwrap(), Some(Pooling::Mean));
        // modules.json names the module's folder.
        std::fs::create_dir(d.join("pool")).unwrap();
        std::fs::write(d.join("pool/config.json"), r#"{"pooling_mode_lasttoken": true}"#).unwrap();
        let modules = r#"[{"idx": 1, "path": "pool", "type": "sentence_transformers.models.Pooling"}]"#;
        std::fs::write(d.join("modules.json"), modules).unwrap();
        assert_eq!(sentence_transformers(d).unwrap(), Some(Pooling::Last));
        std::fs::write(d.join("pool/config.json"), r#"{"pooling_mode_cls_token": true}"#).unwrap();
        let e = sentence_transformers(d).unwrap_err().to_string();
        assert!(e.contains("pool/config.json") && e.contains("pooling_mode_cls_token"), "{e}");
        std::fs::write(d.join("pool/config.json"), "{").unwrap();
        assert!(sentence_transformers(d).unwrap_err().to_string().contains("not valid JSON"));
        assert_eq!(sentence_transformers(&d.join("pool/config.json")).unwrap(), None, "a file");
    }
}
