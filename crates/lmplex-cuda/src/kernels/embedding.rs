//! `embedding.cu`: the dense embedding gather, its twin and its cases.

use super::check::{against_twin, get, put, put_raw, rows_of, typed, Case, Instance, Rng, DTS};
use super::launch::{dim, int, name, THREADS};
use super::Kernel;
use crate::dtype::Dt;
use crate::exec::Arg::P;
use crate::gpu::Gpu;
use crate::hostexec::{HostExec, Traffic, TwinCall};
use lmplex_core::Result;

pub(super) const KERNEL: Kernel = Kernel { entries: &[("embedding", twin, traffic)], checks };

/// `out[t] = table[ids[t]]` for `rows` rows (zeros for an id outside the vocabulary).
pub struct Embedding {
    pub table: u64,
    pub ids: u64,
    pub out: u64,
    pub hidden: usize,
    pub vocab: usize,
}

impl Embedding {
    pub fn launch(&self, g: &Gpu, dt: Dt, rows: usize) -> Result<()> {
        let args = [P(self.table), P(self.ids), P(self.out), int(self.hidden)?, int(self.vocab)?];
        g.launch(&name("embedding", dt), (dim(rows)?, 1, 1), THREADS, &args)
    }
}

fn twin(h: &HostExec, c: &TwinCall) -> Result<()> {
    let (a, dt) = (&c.args, c.dt);
    a.count(5)?;
    let (table, hidden, vocab) = (a.p(0)?, a.n(3)?, a.n(4)?);
    let ids = h.rd_u32(a.p(1)?, c.rows())?;
    for (t, &id) in ids.iter().enumerate() {
        let row = if (id as usize) < vocab {
            h.rd(table + (id as usize * hidden * dt.size()) as u64, dt, hidden)?
        } else {
            vec![0.0; hidden]
        };
        h.wr(a.p(2)? + (t * hidden * dt.size()) as u64, dt, &row)?;
    }
    Ok(())
}

/// Each row of the table read once, each output row written once, the ids.
fn traffic(_: &HostExec, c: &TwinCall) -> Result<Traffic> {
    let hidden = c.args.n(3)?;
    Ok(Traffic::moves(c.rows() * (2 * hidden * c.dt.size() + 4)))
}

fn checks(filter: &str) -> Vec<Instance> {
    typed("embedding", filter, &DTS, cases)
}

fn cases(dt: Dt) -> Vec<Case> {
    let mut cases = Vec::new();
    for hidden in [64, 300] {
        let mut rng = Rng::new(hidden as u64);
        let (vocab, table) = (50usize, rng.values(50 * hidden, 1.0, dt));
        let ids: Vec<u32> = vec![3, 49, 0, 53, 17, 3];
        cases.push(against_twin(format!("hidden {hidden}, an id past the vocabulary"), ids.len(), move |g, sel| {
            let ids = rows_of(&ids, 1, sel);
            let (t, i, out) = (put(g, dt, &table)?, put_raw(g, &ids)?, g.alloc(ids.len() * hidden * dt.size())?);
            Embedding { table: t.ptr, ids: i.ptr, out: out.ptr, hidden, vocab }.launch(g, dt, ids.len())?;
            get(g, dt, &out, ids.len() * hidden)
        }));
    }
    cases
}
