//! A team of threads for the parallel loops of the forward pass. A decode step runs a few
//! hundred short loops (one per projection and layer); waking a sleeping pool thread for each
//! costs tens of microseconds, so team threads spin between loops (as ggml's do) and sleep only
//! after `SPIN` rounds without work. The calling thread works on the loop too.
//!
//! Invariants:
//! - `parallel_for(n, f)` calls `f(i)` exactly once for every `i < n` and returns after the
//!   last call has returned; which thread runs which `i` is not specified, so `f` must make
//!   each task's result independent of the thread (every caller writes disjoint outputs).
//! - One loop runs at a time (a mutex); a second caller waits for the first loop to end.
//! - A loop is announced by opening `state` (its epoch, open bit set) and closed before
//!   `parallel_for` returns. A helper registers in `active` before it reads `state`, and the
//!   caller waits for `active == 0` after closing: so a helper that saw the loop open can still
//!   use its job, and a helper that arrives later sees it closed and touches nothing.
//! - A task that panics ends its own task only; the loop finishes and the panic is raised again
//!   on the caller's thread (as rayon does), never left to hang the loop.
//! - The team has `rayon::current_num_threads() - 1` helpers (so `RAYON_NUM_THREADS` sets the
//!   thread count of the whole backend), started on first use and never stopped.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Condvar, Mutex, OnceLock};

/// Spin rounds before a helper sleeps (about 100 µs).
const SPIN: u32 = 1 << 14;

struct Job<'a> {
    f: &'a (dyn Fn(usize) + Sync),
    n: usize,
}

/// A value on cache lines of its own: the counters below are written by every thread, and
/// sharing a line with the state a waiting thread spins on made each write a transfer of
/// that line between cores.
#[repr(align(128))]
struct Padded<T>(T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

struct Shared {
    /// `epoch << 1 | open`.
    state: Padded<AtomicU64>,
    /// The current loop's job, on the caller's stack while the loop is open.
    job: AtomicPtr<Job<'static>>,
    /// The next unclaimed task.
    next: Padded<AtomicUsize>,
    /// The tasks that have returned (each thread adds its count once it finds none left).
    done: Padded<AtomicUsize>,
    /// Helpers between reading `state` and leaving the loop.
    active: Padded<AtomicUsize>,
    /// A task of the current loop panicked (re-raised on the caller's thread).
    panicked: AtomicBool,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    /// One loop at a time.
    running: Mutex<()>,
    helpers: usize,
}

fn team() -> &'static Shared {
    static TEAM: OnceLock<&'static Shared> = OnceLock::new();
    TEAM.get_or_init(|| {
        let helpers = rayon::current_num_threads().saturating_sub(1);
        let shared: &'static Shared = Box::leak(Box::new(Shared {
            state: Padded(AtomicU64::new(0)),
            job: AtomicPtr::new(std::ptr::null_mut()),
            next: Padded(AtomicUsize::new(0)),
            done: Padded(AtomicUsize::new(0)),
            active: Padded(AtomicUsize::new(0)),
            panicked: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            running: Mutex::new(()),
            helpers,
        }));
        for i in 0..helpers {
            // A helper that cannot start leaves the work to the others and the caller.
            let _ = std::thread::Builder::new().name(format!("lmplex-team-{i}")).spawn(move || helper(shared));
        }
        shared
    })
}

/// Claims and runs tasks of `job` until none is left, then counts them as done (one add per
/// thread and loop, not per task).
fn work(s: &Shared, job: &Job<'_>) {
    let mut ran = 0;
    loop {
        let i = s.next.fetch_add(1, SeqCst);
        if i >= job.n {
            break;
        }
        // A panicking task still counts as done, so the loop ends; the caller re-raises it.
        IN_TASK.set(true);
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (job.f)(i))).is_err() {
            s.panicked.store(true, SeqCst);
        }
        IN_TASK.set(false);
        ran += 1;
    }
    if ran > 0 {
        s.done.fetch_add(ran, SeqCst);
    }
}

fn helper(s: &'static Shared) {
    let mut seen = 0u64;
    loop {
        let mut spins = 0;
        while s.state.load(SeqCst) >> 1 == seen {
            if spins < SPIN {
                spins += 1;
                std::hint::spin_loop();
                continue;
            }
            let guard = s.lock.lock().unwrap_or_else(|p| p.into_inner());
            s.sleepers.fetch_add(1, SeqCst);
            if s.state.load(SeqCst) >> 1 == seen {
                drop(s.wake.wait(guard));
            }
            s.sleepers.fetch_sub(1, SeqCst);
            spins = 0;
        }
        s.active.fetch_add(1, SeqCst);
        let state = s.state.load(SeqCst);
        if state & 1 == 1 {
            // SAFETY: the loop is open and this helper is registered in `active`, so the
            // caller has not returned and the job it stored before opening is alive.
            work(s, unsafe { &*s.job.load(SeqCst) });
        }
        seen = state >> 1;
        s.active.fetch_sub(1, SeqCst);
    }
}

