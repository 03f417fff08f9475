//! The discrete-event simulation: Poisson arrivals, an optional adaptive
//! limit in front, a FIFO queue and a pool of workers behind it.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use tollgate_core::{AdaptiveLimit, Completion, Concurrency, Permit, Priority, Timestamp};

use super::plan::{Jitter, Plan, micros};

/// What stands in front of the backend.
#[derive(Debug, Clone)]
pub enum Protection {
    /// Nothing: every request is queued.
    None,
    /// A [`Concurrency`] under these settings: a request is admitted by
    /// [`Concurrency::try_acquire`] or refused at once, and released as
    /// [`Completion::Served`] when the backend has finished it, or as
    /// [`Completion::Abandoned`] at its deadline if its client gives up
    /// first ([`OverloadOptions::give_up`](super::OverloadOptions::give_up)).
    Adaptive(AdaptiveLimit),
}

impl Protection {
    /// Its name in reports: the algorithm's, or `none`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Adaptive(config) => config.algorithm().name(),
        }
    }
}

/// The length of a [`Window`], in µs.
pub const WINDOW_US: u64 = 100_000;

/// The time between two [`Tick`]s, in µs.
pub const TICK_US: u64 = 10_000;

/// What happened in one 100 ms window, per class in [`Priority::ALL`]'s
/// order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Window {
    /// Requests sent.
    pub offered: [u64; 3],
    /// Requests admitted (all of them without protection).
    pub admitted: [u64; 3],
    /// Requests refused at once.
    pub shed: [u64; 3],
    /// Responses finished in the window.
    pub completed: u64,
    /// Responses finished in the window within their client's deadline.
    pub good: u64,
    /// Critical requests refused at a moment when a sheddable one would
    /// have been admitted (none, if the limit sheds in order).
    pub inverted: u64,
}

/// The state sampled every 10 ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tick {
    /// When, in µs from the start.
    pub at_us: u64,
    /// The limit in force (none without protection).
    pub limit: Option<u32>,
    /// Requests admitted and not finished: queued or being served.
    pub in_flight: u64,
    /// Requests waiting for a worker.
    pub queued: u64,
    /// The backend's workers.
    pub workers: u32,
}

/// One finished request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Response {
    /// When it finished, in µs from the start.
    pub done_us: u64,
    /// From its admission (its arrival) to its completion, in µs.
    pub latency_us: u64,
    /// Its class.
    pub class: Priority,
}

/// Everything one protection did in one scenario.
#[derive(Debug, Clone)]
pub struct OverloadRun {
    /// The protection's name.
    pub name: &'static str,
    /// The scenario as run.
    pub plan: Plan,
    /// Every 100 ms window, from 0.
    pub windows: Vec<Window>,
    /// The state every 10 ms, from 0.
    pub ticks: Vec<Tick>,
    /// Every finished request, in the order finished.
    pub responses: Vec<Response>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// A phase starts: the backend changes.
    Phase(usize),
    /// A candidate arrival (kept or thinned out).
    Arrival,
    /// A job is done.
    Done(usize),
    /// The client of a job (its index and serial number) gives up.
    GiveUp(usize, u64),
    /// The state is sampled.
    Tick,
}

#[derive(Debug)]
struct Job {
    /// Its number among every job of the run.
    serial: u64,
    class: Priority,
    arrived_us: u64,
    /// Its service time as a multiple of the backend's.
    factor: f64,
    permit: Option<Permit>,
}

/// SplitMix64: small, fast, and the same everywhere.
#[derive(Debug, Clone)]
struct Random(u64);

impl Random {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1_u64 << 53) as f64
    }

    /// Exponential with mean 1.
    fn exponential(&mut self) -> f64 {
        -(1.0 - self.unit()).ln()
    }
}

/// The run's time zero on the limit's clock.
const ORIGIN: Timestamp = Timestamp::from_secs(1_000_000);

struct Sim {
    state: Option<Concurrency>,
    events: BinaryHeap<Reverse<(u64, u64, Event)>>,
    seq: u64,
    jobs: Vec<Option<Job>>,
    free: Vec<usize>,
    queue: VecDeque<usize>,
    busy: u32,
    workers: u32,
    service_us: u64,
    windows: Vec<Window>,
    ticks: Vec<Tick>,
    responses: Vec<Response>,
    deadline_us: u64,
    give_up: bool,
    serials: u64,
}

