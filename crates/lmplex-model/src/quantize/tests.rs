//! The k-quant encoders against candle's decoder (ggml's layouts) and the type rules on
//! synthetic tensor lists; `tests/quantize.rs` checks the rules against `llama-quantize`'s own
//! files and a whole model end to end.

use super::*;
use crate::testing::seeded_values;
use candle_core::quantized::ggml_file::qtensor_from_ggml;

/// `raw` decoded by candle as `t` (`n` values).
fn decode(t: GgmlDType, raw: &[u8], n: usize) -> Vec<f32> {
    let q = qtensor_from_ggml(t, raw, vec![n], &Device::Cpu).unwrap();
    q.dequantize(&Device::Cpu).unwrap().to_vec1::<f32>().unwrap()
}

fn rmse(a: &[f32], b: &[f32]) -> f32 {
    (a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum::<f32>() / a.len() as f32).sqrt()
}

#[test]
fn nearest_int_rounds_half_to_even() {
    let got: Vec<i32> = [0.5f32, 1.5, 2.5, -0.5, -1.5, 3.49, -3.51].iter().map(|&v| kquants::nearest_int(v)).collect();
    assert_eq!(got, [0, 2, 2, 0, -2, 3, -4]);
}

/// Q4_K, Q5_K and Q6_K decode (by candle, from ggml's layout) to within their step of the input, beat
/// candle's older encoder on the same data, and keep an all-zero block exactly.
#[test]
fn k_quants_round_trip_through_ggml_layouts() {
    let n = 16 * QK;
    let mut x: Vec<f32> = seeded_values(n, 7).iter().enumerate().map(|(i, v)| v * (1.0 + (i / 256) as f32)).collect();
    x[..QK].fill(0.0); // an all-zero block
    x[QK..2 * QK].iter_mut().for_each(|v| *v = v.abs() + 0.5); // all positive: min above zero
    for (t, bytes, f, bound) in [
        (GgmlDType::Q4K, kquants::Q4K_BYTES, quantize_q4_k as fn(&[f32]) -> Vec<u8>, 0.09),
        (GgmlDType::Q5K, kquants::Q5K_BYTES, quantize_q5_k as fn(&[f32]) -> Vec<u8>, 0.045),
        (GgmlDType::Q6K, kquants::Q6K_BYTES, quantize_q6_k as fn(&[f32]) -> Vec<u8>, 0.025),
    ] {
        let raw = f(&x);
        assert_eq!(raw.len(), n / QK * bytes, "{t:?} block size");
        let y = decode(t, &raw, n);
        assert!(y[..QK].iter().all(|&v| v == 0.0), "{t:?}: the zero block");
        let theirs = QTensor::quantize(&candle_core::Tensor::from_vec(x.clone(), n, &Device::Cpu).unwrap(), t).unwrap();
        let y_theirs = theirs.dequantize(&Device::Cpu).unwrap().to_vec1::<f32>().unwrap();
        for (b, (xb, yb)) in x.chunks(QK).zip(y.chunks(QK)).enumerate().skip(1) {
            let size = (xb.iter().map(|v| v * v).sum::<f32>() / QK as f32).sqrt();
            let (ours, old) = (rmse(xb, yb), rmse(xb, &y_theirs[b * QK..(b + 1) * QK]));
            assert!(ours <= bound * size, "{t:?} block {b}: rmse {ours} of rms {size}");
            assert!(ours <= old * 1.02, "{t:?} block {b}: {ours} against candle's {old}");
        }
    }
}

const QK: usize = kquants::QK_K;

fn descs(list: &[(&'static str, usize, usize)]) -> Vec<TensorDesc<'static>> {
    list.iter().map(|&(name, row, dims)| TensorDesc { name, row, dims }).collect()
}

#[test]
fn the_rules_pick_llama_quantizes_types() {
    let list = descs(&[
        ("token_embd.weight", 512, 2),
        ("blk.0.attn_norm.weight", 512, 1),
        ("blk.0.attn_qkv.weight", 512, 2),
        ("blk.0.attn_v.weight", 512, 2),
        ("blk.0.ffn_down.weight", 1024, 2),
        ("blk.0.ffn_gate_inp.weight", 512, 2),
        ("blk.0.attn_q.bias", 512, 1),
        ("blk.0.ffn_up.weight", 20, 2),
    ]);
    let name = |t: Option<GgmlDType>| t.map(type_name);
    let got: Vec<_> = plan(FileType::Q4KM, &list, 1, 0).into_iter().map(name).collect();
    // Tied head (no output.weight): token_embd is the head, Q6_K. The fused qkv counts as an
    // attn_v to llama.cpp: two of them, the second (i = 1 >= 7 * 2 / 8) picked by use_more_bits.
    // One layer: its ffn_down is picked.
    let want = [Some("Q6_K"), None, Some("Q4_K"), Some("Q6_K"), Some("Q6_K"), None, None, Some("F16")];
    assert_eq!(got, want);
    let q8: Vec<_> = plan(FileType::Q8_0, &list, 1, 0).into_iter().map(name).collect();
    assert_eq!(q8, [Some("Q8_0"), None, Some("Q8_0"), Some("Q8_0"), Some("Q8_0"), None, None, Some("F16")]);
    let f16: Vec<_> = plan(FileType::F16, &list, 1, 0).into_iter().map(name).collect();
    assert_eq!(f16, [Some("F16"), None, Some("F16"), Some("F16"), Some("F16"), None, None, Some("F16")]);
    // A row of 576 (SmolLM2): the head's Q6_K does not fit and falls back to Q8_0; Q4_K to Q5_0.
    let smol = descs(&[("token_embd.weight", 576, 2), ("blk.0.ffn_gate.weight", 576, 2), ("output.weight", 576, 2)]);
    let got: Vec<_> = plan(FileType::Q4KM, &smol, 1, 0).into_iter().map(name).collect();
    assert_eq!(got, [Some("Q5_0"), Some("Q5_0"), Some("Q8_0")]);
    // A Qwen2-MoE-like file of 16 layers: two `ffn_down` tensors a layer (routed and shared
    // experts), the layer read from the name; 60 experts, so no 8-expert rule.
    let names: Vec<String> = (0..16)
        .flat_map(|i| [format!("blk.{i}.ffn_down_exps.weight"), format!("blk.{i}.ffn_down_shexp.weight")])
        .collect();
    let moe: Vec<TensorDesc<'_>> = names.iter().map(|n| TensorDesc { name: n, row: 1024, dims: 2 }).collect();
    let got = plan(FileType::Q4KM, &moe, 16, 60);
    for (t, ty) in moe.iter().zip(got) {
        let i: usize = t.name.split('.').nth(1).unwrap().parse().unwrap();
        let more = !(2..14).contains(&i) || (i as i64 - 2) % 3 == 2;
        assert_eq!(ty.map(type_name), Some(if more { "Q6_K" } else { "Q4_K" }), "{}", t.name);
    }
    assert_eq!(FileType::from_name("Q4_K_M"), Some(FileType::Q4KM));
    assert_eq!(FileType::from_name("q3_k"), None);
}
