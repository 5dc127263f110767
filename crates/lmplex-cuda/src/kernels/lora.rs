//! `lora.cu`: the LoRA deltas of a batch whose rows run under different adapters (shrink, then
//! expand), their twins, their traffic and their cases: rows of two adapters and of the base,
//! interleaved, into a fused output's columns, against float64 and against the twins.

use super::check::{against_twin, get, put, put_raw, rows_of, typed, Case, Instance, Reference, Rng, DTS};
use super::launch::{dim, int, name, HEAD_THREADS};
use super::Kernel;
use crate::dtype::Dt;
use crate::exec::Arg::P;
use crate::gpu::Gpu;
use crate::hostexec::{HostExec, Traffic, TwinCall};
use lmplex_core::{Error, Result};

pub(super) const KERNEL: Kernel = Kernel {
    entries: &[("lora_shrink", shrink_twin, shrink_traffic), ("lora_expand", expand_twin, expand_traffic)],
    checks,
};

/// Bytes of one slot of a table (`lora.cu`'s `LoraSlot`).
pub const SLOT_BYTES: usize = 24;

/// One slot of a projection's table: where `A` (`[rank, in]`) and `B^T` (`[rank, out]`) start in
/// the pool (element offsets; the pool is in the storage type), the rank (0: the adapter does not
/// adapt the projection) and the scale.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LoraSlot {
    pub a: usize,
    pub bt: usize,
    pub rank: usize,
    pub scale: f32,
}

impl LoraSlot {
    /// The slot as `lora.cu` reads it.
    pub fn bytes(&self) -> Result<[u8; SLOT_BYTES]> {
        let rank = i32::try_from(self.rank).map_err(|_| Error::internal("a LoRA rank does not fit an int"))?;
        let off = |v: usize| i64::try_from(v).map_err(|_| Error::internal("a LoRA offset does not fit an i64"));
        let mut b = [0u8; SLOT_BYTES];
        b[..8].copy_from_slice(&off(self.a)?.to_le_bytes());
        b[8..16].copy_from_slice(&off(self.bt)?.to_le_bytes());
        b[16..20].copy_from_slice(&rank.to_le_bytes());
        b[20..].copy_from_slice(&self.scale.to_le_bytes());
        Ok(b)
    }

    fn read(h: &HostExec, table: u64, s: usize) -> Result<Self> {
        let b = h.rd_bytes(table + (s * SLOT_BYTES) as u64, SLOT_BYTES)?;
        let negative = |_| Error::internal("a LoRA slot with a negative field");
        let word = |i: usize| usize::try_from(i64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8])));
        let rank = usize::try_from(i32::from_le_bytes(b[16..20].try_into().unwrap_or([0; 4]))).map_err(negative)?;
        let scale = f32::from_le_bytes(b[20..].try_into().unwrap_or([0; 4]));
        Ok(Self { a: word(0).map_err(negative)?, bt: word(8).map_err(negative)?, rank, scale })
    }
}

/// `v[t, j] = A_s[j] · x[t]` for row `t` under slot `s = row_slot[t]` (0 past its rank, and for
/// base rows): `x` rows of `in_features`, `v` f32 rows of `max_rank`.
pub struct LoraShrink {
    pub pool: u64,
    pub slots: u64,
    pub row_slot: u64,
    pub x: u64,
    pub v: u64,
    pub in_features: usize,
    pub max_rank: usize,
}

impl LoraShrink {
    pub fn launch(&self, g: &Gpu, dt: Dt, rows: usize) -> Result<()> {
        let (pool, slots, row_slot, x, v) = (P(self.pool), P(self.slots), P(self.row_slot), P(self.x), P(self.v));
        let args = [pool, slots, row_slot, x, v, int(self.in_features)?, int(self.max_rank)?];
        g.launch(&name("lora_shrink", dt), (dim(rows)?, dim(self.max_rank)?, 1), HEAD_THREADS, &args)
    }
}

/// `y[t, o] += scale_s * Σ_j B_s[o, j] v[t, j]` for `o < out_features` of each row under a slot:
/// `y` rows `ldy` apart (it may point into a fused output's columns).
pub struct LoraExpand {
    pub pool: u64,
    pub slots: u64,
    pub row_slot: u64,
    pub v: u64,
    pub y: u64,
    pub out_features: usize,
    pub max_rank: usize,
    pub ldy: usize,
}

