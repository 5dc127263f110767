//! `DeviceLedger`: one device's service ledger, shared by the schedulers of every model on it,
//! and the turn its `fair` models take to run a forward pass.
//!
//! Service is charged in device time: each model's scheduler charges the tokens it computed
//! at its own measured cost per token (`Scheduler::update`), so a tenant's counter is the
//! device seconds it was served, divided by its weight, whichever models served it. The
//! virtual-token-counter rules (`fair`) hold across the device: a tenant that becomes
//! backlogged on any model is lifted to the smallest counter of the tenants backlogged on any.
//!
//! The turn: a model under the `fair` policy runs a step's forward pass only while it holds
//! the device's turn (`Seat::turn`). A free turn goes to the asking model whose step serves
//! the least-served tenant (by priority, then counter, then fewer requests on the device; all
//! read when the turn is handed out, not when asked); at a tie, to the one that asked first.
//! A model between two of its steps (it handed the turn back less than `BETWEEN_STEPS` ago and
//! still has requests) is waited for as if it asked, at its least-served tenant's standing:
//! two busy models would otherwise simply alternate, whatever their tenants' weights, since
//! each finds the other busy with its own host-side work when the turn comes free. A step in
//! progress gives the turn to a model asking for a strictly less-served tenant at its next
//! layer boundary (`Turn::give_way`, on the CPU backend) and goes on when the turn comes
//! back. So while a tenant floods model A, a light tenant's step on model B waits for about
//! one layer of A's step, not for A's queue, and two backlogged tenants on two models share
//! the device by their weights. Models under other policies never ask, and run when they like.
//!
//! The device guard: a model whose running requests with deadlines would meet them alone on
//! the device but not beside another model's steps guards the device until they end
//! (`Seat::guard`, set by its step loop); a model with nothing running starts nothing while
//! another seat's guard holds (`Seat::guarded_by_others`). A budgeted call is accepted on a
//! prediction that counts the work the device holds when it arrives; the guard keeps a model
//! that was idle then from slowing it down later.
//!
//! Invariants: counters are finite, >= 0 and never decrease; a tenant is backlogged while
//! some seat holds one of its requests; a seat's requests leave with it when it is dropped;
//! at most one seat holds the turn, and a `Turn` hands it back when dropped (a panicking step
//! included), so the turn always goes on to a waiting seat.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// How long after handing the turn back a model with requests counts as between two steps
/// (its host-side work: sampling, the stream's chunks, the next schedule) and is waited for.
pub const BETWEEN_STEPS: Duration = Duration::from_millis(2);

/// Where a tenant stands in the turn's order: (priority, counter bits, its requests on the
/// device); smaller goes first. At equal counters (a tenant just lifted to the least-served
/// one's), the tenant with fewer requests goes first, as under `fair` in one model a tenant
/// running nothing does.
type Standing = (i32, u64, usize);

const LAST: Standing = (i32::MAX, u64::MAX, usize::MAX);

/// What a step serves: the priority and tenant of each of its requests.
pub type Serves = Vec<(i32, Arc<str>)>;

/// A seat waiting for the turn, the `order`-th to ask, for a step that `serves` these.
#[derive(Debug)]
struct Ask {
    seat: usize,
    order: u64,
    serves: Serves,
}

#[derive(Debug, Default)]
struct State {
    /// Device seconds served, divided by the weight, per tenant ever seen.
    counters: HashMap<Arc<str>, f64>,
    /// Per seat, its requests per tenant (only tenants with one or more).
    backlog: HashMap<usize, HashMap<Arc<str>, usize>>,
    /// The seat running a forward pass under the turn, if any.
    holder: Option<usize>,
    /// Seats waiting for the turn.
    asking: Vec<Ask>,
    /// When each seat last handed the turn back.
    released: HashMap<usize, Instant>,
    next_seat: usize,
    next_ask: u64,
    /// Per seat, until when its deadlines need the device to itself (`Seat::guard`).
    guards: HashMap<usize, Instant>,
}

impl State {
    /// The latest guard of a seat other than `except` that holds at `now`.
    fn guarded_except(&self, except: usize, now: Instant) -> Option<Instant> {
        self.guards.iter().filter(|&(&seat, &t)| seat != except && t > now).map(|(_, &t)| t).max()
    }

    fn counter(&self, name: &str) -> f64 {
        self.counters.get(name).copied().unwrap_or(0.0)
    }

    fn backlogged(&self, name: &str) -> bool {
        self.backlog.values().any(|b| b.contains_key(name))
    }

    /// Tenant `name`'s requests on every seat.
    fn requests_of(&self, name: &str) -> usize {
        self.backlog.values().filter_map(|b| b.get(name)).sum()
    }

    fn standing_of(&self, priority: i32, name: &str) -> Standing {
        (priority, self.counter(name).to_bits(), self.requests_of(name))
    }

