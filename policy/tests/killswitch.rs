//! The signed kill list (ADR-0009) and its key files: what a gateway accepts, what it
//! refuses, and what applying a list may change.
//!
//! Most envelopes here are built by hand with ed25519-dalek (the prefix spelled out), so
//! the wire format is pinned independently of `killswitch::sign`.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use base64::Engine as _;
use ed25519_dalek::{Signer as _, SigningKey};
use halo_policy::keys::{self, KeyError};
use halo_policy::killswitch::{self, KillList, KillListError};
use halo_policy::snapshot::{Snapshot, SnapshotExperiment, SnapshotRing, SnapshotToggle};
use halo_policy::{Axis, ExperimentStatus, ExperimentType, Membership, Target};
use sha2::{Digest, Sha256};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// 2026-09-30T12:00:00Z.
const NOW: i64 = 1_790_769_600;

fn kill_key() -> SigningKey {
    SigningKey::from_bytes(&[7u8; 32])
}

fn release_key() -> SigningKey {
    SigningKey::from_bytes(&[9u8; 32])
}

fn public(key: &SigningKey) -> ed25519_compact::PublicKey {
    ed25519_compact::PublicKey::new(key.verifying_key().to_bytes())
}

fn rfc3339(unix: i64) -> String {
    OffsetDateTime::from_unix_timestamp(unix)
        .unwrap()
        .format(&Rfc3339)
        .unwrap()
}

fn payload(version: u64, experiments: &[&str], toggles: &[&str], issued_at: &str) -> String {
    serde_json::json!({
        "version": version,
        "experiments": experiments,
        "toggles": toggles,
        "issuedAt": issued_at,
    })
    .to_string()
}

