//! Inputs for the kernels' benchmarks and timing examples (and the model's): `seeded_values`,
//! the same values for a seed on every build and machine.

/// `len` values in [-1, 1) from an LCG seeded with `seed`: the same on every build and
/// machine, for benchmarks that must time the same bytes (`benches/kernels.rs`,
/// `examples/qmatmul_timing.rs`).
pub fn seeded_values(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}
