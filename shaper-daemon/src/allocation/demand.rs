//! Demand estimation: what each leaf class would send if it could, from the datapath's
//! counters, every tick. The allocator ([`crate::allocation::tree`]) turns demands into allocations, and
//! [`crate::allocation::pacing`] allocations into the rates the datapath paces at.
//!
//! A class is *limited* when its pacing rate holds it back, and the sign of that is a queue
//! that never empties: over the last [`QUEUE_WINDOW_NS`] (or four full frames at its rate, if
//! longer) it sent packets and none of them found the class's clock idle (the datapath's
//! `idle_packets` counter), or its clock is now further ahead than that window (a queue that
//! cannot drain within it). A class sending below its pacing rate, however close to it, finds
//! its clock idle now and then, so a steady stream is never mistaken for a greedy sender
//! (which a test on the sent rate alone does: a class paced at what it sends always sends at
//! its pacing rate).
//!
//! - A class whose queue is deeper than two queue windows (and 100 ms) is far from what it
//!   needs (a TCP sender's first windows, a flood): it wants all it can get, as HTB would
//!   give it at once, and the allocator caps it at its share or ceil.
//! - Any other limited class wants what arrives plus what drains its queue within 100 ms, and never
//!   less than its pacing rate (it uses all of it). If what
//!   arrives keeps up with its pacing rate (its queue did not shrink over the queue window),
//!   it would send more if it could: it wants its pacing rate times `1 + g`, where `g` starts at 1/16 and
//!   doubles with every further such tick, up to one. A greedy sender so doubles per tick
//!   until the allocator caps it at its share or ceil (a class that joins at 0.3 mbit/s
//!   reaches 8 within about ten ticks), while a stream whose packets come bunched (its
//!   sender stalled, then caught up) gets what drains the bunch, and no more. The datapath
//!   counts packets when it paces them, so the counters give the arrival rate.
//! - A class that is not limited wants what it offered over [`RATE_WINDOW_NS`] (or over the
//!   last 100 ms, if more and the class was limited within the long window: it sends at its
//!   new rate (not otherwise: an application writing 16 KB every 50 ms has two writes or
//!   three in 100 ms, and its demand would follow them); or if less than half: a class that
//!   stopped gives its share back at once; nothing, after a silence of
//!   200 ms, or four frames' time at its rate if longer, or once it has paused twice as long
//!   as its longest pause of the last 2 s and two ticks at least (an on/off sender, off after
//!   20 ms; an application writing every 50 ms learns its pauses); and a class quiet until a moment
//!   ago, over the time since it was last quiet, once it has sent four full frames) plus
//!   [`HEADROOM_PERCENT`], so that its own jitter does not queue it; a new demand within a
//!   dead band around the last one keeps the last one, so that a steady sender's allocation
//!   (and so its borrowers') does not follow the window's sampling noise (packets entering
//!   and leaving it).
//!
//! The headroom is not lent: the rates paced add up to at most the link, and a link a
//! greedy class shares with steady ones runs at `1 - 2 % * (their share)` of its rate (99.6 %
//! next to a 2 mbit/s stream on 10 mbit/s). Lending it too was tried in the model (`model.rs`,
//! with a datapath link clock): the sum of the rates then exceeds the link whenever the steady
//! classes use their headroom, and a link clock that takes slots when packets are paced
//! cannot hold back packets already given a departure time.
//!
//! A class is never paced below its guaranteed rate, and a quiet class is paced at what it
//! would be given if it woke ([`crate::allocation::pacing`]): a class that starts sending gets its share
//! at once, without waiting for a tick; the borrowers are moved down at the next tick.

use smallvec::SmallVec;
use strength_reduce::StrengthReducedU64;

/// Window over which the offered rate of a class that is not limited is measured.
pub const RATE_WINDOW_NS: u64 = 400_000_000;
/// Shortest window over which a class must have had a queue throughout to count as limited.
pub const QUEUE_WINDOW_NS: u64 = 50_000_000;
/// Shortest window over which the offered rate of a class limited a moment ago is read too.
const RECENT_NS: u64 = 100_000_000;
/// Headroom over the offered rate of a class that is not limited (2 %, plus 8 kbit/s so that
/// a class that starts sending is not paced at nothing).
pub const HEADROOM_PERCENT: u64 = 2;
pub const HEADROOM_FLOOR: u64 = 8_000;
/// The dead band: a class that is not limited keeps its last demand while that is between
/// `offered * (1 + DEAD_BAND_LOW_PERCENT)` and `offered * (1 + DEAD_BAND_HIGH_PERCENT)`.
pub const DEAD_BAND_LOW_PERCENT: u64 = 1;
pub const DEAD_BAND_HIGH_PERCENT: u64 = 4;
/// A limited class's first growth step, as a divisor: `1 + 1/16`; each further limited tick
/// doubles the step, up to doubling the rate.
const FIRST_GROWTH_DIVISOR: u64 = 16;
/// A class that sent nothing for this long (or four frames' time at its rate, if longer)
/// wants nothing. An application's pauses between writes are shorter.
const SILENCE_NS: u64 = 200_000_000;
/// A limited class is given at least what drains its queue within this long.
const DRAIN_NS: u64 = 100_000_000;
/// A full-size Ethernet frame, in bits.
pub(crate) const FRAME_BITS: u64 = shaper_common::FULL_FRAME * 8;

/// The datapath's cumulative counters of one class, as the estimator reads them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Bytes offered: sent plus dropped (wire bytes).
    pub offered_bytes: u64,
    /// Packets (segments) sent.
    pub packets: u64,
    /// Packets that found the class's clock idle.
    pub idle_packets: u64,
}

/// What the daemon observes of one leaf class at a tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    /// `CLOCK_MONOTONIC` time of the observation, ns.
    pub now_ns: u64,
    pub counters: Counters,
    /// How far the class's clock is ahead of now, ns (0 if behind).
    pub backlog_ns: u64,
    /// The rate the class is paced at, bits/s.
    pub pacing: u64,
}

