//! `Meter` and `LiveSignals`: what a step loop's samples publish.

use super::*;

#[test]
fn averages_start_at_the_first_sample_and_move_by_the_weight() {
    let out = Arc::new(LiveSignals::default());
    let mut m = Meter::new(out.clone());
    m.decode_step(1, Duration::from_millis(10), false);
    assert!((out.time_per_output_token_s() - 0.010).abs() < 1e-12);
    assert!((out.step_s_per_seq() - 0.010).abs() < 1e-12, "one batch size: the upper bound");
    m.decode_step(1, Duration::from_millis(20), false);
    assert!((out.time_per_output_token_s() - 0.012).abs() < 1e-12);
    assert_eq!(out.batch_size(), 1.0);
    m.forward(PREFILL_SAMPLE_TOKENS - 1, Duration::from_secs(1)); // too small to count
    assert_eq!(out.prefill_s_per_token(), 0.0);
    m.forward(64, Duration::from_millis(64));
    assert!((out.prefill_s_per_token() - 0.001).abs() < 1e-12);
    assert!(!out.cooling_down());
    m.failed();
    assert!(out.cooling_down());
}

#[test]
fn calibration_takes_a_high_quantile_of_the_ratios_and_never_goes_below_one() {
    let t = Instant::now();
    let out = Arc::new(LiveSignals::default());
    let mut m = Meter::new(out.clone());
    assert_eq!(out.calibration_at(t), 1.0, "none measured");
    m.calibrate_at(0.5, t);
    assert_eq!(out.calibration_at(t), 1.0, "over-predicted: not below 1");
    let mut m = Meter::new(out.clone());
    m.calibrate_at(1.2, t);
    assert!((out.calibration_at(t) - 1.2).abs() < 1e-12, "the first ratio as it is");
    for i in 0..200 {
        m.calibrate_at(if i % 2 == 0 { 1.0 } else { 1.5 }, t);
    }
    let c = out.calibration_at(t);
    assert!((c - 1.5).abs() < 1e-12, "the second largest: {c}");
    m.calibrate_at(f64::NAN, t);
    assert_eq!(out.calibration_at(t), c, "a bad ratio is ignored");
}

#[test]
fn calibration_relaxes_while_no_routed_request_finishes() {
    let t = Instant::now();
    let out = Arc::new(LiveSignals::default());
    let mut m = Meter::new(out.clone());
    for _ in 0..20 {
        m.calibrate_at(1.0, t);
    }
    // Two requests queued behind work their prediction missed.
    m.calibrate_at(12.0, t);
    m.calibrate_at(12.0, t);
    let high = out.calibration_at(t);
    assert!((high - 12.0).abs() < 1e-9, "{high}");
    let later = |s: u64| out.calibration_at(t + Duration::from_secs(s));
    assert_eq!(later(30), high, "held while requests may still finish");
    assert!((later(40).ln() - high.ln() / 2.0).abs() < 1e-9, "then its log halves in a half-life");
    assert!(later(90) < 1.1, "{}", later(90));
    // A request that finishes after the gap starts from the relaxed state.
    m.calibrate_at(1.0, t + Duration::from_secs(90));
    assert!(out.calibration_at(t + Duration::from_secs(90)) < 1.2);
}

#[test]
fn the_slope_is_fitted_once_batch_sizes_vary() {
    let out = Arc::new(LiveSignals::default());
    let mut m = Meter::new(out.clone());
    // Steps of 5 ms plus 2 ms a request, at batches 1..=8.
    for i in 0..40 {
        let b = 1 + i % 8;
        m.decode_step(b, Duration::from_micros(5000 + 2000 * b as u64), false);
    }
    assert!((out.step_s_per_seq() - 0.002).abs() < 1e-9, "{}", out.step_s_per_seq());
    assert!(out.batch_size() > 1.0 && out.batch_size() < 8.0);
}

#[test]
fn the_step_cost_is_the_line_through_the_passes() {
    let mut m = Meter::new(Arc::new(LiveSignals::default()));
    m.forward(8, Duration::from_millis(18));
    assert_eq!(m.step_cost(), None, "one size: no line");
    // 10 ms a pass and 1 ms a token.
    for tokens in [8, 40, 8, 200, 9, 64, 8] {
        m.forward(tokens, Duration::from_micros(10_000 + 1000 * tokens as u64));
    }
    let c = m.step_cost().unwrap();
    assert!((c.base_s - 0.010).abs() < 1e-9 && (c.s_per_token - 0.001).abs() < 1e-12, "{c:?}");
}

