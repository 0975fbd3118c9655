//! The per-target circuit breaker (spec: halos-low-level-design.md step 10, "with more
//! than one target, the breaker opens after 5 consecutive failures and allows one
//! half-open probe after 30 s"). A pure state machine: time is passed in, nothing here
//! calls Envoy.
//!
//! Why in the filter and not Envoy's outlier detection: outlier detection never counts a
//! 429, un-ejects a target fully when its ejection ends (no single probe) and lengthens each
//! later ejection; and an ejected target's priority is skipped by the aggregate's load
//! balancer, which would divert the breaker's own probe. The filter decides which target
//! leads a model call (the aggregate it names), so that is where an open target is skipped
//! ([`crate::pipeline::on_body`]); Envoy then walks the aggregate's fixed order, so a target
//! whose breaker is open can still take a later attempt of a call led by another.
//!
//! What a failure is: an attempt that moved the call on (a connect error, a reset, a 5xx or
//! a 429 from the upstream: [`crate::request::every_target_failed`]'s test); anything else
//! an upstream answered is a success. The request filter records each attempt of a call
//! when its answer's headers arrive ([`Failover::record`]): every attempt before the last
//! failed (Envoy moved on from it), the last is what the answer says.
//!
//! Shared by: every request of one Envoy worker in the wasm build (a VM per worker
//! thread, one set of breakers per VM) and every request of the Envoy process in the
//! native build (one module per process, the set behind a mutex).

use std::collections::HashMap;
use std::time::Duration;

use halo_contract::attempts::Breaker as Settings;
use halo_policy::cluster_names;
use halo_policy::types::Target;

/// One target's breaker. No entry: closed with no failure counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Closed, with this many consecutive failures (fewer than the threshold).
    Closed(u32),
    /// Open since this time: the target leads no call until the cool-down has passed.
    Open(Duration),
    /// One call was let through as the probe at this time; the next outcome decides. A
    /// probe whose outcome never comes (the client went away) is replaced by another one
    /// a cool-down later.
    Probing(Duration),
}

/// The breakers of every target, keyed by the target's sub-cluster name
/// ([`cluster_names::target_cluster`]: one per distinct target, shared by every route
/// that lists it).
#[derive(Debug, Default)]
pub struct Breakers {
    states: HashMap<String, State>,
}

impl Breakers {
    pub fn new() -> Breakers {
        Breakers::default()
    }

    /// Whether a call may lead with `target` at `now`. Once the cool-down of an open
    /// breaker has passed, the first call asking is the probe (the breaker is then
    /// half-open, and asks after it are refused until the probe's outcome).
    pub fn admit(&mut self, settings: &Settings, target: &str, now: Duration) -> bool {
        let cooldown = Duration::from_secs(u64::from(settings.open_seconds));
        let Some(state) = self.states.get_mut(target) else {
            return true;
        };
        match *state {
            State::Closed(_) => true,
            State::Open(since) | State::Probing(since) => {
                if now.saturating_sub(since) < cooldown {
                    return false;
                }
                *state = State::Probing(now);
                true
            }
        }
    }

    /// [`Breakers::admit`] without taking the probe: what it would answer.
    pub fn would_admit(&self, settings: &Settings, target: &str, now: Duration) -> bool {
        let cooldown = Duration::from_secs(u64::from(settings.open_seconds));
        match self.states.get(target) {
            None | Some(State::Closed(_)) => true,
            Some(State::Open(since) | State::Probing(since)) => {
                now.saturating_sub(*since) >= cooldown
            }
        }
    }

    /// An attempt on `target` ended: `failed` when it moved the call on.
    pub fn record(&mut self, settings: &Settings, target: &str, failed: bool, now: Duration) {
        if !failed {
            // Closed again (or still), with nothing counted: no entry.
            self.states.remove(target);
            return;
        }
        let threshold = settings.consecutive_failures.max(1);
        let state = self
            .states
            .entry(target.to_string())
            .or_insert(State::Closed(0));
        *state = match *state {
            State::Closed(n) if n + 1 < threshold => State::Closed(n + 1),
            // The threshold reached, or the probe failed: open from now.
            State::Closed(_) | State::Probing(_) => State::Open(now),
            // Attempts that were under way when it opened change nothing.
            open @ State::Open(_) => open,
        };
    }

    /// True when every breaker is closed with no failure counted.
    pub fn is_empty(&self) -> bool {
        self.states.is_empty()
    }

    /// Whether `target`'s breaker is open or half-open (for the flow's tests).
    pub fn is_open(&self, target: &str) -> bool {
        matches!(
            self.states.get(target),
            Some(State::Open(_) | State::Probing(_))
        )
    }
}

/// Where the breakers live for a build: the flow asks for them for the length of a call
/// (`f`), so a build that shares them across threads holds its lock only that long.
pub trait BreakerCell {
    fn with<R>(&self, f: impl FnOnce(&mut Breakers) -> R) -> R;
}

