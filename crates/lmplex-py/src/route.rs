//! Python classes for routing: ``Route`` (mode, tier, budgets) and ``TierSet`` (served names per
//! tier), thin mirrors of `lmplex_core::Route` and `lmplex_route::TierSet` (keyword arguments
//! go through their serde derives, as the server's TOML and the API's ``lmplex`` object do).
//!
//! Invariant: a ``Route`` that exists in Python has passed `Route::validate` (finite budgets
//! >= 0, ``fixed`` with a tier); bad values raise ``InvalidRequest`` naming the value.

use crate::errors::{invalid, to_py};
use crate::kwargs::{from_kwargs, repr_changed};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// How a call to ``lmplex:auto`` (or a tier) is routed: ``Route(mode=..., tier=..., max_latency_ms=...,
/// max_cost=...)``.
///
/// ``mode`` is ``fixed``, ``balanced``, ``deep`` or ``max`` (unset: ``fixed`` with a tier, else
/// ``balanced``); ``tier`` one of ``fast``, ``balanced``, ``deep``, ``max``; the budgets bound the
/// predicted end-to-end latency (ms) and the cost bound (docs/routing.md). Every field is optional.
#[pyclass(module = "lmplex._core", frozen, eq)]
#[derive(Clone, PartialEq)]
pub struct Route {
    pub(crate) inner: lmplex_core::Route,
}

#[pymethods]
impl Route {
    #[new]
    #[pyo3(signature = (**fields))]
    fn new(py: Python<'_>, fields: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let inner: lmplex_core::Route = from_kwargs(py, "Route", None, fields)?;
        inner.validate().map_err(to_py)?;
        Ok(Self { inner })
    }

    /// A ``Route`` from a dict of its fields (what :meth:`to_dict` returns).
    #[staticmethod]
    fn from_dict(py: Python<'_>, fields: &Bound<'_, PyDict>) -> PyResult<Self> {
        Self::new(py, Some(fields))
    }

    /// The set fields by name (the API's ``lmplex`` object).
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let d = pythonize::pythonize(py, &self.inner).map_err(|e| invalid(e.to_string()))?;
        let d = d.cast_into::<PyDict>()?;
        let unset: Vec<Bound<'_, PyAny>> = d.iter().filter(|(_, v)| v.is_none()).map(|(k, _)| k).collect();
        for k in unset {
            d.del_item(k)?;
        }
        Ok(d.into_any())
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyAny>,))> {
        Ok((slf.getattr("from_dict")?, (slf.get().to_dict(slf.py())?,)))
    }

    fn __repr__(&self) -> PyResult<String> {
        repr_changed("Route", &self.inner, &lmplex_core::Route::default(), &[])
    }

    /// The mode set, or ``None``.
    #[getter]
    fn mode(&self) -> Option<&'static str> {
        self.inner.mode.map(lmplex_core::Mode::as_str)
    }
    /// The tier set, or ``None``.
    #[getter]
    fn tier(&self) -> Option<&'static str> {
        self.inner.tier.map(lmplex_core::Tier::as_str)
    }
    /// Most predicted end-to-end latency, in ms.
    #[getter]
    fn max_latency_ms(&self) -> Option<f64> {
        self.inner.max_latency_ms
    }
    /// Most cost (the bound: every prompt token and every ``max_tokens`` at the model's prices).
    #[getter]
    fn max_cost(&self) -> Option<f64> {
        self.inner.max_cost
    }
}

/// Served model names per tier: ``TierSet(fast=[...], balanced=[...], deep=[...], max=[...])`` (the
/// server TOML's ``[tiers]``). A tier may be empty; a model may be in several.
#[pyclass(module = "lmplex._core", frozen, eq)]
#[derive(Clone, PartialEq)]
pub struct TierSet {
    pub(crate) inner: lmplex_route::TierSet,
}

#[pymethods]
impl TierSet {
    #[new]
    #[pyo3(signature = (**fields))]
    fn new(py: Python<'_>, fields: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let inner: lmplex_route::TierSet = from_kwargs(py, "TierSet", None, fields)?;
        let all = Self { inner: inner.clone() }.models();
        inner.validate(&all.iter().map(String::as_str).collect::<Vec<_>>()).map_err(to_py)?;
        Ok(Self { inner })
    }

    /// A ``TierSet`` from a dict of its fields (what :meth:`to_dict` returns).
    #[staticmethod]
    fn from_dict(py: Python<'_>, fields: &Bound<'_, PyDict>) -> PyResult<Self> {
        Self::new(py, Some(fields))
    }

    /// Every tier's list by name.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        pythonize::pythonize(py, &self.inner).map_err(|e| invalid(e.to_string()))
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyAny>,))> {
        Ok((slf.getattr("from_dict")?, (slf.get().to_dict(slf.py())?,)))
    }

    fn __repr__(&self) -> PyResult<String> {
        repr_changed("TierSet", &self.inner, &lmplex_route::TierSet::default(), &[])
    }

    /// Low latency, lower quality.
    #[getter]
    fn fast(&self) -> Vec<String> {
        self.inner.fast.clone()
    }
    /// The default trade-off.
    #[getter]
    fn balanced(&self) -> Vec<String> {
        self.inner.balanced.clone()
    }
    /// High quality.
    #[getter]
    fn deep(&self) -> Vec<String> {
        self.inner.deep.clone()
    }
    /// The best resources.
    #[getter]
    fn max(&self) -> Vec<String> {
        self.inner.max.clone()
    }
    /// Every served name in any tier, each once, in tier order.
    fn models(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for t in lmplex_core::Tier::ALL {
            for m in self.inner.models(t) {
                if !out.contains(m) {
                    out.push(m.clone());
                }
            }
        }
        out
    }
}

/// `fields` with a ``Route`` under ``route`` replaced by its dict (so ``Tenant(route=Route(...))``
/// goes through the serde derive like a dict does).
pub(crate) fn route_as_dict<'py>(fields: Option<&Bound<'py, PyDict>>) -> PyResult<Option<Bound<'py, PyDict>>> {
    let Some(f) = fields else { return Ok(None) };
    let f = f.copy()?;
    if let Some(r) = f.get_item("route")? {
        if let Ok(route) = r.cast::<Route>() {
            let d = route.get().to_dict(f.py())?;
            f.set_item("route", d)?;
        }
    }
    Ok(Some(f))
}
