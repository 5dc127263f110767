//! The LoRA adapters of a host's models, served as models of their own (vLLM's convention): a
//! call that names an adapter runs on its parent model under that adapter.
//!
//! Data flow: each model's adapters are its config's `lora_modules`, read by its engine when it
//! loads (`crate::lora::LoraRegistry`); `load_lora_adapter` reads one into a ready engine and
//! records it in the config, so a model unloaded when idle comes back with the same adapters.
//!
//! Invariants: one name is one thing in the host: no adapter is named like a model or like
//! another model's adapter; an adapter that cannot be read changes nothing; a model's
//! reservation holds its `max_loras` largest adapters (`sizing::lora_plan_bytes`), and a
//! runtime load that grows it past the device's budget is refused as `Capacity`.

use super::{Entry, ModelHost};
use crate::sizing::lora_plan_bytes;
use lmplex_core::{Error, ModelConfig, Result};
use std::collections::BTreeMap;

/// The model whose config serves the adapter `name`.
fn parent_of<'a>(entries: &'a BTreeMap<String, Entry>, name: &str) -> Option<&'a String> {
    entries.iter().find(|(_, e)| e.config.lora_modules.contains_key(name)).map(|(n, _)| n)
}

/// Refuses a model `name` with `config`'s adapters when a name would be taken twice.
pub(super) fn check_names(entries: &BTreeMap<String, Entry>, name: &str, config: &ModelConfig) -> Result<()> {
    if let Some(p) = parent_of(entries, name) {
        return Err(Error::invalid(format!("'{name}' is already the name of a LoRA adapter of model '{p}'")));
    }
    for a in config.lora_modules.keys() {
        if entries.contains_key(a) {
            return Err(Error::invalid(format!("LoRA adapter '{a}' of model '{name}' is named like a loaded model")));
        }
        if let Some(p) = parent_of(entries, a) {
            return Err(Error::invalid(format!("LoRA adapter '{a}' of model '{name}' is already served by '{p}'")));
        }
    }
    Ok(())
}

impl ModelHost {
    /// The model that serves the adapter `name`, if one does.
    pub fn adapter_parent(&self, name: &str) -> Option<String> {
        parent_of(&self.entries(), name).cloned()
    }

    /// Every served adapter with its parent model, by adapter name (adapters of models that
    /// have loaded at least once).
    pub fn adapters(&self) -> BTreeMap<String, String> {
        let entries = self.entries();
        let mut out = BTreeMap::new();
        for (model, e) in entries.iter().filter(|(_, e)| e.loads > 0) {
            out.extend(e.config.lora_modules.keys().map(|a| (a.clone(), model.clone())));
        }
        out
    }

    /// Reads the PEFT adapter folder `path` into `model` (the only model when `None`) and
    /// serves it as `name` (vLLM's `/v1/load_lora_adapter`); an idle model is reloaded first.
    /// Replacing an adapter of the same model is allowed; requests already running keep theirs.
    pub fn load_lora_adapter(&self, model: Option<&str>, name: &str, path: &str) -> Result<()> {
        let model = match model {
            Some(m) => m.to_string(),
            None => match &self.known_names()[..] {
                [one] => one.clone(),
                names => {
                    return Err(Error::invalid(format!(
                        "name the base model of LoRA adapter '{name}': this host serves {names:?}"
                    )))
                }
            },
        };
        {
            let entries = self.entries();
            if entries.contains_key(name) {
                return Err(Error::invalid(format!("LoRA adapter '{name}' is named like a served model")));
            }
            if let Some(p) = parent_of(&entries, name).filter(|p| **p != model) {
                return Err(Error::invalid(format!("LoRA adapter '{name}' is already served by model '{p}'")));
            }
        }
        let engine = self.acquire(&model)?;
        // The model's reservation grows by what the new adapter adds to its plan, if it fits.
        let (config, placement) = {
            let entries = self.entries();
            let e = entries.get(&model).ok_or_else(|| Error::invalid(format!("model '{model}' is not loaded")))?;
            (e.config.clone(), e.placement)
        };
        let mut with = config.clone();
        with.lora_modules.insert(name.to_string(), path.to_string());
        let grow = lora_plan_bytes(&with)?.saturating_sub(lora_plan_bytes(&config)?);
        self.check_fits(&self.entries(), &model, placement, grow, &format!(" more for LoRA adapter '{name}'"))?;
        engine.lora().load(name, std::path::Path::new(path))?;
        if let Some(e) = self.entries().get_mut(&model) {
            e.config.lora_modules.insert(name.to_string(), path.to_string());
            e.need += grow;
        }
        Ok(())
    }

    /// Stops serving the adapter `name` (vLLM's `/v1/unload_lora_adapter`); running requests
    /// finish under it.
    pub fn unload_lora_adapter(&self, name: &str) -> Result<()> {
        let (model, engine) = {
            let mut entries = self.entries();
            let model = parent_of(&entries, name)
                .cloned()
                .ok_or_else(|| Error::invalid(format!("no LoRA adapter named '{name}' is loaded")))?;
            let e = entries.get_mut(&model).ok_or_else(|| Error::internal("a parent without an entry"))?;
            e.config.lora_modules.remove(name);
            (model, e.engine.clone())
        };
        match engine {
            Some(engine) => engine.lora().unload(name).map_err(|e| e.with_context(&format!("model '{model}'"))),
            None => Ok(()),
        }
    }
}