/// What the request filter keeps of a routed call to record its attempts: the route's
/// targets, which of them the call's class can use, and the one that led.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failover {
    pub alias: String,
    pub targets: Vec<Target>,
    /// Per target of `targets`: whether the call's class can use it (the aggregate walks
    /// only those).
    pub usable: Vec<bool>,
    /// The index in `targets` of the target the call led with.
    pub lead: usize,
    /// The breakers' threshold and cool-down in force when the call was decided.
    pub settings: Settings,
}

impl Failover {
    /// Record the attempts of the call: `attempts` were made (Envoy's count; `None` reads
    /// as one), `last_failed` says how the last one ended (`None`: unknown, the answer
    /// never came; only the attempts before it are recorded).
    ///
    /// Envoy sends attempt k to the k-th sub-cluster of the aggregate (each retry to the
    /// next untried priority), so the aggregate's order names the target of each.
    pub fn record(
        &self,
        breakers: &mut Breakers,
        attempts: Option<u32>,
        last_failed: Option<bool>,
        now: Duration,
    ) {
        let attempts = usize::try_from(attempts.unwrap_or(1).max(1)).unwrap_or(1);
        let order: Vec<usize> = if attempts == 1 {
            vec![self.lead]
        } else {
            cluster_names::failover_indices(&self.targets, &self.alias, &self.usable, self.lead)
        };
        for (k, &index) in order.iter().enumerate().take(attempts) {
            let failed = if k + 1 < attempts {
                true
            } else {
                match last_failed {
                    Some(failed) => failed,
                    None => continue,
                }
            };
            // A success on a target with no breaker state changes nothing: the common
            // call costs no key.
            if let Some(target) = self.targets.get(index)
                && (failed || !breakers.is_empty())
            {
                let key = cluster_names::target_cluster(target);
                breakers.record(&self.settings, &key, failed, now);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: &str = "t~prov-a~m~0~abcd1234";

    fn settings() -> Settings {
        Settings {
            consecutive_failures: 5,
            open_seconds: 30,
        }
    }

    fn at(secs: u64) -> Duration {
        Duration::from_secs(1_000 + secs)
    }

    #[test]
    fn five_consecutive_failures_open_it_and_a_success_in_between_resets_the_count() {
        let s = settings();
        let mut b = Breakers::new();
        for _ in 0..4 {
            b.record(&s, T, true, at(0));
        }
        assert!(b.admit(&s, T, at(0)), "four failures leave it closed");
        b.record(&s, T, false, at(0));
        for _ in 0..4 {
            b.record(&s, T, true, at(0));
        }
        assert!(b.admit(&s, T, at(0)), "the success reset the count");
        b.record(&s, T, true, at(1));
        assert!(b.is_open(T));
        assert!(!b.admit(&s, T, at(1)), "the fifth in a row opens it");
        assert!(!b.admit(&s, T, at(30)), "for the whole cool-down");
        // Another target is not affected.
        assert!(b.admit(&s, "t~other", at(1)));
    }

    #[test]
    fn after_the_cool_down_exactly_one_probe_goes_and_its_outcome_decides() {
        let s = settings();
        let mut b = Breakers::new();
        for _ in 0..5 {
            b.record(&s, T, true, at(0));
        }
        assert!(!b.would_admit(&s, T, at(29)));
        assert!(b.would_admit(&s, T, at(30)));
        assert!(
            b.admit(&s, T, at(30)),
            "the first call after the cool-down probes"
        );
        assert!(!b.admit(&s, T, at(30)), "one probe at a time");
        assert!(!b.admit(&s, T, at(45)));
        // The probe failed: open again for a whole cool-down from now.
        b.record(&s, T, true, at(46));
        assert!(!b.admit(&s, T, at(75)));
        assert!(b.admit(&s, T, at(76)));
        // This probe succeeded: closed, every call may lead with it.
        b.record(&s, T, false, at(77));
        assert!(!b.is_open(T));
        assert!(b.admit(&s, T, at(77)) && b.admit(&s, T, at(77)));
        // And the count starts from nothing: four failures do not open it.
        for _ in 0..4 {
            b.record(&s, T, true, at(78));
        }
        assert!(b.admit(&s, T, at(78)));
    }

    #[test]
    fn a_probe_whose_outcome_never_comes_is_replaced_a_cool_down_later() {
        let s = settings();
        let mut b = Breakers::new();
        for _ in 0..5 {
            b.record(&s, T, true, at(0));
        }
        assert!(b.admit(&s, T, at(30)));
        assert!(!b.admit(&s, T, at(59)));
        assert!(b.admit(&s, T, at(60)), "the lost probe is replaced");
    }

    #[test]
    fn attempts_under_way_when_it_opened_do_not_extend_it() {
        let s = settings();
        let mut b = Breakers::new();
        for _ in 0..5 {
            b.record(&s, T, true, at(0));
        }
        b.record(&s, T, true, at(20));
        assert!(b.admit(&s, T, at(30)));
    }

    #[test]
    fn a_threshold_of_one_opens_on_the_first_failure() {
        let s = Settings {
            consecutive_failures: 1,
            open_seconds: 1,
        };
        let mut b = Breakers::new();
        b.record(&s, T, true, at(0));
        assert!(!b.admit(&s, T, at(0)));
        assert!(b.admit(&s, T, at(1)));
    }
}
