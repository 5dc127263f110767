//! `ModelHost`: several models in one process, each device's models inside one memory budget.
//!
//! Each model's cost is its plan (`EnginePlan::device_bytes`: weights, its KV pool, on CUDA
//! its workspace, its LoRA adapters held and its draft model), read from the checkpoint's
//! headers before anything loads, on the device the plan places it (`crate::placement`). A
//! model whose plan does not fit its device's budget left is refused with a `Capacity` error
//! that gives the numbers. The CPU's budget is the host's
//! `budget` (default: the memory available at start); a CUDA device's is set with
//! `set_cuda_budget` or, on its first model, `gpu_memory_utilization` of the device's memory
//! less `CUDA_CONTEXT_BYTES` for the context, kernels and cuBLAS that its models share.
//!
//! A model whose config has a `keep_alive_s` is unloaded by [`ModelHost::unload_idle`] once it has been
//! idle that long (no request in it, no caller holding it), and reloaded by
//! [`ModelHost::acquire`] on its next use (from the page cache, so a reload costs about a cold
//! load minus the disk read). Idle models keep their name and configuration but no memory.
//!
//! Invariants: on each device, the sum of the reservations of the loading and ready models
//! never exceeds that device's budget (an idle model reserves nothing, and its reload is
//! checked again); a name is present at most once; `get` and `acquire` never return a model
//! that has not run its warm-up step;
//! unloading drops the host's reference (the engine's memory is freed when the last in-flight
//! request holding it ends).

mod adapters;
mod submit;
mod warm;
pub use submit::{Routed, Submitted, Target};

use crate::budgets::{gib, Budgets};
use crate::engine::Engine;
use crate::placement::Placement;
use crate::report::{DeviceBudget, HostMemory};
use crate::sizing::EnginePlan;
use crate::tenants::Tenants;
use lmplex_core::{Error, ModelConfig, Result};
use lmplex_route::TierSet;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::Instant;

/// Where a model of the host stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelState {
    /// Loading or reloading; holds its reservation.
    Loading,
    /// Loaded and warmed up.
    Ready,
    /// Unloaded after `keep_alive` of idleness; reloads on the next `acquire`.
    Idle,
}

struct Entry {
    config: ModelConfig,
    /// The device its plan placed it on.
    placement: Placement,
    engine: Option<Arc<Engine>>,
    state: ModelState,
    /// Plan bytes, counted against the budget unless idle.
    need: usize,
    last_used: Instant,
    loads: u64,
    /// Seconds the last (re)load took, warm-up included.
    ready_s: f64,
}

/// Several engines by served name in one process, inside one memory budget; see the module docs.
pub struct ModelHost {
    /// The CPU's and each CUDA device's budget.
    budgets: Budgets,
    entries: Mutex<BTreeMap<String, Entry>>,
    /// Signalled whenever a load ends (for callers waiting on a `Loading` model).
    loaded: Condvar,
    /// The tenants every model's requests are admitted for.
    tenants: Arc<Tenants>,
    /// The tiers routed calls choose from (`submit`).
    pub(crate) tiers: RwLock<TierSet>,
    /// Held by `submit` from a call's prediction to its place in a queue.
    pub(crate) submitting: Mutex<()>,
}

/// What the loading and ready models on `on` reserve.
fn reserved_in(entries: &BTreeMap<String, Entry>, on: Placement) -> usize {
    entries.values().filter(|e| e.state != ModelState::Idle && e.placement == on).map(|e| e.need).sum()
}

impl ModelHost {
    /// A host with `budget` bytes for models, or (`None`) the memory available now.
    pub fn new(budget: Option<usize>) -> Self {
        Self::with_tenants(budget, Arc::default())
    }

    /// `new`, with the tenants (their keys and quotas) every model's requests answer to.
    pub fn with_tenants(budget: Option<usize>, tenants: Arc<Tenants>) -> Self {
        Self {
            budgets: Budgets::new(budget),
            entries: Mutex::new(BTreeMap::new()),
            loaded: Condvar::new(),
            tenants,
            tiers: RwLock::default(),
            submitting: Mutex::new(()),
        }
    }

