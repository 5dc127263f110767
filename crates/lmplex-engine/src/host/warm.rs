//! The host's part of warming up: models that share a device measure their steps side by side
//! before traffic, so each one's shared factor (`crate::signals`) is measured, not assumed.

use crate::placement::Placement;
use crate::Engine;
use std::sync::Arc;

/// Runs `Engine::measure_batch` at once on the models of `ready` that share a device with
/// another (one device at a time; a model alone on its device has nothing to measure).
pub(super) fn measure_side_by_side(ready: &[(Placement, Arc<Engine>)]) {
    let mut devices: Vec<Placement> = Vec::new();
    for (p, _) in ready {
        if !devices.contains(p) {
            devices.push(*p);
        }
    }
    for on in devices {
        let group: Vec<&Arc<Engine>> = ready.iter().filter(|(p, _)| *p == on).map(|(_, e)| e).collect();
        if group.len() > 1 {
            std::thread::scope(|s| group.iter().for_each(|e| drop(s.spawn(|| e.measure_batch()))));
        }
    }
}