/// What the estimator concluded at a tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Estimate {
    /// What the class wants, bits/s; `u64::MAX` for a class with a deep queue (all it can get).
    pub demand: u64,
    /// The offered rate over [`RATE_WINDOW_NS`], bits/s.
    pub offered: u64,
    /// Whether the pacing rate holds the class back.
    pub limited: bool,
    /// Whether it did within [`RATE_WINDOW_NS`]: the class would send more (a greedy TCP
    /// flow between two windows is not limited for a moment).
    pub lately_limited: bool,
    /// The offered rate over the queue window ([`QUEUE_WINDOW_NS`], or four full frames at
    /// its pacing rate if longer), bits/s: what it sends now.
    pub sending: u64,
}

/// The counter histories of a set of leaf classes, kept by row: one row a tick, with its
/// time, the classes side by side in it (each in its column). Every class updated at a tick
/// is observed at the row's time, so a window starts at the same row for all of them, and a
/// tick reads each of the rows it needs from one end to the other: at 10,000 classes the
/// histories do not fit in the caches, and a class's own history, one block per class, made a
/// tick wait on a load that missed them for each window of each class (at 10,000 classes,
/// 1.5-2.8 ms a tick rather than 1.05-1.3, old and new builds alternated on one machine).
#[derive(Debug)]
pub struct Histories {
    /// The rows with their times, oldest first, covering [`RATE_WINDOW_NS`]: the oldest is at
    /// or before its start.
    rows: Vec<(u64, Vec<Sample>)>,
    /// Rows forgotten, kept for the next ones.
    spare: Vec<Vec<Sample>>,
    /// The time between the two newest rows (1 ns if there is one row), as a divisor: where
    /// a search starts.
    spacing: StrengthReducedU64,
    /// Per window of [`COMMON_WINDOWS`], the newest row at least that old at the last row's
    /// time, if any: where that window starts for every class whose history reaches back to it.
    common: [Option<usize>; COMMON_WINDOWS.len()],
    /// Per row, the time from it to the last row as a divisor, computed once a tick (`None`
    /// for the last row: a rate over no time is 0). Every rate an estimate reads is from a
    /// row to the last: at 10,000 classes paced at a few hundred kbit/s, whose windows are
    /// not the common ones, a division for each was a fifth of a tick (a 64-bit division
    /// takes 40-90 cycles on older x86 cores).
    elapsed: Vec<Option<Divisor>>,
}

/// The windows a class reads at the rates most classes are paced at (the queue window, the
/// recent window and the silence window, at their floors): at 10,000 classes, searching the
/// rows for each window of each class, and dividing by each window's length, were a third of
/// a tick's estimates; a tick now finds each of these rows once, and divides by the time
/// since it as multiplications.
const COMMON_WINDOWS: [u64; 3] = [QUEUE_WINDOW_NS, RECENT_NS, SILENCE_NS];

impl Default for Histories {
    fn default() -> Self {
        Self {
            rows: Vec::new(),
            spare: Vec::new(),
            spacing: StrengthReducedU64::new(1),
            common: [None; COMMON_WINDOWS.len()],
            elapsed: Vec::new(),
        }
    }
}

impl Histories {
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts the row of the tick at `now`, with room for the columns below `width`: the
    /// estimators updated at this tick observe their classes at `now`, which is never earlier
    /// than the last row's (a second start at the same time keeps that row). Rows older than
    /// the longest window are forgotten.
    pub fn start_row(&mut self, now: u64, width: usize) {
        if self.rows.last().is_none_or(|&(last, _)| now > last) {
            let row = self.spare.pop().unwrap_or_default();
            slide_with(&mut self.rows, now, row, RATE_WINDOW_NS, |row| self.spare.push(row));
            self.find_common(now);
        }
        // What a row held before it was reused is never read: each estimator knows which rows
        // hold its class's samples.
        if let Some((_, row)) = self.rows.last_mut().filter(|(_, row)| row.len() < width) {
            row.resize(width, Sample::default());
        }
    }

    /// Finds the rows [`Self::common`] and [`Self::elapsed`] keep, and the rows' spacing, for
    /// the row at `now`.
    fn find_common(&mut self, now: u64) {
        let rows = &self.rows;
        let n = rows.len();
        let spacing = if n >= 2 { rows[n - 1].0.saturating_sub(rows[n - 2].0).max(1) } else { 1 };
        self.spacing = StrengthReducedU64::new(spacing);
        self.common = COMMON_WINDOWS.map(|window| rows.iter().rposition(|&(t, _)| now.saturating_sub(t) >= window));
        self.elapsed.clear();
        self.elapsed.extend(rows.iter().map(|&(t, _)| Divisor::new(now - t)));
    }

    /// The rate of `bytes` since row `i` to the last row, bits/s, as [`bits_per_sec`] gives
    /// it.
    fn rate_since(&self, i: usize, bytes: u64) -> u64 {
        self.elapsed[i].map_or(0, |ns| ns.mul_div(bytes, 8_000_000_000))
    }

    /// The time of row `i`.
    fn time(&self, i: usize) -> u64 {
        self.rows[i].0
    }

    /// Row `i` and the sample of `column` in it.
    fn get(&self, i: usize, column: usize) -> (usize, Sample) {
        (i, self.rows[i].1[column])
    }
}

/// The demand estimator of one leaf class: where its history is in [`Histories`], and its
/// last demand.
#[derive(Debug, Clone)]
pub struct Estimator {
    /// The time of the last row the class was observed at.
    last_ns: When,
    /// The rows in a row, up to that one, the class was observed at: its history (a class
    /// missing from a row, new or skipped by a failed tick, starts a new one).
    rows: u16,
    /// The last demand given.
    demand: u64,
    /// Limited ticks in a row whose queue did not shrink (or was deep).
    streak: u8,
    /// The last observation at which the class was quiet (had offered less than
    /// [`WAKE_BYTES`] over the silence window): what it sends after that is
    /// measured from there while the windows catch up. Its time and offered bytes.
    quiet_at: (When, u64),
    /// When the class was last limited.
    limited_at: When,
    /// The last observation at which the class had offered more than at the one before.
    sent_at: When,
    /// Its pauses (time between two observations at which it offered more) of the last
    /// [`PAUSE_MEMORY_NS`] that no later pause was as long as: (when the pause ended, its
    /// length), oldest and longest first. The front is the longest remembered pause; one
    /// that a later, longer pause outlasts can never be it again, and is not kept (a
    /// class that sends every tick would otherwise keep 200 and have them all read every tick).
    /// The first is kept in the estimator: a class that sends every tick keeps one pause,
    /// and at 10,000 classes a load from the heap for each was a twentieth of a tick's
    /// cache misses.
    pauses: SmallVec<[(u64, u64); 1]>,
    /// The offered bytes of the last observation, and the time of the first observation of
    /// its history that had offered as many: a class whose history is flat from its first
    /// row is idle throughout, and [`Estimator::update`] does not read its history.
    flat: (u64, u64),
    /// The pacing rate the windows that follow from it were last worked out for, and its
    /// queue window ([`queue_window`]) and recent window ([`recent_window`]): a class's rate
    /// changes seldom, and below a few mbit/s each is a division, which takes 40-90 cycles
    /// on older x86 cores (at 10,000 classes paced at a few hundred kbit/s, a tenth of a
    /// tick).
    windows: (u64, u64, u64),
    /// [`HEADROOM_PERCENT`], or another value for the model's tuning sweep (at most
    /// 255); the dead band scales with it (from half of it to twice it).
    headroom_percent: u8,
    /// Whether an idle class's history is read all the same (the tests compare the two).
    #[cfg(test)]
    read_idle: bool,
}