    /// The best standing among `serves` now (a step serving nothing stands last).
    fn standing(&self, serves: &[(i32, Arc<str>)]) -> Standing {
        serves.iter().map(|(p, t)| self.standing_of(*p, t)).min().unwrap_or(LAST)
    }

    /// Whether `seat`, asking, is the one the free turn goes to now; if not only because a
    /// seat between two steps stands before it, until when that seat is waited for.
    fn next_in_turn(&self, seat: usize, now: Instant, grace: Duration) -> Result<(), Option<Instant>> {
        let best = self.asking.iter().min_by_key(|a| (self.standing(&a.serves), a.order)).ok_or(None)?;
        if self.holder.is_some() || best.seat != seat {
            return Err(None);
        }
        let mine = self.standing(&best.serves);
        let between = self.released.iter().filter(|&(&s, &at)| {
            let waits = || self.backlog.get(&s).is_some_and(|b| self.standing_of_backlog(b) < mine);
            s != seat && now < at + grace && !self.asking.iter().any(|a| a.seat == s) && waits()
        });
        match between.map(|(_, &at)| at + grace).max() {
            Some(until) => Err(Some(until)),
            None => Ok(()),
        }
    }

    /// Where a seat's least-served tenant stands (at priority 0).
    fn standing_of_backlog(&self, backlog: &HashMap<Arc<str>, usize>) -> Standing {
        backlog.keys().map(|t| self.standing_of(0, t)).min().unwrap_or(LAST)
    }
}

/// One device's service ledger and turn (see the module header). Share it as an `Arc` among
/// the schedulers of the models on one device; each takes a `Seat`.
#[derive(Debug)]
pub struct DeviceLedger {
    state: Mutex<State>,
    turn_free: Condvar,
    /// `state.asking.len()`, read without the lock by `Turn::give_way`.
    num_asking: AtomicUsize,
    between_steps: Duration,
}

impl Default for DeviceLedger {
    fn default() -> Self {
        Self::new(BETWEEN_STEPS)
    }
}

impl DeviceLedger {
    /// A ledger that counts a model as between two steps for `between_steps` after it hands
    /// the turn back (`BETWEEN_STEPS` by default).
    pub fn new(between_steps: Duration) -> Self {
        Self { state: Mutex::default(), turn_free: Condvar::new(), num_asking: AtomicUsize::new(0), between_steps }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new seat on this ledger, for one model's scheduler.
    pub fn seat(self: &Arc<Self>) -> Seat {
        let mut s = self.lock();
        let id = s.next_seat;
        s.next_seat += 1;
        s.backlog.insert(id, HashMap::new());
        Seat { ledger: self.clone(), id }
    }

    /// Tenant `name`'s counter: device seconds served over its weight (0 for one never seen).
    pub fn counter(&self, name: &str) -> f64 {
        self.lock().counter(name)
    }

    /// How many seats wait for the turn now.
    pub fn num_asking(&self) -> usize {
        self.num_asking.load(Ordering::Relaxed)
    }

    /// The latest device guard of a seat other than `seat` that still holds at `now` (see the
    /// module header).
    pub fn guarded_for(&self, seat: usize, now: Instant) -> Option<Instant> {
        self.lock().guarded_except(seat, now)
    }
}

/// One model's place on a `DeviceLedger`: it charges that model's service and holds its backlog.
#[derive(Debug)]
pub struct Seat {
    ledger: Arc<DeviceLedger>,
    id: usize,
}

impl Seat {
    /// A seat on a ledger of its own (a model that shares its device with no other).
    pub fn alone() -> Self {
        Arc::new(DeviceLedger::default()).seat()
    }

    /// The ledger this seat is on.
    pub fn ledger(&self) -> &Arc<DeviceLedger> {
        &self.ledger
    }

    /// Tenant `name`'s counter.
    pub fn counter(&self, name: &str) -> f64 {
        self.ledger.counter(name)
    }

    /// A request of tenant `name` joined this seat: the tenant, if backlogged nowhere on the
    /// device, is lifted to the smallest counter of the backlogged tenants.
    pub fn arrive(&self, name: &Arc<str>) {
        let mut s = self.ledger.lock();
        if !s.backlogged(name) {
            let floor = s.backlog.values().flat_map(|b| b.keys()).map(|t| s.counter(t)).min_by(f64::total_cmp);
            let c = s.counters.entry(name.clone()).or_insert(0.0);
            if let Some(floor) = floor {
                *c = c.max(floor);
            }
        }
        let mine = s.backlog.get_mut(&self.id).expect("a seat's backlog lives as long as the seat");
        *mine.entry(name.clone()).or_insert(0) += 1;
    }

    /// A request of tenant `name` left this seat (finished or aborted).
    pub fn leave(&self, name: &str) {
        let mut s = self.ledger.lock();
        let mine = s.backlog.get_mut(&self.id).expect("a seat's backlog lives as long as the seat");
        if let Some(n) = mine.get_mut(name) {
            *n -= 1;
            if *n == 0 {
                mine.remove(name);
            }
        }
        drop(s);
        self.ledger.turn_free.notify_all(); // a seat waiting for this one may go on
    }

