//! Prometheus metrics (`/metrics`, text format), per model and tenant, with vLLM-like names
//! under `lmplex_`.
//!
//! Counters and histograms are recorded as requests run, labelled by model and tenant; gauges
//! (running, waiting, queue depth, KV usage) are read from each engine's `Stats` when scraped,
//! so they are never stale. Invariant: a `model` label is a served model name and a `tenant`
//! label a configured tenant's name, never a client's unknown string (requests for unknown
//! models count under `model=""`, unauthenticated ones and the default tenant's under
//! `tenant=""`), so clients cannot grow the label set.

use lmplex_engine::{ModelHost, ModelState};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicU64, Ordering};

/// The label of per-model metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabel {
    /// The served model name.
    pub model: String,
}

/// The label of per-request metrics: model and tenant.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabel {
    /// The served model name.
    pub model: String,
    /// The tenant's name; `""` for the default tenant.
    pub tenant: String,
}

/// The label of `lmplex_requests`: model, tenant and how the request ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// The served model name, or `""` for a model the server does not serve.
    pub model: String,
    /// The tenant's name; `""` for the default tenant or an unauthenticated caller.
    pub tenant: String,
    /// `stop`, `length`, `abort` (client went away) or the error's HTTP status.
    pub outcome: String,
}

/// The label of `lmplex_route_decisions`: how a routed call was decided.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabel {
    /// The mode in force (`fixed`, `balanced`, `deep`, `max`).
    pub mode: String,
    /// The call's tier, else the chosen model's first tier.
    pub tier: String,
    /// The served model that ran the call.
    pub model: String,
}

/// The label of `lmplex_route_refusals`: a routed (or budgeted) call that ran nowhere.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabel {
    /// The mode in force.
    pub mode: String,
    /// `budget_unsatisfiable`, or the HTTP status of another refusal.
    pub reason: String,
}

/// The label of `lmplex_model_memory_bytes`: model and category.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MemoryLabel {
    /// The served model name.
    pub model: String,
    /// `weights`, `kv_cache`, `kv_swap`, `workspace`, `graphs` or `other` (`MemoryReport`'s
    /// fields).
    pub category: String,
}

/// The label of the budget gauges: `cpu` or `cuda:N`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeviceLabel {
    /// `cpu` or `cuda:N`.
    pub device: String,
}

type HistFamily = Family<RequestLabel, Histogram, fn() -> Histogram>;

/// Every metric the server exports, registered under the `lmplex_` prefix.
pub struct Metrics {
    registry: Registry,
    /// `lmplex_requests`: finished requests by model, tenant and outcome.
    pub requests: Family<OutcomeLabel, Counter>,
    /// `lmplex_prompt_tokens`: prompt tokens of finished requests.
    pub prompt_tokens: Family<RequestLabel, Counter>,
    /// `lmplex_generation_tokens`: tokens generated.
    pub generation_tokens: Family<RequestLabel, Counter>,
    /// `lmplex_cost`: money spent at the models' prices.
    pub cost: Family<RequestLabel, Counter<f64, AtomicU64>>,
    /// `lmplex_request_queue_time_seconds`: from arrival to the first step.
    pub queue_time: HistFamily,
    /// `lmplex_time_to_first_token_seconds`: from submission to the first token.
    pub ttft: HistFamily,
    /// `lmplex_inter_token_latency_seconds`: between tokens (a chunk's gap split over its tokens).
    pub inter_token: HistFamily,
    /// `lmplex_e2e_request_latency_seconds`: from submission to the last chunk.
    pub e2e: HistFamily,
    /// `lmplex_route_decisions`: routed calls by mode, tier and the model that ran them.
    pub route_decisions: Family<DecisionLabel, Counter>,
    /// `lmplex_route_refusals`: routed or budgeted calls refused, by mode and reason.
    pub route_refusals: Family<RefusalLabel, Counter>,
    /// `lmplex_route_budget_overruns`: requests with a latency budget that ended after it.
    pub route_budget_overruns: Family<RequestLabel, Counter>,
    /// `lmplex_route_fallbacks`: routed calls that ran on a fallback, by that model.
    pub route_fallbacks: Family<ModelLabel, Counter>,
    /// `lmplex_route_latency_ratio`: a routed request's latency over its predicted latency.
    pub route_latency_ratio: Family<ModelLabel, Histogram, fn() -> Histogram>,
    running: Family<ModelLabel, Gauge>,
    waiting: Family<ModelLabel, Gauge>,
    kv_usage: Family<ModelLabel, Gauge<f64, AtomicU64>>,
    swapped_blocks: Family<ModelLabel, Gauge>,
    loaded: Family<ModelLabel, Gauge>,
    loads: Family<ModelLabel, Gauge>,
    memory: Family<MemoryLabel, Gauge>,
    ready: Family<ModelLabel, Gauge<f64, AtomicU64>>,
    budget: Family<DeviceLabel, Gauge>,
    reserved: Family<DeviceLabel, Gauge>,
    context: Family<DeviceLabel, Gauge>,
    unmetered: Counter,
    spec: SpecCounters,
}

