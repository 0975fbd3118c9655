//! assign: the single source of hashing for rings, variants, toggle percentages and
//! weighted route picks.
//!
//! The filter, `halo gateway routes`, halod and the controller all call these functions, so
//! one user gets the same ring, variant and target everywhere. The algorithm is part of the
//! product's contract: changing any step below moves real users between rings, variants
//! and providers (and cold-starts their prompt caches). It must never change silently; the
//! golden vectors in the tests pin it.
//!
//! # Algorithm
//!
//! 1. `h` = the first 8 bytes, read big-endian as a `u64`, of
//!    `SHA-256(salt || 0x00 || key)`, where `salt` and `key` are their UTF-8 bytes.
//!    The zero byte separates the two so that `("ab", "c")` and `("a", "bc")` differ.
//! 2. [`bucket`] = `h % 10_000`: a basis-point bucket in `0..10_000`.
//! 3. [`in_percent`] = `bucket < percent * 100`: 0 takes nobody, 100 (or more) everybody,
//!    and raising the percent only ever adds users (the ones already in stay in).
//! 4. [`pick`] over weights `w`: `point = h % sum(w)`, the answer is the first index whose
//!    cumulative weight exceeds `point`. Zero weights are never picked; an empty or
//!    all-zero list has no answer.
//!
//! # Salts and keys by use
//!
//! | use                          | salt                    | key                        |
//! |------------------------------|-------------------------|----------------------------|
//! | ring `percent`               | `ring:<ring name>`      | user                       |
//! | experiment variant           | the experiment's `salt` | user                       |
//! | toggle rule `percent`        | `toggle:<toggle name>`  | user                       |
//! | weighted target in a tier    | `route:<alias>`         | [`sticky_key`] (user, session) |
//! | evidence unit ([`unit`])     | `unit:` + the experiment's `salt` (outside one: `unit:ring:<ring>`) | user |
//!
//! Distinct salts make the uses independent: being in a ring's 10% says nothing about being
//! in a toggle's 10%.

use sha2::{Digest, Sha256};

/// Number of buckets [`bucket`] spreads keys over (basis points of 100%).
pub const BUCKETS: u32 = 10_000;