/// A moment an estimator remembers, or none: an `Option<u64>` in 8 bytes rather than 16
/// (the monotonic clock never reaches `u64::MAX`). Every estimator is read every tick, and
/// at 10,000 classes the memory they take is what a tick waits on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct When(u64);

impl When {
    const NEVER: Self = Self(u64::MAX);

    fn at(t: u64) -> Self {
        debug_assert!(t != u64::MAX, "a time the monotonic clock reaches");
        Self(t)
    }

    fn get(self) -> Option<u64> {
        (self.0 != u64::MAX).then_some(self.0)
    }
}

impl Default for Estimator {
    fn default() -> Self {
        Self::with_headroom(HEADROOM_PERCENT)
    }
}

/// What an estimator keeps of an observation, in 24 bytes (32 in full): at 10,000 classes
/// the histories do not fit in the caches, and a tick waits on the memory they take. The
/// packet counters are kept in their low 32 bits (the estimator only asks whether they moved
/// within its window, and 2^32 packets do not pass in one), the backlog in microseconds (up
/// to 71 minutes).
#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    offered_bytes: u64,
    packets: u32,
    idle_packets: u32,
    backlog_us: u32,
}

impl Sample {
    #[expect(clippy::cast_possible_truncation, reason = "the counters' low bits, as documented")]
    fn of(o: &Observation) -> Self {
        Self {
            offered_bytes: o.counters.offered_bytes,
            packets: o.counters.packets as u32,
            idle_packets: o.counters.idle_packets as u32,
            backlog_us: u32::try_from(o.backlog_ns / 1000).unwrap_or(u32::MAX),
        }
    }
}

/// A class that is not limited and offered less than `1/STOPPED_DIVISOR` of its long-window
/// rate over the last 100 ms has (nearly) stopped: it wants what it offered lately (an
/// application writing in bursts every 50 ms has at least one in 100 ms, more than half).
const STOPPED_DIVISOR: u64 = 2;

/// A class that offered less than four full frames over its silence window is quiet (a
/// ping, a DNS query, a TCP handshake); once it has offered this many bytes since, it is
/// sending, and its rate is read from the time it was last quiet.
const WAKE_BYTES: u64 = 4 * FRAME_BITS / 8;

/// A class that is not limited has stopped once it has paused twice as long as its longest
/// pause of the last [`PAUSE_MEMORY_NS`] (a silence over [`SILENCE_NS`] was a stop, not a
/// pause), and at least this long (two ticks): it gives its
/// share back then, not when its 100 ms rate falls under half its 400 ms one (about 60 ms
/// after an on/off sender stops). An application that writes every 50 ms pauses for about
/// as long between writes, and keeps its share.
const STOP_NS: u64 = 20_000_000;
/// How long the estimator remembers a class's pauses.
const PAUSE_MEMORY_NS: u64 = 2_000_000_000;

impl Estimator {
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// An estimator that gives classes that are not limited `percent` of headroom.
    #[must_use]
    pub fn with_headroom(percent: u64) -> Self {
        Self {
            last_ns: When::NEVER,
            rows: 0,
            demand: 0,
            streak: 0,
            quiet_at: (When::NEVER, 0),
            limited_at: When::NEVER,
            sent_at: When::NEVER,
            pauses: SmallVec::new(),
            flat: (0, 0),
            windows: (0, queue_window(0), recent_window(0)),
            headroom_percent: u8::try_from(percent).unwrap_or(u8::MAX),
            #[cfg(test)]
            read_idle: false,
        }
    }

