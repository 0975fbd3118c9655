//! PollKill: how halod reacts to a newly accepted kill list between full cycles
//! (spec: halod apply loop, "Between pulls"; ADR-0009 addendum 2026-10-02).
//!
//! The list itself is verified by halo-policy (signature with the kill key, freshness,
//! strictly newer than the held list); this module only decides what the change means
//! for this device, without a registry round trip where it can.

use halo_policy::CONTROL_VARIANT;
use halo_policy::killswitch::KillList;

use crate::state::Assignment;

/// What a kill-list change asks of the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillAction {
    /// Nothing this device runs changed.
    Nothing,
    /// The device's experiment was just killed: apply the cached, already verified ring
    /// release (control) now.
    ApplyRingRelease,
    /// Something may come back (an unkill) or toggle kills changed: run a full cycle.
    FullCycle,
}

/// Compare the held list (`None`: never accepted one) with the newly accepted one.
pub fn react(
    held: Option<&KillList>,
    new: &KillList,
    assignment: Option<&Assignment>,
) -> KillAction {
    let was_killed = |name: &str| held.is_some_and(|l| l.is_experiment_killed(name));
    if let Some(a) = assignment.filter(|a| a.variant != CONTROL_VARIANT) {
        let now_killed = new.is_experiment_killed(&a.experiment);
        if now_killed && !was_killed(&a.experiment) {
            return KillAction::ApplyRingRelease;
        }
    }
    // An unkill of an experiment this device is enrolled in may move it back to its
    // variant; the assignment only names a variant while it runs, so look at what was
    // lifted.
    let unkilled = held.is_some_and(|l| {
        l.experiments()
            .iter()
            .any(|name| !new.is_experiment_killed(name))
    });
    let toggles_changed = held.map_or(!new.toggles().is_empty(), |l| l.toggles() != new.toggles());
    // The spec runs a full cycle on toggle-kill changes "while on a variant"; client
    // toggles live in the ring release too, so any change of toggle kills re-renders.
    if unkilled || toggles_changed {
        KillAction::FullCycle
    } else {
        KillAction::Nothing
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use halo_policy::keys;
    use halo_policy::killswitch::{self, KillPayload};
    use time::OffsetDateTime;

    use super::*;

    struct Signer {
        key: ed25519_dalek::SigningKey,
        public: ed25519_compact::PublicKey,
        now: i64,
    }

    impl Signer {
        fn new() -> Signer {
            let pair = keys::generate().unwrap();
            Signer {
                key: keys::signing_key_from_pem(&pair.private_pem).unwrap(),
                public: keys::public_key_from_pem(&pair.public_pem).unwrap(),
                now: 1_800_000_000,
            }
        }

        /// A list issued one second after the previous one, verified as halod would.
        fn list(
            &mut self,
            experiments: &[&str],
            toggles: &[&str],
            held: Option<&KillList>,
        ) -> KillList {
            self.now += 1;
            let payload = KillPayload {
                version: self.now as u64,
                experiments: experiments
                    .iter()
                    .map(|s| s.to_string())
                    .collect::<BTreeSet<_>>(),
                toggles: toggles.iter().map(|s| s.to_string()).collect(),
                issued_at: OffsetDateTime::from_unix_timestamp(self.now).unwrap(),
            };
            let envelope = killswitch::sign(&payload, &self.key).unwrap();
            killswitch::verify(&envelope, &self.public, self.now, held).unwrap()
        }
    }

    fn on(experiment: &str, variant: &str) -> Assignment {
        Assignment {
            experiment: experiment.into(),
            variant: variant.into(),
        }
    }

    #[test]
    fn killing_the_devices_experiment_applies_the_ring_release() {
        let mut s = Signer::new();
        let empty = s.list(&[], &[], None);
        let killed = s.list(&["opus-default"], &[], Some(&empty));
        let a = on("opus-default", "treatment");
        assert_eq!(
            react(Some(&empty), &killed, Some(&a)),
            KillAction::ApplyRingRelease
        );
        // Already killed before: nothing new to do.
        let again = s.list(&["opus-default"], &[], Some(&killed));
        assert_eq!(react(Some(&killed), &again, Some(&a)), KillAction::Nothing);
    }

    #[test]
    fn a_device_in_control_or_another_experiment_is_not_moved() {
        let mut s = Signer::new();
        let empty = s.list(&[], &[], None);
        let killed = s.list(&["opus-default"], &[], Some(&empty));
        let control = on("opus-default", CONTROL_VARIANT);
        assert_eq!(
            react(Some(&empty), &killed, Some(&control)),
            KillAction::Nothing
        );
        let other = on("other-test", "treatment");
        assert_eq!(
            react(Some(&empty), &killed, Some(&other)),
            KillAction::Nothing
        );
        assert_eq!(react(Some(&empty), &killed, None), KillAction::Nothing);
    }

    #[test]
    fn an_unkill_or_a_toggle_kill_change_runs_a_full_cycle() {
        let mut s = Signer::new();
        let killed = s.list(&["opus-default"], &[], None);
        let lifted = s.list(&[], &[], Some(&killed));
        assert_eq!(react(Some(&killed), &lifted, None), KillAction::FullCycle);
        let toggled = s.list(&[], &["deep-reasoning"], Some(&lifted));
        assert_eq!(react(Some(&lifted), &toggled, None), KillAction::FullCycle);
        // The first list ever accepted with toggle kills also re-renders.
        let mut fresh = Signer::new();
        let first = fresh.list(&[], &["deep-reasoning"], None);
        assert_eq!(react(None, &first, None), KillAction::FullCycle);
    }
}
