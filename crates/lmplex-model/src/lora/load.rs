//! Reading a PEFT adapter folder (`adapter_config.json` + `adapter_model.safetensors`) against
//! the base's projections.
//!
//! Invariants: an adapter loads whole or not at all, and every refusal names the file and the
//! field or tensor: a module the config targets that the base lacks, a tensor for a module the
//! config does not target (or the base lacks: lmplex does not adapt MoE experts, embeddings or
//! the head), a shape that is not the base's (an adapter made for another model), a rank above
//! `max_rank`, an element type other than f32/f16/bf16, a corrupt or truncated file.

use super::{LoraAdapter, LoraConfig, LoraModule, LoraPair};
use lmplex_core::{Error, Result};
use lmplex_cpu::lora::LowRank;
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::path::Path;

fn err(path: &Path, what: impl std::fmt::Display) -> Error {
    Error::model_load(format!("{}: {what}", path.display()))
}

/// A matrix as kept: bf16 stays bf16 (as bits); f32 and f16 become f32.
enum Values {
    F32(Vec<f32>),
    Bf16(Vec<u16>),
}

impl Values {
    fn f32(self) -> Vec<f32> {
        match self {
            Self::F32(v) => v,
            Self::Bf16(v) => v.into_iter().map(|b| half::bf16::from_bits(b).to_f32()).collect(),
        }
    }
}

/// A tensor's values as kept.
fn values(path: &Path, name: &str, view: &safetensors::tensor::TensorView<'_>) -> Result<Values> {
    let data = view.data();
    Ok(match view.dtype() {
        Dtype::F32 => Values::F32(data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()),
        Dtype::F16 => {
            Values::F32(data.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect())
        }
        Dtype::BF16 => Values::Bf16(data.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect()),
        other => return Err(err(path, format!("tensor '{name}' is {other:?}; expected F32, F16 or BF16"))),
    })
}

/// The pair of `a` and `b` (`b`'s rows in llama.cpp's order for `permuted_heads`), bf16 when
/// both are.
fn low_rank(a: Values, b: Values, rank: usize, permuted_heads: Option<usize>) -> LowRank {
    let permute = |v: &[u16]| permuted_heads.map(|h| permute_rows(v, h, rank));
    match (a, b) {
        (Values::Bf16(a), Values::Bf16(b)) => LowRank::bf16(a, permute(&b).as_deref().unwrap_or(&b), rank),
        (a, b) => {
            let b = b.f32();
            let b = permuted_heads.map_or(b.clone(), |h| permute_rows(&b, h, rank));
            LowRank::f32(a.f32(), &b, rank)
        }
    }
}

/// `(module name, is B)` of a PEFT tensor name: `base_model.model.{module}.lora_{A,B}[.{adapter}].weight`.
fn split_name(name: &str) -> Option<(&str, bool)> {
    let rest = name.strip_prefix("base_model.model.").unwrap_or(name);
    let rest = rest.strip_suffix(".weight")?;
    // `…lora_A.default`: the adapter's name may follow the matrix's.
    let (module, tail) = rest.rsplit_once(".lora_")?;
    match tail.split('.').next()? {
        "A" => Some((module, false)),
        "B" => Some((module, true)),
        _ => None,
    }
}

/// `b`'s rows (`[out, rank]`, Hugging Face's order) in llama.cpp's order for a projection of
/// `heads` heads: within a head, row `half * d/2 + i` goes to `2 i + half`.
fn permute_rows<T: Copy + Default>(b: &[T], heads: usize, rank: usize) -> Vec<T> {
    let out = b.len() / rank.max(1);
    let hd = out / heads.max(1);
    let mut p = vec![T::default(); b.len()];
    for h in 0..heads {
        for half in 0..2 {
            for i in 0..hd / 2 {
                let (from, to) = (h * hd + half * hd / 2 + i, h * hd + 2 * i + half);
                p[to * rank..(to + 1) * rank].copy_from_slice(&b[from * rank..(from + 1) * rank]);
            }
        }
    }
    p
}

/// Bytes the adapter in folder `dir` will hold once loaded (bf16 tensors at 2 bytes a value,
/// the others at 4), from its safetensors header alone: what a memory plan reserves for it.
pub fn planned_bytes(dir: &Path) -> Result<usize> {
    use std::io::Read;
    if let Err(e) = std::fs::metadata(dir.join("adapter_config.json")) {
        return Err(err(dir, format!("not a PEFT adapter folder (adapter_config.json: {e})")));
    }
    let path = dir.join("adapter_model.safetensors");
    let mut f = std::fs::File::open(&path).map_err(|e| err(&path, e))?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len).map_err(|e| err(&path, format!("corrupt or truncated: {e}")))?;
    let len = u64::from_le_bytes(len);
    let size = f.metadata().map_err(|e| err(&path, e))?.len();
    if len > size.saturating_sub(8) || len > 100 << 20 {
        return Err(err(&path, format!("corrupt or truncated: a header of {len} bytes in a file of {size}")));
    }
    let mut header = vec![0u8; len as usize];
    f.read_exact(&mut header).map_err(|e| err(&path, format!("corrupt or truncated: {e}")))?;
    let header: serde_json::Value =
        serde_json::from_slice(&header).map_err(|e| err(&path, format!("corrupt header: {e}")))?;
    let tensors = header.as_object().ok_or_else(|| err(&path, "corrupt header: not an object"))?;
    let mut bytes = 0usize;
    for (name, t) in tensors.iter().filter(|(k, _)| *k != "__metadata__") {
        let shape = t["shape"].as_array().ok_or_else(|| err(&path, format!("tensor '{name}' has no shape")))?;
        let n = shape.iter().try_fold(1usize, |n, d| d.as_u64().and_then(|d| n.checked_mul(d as usize)));
        let n = n.ok_or_else(|| err(&path, format!("tensor '{name}' has a bad shape")))?;
        bytes = bytes.saturating_add(n * if t["dtype"] == "BF16" { 2 } else { 4 });
    }
    Ok(bytes)
}

