//! When to mint the next token: a pure schedule (no clock, no I/O; time comes in as a
//! parameter) so every rule is unit-tested.
//!
//! - After a token is minted, the next refresh is at the earlier of half its life and
//!   `min_remaining` before it expires (never sooner than `min_interval` after minting, so
//!   a provider answering tiny lifetimes cannot make a busy loop).
//! - After a failure, retry with exponential backoff (`retry_initial` doubling up to
//!   `retry_max`). The token held stays held: a failed refresh never drops a token that
//!   is still valid (the runner leaves the SDS file alone).

use std::time::{Duration, SystemTime};

/// The knobs; [`Policy::default`] is what the binary uses unless told otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Refresh once less than this remains (default 5 minutes).
    pub min_remaining: Duration,
    /// The earliest a refresh follows a mint (default 1 second).
    pub min_interval: Duration,
    /// First retry delay after a failure (default 1 second).
    pub retry_initial: Duration,
    /// Longest retry delay (default 1 minute).
    pub retry_max: Duration,
}

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            min_remaining: Duration::from_secs(5 * 60),
            min_interval: Duration::from_secs(1),
            retry_initial: Duration::from_secs(1),
            retry_max: Duration::from_secs(60),
        }
    }
}

/// A token's life: when it was asked for and when it expires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// When the request that minted it was sent (its life is counted from there, so a
    /// slow answer makes the schedule earlier, not later).
    pub obtained_at: SystemTime,
    pub expires_at: SystemTime,
}

impl Lease {
    pub fn new(obtained_at: SystemTime, expires_in: Duration) -> Lease {
        Lease {
            obtained_at,
            expires_at: obtained_at + expires_in,
        }
    }

    pub fn valid_at(&self, now: SystemTime) -> bool {
        now < self.expires_at
    }
}

impl Policy {
    /// When to refresh a token minted as `lease` says.
    pub fn refresh_at(&self, lease: &Lease) -> SystemTime {
        let life = lease
            .expires_at
            .duration_since(lease.obtained_at)
            .unwrap_or(Duration::ZERO);
        let half_life = lease.obtained_at + life / 2;
        let margin = lease
            .expires_at
            .checked_sub(self.min_remaining)
            .unwrap_or(lease.obtained_at);
        half_life
            .min(margin)
            .max(lease.obtained_at + self.min_interval)
    }

    /// The delay before retry number `failures` (1 for the first failure).
    pub fn backoff(&self, failures: u32) -> Duration {
        let factor = 2u32.saturating_pow(failures.saturating_sub(1));
        self.retry_initial
            .checked_mul(factor)
            .unwrap_or(self.retry_max)
            .min(self.retry_max)
    }
}

/// The schedule of one token.
#[derive(Debug, Clone)]
pub struct Schedule {
    policy: Policy,
    lease: Option<Lease>,
    failures: u32,
    next: SystemTime,
}

impl Schedule {
    /// Nothing held yet: the first mint is due at `now`.
    pub fn new(policy: Policy, now: SystemTime) -> Schedule {
        Schedule {
            policy,
            lease: None,
            failures: 0,
            next: now,
        }
    }

    /// When the next mint is due.
    pub fn next_attempt(&self) -> SystemTime {
        self.next
    }

    /// How long to wait from `now` (zero when due).
    pub fn wait(&self, now: SystemTime) -> Duration {
        self.next.duration_since(now).unwrap_or(Duration::ZERO)
    }

    /// The token held (the last one minted and written), if any.
    pub fn lease(&self) -> Option<Lease> {
        self.lease
    }

    /// Consecutive failures since the last success.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// A token was minted (and written): hold it, plan its refresh.
    pub fn succeeded(&mut self, lease: Lease) {
        self.failures = 0;
        self.next = self.policy.refresh_at(&lease);
        self.lease = Some(lease);
    }