    /// Adds `seconds` of device time, over `weight`, to tenant `name`'s counter.
    pub fn charge(&self, name: &Arc<str>, weight: f64, seconds: f64) {
        if seconds > 0.0 && seconds.is_finite() {
            *self.ledger.lock().counters.entry(name.clone()).or_insert(0.0) += seconds / weight;
        }
    }

    /// Whether another seat on the device holds requests (its model has work, which a long
    /// step here would hold up).
    pub fn others_busy(&self) -> bool {
        self.ledger.lock().backlog.iter().any(|(&s, b)| s != self.id && !b.is_empty())
    }

    /// Guards the device until `until` for this seat's deadlines, or lifts its guard (`None`).
    pub fn guard(&self, until: Option<Instant>) {
        let mut s = self.ledger.lock();
        match until {
            Some(t) => s.guards.insert(self.id, t),
            None => s.guards.remove(&self.id),
        };
    }

    /// Until when another seat guards the device, if it does at `now`: a model with nothing
    /// running starts nothing before.
    pub fn guarded_by_others(&self, now: Instant) -> Option<Instant> {
        self.ledger.guarded_for(self.id, now)
    }

    /// This seat's number on its ledger.
    pub fn id(&self) -> usize {
        self.id
    }

    /// Waits for the device's turn for a step that serves `serves` (priority, tenant), and
    /// holds it until the returned `Turn` is dropped.
    pub fn turn(&self, serves: Serves) -> Turn {
        let s = self.ledger.lock();
        drop(self.ledger.wait_for_turn(s, self.id, &serves));
        Turn { ledger: self.ledger.clone(), seat: self.id, serves, gave_way: AtomicU64::new(0) }
    }
}

impl DeviceLedger {
    /// Asks for the turn for `seat`'s step serving `serves`, waits until it is handed to it,
    /// and takes it.
    fn wait_for_turn<'a>(
        &'a self,
        mut s: MutexGuard<'a, State>,
        seat: usize,
        serves: &[(i32, Arc<str>)],
    ) -> MutexGuard<'a, State> {
        let order = s.next_ask;
        s.next_ask += 1;
        s.asking.push(Ask { seat, order, serves: serves.to_vec() });
        self.num_asking.store(s.asking.len(), Ordering::Relaxed);
        self.turn_free.notify_all(); // a seat waiting for this one to ask may go on
        loop {
            let now = Instant::now();
            s = match s.next_in_turn(seat, now, self.between_steps) {
                Ok(()) => break,
                Err(None) => self.turn_free.wait(s).unwrap_or_else(PoisonError::into_inner),
                Err(Some(until)) => {
                    self.turn_free.wait_timeout(s, until - now).unwrap_or_else(PoisonError::into_inner).0
                }
            };
        }
        s.asking.retain(|a| a.seat != seat);
        self.num_asking.store(s.asking.len(), Ordering::Relaxed);
        s.holder = Some(seat);
        s
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        let mut s = self.ledger.lock();
        s.backlog.remove(&self.id);
        s.released.remove(&self.id);
        s.guards.remove(&self.id);
        s.asking.retain(|a| a.seat != self.id);
        self.ledger.num_asking.store(s.asking.len(), Ordering::Relaxed);
        drop(s);
        self.ledger.turn_free.notify_all();
    }
}

/// The device's turn, held by one seat for one forward pass; dropping it hands the turn on.
#[derive(Debug)]
pub struct Turn {
    ledger: Arc<DeviceLedger>,
    seat: usize,
    serves: Serves,
    /// Nanoseconds spent in `give_way` waiting for the turn to come back.
    gave_way: AtomicU64,
}

impl Turn {
    /// Gives the turn to a model whose step, asking now, serves a tenant strictly less served
    /// than this step's (by priority, then counter), and waits until the turn comes back; at
    /// once when none asks. Called between the layers of a forward pass (which then goes on
    /// where it stopped), so a light tenant's step on another model waits for one layer of
    /// this step, not all of it.
    pub fn give_way(&self) {
        if self.ledger.num_asking.load(Ordering::Relaxed) == 0 {
            return; // the common case: one atomic load per layer
        }
        let s = self.ledger.lock();
        let mine = s.standing(&self.serves);
        if !s.asking.iter().any(|a| s.standing(&a.serves) < mine) {
            return;
        }
        let t = Instant::now();
        let mut s = s;
        s.holder = None;
        s.released.insert(self.seat, t);
        drop(self.ledger.wait_for_turn(s, self.seat, &self.serves));
        self.gave_way.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    /// Time this step spent giving way (not running), so far.
    pub fn gave_way(&self) -> Duration {
        Duration::from_nanos(self.gave_way.load(Ordering::Relaxed))
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut s = self.ledger.lock();
        if s.holder == Some(self.seat) {
            s.holder = None;
        }
        s.released.insert(self.seat, Instant::now());
        drop(s);
        self.ledger.turn_free.notify_all();
    }
}
