//! Rotary position embedding on the CPU: inverse frequencies as transformers computes them
//! (scalings and GGUF factors included, shared with the CUDA kernel), their cos/sin tables, and
//! the rotation of one token's heads, plain or multimodal (M-RoPE).
//!
//! Invariants: a table is computed once per model and read only; a token's rotation depends on
//! its rope position alone (`RopeTable::apply_at` with three equal positions gives `apply`'s
//! bits), never on the batch.

use crate::args::{RopeArgs, RopeScaling};

/// Rotary inverse frequencies `[head_dim / 2]` as transformers computes them, scaling (linear,
/// Llama 3, LongRoPE: long factors when `max_positions` exceeds the original context) and GGUF
/// `rope_freqs` factors included (shared by the CPU tables and the CUDA kernel).
pub fn inv_freq(args: &RopeArgs, head_dim: usize, max_positions: usize, freq_factors: Option<&[f32]>) -> Vec<f32> {
    let half = head_dim / 2;
    let mut inv_freq: Vec<f32> = (0..half).map(|i| 1.0 / args.theta.powf((2 * i) as f32 / head_dim as f32)).collect();
    match &args.scaling {
        RopeScaling::None => {}
        RopeScaling::Linear { factor } => inv_freq.iter_mut().for_each(|f| *f /= factor),
        RopeScaling::Llama3(s) => {
            let low_wavelen = s.original_max_position_embeddings as f32 / s.low_freq_factor;
            let high_wavelen = s.original_max_position_embeddings as f32 / s.high_freq_factor;
            for f in inv_freq.iter_mut() {
                let wavelen = 2.0 * std::f32::consts::PI / *f;
                *f = if wavelen < high_wavelen {
                    *f
                } else if wavelen > low_wavelen {
                    *f / s.factor
                } else {
                    let smooth = (s.original_max_position_embeddings as f32 / wavelen - s.low_freq_factor)
                        / (s.high_freq_factor - s.low_freq_factor);
                    (1.0 - smooth) * *f / s.factor + smooth * *f
                };
            }
        }
        RopeScaling::LongRope(l) => {
            // transformers: 1 / (ext * base^(2i/d)), the product taken before the division.
            let ext = if max_positions > l.original_max_position_embeddings { &l.long_factor } else { &l.short_factor };
            for (i, (f, e)) in inv_freq.iter_mut().zip(ext).enumerate() {
                *f = 1.0 / (e * args.theta.powf((2 * i) as f32 / head_dim as f32));
            }
        }
    }
    if let (RopeScaling::None, Some(ff)) = (&args.scaling, freq_factors) {
        for (f, d) in inv_freq.iter_mut().zip(ff) {
            *f /= d;
        }
    }
    inv_freq
}

/// The factor cos and sin are multiplied by (LongRoPE's `attention_factor`, else 1).
pub fn rope_magnitude(args: &RopeArgs) -> f32 {
    match &args.scaling {
        RopeScaling::LongRope(l) => l.attention_factor,
        _ => 1.0,
    }
}

/// cos/sin tables `[max_positions, rot_dim / 2]`.
pub struct RopeTable {
    cos: Vec<f32>,
    sin: Vec<f32>,
    half: usize,
    interleaved: bool,
    /// `RopeArgs::mrope_section`: the last frequency of each of the three sections.
    mrope_ends: Option<[usize; 3]>,
    /// Positions the table covers (`0..max_positions`).
    pub max_positions: usize,
}

impl RopeTable {
    /// Bytes the cos and sin tables take.
    pub fn size_in_bytes(&self) -> usize {
        (self.cos.len() + self.sin.len()) * 4
    }

    /// cos/sin of `inv_freq` (scaling and GGUF `rope_freqs` factors included) times
    /// `rope_magnitude` for every position below `max_positions`.
    pub fn new(args: &RopeArgs, head_dim: usize, max_positions: usize, freq_factors: Option<&[f32]>) -> Self {
        let half = head_dim / 2;
        let inv_freq = inv_freq(args, head_dim, max_positions, freq_factors);
        let mag = rope_magnitude(args);
        let mut cos = Vec::with_capacity(max_positions * half);
        let mut sin = Vec::with_capacity(max_positions * half);
        for p in 0..max_positions {
            for f in &inv_freq {
                let a = p as f32 * f;
                cos.push(a.cos() * mag);
                sin.push(a.sin() * mag);
            }
        }
        let mrope_ends = args.mrope_section.map(|[t, h, w]| [t, t + h, t + h + w]);
        Self { cos, sin, half, interleaved: args.interleaved, mrope_ends, max_positions }
    }

    /// Rotates every head of one token in place for its rope position `pos`: temporal,
    /// height and width positions under M-RoPE (frequency `i` takes the position of its
    /// section, transformers' `mrope_section` split), else `pos[0]` (`apply`). Equal positions
    /// give `apply`'s bits.
    pub fn apply_at(&self, x: &mut [f32], pos: [usize; 3], head_dim: usize) {
        let Some(ends) = self.mrope_ends.filter(|_| pos[1..].iter().any(|&p| p != pos[0])) else {
            return self.apply(x, pos[0], head_dim);
        };
        let stream = |i: usize| ends.iter().position(|&e| i < e).unwrap_or(2);
        let at = |i: usize| pos[stream(i)] * self.half + i;
        for head in x.chunks_exact_mut(head_dim) {
            for i in 0..self.half {
                let (a, b) = if self.interleaved { (2 * i, 2 * i + 1) } else { (i, i + self.half) };
                let (x0, x1, c, s) = (head[a], head[b], self.cos[at(i)], self.sin[at(i)]);
                head[a] = x0 * c - x1 * s;
                head[b] = x0 * s + x1 * c;
            }
        }
    }

    /// Rotates every head of one token (`x: [heads * head_dim]`) in place for position `pos`.
    pub fn apply(&self, x: &mut [f32], pos: usize, head_dim: usize) {
        let (cos, sin) = (&self.cos[pos * self.half..][..self.half], &self.sin[pos * self.half..][..self.half]);
        for head in x.chunks_exact_mut(head_dim) {
            for i in 0..self.half {
                let (a, b) = if self.interleaved { (2 * i, 2 * i + 1) } else { (i, i + self.half) };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * cos[i] - x1 * sin[i];
                head[b] = x0 * sin[i] + x1 * cos[i];
            }
        }
    }
}