    /// Minting (or writing) failed at `now`: keep the held token, retry after a backoff.
    /// Returns the delay.
    pub fn failed(&mut self, now: SystemTime) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let delay = self.policy.backoff(self.failures);
        self.next = now + delay;
        delay
    }

    /// Whether the held token is still valid at `now`.
    pub fn holds_valid(&self, now: SystemTime) -> bool {
        self.lease.is_some_and(|l| l.valid_at(now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    #[test]
    fn an_hour_token_is_refreshed_at_half_life() {
        let p = Policy::default();
        let lease = Lease::new(at(0), Duration::from_secs(3600));
        assert_eq!(p.refresh_at(&lease), at(1800));
    }

    #[test]
    fn a_token_with_little_margin_is_refreshed_min_remaining_before_expiry() {
        // 8 minutes of life: half-life is 4 minutes, 5 minutes before expiry is at 3.
        let p = Policy::default();
        let lease = Lease::new(at(0), Duration::from_secs(480));
        assert_eq!(p.refresh_at(&lease), at(180));
    }

    #[test]
    fn a_token_shorter_than_the_margin_is_refreshed_soon_but_never_in_a_busy_loop() {
        // Less than 5 minutes remain from the start: refresh as soon as min_interval allows.
        let p = Policy::default();
        assert_eq!(
            p.refresh_at(&Lease::new(at(0), Duration::from_secs(240))),
            at(1)
        );
        assert_eq!(
            p.refresh_at(&Lease::new(at(0), Duration::ZERO)),
            at(1),
            "min_interval floors it"
        );
        // With a small margin, a short token is refreshed at half-life.
        let p = Policy {
            min_remaining: Duration::from_secs(1),
            ..Policy::default()
        };
        assert_eq!(
            p.refresh_at(&Lease::new(at(0), Duration::from_secs(4))),
            at(2)
        );
    }

    #[test]
    fn min_remaining_is_configurable() {
        let p = Policy {
            min_remaining: Duration::from_secs(60 * 50),
            ..Policy::default()
        };
        let lease = Lease::new(at(0), Duration::from_secs(3600));
        assert_eq!(p.refresh_at(&lease), at(600));
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let p = Policy::default();
        let delays: Vec<u64> = (1..=9).map(|n| p.backoff(n).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(p.backoff(u32::MAX), Duration::from_secs(60));
    }

    #[test]
    fn the_first_mint_is_due_at_once() {
        let s = Schedule::new(Policy::default(), at(5));
        assert_eq!(s.next_attempt(), at(5));
        assert_eq!(s.wait(at(5)), Duration::ZERO);
        assert!(!s.holds_valid(at(5)));
    }

    #[test]
    fn a_failed_refresh_keeps_the_valid_token_and_backs_off() {
        let mut s = Schedule::new(Policy::default(), at(0));
        let lease = Lease::new(at(0), Duration::from_secs(3600));
        s.succeeded(lease);
        assert_eq!(s.next_attempt(), at(1800));
        assert_eq!(s.wait(at(1000)), Duration::from_secs(800));

        assert_eq!(s.failed(at(1800)), Duration::from_secs(1));
        assert_eq!(s.next_attempt(), at(1801));
        assert_eq!(s.failed(at(1801)), Duration::from_secs(2));
        assert_eq!(s.next_attempt(), at(1803));
        assert_eq!(s.lease(), Some(lease), "the held token is not dropped");
        assert!(s.holds_valid(at(1803)));
        assert_eq!(s.failures(), 2);

        let fresh = Lease::new(at(1803), Duration::from_secs(3600));
        s.succeeded(fresh);
        assert_eq!(s.failures(), 0);
        assert_eq!(s.lease(), Some(fresh));
        assert_eq!(s.next_attempt(), at(1803 + 1800));
        assert_eq!(
            s.failed(at(4000)),
            Duration::from_secs(1),
            "backoff restarts"
        );
    }

    #[test]
    fn a_token_expires_at_its_end() {
        let lease = Lease::new(at(0), Duration::from_secs(10));
        assert!(lease.valid_at(at(9)));
        assert!(!lease.valid_at(at(10)));
    }
}