    /// Records an observation in `column` of the row [`Histories::start_row`] started last,
    /// at `o.now_ns`, and returns the class's demand.
    pub fn update(&mut self, h: &mut Histories, column: usize, o: &Observation) -> Estimate {
        let n = h.rows.len();
        assert!(n > 0 && h.time(n - 1) == o.now_ns, "an observation at the time of the row started last");
        // What the class had offered at the row before, if it is in its history: the bytes
        // of its last observation (`flat`), unless that was at this row already.
        let repeat = self.last_ns.get() == Some(o.now_ns);
        let last_offered = self.flat.0;
        if !repeat {
            let previous = n.checked_sub(2).map(|i| h.time(i));
            let last = self.last_ns.get();
            self.rows = if last.is_some() && last == previous { (self.rows + 1).min(rows_of(n)) } else { 1 };
            self.last_ns = When::at(o.now_ns);
        }
        // The class's history: rows `first..n`.
        let first = n - usize::from(self.rows);
        if self.rows == 1 || self.flat.0 != o.counters.offered_bytes {
            self.flat = (o.counters.offered_bytes, o.now_ns);
        }
        let sample = Sample::of(o);
        h.rows[n - 1].1[column] = sample;
        if self.idle_throughout(h, first, o) {
            return self.idle(o);
        }
        let before = if self.rows < 2 {
            None
        } else if repeat {
            Some(h.get(n - 2, column).1.offered_bytes)
        } else {
            Some(last_offered)
        };
        if self.windows.0 != o.pacing {
            self.windows = (o.pacing, queue_window(o.pacing), recent_window(o.pacing));
        }
        let (_, window, recent_ns) = self.windows;
        // The samples the estimate reads, found and read together, before any is used: at
        // 10,000 classes they miss the caches, and their loads then wait together, not one
        // after another (a class that is limited does not use the last). The first of the
        // history; the starts of the queue window, of the silence window (whether the class
        // is quiet, and for most classes whether it is silent) and of the recent window.
        let at_first = h.get(first, column);
        let recent = Self::window_start(h, column, first, o.now_ns, window);
        let at_silence = Self::window_start(h, column, first, o.now_ns, SILENCE_NS);
        let at_recent = Self::window_start(h, column, first, o.now_ns, recent_ns);
        self.note_pause(before, o);
        let offered = Self::rate_since(h, at_first, o);
        let limited = o.pacing != 0
            && (o.backlog_ns >= window
                || (o.backlog_ns > 0
                    && recent.is_some_and(|(_, s0)| {
                        sample.packets != s0.packets && sample.idle_packets == s0.idle_packets
                    })));
        if limited {
            self.limited_at = When::at(o.now_ns);
        }
        let lately_limited = self.lately_limited(o.now_ns);
        let demand = if limited && o.backlog_ns >= deep_queue(window) {
            // A queue that takes this long to drain: the class is far from what it needs
            // (a TCP sender's first windows, a flood). It wants all it can get, as it would get
            // from HTB at once; the allocator caps it at its share or ceil.
            self.streak = self.streak.saturating_add(1);
            u64::MAX
        } else if limited {
            // What arrived over the queue window (the datapath counts packets as they are
            // paced, so this is the arrival rate, not the departure rate).
            let arriving = recent.map_or(offered, |s| Self::rate_since(h, s, o));
            // Enough to drain the queue within DRAIN_NS, on top of what arrives.
            let drain = mul_div(o.backlog_ns.min(DRAIN_NS), o.pacing, DRAIN_NS);
            // Arrivals that keep up with the pacing rate: the class would send more if it
            // could; grow it faster and faster. Arrivals below it (a bunch of packets
            // draining): give it what drains the bunch, and no more.
            // The class had a queue throughout the window (it is limited), so it sent at its
            // pacing rate; a queue that did not shrink means that at least as much arrived.
            let keeps_up = recent.is_none_or(|(_, s0)| sample.backlog_us >= s0.backlog_us);
            self.streak = if keeps_up { self.streak.saturating_add(1) } else { 0 };
            let grown = if self.streak == 0 {
                0
            } else {
                let step =
                    (o.pacing / FIRST_GROWTH_DIVISOR) << u32::from(self.streak - 1).min(FIRST_GROWTH_DIVISOR.ilog2());
                o.pacing.saturating_add(step.min(o.pacing))
            };
            // A limited class uses all of its pacing rate: it never wants less.
            arriving.max(offered).saturating_add(drain).max(grown).max(o.pacing)
        } else {
            self.streak = 0;
            // What it offered lately too, read as its new rate if it was limited within the
            // long window (a TCP flow between two windows sends at its new rate, which the
            // long window has not caught up with yet); not otherwise: an application that
            // writes in bursts (16 KB every 50 ms) has two writes or three in 100 ms, and its
            // demand would jump with each third.
            let lately = at_recent.map_or(offered, |s| Self::rate_since(h, s, o));
            let mut risen = if lately_limited { lately } else { 0 };
            // A class that was quiet until a moment ago (a transfer starting): what it sent
            // since, over the time since, not spread over windows it was quiet in (its
            // share would be undercounted until they pass, and its first windows queued).
            if let Some((t0, bytes0)) = self.quiet_at() {
                let since = o.counters.offered_bytes.saturating_sub(bytes0);
                if o.now_ns.saturating_sub(t0) <= recent_ns && since >= WAKE_BYTES {
                    risen = risen.max(Self::rate_between(t0, bytes0, o));
                }
            }
            // And a class that has (nearly) stopped gives its share back at once, rather
            // than as its long window empties (an on/off sender, off); one that sent nothing
            // for 200 ms (or four frames' time at the rate it had), all of it. Not sooner: an
            // application writing in bursts (16 KB every 50 ms at 2.5 mbit/s) is silent between
            // them, and is paced at its guarantee when it writes again; its share must stay
            // reserved, or the link carries it on top of what the others were given.
            let silence = frames_ns_over(4, offered, SILENCE_NS).min(RATE_WINDOW_NS);
            let silent = if silence == SILENCE_NS {
                at_silence
            } else {
                Self::window_start(h, column, first, o.now_ns, silence)
            }
            .is_some_and(|(_, s0)| s0.offered_bytes == o.counters.offered_bytes);
            let offered = if silent || self.stopped(o.now_ns) {
                0
            } else if lately < offered / STOPPED_DIVISOR {
                lately
            } else {
                offered.max(risen)
            };
            self.with_headroom_and_dead_band(offered)
        };
        self.demand = demand;
        let over_silence = at_silence
            .map_or(o.counters.offered_bytes, |(_, s0)| o.counters.offered_bytes.saturating_sub(s0.offered_bytes));
        if over_silence < WAKE_BYTES {
            self.quiet_at = (When::at(o.now_ns), o.counters.offered_bytes);
        }
        let sending = match recent {
            Some((_, s0)) if s0.offered_bytes == o.counters.offered_bytes => 0,
            Some(s0) => Self::rate_since(h, s0, o),
            None => offered,
        };
        Estimate { demand, offered, limited, lately_limited, sending }
    }

    /// What a class that is not limited and offered `offered` bits/s wants: that plus the
    /// headroom, or its last demand if that is within the dead band.
    fn with_headroom_and_dead_band(&self, offered: u64) -> u64 {
        let h = u64::from(self.headroom_percent);
        let low = percent_over(offered, h * DEAD_BAND_LOW_PERCENT / HEADROOM_PERCENT);
        let high = percent_over(offered, h * DEAD_BAND_HIGH_PERCENT / HEADROOM_PERCENT).saturating_add(HEADROOM_FLOOR);
        if (low..=high).contains(&self.demand) {
            self.demand
        } else {
            percent_over(offered, h).saturating_add(HEADROOM_FLOOR)
        }
    }

