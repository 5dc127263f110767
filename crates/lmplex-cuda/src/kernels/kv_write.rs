//! `kv_write.cu`: each row's k and v written into the paged cache, its twin and its case.

use super::check::{against_twin, get, put, put_raw, typed, Case, Instance, Rng, DTS};
use super::launch::{dim, int, name, THREADS};
use super::Kernel;
use crate::dtype::Dt;
use crate::exec::Arg::P;
use crate::gpu::Gpu;
use crate::hostexec::{HostExec, Traffic, TwinCall};
use lmplex_core::Result;

pub(super) const KERNEL: Kernel = Kernel { entries: &[("reshape_and_cache", twin, traffic)], checks };

/// Writes each row's k and v into the cache at `slot_mapping[t]` (i64; −1 writes nothing).
pub struct ReshapeAndCache {
    pub k: u64,
    pub v: u64,
    pub k_cache: u64,
    pub v_cache: u64,
    pub slot_mapping: u64,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub k_stride: usize,
    pub v_stride: usize,
}

impl ReshapeAndCache {
    pub fn launch(&self, g: &Gpu, dt: Dt, rows: usize) -> Result<()> {
        let args = [
            P(self.k),
            P(self.v),
            P(self.k_cache),
            P(self.v_cache),
            P(self.slot_mapping),
            int(self.num_kv_heads)?,
            int(self.head_dim)?,
            int(self.k_stride)?,
            int(self.v_stride)?,
        ];
        g.launch(&name("reshape_and_cache", dt), (dim(rows)?, 1, 1), THREADS, &args)
    }
}

fn twin(h: &HostExec, c: &TwinCall) -> Result<()> {
    let (a, dt) = (&c.args, c.dt);
    a.count(9)?;
    let (nkv, hd, ks, vs) = (a.n(5)?, a.n(6)?, a.n(7)?, a.n(8)?);
    let n = nkv * hd;
    let slots = h.rd_i64(a.p(4)?, c.rows())?;
    for (t, &slot) in slots.iter().enumerate() {
        if slot < 0 {
            continue;
        }
        let k = h.rd(a.p(0)? + (t * ks * dt.size()) as u64, dt, n)?;
        let v = h.rd(a.p(1)? + (t * vs * dt.size()) as u64, dt, n)?;
        h.wr(a.p(2)? + (slot as usize * n * dt.size()) as u64, dt, &k)?;
        h.wr(a.p(3)? + (slot as usize * n * dt.size()) as u64, dt, &v)?;
    }
    Ok(())
}

/// Each row with a slot: its k and v read and written into the cache; every row's slot.
fn traffic(h: &HostExec, c: &TwinCall) -> Result<Traffic> {
    let n = c.args.n(5)? * c.args.n(6)?;
    let written = h.rd_i64(c.args.p(4)?, c.rows())?.iter().filter(|&&s| s >= 0).count();
    Ok(Traffic::moves(written * 4 * n * c.dt.size() + c.rows() * 8))
}

fn checks(filter: &str) -> Vec<Instance> {
    typed("reshape_and_cache", filter, &DTS, cases)
}

fn cases(dt: Dt) -> Vec<Case> {
    let mut rng = Rng::new(11);
    let (nkv, hd, rows, slots_total) = (2usize, 64usize, 5usize, 16usize);
    let width = 3 * nkv * hd;
    let x = rng.values(rows * width, 1.0, dt);
    let slots: Vec<i64> = vec![3, -1, 7, 0, 12];
    let label = "5 rows, one with slot -1 (padding)".to_string();
    vec![against_twin(label, 1, move |g, _| {
        let (xb, sb) = (put(g, dt, &x)?, put_raw(g, &slots)?);
        let (kc, vc) = (g.alloc(slots_total * nkv * hd * dt.size())?, g.alloc(slots_total * nkv * hd * dt.size())?);
        ReshapeAndCache {
            k: xb.ptr,
            v: xb.at(nkv * hd * dt.size()),
            k_cache: kc.ptr,
            v_cache: vc.ptr,
            slot_mapping: sb.ptr,
            num_kv_heads: nkv,
            head_dim: hd,
            k_stride: width,
            v_stride: width,
        }
        .launch(g, dt, rows)?;
        let n = slots_total * nkv * hd;
        Ok([get(g, dt, &kc, n)?, get(g, dt, &vc, n)?].concat())
    })]
}
