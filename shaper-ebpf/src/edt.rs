//! Earliest departure time pacing, after Cilium's `bpf/lib/edt.h`: each class has a virtual
//! clock `next`; a packet departs at `t = max(now, next)` and moves the clock to
//! `t + wire_len / rate`. The `fq` qdisc holds each packet until its `skb->tstamp`.
//!
//! Unlike edt.h, which reads and writes the clock without synchronisation, several CPUs may
//! send in one class at once here, so the clock only moves by atomic operations: a
//! backlogged class (clock ahead of `t0`) takes its slot with one fetch-and-add, which is exact
//! under any contention; an idle class restarts its clock with compare-and-exchange.

use core::intrinsics::{atomic_cxchg, atomic_or, atomic_xadd, AtomicOrdering};

use shaper_common::ClassConfig;

/// Atomic compare-and-exchange on a u64 (BPF_ATOMIC | BPF_CMPXCHG).
///
/// `core::sync::atomic` is not available: the bpfel target declares no CAS support (it
/// depends on the ISA version, chosen with `-C target-cpu=v3` in shaper-daemon/build.rs).
#[inline(always)]
pub unsafe fn cas(dst: *mut u64, old: u64, new: u64) -> bool {
    // SAFETY: forwarded to the caller.
    unsafe { atomic_cxchg::<u64, { AtomicOrdering::SeqCst }, { AtomicOrdering::SeqCst }>(dst, old, new).1 }
}

/// Atomic fetch-and-add on a u64 (BPF_ATOMIC | BPF_ADD | BPF_FETCH); returns the old value.
#[inline(always)]
pub unsafe fn fetch_add(dst: *mut u64, v: u64) -> u64 {
    // SAFETY: forwarded to the caller.
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::SeqCst }>(dst, v) }
}

/// Atomic or on a u64 (BPF_ATOMIC | BPF_OR, without BPF_FETCH: the old value is not used).
#[inline(always)]
pub unsafe fn or(dst: *mut u64, v: u64) {
    // SAFETY: forwarded to the caller.
    unsafe { atomic_or::<u64, u64, { AtomicOrdering::SeqCst }>(dst, v) };
}

/// Outcome of pacing one packet.
pub enum Verdict {
    /// Leave at this time (CLOCK_MONOTONIC ns); `idle`: the clock was at or behind `t0` (no
    /// queue). A packet dropped after all returns its slot with [`give_back`].
    Send { depart: u64, idle: bool },
    /// The departure would be later than the horizon.
    Horizon,
}

/// Compare-and-exchange attempts before an idle class is treated as backlogged.
const CAS_ATTEMPTS: usize = 4;

/// Paces one packet: takes a slot of `cost` ns (its wire length over the class's rate) on
/// the clock at `next`. `t0` is the earliest the packet may leave (now, or a later time: the
/// link clock), `now` the current CLOCK_MONOTONIC time. A
/// clock that fell behind restarts up to `burst` ns before now: a class that was idle (or
/// sent below its rate) may send that much at once, as HTB's burst lets it (a stream's
/// packets that its sender bunched pass without a queue). A packet that leaves later than
/// now restarts it at its departure.
///
/// # Safety
/// `next` must point into a map value that stays valid for the call.
#[inline(always)]
pub unsafe fn take_slot(next: *mut u64, cost: u64, t0: u64, now: u64, limits: &ClassConfig) -> Verdict {
    // SAFETY: forwarded to the caller.
    match unsafe { take_slot_packed(next, cost, t0, now, limits) } {
        HORIZON => Verdict::Horizon,
        v => Verdict::Send { depart: v & !IDLE, idle: v & IDLE != 0 },
    }
}

/// [`take_slot`]'s answer packed in a register: the departure time, with `IDLE` set if the
/// clock was idle, or `HORIZON`. Departure times are CLOCK_MONOTONIC ns, far below 2^63.
const IDLE: u64 = 1 << 63;
const HORIZON: u64 = 0;

/// [`take_slot`]'s work, its answer packed in a register; the horizon and the burst come
/// from `limits`. Inlined: every packet takes a slot, and a BPF-to-BPF call is a call and a
/// return, the return through the kernel's return thunk where the CPU needs one (AMD's SRSO
/// mitigation: about 8 ns a call on the benchmark's machine). Out of line it had kept the
/// verifier's walk of the caller within bounds on older kernels; inlined, the walks went
/// down (Debian 6.1: 244,453 instructions to 238,274; 6.12: 184,464 to 167,426). Its answer
/// stays one packed word even so: written straight into [`take_slot`] as a `Verdict`, the
/// walks went up again (6.12: 184,317; 6.18: 193,888 against 179,232), the paths meeting less
/// often at one value than at an enum's tag and fields.
#[inline(always)]
unsafe fn take_slot_packed(next: *mut u64, cost: u64, t0: u64, now: u64, limits: &ClassConfig) -> u64 {
    let (horizon, burst) = (limits.horizon_ns, limits.burst_ns);
    for _ in 0..CAS_ATTEMPTS {
        // SAFETY: `next` is valid (caller) and 8-byte aligned (map value of u64 fields).
        let last = unsafe { core::ptr::read_volatile(next) };
        if last > t0 {
            break;
        }
        // The class is idle: the packet may leave at t0, and the clock restarts from there
        // (or up to `burst` before).
        if t0 - now > horizon {
            return HORIZON;
        }
        // A packet held back to a later time (behind the link clock) restarts the clock at its departure: the burst is credit for the time
        // the class was idle until now, not until then.
        let floor = if t0 > now { t0 } else { t0 - burst };
        let start = if last > floor { last } else { floor };
        // SAFETY: as above.
        let swapped = unsafe { cas(next, last, start + cost) };
        if swapped {
            return t0 | IDLE;
        }
    }
    // Backlogged: take the next slot. The clock only ever moves forward, so `old` is at least
    // what was read above; if a racing restart left it just below t0, leaving at t0 is at most
    // one packet early.
    // SAFETY: as above.
    let old = unsafe { fetch_add(next, cost) };
    let depart = if old > t0 { old } else { t0 };
    if depart - now > horizon {
        // SAFETY: as above.
        unsafe { give_back(next, cost) };
        return HORIZON;
    }
    if old <= t0 {
        depart | IDLE
    } else {
        depart
    }
}

/// Returns a packet's slot to the class clock, for a packet that is dropped after all.
///
/// # Safety
/// As for [`take_slot`].
#[inline(always)]
pub unsafe fn give_back(next: *mut u64, cost: u64) {
    // SAFETY: forwarded to the caller.
    unsafe { fetch_add(next, cost.wrapping_neg()) };
}