    /// The share (0, 1] of each CUDA device's memory its models may reserve, for devices whose
    /// budget is not set (vLLM's `gpu_memory_utilization`; default 0.9).
    pub fn with_gpu_memory_utilization(mut self, share: f64) -> Result<Self> {
        self.budgets = self.budgets.with_gpu_memory_utilization(share)?;
        Ok(self)
    }

    /// Sets CUDA device `ordinal`'s budget to `bytes` (instead of `gpu_memory_utilization`).
    pub fn set_cuda_budget(&self, ordinal: u32, bytes: usize) {
        self.budgets.set_cuda(ordinal, bytes);
    }

    /// The tenants of this host.
    pub fn tenants(&self) -> &Arc<Tenants> {
        &self.tenants
    }

    /// The table; every update under the lock leaves it whole, so a poisoned lock is usable.
    fn entries(&self) -> MutexGuard<'_, BTreeMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The CPU's memory budget, in bytes.
    pub fn budget(&self) -> usize {
        self.budgets.cpu
    }

    /// Bytes reserved by loading and ready models on the CPU.
    pub fn reserved(&self) -> usize {
        reserved_in(&self.entries(), Placement::Cpu)
    }

    fn check_fits(
        &self,
        entries: &BTreeMap<String, Entry>,
        name: &str,
        on: Placement,
        need: usize,
        plan: &str,
    ) -> Result<()> {
        let budget = self.budgets.of(on)?;
        let used = reserved_in(entries, on);
        if used.saturating_add(need) <= budget {
            return Ok(());
        }
        let holders = entries.values().filter(|e| e.state != ModelState::Idle && e.placement == on).count();
        let whose = match on {
            Placement::Cpu => "the host's".to_string(),
            Placement::Cuda(_) => format!("{on}'s"),
        };
        Err(Error::capacity(format!(
            "model '{name}' needs {}{plan} but only {} of {whose} {} budget is free ({} reserved \
             by {holders} model(s)): lower max_model_len, max_model_concurrency or kv_cache_bytes, \
             or unload a model",
            gib(need),
            gib(budget.saturating_sub(used)),
            gib(budget),
            gib(used),
        )))
    }

    /// Loads `config` (its checkpoint: `ModelConfig::checkpoint`) under its served name
    /// (`ModelConfig::served_name`), after checking its plan against the budget, and runs one
    /// warm-up step. With `keep_alive_s`,
    /// `unload_idle` unloads it after that long unused. `InvalidRequest` when the name is
    /// taken; `Capacity` when the model does not fit; `ModelLoad` for a bad checkpoint.
    pub fn load(&self, config: ModelConfig) -> Result<Arc<Engine>> {
        let name = config.served_name().to_string();
        self.reserve(&name, &config)?;
        self.finish_load(&name, Instant::now(), Engine::with_tenants(config, self.tenants.clone()), true)
    }