/// `lmplex_spec_decode_*` (vLLM's names): each model's speculative-decoding counters, moved up by
/// what its engine counted since the last scrape (an engine reloaded after idleness counts
/// from 0 again, so a smaller reading is all new).
#[derive(Default)]
struct SpecCounters {
    drafts: Family<ModelLabel, Counter>,
    draft_tokens: Family<ModelLabel, Counter>,
    accepted_tokens: Family<ModelLabel, Counter>,
    seen: std::sync::Mutex<std::collections::HashMap<String, [u64; 3]>>,
}

impl SpecCounters {
    fn register(&self, registry: &mut Registry) {
        registry.register("spec_decode_num_drafts", "Decode steps that verified drafted tokens", self.drafts.clone());
        registry.register("spec_decode_num_draft_tokens", "Tokens drafted and verified", self.draft_tokens.clone());
        registry.register(
            "spec_decode_num_accepted_tokens",
            "Drafted tokens accepted: each the token plain decoding picks there",
            self.accepted_tokens.clone(),
        );
    }

    fn read(&self, l: &ModelLabel, now: [u64; 3]) {
        let mut seen = self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let last = seen.entry(l.model.clone()).or_default();
        for ((family, &n), before) in
            [&self.drafts, &self.draft_tokens, &self.accepted_tokens].iter().zip(&now).zip(last.iter())
        {
            family.get_or_create(l).inc_by(if n >= *before { n - before } else { n });
        }
        *last = now;
    }
}

fn latency_buckets() -> Histogram {
    Histogram::new([0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0])
}

fn ratio_buckets() -> Histogram {
    Histogram::new([0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0, 10.0])
}