/// The 64-bit hash every assignment derives from (step 1 of the algorithm).
pub fn hash64(salt: &str, key: &str) -> u64 {
    let mut hasher = Sha256::new();
    hasher.update(salt.as_bytes());
    hasher.update([0u8]);
    hasher.update(key.as_bytes());
    let digest = hasher.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

/// The key's bucket in `0..10_000` under `salt`.
pub fn bucket(salt: &str, key: &str) -> u32 {
    // The remainder is below 10_000, so it always fits.
    (hash64(salt, key) % u64::from(BUCKETS)) as u32
}

/// Whether the key falls in the first `percent` percent under `salt`.
pub fn in_percent(salt: &str, key: &str, percent: u32) -> bool {
    bucket(salt, key) < percent.saturating_mul(BUCKETS / 100)
}

/// The index picked by weight for the key under `salt`; `None` for an empty or all-zero
/// list.
pub fn pick(salt: &str, key: &str, weights: &[u32]) -> Option<usize> {
    let total: u64 = weights.iter().map(|&w| u64::from(w)).sum();
    if total == 0 {
        return None;
    }
    let point = hash64(salt, key) % total;
    let mut cumulative = 0u64;
    for (index, &weight) in weights.iter().enumerate() {
        cumulative += u64::from(weight);
        if point < cumulative {
            return Some(index);
        }
    }
    None
}

/// The key of a sticky route pick: the user, a newline, then the harness session (which
/// may be empty). A user containing a newline could collide with another (user, session)
/// pair; that only shares a target choice, it grants nothing.
pub fn sticky_key(user: &str, session: &str) -> String {
    let mut key = String::with_capacity(user.len() + 1 + session.len());
    key.push_str(user);
    key.push('\n');
    key.push_str(session);
    key
}

/// Salt of a ring's `percent` membership.
pub fn ring_salt(ring: &str) -> String {
    format!("ring:{ring}")
}

/// Salt of a toggle rule's `percent`.
pub fn toggle_salt(toggle: &str) -> String {
    format!("toggle:{toggle}")
}

/// Salt of the weighted pick within a tier of an alias's targets.
pub fn route_salt(alias: &str) -> String {
    format!("route:{alias}")
}

/// The evidence unit of `user` (spec: "the per-unit key is a salted hash"): 32 lowercase
/// hex digits (128 bits) of `SHA-256(salt || 0x00 || user)` for the salt [`unit_salt`]
/// gives. What leaves the gateway in place of the subject: the controller compares
/// variants per unit without ever seeing who the unit is. Distinct from the variant hash
/// (its own salt prefix), so a unit says nothing about another use's bucket.
pub fn unit(salt: &str, user: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(salt.as_bytes());
    hasher.update([0u8]);
    hasher.update(user.as_bytes());
    hex::encode(&hasher.finalize()[..16])
}

/// The salt of the evidence [`unit`]: the experiment's own salt when the call counts for
/// one, else the ring's.
pub fn unit_salt(experiment_salt: Option<&str>, ring: &str) -> String {
    match experiment_salt {
        Some(salt) => format!("unit:{salt}"),
        None => format!("unit:{}", ring_salt(ring)),
    }
}

/// Whether `user` is in the `percent` share of ring `ring` (a ring's `membership.percent`).
pub fn in_ring_percent(ring: &str, user: &str, percent: u32) -> bool {
    in_percent(&ring_salt(ring), user, percent)
}

/// Whether `user` is in the `percent` share of a rule of toggle `toggle`.
pub fn in_toggle_percent(toggle: &str, user: &str, percent: u32) -> bool {
    in_percent(&toggle_salt(toggle), user, percent)
}

/// The variant index of `user` in an experiment with this `salt` and these variant weights.
pub fn variant(salt: &str, user: &str, weights: &[u32]) -> Option<usize> {
    pick(salt, user, weights)
}

/// The weighted pick among one tier's targets of `alias`, for this sticky key.
pub fn route_pick(alias: &str, sticky: &str, weights: &[u32]) -> Option<usize> {
    pick(&route_salt(alias), sticky, weights)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (salt, key, h, bucket, pick over [90, 10], pick over [1, 1, 1]).
    /// Computed once (and cross-checked with Python's hashlib) and pinned. Changing any of
    /// these moves real users between rings, variants and targets: do not update them to
    /// make a test pass.
    const GOLDEN: [(&str, &str, u64, u32, usize, usize); 12] = [
        (
            "ring:canary",
            "alice@acme.com",
            0x2ab6_7974_cc57_65c2,
            9682,
            0,
            0,
        ),
        (
            "ring:canary",
            "bob@acme.com",
            0xb41a_bc26_8dec_d4f8,
            3144,
            0,
            0,
        ),
        ("ring:canary", "", 0x7122_a964_f9bd_80e4, 8900, 0, 1),
        (
            "ring:early-adopters",
            "alice@acme.com",
            0x48c6_e35c_b118_3016,
            70,
            0,
            2,
        ),
        (
            "toggle:fast-sonnet",
            "alice@acme.com",
            0xbc87_9c3a_ad26_eb64,
            5748,
            0,
            0,
        ),
        (
            "toggle:fast-sonnet",
            "carol@acme.com",
            0xd40a_a248_02b8_efc8,
            8456,
            0,
            1,
        ),
        (
            "exp-opus-canary-2025",
            "alice@acme.com",
            0x90bb_724c_e655_9eb8,
            7288,
            0,
            2,
        ),
        (
            "exp-opus-canary-2025",
            "dave@acme.com",
            0xa43a_22b2_a489_1b72,
            1506,
            0,
            0,
        ),
        (
            "route:default",
            "alice@acme.com\ns-42",
            0x5286_2cee_55f4_e20e,
            9262,
            0,
            2,
        ),
        (
            "route:default",
            "alice@acme.com\n",
            0x707e_4b30_c373_41f6,
            5542,
            0,
            1,
        ),
        (
            "route:opus",
            "bob@acme.com\ns-1",
            0xe8f7_5cbf_f02d_c4ac,
            3420,
            0,
            2,
        ),
        ("", "", 0x6e34_0b9c_ffb3_7a98, 3192, 1, 2),
    ];

    #[test]
    fn golden_vectors_are_pinned() {
        for (salt, key, h, b, p90, p3) in GOLDEN {
            assert_eq!(hash64(salt, key), h, "hash of {salt:?} {key:?}");
            assert_eq!(bucket(salt, key), b, "bucket of {salt:?} {key:?}");
            assert_eq!(
                pick(salt, key, &[90, 10]),
                Some(p90),
                "90/10 of {salt:?} {key:?}"
            );
            assert_eq!(
                pick(salt, key, &[1, 1, 1]),
                Some(p3),
                "thirds of {salt:?} {key:?}"
            );
        }
    }

    #[test]
    fn golden_picks_of_the_minority_and_around_zero_weights() {
        // Users who land in the 10% of a 90/10 route split; pinned like the table above.
        let user13 = sticky_key("user13@acme.com", "s-1");
        let user32 = sticky_key("user32@acme.com", "s-1");
        assert_eq!(route_pick("default", &user13, &[90, 10]), Some(1));
        assert_eq!(route_pick("default", &user32, &[90, 10]), Some(1));
        // Zero weights are never chosen: the point falls through to the next non-zero one.
        assert_eq!(route_pick("default", &user13, &[0, 5, 0, 5]), Some(1));
        assert_eq!(route_pick("default", &user32, &[0, 5, 0, 5]), Some(3));
        assert_eq!(
            variant("exp-opus-canary-2025", "erin@acme.com", &[50, 50]),
            Some(0)
        );
        assert_eq!(bucket("exp-opus-canary-2025", "erin@acme.com"), 1023);
    }

    #[test]
    fn helpers_use_the_documented_salts_and_keys() {
        assert_eq!(sticky_key("alice@acme.com", "s-42"), "alice@acme.com\ns-42");
        assert_eq!(sticky_key("alice@acme.com", ""), "alice@acme.com\n");
        assert_eq!(ring_salt("canary"), "ring:canary");
        assert_eq!(toggle_salt("fast-sonnet"), "toggle:fast-sonnet");
        assert_eq!(route_salt("opus"), "route:opus");
        // alice is in bucket 70 of ring:early-adopters: in at 1%, out below.
        assert!(in_ring_percent("early-adopters", "alice@acme.com", 1));
        assert!(!in_ring_percent("early-adopters", "alice@acme.com", 0));
        // alice is in bucket 5748 of toggle:fast-sonnet: in at 58%, out at 57%.
        assert!(in_toggle_percent("fast-sonnet", "alice@acme.com", 58));
        assert!(!in_toggle_percent("fast-sonnet", "alice@acme.com", 57));
        assert_eq!(
            route_pick("default", &sticky_key("alice@acme.com", "s-42"), &[10, 90]),
            Some(1)
        );
    }

    #[test]
    fn percent_bounds() {
        for (salt, key, ..) in GOLDEN {
            assert!(!in_percent(salt, key, 0), "0% takes nobody");
            assert!(in_percent(salt, key, 100), "100% takes everybody");
            assert!(
                in_percent(salt, key, u32::MAX),
                "over 100% saturates to everybody"
            );
        }
    }

    #[test]
    fn raising_a_percent_keeps_everyone_already_in() {
        for n in 0..2_000 {
            let user = format!("user{n}@acme.com");
            let in_at_10 = in_percent("ring:canary", &user, 10);
            let in_at_25 = in_percent("ring:canary", &user, 25);
            assert!(!in_at_10 || in_at_25, "{user} left the ring when it grew");
        }
    }

    #[test]
    fn ten_percent_of_ten_thousand_users_is_about_a_thousand() {
        let inside = (0..10_000)
            .filter(|n| in_percent("ring:canary", &format!("user{n}@acme.com"), 10))
            .count();
        assert!((900..=1_100).contains(&inside), "{inside} of 10000 at 10%");
    }

    #[test]
    fn a_ninety_ten_pick_splits_within_tolerance() {
        let mut counts = [0usize; 2];
        for n in 0..10_000 {
            let key = sticky_key(&format!("user{n}@acme.com"), "s-1");
            let index = route_pick("default", &key, &[90, 10]).expect("non-zero weights");
            counts[index] += 1;
        }
        assert!((8_800..=9_200).contains(&counts[0]), "{counts:?}");
        assert!((800..=1_200).contains(&counts[1]), "{counts:?}");
    }

    #[test]
    fn the_same_input_gives_the_same_answer() {
        for n in 0..200 {
            let user = format!("user{n}@acme.com");
            let first = (
                bucket("ring:canary", &user),
                pick("salt-1", &user, &[3, 2, 5]),
            );
            let again = (
                bucket("ring:canary", &user),
                pick("salt-1", &user, &[3, 2, 5]),
            );
            assert_eq!(first, again);
        }
    }

    #[test]
    fn salts_are_independent() {
        // Who is in ring:a's 10% must not predict who is in ring:b's 10%: the overlap of
        // two independent 10% slices of 10 000 users is about 100.
        let users: Vec<String> = (0..10_000).map(|n| format!("user{n}@acme.com")).collect();
        let both = users
            .iter()
            .filter(|u| in_percent("ring:a", u, 10) && in_percent("toggle:a", u, 10))
            .count();
        assert!(
            (50..=150).contains(&both),
            "{both} users in both 10% slices"
        );
        // And the separator matters: moving a byte across it changes the hash.
        assert_ne!(hash64("ab", "c"), hash64("a", "bc"));
    }

    #[test]
    fn pick_has_no_answer_without_weight() {
        assert_eq!(pick("s", "k", &[]), None);
        assert_eq!(pick("s", "k", &[0, 0]), None);
        assert_eq!(pick("s", "k", &[0, 7, 0]), Some(1));
        // Weights near u32::MAX do not overflow the sum.
        assert!(pick("s", "k", &[u32::MAX, u32::MAX]).is_some());
    }

    #[test]
    fn the_unit_is_a_salted_hash_never_the_user() {
        let a = unit(&unit_salt(Some("s1"), "general"), "alice@acme.com");
        assert_eq!(a.len(), 32);
        assert!(
            a.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        assert!(!a.contains("alice"));
        // Stable, and another salt (experiment) or user gives another unit.
        assert_eq!(a, unit(&unit_salt(Some("s1"), "general"), "alice@acme.com"));
        assert_ne!(a, unit(&unit_salt(Some("s2"), "general"), "alice@acme.com"));
        assert_ne!(a, unit(&unit_salt(Some("s1"), "general"), "bob@acme.com"));
        // Outside an experiment the ring salts it; the prefix keeps it apart from the
        // variant hash of the same salt.
        assert_eq!(unit_salt(None, "early"), "unit:ring:early");
        assert_ne!(&a[..16], format!("{:016x}", hash64("s1", "alice@acme.com")));
    }
}
