//! Active queue management on the departure delay: CoDel (RFC 8289), applied when a packet
//! is given its departure time, since EDT knows at that moment how long the packet will wait.
//!
//! A class that stays above `target` delay for a whole `interval` enters the dropping state
//! and gives a congestion signal (ECN CE mark, or a drop for packets that are not
//! ECN-capable) at times spaced `interval / sqrt(count)` apart, until its delay falls below
//! target. Without this a greedy TCP flow fills the class up to the drop horizon.
//!
//! A delay past `overload` (half the horizon) in a class that gave no signal for 16 intervals
//! enters the dropping state at once, without waiting for the interval: a TCP slow start
//! outgrows a slow class's horizon before an interval's signal reaches its sender (at
//! 1 mbit/s a 200 ms horizon is 16 frames; its initial window is 10), and the tail drops at
//! the horizon take its retransmissions too, which stalls it for a retransmission timeout
//! (seed 004's 1 mbit/s class fell 4 % short of its rate one run in four so). One signal
//! then, and the control law's after it.
//!
//! The state is shared by the CPUs sending in the class. Each transition is one atomic
//! operation, and the compare-and-exchange on `drop_next_ns` makes sure that each scheduled
//! signal is given exactly once, whichever CPU gets there first.

use shaper_common::{ClassConfig, ClassState};

use crate::edt::{cas, fetch_add};

/// Whether the packet carries a congestion signal.
pub enum Signal {
    None,
    Congested,
}

/// `65536 / sqrt(n)` for n in 0..1024 (entry 0 unused): the control law's spacing factor.
const INV_SQRT: [u32; 1024] = {
    let mut t = [0u32; 1024];
    let mut n = 1;
    while n < 1024 {
        // isqrt(n << 32) = sqrt(n) * 65536; 65536 * 65536 / that = 65536 / sqrt(n).
        let target = (n as u64) << 32;
        let mut lo = 0u64;
        let mut hi = 1u64 << 32;
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if mid * mid <= target {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        t[n] = ((1u64 << 32) / lo) as u32;
        n += 1;
    }
    t
};

/// `interval / sqrt(count)`; counts past the table use its last entry.
#[inline(always)]
fn control_law(interval: u64, count: u64) -> u64 {
    let i = if count >= 1024 { 1023 } else { count.max(1) as usize };
    let factor = if i < 1024 { u64::from(INV_SQRT[i]) } else { 0 };
    (interval * factor) >> 16
}

/// Runs CoDel for one packet that will wait `delay` ns, with the class's target and interval
/// (`ClassConfig::codel_target_ns`, `codel_interval_ns`); `eligible`: whether the packet may
/// carry a congestion signal (see the datapath's isolation); a delay past half the class's
/// horizon does not wait for the interval.
///
/// In a frame of its own: the verifier then walks the caller's paths on from one return
/// rather than from each of CoDel's (inlined, the overload test
/// took the walk on Debian 6.1 past 600,000 instructions: 604,529; in its frame, 588,486);
/// five arguments at most.
///
/// # Safety
/// `state` must point into a map value that stays valid for the call.
#[inline(never)]
pub unsafe fn codel(state: *mut ClassState, delay: u64, now: u64, config: &ClassConfig, eligible: bool) -> Signal {
    let (target, interval, overload) = (config.codel_target_ns, config.codel_interval_ns, config.horizon_ns / 2);
    // SAFETY: valid (caller); the fields are 8-byte aligned u64s.
    let (first_above, drop_next, count, dropping) = unsafe {
        (
            core::ptr::addr_of_mut!((*state).first_above_ns),
            core::ptr::addr_of_mut!((*state).drop_next_ns),
            core::ptr::addr_of_mut!((*state).count),
            core::ptr::addr_of_mut!((*state).dropping),
        )
    };
    if delay < target {
        // Leave the dropping state, and restart the interval when the delay next exceeds
        // target. Stores of 0 are single aligned writes; skipping them when already 0 keeps
        // the cache line shared between CPUs.
        // SAFETY: as above.
        unsafe {
            if core::ptr::read_volatile(first_above) != 0 {
                core::ptr::write_volatile(first_above, 0);
            }
            if core::ptr::read_volatile(dropping) != 0 {
                core::ptr::write_volatile(dropping, 0);
            }
        }
        return Signal::None;
    }
    // SAFETY: as above.
    let (above_since, last) = unsafe { (core::ptr::read_volatile(first_above), core::ptr::read_volatile(drop_next)) };
    // Whether the class signalled within 16 intervals: RFC 8289's memory of a recent
    // dropping state, which it resumes near its previous rate of signals.
    let recent = now.saturating_sub(last) < 16 * interval;
    // Past the overload delay with no recent signal: a queue grown from nothing, not CoDel's
    // own standing queue, which its control law keeps (a class whose target is near half its
    // horizon, 87 ms of 200 at seed 003's 470 kbit/s, had its single TCP flow cut back on
    // every spike, and its link use fell 3 %). Branch-free, for the verifier's walk.
    let overloaded = (delay > overload) & !recent;
    if above_since == 0 {
        // SAFETY: as above.
        unsafe { cas(first_above, 0, now + interval) };
        if !overloaded {
            return Signal::None;
        }
    } else if now < above_since && !overloaded {
        return Signal::None;
    }
    // A packet that may not carry a signal (its host is within its fair share) leaves the
    // state as it is: the signal due goes to the next packet that may.
    if !eligible {
        return Signal::None;
    }
    // SAFETY: as above.
    if unsafe { core::ptr::read_volatile(dropping) } == 0 {
        // Enter the dropping state (one CPU does); a class that was dropping recently resumes
        // near its previous rate of signals.
        // SAFETY: as above.
        if !unsafe { cas(dropping, 0, 1) } {
            return Signal::None;
        }
        // SAFETY: as above.
        let previous = unsafe { core::ptr::read_volatile(count) };
        let start = if recent && previous > 2 { previous - 2 } else { 1 };
        // SAFETY: as above.
        unsafe {
            core::ptr::write_volatile(count, start);
            core::ptr::write_volatile(drop_next, now + control_law(interval, start));
        }
        return Signal::Congested;
    }
    // SAFETY: as above.
    let next_signal = unsafe { core::ptr::read_volatile(drop_next) };
    if now < next_signal {
        return Signal::None;
    }
    // SAFETY: as above.
    let n = unsafe { fetch_add(count, 1) } + 1;
    // SAFETY: as above.
    if unsafe { cas(drop_next, next_signal, next_signal + control_law(interval, n)) } {
        return Signal::Congested;
    }
    // Another CPU gave this signal.
    // SAFETY: as above.
    unsafe { fetch_add(count, 1u64.wrapping_neg()) };
    Signal::None
}
