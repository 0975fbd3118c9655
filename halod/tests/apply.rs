//! halod end to end: a real registry (docker-registry via halo-testkit) holding releases
//! of examples/acme-corp published with halo-release, a real halo-server on loopback
//! (ring endpoint, reports, signed kill list), and halod applying under a root prefix.
//! One test per row of issue 7's "Attacks and faults", plus the `halod once` binary.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ed25519_dalek::SigningKey;
use halo_killswitch::{Action, Target};
use halo_policy::{Harness, Org};
use halo_release::adapters::Os;
use halo_release::build::{RingBuild, build_ring};
use halo_release::names::pointer_tag;
use halo_release::oci::{self, Registry, RegistryOptions, prepare_pointer, publish_ring};
use halo_release::pointer::new_pointer;
use halo_release::sign::Signer;
use halo_server::server::Running;
use halo_testkit::registry::Registry as TestRegistry;
use halod::agent::{Agent, Outcome, Status};
use halod::config::Config;
use halod::state::State;
use time::OffsetDateTime;

const GATEWAY_TOKEN: &str = "3f9a1c7e5b2d8046af13ce97b0d24e6c58a7f31d9e0b6c24f8a5173d0e9c6b12";
const EXPERIMENT: &str = "claude-opus-default";
const CLAUDE: &str = "/etc/claude-code/managed-settings.json";
const CODEX: &str = "/etc/codex/managed_config.toml";
const GEMINI: &str = "/etc/gemini-cli/settings.json";
/// halod's own script: the telemetry attribution Codex and Gemini CLI read.
const TELEMETRY_PROFILE: &str = "/etc/profile.d/halos-telemetry.sh";

fn acme() -> Org {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/acme-corp");
    halo_policy::load::load_dir(&dir).expect("acme-corp loads")
}

/// acme-corp with one Claude Code override changed: a second, different release.
fn acme_v2() -> Org {
    let mut org = acme();
    org.profiles
        .get_mut("engineering")
        .unwrap()
        .harnesses
        .get_mut(&Harness::ClaudeCode)
        .unwrap()
        .overrides
        .insert("cleanupPeriodDays".into(), serde_json::json!(7));
    org
}

fn signer(seed: u8) -> Signer {
    Signer::new(SigningKey::from_bytes(&[seed; 32]))
}

fn quiet(_: &str) {}

/// A user of the canary ring (by group) whom the experiment assigns `variant`.
fn user_in(variant: &str) -> String {
    let org = acme();
    let exp = &org.experiments[EXPERIMENT];
    let weights: Vec<u32> = exp.variants.iter().map(|v| v.weight).collect();
    (0..1000)
        .map(|i| format!("dev{i}@acme.com"))
        .find(|u| {
            halo_policy::assign::variant(&exp.salt, u, &weights)
                .is_some_and(|i| exp.variants[i].name == variant)
        })
        .expect("some user lands in each variant")
}

/// Registry + halo-server + a device directory.
struct World {
    registry: Option<TestRegistry>,
    registry_host: String,
    server: Option<Running>,
    api: String,
    dir: tempfile::TempDir,
    key: Signer,
    seqs: BTreeMap<String, u64>,
}

