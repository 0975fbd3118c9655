//! Against a real registry (Debian's docker-registry on loopback, via halo-testkit):
//! publish, verify, promote, and every way a release or pointer must be refused.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![cfg(feature = "oci")]

use std::collections::BTreeMap;
use std::path::Path;

use ed25519_dalek::SigningKey;
use halo_release::build::build_ring;
use halo_release::names::pointer_tag;
use halo_release::oci::{
    self, OciError, Registry, RegistryOptions, prepare_pointer, promote_ring, publish_ring,
    pull_verified, read_pointer,
};
use halo_release::pointer::{Applied, new_pointer};
use halo_release::sign::Signer;
use halo_testkit::registry::Registry as TestRegistry;
use time::OffsetDateTime;

fn acme() -> halo_policy::Org {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/acme-corp");
    halo_policy::load::load_dir(&dir).expect("acme-corp loads")
}

fn signer(seed: u8) -> Signer {
    Signer::new(SigningKey::from_bytes(&[seed; 32]))
}

fn now() -> OffsetDateTime {
    OffsetDateTime::now_utc()
}

fn quiet(_: &str) {}

fn connect(reg: &TestRegistry) -> Registry {
    Registry::connect(
        &format!("{}/acme/halos", reg.host()),
        RegistryOptions::default(),
    )
    .unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn publish_verify_promote_round_trip_and_refusals() {
    let test_registry = TestRegistry::start();
    let reg = connect(&test_registry);
    let org = acme();
    let key = signer(1);
    let keys = [key.public_key()];
    let none = BTreeMap::new();

    // The canary ring is enrolled in the running client experiment: 2 channels + ring.
    let build = build_ring(&org, "canary").unwrap();
    assert_eq!(build.channels.len(), 2);
    let r1 = publish_ring(&reg, &build, "1.0.0", &key, &none, now(), None, &quiet)
        .await
        .unwrap();
    assert_eq!(r1.releases.len(), 3);
    assert_eq!(r1.pointers.len(), 3);
    assert_eq!(
        r1.pointers.last().unwrap().0,
        "ring-canary.pointer",
        "the ring moves last"
    );

    // Verify as halod would: pointer, then the release by digest.
    let v = pull_verified(
        &reg,
        "acme-corp",
        "canary",
        None,
        &keys,
        None,
        now(),
        oci::DEFAULT_MAX_RELEASE_BYTES,
    )
    .await
    .unwrap();
    assert_eq!(v.pointer.digest, build.ring.digest);
    assert_eq!(v.manifest, build.ring.manifest);
    let channel = &v.manifest.experiments[0].variants[1].channel;
    let cv = pull_verified(
        &reg,
        "acme-corp",
        "canary",
        Some(channel),
        &keys,
        None,
        now(),
        oci::DEFAULT_MAX_RELEASE_BYTES,
    )
    .await
    .unwrap();
    assert_eq!(cv.manifest.channel.as_ref(), Some(channel));

    // Same policy, same digest: republishing v1.0.0 is a no-op, v1.0.1 has the same
    // release digest, and the seq only grows.
    let again = publish_ring(
        &reg,
        &build_ring(&org, "canary").unwrap(),
        "1.0.0",
        &key,
        &none,
        now(),
        None,
        &quiet,
    )
    .await
    .unwrap();
    assert_eq!(again.releases[2].1, r1.releases[2].1);
    assert!(!again.releases[2].3, "nothing pushed again");
    let r2 = publish_ring(
        &reg,
        &build_ring(&org, "canary").unwrap(),
        "1.0.1",
        &key,
        &none,
        now(),
        None,
        &quiet,
    )
    .await
    .unwrap();
    assert_eq!(
        r2.releases[2].1, r1.releases[2].1,
        "same policy gives the same release digest"
    );
    let seq1 = r1.pointers[2].1;
    let seq_again = again.pointers[2].1;
    let seq2 = r2.pointers[2].1;
    assert!(
        seq1 < seq_again && seq_again < seq2,
        "{seq1} < {seq_again} < {seq2}"
    );

    // A recorded seq far ahead (a registry rolled back) still wins.
    let recorded: BTreeMap<String, u64> = [("ring-canary.pointer".to_string(), seq2 + 1000)].into();
    let r3 = promote_ring(
        &reg,
        "canary",
        "1.0.0",
        &key,
        &recorded,
        now(),
        None,
        &quiet,
    )
    .await
    .unwrap();
    assert_eq!(r3.pointers.last().unwrap().1, seq2 + 1001);

    // A moved tag is refused: v1.0.0 of a changed policy.
    let mut changed = org.clone();
    changed
        .profiles
        .get_mut("engineering")
        .unwrap()
        .models
        .push("extra".into());
    let err = publish_ring(
        &reg,
        &build_ring(&changed, "canary").unwrap(),
        "1.0.0",
        &key,
        &none,
        now(),
        None,
        &quiet,
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, OciError::TagExists { ref tag, .. } if tag == "v1.0.0_canary_claude-opus-default_control"),
        "{err}"
    );
    assert!(err.to_string().contains("moving a tag is an error"));

    // Rollback: publish v2 of the changed policy, then promote back to v1.0.0.
    let r4 = publish_ring(
        &reg,
        &build_ring(&changed, "canary").unwrap(),
        "2.0.0",
        &key,
        &recorded,
        now(),
        None,
        &quiet,
    )
    .await
    .unwrap();
    assert_ne!(r4.releases[2].1, r1.releases[2].1);
    let before = read_pointer(&reg, "ring-canary.pointer", &keys)
        .await
        .unwrap()
        .unwrap();
    let back = promote_ring(&reg, "canary", "1.0.0", &key, &none, now(), None, &quiet)
        .await
        .unwrap();
    let after = read_pointer(&reg, "ring-canary.pointer", &keys)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(after.digest, r1.releases[2].1, "rolled back to v1.0.0");
    assert!(after.seq > before.seq);
    assert_eq!(back.pointers.last().unwrap().1, after.seq);
    // A device that applied the newer seq refuses an older one; accepts the rollback.
    let applied = Applied {
        seq: after.seq + 1,
        digest: after.digest.clone(),
    };
    let err = pull_verified(
        &reg,
        "acme-corp",
        "canary",
        None,
        &keys,
        Some(&applied),
        now(),
        oci::DEFAULT_MAX_RELEASE_BYTES,
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("rollback refused"), "{err}");

    // Wrong key: the preflight refuses and no pointer moves.
    let wrong = signer(2);
    let err = publish_ring(
        &reg,
        &build_ring(&org, "canary").unwrap(),
        "3.0.0",
        &wrong,
        &none,
        now(),
        None,
        &quiet,
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("wrong --key"), "{err}");
    let still = read_pointer(&reg, "ring-canary.pointer", &keys)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(still, after, "no pointer moved");
    // A verifier trusting only another key refuses the pointer.
    let err = pull_verified(
        &reg,
        "acme-corp",
        "canary",
        None,
        &[wrong.public_key()],
        None,
        now(),
        oci::DEFAULT_MAX_RELEASE_BYTES,
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("does not verify"), "{err}");
    // And the wrong org.
    let err = pull_verified(
        &reg,
        "other-org",
        "canary",
        None,
        &keys,
        None,
        now(),
        oci::DEFAULT_MAX_RELEASE_BYTES,
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("org"), "{err}");
}

