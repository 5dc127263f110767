//! The LoRA adapters one engine serves, by name: where each is read from and which are held in
//! memory now.
//!
//! Data flow: the model's `lora_modules` are read (and so checked) when the engine loads; a
//! request that names an adapter takes its `Arc` at admission (`acquire`, reading it again
//! from its folder if it was let go), the sequence carries it to every forward pass, and the
//! step loop never looks an adapter up by name. `load`/`unload` add and remove adapters at run
//! time (vLLM's `/v1/load_lora_adapter` and `/v1/unload_lora_adapter`).
//!
//! Invariants: the registry keeps at most `max_loras` adapters in memory that no request
//! holds (the least recently used idle one is let go first); adapters held by requests stay,
//! however many, and the scheduler runs at most `max_loras` distinct adapters in a step
//! (`SchedulerConfig::max_loras`), so a request under another adapter waits in the queue (its
//! adapter in host memory) instead of being refused. An adapter is read from disk outside the
//! registry's lock; an adapter loaded while `max_loras` are busy is checked and served, and read
//! again for its first request. Unloading an adapter lets
//! running sequences finish under it; a new adapter under the same name never shares their
//! cached K/V (each load has its own `LoraAdapter::id`, which salts the prefix cache).

use lmplex_core::{Error, ModelConfig, Result};
use lmplex_model::lora::{LoraAdapter, LoraModule};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

/// What an adapter is checked against: the base's adaptable projections and its layer count
/// (`None`: the backend runs no adapter).
pub(crate) type Base = Option<(Vec<LoraModule>, usize)>;

struct Entry {
    path: PathBuf,
    held: Option<Arc<LoraAdapter>>,
    last_used: u64,
}

#[derive(Default)]
struct Inner {
    known: BTreeMap<String, Entry>,
    clock: u64,
}

/// One engine's adapters.
pub struct LoraRegistry {
    base: Base,
    backend: &'static str,
    max_loras: usize,
    max_rank: usize,
    inner: Mutex<Inner>,
}

impl LoraRegistry {
    /// The registry of a model on `backend` (named in errors) whose adapters are checked
    /// against `base`, with `config`'s adapters read and checked now (the first `max_loras`
    /// stay held).
    pub(crate) fn new(base: Base, backend: &'static str, config: &ModelConfig) -> Result<Self> {
        let r = Self {
            base,
            backend,
            max_loras: config.max_loras.max(1),
            max_rank: config.max_lora_rank,
            inner: Mutex::new(Inner::default()),
        };
        for (name, path) in &config.lora_modules {
            r.load(name, path.as_ref())?;
        }
        Ok(r)
    }

    fn lock(&self) -> Result<MutexGuard<'_, Inner>> {
        self.inner.lock().map_err(|_| Error::internal("the adapter registry's lock is poisoned"))
    }

    fn read(&self, name: &str, path: &std::path::Path) -> Result<Arc<LoraAdapter>> {
        let Some((modules, layers)) = &self.base else {
            return Err(Error::invalid(format!(
                "LoRA adapter {name:?}: adapters are off on {} until a device run confirms them \
                 (LMPLEX_CUDA_LORA=1 turns them on); load the model on the CPU",
                self.backend
            )));
        };
        LoraAdapter::load(path, modules, *layers, self.max_rank)
            .map(Arc::new)
            .map_err(|e| Error::model_load(format!("LoRA adapter {name:?}: {e}")))
    }

    /// Reads the adapter in folder `path` and serves it as `name` (replacing an adapter of
    /// that name), held in memory if `max_loras` allows. Nothing changes if it cannot be read.
    pub fn load(&self, name: &str, path: &std::path::Path) -> Result<()> {
        if name.trim().is_empty() {
            return Err(Error::invalid("a LoRA adapter needs a non-empty name"));
        }
        let adapter = self.read(name, path)?;
        let mut inner = self.lock()?;
        inner.known.remove(name);
        // Held if there is room; else known, and read again when a request needs it.
        let held = Self::let_go_idle(&mut inner, self.max_loras - 1).then_some(adapter);
        inner.clock += 1;
        let last_used = inner.clock;
        inner.known.insert(name.to_string(), Entry { path: path.to_path_buf(), held, last_used });
        Ok(())
    }

    /// Stops serving `name`; running sequences finish under it.
    pub fn unload(&self, name: &str) -> Result<()> {
        match self.lock()?.known.remove(name) {
            Some(_) => Ok(()),
            None => Err(Error::invalid(format!("no LoRA adapter named {name:?} is loaded"))),
        }
    }

    /// The adapter `name` for a new request, read again from its folder if it was let go.
    pub(crate) fn acquire(&self, name: &str) -> Result<Arc<LoraAdapter>> {
        let path = {
            let mut inner = self.lock()?;
            Self::let_go_idle(&mut inner, self.max_loras); // those held over it while busy
            inner.clock += 1;
            let now = inner.clock;
            let Some(e) = inner.known.get_mut(name) else {
                let names: Vec<&String> = inner.known.keys().collect();
                return Err(Error::invalid(format!("unknown LoRA adapter {name:?}; this model serves {names:?}")));
            };
            e.last_used = now;
            if let Some(a) = &e.held {
                return Ok(a.clone());
            }
            e.path.clone()
        };
        let adapter = self.read(name, &path)?; // outside the lock: other adapters go on
        let mut inner = self.lock()?;
        match inner.known.get_mut(name) {
            // Read by another request meanwhile: share that one.
            Some(Entry { held: Some(a), .. }) => return Ok(a.clone()),
            Some(e) if e.path == path => {}
            _ => return Err(Error::invalid(format!("LoRA adapter {name:?} was unloaded; retry"))),
        }
        Self::let_go_idle(&mut inner, self.max_loras - 1);
        if let Some(e) = inner.known.get_mut(name) {
            e.held = Some(adapter.clone());
        }
        Ok(adapter)
    }

    /// Lets go of the least recently used idle adapters while more than `keep` are held (busy
    /// ones stay; see the invariants). Returns whether at most `keep` are held.
    fn let_go_idle(inner: &mut Inner, keep: usize) -> bool {
        while inner.known.values().filter(|e| e.held.is_some()).count() > keep {
            let idle = inner
                .known
                .values_mut()
                .filter(|e| e.held.as_ref().is_some_and(|a| Arc::strong_count(a) == 1))
                .min_by_key(|e| e.last_used);
            match idle {
                Some(e) => e.held = None,
                None => return false,
            }
        }
        true
    }

    /// The served adapters' names, sorted.
    pub fn names(&self) -> Vec<String> {
        self.lock().map(|i| i.known.keys().cloned().collect()).unwrap_or_default()
    }

    /// Bytes of the adapters held in memory now.
    pub fn held_bytes(&self) -> usize {
        self.lock()
            .map(|i| i.known.values().filter_map(|e| e.held.as_ref()).map(|a| a.size_in_bytes()).sum())
            .unwrap_or(0)
    }
}