/// Runs `plan` with `protection` in front of the backend.
///
/// Arrivals are Poisson, at the plan's offered load (drawn by thinning,
/// so exactly), each with a class drawn from the mix and a service-time
/// factor drawn from the jitter, all from one seeded stream: every
/// protection sees the same requests. A request that is admitted waits in
/// a FIFO queue for a worker and is served to the end, whether or not its
/// client still waits for it; when workers are taken away, the ones busy
/// finish their request first.
///
/// ```
/// use tollgate_core::{AdaptiveLimit, LimitAlgorithm};
/// use tollgate_sim::overload::{OverloadOptions, Plan, Protection, Scenario, simulate};
///
/// let plan = Plan::new(Scenario::Ramp, &OverloadOptions::default())?;
/// let none = simulate(&plan, &Protection::None);
/// let vegas = AdaptiveLimit::builder("backend").algorithm(LimitAlgorithm::Vegas).build()?;
/// let vegas = simulate(&plan, &Protection::Adaptive(vegas));
/// let good = |run: &tollgate_sim::overload::OverloadRun| -> u64 {
///     run.windows[350..].iter().map(|w| w.good).sum()
/// };
/// assert!(good(&vegas) > 10 * good(&none));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn simulate(plan: &Plan, protection: &Protection) -> OverloadRun {
    let end_us = plan.end_us();
    let state = match protection {
        Protection::None => None,
        Protection::Adaptive(config) => Some(Concurrency::new(config, ORIGIN)),
    };
    let first = plan.phases.first();
    let mut sim = Sim {
        state,
        events: BinaryHeap::new(),
        seq: 0,
        jobs: Vec::new(),
        free: Vec::new(),
        queue: VecDeque::new(),
        busy: 0,
        workers: first.map_or(1, |p| p.workers),
        service_us: first.map_or(1, |p| p.service_us),
        windows: vec![Window::default(); end_us.div_ceil(WINDOW_US) as usize],
        ticks: Vec::with_capacity((end_us / TICK_US) as usize + 1),
        responses: Vec::new(),
        deadline_us: micros(plan.options.deadline),
        give_up: plan.options.give_up,
        serials: 0,
    };
    for (index, phase) in plan.phases.iter().enumerate().skip(1) {
        sim.schedule(phase.start_us, Event::Phase(index));
    }
    sim.schedule(0, Event::Tick);

    let mut random = Random(plan.options.seed);
    let peak = plan.peak_load();
    // Candidate arrivals per µs at the peak load.
    let peak_rate = peak * plan.capacity() / 1e6;
    let mix_total: f64 = plan.options.mix.iter().sum();
    let mut next_arrival = random.exponential() / peak_rate;
    if next_arrival < end_us as f64 {
        sim.schedule(next_arrival as u64, Event::Arrival);
    }

    while let Some(Reverse((now, _, event))) = sim.events.pop() {
        if now >= end_us {
            break;
        }
        match event {
            Event::Phase(index) => {
                if let Some(phase) = plan.phases.get(index) {
                    sim.workers = phase.workers;
                    sim.service_us = phase.service_us;
                }
                sim.dispatch(now);
            }
            Event::Arrival => {
                // The same draws, in the same order, whatever happens next.
                let keep = random.unit() * peak < plan.load_at(now);
                let pick = random.unit() * mix_total;
                let factor = match plan.options.jitter {
                    Jitter::Uniform => 0.8 + 0.4 * random.unit(),
                    Jitter::Exponential => random.exponential(),
                };
                if keep {
                    sim.arrive(now, class_of(pick, &plan.options.mix), factor);
                }
                next_arrival += random.exponential() / peak_rate;
                if next_arrival < end_us as f64 {
                    sim.schedule((next_arrival as u64).max(now), Event::Arrival);
                }
            }
            Event::Done(id) => sim.finish(now, id),
            Event::GiveUp(id, serial) => sim.give_up(now, id, serial),
            Event::Tick => {
                sim.tick(now);
                sim.schedule(now + TICK_US, Event::Tick);
            }
        }
    }

    OverloadRun {
        name: protection.name(),
        plan: plan.clone(),
        windows: sim.windows,
        ticks: sim.ticks,
        responses: sim.responses,
    }
}

/// The class whose share of the mix `pick` (from 0 to the mix's total)
/// falls in.
fn class_of(pick: f64, mix: &[f64; 3]) -> Priority {
    let mut bound = 0.0;
    for (class, share) in Priority::ALL.into_iter().zip(mix) {
        bound += share;
        if pick < bound {
            return class;
        }
    }
    Priority::Sheddable
}