    /// Whether the class has had no queue and offered nothing throughout its history (rows
    /// `first..`), which is at least [`SILENCE_NS`] long, and was quiet at its last
    /// observation: what [`Estimator::update`] concludes from its history then is
    /// [`Estimator::idle`]'s, without reading it. At 10,000 classes, most of them idle at any
    /// moment, the reads of the histories are most of a tick.
    fn idle_throughout(&self, h: &Histories, first: usize, o: &Observation) -> bool {
        #[cfg(test)]
        if self.read_idle {
            return false;
        }
        let start = h.time(first);
        o.backlog_ns == 0
            && self.rows >= 2
            && self.flat.1 <= start
            && o.now_ns.saturating_sub(start) >= SILENCE_NS
            && self.quiet_at().is_some_and(|(_, bytes)| bytes == o.counters.offered_bytes)
    }

    /// The estimate of a class idle throughout its history ([`Estimator::idle_throughout`]):
    /// it offered nothing over every window, so it is silent, quiet, not limited, and wants
    /// nothing (or its last demand, if within the dead band of nothing).
    fn idle(&mut self, o: &Observation) -> Estimate {
        self.streak = 0;
        self.demand = self.with_headroom_and_dead_band(0);
        self.quiet_at = (When::at(o.now_ns), o.counters.offered_bytes);
        let lately_limited = self.lately_limited(o.now_ns);
        Estimate { demand: self.demand, offered: 0, limited: false, lately_limited, sending: 0 }
    }

    /// Records the pause that ends at this observation, if the class offered more than at
    /// the row before (`before`, if in its history; not read from the row: at 10,000 classes
    /// each row a tick reads is a stream of loads that miss the caches).
    fn note_pause(&mut self, before: Option<u64>, o: &Observation) {
        let sent = before.is_none_or(|bytes| o.counters.offered_bytes > bytes);
        if !sent {
            return;
        }
        // A silence longer than SILENCE_NS was a stop (an on/off sender's off phase), not a
        // pause between writes.
        if let Some(pause) = self.sent_at.get().map(|t| o.now_ns.saturating_sub(t)).filter(|&p| p <= SILENCE_NS) {
            while self.pauses.last().is_some_and(|&(_, p)| p <= pause) {
                self.pauses.pop();
            }
            self.pauses.push((o.now_ns, pause));
        }
        // The pauses forgotten are the oldest, at the front (a `Vec`: a `VecDeque` works out
        // the wrap round its buffer at each access, and there are few to move).
        let forgotten = self.pauses.partition_point(|&(t, _)| o.now_ns.saturating_sub(t) > PAUSE_MEMORY_NS);
        if forgotten > 0 {
            self.pauses.drain(..forgotten);
        }
        self.sent_at = When::at(o.now_ns);
    }

    /// The time and offered bytes of the last observation at which the class was quiet, if
    /// any.
    fn quiet_at(&self) -> Option<(u64, u64)> {
        self.quiet_at.0.get().map(|t| (t, self.quiet_at.1))
    }

    /// Whether the class was limited within [`RATE_WINDOW_NS`].
    fn lately_limited(&self, now: u64) -> bool {
        self.limited_at.get().is_some_and(|t| now.saturating_sub(t) <= RATE_WINDOW_NS)
    }

    /// Whether the class has stopped: it has paused for twice its longest pause of the last
    /// [`PAUSE_MEMORY_NS`], and for [`STOP_NS`] at least.
    fn stopped(&self, now: u64) -> bool {
        let longest = self.pauses.first().map_or(0, |&(_, p)| p);
        self.sent_at.get().is_some_and(|t| now.saturating_sub(t) >= (2 * longest).max(STOP_NS))
    }

    /// The offered rate from sample `since` (its row, and it) to the observation, bits/s.
    fn rate_since(h: &Histories, (i, s0): (usize, Sample), o: &Observation) -> u64 {
        h.rate_since(i, o.counters.offered_bytes.saturating_sub(s0.offered_bytes))
    }

    /// The offered rate from time `t0`, when the class had offered `bytes0`, to the
    /// observation, bits/s.
    fn rate_between(t0: u64, bytes0: u64, o: &Observation) -> u64 {
        bits_per_sec(o.counters.offered_bytes.saturating_sub(bytes0), o.now_ns.saturating_sub(t0))
    }

    /// The newest sample of the class's history (rows `first..`) at least `window` old.
    /// For the windows of [`COMMON_WINDOWS`] the tick has found the row already. Otherwise,
    /// the rows being in time order and about a tick apart, the search starts where the
    /// spacing of the two newest puts the row and walks from there. It reads the rows' times
    /// only, which every class shares: classes with the same window find the same row, and
    /// the tick reads that row's samples in column order.
    /// Inlined: each search of an update then loads from its own instruction, whose stride
    /// from one class to the next the CPU's prefetcher learns.
    #[expect(clippy::inline_always, reason = "one load instruction per search")]
    #[inline(always)]
    fn window_start(h: &Histories, column: usize, first: usize, now: u64, window: u64) -> Option<(usize, Sample)> {
        if let Some(k) = COMMON_WINDOWS.iter().position(|&w| w == window) {
            return h.common[k].filter(|&i| i >= first).map(|i| h.get(i, column));
        }
        let n = h.rows.len();
        let old_enough = |i: usize| now.saturating_sub(h.time(i)) >= window;
        let back = if n - first >= 2 {
            let (rows, part) = StrengthReducedU64::div_rem(window, h.spacing);
            usize::try_from(rows + u64::from(part != 0)).unwrap_or(n)
        } else {
            n
        };
        let mut i = n - back.min(n - first);
        while i < n && old_enough(i) {
            i += 1;
        }
        while i > first && !old_enough(i - 1) {
            i -= 1;
        }
        (i > first).then(|| h.get(i - 1, column))
    }
}

/// `n` rows as an estimator counts them (a few hundred at most: the rows of
/// [`RATE_WINDOW_NS`] at a tick of 1 ms or more; more is counted as 65,535).
fn rows_of(n: usize) -> u16 {
    u16::try_from(n).unwrap_or(u16::MAX)
}

/// A queue deep enough that a limited class wants all it can get: two queue windows, and at
/// least 100 ms.
fn deep_queue(window: u64) -> u64 {
    (2 * window).max(100_000_000)
}

