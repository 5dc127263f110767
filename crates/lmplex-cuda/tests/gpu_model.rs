//! The GPU path's device-free figures (`lmplex_cuda::profile`, the counting executor under the
//! real forward pass of Llama-3.2-1B and Llama-3-8B shapes) against the committed run,
//! `docs/bench/gpu-model.json` (`lmplex bench --workloads gpu-model --json`): no step may issue
//! more launches, or move more bytes against its minimum, than there. An improvement passes;
//! rerun the command into that file to make it the new bar. Needs no GPU and no CUDA library.

use serde_json::Value;

fn steps(shape: &Value) -> Vec<(String, &Value)> {
    let mut out: Vec<(String, &Value)> =
        shape["decode"].as_object().unwrap().iter().map(|(b, v)| (format!("decode {b}"), v)).collect();
    out.push(("prefill_1000".into(), &shape["prefill_1000"]));
    out
}

#[test]
fn no_step_launches_or_moves_more_than_the_committed_run() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/bench/gpu-model.json");
    let committed: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let now = lmplex_cuda::profile::report().unwrap();
    for (k, v) in now["settings"].as_object().unwrap() {
        assert_eq!(v, &committed["settings"][k], "the committed run was measured with another {k}");
    }
    let shapes = committed["shapes"].as_object().unwrap();
    assert_eq!(shapes.len(), 2);
    for (name, shape) in shapes {
        for (step, was) in steps(shape) {
            let is = match step.strip_prefix("decode ") {
                Some(b) => &now["shapes"][name]["decode"][b],
                None => &now["shapes"][name][&step],
            };
            let at = format!("{name} {step}");
            let n = |v: &Value, k: &str| v[k].as_f64().unwrap_or_else(|| panic!("{at}: no {k}"));
            for key in ["launches_per_layer", "launches_per_step"] {
                assert!(n(is, key) <= n(was, key), "{at}: {key} {} where the committed run has {}", is[key], was[key]);
            }
            assert!(
                n(is, "bytes_ratio") <= n(was, "bytes_ratio") + 1e-3,
                "{at}: bytes_ratio {} > {}",
                is["bytes_ratio"],
                was["bytes_ratio"]
            );
            // What holds of any step: it moves at least its minimum, its layer's launches add up,
            // and its modeled time is no faster than its bytes at the bandwidth.
            assert!(n(is, "bytes_ratio") >= 1.0, "{at}: moves less than the step's minimum");
            let layer: f64 = is["layer_launches"].as_object().unwrap().values().map(|v| v.as_f64().unwrap()).sum();
            assert_eq!(layer, n(is, "launches_per_layer"), "{at}");
            assert!(n(is, "modeled_roofline_pct") <= 100.0, "{at}");
        }
    }
}