impl LoraAdapter {
    /// The adapter in folder `dir`, for a base whose adaptable projections are `modules` and
    /// whose layers number `num_layers`; refused when a pair's rank exceeds `max_rank`.
    pub fn load(dir: &Path, modules: &[LoraModule], num_layers: usize, max_rank: usize) -> Result<Self> {
        let cfg_path = dir.join("adapter_config.json");
        let text = std::fs::read_to_string(&cfg_path)
            .map_err(|e| err(dir, format!("not a PEFT adapter folder (adapter_config.json: {e})")))?;
        let cfg = LoraConfig::parse(&cfg_path, &text)?;
        let st_path = dir.join("adapter_model.safetensors");
        if !st_path.exists() && dir.join("adapter_model.bin").exists() {
            return Err(err(dir, "adapter_model.bin (a pickle) is not read: save the adapter as safetensors"));
        }
        let bytes = std::fs::read(&st_path).map_err(|e| err(&st_path, e))?;
        let st = SafeTensors::deserialize(&bytes).map_err(|e| err(&st_path, format!("corrupt or truncated: {e}")))?;
        let by_name: HashMap<String, &LoraModule> = modules.iter().map(|m| (m.name(), m)).collect();
        if let Some(listed) = cfg.listed_targets() {
            for t in listed {
                if !by_name.keys().any(|n| n == t || n.ends_with(&format!(".{t}"))) {
                    return Err(err(
                        &cfg_path,
                        format!(
                            "target_modules names {t:?}, which matches no projection lmplex can adapt in this model"
                        ),
                    ));
                }
            }
        }
        // Each module's A and B, read and checked.
        let mut found: HashMap<&str, [Option<Values>; 2]> = HashMap::new();
        for (name, view) in st.tensors() {
            let (module, is_b) = split_name(&name)
                .ok_or_else(|| err(&st_path, format!("tensor '{name}' is not a LoRA A or B matrix")))?;
            let (key, m) = by_name.get_key_value(module).ok_or_else(|| {
                err(
                    &st_path,
                    format!("tensor '{name}' adapts '{module}', which this model lacks or lmplex cannot adapt"),
                )
            })?;
            if !cfg.targets(key) {
                return Err(err(
                    &st_path,
                    format!("tensor '{name}' adapts '{module}', which target_modules does not name"),
                ));
            }
            let (r, _) = cfg.rank_and_scale(key);
            let want = if is_b { vec![m.out_features, r] } else { vec![r, m.in_features] };
            if view.shape() != want.as_slice() {
                return Err(err(
                    &st_path,
                    format!("tensor '{name}' is {:?} where this model and rank {r} need {want:?}", view.shape()),
                ));
            }
            if r > max_rank {
                return Err(err(&st_path, format!("'{module}' has rank {r}, above max_lora_rank {max_rank}")));
            }
            found.entry(key.as_str()).or_default()[usize::from(is_b)] = Some(values(&st_path, &name, &view)?);
        }
        let mut layers: Vec<[Option<LoraPair>; 9]> = (0..num_layers).map(|_| Default::default()).collect();
        for m in modules {
            let name = m.name();
            if !cfg.targets(&name) {
                continue;
            }
            let (r, scale) = cfg.rank_and_scale(&name);
            match found.remove(name.as_str()) {
                Some([Some(a), Some(b)]) => {
                    let pair = LoraPair::new(low_rank(a, b, r, m.permuted_heads), scale);
                    layers[m.layer][m.target.slot()] = Some(pair);
                }
                Some([a, _]) => {
                    let which = if a.is_some() { "lora_B" } else { "lora_A" };
                    return Err(err(&st_path, format!("'{name}' has no {which} matrix")));
                }
                None => {
                    return Err(err(&st_path, format!("no LoRA matrices for '{name}', which target_modules names")))
                }
            }
        }
        Ok(Self::new(layers))
    }
}

#[cfg(test)]
mod tests {
    use super::{permute_rows, split_name};

    #[test]
    fn rows_go_to_llama_cpps_order() {
        // One head of 4 rows, rank 1: HF rows [a0, a1, b0, b1] -> [a0, b0, a1, b1].
        assert_eq!(permute_rows(&[0.0, 1.0, 2.0, 3.0], 1, 1), vec![0.0, 2.0, 1.0, 3.0]);
        // Two heads, rank 2: each head's rows move within it.
        let b: Vec<f32> = (0..16).map(|x| x as f32).collect();
        let p = permute_rows(&b, 2, 2);
        assert_eq!(&p[..8], &[0.0, 1.0, 4.0, 5.0, 2.0, 3.0, 6.0, 7.0]);
        assert_eq!(&p[8..], &[8.0, 9.0, 12.0, 13.0, 10.0, 11.0, 14.0, 15.0]);
    }

    #[test]
    fn peft_names_split_into_module_and_matrix() {
        let m = "model.layers.0.self_attn.q_proj";
        assert_eq!(split_name(&format!("base_model.model.{m}.lora_A.weight")), Some((m, false)));
        assert_eq!(split_name(&format!("base_model.model.{m}.lora_B.weight")), Some((m, true)));
        assert_eq!(split_name(&format!("base_model.model.{m}.lora_B.default.weight")), Some((m, true)));
        assert_eq!(split_name(&format!("base_model.model.{m}.lora_magnitude_vector")), None);
        assert_eq!(split_name(&format!("base_model.model.{m}.lora_embedding_A.weight")), None);
    }
}