/// The window over which the offered rate of a class that was limited a moment ago is read
/// too: 100 ms, or 32 full frames at its pacing rate if longer (so that a packet more or
/// less moves it by 3 % at most), within [`RATE_WINDOW_NS`].
fn recent_window(pacing: u64) -> u64 {
    frames_ns_over(32, pacing, RECENT_NS).min(RATE_WINDOW_NS)
}

/// The window over which a class must have had a queue throughout to count as limited:
/// [`QUEUE_WINDOW_NS`], or four full frames at its pacing rate if longer.
fn queue_window(pacing: u64) -> u64 {
    frames_ns_over(4, pacing, QUEUE_WINDOW_NS)
}

/// [`frames_ns`], or `floor` if longer; without a division at the rates at which the frames
/// take no longer than `floor` (most classes: it is done for each class every tick).
fn frames_ns_over(frames: u64, bits_per_sec: u64, floor: u64) -> u64 {
    if bits_per_sec.saturating_mul(floor) >= frames * FRAME_BITS * 1_000_000_000 {
        floor
    } else {
        frames_ns(frames, bits_per_sec).max(floor)
    }
}

/// How long `frames` full-size frames take at `bits_per_sec` (at least 1 bit/s), ns: the
/// daemon's rates are in bits/s, the datapath's (`shaper_common::frames_ns`) in bytes/s.
pub(crate) fn frames_ns(frames: u64, bits_per_sec: u64) -> u64 {
    mul_div(frames * FRAME_BITS, 1_000_000_000, bits_per_sec.max(1))
}

/// One host's fair share of a class's rate, as max-min fairness has it, for isolation inside
/// the class (bits/s). Over the last tick the datapath saw `over` hosts over their share
/// `previous`, `near` hosts within it but sending a good part of it (they contend for the
/// class too), and `light` bits/s from the other hosts (DNS, a call: well within their share).
/// The light hosts keep what they send; the rest of `rate` is divided among the contending
/// hosts (the water-filling step, repeated every tick). A class without a queue has no one
/// to protect: its hosts may each use all of it. The share falls by at most half per tick, so
/// that a wrong guess does not throttle a host that was within its share.
#[must_use]
pub fn fair_share(rate: u64, limited: bool, light: u64, over: u64, near: u64, previous: u64) -> u64 {
    let target = if limited { rate.saturating_sub(light).checked_div(over + near).unwrap_or(rate) } else { rate };
    let floor = if previous == 0 { rate } else { previous / 2 };
    target.clamp(floor.min(rate), rate).max(1)
}

/// The rate of `bytes` over `ns`, bits/s (0 over no time).
pub(crate) fn bits_per_sec(bytes: u64, ns: u64) -> u64 {
    mul_div(bytes, 8_000_000_000, ns)
}

/// `value * (100 + percent) / 100`, saturating.
pub(crate) fn percent_over(value: u64, percent: u64) -> u64 {
    mul_div(value, 100 + percent, 100)
}

fn saturate(v: u128) -> u64 {
    u64::try_from(v).unwrap_or(u64::MAX)
}

/// `a * b / c`, saturating; 0 for `c` 0. In 64 bits while `a * b` fits: a 128-bit division
/// is a call that costs as much as the rest of a class's estimate, done for every class
/// every tick.
pub(crate) fn mul_div(a: u64, b: u64, c: u64) -> u64 {
    match a.checked_mul(b) {
        Some(ab) => ab.checked_div(c).unwrap_or(0),
        None => (u128::from(a) * u128::from(b)).checked_div(u128::from(c)).map_or(0, saturate),
    }
}

/// A divisor that many quotients of a tick share, worked out once: [`Divisor::mul_div`]
/// divides as multiplications (exact: the quotient [`mul_div`] gives). A division takes
/// 15-40 cycles, and a tick at 10,000 classes did tens of thousands by the same few values.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Divisor {
    value: u64,
    reduced: StrengthReducedU64,
}

impl Divisor {
    /// `c` as a divisor; `None` for 0 (by which [`mul_div`] gives 0).
    pub(crate) fn new(c: u64) -> Option<Self> {
        (c > 0).then(|| Self { value: c, reduced: StrengthReducedU64::new(c) })
    }

    /// `a * b / self`, as [`mul_div`] gives it.
    pub(crate) fn mul_div(self, a: u64, b: u64) -> u64 {
        match a.checked_mul(b) {
            Some(ab) => ab / self.reduced,
            None => mul_div(a, b, self.value),
        }
    }
}