#[tokio::test(flavor = "current_thread")]
async fn tampered_manifest_or_pointer_fails_verify() {
    let test_registry = TestRegistry::start();
    let reg = connect(&test_registry);
    let org = acme();
    let key = signer(1);
    let keys = [key.public_key()];
    let build = build_ring(&org, "early").unwrap();
    assert!(
        build.channels.is_empty(),
        "early is in no client experiment"
    );
    publish_ring(
        &reg,
        &build,
        "1.0.0",
        &key,
        &BTreeMap::new(),
        now(),
        None,
        &quiet,
    )
    .await
    .unwrap();
    let tag = pointer_tag("early", None).unwrap();
    let good = read_pointer(&reg, &tag, &keys).await.unwrap().unwrap();

    // Tampered pointer: the payload changed (seq bumped) under the old signature.
    let (bytes, _) = reg.get_manifest(&tag).await.unwrap().unwrap();
    let mut manifest: oci::ImageManifest = serde_json::from_slice(&bytes).unwrap();
    let mut forged = good.clone();
    forged.seq += 1;
    let payload = forged.to_bytes();
    let d = halo_release::pack::digest(&payload);
    reg.push_blob_if_missing(&payload, &d).await.unwrap();
    manifest.layers[0] = oci::Descriptor::of(oci::POINTER_TYPE, &payload);
    reg.push_manifest(&tag, &manifest.to_bytes()).await.unwrap();
    let err = pull_verified(
        &reg,
        "acme-corp",
        "early",
        None,
        &keys,
        None,
        now(),
        oci::DEFAULT_MAX_RELEASE_BYTES,
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("does not verify"), "{err}");

    // Tampered release: a different tar in the layer, its manifest keeping the old
    // signature, behind a validly signed pointer (a registry writer swapping content).
    let (rbytes, _) = reg.get_manifest(&good.manifest).await.unwrap().unwrap();
    let mut rmanifest: oci::ImageManifest = serde_json::from_slice(&rbytes).unwrap();
    let other = build_ring(&org, "canary").unwrap().ring;
    let layer_digest = halo_release::pack::digest(&other.tar);
    reg.push_blob_if_missing(&other.tar, &layer_digest)
        .await
        .unwrap();
    rmanifest.layers[0] = oci::Descriptor::of(oci::RELEASE_LAYER_TYPE, &other.tar);
    let tampered = rmanifest.to_bytes();
    let tampered_digest = halo_release::pack::digest(&tampered);
    reg.push_manifest(&tampered_digest, &tampered)
        .await
        .unwrap();
    let pointer = new_pointer(
        "acme-corp",
        "early",
        None,
        &layer_digest,
        &tampered_digest,
        good.seq + 10,
        now(),
    );
    let p = prepare_pointer(pointer, &key).unwrap();
    reg.push_blob_if_missing(&p.payload, &halo_release::pack::digest(&p.payload))
        .await
        .unwrap();
    reg.push_manifest(&tag, &p.manifest).await.unwrap();
    let err = pull_verified(
        &reg,
        "acme-corp",
        "early",
        None,
        &keys,
        None,
        now(),
        oci::DEFAULT_MAX_RELEASE_BYTES,
    )
    .await
    .unwrap_err();
    assert!(
        err.to_string().contains("signature does not verify"),
        "{err}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn unreachable_registry_fails_clearly() {
    let port = halo_testkit::free_port();
    let reg = Registry::connect(
        &format!("127.0.0.1:{port}/acme/halos"),
        RegistryOptions::default(),
    )
    .unwrap();
    let build = build_ring(&acme(), "early").unwrap();
    let err = publish_ring(
        &reg,
        &build,
        "1.0.0",
        &signer(1),
        &BTreeMap::new(),
        now(),
        None,
        &quiet,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, OciError::Unreachable { .. }), "{err}");
    assert!(
        err.to_string()
            .starts_with(&format!("cannot reach registry 127.0.0.1:{port}")),
        "{err}"
    );
}