#[test]
fn until_batch_sizes_vary_the_slope_is_a_passs_cost_per_token_within_the_bound() {
    let out = Arc::new(LiveSignals::default());
    let mut m = Meter::new(out.clone());
    for tokens in [8, 40, 8, 200] {
        m.forward(tokens, Duration::from_micros(10_000 + 1000 * tokens as u64));
    }
    m.decode_step(2, Duration::from_millis(12), false);
    assert!((out.step_s_per_seq() - 0.001).abs() < 1e-12, "{}", out.step_s_per_seq());
    let mut m = Meter::new(out.clone());
    for tokens in [8, 40] {
        m.forward(tokens, Duration::from_millis(10 * tokens as u64)); // 10 ms a token
    }
    m.decode_step(2, Duration::from_millis(12), false);
    assert!((out.step_s_per_seq() - 0.006).abs() < 1e-12, "the bound: {}", out.step_s_per_seq());
}

#[test]
fn cached_tokens_count_the_leading_blocks_the_cache_holds() {
    let bs = 4;
    let ids: Vec<TokenId> = (0..11).collect();
    let mut hashes = Vec::new();
    extend_block_hashes(&mut hashes, &ids, ids.len(), bs, Some("t"));
    let mut pool = BlockPool::new(8, true);
    let blocks = pool.allocate(2).unwrap();
    pool.cache_block(blocks[0], hashes[0]);
    let out = Arc::new(LiveSignals::default());
    let mut m = Meter::new(out.clone());
    m.publish_prefix(&pool, true);
    assert_eq!(out.cached_tokens(&ids, Some("t"), bs), 4);
    assert_eq!(out.cached_tokens(&ids, None, bs), 0, "another salt sees nothing");
    pool.cache_block(blocks[1], hashes[1]);
    m.publish_prefix(&pool, true);
    assert_eq!(out.cached_tokens(&ids, Some("t"), bs), 8);
    assert_eq!(out.cached_tokens(&ids[..8], Some("t"), bs), 4, "one token is always computed");
}

#[test]
fn steps_beside_a_busy_model_measure_the_shared_factor_not_the_figures_alone() {
    let out = Arc::new(LiveSignals::default());
    let mut m = Meter::new(out.clone());
    assert_eq!(out.shared_factor(), SHARED_FACTOR_PRIOR, "until measured");
    m.decode_step(1, Duration::from_millis(10), true); // nothing alone yet: taken as alone
    assert!((out.time_per_output_token_s() - 0.010).abs() < 1e-12);
    m.decode_step(1, Duration::from_millis(30), true);
    assert!((out.time_per_output_token_s() - 0.010).abs() < 1e-12, "the figures alone stay");
    assert!((out.shared_factor() - 3.0).abs() < 1e-12);
    // A shared step faster than alone is a step alone: the figure alone was too high.
    m.decode_step(1, Duration::from_millis(5), true);
    assert!((out.shared_factor() - 3.0).abs() < 1e-12);
    let tpot = 0.010 + EWMA * (0.005 - 0.010);
    assert!((out.time_per_output_token_s() - tpot).abs() < 1e-12);
    m.decode_step(1, Duration::from_millis(20), false);
    assert!((out.time_per_output_token_s() - (tpot + EWMA * (0.020 - tpot))).abs() < 1e-12);
}

#[test]
fn the_device_is_guarded_while_a_deadline_is_met_alone_but_not_shared() {
    let out = Arc::new(LiveSignals::default());
    let mut m = Meter::new(out.clone());
    let now = Instant::now();
    let ms = |n: u64| Duration::from_millis(n);
    assert_eq!(m.guard(&[(10, Some(now + ms(150)))], now), None, "nothing measured yet");
    m.decode_step(1, ms(10), false);
    m.decode_step(1, ms(30), true); // shared, the steps take 3x as long
                                    // 10 tokens of 10 ms: met alone (100 <= 150 ms), not shared (300 ms): guarded 100 ms.
    assert_eq!(m.guard(&[(10, Some(now + ms(150)))], now), Some(now + ms(100)));
    assert_eq!(m.guard(&[(10, Some(now + ms(50)))], now), None, "late either way");
    assert_eq!(m.guard(&[(10, Some(now + ms(400)))], now), None, "met either way");
    assert_eq!(m.guard(&[(10, None)], now), None, "no deadline");
    // The latest end of those at risk, each at the batch of all the running ones.
    let (a, b) = (Some(now + ms(250)), Some(now + ms(500)));
    m.decode_step(2, ms(20), false); // a step of 2 alone; the guard times them at batch 2
    let step = out.time_per_output_token_s() + (2.0 - out.batch_size()) * out.step_s_per_seq();
    let want = now + Duration::from_secs_f64(20.0 * step);
    assert_eq!(m.guard(&[(10, a), (20, b)], now), Some(want));
}
