//! `ModelHost`: several models in one process, on one device, inside one memory budget.
//!
//! Each model's cost is its plan (`EnginePlan::device_bytes`: weights plus its KV pool), read
//! from the checkpoint's headers before anything loads. A model whose plan does not fit the
//! budget left is refused with a `Capacity` error that gives the numbers.
//!
//! Invariants: the sum of the reservations of the loaded (and loading) models never exceeds the
//! budget; a name is loaded at most once; a model is listed only after it loaded and ran a
//! warm-up step, so `get` never returns a model that cannot serve; unloading drops the host's
//! reference (the engine's memory is freed when the last in-flight request holding it ends).

use crate::engine::Engine;
use crate::sizing::EnginePlan;
use lmplex_core::{Error, ModelConfig, Result};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

pub struct ModelHost {
    budget: usize,
    models: RwLock<BTreeMap<String, Arc<Engine>>>,
    /// Bytes reserved per model name, loading ones included.
    reserved: Mutex<BTreeMap<String, usize>>,
}

/// Memory the machine can still give (`MemAvailable`), or `None` where it cannot be read.
pub fn available_memory() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn gib(b: usize) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

impl ModelHost {
    /// A host with `budget` bytes for models, or (`None`) the memory available now.
    pub fn new(budget: Option<usize>) -> Self {
        let budget = budget.or_else(available_memory).unwrap_or(usize::MAX);
        Self { budget, models: RwLock::new(BTreeMap::new()), reserved: Mutex::new(BTreeMap::new()) }
    }

    /// The reservations; a panic elsewhere while holding the lock leaves the map whole (every
    /// update is one insert or remove), so a poisoned lock is still usable.
    fn reservations(&self) -> MutexGuard<'_, BTreeMap<String, usize>> {
        self.reserved.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Bytes reserved by loaded and loading models.
    pub fn reserved(&self) -> usize {
        self.reservations().values().sum()
    }

    /// Loads `config` from `path` as `name`, after checking its plan against the budget, and
    /// runs one warm-up step. `InvalidRequest` when the name is taken; `Capacity` when the
    /// model does not fit; `ModelLoad` for a bad checkpoint.
    pub fn load(&self, name: &str, config: ModelConfig, path: &Path) -> Result<Arc<Engine>> {
        let plan = EnginePlan::new(&config, path)?;
        let need = plan.device_bytes();
        {
            let mut reserved = self.reservations();
            if reserved.contains_key(name) {
                return Err(Error::invalid(format!("a model named '{name}' is already loaded")));
            }
            let used: usize = reserved.values().sum();
            if used.saturating_add(need) > self.budget {
                return Err(Error::capacity(format!(
                    "model '{name}' needs {} ({} weights + {} KV pool) but only {} of the host's {} \
                     budget is free ({} reserved by {} model(s)): lower max_model_len, \
                     max_model_concurrency or kv_cache_bytes, or unload a model",
                    gib(need),
                    gib(plan.model.weight_bytes),
                    gib(plan.kv.kv_cache_bytes()),
                    gib(self.budget.saturating_sub(used)),
                    gib(self.budget),
                    gib(used),
                    reserved.len()
                )));
            }
            reserved.insert(name.to_string(), need);
        }
        let loaded = Engine::new(config, path).and_then(|e| e.warm_up().map(|()| e));
        match loaded {
            Ok(engine) => {
                let engine = Arc::new(engine);
                self.models.write().unwrap_or_else(PoisonError::into_inner).insert(name.to_string(), engine.clone());
                Ok(engine)
            }
            Err(e) => {
                self.reservations().remove(name);
                Err(e)
            }
        }
    }

    /// Removes `name` and releases its reservation; `InvalidRequest` if it is not loaded.
    pub fn unload(&self, name: &str) -> Result<()> {
        if self.models.write().unwrap_or_else(PoisonError::into_inner).remove(name).is_none() {
            return Err(Error::invalid(format!("no model named '{name}' is loaded")));
        }
        self.reservations().remove(name);
        Ok(())
    }

    pub fn get(&self, name: &str) -> Option<Arc<Engine>> {
        self.models.read().unwrap_or_else(PoisonError::into_inner).get(name).cloned()
    }

    /// Loaded model names, sorted.
    pub fn names(&self) -> Vec<String> {
        self.models.read().unwrap_or_else(PoisonError::into_inner).keys().cloned().collect()
    }

    /// Each model's `Engine::memory()`, plus `host`: `budget`, `reserved` and `free`.
    pub fn memory(&self) -> BTreeMap<String, BTreeMap<String, usize>> {
        let mut out: BTreeMap<String, BTreeMap<String, usize>> = self
            .models
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(n, e)| (n.clone(), e.memory()))
            .collect();
        let reserved = self.reserved();
        out.insert(
            "host".into(),
            BTreeMap::from([
                ("budget".into(), self.budget),
                ("reserved".into(), reserved),
                ("free".into(), self.budget.saturating_sub(reserved)),
            ]),
        );
        out
    }
}