impl World {
    async fn new() -> World {
        let registry = TestRegistry::start();
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        // The root prefix stands in for `/`, which exists.
        std::fs::create_dir(dir.path().join("root")).unwrap();
        let pair = halo_policy::keys::generate().unwrap();
        std::fs::write(dir.path().join("killswitch.key"), &pair.private_pem).unwrap();
        std::fs::write(dir.path().join("killswitch.pub"), &pair.public_pem).unwrap();
        std::fs::write(dir.path().join("gateway.token"), GATEWAY_TOKEN).unwrap();
        let settings = halo_server::config::Settings {
            listen: "127.0.0.1:0".parse().unwrap(),
            admin_listen: "127.0.0.1:0".parse().unwrap(),
            policy_dir: Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/acme-corp"),
            data_dir: Some(dir.path().join("server-data")),
            killswitch_key_file: Some(dir.path().join("killswitch.key")),
            gateway_token_file: Some(dir.path().join("gateway.token")),
            token_file: None,
            device_ttl: Duration::from_secs(3600),
            enrollment_ttl: Duration::from_secs(3600),
            oidc_ca_file: None,
            max_body_bytes: 64 * 1024,
            xds_listen: None,
            xds_gateway_file: None,
            evidence: Default::default(),
            shadow: Default::default(),
            budget: Default::default(),
            console_url: None,
            controller: Default::default(),
        };
        let server = halo_server::server::start(&settings).await.unwrap();
        let api = format!("http://{}", server.api_addr);
        let key = signer(1);
        write_pub(&dir.path().join("release.pub"), 1);
        World {
            registry_host: registry.host(),
            registry: Some(registry),
            server: Some(server),
            api,
            dir,
            key,
            seqs: BTreeMap::new(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn root(&self) -> PathBuf {
        self.path("root")
    }

    fn reg(&self) -> Registry {
        Registry::connect(
            &format!("{}/acme/halos", self.registry_host),
            RegistryOptions::default(),
        )
        .unwrap()
    }

    async fn publish_with(&mut self, org: &Org, version: &str, key: &Signer) -> RingBuild {
        let build = build_ring(org, "canary").unwrap();
        let report = publish_ring(
            &self.reg(),
            &build,
            version,
            key,
            &self.seqs,
            OffsetDateTime::now_utc(),
            None,
            &quiet,
        )
        .await
        .unwrap();
        // Two publishes in one second still get growing seqs.
        for (tag, seq) in report.pointers {
            self.seqs.insert(tag, seq);
        }
        build
    }

    async fn publish(&mut self, org: &Org, version: &str) -> RingBuild {
        let key = signer(1);
        self.publish_with(org, version, &key).await
    }

    /// Enroll a device for `user` (groups: halos-canary) over HTTP; returns the token file.
    async fn enroll(&self, user: &str) -> PathBuf {
        let devices = &self.server.as_ref().unwrap().fleet.devices;
        let minted = devices
            .mint_enrollment("test", Some(user.into()), vec!["halos-canary".into()])
            .await
            .unwrap();
        let reply: serde_json::Value = reqwest::Client::new()
            .post(format!("{}/api/v1/enroll", self.api))
            .json(&serde_json::json!({"enrollmentToken": minted.token, "host": "dev-1"}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let path = self.path("device.token");
        std::fs::write(&path, reply["deviceToken"].as_str().unwrap()).unwrap();
        path
    }

    /// halod.yaml text for a device of `user`, plus `extra` lines (which may replace
    /// `pubkeys`).
    async fn config_text(&self, user: &str, extra: &str) -> String {
        let token = self.enroll(user).await;
        let pubkeys = if extra.contains("pubkeys:") {
            String::new()
        } else {
            format!("pubkeys: [{}]\n", self.path("release.pub").display())
        };
        format!(
            "org: acme-corp\n\
             registry: {reg}/acme/halos\n\
             ringEndpoint: {api}/api/v1/fleet/ring\n\
             user: {user}\n\
             host: dev-1\n\
             deviceTokenFile: {token}\n\
             reportURL: {api}/api/v1/fleet/report\n\
             root: {root}\n\
             stateDir: {state}\n\
             killSwitch:\n  url: {api}/api/v1/fleet/killswitch\n  pubkeyFile: {kpub}\n  interval: 1s\n\
             {pubkeys}{extra}",
            reg = self.registry_host,
            api = self.api,
            token = token.display(),
            root = self.root().display(),
            state = self.path("state").display(),
            kpub = self.path("killswitch.pub").display(),
        )
    }

    async fn agent(&self, user: &str, extra: &str) -> Agent {
        let text = self.config_text(user, extra).await;
        Agent::new(Config::parse(&text).unwrap(), None).unwrap()
    }

    async fn kill(&self, action: Action) {
        let ks = self.server.as_ref().unwrap().killswitch().cloned().unwrap();
        ks.change(
            "test",
            action,
            Target::Experiment,
            EXPERIMENT,
            "test",
            |_| Ok(()),
        )
        .await
        .unwrap();
    }

    fn read(&self, path: &str) -> Option<String> {
        std::fs::read_to_string(self.root().join(path.trim_start_matches('/'))).ok()
    }

    /// Replace the ring pointer with `pointer` signed by the release key.
    async fn plant_pointer(&self, pointer: halo_release::pointer::Pointer) {
        let p = prepare_pointer(pointer, &self.key).unwrap();
        let reg = self.reg();
        reg.push_blob_if_missing(&p.payload, &halo_release::pack::digest(&p.payload))
            .await
            .unwrap();
        reg.push_manifest(&p.tag, &p.manifest).await.unwrap();
    }

    async fn current_pointer(&self) -> halo_release::pointer::Pointer {
        oci::read_pointer(
            &self.reg(),
            &pointer_tag("canary", None).unwrap(),
            &[self.key.public_key()],
        )
        .await
        .unwrap()
        .unwrap()
    }
}

/// Write the public PEM of test key `seed`.
fn write_pub(path: &Path, seed: u8) {
    let pem = halo_policy::keys::KeyPair::from_signing_key(&SigningKey::from_bytes(&[seed; 32]))
        .unwrap()
        .public_pem;
    std::fs::write(path, pem).unwrap();
}

/// The linux file `path` of `build`'s ring release.
fn ring_file(build: &RingBuild, path: &str) -> String {
    String::from_utf8(build.ring.file(Os::Linux, path).unwrap().to_vec()).unwrap()
}

fn assert_failed(status: &Status, needle: &str) {
    assert_eq!(status.outcome, Outcome::Failed, "{}", status.line());
    let error = status.error.as_deref().unwrap_or_default();
    assert!(
        error.contains(needle),
        "{error:?} should mention {needle:?}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn pointer_attacks_are_refused_and_the_files_stay() {
    let mut w = World::new().await;
    let user = user_in("control");
    let v1 = w.publish(&acme(), "1.0.0").await;
    let mut agent = w.agent(&user, "").await;
    let first = agent.cycle().await;
    assert_eq!(first.outcome, Outcome::Applied, "{}", first.line());
    let old = w.current_pointer().await;
    let v2 = w.publish(&acme_v2(), "2.0.0").await;
    let second = agent.cycle().await;
    assert_eq!(second.outcome, Outcome::Applied, "{}", second.line());
    assert!(w.read(CLAUDE).unwrap().contains("\"cleanupPeriodDays\": 7"));
    let applied = w.current_pointer().await;
    let on_disk = w.read(CLAUDE).unwrap();

    // Replayed older pointer: validly signed, but its seq is below the last applied.
    w.plant_pointer(old.clone()).await;
    assert_failed(&agent.cycle().await, "rollback refused");

    // Expired pointer: a newer seq, issued 8 days ago.
    let stale = new_pointer(
        "acme-corp",
        "canary",
        None,
        &old.digest,
        &old.manifest,
        applied.seq + 10,
        OffsetDateTime::now_utc() - time::Duration::days(8),
    );
    w.plant_pointer(stale).await;
    assert_failed(&agent.cycle().await, "expired");

    // Org mismatch: signed by the org's key, naming another org.
    let mut other = new_pointer(
        "evil-corp",
        "canary",
        None,
        &old.digest,
        &old.manifest,
        applied.seq + 20,
        OffsetDateTime::now_utc(),
    );
    w.plant_pointer(other.clone()).await;
    assert_failed(&agent.cycle().await, "org");

    // Digest mismatch: the pointer names v1's release digest but v2's manifest.
    other.org = "acme-corp".into();
    other.manifest = applied.manifest.clone();
    other.digest = old.digest.clone();
    other.seq = applied.seq + 30;
    assert_ne!(old.digest, applied.digest);
    w.plant_pointer(other).await;
    assert_failed(&agent.cycle().await, "but manifest");

    // Through all of it: v2's files stay, and so does the record of what is applied.
    assert_eq!(w.read(CLAUDE).unwrap(), on_disk);
    let state = State::load(&w.path("state")).unwrap();
    // The device is in the control variant: its channel release is what is applied.
    assert_eq!(state.digest, second.digest);
    assert_ne!(v1.ring.digest, v2.ring.digest);
    assert_eq!(state.marks["ring-canary.pointer"].seq, applied.seq);
    let last = state.last_status.unwrap();
    assert_eq!(last["outcome"], "failed");
}

#[tokio::test(flavor = "current_thread")]
async fn a_revoked_key_and_an_oversized_release_are_refused() {
    let mut w = World::new().await;
    let user = user_in("control");
    // Published with key 2, which the device trusts but lists as revoked.
    let revoked = signer(2);
    w.publish_with(&acme(), "1.0.0", &revoked).await;
    write_pub(&w.path("revoked.pub"), 2);
    let extra = format!(
        "pubkeys: [{}, {}]\nrevokedKeys: [{}]\n",
        w.path("release.pub").display(),
        w.path("revoked.pub").display(),
        revoked.key_id()
    );
    let mut agent = w.agent(&user, &extra).await;
    assert_failed(&agent.cycle().await, "does not verify with any trusted key");
    assert!(!w.root().join("etc").exists(), "nothing written");

    // Not revoked: the same release applies.
    let extra = format!("pubkeys: [{}]\n", w.path("revoked.pub").display());
    let mut trusting = w.agent(&user, &extra).await;
    // The cap: a release larger than maxLayerBytes is refused before download.
    let mut capped = w
        .agent(&user, &format!("{extra}maxLayerBytes: 1024\n"))
        .await;
    assert_failed(&capped.cycle().await, "cap");
    assert!(!w.root().join("etc").exists(), "nothing written");
    assert_eq!(trusting.cycle().await.outcome, Outcome::Applied);
}

#[tokio::test(flavor = "current_thread")]
async fn a_planted_symlink_and_a_world_writable_parent_are_refused_the_rest_applies() {
    let mut w = World::new().await;
    let user = user_in("control");
    let build = w.publish(&acme(), "1.0.0").await;
    let root = w.root();
    let elsewhere = w.path("elsewhere");
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::fs::create_dir_all(&elsewhere).unwrap();
    symlink(&elsewhere, root.join("etc/codex")).unwrap();
    std::fs::create_dir_all(root.join("etc/claude-code")).unwrap();
    std::fs::set_permissions(
        root.join("etc/claude-code"),
        std::fs::Permissions::from_mode(0o777),
    )
    .unwrap();
    let mut agent = w.agent(&user, "").await;
    let status = agent.cycle().await;
    assert_eq!(status.outcome, Outcome::Refused, "{}", status.line());
    assert_eq!(status.outcome.exit_code(), 3);
    let refused: BTreeMap<&str, &str> = status
        .refused
        .iter()
        .map(|p| (p.path.as_str(), p.reason.as_str()))
        .collect();
    assert!(refused[CODEX].contains("symlink"), "{refused:?}");
    assert!(refused[CLAUDE].contains("writable"), "{refused:?}");
    assert_eq!(
        std::fs::read_dir(&elsewhere).unwrap().count(),
        0,
        "nothing written through the link"
    );
    assert!(!root.join("etc/claude-code/managed-settings.json").exists());
    // The rest applied.
    assert_eq!(w.read(GEMINI).unwrap(), ring_file(&build, GEMINI));
    assert!(status.written.contains(&GEMINI.to_string()));
}

#[tokio::test(flavor = "current_thread")]
async fn registry_down_keeps_the_last_release_and_says_why() {
    let mut w = World::new().await;
    let user = user_in("control");
    w.publish(&acme(), "1.0.0").await;
    let mut agent = w.agent(&user, "").await;
    assert_eq!(agent.cycle().await.outcome, Outcome::Applied);
    let before = w.read(CODEX).unwrap();
    drop(w.registry.take());
    let status = agent.cycle().await;
    assert_failed(&status, "cannot reach registry");
    assert_eq!(w.read(CODEX).unwrap(), before);
    let state = State::load(&w.path("state")).unwrap();
    assert!(
        state.last_status.unwrap()["error"]
            .as_str()
            .unwrap()
            .contains("cannot reach registry")
    );
    assert!(
        state.digest.is_some(),
        "the applied release is still recorded"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn halo_server_down_first_run_writes_nothing_later_the_last_ring_is_used() {
    let mut w = World::new().await;
    let user = user_in("control");
    w.publish(&acme(), "1.0.0").await;
    let text = w.config_text(&user, "").await;
    let dead = format!("http://127.0.0.1:{}", halo_testkit::free_port());
    let down = text.replace(&w.api, &dead);
    let mut agent = Agent::new(Config::parse(&down).unwrap(), None).unwrap();
    let status = agent.cycle().await;
    assert_failed(&status, "no last-known ring on the first run");
    assert!(!w.root().join("etc").exists(), "no ring: nothing written");
    assert!(status.kill_error.is_some(), "the kill poll failed too");

    // After one good cycle, the same outage falls back to the last-known ring.
    let mut up = Agent::new(Config::parse(&text).unwrap(), None).unwrap();
    assert_eq!(up.cycle().await.outcome, Outcome::Applied);
    let mut agent = Agent::new(Config::parse(&down).unwrap(), None).unwrap();
    let status = agent.cycle().await;
    assert_eq!(status.outcome, Outcome::Unchanged, "{}", status.line());
    assert_eq!(status.ring_source.as_deref(), Some("last-known"));
    assert_eq!(status.ring.as_deref(), Some("canary"));
}

#[tokio::test(flavor = "current_thread")]
async fn a_killed_experiment_reverts_within_one_kill_poll_and_comes_back_when_unkilled() {
    let mut w = World::new().await;
    let user = user_in("opus-default");
    let build = w.publish(&acme(), "1.0.0").await;
    let cli_token = w.path("cli.token");
    std::fs::write(&cli_token, "cli-receiver-token-7f3\n").unwrap();
    let mut agent = w
        .agent(
            &user,
            &format!("telemetryTokenFile: {}\n", cli_token.display()),
        )
        .await;
    let first = agent.cycle().await;
    assert_eq!(first.outcome, Outcome::Applied, "{}", first.line());
    let a = first.assignment.clone().unwrap();
    assert_eq!(
        (a.experiment.as_str(), a.variant.as_str()),
        (EXPERIMENT, "opus-default")
    );
    let ring = first.ring.clone().unwrap();
    let on_variant = w.read(CLAUDE).unwrap();
    // The harnesses' telemetry names this device's ring, release, variant and unit (the
    // gateway's unit function, the experiment's salt), never the user; the CLI
    // receiver's token is in the OTLP headers of Claude Code and Codex.
    let salt = acme().experiments[EXPERIMENT].salt.clone();
    let unit =
        halo_policy::assign::unit(&halo_policy::assign::unit_salt(Some(&salt), &ring), &user);
    let env = |text: &str, key: &str| -> String {
        let v: serde_json::Value = serde_json::from_str(text).unwrap();
        v["env"][key].as_str().unwrap_or_default().to_string()
    };
    assert_eq!(
        env(&on_variant, "OTEL_RESOURCE_ATTRIBUTES"),
        format!(
            "halo.ring={ring},halo.release={},halo.experiment={EXPERIMENT},halo.variant=opus-default,halo.unit={unit}",
            first.digest.as_deref().unwrap()
        )
    );
    assert_eq!(
        env(&on_variant, "OTEL_EXPORTER_OTLP_HEADERS"),
        "Authorization=Bearer cli-receiver-token-7f3"
    );
    assert!(!on_variant.contains(&user));
    assert!(
        w.read(CODEX)
            .unwrap()
            .contains("authorization = \"Bearer cli-receiver-token-7f3\"")
    );
    let profile = w.read(TELEMETRY_PROFILE).unwrap();
    assert!(profile.contains(&format!("halo.unit={unit}")), "{profile}");
    assert!(!profile.contains("cli-receiver-token"));
    assert!(on_variant.contains("opus"), "{on_variant}");
    // Toggles: deep-reasoning is on for the canary ring.
    assert!(first.toggles.contains(&"deep-reasoning".to_string()));
    assert!(on_variant.contains("\"alwaysThinkingEnabled\": true"));

    // Kill: one kill poll applies the cached ring release, no cycle needed.
    w.kill(Action::Kill).await;
    let status = agent.poll_kill().await.expect("the kill is acted on");
    assert_eq!(status.trigger, "kill-poll");
    assert_eq!(status.outcome, Outcome::Applied, "{}", status.line());
    assert_eq!(status.assignment, None);
    assert_eq!(status.digest.as_deref(), Some(build.ring.digest.as_str()));
    let reverted = w.read(CLAUDE).unwrap();
    assert_ne!(reverted, on_variant);
    assert!(reverted.contains("\"model\": \"sonnet\""), "{reverted}");
    // Off the experiment, the records count for the ring (the ring-salted unit).
    let ring_unit = halo_policy::assign::unit(&halo_policy::assign::unit_salt(None, &ring), &user);
    assert_eq!(
        env(&reverted, "OTEL_RESOURCE_ATTRIBUTES"),
        format!(
            "halo.ring={ring},halo.release={},halo.unit={ring_unit}",
            build.ring.digest
        )
    );
    assert_eq!(w.read(GEMINI).unwrap(), ring_file(&build, GEMINI));
    // A full cycle while killed keeps the device on the ring release.
    let again = agent.cycle().await;
    assert_eq!(again.outcome, Outcome::Unchanged, "{}", again.line());
    assert_eq!(again.assignment, None);

    // Unkill: the next poll runs a full cycle and the variant comes back.
    w.kill(Action::Unkill).await;
    let status = agent.poll_kill().await.expect("the unkill is acted on");
    assert_eq!(status.outcome, Outcome::Applied, "{}", status.line());
    assert_eq!(status.assignment.unwrap().variant, "opus-default");
    assert_eq!(w.read(CLAUDE).unwrap(), on_variant);
    // The held list survives a restart: a new agent restores it from state.json.
    let state = State::load(&w.path("state")).unwrap();
    assert!(state.kill_envelope.is_some());
}

/// The client axis of a rollout end to end (issue #23): acme-corp's harness-upgrade
/// rollout running at step 0 (the canary ring, 5%) is published; a canary device whose
/// user the 5% leaves on control applies control's channel. The advance PR merged (step
/// 1: the canary ring whole) and the ring published again, the same device's next cycle
/// moves it to the `next` variant's channel (the engineering-next profile).
#[tokio::test(flavor = "current_thread")]
async fn a_client_rollouts_advance_moves_a_device_to_the_change_once_republished() {
    const NEXT: &str = "engineering-next-canary";
    let mut w = World::new().await;
    let mut org = acme();
    // The rollout started: its experiment runs. The opus A/B test of the same ring is
    // concluded: halod applies one client experiment per device, the first listed.
    org.experiments.get_mut(EXPERIMENT).unwrap().status = halo_policy::ExperimentStatus::Concluded;
    org.experiments.get_mut(NEXT).unwrap().status = halo_policy::ExperimentStatus::Running;
    let rollout = org.rollouts.get_mut("harness-upgrade").unwrap();
    rollout.status = halo_policy::RolloutStatus::Running;
    rollout.step = 0;
    let salt = org.experiments[NEXT].salt.clone();
    let user = (0..1000)
        .map(|i| format!("dev{i}@acme.com"))
        .find(|u| halo_policy::assign::variant(&salt, u, &[95, 5]) == Some(0))
        .expect("a user the 5% leaves on control");

    let channel = |build: &RingBuild, variant: &str| {
        build
            .channels
            .iter()
            .find(|c| {
                c.manifest
                    .channel
                    .as_ref()
                    .is_some_and(|c| c.experiment == NEXT && c.variant == variant)
            })
            .cloned()
            .expect("the variant's channel")
    };
    let step0 = w.publish(&org, "1.0.0").await;
    let mut agent = w.agent(&user, "").await;
    let first = agent.cycle().await;
    assert_eq!(first.outcome, Outcome::Applied, "{}", first.line());
    let a = first.assignment.clone().expect("assigned");
    assert_eq!(
        (a.experiment.as_str(), a.variant.as_str()),
        (NEXT, "control")
    );
    let control = channel(&step0, "control");
    assert_eq!(first.digest.as_deref(), Some(control.digest.as_str()));

    // The advance PR merged: step 1 takes the canary ring whole; the ring is published.
    org.rollouts.get_mut("harness-upgrade").unwrap().step = 1;
    let step1 = w.publish(&org, "1.0.1").await;
    let second = agent.cycle().await;
    // engineering-next differs from engineering in its harness version pins, which no
    // managed file carries: the files stay, the device's release is the channel's.
    assert!(
        matches!(second.outcome, Outcome::Applied | Outcome::Unchanged),
        "{}",
        second.line()
    );
    assert_eq!(second.assignment.expect("assigned").variant, "next");
    let next = channel(&step1, "next");
    assert_eq!(second.digest.as_deref(), Some(next.digest.as_str()));
    assert_ne!(next.digest, control.digest);
}

#[tokio::test(flavor = "current_thread")]
async fn run_reverts_a_killed_experiment_on_the_kill_poll() {
    let mut w = World::new().await;
    let user = user_in("opus-default");
    w.publish(&acme(), "1.0.0").await;
    // A full cycle only every hour: the revert must come from the 1 s kill poll.
    let mut agent = w.agent(&user, "interval: 1h\n").await;
    let statuses = std::sync::Mutex::new(Vec::<Status>::new());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let emit = |s: &Status| statuses.lock().unwrap().push(s.clone());
    let driver = async {
        let applied = |want: &str| {
            statuses
                .lock()
                .unwrap()
                .iter()
                .any(|s| s.outcome == Outcome::Applied && s.trigger == want)
        };
        wait_async("the first cycle", || applied("cycle")).await;
        w.kill(Action::Kill).await;
        wait_async("the kill-poll revert", || applied("kill-poll")).await;
        let _ = stop_tx.send(());
    };
    tokio::join!(
        agent.run(
            async {
                let _ = stop_rx.await;
            },
            &emit
        ),
        driver
    );
    let statuses = statuses.into_inner().unwrap();
    let revert = statuses.iter().find(|s| s.trigger == "kill-poll").unwrap();
    assert_eq!(revert.assignment, None);
    assert_eq!(
        statuses.iter().filter(|s| s.trigger == "cycle").count(),
        1,
        "no second full cycle was needed"
    );
}

/// Poll `done` every 20 ms for at most 30 s, yielding to the agent in between.
async fn wait_async(what: &str, done: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_power_cut_between_write_and_rename_leaves_the_old_file() {
    let mut w = World::new().await;
    let user = user_in("control");
    w.publish(&acme(), "1.0.0").await;
    let mut agent = w.agent(&user, "").await;
    assert_eq!(agent.cycle().await.outcome, Outcome::Applied);
    let old = w.read(CLAUDE).unwrap();
    w.publish(&acme_v2(), "2.0.0").await;
    // The temp file is written and synced, then the power goes: no rename.
    agent.set_writer(Arc::new(|path: &Path, bytes: &[u8], mode: u32| {
        let tmp = path.with_file_name(format!(
            ".{}.tmp-{}",
            path.file_name().unwrap().to_string_lossy(),
            std::process::id()
        ));
        let mut f = halo_fsutil::create_new(&tmp, mode).map_err(|e| e.to_string())?;
        std::io::Write::write_all(&mut f, bytes).map_err(|e| e.to_string())?;
        f.sync_all().map_err(|e| e.to_string())?;
        Err("power cut before rename".to_string())
    }));
    let status = agent.cycle().await;
    assert_eq!(status.outcome, Outcome::Refused, "{}", status.line());
    assert!(status.failed.iter().any(|f| f.path == CLAUDE));
    assert_eq!(w.read(CLAUDE).unwrap(), old, "the old file is intact");
    // Back on: the next cycle completes the write over the dead temp file.
    agent.set_writer(Arc::new(halod::install::write_atomic));
    let status = agent.cycle().await;
    assert_eq!(status.outcome, Outcome::Applied, "{}", status.line());
    assert!(w.read(CLAUDE).unwrap().contains("\"cleanupPeriodDays\": 7"));
    let leftovers: Vec<_> = std::fs::read_dir(w.root().join("etc/claude-code"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// Done when: `halod once` against acme-corp published to the local registry writes the
/// expected files under the root prefix, and reports to halo-server.
#[tokio::test(flavor = "current_thread")]
async fn halod_once_binary_applies_acme_corp_under_the_root_prefix() {
    let mut w = World::new().await;
    let user = user_in("control");
    let build = w.publish(&acme(), "1.0.0").await;
    let text = w.config_text(&user, "").await;
    let config = w.path("halod.yaml");
    std::fs::write(
        &config,
        text.replace(&format!("root: {}\n", w.root().display()), ""),
    )
    .unwrap();
    let root = w.root();
    let bin = env!("CARGO_BIN_EXE_halod");
    // Blocking process runs on the blocking pool, so the in-process halo-server on this
    // runtime keeps answering.
    let run = |args: &[&str]| {
        let mut cmd = std::process::Command::new(bin);
        cmd.arg("--config").arg(&config).arg("--root").arg(&root);
        cmd.args(args);
        async move {
            tokio::task::spawn_blocking(move || cmd.output())
                .await
                .unwrap()
        }
    };
    let out = run(&["once"]).await.unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8(out.stdout).unwrap();
    assert_eq!(line.lines().count(), 1, "one status line: {line}");
    let status: Status = serde_json::from_str(line.trim()).unwrap();
    assert_eq!(status.outcome, Outcome::Applied);
    assert!(!line.contains(&user), "the status names no user");
    // Every linux file of the control channel's release, toggles merged into settings.
    let channel = build
        .channels
        .iter()
        .find(|c| c.manifest.channel.as_ref().unwrap().variant == "control")
        .unwrap();
    for entry in channel.manifest.files.iter().filter(|f| f.os == Os::Linux) {
        let on_disk = w
            .read(&entry.path)
            .unwrap_or_else(|| panic!("{} missing", entry.path));
        let released = String::from_utf8(channel.blobs[&entry.sha256].clone()).unwrap();
        if entry.path == CLAUDE || entry.path == CODEX {
            assert_ne!(
                on_disk, released,
                "deep-reasoning merged into {}",
                entry.path
            );
        } else {
            assert_eq!(on_disk, released, "{}", entry.path);
        }
        let mode = std::fs::metadata(root.join(entry.path.trim_start_matches('/')))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, entry.mode);
    }
    // And halod's own script with the telemetry attribution (acme-corp's telemetry is
    // on), which names no user.
    let script = w.read(TELEMETRY_PROFILE).expect("the telemetry script");
    assert!(script.contains("halo.unit="), "{script}");
    assert!(!script.contains(&user));
    assert!(
        w.read(CLAUDE)
            .unwrap()
            .contains("\"alwaysThinkingEnabled\": true")
    );
    assert!(
        w.read(CODEX)
            .unwrap()
            .contains("model_reasoning_effort = \"high\"")
    );
    assert!(
        status
            .written
            .contains(&"/etc/profile.d/halos-gemini-cli.sh".to_string())
    );

    // Again: nothing to do, still exit 0; `halod status` shows the state.
    let out = run(&["once"]).await.unwrap();
    assert_eq!(out.status.code(), Some(0));
    let status: Status = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status.outcome, Outcome::Unchanged);
    let out = run(&["status"]).await.unwrap();
    assert_eq!(out.status.code(), Some(0));
    let state: State = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(state.ring.as_deref(), Some("canary"));
    assert_eq!(state.assignment.unwrap().variant, "control");

    // Both reports reached halo-server, for this device.
    let reports = std::fs::read_to_string(w.path("server-data/reports.jsonl")).unwrap();
    assert_eq!(reports.lines().count(), 2, "{reports}");
    assert!(reports.contains("\"device\":\"dev-"));

    // A refused file is exit 3; a failed cycle exit 4.
    std::fs::set_permissions(
        root.join("etc/codex"),
        std::fs::Permissions::from_mode(0o777),
    )
    .unwrap();
    std::fs::write(root.join("etc/codex/managed_config.toml"), "tampered = 1\n").unwrap();
    assert_eq!(run(&["once"]).await.unwrap().status.code(), Some(3));
    drop(w.registry.take());
    assert_eq!(run(&["once"]).await.unwrap().status.code(), Some(4));
}
