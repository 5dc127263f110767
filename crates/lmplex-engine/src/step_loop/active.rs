//! `Active`: a request the loop holds, from its arrival until its last chunk is sent, with what
//! the loop measures about it for the router (its queue time, first token, the largest batch
//! it ran in, and the calibration sample it gives when it ends).

use crate::sequence::Sequence;
use crate::signals::{calibration_sample, Meter, Ran};
use crate::stats::QueueSlot;
use lmplex_core::{Result, StreamChunk};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;

pub(super) struct Active {
    pub seq: Sequence,
    pub tx: UnboundedSender<Result<StreamChunk>>,
    /// Its place in the bounded queue until it is first scheduled.
    pub queue_slot: Option<QueueSlot>,
    pub arrival: Instant,
    /// From arrival to the first step, until its first chunk carries it.
    pub queue_time: Option<Duration>,
    /// Arrival to its first generated token, once sent.
    pub first_token: Option<Duration>,
    /// The most requests a step it was scheduled in held.
    pub max_batch: usize,
    /// Whether a step it was scheduled in ran while another model of the device held requests.
    pub shared: bool,
}

impl Active {
    pub fn new(seq: Sequence, tx: UnboundedSender<Result<StreamChunk>>, slot: QueueSlot, arrival: Instant) -> Self {
        Self {
            seq,
            tx,
            queue_slot: Some(slot),
            arrival,
            queue_time: None,
            first_token: None,
            max_batch: 0,
            shared: false,
        }
    }

    /// It ended now: a request that carried the router's prediction logs what it measured
    /// against it (debug level, target `lmplex::route`) and gives `meter` its calibration
    /// sample, if any (`crate::signals::calibration`).
    pub fn ended(&self, meter: &mut Meter) {
        let Some(p) = &self.seq.predicted else { return };
        let measured = self.arrival.elapsed();
        let ran = Ran {
            measured_s: measured.as_secs_f64(),
            tokens: self.seq.output_ids.len(),
            max_batch: self.max_batch,
            shared: self.shared,
            missed: self.seq.max_latency.is_some_and(|budget| measured > budget),
        };
        let first = self.first_token.unwrap_or_default();
        tracing::debug!(
            target: "lmplex::route",
            fixed_s = p.queue_and_prefill_s,
            tpot_s = p.time_per_output_token_s,
            tokens = ran.tokens,
            first_token_s = first.as_secs_f64(),
            decode_s = measured.saturating_sub(first).as_secs_f64(),
            batch = p.batch,
            max_batch = ran.max_batch,
            predicted_shared = p.shared,
            shared = ran.shared,
            missed = ran.missed,
            "a predicted request ended after {:.3} s (predicted {:.3} s)",
            ran.measured_s,
            p.queue_and_prefill_s + ran.tokens as f64 * p.time_per_output_token_s,
        );
        if let Some(ratio) = calibration_sample(p, &ran) {
            meter.calibrate(ratio);
        }
    }
}
