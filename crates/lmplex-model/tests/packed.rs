//! AWQ and GPTQ folders load as the model of their dequantized weights.
//!
//! Each case takes the tiny random llama (f32), quantizes every projection with known integers
//! (per group and column: an f16 scale, a zero, `q = clamp(round(w / s) + z)`), writes them
//! packed the way AutoAWQ's `WQLinear_GEMM.from_linear` and AutoGPTQ's `QuantLinear.pack`
//! write them (GPTQ act-order with a permuted `g_idx`, 8-bit, `gptq_v2`, per-column groups),
//! and writes the reference folder holding `s · (q − z)` as plain f32 matrices.
//! - Layouts held dense (act-order, 8-bit): the same logits as the reference, bit for bit.
//! - Layouts held as Q4_1 blocks (4-bit, groups of whole 32-input blocks): every block decodes
//!   (candle's Q4_1 decoder) to the reference within the f16 rounding of `−s·z`, the model is
//!   smaller, and its logits (integer kernels, 8-bit activations) stay close to the reference's.
//! - The packed folder reports its method, and the memory plan counts what loading holds.

use candle_core::{Device, Tensor};
use lmplex_model::testing::{write_tiny_checkpoint, Family, VOCAB};
use lmplex_model::{ForwardBatch, KvDtype, LogitsSelect, SeqChunk};
use safetensors::{Dtype, View};
use std::collections::HashMap;
use std::path::Path;

#[derive(Clone, Copy)]
enum Layout {
    Awq,
    Gptq { bits: u32, act_order: bool, v2: bool },
}

struct Case {
    layout: Layout,
    group: Option<usize>,
    /// Held as Q4_1 blocks (else dense).
    q4_1: bool,
}