/// Issue 27, item 6: a pointer signed by a foreign key is planted over ours. Publish and
/// promote refuse, naming the foreign key id and the recovery; the recovery replaces only
/// pointers claiming exactly the confirmed id, and refuses every near miss.
#[tokio::test(flavor = "current_thread")]
async fn a_foreign_pointer_is_replaced_only_when_its_key_id_is_confirmed() {
    let test_registry = TestRegistry::start();
    let reg = connect(&test_registry);
    let org = acme();
    let key = signer(1);
    let keys = [key.public_key()];
    let none = BTreeMap::new();
    let build = build_ring(&org, "early").unwrap();
    publish_ring(&reg, &build, "1.0.0", &key, &none, now(), None, &quiet)
        .await
        .unwrap();
    let tag = pointer_tag("early", None).unwrap();
    let ours = read_pointer(&reg, &tag, &keys).await.unwrap().unwrap();

    // Someone with write access plants a pointer signed by their own key.
    let foreign = signer(9);
    let planted = new_pointer(
        "acme-corp",
        "early",
        None,
        &ours.digest,
        &ours.manifest,
        ours.seq + 1,
        now(),
    );
    let p = prepare_pointer(planted, &foreign).unwrap();
    reg.push_blob_if_missing(&p.payload, &halo_release::pack::digest(&p.payload))
        .await
        .unwrap();
    reg.push_manifest(&tag, &p.manifest).await.unwrap();
    let (planted_manifest, _) = reg.get_manifest(&tag).await.unwrap().unwrap();

    // Publish and promote refuse, showing the foreign key id and the recovery command.
    let err = publish_ring(&reg, &build, "1.1.0", &key, &none, now(), None, &quiet)
        .await
        .unwrap_err();
    match &err {
        OciError::ForeignPointer {
            key_id, own_key_id, ..
        } => {
            assert_eq!(key_id, &foreign.key_id());
            assert_eq!(own_key_id, &key.key_id());
        }
        other => panic!("expected ForeignPointer, got {other}"),
    }
    let text = err.to_string();
    assert!(text.contains("no pointer was moved"), "{text}");
    assert!(
        text.contains(&format!("--replace-foreign-pointer {}", foreign.key_id())),
        "{text}"
    );
    let err = promote_ring(&reg, "early", "1.0.0", &key, &none, now(), None, &quiet)
        .await
        .unwrap_err();
    assert!(matches!(err, OciError::ForeignPointer { .. }), "{err}");

    // Near misses move nothing: another id, the publishing key's own id.
    for wrong in ["0123456789abcdef".to_string(), key.key_id()] {
        let err = promote_ring(
            &reg,
            "early",
            "1.0.0",
            &key,
            &none,
            now(),
            Some(&wrong),
            &quiet,
        )
        .await
        .unwrap_err();
        assert!(
            matches!(err, OciError::ForeignPointer { .. } | OciError::Verify(_)),
            "{err}"
        );
        let (still, _) = reg.get_manifest(&tag).await.unwrap().unwrap();
        assert_eq!(still, planted_manifest, "{wrong}: nothing moved");
    }

    // The confirmed id: the pointer is ours again, its seq above the last one we wrote
    // (the publisher's state file; the planted seq is not trusted).
    let recorded = BTreeMap::from([(tag.clone(), ours.seq)]);
    let report = promote_ring(
        &reg,
        "early",
        "1.0.0",
        &key,
        &recorded,
        now(),
        Some(&foreign.key_id()),
        &quiet,
    )
    .await
    .unwrap();
    assert_eq!(report.pointers.len(), 1);
    let back = read_pointer(&reg, &tag, &keys).await.unwrap().unwrap();
    assert_eq!(back.digest, ours.digest);
    assert!(back.seq > ours.seq, "{} vs {}", back.seq, ours.seq);
    pull_verified(
        &reg,
        "acme-corp",
        "early",
        None,
        &keys,
        None,
        now(),
        oci::DEFAULT_MAX_RELEASE_BYTES,
    )
    .await
    .unwrap();

    // With nothing foreign left, the flag is refused rather than silently ignored.
    let err = promote_ring(
        &reg,
        "early",
        "1.0.0",
        &key,
        &none,
        now(),
        Some(&foreign.key_id()),
        &quiet,
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("nothing to replace"), "{err}");
    // And publish works again.
    publish_ring(&reg, &build, "1.1.0", &key, &none, now(), None, &quiet)
        .await
        .unwrap();
}
