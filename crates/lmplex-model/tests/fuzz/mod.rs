//! The fuzzers' harness: the allocation check, one case's load and its verdict, and the
//! rounds of cases (see `fuzz_parsers.rs`). `gguf` and `json` hold the mutations.

pub mod gguf;
pub mod json;

use lmplex_core::Error;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Cases per target in CI.
const CASES: u32 = 512;
/// Seconds one load (and chat render) may take.
const HANG_S: u64 = 20;
/// The largest single allocation any case may make.
const MAX_ALLOC: usize = 64 << 20;

/// The system allocator, remembering the largest single allocation since the last reset.
struct Tracking;
static LARGEST: AtomicUsize = AtomicUsize::new(0);
thread_local! { static IN_TRACE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) }; }

unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // Where an oversized allocation comes from (the capture allocates: not again inside it).
        if layout.size() > MAX_ALLOC && !IN_TRACE.with(|t| t.replace(true)) {
            eprintln!("an allocation of {} bytes at\n{}", layout.size(), std::backtrace::Backtrace::force_capture());
            IN_TRACE.with(|t| t.set(false));
        }
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Tracking = Tracking;

/// How the run is bounded: `CASES` (or `LMPLEX_FUZZ_CASES`) cases per round, and rounds until
/// `LMPLEX_FUZZ_SECONDS` have passed (one round without it).
fn bounds() -> (Config, Option<Instant>) {
    let cases = std::env::var("LMPLEX_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(CASES);
    let deadline = std::env::var("LMPLEX_FUZZ_SECONDS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map(|s| Instant::now() + Duration::from_secs(s));
    (Config { cases, failure_persistence: None, max_shrink_iters: 64, ..Config::default() }, deadline)
}

/// Loads `path` (and renders a chat with its template) on a thread of its own; the outcome
/// checked as the module header says. `file` is the name the error must carry.
pub fn check_load(path: &Path, file: &str) -> Result<(), TestCaseError> {
    let p = path.to_path_buf();
    check(path, file, move || {
        let m = lmplex_model::load(&p, Some(32)).map_err(|e| (true, e))?;
        let chat = [lmplex_model::ChatMessage::new("user", "hi")];
        let text = m.tokenizer.apply_chat_template(&chat, true).map_err(|e| (false, e))?;
        m.tokenizer.encode(&text, false).map(|_| ()).map_err(|e| (false, e))
    })
}

/// Runs `job` on a thread of its own and checks its outcome as the module header says: an
/// error it marks as the load's (`true`) must name `file` or `path`.
pub fn check(
    path: &Path,
    file: &str,
    job: impl FnOnce() -> Result<(), (bool, Error)> + Send + std::panic::UnwindSafe + 'static,
) -> Result<(), TestCaseError> {
    // One case at a time in the process, so the largest allocation is this case's.
    static ONE: Mutex<()> = Mutex::new(());
    let _one = ONE.lock().unwrap_or_else(PoisonError::into_inner);
    let shown = path.display().to_string();
    let (tx, rx) = std::sync::mpsc::channel();
    LARGEST.store(0, Ordering::Relaxed);
    std::thread::spawn(move || {
        let out = std::panic::catch_unwind(job);
        let _ = tx.send(out.map_err(|p| {
            p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        }));
    });
    let out = rx
        .recv_timeout(Duration::from_secs(HANG_S))
        .map_err(|_| TestCaseError::fail(format!("{file}: no answer within {HANG_S} s (a hang)")))?;
    let largest = LARGEST.load(Ordering::Relaxed);
    prop_assert!(largest <= MAX_ALLOC, "{file}: an allocation of {largest} bytes");
    match out {
        Err(panic) => Err(TestCaseError::fail(format!("{file}: panicked: {panic:?}"))),
        Ok(Ok(())) => Ok(()),
        // A load error names the file; a chat template's error (at render) is the request's.
        Ok(Err((loading, Error::ModelLoad(m) | Error::InvalidRequest(m)))) => {
            let named = m.contains(file) || m.contains(&shown);
            prop_assert!(!loading || named, "the error names neither {file} nor the checkpoint: {m}");
            prop_assert!(!m.contains("stack backtrace") && !m.contains("RUST_BACKTRACE"), "{m}");
            Ok(())
        }
        Ok(Err((_, e))) => Err(TestCaseError::fail(format!("{file}: not a load error: {e:?}"))),
    }
}

/// Runs rounds of `strategy`'s cases through `case` (see `bounds`), each round from a fresh
/// random seed; prints how many cases `target` ran (`scripts/fuzz-parsers` reads it).
pub fn fuzz<S: Strategy>(target: &str, strategy: S, case: impl Fn(S::Value) -> Result<(), TestCaseError>)
where
    S::Value: std::fmt::Debug,
{
    let (config, deadline) = bounds();
    let mut total = 0u64;
    loop {
        if let Err(e) = TestRunner::new(config.clone()).run(&strategy, &case) {
            panic!("{target}: {e}");
        }
        total += u64::from(config.cases);
        if deadline.is_none_or(|d| Instant::now() > d) {
            break;
        }
    }
    eprintln!("fuzz target {target}: {total} cases");
}