thread_local! {
    /// This thread is running a task (a nested loop runs serially instead of deadlocking).
    static IN_TASK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f(i)` for every `i < n` on the team and the calling thread; returns when all are done.
pub fn parallel_for(n: usize, f: &(dyn Fn(usize) + Sync)) {
    let s = team();
    if n <= 1 || s.helpers == 0 || IN_TASK.get() {
        (0..n).for_each(f);
        return;
    }
    let _one = s.running.lock().unwrap_or_else(|p| p.into_inner());
    let job = Job { f, n };
    s.next.store(0, SeqCst);
    s.done.store(0, SeqCst);
    // The pointer is used only while the loop is open and helpers are registered (above).
    s.job.store((&job as *const Job<'_>).cast_mut().cast(), SeqCst);
    let epoch = (s.state.load(SeqCst) >> 1) + 1;
    s.state.store(epoch << 1 | 1, SeqCst);
    if s.sleepers.load(SeqCst) > 0 {
        let _g = s.lock.lock().unwrap_or_else(|p| p.into_inner());
        s.wake.notify_all();
    }
    work(s, &job);
    while s.done.load(SeqCst) < n {
        std::hint::spin_loop();
    }
    s.state.store(epoch << 1, SeqCst);
    while s.active.load(SeqCst) > 0 {
        std::hint::spin_loop();
    }
    if s.panicked.swap(false, SeqCst) {
        panic!("a task of a parallel loop panicked");
    }
}

/// Raw output cells shared by the tasks of one loop.
#[derive(Clone, Copy)]
pub struct Cells(*mut f32);
// SAFETY: tasks write disjoint cells (the callers' contract) of a buffer that outlives the loop.
unsafe impl Send for Cells {}
unsafe impl Sync for Cells {}

impl Cells {
    /// Cells over `buf`'s values; the caller keeps `buf` alive and unmoved for the loop.
    pub fn new(buf: &mut [f32]) -> Self {
        Self(buf.as_mut_ptr())
    }

    /// Cells over the first `len` values of `buf`'s capacity (reserved here, `buf` emptied):
    /// for a loop whose tasks together write every one of them, after which the caller sets
    /// the length (no zero fill of an output that is about to be overwritten).
    pub fn uninit(buf: &mut Vec<f32>, len: usize) -> Self {
        buf.clear();
        buf.reserve_exact(len);
        Self(buf.as_mut_ptr())
    }

    /// The cell at `i`, for tasks that write scattered cells.
    ///
    /// # Safety
    /// `i` is inside the buffer; writes through it follow the disjointness contract above.
    pub unsafe fn ptr(&self, i: usize) -> *mut f32 {
        self.0.add(i)
    }

    /// # Safety
    /// `start..start + len` is inside the buffer and no other task touches it during the loop.
    #[allow(clippy::mut_from_ref)] // disjointness is the caller's contract (above)
    pub unsafe fn slice(&self, start: usize, len: usize) -> &mut [f32] {
        std::slice::from_raw_parts_mut(self.0.add(start), len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once_across_many_loops() {
        for n in [0usize, 1, 2, 7, 1000] {
            for _ in 0..200 {
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                parallel_for(n, &|i| {
                    hits[i].fetch_add(1, SeqCst);
                });
                assert!(hits.iter().all(|h| h.load(SeqCst) == 1));
            }
        }
    }

    #[test]
    fn nested_loops_and_panics_end() {
        let total = AtomicUsize::new(0);
        parallel_for(8, &|_| {
            parallel_for(4, &|_| {
                total.fetch_add(1, SeqCst);
            })
        });
        assert_eq!(total.load(SeqCst), 32);
        let caught = std::panic::catch_unwind(|| parallel_for(16, &|i| assert_ne!(i, 5)));
        assert!(caught.is_err());
        parallel_for(16, &|_| {}); // the team still works
    }

    #[test]
    fn concurrent_callers_take_turns() {
        let total = AtomicUsize::new(0);
        std::thread::scope(|sc| {
            for _ in 0..3 {
                sc.spawn(|| {
                    for _ in 0..100 {
                        parallel_for(50, &|_| {
                            total.fetch_add(1, SeqCst);
                        });
                    }
                });
            }
        });
        assert_eq!(total.load(SeqCst), 3 * 100 * 50);
    }
}