/// Appends `sample`, taken at `now`, to a time series and forgets what is older than
/// `window`, keeping the newest sample at or before the window's start (it marks the start);
/// hands each sample it forgets to `forgotten`.
/// (A `Vec`: the rows of [`Histories`] are read by index for every class every tick, and a
/// `VecDeque`'s index wraps round its buffer; they are few, and move up once a tick.)
fn slide_with<T>(samples: &mut Vec<(u64, T)>, now: u64, sample: T, window: u64, mut forgotten: impl FnMut(T)) {
    samples.push((now, sample));
    while samples.len() > 2 && now.saturating_sub(samples[1].0) >= window {
        forgotten(samples.remove(0).1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const MBIT: u64 = 1_000_000;

    /// One class's estimator, with histories of its own.
    #[derive(Default)]
    struct Solo {
        histories: Histories,
        estimator: Estimator,
    }

    impl Solo {
        fn update(&mut self, o: &Observation) -> Estimate {
            self.histories.start_row(o.now_ns, 1);
            self.estimator.update(&mut self.histories, 0, o)
        }
    }

    /// Drives an estimator with a class that offers `offered` bits/s, in full frames, paced
    /// at `pacing`, for `ticks` ticks of 10 ms; `queued(tick)` says whether the class's clock
    /// stays ahead of now through the tick. Returns the last estimate.
    fn drive(
        e: &mut Solo,
        start: &mut (u64, Counters),
        offered: u64,
        pacing: u64,
        ticks: u32,
        queued: bool,
    ) -> Estimate {
        let mut last = None;
        for _ in 0..ticks {
            let (t, c) = start;
            *t += 10 * MS;
            let bytes = offered / 8 / 100;
            c.offered_bytes += bytes;
            let packets = (bytes / 1514).max(1);
            c.packets += packets;
            if !queued {
                c.idle_packets += 1;
            }
            last = Some(e.update(&Observation {
                now_ns: *t,
                counters: *c,
                backlog_ns: if queued { 5 * MS } else { 0 },
                pacing,
            }));
        }
        last.expect("at least one tick")
    }

    #[test]
    fn a_steady_stream_is_not_limited_and_wants_what_it_sends_plus_headroom() {
        let mut e = Solo::default();
        let mut s = (0, Counters::default());
        let r = drive(&mut e, &mut s, 2 * MBIT, 2_100_000, 100, false);
        assert!(!r.limited);
        assert_eq!(r.offered, 2 * MBIT);
        assert_eq!(r.demand, 2 * MBIT * 102 / 100 + HEADROOM_FLOOR);
    }

    #[test]
    fn a_queue_that_never_empties_makes_a_class_limited_and_its_demand_grows() {
        let mut e = Solo::default();
        let mut s = (0, Counters::default());
        drive(&mut e, &mut s, 300_000, 300_000, 10, false);
        // Queued, but not yet for a whole window (four frames at 0.3 mbit/s: 161 ms).
        assert!(!drive(&mut e, &mut s, 300_000, 300_000, 15, true).limited);
        let first = drive(&mut e, &mut s, 300_000, 300_000, 2, true);
        assert!(first.limited);
        // A greedy sender's arrivals keep up with its pacing rate: steps of 1/16, 1/8, ... of
        // the pacing rate, then doubling.
        let mut pacing = first.demand;
        let mut ticks = 0;
        while pacing < 8 * MBIT {
            let r = drive(&mut e, &mut s, pacing, pacing, 1, true);
            assert!(r.demand > pacing);
            pacing = r.demand;
            ticks += 1;
        }
        assert!(ticks <= 10, "{ticks} ticks to reach 8 mbit/s");
    }

    #[test]
    fn a_deep_queue_counts_at_once() {
        let mut e = Solo::default();
        let c = Counters { offered_bytes: 1514, packets: 1, idle_packets: 1 };
        let r = e.update(&Observation { now_ns: MS, counters: c, backlog_ns: 200 * MS, pacing: 1_000_000 });
        assert!(r.limited);
        // What drains the queue within 100 ms, at least.
        assert!(r.demand >= 1_000_000);
    }

    #[test]
    fn a_bunch_gets_what_drains_it_and_no_more() {
        let mut e = Solo::default();
        let mut s = (0, Counters::default());
        drive(&mut e, &mut s, 2 * MBIT, 2_048_000, 60, false);
        // The stream's packets came bunched: a queue for 60 ms, draining, while it still
        // sends 2 mbit/s.
        let mut r = None;
        for backlog in (1..=6).rev() {
            s.0 += 10 * MS;
            s.1.offered_bytes += 2500;
            s.1.packets += 2;
            r = Some(e.update(&Observation {
                now_ns: s.0,
                counters: s.1,
                backlog_ns: backlog * MS,
                pacing: 2_048_000,
            }));
        }
        let r = r.unwrap();
        assert!(r.limited);
        // 5 ms of queue drained within 100 ms: 5 % more, not a doubling.
        assert!(r.demand < 2_048_000 * 110 / 100, "{r:?}");
    }

    #[test]
    fn a_class_that_wakes_is_measured_from_when_it_was_quiet() {
        let mut e = Solo::default();
        let mut s = (0, Counters::default());
        drive(&mut e, &mut s, 0, 8 * MBIT, 40, false);
        // One packet (a ping): still quiet, and it wants about what 100 ms of it make.
        let r = drive(&mut e, &mut s, 1514 * 8 * 100, 8 * MBIT, 1, false);
        assert!(r.demand < 200_000, "{r:?}");
        drive(&mut e, &mut s, 0, 8 * MBIT, 40, false);
        // A transfer at 8 mbit/s for 20 ms: it wants that, not the 1.6 mbit/s of the 100 ms
        // it was quiet for most of.
        let r = drive(&mut e, &mut s, 8 * MBIT, 8 * MBIT, 2, false);
        assert!(r.demand >= 8 * MBIT, "{r:?}");
    }

    #[test]
    fn a_sender_that_stops_gives_its_share_back_after_two_ticks() {
        let mut e = Solo::default();
        let mut s = (0, Counters::default());
        assert!(drive(&mut e, &mut s, 4 * MBIT, 5 * MBIT, 100, false).demand >= 4 * MBIT);
        // It stops: one tick of silence is a pause, two are a stop.
        assert!(drive(&mut e, &mut s, 0, 5 * MBIT, 1, false).demand >= 3_500_000);
        let r = drive(&mut e, &mut s, 0, 5 * MBIT, 1, false);
        assert!(r.demand <= HEADROOM_FLOOR, "{r:?}");
    }

    #[test]
    fn an_application_that_pauses_between_writes_keeps_its_share() {
        let mut e = Solo::default();
        let mut s = (0, Counters::default());
        // 16 KB every 50 ms (2.6 mbit/s): a tick with a write, four without.
        let mut demands = Vec::new();
        for _ in 0..100 {
            drive(&mut e, &mut s, 16_384 * 8 * 100, 5 * MBIT, 1, false);
            for _ in 0..4 {
                demands.push(drive(&mut e, &mut s, 0, 5 * MBIT, 1, false).demand);
            }
        }
        // Once it has paused a few times, it is never taken for stopped.
        assert!(demands[20..].iter().all(|&d| d >= 2_000_000), "{:?}", &demands[20..]);
    }

    #[test]
    fn the_dead_band_keeps_a_steady_demand_steady() {
        let mut e = Solo::default();
        let mut s = (0, Counters::default());
        let before = drive(&mut e, &mut s, 2 * MBIT, 2_100_000, 60, false).demand;
        // The offered rate wobbles by 1 %: the demand stays.
        let after = drive(&mut e, &mut s, 2 * MBIT * 101 / 100, before, 60, false).demand;
        assert_eq!(before, after);
        // It drops by half: the demand follows within the window.
        let later = drive(&mut e, &mut s, MBIT, before, 41, false);
        assert!((MBIT * 101 / 100..=MBIT * 104 / 100 + HEADROOM_FLOOR).contains(&later.demand), "{later:?}");
    }

    #[test]
    fn classes_share_rows_and_one_missing_from_a_row_starts_its_history_over() {
        let mut histories = Histories::new();
        let (mut first, mut second) = (Estimator::new(), Estimator::new());
        let mut counters = Counters::default();
        for tick in 1..=100u64 {
            let now = tick * 10 * MS;
            counters.offered_bytes += 2 * MBIT / 8 / 100;
            counters.packets += 2;
            counters.idle_packets += 2;
            let observation = Observation { now_ns: now, counters, backlog_ns: 0, pacing: 10 * MBIT };
            histories.start_row(now, 2);
            let ea = first.update(&mut histories, 0, &observation);
            if tick > 40 {
                assert_eq!(ea.offered, 2 * MBIT, "tick {tick}");
            }
            // The second is skipped at tick 90 (a failed tick): its column of that row holds
            // nothing of it, and its history starts over from tick 91.
            if tick == 90 {
                continue;
            }
            let eb = second.update(&mut histories, 1, &observation);
            match tick {
                41..=89 | 92.. => assert_eq!(eb.offered, 2 * MBIT, "tick {tick}"),
                91 => assert_eq!(eb.offered, 0, "a history of one row has no rate yet"),
                _ => {}
            }
        }
        // 400 ms of rows, and the one at the window's start.
        assert_eq!(histories.rows.len(), 41);
    }

    #[test]
    fn frames_over_a_floor_are_the_frames_or_the_floor() {
        for bits in [0, 1, 64_000, 968_000, 969_000, 969_919, 969_920, 969_921, MBIT, 10 * MBIT, u64::MAX] {
            for floor in [QUEUE_WINDOW_NS, SILENCE_NS] {
                assert_eq!(frames_ns_over(4, bits, floor), frames_ns(4, bits).max(floor), "{bits} bit/s over {floor}");
            }
        }
    }

    /// Drives two estimators with the same observations, one that reads an idle class's
    /// history all the same, through `phases` of (ticks, what the class does: 0 nothing, 1
    /// a steady stream, 2 a queue, 3 missing from the rows), and asserts that they conclude
    /// the same at every tick. Returns the ticks at which the class was idle throughout.
    fn idle_shortcut_agrees(phases: &[(u32, u8, u64)]) -> u32 {
        let (mut short, mut full) = (Solo::default(), Solo::default());
        full.estimator.read_idle = true;
        let (mut now, mut c) = (0, Counters::default());
        let mut idle = 0;
        for &(ticks, kind, rate) in phases {
            for _ in 0..ticks {
                now += 10 * MS;
                if kind == 3 {
                    short.histories.start_row(now, 1);
                    full.histories.start_row(now, 1);
                    continue;
                }
                if kind != 0 {
                    c.offered_bytes += rate / 800;
                    c.packets += rate / 800 / 1500 + 1;
                    c.idle_packets += u64::from(kind == 1);
                }
                let backlog_ns = if kind == 2 { 30 * MS } else { 0 };
                let o = Observation { now_ns: now, counters: c, backlog_ns, pacing: rate.max(MBIT) };
                let (a, b) = (short.update(&o), full.update(&o));
                assert_eq!(a, b, "at {} ms", now / MS);
                let first = short.histories.rows.len() - usize::from(short.estimator.rows);
                idle += u32::from(short.estimator.idle_throughout(&short.histories, first, &o));
            }
        }
        idle
    }

    /// Every estimator is read every tick: at 10,000 classes its size is what a tick waits on
    /// (two cache lines, 1.25 MB in all).
    #[test]
    fn an_estimator_fits_in_two_cache_lines() {
        assert!(std::mem::size_of::<Estimator>() <= 128, "{} bytes", std::mem::size_of::<Estimator>());
    }

    #[test]
    fn a_class_idle_throughout_its_history_is_estimated_without_reading_it() {
        // A transfer, a pause shorter than the history, one longer; a queue, then silence;
        // a class missing from a row, then silent.
        let idle = idle_shortcut_agrees(&[
            (100, 1, 2 * MBIT),
            (30, 0, 0),
            (100, 0, 0),
            (50, 2, 3 * MBIT),
            (100, 0, 0),
            (1, 3, 0),
            (100, 0, 0),
        ]);
        // Idle once the history (400 ms) is flat: 59 + 59 + 59 ticks of the silences.
        assert!(idle >= 150, "{idle} ticks idle throughout");
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config {
            cases: 64,
            rng_seed: proptest::test_runner::RngSeed::Fixed(0x1d1e),
            ..proptest::test_runner::Config::default()
        })]
        #[test]
        fn the_idle_shortcut_concludes_what_the_histories_would(
            phases in proptest::collection::vec((1..80u32, 0..4u8, 0..20 * MBIT), 1..12)
        ) {
            idle_shortcut_agrees(&phases);
        }
    }

    #[test]
    fn slide_keeps_the_window_start() {
        let (mut v, mut forgotten) = (Vec::new(), Vec::new());
        for t in 0..10u64 {
            slide_with(&mut v, t * 10, t, 30, |old| forgotten.push(old));
        }
        assert_eq!(v.first().unwrap().0, 60);
        assert_eq!(v.last().unwrap().0, 90);
        assert_eq!(forgotten, [0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn fair_shares_fill_the_class_max_min() {
        // A class of 10 mbit/s with a queue, 1 mbit/s from light hosts, one host over the
        // share and one near it: 4.5 each.
        assert_eq!(fair_share(10 * MBIT, true, MBIT, 1, 1, 5 * MBIT), 4_500_000);
        // A host of 8 connections over a share of 6.2 and one of 1 near it: 5 each.
        assert_eq!(fair_share(10 * MBIT, true, 0, 1, 1, 6_200_000), 5 * MBIT);
        // One host alone keeps all but what the light hosts send.
        assert_eq!(fair_share(10 * MBIT, true, 300_000, 1, 0, 5 * MBIT), 9_700_000);
        // Falls by at most half a tick.
        assert_eq!(fair_share(10 * MBIT, true, 0, 4, 0, 4 * MBIT), 2_500_000);
        assert_eq!(fair_share(10 * MBIT, true, 0, 8, 0, 4 * MBIT), 2 * MBIT);
        // No queue: no limit.
        assert_eq!(fair_share(10 * MBIT, false, 0, 3, 1, 2 * MBIT), 10 * MBIT);
    }
}