impl LoraExpand {
    pub fn launch(&self, g: &Gpu, dt: Dt, rows: usize) -> Result<()> {
        let (pool, slots, row_slot, v, y) = (P(self.pool), P(self.slots), P(self.row_slot), P(self.v), P(self.y));
        let args = [pool, slots, row_slot, v, y, int(self.out_features)?, int(self.max_rank)?, int(self.ldy)?];
        let grid = (dim(rows)?, dim(self.out_features.div_ceil(HEAD_THREADS as usize))?, 1);
        g.launch(&name("lora_expand", dt), grid, HEAD_THREADS, &args)
    }
}

/// The slot of each of the launch's rows (`None` for the base).
fn row_slots(h: &HostExec, row_slot: u64, rows: usize) -> Result<Vec<Option<usize>>> {
    Ok(h.rd_u32(row_slot, rows)?.into_iter().map(|s| usize::try_from(s as i32).ok()).collect())
}

fn shrink_twin(h: &HostExec, c: &TwinCall) -> Result<()> {
    let (a, dt) = (&c.args, c.dt);
    a.count(7)?;
    let (pool, table, x, v, k, max_rank) = (a.p(0)?, a.p(1)?, a.p(3)?, a.p(4)?, a.n(5)?, a.n(6)?);
    for (t, s) in row_slots(h, a.p(2)?, c.rows())?.into_iter().enumerate() {
        let mut out = vec![0f32; max_rank];
        if let Some(s) = s {
            let slot = LoraSlot::read(h, table, s)?;
            let xr = h.rd(x + (t * k * dt.size()) as u64, dt, k)?;
            let am = h.rd(pool + (slot.a * dt.size()) as u64, dt, slot.rank * k)?;
            for (j, o) in out.iter_mut().enumerate().take(slot.rank.min(max_rank)) {
                *o = xr.iter().zip(&am[j * k..(j + 1) * k]).map(|(p, q)| p * q).sum();
            }
        }
        h.wr(v + (t * max_rank * 4) as u64, Dt::F32, &out)?;
    }
    Ok(())
}

fn expand_twin(h: &HostExec, c: &TwinCall) -> Result<()> {
    let (a, dt) = (&c.args, c.dt);
    a.count(8)?;
    let (pool, table, v, y) = (a.p(0)?, a.p(1)?, a.p(3)?, a.p(4)?);
    let (n, max_rank, ldy) = (a.n(5)?, a.n(6)?, a.n(7)?);
    for (t, s) in row_slots(h, a.p(2)?, c.rows())?.into_iter().enumerate() {
        let Some(slot) = s.map(|s| LoraSlot::read(h, table, s)).transpose()?.filter(|s| s.rank > 0) else {
            continue;
        };
        let vr = h.rd(v + (t * max_rank * 4) as u64, Dt::F32, max_rank)?;
        let bt = h.rd(pool + (slot.bt * dt.size()) as u64, dt, slot.rank * n)?;
        let at = y + (t * ldy * dt.size()) as u64;
        let mut yr = h.rd(at, dt, n)?;
        for (o, e) in yr.iter_mut().enumerate() {
            let d: f32 = (0..slot.rank).fold(0.0, |acc, j| acc + bt[j * n + o] * vr[j]);
            *e += slot.scale * d;
        }
        h.wr(at, dt, &yr)?;
    }
    Ok(())
}

/// The distinct slots of the launch's rows, each with its rows.
fn slot_rows(h: &HostExec, c: &TwinCall) -> Result<Vec<(LoraSlot, usize)>> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for s in row_slots(h, c.args.p(2)?, c.rows())?.into_iter().flatten() {
        match out.iter_mut().find(|(t, _)| *t == s) {
            Some((_, n)) => *n += 1,
            None => out.push((s, 1)),
        }
    }
    out.into_iter().map(|(s, n)| Ok((LoraSlot::read(h, c.args.p(1)?, s)?, n))).collect()
}

/// Each adapted row's x read, each slot's `A` once (its rows from L2 after), `v` written.
fn shrink_traffic(h: &HostExec, c: &TwinCall) -> Result<Traffic> {
    let (k, max_rank, sz) = (c.args.n(5)?, c.args.n(6)?, c.dt.size());
    let (mut bytes, mut flops) = (c.rows() * max_rank * 4, 0);
    for (slot, rows) in slot_rows(h, c)? {
        bytes += (rows + slot.rank) * k * sz;
        flops += 2 * rows * slot.rank * k;
    }
    Ok(Traffic { bytes: bytes as u64, flops: flops as u64, tensor_cores: false })
}