impl Metrics {
    /// Registers every metric, all empty.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("lmplex");
        let requests = Family::<OutcomeLabel, Counter>::default();
        let prompt_tokens = Family::<RequestLabel, Counter>::default();
        let generation_tokens = Family::<RequestLabel, Counter>::default();
        let cost = Family::<RequestLabel, Counter<f64, AtomicU64>>::default();
        let queue_time: HistFamily = Family::new_with_constructor(latency_buckets);
        let ttft: HistFamily = Family::new_with_constructor(latency_buckets);
        let inter_token: HistFamily = Family::new_with_constructor(latency_buckets);
        let e2e: HistFamily = Family::new_with_constructor(latency_buckets);
        let route_decisions = Family::<DecisionLabel, Counter>::default();
        let route_refusals = Family::<RefusalLabel, Counter>::default();
        let route_budget_overruns = Family::<RequestLabel, Counter>::default();
        let route_fallbacks = Family::<ModelLabel, Counter>::default();
        let route_latency_ratio: Family<ModelLabel, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(ratio_buckets);
        let running = Family::<ModelLabel, Gauge>::default();
        let waiting = Family::<ModelLabel, Gauge>::default();
        let kv_usage = Family::<ModelLabel, Gauge<f64, AtomicU64>>::default();
        let swapped_blocks = Family::<ModelLabel, Gauge>::default();
        let loaded = Family::<ModelLabel, Gauge>::default();
        let loads = Family::<ModelLabel, Gauge>::default();
        let memory = Family::<MemoryLabel, Gauge>::default();
        let ready = Family::<ModelLabel, Gauge<f64, AtomicU64>>::default();
        let budget = Family::<DeviceLabel, Gauge>::default();
        let reserved = Family::<DeviceLabel, Gauge>::default();
        let context = Family::<DeviceLabel, Gauge>::default();
        let unmetered = Counter::default();
        let spec = SpecCounters::default();
        spec.register(&mut registry);
        registry.register("requests", "Finished requests by outcome", requests.clone());
        registry.register("prompt_tokens", "Prompt tokens processed", prompt_tokens.clone());
        registry.register("generation_tokens", "Tokens generated", generation_tokens.clone());
        registry.register("cost", "Money spent at the models' prices", cost.clone());
        registry.register("request_queue_time_seconds", "Time from arrival to the first step", queue_time.clone());
        registry.register("time_to_first_token_seconds", "Time to the first token", ttft.clone());
        registry.register("inter_token_latency_seconds", "Time between streamed tokens", inter_token.clone());
        registry.register("e2e_request_latency_seconds", "Request latency, arrival to last token", e2e.clone());
        registry.register("route_decisions", "Routed calls by mode, tier and chosen model", route_decisions.clone());
        registry.register("route_refusals", "Routed or budgeted calls refused, by reason", route_refusals.clone());
        registry.register(
            "route_budget_overruns",
            "Requests with a latency budget that ended after it",
            route_budget_overruns.clone(),
        );
        registry.register("route_fallbacks", "Routed calls run on a fallback model", route_fallbacks.clone());
        registry.register(
            "route_latency_ratio",
            "A routed request's end-to-end latency over the router's prediction",
            route_latency_ratio.clone(),
        );
        registry.register("num_requests_running", "Requests in the running batch", running.clone());
        registry.register("num_requests_waiting", "Requests waiting to run (new or preempted)", waiting.clone());
        registry.register("kv_cache_usage_ratio", "Fraction of KV blocks held by requests", kv_usage.clone());
        registry.register(
            "kv_swap_used_blocks",
            "Warm-tier KV blocks held by swapped requests",
            swapped_blocks.clone(),
        );
        registry.register(
            "model_loaded",
            "1 while the model is in memory, 0 while unloaded for idleness",
            loaded.clone(),
        );
        registry.register("model_loads", "Times the model has loaded (the first load plus reloads)", loads.clone());
        registry.register("model_memory_bytes", "Bytes a loaded model holds, by category", memory.clone());
        registry.register(
            "model_ready_seconds",
            "Seconds the model's last load or reload took, warm-up included",
            ready.clone(),
        );
        registry.register("memory_budget_bytes", "Bytes the models of a device may reserve", budget.clone());
        registry.register("memory_reserved_bytes", "Bytes reserved by a device's models' plans", reserved.clone());
        registry.register(
            "device_context_bytes",
            "Bytes a CUDA device's context and kernels took when opened, by the driver's count",
            context.clone(),
        );
        registry.register(
            "usage_unmetered_requests",
            "Calls let through unmetered while a fail-open usage store was unavailable",
            unmetered.clone(),
        );
        Self {
            registry,
            requests,
            prompt_tokens,
            generation_tokens,
            cost,
            queue_time,
            ttft,
            inter_token,
            e2e,
            route_decisions,
            route_refusals,
            route_budget_overruns,
            route_fallbacks,
            route_latency_ratio,
            running,
            waiting,
            kv_usage,
            swapped_blocks,
            loaded,
            loads,
            memory,
            ready,
            budget,
            reserved,
            context,
            unmetered,
            spec,
        }
    }

    /// The text exposition, after reading every engine's gauges.
    pub fn render(&self, host: &ModelHost) -> String {
        let unmetered = host.tenants().num_unmetered();
        self.unmetered.inc_by(unmetered.saturating_sub(self.unmetered.get()));
        let mem = host.memory();
        let devices = mem.cuda.iter().map(|(d, b)| (d.clone(), b.budget, b.reserved));
        for (device, budget, reserved) in std::iter::once(("cpu".to_string(), mem.budget, mem.reserved)).chain(devices)
        {
            let l = DeviceLabel { device };
            self.budget.get_or_create(&l).set(i64::try_from(budget).unwrap_or(i64::MAX));
            self.reserved.get_or_create(&l).set(reserved as i64);
        }
        for (device, b) in &mem.cuda {
            if let Some(bytes) = b.context {
                self.context.get_or_create(&DeviceLabel { device: device.clone() }).set(bytes as i64);
            }
        }
        for name in host.names() {
            let m = mem.models.get(&name).copied().unwrap_or_default();
            let categories = [
                ("weights", m.weights),
                ("kv_cache", m.kv_cache),
                ("kv_swap", m.kv_swap),
                ("workspace", m.workspace),
                ("graphs", m.graphs),
                ("other", m.other),
                ("lora_adapters", m.lora_adapters),
            ];
            for (category, bytes) in categories {
                let l = MemoryLabel { model: name.clone(), category: category.into() };
                self.memory.get_or_create(&l).set(bytes as i64);
            }
            let l = ModelLabel { model: name.clone() };
            self.ready.get_or_create(&l).set(host.ready_seconds(&name).unwrap_or(0.0));
            self.loaded.get_or_create(&l).set(i64::from(host.state(&name) == Some(ModelState::Ready)));
            self.loads.get_or_create(&l).set(host.num_loads(&name) as i64);
            let Some(e) = host.get(&name) else {
                // Unloaded: nothing runs and no KV is held.
                self.running.get_or_create(&l).set(0);
                self.waiting.get_or_create(&l).set(0);
                self.kv_usage.get_or_create(&l).set(0.0);
                self.swapped_blocks.get_or_create(&l).set(0);
                continue;
            };
            let s = e.stats();
            let blocks = s.num_kv_blocks.load(Ordering::Relaxed).max(1);
            let free = s.num_free_kv_blocks.load(Ordering::Relaxed);
            self.running.get_or_create(&l).set(s.num_running.load(Ordering::Relaxed) as i64);
            self.waiting.get_or_create(&l).set(s.num_waiting.load(Ordering::Relaxed) as i64);
            self.kv_usage.get_or_create(&l).set(1.0 - free as f64 / blocks as f64);
            let swap_used = s
                .num_swap_blocks
                .load(Ordering::Relaxed)
                .saturating_sub(s.num_free_swap_blocks.load(Ordering::Relaxed));
            self.swapped_blocks.get_or_create(&l).set(swap_used as i64);
            let n = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
            self.spec.read(
                &l,
                [
                    n(&s.spec_decode_num_drafts),
                    n(&s.spec_decode_num_draft_tokens),
                    n(&s.spec_decode_num_accepted_tokens),
                ],
            );
        }
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