/// A safetensors tensor of raw bytes (candle's writer has no i32).
struct Raw {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl View for &Raw {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        (&self.data[..]).into()
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

fn i32s(shape: Vec<usize>, v: &[u32]) -> Raw {
    Raw { dtype: Dtype::I32, shape, data: v.iter().flat_map(|x| x.to_le_bytes()).collect() }
}

fn f16s(shape: Vec<usize>, v: &[f32]) -> Raw {
    Raw { dtype: Dtype::F16, shape, data: v.iter().flat_map(|x| half::f16::from_f32(*x).to_le_bytes()).collect() }
}

fn f32s(shape: Vec<usize>, v: &[f32]) -> Raw {
    Raw { dtype: Dtype::F32, shape, data: v.iter().flat_map(|x| x.to_le_bytes()).collect() }
}

/// Quantizes `w` (`[n, k]`) into `(q[k][n], zeros[g][n], scales[g][n], group of each input,
/// dequantized [n, k])`.
#[allow(clippy::type_complexity)]
fn quantize(
    w: &[f32],
    n: usize,
    k: usize,
    bits: u32,
    case: &Case,
) -> (Vec<u32>, Vec<u32>, Vec<f32>, Vec<usize>, Vec<f32>) {
    let g_size = case.group.unwrap_or(k);
    let groups = k / g_size;
    let act_order = matches!(case.layout, Layout::Gptq { act_order: true, .. });
    // Act-order: input i belongs to group perm(i) / G for a fixed scrambling permutation.
    let group: Vec<usize> = (0..k).map(|i| if act_order { (i * 37 + 11) % k / g_size } else { i / g_size }).collect();
    let max_q = ((1u32 << bits) - 1) as f32;
    let (mut zeros, mut scales) = (vec![0u32; groups * n], vec![0f32; groups * n]);
    for g in 0..groups {
        for col in 0..n {
            let vals: Vec<f32> = (0..k).filter(|&i| group[i] == g).map(|i| w[col * k + i]).collect();
            let (lo, hi) = vals.iter().fold((0f32, 0f32), |(a, b), &x| (a.min(x), b.max(x)));
            let s = half::f16::from_f32(((hi - lo) / max_q).max(1e-4)).to_f32();
            scales[g * n + col] = s;
            zeros[g * n + col] = (-lo / s).round().clamp(0.0, max_q) as u32;
        }
    }
    let mut q = vec![0u32; k * n];
    let mut deq = vec![0f32; n * k];
    for i in 0..k {
        for col in 0..n {
            let (s, z) = (scales[group[i] * n + col], zeros[group[i] * n + col]);
            let v = ((w[col * k + i] / s).round() + z as f32).clamp(0.0, max_q) as u32;
            q[i * n + col] = v;
            deq[col * k + i] = s * (v as f32 - z as f32);
        }
    }
    (q, zeros, scales, group, deq)
}

/// The packed tensors of one projection and its dequantized matrix.
fn pack(w: &[f32], n: usize, k: usize, case: &Case) -> (Vec<(&'static str, Raw)>, Vec<f32>) {
    let bits = match case.layout {
        Layout::Awq => 4,
        Layout::Gptq { bits, .. } => bits,
    };
    let (q, zeros, scales, group, deq) = quantize(w, n, k, bits, case);
    let (p, mask) = ((32 / bits) as usize, (1u32 << bits) - 1);
    let groups = scales.len() / n;
    let mut out = vec![("scales", f16s(vec![groups, n], &scales))];
    match case.layout {
        Layout::Awq => {
            // AutoAWQ: word col of row r holds columns col*8 + ORDER[i] in nibble i.
            const ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];
            let words = |rows: usize, v: &[u32]| -> Vec<u32> {
                let mut o = vec![0u32; rows * n / 8];
                for r in 0..rows {
                    for c in 0..n / 8 {
                        for (i, &j) in ORDER.iter().enumerate() {
                            o[r * n / 8 + c] |= v[r * n + c * 8 + j] << (4 * i);
                        }
                    }
                }
                o
            };
            out.push(("qweight", i32s(vec![k, n / 8], &words(k, &q))));
            out.push(("qzeros", i32s(vec![groups, n / 8], &words(groups, &zeros))));
        }
        Layout::Gptq { v2, .. } => {
            // AutoGPTQ: qweight packs p consecutive inputs per word; qzeros p consecutive columns.
            let mut qw = vec![0u32; k / p * n];
            for i in 0..k {
                qw[(i / p) * n..(i / p + 1) * n].iter_mut().zip(&q[i * n..(i + 1) * n]).for_each(|(word, &v)| {
                    *word |= v << (bits as usize * (i % p));
                });
            }
            let mut qz = vec![0u32; groups * n / p];
            for g in 0..groups {
                for c in 0..n {
                    let z = if v2 { zeros[g * n + c] } else { zeros[g * n + c].wrapping_sub(1) & mask };
                    qz[g * n / p + c / p] |= z << (bits as usize * (c % p));
                }
            }
            out.push(("qweight", i32s(vec![k / p, n], &qw)));
            out.push(("qzeros", i32s(vec![groups, n / p], &qz)));
            let g_idx: Vec<u32> = group.iter().map(|&g| g as u32).collect();
            out.push(("g_idx", i32s(vec![k], &g_idx)));
        }
    }
    (out, deq)
}

fn quantization_config(case: &Case) -> serde_json::Value {
    let group = case.group.map_or(-1, |g| g as i64);
    match case.layout {
        Layout::Awq => serde_json::json!({"quant_method": "awq", "bits": 4, "group_size": group,
            "zero_point": true, "version": "gemm"}),
        Layout::Gptq { bits, act_order, v2 } => serde_json::json!({"quant_method": "gptq", "bits": bits,
            "group_size": group, "desc_act": act_order, "sym": false,
            "checkpoint_format": if v2 { "gptq_v2" } else { "gptq" }}),
    }
}

/// Checks that `Packed::q4_1_blocks` of one projection's tensors decode to `deq` within the f16
/// rounding of each block's minimum.
fn check_blocks(parts: &[(&'static str, Raw)], deq: &[f32], case: &Case) {
    use lmplex_model::weights::{Packed, PackedRaw};
    let cfg = serde_json::json!({ "quantization_config": quantization_config(case) });
    let packed = Packed::from_config(&cfg).unwrap().unwrap();
    let get = |name: &str| parts.iter().find(|(n, _)| *n == name).map(|(_, r)| r);
    let ints = |name: &str| {
        get(name).map(|r| PackedRaw {
            shape: r.shape.clone(),
            values: r.data.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        })
    };
    let s = get("scales").unwrap();
    let scales = PackedRaw {
        shape: s.shape.clone(),
        values: s.data.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
    };
    let (qw, qz, g) = (ints("qweight").unwrap(), ints("qzeros").unwrap(), ints("g_idx"));
    let (blocks, n, k) = packed.q4_1_blocks(&qw, &qz, &scales, g.as_ref()).unwrap().expect("Q4_1 layout");
    let q = candle_core::quantized::ggml_file::qtensor_from_ggml(
        candle_core::quantized::GgmlDType::Q4_1,
        &blocks,
        vec![n, k],
        &Device::Cpu,
    )
    .unwrap();
    let got = q.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let step = scales.values.iter().fold(0f32, |m, &x| m.max(x));
    for (i, (a, b)) in got.iter().zip(deq).enumerate() {
        // |m| <= 15·s, rounded to f16: 2^-11 of it, plus f32 noise.
        assert!((a - b).abs() <= 15.0 * step / 2048.0 + 1e-6, "weight {i}: {a} vs {b}");
    }
}

/// Writes the packed folder and the dequantized reference folder from the tiny llama in `src`.
fn write_pair(src: &Path, packed: &Path, reference: &Path, case: &Case) {
    let tensors = candle_core::safetensors::load(src.join("model.safetensors"), &Device::Cpu).unwrap();
    let mut raws: Vec<(String, Raw)> = Vec::new();
    let mut dense: HashMap<String, Tensor> = HashMap::new();
    for (name, t) in &tensors {
        let is_proj = name.ends_with("_proj.weight");
        if !is_proj {
            let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            raws.push((name.clone(), f32s(t.dims().to_vec(), &v)));
            dense.insert(name.clone(), t.clone());
            continue;
        }
        let (n, k) = t.dims2().unwrap();
        let (parts, deq) = pack(&t.flatten_all().unwrap().to_vec1::<f32>().unwrap(), n, k, case);
        if case.q4_1 {
            check_blocks(&parts, &deq, case);
        }
        let base = name.strip_suffix(".weight").unwrap();
        raws.extend(parts.into_iter().map(|(suffix, r)| (format!("{base}.{suffix}"), r)));
        dense.insert(name.clone(), Tensor::from_vec(deq, (n, k), &Device::Cpu).unwrap());
    }
    for dir in [packed, reference] {
        for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
            if src.join(f).exists() {
                std::fs::copy(src.join(f), dir.join(f)).unwrap();
            }
        }
    }
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    cfg["quantization_config"] = quantization_config(case);
    std::fs::write(packed.join("config.json"), cfg.to_string()).unwrap();
    let views: Vec<(&str, &Raw)> = raws.iter().map(|(n, r)| (n.as_str(), r)).collect();
    safetensors::serialize_to_file(views, None, &packed.join("model.safetensors")).unwrap();
    candle_core::safetensors::save(&dense, reference.join("model.safetensors")).unwrap();
}

fn logits(dir: &Path) -> (Vec<f32>, String, usize) {
    let loaded = lmplex_model::load(dir, None).unwrap();
    let mut kv = loaded.model.new_kv_cache(16, 16, KvDtype::F32).unwrap();
    let ids: Vec<u32> = (0..40).map(|i| (i * 7 + 3) % VOCAB as u32).collect();
    let table: Vec<u32> = (0..3).collect();
    let seq = SeqChunk {
        token_ids: &ids,
        start_pos: 0,
        block_table: &table,
        logits: LogitsSelect::All,
        num_prompt_tokens: usize::MAX,
        lora: None,
        embeds: None,
    };
    let out = loaded.model.forward_logits(&ForwardBatch { seqs: vec![seq] }, &mut kv).unwrap();
    (out, loaded.info.quantization, loaded.model.weight_bytes())
}

#[test]
fn awq_and_gptq_folders_give_the_logits_of_their_dequantized_weights() {
    let src = tempfile::tempdir().unwrap();
    write_tiny_checkpoint(src.path(), Family::Llama).unwrap();
    let cases = [
        Case { layout: Layout::Awq, group: Some(32), q4_1: true },
        Case { layout: Layout::Gptq { bits: 4, act_order: false, v2: false }, group: Some(32), q4_1: true },
        Case { layout: Layout::Gptq { bits: 4, act_order: false, v2: true }, group: None, q4_1: true },
        Case { layout: Layout::Gptq { bits: 4, act_order: true, v2: false }, group: Some(32), q4_1: false },
        Case { layout: Layout::Gptq { bits: 8, act_order: false, v2: true }, group: None, q4_1: false },
    ];
    for (i, case) in cases.iter().enumerate() {
        let (packed, reference) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        write_pair(src.path(), packed.path(), reference.path(), case);
        let (got, method, bytes) = logits(packed.path());
        let (want, none, dense_bytes) = logits(reference.path());
        assert_eq!(none, "none");
        assert_eq!(method, if matches!(case.layout, Layout::Awq) { "awq" } else { "gptq" }, "case {i}");
        assert_eq!(got.len(), 40 * VOCAB);
        if case.q4_1 {
            let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
            let diff = got.iter().zip(&want).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(diff < 0.03 * scale, "case {i}: max |logit diff| {diff} of {scale}");
            assert!(bytes < dense_bytes / 2, "case {i}: {bytes} bytes held, {dense_bytes} dense");
        } else {
            assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "case {i}: logits differ");
        }
        // The plan counts what loading holds (the integer kernels' copy of Q4_1 blocks adds a
        // little alignment slack the headers cannot tell).
        let plan = lmplex_model::plan(packed.path(), None, lmplex_core::DType::Auto).unwrap().weight_bytes;
        let slack = if case.q4_1 { bytes / 50 } else { 0 };
        assert!(plan <= bytes && bytes <= plan + slack, "case {i}: plan {plan}, held {bytes}");
    }
}

#[test]
fn unsupported_quantization_configs_are_named() {
    for (cfg, what) in [
        (serde_json::json!({"quant_method": "fp8"}), "quant_method 'fp8'"),
        (serde_json::json!({"quant_method": "awq", "bits": 4, "version": "gemv"}), "AWQ version 'gemv'"),
        (serde_json::json!({"quant_method": "gptq", "bits": 3, "group_size": 128}), "GPTQ with 3 bits"),
    ] {
        let e = lmplex_model::weights::Packed::from_config(&serde_json::json!({"quantization_config": cfg}));
        let msg = e.unwrap_err().to_string();
        assert!(msg.contains(what), "{msg}");
    }
}
