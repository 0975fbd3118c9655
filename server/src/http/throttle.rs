//! Per-address throttling of failed shared-secret attempts (gateway, fleet, enrollment
//! and device tokens).
//!
//! After [`SLOW_AFTER`] failures an address's answers are delayed, growing with each
//! further failure; after [`BLOCK_AFTER`] it is blocked for [`BLOCK_FOR`]. A blocked
//! address gets the same 429 whether its token is right or wrong (ADR-0009, third
//! review), and the token is not even checked, so a guesser learns nothing while
//! blocked. A success before the block clears the address's count.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub const SLOW_AFTER: u32 = 5;
pub const BLOCK_AFTER: u32 = 10;
pub const BLOCK_FOR: Duration = Duration::from_secs(15 * 60);
/// Added per failure beyond [`SLOW_AFTER`], capped at [`MAX_DELAY`].
pub const DELAY_STEP: Duration = Duration::from_millis(100);
pub const MAX_DELAY: Duration = Duration::from_secs(2);
/// Failures older than this are forgotten.
pub const WINDOW: Duration = Duration::from_secs(15 * 60);
/// Bound on tracked addresses, so a flood of sources cannot exhaust memory.
const MAX_TRACKED: usize = 100_000;

#[derive(Debug, Clone, Copy)]
struct Entry {
    failures: u32,
    last: Instant,
    blocked_until: Option<Instant>,
}

/// What to do with a request from an address before checking its secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Check the secret, after waiting this long.
    Check(Duration),
    /// Blocked: answer 429 without looking at the secret.
    Blocked,
}

#[derive(Debug, Default)]
pub struct Throttle {
    entries: Mutex<HashMap<IpAddr, Entry>>,
}

impl Throttle {
    pub fn gate(&self, addr: IpAddr) -> Gate {
        let now = Instant::now();
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let Some(e) = entries.get(&addr).copied() else {
            return Gate::Check(Duration::ZERO);
        };
        if let Some(until) = e.blocked_until {
            if now < until {
                return Gate::Blocked;
            }
            entries.remove(&addr);
            return Gate::Check(Duration::ZERO);
        }
        if now.duration_since(e.last) > WINDOW {
            entries.remove(&addr);
            return Gate::Check(Duration::ZERO);
        }
        Gate::Check(delay_for(e.failures))
    }

    pub fn failure(&self, addr: IpAddr) {
        let now = Instant::now();
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() >= MAX_TRACKED && !entries.contains_key(&addr) {
            entries.retain(|_, e| {
                e.blocked_until.is_some_and(|u| u > now) || now.duration_since(e.last) <= WINDOW
            });
        }
        let e = entries.entry(addr).or_insert(Entry {
            failures: 0,
            last: now,
            blocked_until: None,
        });
        e.failures = e.failures.saturating_add(1);
        e.last = now;
        if e.failures >= BLOCK_AFTER {
            e.blocked_until = Some(now + BLOCK_FOR);
        }
    }

    pub fn success(&self, addr: IpAddr) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries
            .get(&addr)
            .is_some_and(|e| e.blocked_until.is_none())
        {
            entries.remove(&addr);
        }
    }

    /// Addresses blocked now (a gauge for /metrics).
    pub fn blocked_count(&self) -> usize {
        let now = Instant::now();
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|e| e.blocked_until.is_some_and(|u| u > now))
            .count()
    }
}

fn delay_for(failures: u32) -> Duration {
    if failures < SLOW_AFTER {
        return Duration::ZERO;
    }
    (DELAY_STEP * (failures - SLOW_AFTER + 1)).min(MAX_DELAY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slows_then_blocks_and_success_resets_only_before_the_block() {
        let t = Throttle::default();
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        for _ in 0..SLOW_AFTER - 1 {
            t.failure(a);
        }
        assert_eq!(t.gate(a), Gate::Check(Duration::ZERO));
        t.failure(a);
        assert_eq!(t.gate(a), Gate::Check(DELAY_STEP));
        t.success(a);
        assert_eq!(t.gate(a), Gate::Check(Duration::ZERO));
        for _ in 0..BLOCK_AFTER {
            t.failure(a);
        }
        assert_eq!(t.gate(a), Gate::Blocked);
        t.success(a);
        assert_eq!(t.gate(a), Gate::Blocked);
        assert_eq!(t.blocked_count(), 1);
        let b: IpAddr = "127.0.0.3".parse().unwrap();
        assert_eq!(t.gate(b), Gate::Check(Duration::ZERO));
    }
}