    /// Loads several models at once, one thread each, then warms them up one at a time, so each
    /// warm-up's measuring request (`Engine::warm_up`) runs on a quiet device rather than beside
    /// the other loads. Reservations are made first, in the given order, so which model is
    /// refused for lack of room does not depend on timing; a refusal loads nothing. The first
    /// error, naming its model, is returned.
    pub fn load_all(&self, models: &[ModelConfig]) -> Result<()> {
        for (i, config) in models.iter().enumerate() {
            if let Err(e) = self.reserve(config.served_name(), config) {
                let mut entries = self.entries();
                for c in &models[..i] {
                    entries.remove(c.served_name());
                }
                return Err(e);
            }
        }
        let engines: Vec<(Instant, Result<Engine>)> = std::thread::scope(|scope| {
            let loads: Vec<_> = models
                .iter()
                .map(|config| {
                    scope.spawn(move || (Instant::now(), Engine::with_tenants(config.clone(), self.tenants.clone())))
                })
                .collect();
            loads
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| (Instant::now(), Err(Error::internal("a model load panicked")))))
                .collect()
        });
        let mut first_error = None;
        for (config, (started, engine)) in models.iter().zip(engines) {
            let name = config.served_name();
            if let Err(e) = self.finish_load(name, started, engine, true) {
                first_error = first_error.or(Some(e.with_context(&format!("model '{name}'"))));
            }
        }
        warm::measure_side_by_side(&self.ready_of(models));
        first_error.map_or(Ok(()), Err)
    }

    /// The ready models of `models` with their devices.
    fn ready_of(&self, models: &[ModelConfig]) -> Vec<(Placement, Arc<Engine>)> {
        let entries = self.entries();
        let entries = models.iter().filter_map(|c| entries.get(c.served_name()));
        entries.filter_map(|e| Some((e.placement, e.engine.clone()?))).collect()
    }

    /// Checks the plan of `name` against the budget and records it as loading.
    fn reserve(&self, name: &str, config: &ModelConfig) -> Result<()> {
        let context = |e: Error| e.with_context(&format!("model '{name}'"));
        let plan = EnginePlan::new(config).map_err(context)?;
        let need = plan.device_bytes();
        let on = plan.placement;
        self.budgets.of(on).map_err(context)?;
        let mut entries = self.entries();
        if entries.contains_key(name) {
            return Err(Error::invalid(format!("a model named '{name}' is already loaded")));
        }
        adapters::check_names(&entries, name, config)?;
        let device = match on {
            Placement::Cpu => String::new(),
            Placement::Cuda(_) => format!(" + {} workspace on {on}", gib(plan.workspace_bytes)),
        };
        let lora =
            if plan.lora_bytes > 0 { format!(" + {} LoRA adapters", gib(plan.lora_bytes)) } else { String::new() };
        let draft =
            if plan.draft_bytes > 0 { format!(" + {} draft model", gib(plan.draft_bytes)) } else { String::new() };
        let parts = format!(
            " ({} weights + {} KV pool{device}{lora}{draft})",
            gib(plan.model.weight_bytes),
            gib(plan.kv.kv_cache_bytes())
        );
        self.check_fits(&entries, name, on, need, &parts)?;
        entries.insert(
            name.to_string(),
            Entry {
                config: config.clone(),
                placement: on,
                engine: None,
                state: ModelState::Loading,
                need,
                last_used: Instant::now(),
                loads: 0,
                ready_s: 0.0,
            },
        );
        Ok(())
    }

    /// Records the end of a load (warm-up included): ready, or on failure removed (a first
    /// load) or back to idle (a reload).
    fn finish_load(&self, name: &str, started: Instant, engine: Result<Engine>, first: bool) -> Result<Arc<Engine>> {
        let engine = engine.and_then(|e| e.warm_up().map(|()| Arc::new(e)));
        let mut entries = self.entries();
        let result = match (&engine, entries.get_mut(name)) {
            (Ok(e), Some(entry)) => {
                entry.engine = Some(e.clone());
                entry.state = ModelState::Ready;
                entry.last_used = Instant::now();
                entry.loads += 1;
                entry.ready_s = started.elapsed().as_secs_f64();
                Ok(e.clone())
            }
            (Err(_), Some(entry)) if !first => {
                entry.state = ModelState::Idle;
                engine
            }
            (Err(_), Some(_)) => {
                entries.remove(name);
                engine
            }
            (_, None) => Err(Error::invalid(format!("model '{name}' was unloaded while it loaded"))),
        };
        drop(entries);
        self.loaded.notify_all();
        result
    }

    /// Removes `name` and releases its reservation; `InvalidRequest` if it is not present or
    /// still loading.
    pub fn unload(&self, name: &str) -> Result<()> {
        let mut entries = self.entries();
        match entries.get(name).map(|e| e.state) {
            None => Err(Error::invalid(format!("no model named '{name}' is loaded"))),
            Some(ModelState::Loading) => Err(Error::invalid(format!("model '{name}' is still loading"))),
            Some(_) => {
                entries.remove(name);
                Ok(())
            }
        }
    }

    /// The ready engine of `name`, without counting as a use (for reports).
    pub fn get(&self, name: &str) -> Option<Arc<Engine>> {
        self.entries().get(name).and_then(|e| e.engine.clone())
    }

    /// Where model `name` stands, or `None` for a name the host does not know.
    pub fn state(&self, name: &str) -> Option<ModelState> {
        self.entries().get(name).map(|e| e.state)
    }

    /// Seconds from the start of `name`'s last load or reload to ready (warm-up included), or
    /// `None` before its first load ends.
    pub fn ready_seconds(&self, name: &str) -> Option<f64> {
        self.entries().get(name).filter(|e| e.loads > 0).map(|e| e.ready_s)
    }

    /// How many times `name` has loaded (1 plus its reloads).
    pub fn num_loads(&self, name: &str) -> u64 {
        self.entries().get(name).map_or(0, |e| e.loads)
    }

    /// The engine of `name` for a use: waits while it loads, reloads it if idle (blocking; the
    /// budget is checked again). `InvalidRequest` for an unknown name.
    pub fn acquire(&self, name: &str) -> Result<Arc<Engine>> {
        let mut entries = self.entries();
        loop {
            let entry =
                entries.get_mut(name).ok_or_else(|| Error::invalid(format!("no model named '{name}' is loaded")))?;
            match entry.state {
                ModelState::Ready => {
                    entry.last_used = Instant::now();
                    return entry.engine.clone().ok_or_else(|| Error::internal("a ready model has an engine"));
                }
                ModelState::Loading => {
                    entries = self.loaded.wait(entries).unwrap_or_else(PoisonError::into_inner);
                }
                ModelState::Idle => {
                    let (need, on) = (entry.need, entry.placement);
                    self.check_fits(&entries, name, on, need, "")?;
                    let entry = entries.get_mut(name).expect("present");
                    entry.state = ModelState::Loading;
                    let config = entry.config.clone();
                    drop(entries);
                    let started = Instant::now();
                    let engine = Engine::with_tenants(config, self.tenants.clone());
                    return self.finish_load(name, started, engine, false);
                }
            }
        }
    }

    /// Unloads every ready model with a `keep_alive` that has been idle that long; returns
    /// their names. A model counts as in use while it has requests or a caller holds it, and
    /// its idle time restarts then.
    pub fn unload_idle(&self) -> Vec<String> {
        let now = Instant::now();
        let mut out = Vec::new();
        for (name, e) in self.entries().iter_mut() {
            let (Some(keep), Some(engine)) = (e.config.keep_alive(), &e.engine) else { continue };
            let s = engine.stats();
            let busy = Arc::strong_count(engine) > 1
                || s.num_running.load(Ordering::Acquire) + s.num_waiting.load(Ordering::Acquire) > 0
                || s.num_queued.load(Ordering::Acquire) > 0;
            if busy {
                e.last_used = now;
            } else if now.duration_since(e.last_used) >= keep {
                e.engine = None;
                e.state = ModelState::Idle;
                out.push(name.clone());
            }
        }
        out
    }

    /// Names of the ready and idle models, sorted (not those still loading for the first time).
    pub fn names(&self) -> Vec<String> {
        self.entries().iter().filter(|(_, e)| e.loads > 0).map(|(n, _)| n.clone()).collect()
    }

    /// Every name the host knows, loading ones included, sorted.
    pub fn known_names(&self) -> Vec<String> {
        self.entries().keys().cloned().collect()
    }

    /// The CPU's budget and what is reserved of it, each CUDA device's, and each ready model's
    /// `Engine::memory()` by name.
    pub fn memory(&self) -> HostMemory {
        let entries = self.entries();
        let reserved = reserved_in(&entries, Placement::Cpu);
        let cuda = self
            .budgets
            .cuda()
            .into_iter()
            .map(|(n, budget)| {
                let reserved = reserved_in(&entries, Placement::Cuda(n));
                (
                    Placement::Cuda(n).to_string(),
                    DeviceBudget {
                        budget,
                        reserved,
                        free: budget.saturating_sub(reserved),
                        context: lmplex_cuda::device::context_bytes(n),
                    },
                )
            })
            .collect();
        HostMemory {
            budget: self.budgets.cpu,
            reserved,
            free: self.budgets.cpu.saturating_sub(reserved),
            cuda,
            idle_models: entries.values().filter(|e| e.state == ModelState::Idle).count(),
            models: entries.iter().filter_map(|(n, e)| Some((n.clone(), e.engine.as_ref()?.memory()))).collect(),
        }
    }
}
