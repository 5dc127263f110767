//! `Call`: one call (an API request, a Python `generate`) carried whole from the edge to the
//! step loop: the tenant it runs for, the route in force and its requests, each sampled `n`
//! times.
//!
//! Data flow: the edge resolves the tenant once (the server by its key, Rust and Python callers
//! by `Request.tenant` through `Call::by_name`) and completes the route once (the call's own
//! fields, then the tenant's default) -> `ModelHost::submit(&Call, &Target)` or
//! `Engine::prepare(&Call)` -> `Prepared` (rendered and tokenized once per engine) ->
//! `Engine::submit_prepared` (admitted once per tenant, queued).
//!
//! Invariants: a `Call` holds one resolved tenant and a validated route, so nothing after the
//! edge looks a tenant up by name or merges a route again; `Request.tenant` is read only by
//! `Call::by_name`; sample `i` of a request with a seed uses `seed + i` (as vLLM does), so each
//! sample is reproducible alone, and the samples of request `k` are the call's sequences
//! `k * n .. (k + 1) * n`.

use crate::engine::Request;
use crate::tenants::{Tenant, Tenants};
use lmplex_core::{Error, Result, Route};
use std::sync::Arc;

/// One call: its tenant, the route in force and its requests; see the module docs.
#[derive(Debug, Clone)]
pub struct Call {
    tenant: Arc<Tenant>,
    route: Route,
    requests: Vec<Request>,
    samples: usize,
}

impl Call {
    /// A call of `requests` for `tenant` (already resolved), routed by `route` with its unset
    /// fields taken from the tenant's default route; `InvalidRequest` for a bad route.
    pub fn new(tenant: Arc<Tenant>, route: &Route, requests: Vec<Request>) -> Result<Self> {
        let route = route.or(&tenant.config().route.unwrap_or_default());
        route.validate()?;
        Ok(Self { tenant, route, requests, samples: 1 })
    }

    /// `new` for the tenant the requests name (`Request.tenant`, looked up once in `tenants`;
    /// none is the default tenant). The requests of one call name one tenant.
    pub fn by_name(tenants: &Tenants, route: &Route, requests: Vec<Request>) -> Result<Self> {
        let name = requests.first().and_then(|r| r.tenant.as_deref());
        if let Some(other) = requests.iter().find(|r| r.tenant.as_deref() != name) {
            return Err(Error::invalid(format!(
                "the requests of one call name one tenant: '{}' and '{}'",
                name.unwrap_or_default(),
                other.tenant.as_deref().unwrap_or_default()
            )));
        }
        Self::new(tenants.get(name)?, route, requests)
    }

    /// Each request sampled `n` times (at least once); see the module docs for the seeds.
    pub fn with_samples(mut self, n: usize) -> Self {
        self.samples = n.max(1);
        self
    }

    /// The tenant every request runs for.
    pub fn tenant(&self) -> &Arc<Tenant> {
        &self.tenant
    }

    /// The route in force: the call's own fields, then the tenant's default (validated).
    pub fn route(&self) -> &Route {
        &self.route
    }

    /// The requests, before sampling.
    pub fn requests(&self) -> &[Request] {
        &self.requests
    }

    /// Samples per request.
    pub fn samples(&self) -> usize {
        self.samples
    }
}