impl Sim {
    fn schedule(&mut self, at: u64, event: Event) {
        self.events.push(Reverse((at, self.seq, event)));
        self.seq += 1;
    }

    fn window(&mut self, now: u64) -> Option<&mut Window> {
        self.windows.get_mut((now / WINDOW_US) as usize)
    }

    fn arrive(&mut self, now: u64, class: Priority, factor: f64) {
        let index = class.index();
        let permit = match &mut self.state {
            None => None,
            Some(state) => {
                let at = ORIGIN + from_micros(now);
                // Asked before the critical request's own refusal, which
                // closes the classes below it: asked after, it never was.
                let sheddable_admitted =
                    class == Priority::Critical && state.would_admit(Priority::Sheddable, at);
                match state.try_acquire(class, at) {
                    Some(permit) => Some(permit),
                    None => {
                        let inverted = sheddable_admitted;
                        if let Some(window) = self.window(now) {
                            window.offered[index] += 1;
                            window.shed[index] += 1;
                            window.inverted += u64::from(inverted);
                        }
                        return;
                    }
                }
            }
        };
        if let Some(window) = self.window(now) {
            window.offered[index] += 1;
            window.admitted[index] += 1;
        }
        let serial = self.serials;
        self.serials += 1;
        let abandoned = self.give_up && permit.is_some();
        let job = Job {
            serial,
            class,
            arrived_us: now,
            factor,
            permit,
        };
        let id = match self.free.pop() {
            Some(id) => {
                if let Some(slot) = self.jobs.get_mut(id) {
                    *slot = Some(job);
                }
                id
            }
            None => {
                self.jobs.push(Some(job));
                self.jobs.len() - 1
            }
        };
        self.queue.push_back(id);
        if abandoned {
            self.schedule(now + self.deadline_us, Event::GiveUp(id, serial));
        }
        self.dispatch(now);
    }

    /// The client of job `id` gives up at `now`, if that job (numbered
    /// `serial`) is still running: its slot is handed back as abandoned,
    /// and the backend goes on with it.
    fn give_up(&mut self, now: u64, id: usize, serial: u64) {
        let Some(job) = self.jobs.get_mut(id).and_then(Option::as_mut) else {
            return;
        };
        if job.serial != serial {
            return;
        }
        if let (Some(state), Some(permit)) = (&mut self.state, job.permit.take()) {
            state.release(permit, ORIGIN + from_micros(now), Completion::Abandoned);
        }
    }

    /// Starts queued jobs on idle workers.
    fn dispatch(&mut self, now: u64) {
        while self.busy < self.workers {
            let Some(id) = self.queue.pop_front() else {
                return;
            };
            let factor = self
                .jobs
                .get(id)
                .and_then(Option::as_ref)
                .map_or(1.0, |job| job.factor);
            let service = (self.service_us as f64 * factor).round().max(1.0) as u64;
            self.busy += 1;
            self.schedule(now + service, Event::Done(id));
        }
    }

    fn finish(&mut self, now: u64, id: usize) {
        self.busy = self.busy.saturating_sub(1);
        if let Some(job) = self.jobs.get_mut(id).and_then(Option::take) {
            self.free.push(id);
            let latency_us = now - job.arrived_us;
            if let (Some(state), Some(permit)) = (&mut self.state, job.permit) {
                state.release(permit, ORIGIN + from_micros(now), Completion::Served);
            }
            self.responses.push(Response {
                done_us: now,
                latency_us,
                class: job.class,
            });
            let good = latency_us <= self.deadline_us;
            if let Some(window) = self.window(now) {
                window.completed += 1;
                window.good += u64::from(good);
            }
        }
        self.dispatch(now);
    }

    fn tick(&mut self, now: u64) {
        let queued = self.queue.len() as u64;
        let (limit, in_flight) = match &self.state {
            Some(state) => (
                Some(state.limit(ORIGIN + from_micros(now))),
                u64::from(state.in_flight()),
            ),
            None => (None, queued + u64::from(self.busy)),
        };
        self.ticks.push(Tick {
            at_us: now,
            limit,
            in_flight,
            queued,
            workers: self.workers,
        });
    }
}

fn from_micros(us: u64) -> std::time::Duration {
    std::time::Duration::from_micros(us)
}
