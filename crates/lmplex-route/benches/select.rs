//! What one routing decision costs: `TierSet::select` over 4 and 16 models in every tier
//! (goal: under 20 us a decision).

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use lmplex_core::{Mode, Route, Tier};
use lmplex_route::{Backlog, Device, ModelFacts, ModelSignals, PromptFacts, RouteRequest, Signals, TierSet, Work};

fn setup(n: usize) -> (TierSet, Signals, RouteRequest) {
    let mut tiers = TierSet::default();
    let mut signals = Signals::default();
    let mut req = RouteRequest {
        route: Route { mode: Some(Mode::Deep), tier: None, max_latency_ms: Some(2000.0), max_cost: Some(1e-3) },
        max_tokens: 128,
        ..Default::default()
    };
    for i in 0..n {
        let name = format!("model-{i}");
        for t in Tier::ALL {
            if (i + t as usize).is_multiple_of(2) {
                match t {
                    Tier::Fast => tiers.fast.push(name.clone()),
                    Tier::Balanced => tiers.balanced.push(name.clone()),
                    Tier::Deep => tiers.deep.push(name.clone()),
                    Tier::Max => tiers.max.push(name.clone()),
                }
            }
        }
        let facts = ModelFacts {
            name: name.clone(),
            quality: 40.0 + i as f64,
            price_per_million_input_tokens: 0.1 * (i + 1) as f64,
            price_per_million_output_tokens: 0.4 * (i + 1) as f64,
        };
        let s = ModelSignals {
            available: true,
            num_running: i % 8,
            num_waiting: i % 3,
            max_num_seqs: 8,
            kv_usage: 0.5,
            prefill_s_per_token: 0.0005,
            time_per_output_token_s: 0.01 + 0.002 * i as f64,
            batch_size: 2.0,
            step_s_per_seq: 0.001,
            backlog: Backlog {
                running_left: (0..i % 8).map(|r| 20 * r).collect(),
                ahead: Work::default(),
                behind_deadlines: Work { requests: i % 3, prompt_tokens: 300 * (i % 3), output_tokens: 100 * (i % 3) },
                deadlines: Vec::new(),
            },
            device: Device::default(),
            calibration: 1.0,
        };
        signals.models.insert(name.clone(), (facts, s));
        req.prompts.insert(name, PromptFacts { prompt_tokens: 300, cached_tokens: 64 * (i % 2) });
    }
    (tiers, signals, req)
}

fn bench(c: &mut Criterion) {
    for n in [4, 16] {
        let (tiers, signals, req) = setup(n);
        assert!(tiers.select(&req, &signals).is_ok());
        c.bench_function(&format!("select_deep_{n}_models"), |b| {
            b.iter(|| tiers.select(black_box(&req), black_box(&signals)))
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