fn envelope_with(raw_payload: &str, signature: &[u8]) -> Vec<u8> {
    let signature = base64::engine::general_purpose::STANDARD.encode(signature);
    format!(r#"{{"payload":{raw_payload},"signature":"{signature}"}}"#).into_bytes()
}

/// An envelope signed the way ADR-0009 says: over the prefix and the raw payload bytes.
fn signed(key: &SigningKey, raw_payload: &str) -> Vec<u8> {
    let mut message = b"halo-killswitch-v1\n".to_vec();
    message.extend_from_slice(raw_payload.as_bytes());
    envelope_with(raw_payload, &key.sign(&message).to_bytes())
}

/// A kill list issued `age` seconds before NOW, accepted with no list held.
fn accepted(experiments: &[&str], toggles: &[&str], age: i64) -> KillList {
    let raw = payload(1, experiments, toggles, &rfc3339(NOW - age));
    killswitch::verify(&signed(&kill_key(), &raw), &public(&kill_key()), NOW, None).unwrap()
}

fn verify(envelope: &[u8]) -> Result<KillList, KillListError> {
    killswitch::verify(envelope, &public(&kill_key()), NOW, None)
}

// ---------------------------------------------------------------------------
// Signature and domain separation
// ---------------------------------------------------------------------------

#[test]
fn hand_signed_list_is_accepted_with_its_names_sorted() {
    let raw = payload(
        42,
        &["exp-b", "exp-a", "exp-b"],
        &["tog-z", "tog-y"],
        "2026-09-30T11:59:30Z",
    );
    let list = verify(&signed(&kill_key(), &raw)).unwrap();
    assert_eq!(list.version(), 42);
    assert_eq!(list.issued_at_unix(), NOW - 30);
    let experiments: Vec<&str> = list.experiments().iter().map(String::as_str).collect();
    assert_eq!(experiments, ["exp-a", "exp-b"]);
    let toggles: Vec<&str> = list.toggles().iter().map(String::as_str).collect();
    assert_eq!(toggles, ["tog-y", "tog-z"]);
    assert!(list.is_experiment_killed("exp-a"));
    assert!(!list.is_experiment_killed("exp-c"));
    assert!(list.is_toggle_killed("tog-z"));
    assert!(!list.is_toggle_killed("exp-a"));
}

#[test]
fn signed_bytes_are_verified_as_sent_not_re_serialized() {
    // Whitespace and key order a serializer would not produce are fine when signed.
    let raw = "{ \"issuedAt\" : \"2026-09-30T12:00:00Z\",\n  \"toggles\": [],\n  \"experiments\": [\"exp-a\"], \"version\": 3 }";
    let list = verify(&signed(&kill_key(), raw)).unwrap();
    assert!(list.is_experiment_killed("exp-a"));
    assert_eq!(list.version(), 3);
}

#[test]
fn list_signed_by_the_release_key_is_refused() {
    let raw = payload(1, &["exp-a"], &[], &rfc3339(NOW));
    let err = verify(&signed(&release_key(), &raw)).unwrap_err();
    assert_eq!(err, KillListError::BadSignature);
    assert!(err.to_string().contains("does not verify"), "{err}");
}

#[test]
fn signature_without_the_domain_prefix_is_refused() {
    let raw = payload(1, &["exp-a"], &[], &rfc3339(NOW));
    let bare = kill_key().sign(raw.as_bytes()).to_bytes();
    assert_eq!(
        verify(&envelope_with(&raw, &bare)).unwrap_err(),
        KillListError::BadSignature
    );
}

#[test]
fn release_pointer_statement_signed_with_the_kill_key_is_not_a_kill_list() {
    let raw = payload(1, &["exp-a"], &[], &rfc3339(NOW));
    let statement = format!(
        "halos.pointer.v1 {}",
        hex::encode(Sha256::digest(raw.as_bytes()))
    );
    let signature = kill_key().sign(statement.as_bytes()).to_bytes();
    assert_eq!(
        verify(&envelope_with(&raw, &signature)).unwrap_err(),
        KillListError::BadSignature
    );
    // Nor is the statement itself, carried as the payload, with a kill-list signature.
    let as_payload = serde_json::to_string(&statement).unwrap();
    assert!(matches!(
        verify(&signed(&kill_key(), &as_payload)).unwrap_err(),
        KillListError::MalformedEnvelope(_)
    ));
}

#[test]
fn tampering_any_payload_byte_is_refused() {
    let raw = payload(1, &["exp-a"], &["tog-a"], &rfc3339(NOW));
    let good = signed(&kill_key(), &raw);
    assert!(verify(&good).is_ok());
    let text = String::from_utf8(good).unwrap();

    // An un-kill: the experiment renamed away.
    let renamed = text.replacen("exp-a", "exp-b", 1);
    // Whitespace only: still the same JSON, but not the signed bytes.
    let spaced = text.replacen("{\"payload\":{", "{\"payload\":{ ", 1);
    // The version bumped.
    let bumped = text.replacen("\"version\":1", "\"version\":2", 1);
    for tampered in [renamed, spaced, bumped] {
        assert_ne!(tampered, text);
        assert_eq!(
            verify(tampered.as_bytes()).unwrap_err(),
            KillListError::BadSignature,
            "{tampered}"
        );
    }
}

// ---------------------------------------------------------------------------
// Freshness and replay
// ---------------------------------------------------------------------------

#[test]
fn age_bound_is_ten_minutes_inclusive() {
    let at = |issued: &str| verify(&signed(&kill_key(), &payload(1, &[], &[], issued)));
    assert!(at(&rfc3339(NOW - 600)).is_ok());
    assert!(at("2026-09-30T11:50:00.5Z").is_ok(), "599.5 s old");
    let err = at(&rfc3339(NOW - 601)).unwrap_err();
    assert!(
        matches!(err, KillListError::Stale { age_secs: 601, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("stale"), "{err}");
    assert!(matches!(
        at("2026-09-30T11:49:59.999Z").unwrap_err(),
        KillListError::Stale { .. }
    ));
}

#[test]
fn future_bound_is_one_minute_inclusive() {
    let at = |issued: &str| verify(&signed(&kill_key(), &payload(1, &[], &[], issued)));
    assert!(at(&rfc3339(NOW + 60)).is_ok());
    let err = at(&rfc3339(NOW + 61)).unwrap_err();
    assert!(
        matches!(err, KillListError::Future { ahead_secs: 61, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("future"), "{err}");
    assert!(matches!(
        at("2026-09-30T12:01:00.001Z").unwrap_err(),
        KillListError::Future { .. }
    ));
}

#[test]
fn replay_of_the_held_list_and_older_lists_are_refused_newer_accepted() {
    let key = public(&kill_key());
    let held_envelope = signed(
        &kill_key(),
        &payload(5, &["exp-a"], &[], &rfc3339(NOW - 10)),
    );
    let held = killswitch::verify(&held_envelope, &key, NOW - 10, None).unwrap();

    // The same envelope again.
    let err = killswitch::verify(&held_envelope, &key, NOW, Some(&held)).unwrap_err();
    assert!(matches!(err, KillListError::NotNewer { .. }), "{err:?}");
    assert!(err.to_string().contains("not newer"), "{err}");

    // An older, still fresh list without the kill: the un-kill replay.
    let older = signed(&kill_key(), &payload(4, &[], &[], &rfc3339(NOW - 20)));
    assert!(matches!(
        killswitch::verify(&older, &key, NOW, Some(&held)).unwrap_err(),
        KillListError::NotNewer { .. }
    ));

    // Same instant, other content: not strictly newer.
    let same_time = signed(&kill_key(), &payload(6, &[], &[], &rfc3339(NOW - 10)));
    assert!(matches!(
        killswitch::verify(&same_time, &key, NOW, Some(&held)).unwrap_err(),
        KillListError::NotNewer { .. }
    ));

    // A newer list replaces it, even an unkill; a millisecond later is enough.
    let newer = signed(
        &kill_key(),
        &payload(6, &[], &[], "2026-09-30T11:59:50.001Z"),
    );
    let next = killswitch::verify(&newer, &key, NOW, Some(&held)).unwrap();
    assert!(!next.is_experiment_killed("exp-a"));
    assert_eq!(next.version(), 6);
}

#[test]
fn restore_checks_signature_but_not_age_and_guards_replays() {
    let key = public(&kill_key());
    let env = signed(&kill_key(), &payload(2, &["exp-a"], &[], &rfc3339(NOW)));
    let accepted = killswitch::verify(&env, &key, NOW, None).unwrap();
    assert_eq!(accepted.envelope(), env.as_slice());

    // After a restart the persisted envelope is the held list again, whatever its age.
    let restored = killswitch::restore(accepted.envelope(), &key).unwrap();
    assert_eq!(restored, accepted);
    let older = signed(&kill_key(), &payload(1, &[], &[], &rfc3339(NOW - 5)));
    assert!(matches!(
        killswitch::verify(&older, &key, NOW + 1, Some(&restored)).unwrap_err(),
        KillListError::NotNewer { .. }
    ));

    // A restored envelope must still carry the kill key's signature.
    let forged = signed(&release_key(), &payload(2, &[], &[], &rfc3339(NOW)));
    assert_eq!(
        killswitch::restore(&forged, &key).unwrap_err(),
        KillListError::BadSignature
    );
}

// ---------------------------------------------------------------------------
// Strict decoding
// ---------------------------------------------------------------------------

#[test]
fn malformed_envelopes_are_refused_with_their_own_errors() {
    let raw = payload(1, &["exp-a"], &[], &rfc3339(NOW));
    let good = String::from_utf8(signed(&kill_key(), &raw)).unwrap();
    let sig = good
        .split("\"signature\":\"")
        .nth(1)
        .unwrap()
        .trim_end_matches("\"}");

    let envelope_errors = [
        "not json".to_string(),
        format!(r#"{{"payload":{raw}}}"#),
        format!(r#"{{"payload":{raw},"signature":"{sig}","keyId":"k1"}}"#),
        format!(r#"{{"payload":{raw},"payload":{raw},"signature":"{sig}"}}"#),
        format!("{good} {{}}"),
    ];
    for env in envelope_errors {
        let err = verify(env.as_bytes()).unwrap_err();
        assert!(
            matches!(err, KillListError::MalformedEnvelope(_)),
            "{env}: {err:?}"
        );
        assert!(err.to_string().contains("envelope is malformed"), "{err}");
    }

    let short = base64::engine::general_purpose::STANDARD.encode([1u8; 63]);
    for bad_sig in ["not base64!", &sig[..sig.len() - 2], short.as_str()] {
        let env = format!(r#"{{"payload":{raw},"signature":"{bad_sig}"}}"#);
        assert_eq!(
            verify(env.as_bytes()).unwrap_err(),
            KillListError::MalformedSignature,
            "{bad_sig}"
        );
    }
}

#[test]
fn correctly_signed_but_malformed_payloads_are_refused() {
    let issued = rfc3339(NOW);
    let payloads = [
        // Unknown field.
        format!(
            r#"{{"version":1,"experiments":[],"toggles":[],"issuedAt":"{issued}","expires":"never"}}"#
        ),
        // Missing experiments.
        format!(r#"{{"version":1,"toggles":[],"issuedAt":"{issued}"}}"#),
        // Negative version.
        format!(r#"{{"version":-1,"experiments":[],"issuedAt":"{issued}"}}"#),
        // Not RFC 3339.
        r#"{"version":1,"experiments":[],"issuedAt":"2026-09-30 12:00:00"}"#.to_string(),
        // Not UTC.
        r#"{"version":1,"experiments":[],"issuedAt":"2026-09-30T14:00:00+02:00"}"#.to_string(),
    ];
    for raw in payloads {
        let err = verify(&signed(&kill_key(), &raw)).unwrap_err();
        assert!(
            matches!(err, KillListError::MalformedPayload(_)),
            "{raw}: {err:?}"
        );
    }
    // An array carrying the same fields is not the wire format either.
    let array = format!(r#"[1,[],[],"{issued}"]"#);
    assert!(matches!(
        verify(&signed(&kill_key(), &array)).unwrap_err(),
        KillListError::MalformedEnvelope(_)
    ));
}

#[test]
fn payload_without_toggles_kills_no_toggle() {
    let raw = format!(
        r#"{{"version":1,"experiments":["exp-a"],"issuedAt":"{}"}}"#,
        rfc3339(NOW)
    );
    let list = verify(&signed(&kill_key(), &raw)).unwrap();
    assert!(list.toggles().is_empty());
    assert!(list.is_experiment_killed("exp-a"));
}

// ---------------------------------------------------------------------------
// Apply
// ---------------------------------------------------------------------------

fn target(model: &str) -> Target {
    Target {
        upstream: "anthropic".to_string(),
        model: model.to_string(),
        weight: None,
        priority: 0,
        timeout_seconds: None,
    }
}

fn routes(model: &str) -> BTreeMap<String, Vec<Target>> {
    BTreeMap::from([("opus".to_string(), vec![target(model)])])
}

fn experiment(name: &str, status: ExperimentStatus) -> SnapshotExperiment {
    SnapshotExperiment {
        name: name.to_string(),
        experiment_type: ExperimentType::Canary,
        axis: Axis::Traffic,
        status,
        rings: vec!["everyone".to_string()],
        salt: name.to_string(),
        variants: vec![],
        shadow_turns: None,
    }
}

fn toggle(name: &str) -> SnapshotToggle {
    SnapshotToggle {
        name: name.to_string(),
        default: true,
        rules: vec![],
        routes: routes(&format!("{name}-model")),
    }
}

fn snapshot() -> Snapshot {
    Snapshot {
        schema: 1,
        org: "acme".to_string(),
        identity: None,
        protocols: BTreeMap::new(),
        upstreams: BTreeMap::new(),
        models: routes("claude-opus"),
        rings: vec![SnapshotRing {
            name: "everyone".to_string(),
            order: 0,
            release: None,
            membership: Membership {
                default: true,
                ..Membership::default()
            },
        }],
        experiments: vec![
            experiment("exp-running", ExperimentStatus::Running),
            experiment("exp-draft", ExperimentStatus::Draft),
            experiment("exp-paused", ExperimentStatus::Paused),
            experiment("exp-concluded", ExperimentStatus::Concluded),
        ],
        toggles: vec![toggle("tog-a"), toggle("tog-b")],
        prices: Default::default(),
        budgets: Default::default(),
        budget_service: None,
    }
}

#[test]
fn apply_pauses_killed_experiments_and_removes_killed_toggles() {
    let snap = snapshot();
    let list = accepted(&["exp-running", "exp-elsewhere"], &["tog-a"], 0);
    let out = list.apply(&snap);

    assert_eq!(
        out.experiment("exp-running").unwrap().status,
        ExperimentStatus::Paused
    );
    assert_eq!(
        out.experiment("exp-draft").unwrap().status,
        ExperimentStatus::Draft
    );
    let toggles: Vec<&str> = out.toggles.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(toggles, ["tog-b"]);
    // Everything else is untouched, and the input is not modified.
    assert_eq!(out.models, snap.models);
    assert_eq!(out.rings, snap.rings);
    assert_eq!(snap, snapshot());
}

#[test]
fn empty_list_changes_nothing() {
    let snap = snapshot();
    assert_eq!(accepted(&[], &[], 0).apply(&snap), snap);
}

#[test]
fn no_kill_list_can_add_a_route_or_start_anything() {
    let snap = snapshot();
    let experiment_names = [
        "exp-running",
        "exp-draft",
        "exp-paused",
        "exp-concluded",
        "exp-unknown",
    ];
    let toggle_names = ["tog-a", "tog-b", "tog-unknown"];
    let subset = |names: &[&'static str], bits: usize| -> Vec<&'static str> {
        (0..names.len())
            .filter(|i| bits & (1 << i) != 0)
            .map(|i| names[i])
            .collect()
    };
    for e_bits in 0..1usize << experiment_names.len() {
        for t_bits in 0..1usize << toggle_names.len() {
            let killed_e = subset(&experiment_names, e_bits);
            let killed_t = subset(&toggle_names, t_bits);
            let out = accepted(&killed_e, &killed_t, 0).apply(&snap);

            // Routing outside experiments and toggles is never touched.
            assert_eq!(out.models, snap.models);
            assert_eq!(out.rings, snap.rings);
            assert_eq!(out.upstreams, snap.upstreams);
            assert_eq!(out.protocols, snap.protocols);
            assert_eq!(out.identity, snap.identity);

            // Experiments: same ones, same definitions; a status can only become paused.
            assert_eq!(out.experiments.len(), snap.experiments.len());
            for (after, before) in out.experiments.iter().zip(&snap.experiments) {
                let killed = killed_e.contains(&before.name.as_str());
                let expected = if killed {
                    ExperimentStatus::Paused
                } else {
                    before.status
                };
                assert_eq!(after.status, expected, "{killed_e:?}");
                assert_eq!(
                    SnapshotExperiment {
                        status: before.status,
                        ..after.clone()
                    },
                    *before
                );
            }

            // Toggles: only removals, never an addition or a changed route.
            let kept: Vec<&SnapshotToggle> = snap
                .toggles
                .iter()
                .filter(|t| !killed_t.contains(&t.name.as_str()))
                .collect();
            assert_eq!(out.toggles.iter().collect::<Vec<_>>(), kept, "{killed_t:?}");
        }
    }
}

// ---------------------------------------------------------------------------
// Keys
// ---------------------------------------------------------------------------

/// Written by `openssl genpkey -algorithm ed25519` and `openssl pkey -pubout` (a test key).
const OPENSSL_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----
MC4CAQAwBQYDK2VwBCIEINB1dU863PxeBAtW81F9D5KAzQ8vz2lD9jXOeFoU5SBf
-----END PRIVATE KEY-----
";
const OPENSSL_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----
MCowBQYDK2VwAyEAagTV7xy8XVKlJHgi9FSinAsoJCqn02WQoBEBUQpiOfs=
-----END PUBLIC KEY-----
";

#[test]
fn openssl_public_key_verifies_a_list_signed_with_its_private_key() {
    let private = SigningKey::from_bytes(
        &ed25519_compact::KeyPair::from_pem(OPENSSL_PRIVATE)
            .unwrap()
            .sk
            .seed(),
    );
    let key = keys::public_key_from_pem(OPENSSL_PUBLIC).unwrap();
    let env = signed(&private, &payload(1, &["exp-a"], &[], &rfc3339(NOW)));
    assert!(killswitch::verify(&env, &key, NOW, None).is_ok());
    // The kill key does not verify what this key signed.
    assert!(killswitch::verify(&env, &public(&kill_key()), NOW, None).is_err());
}

#[test]
fn public_key_pem_refuses_other_material_without_echoing_it() {
    let err = keys::public_key_from_pem(OPENSSL_PRIVATE).unwrap_err();
    assert_eq!(err, KeyError::PrivateKeyGiven);
    assert!(!err.to_string().contains("MC4CAQAw"), "{err}");

    for bad in [
        "",
        "MCowBQYDK2VwAyEAagTV7xy8XVKlJHgi9FSinAsoJCqn02WQoBEBUQpiOfs=",
        "-----BEGIN PUBLIC KEY-----\nnot base64\n-----END PUBLIC KEY-----\n",
        // An RSA-sized blob.
        "-----BEGIN PUBLIC KEY-----\nMFwwDQYJKoZIhvcNAQEBBQADSwAwSAJBAKj34GkxFhD90vcNLYLInFEX6Ppy1tPf\n-----END PUBLIC KEY-----\n",
    ] {
        let err = keys::public_key_from_pem(bad).unwrap_err();
        assert_eq!(err, KeyError::PublicKeyPem, "{bad}");
        assert!(!err.to_string().contains("MFwwDQ"));
    }
}

#[test]
fn small_order_public_key_is_refused() {
    // SPKI ed25519 header + the encoding of the identity point (order 1).
    let mut der = vec![48, 42, 48, 5, 6, 3, 43, 101, 112, 3, 33, 0, 1];
    der.extend_from_slice(&[0u8; 31]);
    let pem = format!(
        "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
        base64::engine::general_purpose::STANDARD.encode(&der)
    );
    assert!(matches!(
        keys::public_key_from_pem(&pem).unwrap_err(),
        KeyError::InvalidPublicKey(_)
    ));
}

#[cfg(feature = "sign")]
mod sign {
    use super::*;
    use halo_policy::killswitch::KillPayload;
    use std::collections::BTreeSet;

    fn der_of(pem: &str) -> Vec<u8> {
        let b64: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap()
    }

    #[test]
    fn sign_with_dalek_verify_with_compact() {
        let payload = KillPayload {
            version: 9,
            experiments: BTreeSet::from(["exp-a".to_string()]),
            toggles: BTreeSet::from(["tog-a".to_string()]),
            issued_at: OffsetDateTime::from_unix_timestamp(NOW).unwrap(),
        };
        let env = killswitch::sign(&payload, &kill_key()).unwrap();
        let list = killswitch::verify(&env, &public(&kill_key()), NOW, None).unwrap();
        assert_eq!(*list.payload(), payload);
        assert_eq!(list.envelope(), env.as_slice());
        // The wire format names the fields as ADR-0009 does, issuedAt in UTC.
        let text = String::from_utf8(env).unwrap();
        assert!(
            text.starts_with(
                r#"{"payload":{"version":9,"experiments":["exp-a"],"toggles":["tog-a"],"issuedAt":"2026-09-30T12:00:00Z"},"signature":""#
            ),
            "{text}"
        );
        // And a release key cannot have produced it.
        assert_eq!(
            killswitch::verify(text.as_bytes(), &public(&release_key()), NOW, None).unwrap_err(),
            KillListError::BadSignature
        );
    }

    #[test]
    fn sign_writes_utc_whatever_the_offset_given() {
        let payload = KillPayload {
            version: 1,
            experiments: BTreeSet::new(),
            toggles: BTreeSet::new(),
            issued_at: OffsetDateTime::from_unix_timestamp(NOW)
                .unwrap()
                .to_offset(time::macros::offset!(+2)),
        };
        let env = killswitch::sign(&payload, &kill_key()).unwrap();
        let list = verify(&env).unwrap();
        assert_eq!(list.issued_at_unix(), NOW);
    }

    #[test]
    fn generated_keys_round_trip_through_pem_in_openssl_form() {
        let pair = keys::generate().unwrap();
        assert!(
            pair.private_pem
                .starts_with("-----BEGIN PRIVATE KEY-----\n")
        );
        assert!(pair.public_pem.starts_with("-----BEGIN PUBLIC KEY-----\n"));

        // Exactly OpenSSL's PKCS#8 v1 and SPKI layouts (the fixture's headers).
        let private_der = der_of(&pair.private_pem);
        assert_eq!(private_der.len(), 48);
        assert_eq!(private_der[..16], der_of(OPENSSL_PRIVATE)[..16]);
        let public_der = der_of(&pair.public_pem);
        assert_eq!(public_der.len(), 44);
        assert_eq!(public_der[..12], der_of(OPENSSL_PUBLIC)[..12]);

        // Both libraries read both files back, and they agree.
        let signing = keys::signing_key_from_pem(&pair.private_pem).unwrap();
        let public_compact = keys::public_key_from_pem(&pair.public_pem).unwrap();
        assert_eq!(signing.verifying_key().to_bytes(), *public_compact);
        let compact_pair = ed25519_compact::KeyPair::from_pem(&pair.private_pem).unwrap();
        assert_eq!(compact_pair.pk, public_compact);
        assert_eq!(*compact_pair.sk.seed(), signing.to_bytes());

        // The files make a working kill-switch pair.
        let payload = KillPayload {
            version: 1,
            experiments: BTreeSet::from(["exp-a".to_string()]),
            toggles: BTreeSet::new(),
            issued_at: OffsetDateTime::from_unix_timestamp(NOW).unwrap(),
        };
        let env = killswitch::sign(&payload, &signing).unwrap();
        assert!(killswitch::verify(&env, &public_compact, NOW, None).is_ok());

        // Two generated keys differ, and Debug never shows the private key.
        let other = keys::generate().unwrap();
        assert_ne!(other.public_pem, pair.public_pem);
        assert!(!format!("{pair:?}").contains(&pair.private_pem[28..60]));
    }

    #[test]
    fn openssl_private_key_file_is_read() {
        let signing = keys::signing_key_from_pem(OPENSSL_PRIVATE).unwrap();
        let public = keys::public_key_from_pem(OPENSSL_PUBLIC).unwrap();
        assert_eq!(signing.verifying_key().to_bytes(), *public);
        // Re-encoding gives back OpenSSL's exact files.
        let pair = keys::KeyPair::from_signing_key(&signing).unwrap();
        assert_eq!(pair.private_pem.as_str(), OPENSSL_PRIVATE);
        assert_eq!(pair.public_pem, OPENSSL_PUBLIC);
    }

    #[test]
    fn signing_key_pem_refuses_other_material_without_echoing_it() {
        assert_eq!(
            keys::signing_key_from_pem(OPENSSL_PUBLIC).unwrap_err(),
            KeyError::PublicKeyGiven
        );
        let truncated = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEINB1dU863PxeBAtW81F9D5KA\n-----END PRIVATE KEY-----\n";
        let err = keys::signing_key_from_pem(truncated).unwrap_err();
        assert_eq!(err, KeyError::PrivateKeyPem);
        assert!(!err.to_string().contains("MC4CAQAw"), "{err}");
        assert_eq!(
            keys::signing_key_from_pem("").unwrap_err(),
            KeyError::PrivateKeyPem
        );
    }
}

#[test]
fn key_id_is_the_sha256_of_the_raw_public_key() {
    let pem = "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=\n-----END PUBLIC KEY-----\n";
    let key = halo_policy::keys::public_key_from_pem(pem).expect("RFC 8410 example key");
    // Pinned: revocation lists in the field name keys by this id.
    assert_eq!(
        halo_policy::keys::key_id(&key),
        "e744c0791320c3285460eddb523f14c88d857ada46b97a5690d88cf978b9191f"
    );
}