/// Each slot's `B` once, each adapted row's `v` read and its `y` columns read and written.
fn expand_traffic(h: &HostExec, c: &TwinCall) -> Result<Traffic> {
    let (n, max_rank, sz) = (c.args.n(5)?, c.args.n(6)?, c.dt.size());
    let (mut bytes, mut flops) = (0, 0);
    for (slot, rows) in slot_rows(h, c)?.into_iter().filter(|(s, _)| s.rank > 0) {
        bytes += slot.rank * n * sz + rows * (max_rank * 4 + 2 * n * sz);
        flops += 2 * rows * slot.rank * n;
    }
    Ok(Traffic { bytes: bytes as u64, flops: flops as u64, tensor_cores: false })
}

fn checks(filter: &str) -> Vec<Instance> {
    typed("lora", filter, &DTS, cases) // `lora_shrink` and `lora_expand`, checked together
}

/// Shapes of the cases: `in`, the fused output's width, the projection's columns in it.
const SHAPES: [(usize, usize, usize, usize); 2] = [(96, 200, 40, 160), (256, 64, 0, 64)];
/// Each row's slot: two adapters (ranks 4 and 8) and the base, interleaved.
const ROW_SLOT: [i32; 6] = [0, -1, 1, 0, 1, -1];
const RANKS: [usize; 2] = [4, 8];
const SCALES: [f32; 2] = [0.5, 2.0];

/// Shrink then expand, as the forward pass runs them, on `y` of random values: per shape, the
/// float64 result, then the twins.
fn cases(dt: Dt) -> Vec<Case> {
    let mut out = Vec::new();
    for (i, &(k, ldy, col0, n)) in SHAPES.iter().enumerate() {
        let mut rng = Rng::new(0x10a + i as u64);
        let rows = ROW_SLOT.len();
        let a: Vec<Vec<f32>> = RANKS.iter().map(|&r| rng.values(r * k, 0.5, dt)).collect();
        let bt: Vec<Vec<f32>> = RANKS.iter().map(|&r| rng.values(r * n, 0.5, dt)).collect();
        let (x, y) = (rng.values(rows * k, 1.0, dt), rng.values(rows * ldy, 2.0, dt));
        let want: Vec<f64> = (0..rows * ldy)
            .map(|e| {
                let (t, c) = (e / ldy, e % ldy);
                let base = y[e] as f64;
                let Ok(s) = usize::try_from(ROW_SLOT[t]) else { return base };
                if c < col0 || c >= col0 + n {
                    return base;
                }
                let o = c - col0;
                let d: f64 = (0..RANKS[s])
                    .map(|j| {
                        let v: f64 = (0..k).map(|q| x[t * k + q] as f64 * a[s][j * k + q] as f64).sum();
                        bt[s][j * n + o] as f64 * v
                    })
                    .sum();
                base + SCALES[s] as f64 * d
            })
            .collect();
        let run = move |g: &Gpu, sel: Option<usize>| -> Result<Vec<f32>> {
            let m = sel.map_or(rows, |_| 1);
            // The pool: a gap, then A and B^T of each adapter.
            let mut pool = vec![0.0f32; 8];
            let mut table = Vec::new();
            for s in 0..2 {
                let (a_at, bt_at) = (pool.len(), pool.len() + a[s].len());
                pool.extend(&a[s]);
                pool.extend(&bt[s]);
                table.extend(LoraSlot { a: a_at, bt: bt_at, rank: RANKS[s], scale: SCALES[s] }.bytes()?);
            }
            let pool = put(g, dt, &pool)?;
            let (slots, row_slot) = (put_raw(g, &table)?, put_raw(g, &rows_of(&ROW_SLOT, 1, sel))?);
            let (xb, yb) = (put(g, dt, &rows_of(&x, k, sel))?, put(g, dt, &rows_of(&y, ldy, sel))?);
            let max_rank = 8;
            let v = g.alloc(m * max_rank * 4)?;
            let (slots, row_slot) = (slots.ptr, row_slot.ptr);
            let (pool, x, y) = (pool.ptr, xb.ptr, yb.at(col0 * dt.size()));
            LoraShrink { pool, slots, row_slot, x, v: v.ptr, in_features: k, max_rank }.launch(g, dt, m)?;
            LoraExpand { pool, slots, row_slot, v: v.ptr, y, out_features: n, max_rank, ldy }.launch(g, dt, m)?;
            get(g, dt, &yb, m * ldy)
        };
        let label = format!("in {k}, columns {col0}..{} of {ldy}", col0 + n);
        let reference = Reference::Values(want);
        out.push(Case { label: format!("{label} (float64)"), rows, run: Box::new(run.clone()), reference });
        out.push(against_twin(format!("{label} (vs its twins)"), rows, run));
    }
    out
}
