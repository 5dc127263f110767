//! The Python `ModelHost`: several models in one process inside one memory budget, generating
//! on a named model or routed by its tiers (`route=`), as `lmplex serve` does.
//!
//! Invariant: loading and generation run with the GIL released; every output names the served
//! model that produced it (`RequestOutput.model`), which for a routed call is the one chosen.

use crate::config::{ModelConfig, Tenant};
use crate::engine::StreamIterator;
use crate::errors::to_py;
use crate::prompts::CallArgs;
use crate::route::{Route, TierSet};
use crate::types::RequestOutput;
use lmplex_core::{Error, Result};
use lmplex_engine::{Call, Target};
use pyo3::prelude::*;
use std::sync::Arc;

/// Several models in one process and one memory budget: ``ModelHost([(config, path), ...], ...)``.
#[pyclass(module = "lmplex._core", frozen)]
pub struct ModelHost {
    inner: Arc<lmplex_engine::ModelHost>,
}

#[pymethods]
impl ModelHost {
    #[new]
    #[pyo3(signature = (models, memory_budget_bytes=None, tenants=None, tiers=None, gpu_memory_utilization=None, usage_store=None))]
    #[allow(clippy::too_many_arguments)] // keyword arguments of one Python constructor
    fn new(
        py: Python<'_>,
        models: Vec<(ModelConfig, String)>,
        memory_budget_bytes: Option<u64>,
        tenants: Option<Vec<Tenant>>,
        tiers: Option<TierSet>,
        gpu_memory_utilization: Option<f64>,
        usage_store: Option<String>,
    ) -> PyResult<Self> {
        let list = tenants.unwrap_or_default().into_iter().map(|t| t.inner).collect();
        let tenants = Arc::new(crate::engine::tenants_in(list, usage_store.as_deref())?);
        let budget = memory_budget_bytes.map(|b| usize::try_from(b).unwrap_or(usize::MAX));
        let mut host = lmplex_engine::ModelHost::with_tenants(budget, tenants);
        if let Some(share) = gpu_memory_utilization {
            host = host.with_gpu_memory_utilization(share).map_err(to_py)?;
        }
        let specs: Vec<lmplex_core::ModelConfig> = models.into_iter().map(|(c, p)| c.inner.at(p)).collect();
        py.detach(|| host.load_all(&specs)).map_err(to_py)?;
        if let Some(t) = tiers {
            host.set_tiers(t.inner).map_err(to_py)?;
        }
        Ok(Self { inner: Arc::new(host) })
    }

    /// The served model names, sorted.
    #[getter]
    fn models(&self) -> Vec<String> {
        self.inner.names()
    }

    /// Every served LoRA adapter with its parent model, by adapter name.
    fn lora_adapters(&self) -> std::collections::BTreeMap<String, String> {
        self.inner.adapters()
    }

    /// Reads the PEFT adapter folder ``path`` into ``model`` (the only model when ``None``) and
    /// serves it as ``name``.
    #[pyo3(signature = (name, path, model=None))]
    fn load_lora_adapter(&self, py: Python<'_>, name: &str, path: &str, model: Option<&str>) -> PyResult<()> {
        let inner = self.inner.clone();
        py.detach(move || inner.load_lora_adapter(model, name, path)).map_err(to_py)
    }

    /// Stops serving the adapter ``name``; running requests finish under it.
    fn unload_lora_adapter(&self, name: &str) -> PyResult<()> {
        self.inner.unload_lora_adapter(name).map_err(to_py)
    }

    /// The tiers routed calls choose from.
    #[getter]
    fn tiers(&self) -> TierSet {
        TierSet { inner: self.inner.tiers() }
    }

    /// The CPU's memory budget, in bytes.
    #[getter]
    fn memory_budget_bytes(&self) -> usize {
        self.inner.budget()
    }

    /// Seconds from the start of ``name``'s last load or reload to ready (warm-up included);
    /// ``None`` for a name the host does not know or before its first load ends.
    fn ready_seconds(&self, name: &str) -> Option<f64> {
        self.inner.ready_seconds(name)
    }

    /// ``HostMemory``'s fields as a dict (``lmplex.ModelHost.memory`` wraps it).
    fn memory<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        pythonize::pythonize(py, &self.inner.memory()).map_err(|e| to_py(lmplex_core::Error::internal(e.to_string())))
    }

    /// Runs a call on ``model`` or, without one, where the tiers' router chooses under ``route``.
    #[pyo3(signature = (call, model=None, route=None))]
    fn generate(
        &self,
        py: Python<'_>,
        call: &CallArgs,
        model: Option<String>,
        route: Option<Route>,
    ) -> PyResult<Vec<RequestOutput>> {
        let reqs = call.requests.clone();
        let host = self.inner.clone();
        let route = route.map(|r| r.inner).unwrap_or_default();
        let target = model.map_or(Target::Routed, Target::Named);
        let run = move || -> Result<(String, Vec<lmplex_core::RequestOutput>)> {
            let call = Call::by_name(host.tenants(), &route, reqs)?;
            let s = host.submit(&call, &target)?;
            Ok((s.model, s.handles.into_iter().map(|h| h.collect_blocking()).collect::<Result<_>>()?))
        };
        let (name, outs) = py.detach(run).map_err(to_py)?;
        outs.into_iter().map(|o| RequestOutput::new(py, o, Some(name.clone()))).collect()
    }

    /// Streams a call's one prompt on ``model`` or where the router chooses.
    #[pyo3(signature = (call, model=None, route=None))]
    fn stream(
        &self,
        py: Python<'_>,
        call: &CallArgs,
        model: Option<String>,
        route: Option<Route>,
    ) -> PyResult<StreamIterator> {
        let req = call.one("stream")?;
        let host = self.inner.clone();
        let route = route.map(|r| r.inner).unwrap_or_default();
        let target = model.map_or(Target::Routed, Target::Named);
        let run = move || -> Result<StreamIterator> {
            let call = Call::by_name(host.tenants(), &route, vec![req])?;
            let s = host.submit(&call, &target)?;
            match <[_; 1]>::try_from(s.handles) {
                Ok([handle]) => Ok(StreamIterator::new(handle, s.model)),
                Err(h) => Err(Error::internal(format!("a call of one prompt gave {} streams", h.len()))),
            }
        };
        py.detach(run).map_err(to_py)
    }
}
