//! Native unit tests of the pure modules: configuration decoding, the request pipeline
//! and the kill-list state machine.

use halo_policy::decide::Caller;
use serde_json::{Value, json};

use crate::config::{Config, IdentityMode};
use crate::killstate::{FetchOutcome, KillState};
use crate::pipeline::{self, Head, VerifiedClaims};

pub(crate) fn snapshot(issuer: Option<&str>) -> Value {
    let mut s = json!({
        "schema": 1, "org": "t",
        "protocols": {"claude-code": "anthropic-messages", "codex": "openai-responses", "gemini-cli": "gemini"},
        "upstreams": {"a": {"url": "http://127.0.0.1:1", "kind": "anthropic"},
                      "b": {"url": "http://127.0.0.1:2", "kind": "anthropic"},
                      "g": {"url": "http://127.0.0.1:3", "kind": "gemini"}},
        "models": {"sonnet": [{"upstream": "a", "model": "claude-sonnet"}],
                   "w": [{"upstream": "a", "model": "m-a", "weight": 1}, {"upstream": "b", "model": "m-b", "weight": 1}],
                   "gem": [{"upstream": "g", "model": "gemini-2.5-pro"}]},
        "rings": [{"name": "general", "order": 1, "release": "r1", "membership": {"default": true}}],
        "experiments": [], "toggles": [],
    });
    if let Some(iss) = issuer {
        s["identity"] = json!({"issuer": iss, "audience": "aud"});
    }
    s
}

fn config(settings: Value) -> Result<Config, String> {
    let doc = json!({"snapshot": snapshot(Some("https://idp")), "settings": settings});
    Config::from_bytes(doc.to_string().as_bytes()).map_err(|e| e.to_string())
}

fn kill_pem(seed: u8) -> String {
    let key = ed25519_dalek::SigningKey::from_bytes(&[seed; 32]);
    halo_policy::keys::KeyPair::from_signing_key(&key)
        .expect("pair")
        .public_pem
}

#[test]
fn config_defaults_and_identity_mode_resolution() {
    let c = config(json!({})).expect("defaults");
    assert_eq!(
        c.identity.mode,
        Some(IdentityMode::Jwt),
        "an issuer means jwt"
    );
    assert_eq!(c.max_body_bytes, 32 * 1024 * 1024);
    assert_eq!(c.route_header, "x-halo-route");
    assert_eq!(c.identity.user_claim, "email");
    assert!(!c.forward_auth);
    assert_eq!(c.identity.jwt_metadata_key, "halo_jwt");
    // Istio's RequestAuthentication puts the payload under `payload`.
    let c = config(json!({"identity": {"jwtMetadataKey": "payload"}})).expect("istio key");
    assert_eq!(c.identity.jwt_metadata_key, "payload");

    let doc = json!({"snapshot": snapshot(None), "settings": {}});
    let c = Config::from_bytes(doc.to_string().as_bytes()).expect("no identity");
    assert_eq!(
        c.identity.mode, None,
        "no issuer, no CIDRs, no mode: fail closed at request time"
    );
    let doc = json!({"snapshot": snapshot(None), "settings": {"identity": {"trustedProxyCIDRs": ["10.0.0.0/8"], "identityHeader": "X-User"}}});
    let c = Config::from_bytes(doc.to_string().as_bytes()).expect("cidrs");
    assert_eq!(c.identity.mode, Some(IdentityMode::TrustedHeader));
    assert_eq!(c.identity.identity_header.as_deref(), Some("x-user"));
}

#[test]
fn bad_configurations_are_refused_naming_the_field() {
    let cases = [
        (json!({"bogus": 1}), "bogus"),
        (json!({"identity": {"mode": "magic"}}), "identity.mode"),
        (
            json!({"identity": {"trustedProxyCIDRs": ["nope"]}}),
            "trustedProxyCIDRs[0]",
        ),
        (
            json!({"identity": {"mode": "trusted_header", "trustedProxyCIDRs": ["10.0.0.0/8"]}}),
            "identityHeader",
        ),
        (json!({"maxBodyBytes": 0}), "maxBodyBytes"),
        (
            json!({"identity": {"jwtMetadataKey": ""}}),
            "jwtMetadataKey",
        ),
        (json!({"routeHeader": "x-route"}), "routeHeader"),
        (
            json!({"killSwitch": {"cluster": "k", "url": "http://halo-server.halos:8080/k", "token": "t", "pubkey": kill_pem(1)}}),
            "plain http",
        ),
        (
            json!({"killSwitch": {"cluster": "k", "url": "https://h/k", "token": "", "pubkey": kill_pem(1)}}),
            "token",
        ),
        (
            json!({"killSwitch": {"cluster": "k", "url": "https://h/k", "token": "t", "pubkey": kill_pem(1), "intervalSeconds": 0}}),
            "intervalSeconds",
        ),
        (
            json!({"shadow": {"cluster": "s", "url": "http://halo-server.halos:9445/mirror", "token": "t"}}),
            "shadow.url: plain http",
        ),
        (
            json!({"shadow": {"cluster": "s", "url": "https://h/mirror"}}),
            "shadow.token: the shadow token is required",
        ),
        (
            json!({"shadow": {"cluster": "s", "url": "https://h/mirror", "token": "t", "maxBytes": 0}}),
            "shadow.maxBytes",
        ),
        (
            json!({"shadow": {"cluster": "s", "url": "https://h/mirror", "token": "t", "extra": 1}}),
            "shadow.extra: unknown field",
        ),
    ];
    for (settings, needle) in cases {
        let err = config(settings.clone()).expect_err(&settings.to_string());
        assert!(err.contains(needle), "{settings}: {err}");
    }
    let err = Config::from_bytes(br#"{"snapshot": {"schema": 2}}"#).expect_err("bad snapshot");
    assert!(err.to_string().contains("snapshot"), "{err}");
}

#[test]
fn kill_switch_settings_derive_path_and_authority_and_tolerate_a_bad_key() {
    let ok = config(json!({"killSwitch": {"cluster": "k", "url": "http://halo-server.halos:8080/api/v1/gateway/killswitch",
        "token": "t", "pubkey": kill_pem(1), "allowInsecureInCluster": true}}))
    .expect("in-cluster http allowed");
    let ks = ok.kill_switch.expect("set");
    assert_eq!(ks.authority, "halo-server.halos:8080");
    assert_eq!(ks.path, "/api/v1/gateway/killswitch");
    assert_eq!(ks.interval_secs, 10);
    assert!(ks.key.is_ok());
    let loopback = config(json!({"killSwitch": {"cluster": "k", "url": "http://127.0.0.1:9/k", "token": "t", "pubkey": "junk"}}))
        .expect("loopback http is fine; a bad key is not a refusal");
    assert!(loopback.kill_switch.expect("set").key.is_err());
}

#[test]
fn the_gateway_token_can_come_from_the_vm_environment_and_never_twice() {
    let settings = |ks: Value| {
        json!({"snapshot": snapshot(Some("https://idp")), "settings": {"killSwitch": ks}})
            .to_string()
    };
    let base = json!({"cluster": "k", "url": "https://h/k", "pubkey": kill_pem(1), "tokenEnv": "HALO_GATEWAY_TOKEN"});
    let env = |name: &str| (name == "HALO_GATEWAY_TOKEN").then(|| "from-env".to_string());
    let cfg = Config::from_bytes_with_env(settings(base.clone()).as_bytes(), &env).expect("env");
    assert_eq!(cfg.kill_switch.expect("set").token, "from-env");
    let err = Config::from_bytes(settings(base.clone()).as_bytes()).expect_err("unset");
    assert!(
        err.to_string()
            .contains("settings.killSwitch.tokenEnv: HALO_GATEWAY_TOKEN is not set"),
        "{err}"
    );
    let mut both = base;
    both["token"] = json!("inline");
    let err = Config::from_bytes_with_env(settings(both).as_bytes(), &env).expect_err("both");
    assert!(err.to_string().contains("not both"), "{err}");
    // WASI's block: NUL-terminated NAME=value entries.
    let block = b"A=1\0HALO_GATEWAY_TOKEN=t=x\0";
    assert_eq!(
        crate::config::env_entry(block, "HALO_GATEWAY_TOKEN").as_deref(),
        Some("t=x")
    );
    assert_eq!(crate::config::env_entry(block, "B"), None);
}

fn head<'a>(headers: &'a [(String, String)], claims: Option<VerifiedClaims>) -> Head<'a> {
    Head {
        method: "POST",
        path: "/v1/messages",
        headers,
        peer: "127.0.0.1".parse().ok(),
        claims,
        content_length: None,
    }
}

fn claims(user: &str) -> Option<VerifiedClaims> {
    Some(VerifiedClaims {
        user: Some(user.into()),
        email_verified: Some(true),
        groups: vec![],
    })
}

#[test]
fn pipeline_identity_rules() {
    let cfg = config(json!({})).expect("cfg");
    let none: Vec<(String, String)> = vec![];
    let p = pipeline::on_head(&cfg, &head(&none, claims("u@x"))).expect("verified");
    assert!(matches!(p.caller, Caller::Verified(ref s) if s.user == "u@x"));
    let r = pipeline::on_head(&cfg, &head(&none, None)).expect_err("no token");
    assert_eq!(r.status, 401);
    assert!(
        r.headers
            .iter()
            .any(|(n, v)| n == "www-authenticate" && v == "Bearer realm=\"halos\"")
    );
    let mut unverified = claims("u@x");
    if let Some(c) = unverified.as_mut() {
        c.email_verified = None;
    }
    assert_eq!(
        pipeline::on_head(&cfg, &head(&none, unverified.clone()))
            .expect_err("unverified")
            .status,
        401
    );
    let trusting = config(json!({"identity": {"trustUnverifiedEmail": true}})).expect("cfg");
    assert!(pipeline::on_head(&trusting, &head(&none, unverified)).is_ok());
    let folded = vec![("authorization".to_string(), "Bearer a,Bearer b".to_string())];
    assert_eq!(
        pipeline::on_head(&cfg, &head(&folded, claims("u@x")))
            .expect_err("dup")
            .status,
        400
    );
    let mut big = head(&none, claims("u@x"));
    big.content_length = Some(cfg.max_body_bytes + 1);
    assert_eq!(pipeline::on_head(&cfg, &big).expect_err("413").status, 413);
}

#[test]
fn pipeline_trusted_header_honoured_only_from_trusted_peers() {
    let doc = json!({"snapshot": snapshot(None), "settings": {"identity": {
        "identityHeader": "x-user", "groupsHeader": "x-groups", "trustedProxyCIDRs": ["10.0.0.0/8"]}}});
    let cfg = Config::from_bytes(doc.to_string().as_bytes()).expect("cfg");
    let hs = vec![
        ("x-user".to_string(), "bob".to_string()),
        ("x-groups".to_string(), "a, b".to_string()),
    ];
    let mut h = head(&hs, None);
    h.peer = "10.1.2.3".parse().ok();
    let p = pipeline::on_head(&cfg, &h).expect("trusted");
    assert!(
        matches!(p.caller, Caller::Verified(ref s) if s.user == "bob" && s.groups == ["a", "b"])
    );
    h.peer = "192.168.1.1".parse().ok();
    assert_eq!(
        pipeline::on_head(&cfg, &h).expect_err("untrusted").status,
        401
    );
}

#[test]
fn pipeline_body_routes_rewrites_and_stamps() {
    let cfg = config(json!({})).expect("cfg");
    let none: Vec<(String, String)> = vec![];
    let pending = pipeline::on_head(&cfg, &head(&none, claims("u@x"))).expect("ok");
    let f = pipeline::on_body(
        &cfg,
        &cfg.snapshot,
        &pending,
        br#"{"model":"sonnet","x":1}"#,
        None,
        0,
        &mut |_| true,
    )
    .expect("routed");
    assert_eq!(f.cluster, "sonnet-0");
    let sent = br#"{"model":"sonnet","x":1}"#;
    let edit = f.body.as_ref().expect("the model is rewritten in the body");
    assert_eq!(edit.apply(sent), br#"{"model":"claude-sonnet","x":1}"#);
    // Only the head up to the model changes hands.
    assert_eq!(edit.drop, br#"{"model":"sonnet""#.len());
    assert!(!edit.keeps(sent));
    // The same model written again keeps the body (the native build then writes nothing).
    let same = pipeline::PrefixEdit::model(sent, 9, 17, "sonnet");
    assert!(same.keeps(sent));
    assert!(
        !same.keeps(&sent[..5]),
        "a body shorter than the edit's head"
    );
    assert!(f.stamps.contains(&("x-halo-ring".into(), "general".into())));
    assert!(f.stamps.contains(&("x-halo-release".into(), "r1".into())));
    assert!(
        f.stamps
            .contains(&("x-halo-route".into(), "sonnet-0".into()))
    );
    // Scanned while it arrived (the glue's way): the same forward.
    let mut scan = halo_policy::body_scan::Incremental::new();
    for n in [1, 9, 12, sent.len()] {
        scan.feed(&sent[..n]).expect("a valid prefix");
    }
    let scanned = pipeline::on_body(
        &cfg,
        &cfg.snapshot,
        &pending,
        sent,
        Some(scan.finish(sent)),
        0,
        &mut |_| true,
    )
    .expect("routed");
    assert_eq!(scanned, f);
    // A body whose scan failed on the way is admit's 400, naming the problem.
    let bad = br#"{"model":"sonnet",}"#;
    let mut scan = halo_policy::body_scan::Incremental::new();
    let early = scan.feed(bad);
    assert!(
        early.is_err(),
        "refused as soon as the comma is followed by a brace"
    );
    let r = pipeline::on_body(
        &cfg,
        &cfg.snapshot,
        &pending,
        bad,
        Some(scan.finish(bad)),
        0,
        &mut |_| true,
    )
    .expect_err("invalid JSON");
    assert_eq!(r.status, 400);
    assert!(String::from_utf8_lossy(&r.body).contains("not valid JSON"));

    let r = pipeline::on_body(
        &cfg,
        &cfg.snapshot,
        &pending,
        br#"{"model":"gpt-4"}"#,
        None,
        0,
        &mut |_| true,
    )
    .expect_err("unknown");
    assert_eq!(r.status, 400);

    let mut gem = pending.clone();
    gem.path = "/v1beta/models/gem:generateContent?key=tok&alt=sse".into();
    let f = pipeline::on_body(&cfg, &cfg.snapshot, &gem, b"{}", None, 0, &mut |_| true)
        .expect("gemini");
    assert_eq!(
        f.path.as_deref(),
        Some("/v1beta/models/gemini-2.5-pro:generateContent?alt=sse")
    );
    assert_eq!(f.body, None);
    assert_eq!(f.cluster, "gem-0");
}

#[test]
fn path_model_rewrite_encodes_the_target() {
    use halo_policy::types::WireProtocol;
    assert_eq!(
        pipeline::rewrite_path_model(
            "/model/sonnet/invoke",
            WireProtocol::BedrockInvoke,
            "arn:aws:x/y"
        ),
        "/model/arn%3Aaws%3Ax%2Fy/invoke"
    );
}

#[test]
fn hygiene_removes_halo_identity_and_credentials_unless_forward_auth() {
    let doc = json!({"snapshot": snapshot(None), "settings": {"identity": {
        "identityHeader": "x-user", "trustedProxyCIDRs": ["10.0.0.0/8"]}}});
    let cfg = Config::from_bytes(doc.to_string().as_bytes()).expect("cfg");
    let hs: Vec<(String, String)> = [
        "x-halo-ring",
        "X-User",
        "authorization",
        "x-api-key",
        "api-key",
        "x-goog-api-key",
        "proxy-authorization",
        "accept",
    ]
    .iter()
    .map(|n| (n.to_string(), "v".to_string()))
    .collect();
    let r = crate::hygiene::removals(&cfg, &hs);
    assert_eq!(
        r,
        [
            "x-halo-ring",
            "x-user",
            "authorization",
            "x-api-key",
            "api-key",
            "x-goog-api-key",
            "proxy-authorization",
            "x-halo-route"
        ]
    );
    let doc = json!({"snapshot": snapshot(None), "settings": {"forwardAuth": true, "identity": {"mode": "none"}}});
    let cfg = Config::from_bytes(doc.to_string().as_bytes()).expect("cfg");
    assert_eq!(
        crate::hygiene::removals(&cfg, &hs),
        ["x-halo-ring", "x-halo-route"]
    );
}

fn envelope(key: &ed25519_dalek::SigningKey, experiments: &[&str], issued: i64) -> Vec<u8> {
    let payload = halo_policy::killswitch::KillPayload {
        version: 1,
        experiments: experiments.iter().map(|s| s.to_string()).collect(),
        toggles: Default::default(),
        issued_at: time::OffsetDateTime::from_unix_timestamp(issued).expect("time"),
    };
    halo_policy::killswitch::sign(&payload, key).expect("sign")
}

#[test]
fn kill_state_machine() {
    let signer = ed25519_dalek::SigningKey::from_bytes(&[9; 32]);
    let key = halo_policy::keys::public_key_from_pem(&kill_pem(9)).expect("key");
    let now = 1_800_000_000;
    let mut st = KillState::new();
    assert_eq!(
        st.on_fetch(Some(503), b"", &key, now),
        FetchOutcome::HttpError
    );
    assert_eq!(st.on_fetch(None, b"", &key, now), FetchOutcome::HttpError);
    assert!(st.held().is_none(), "never fetched kills nothing");
    let e1 = envelope(&signer, &["x"], now - 5);
    assert_eq!(
        st.on_fetch(Some(200), &e1, &key, now),
        FetchOutcome::Accepted
    );
    assert_eq!(
        st.on_fetch(Some(200), &e1, &key, now),
        FetchOutcome::Unchanged
    );
    assert_eq!(
        st.on_fetch(Some(200), &envelope(&signer, &[], now - 700), &key, now),
        FetchOutcome::Stale
    );
    assert_eq!(
        st.on_fetch(Some(200), &envelope(&signer, &[], now + 120), &key, now),
        FetchOutcome::Future
    );
    assert_eq!(
        st.on_fetch(Some(200), &envelope(&signer, &[], now - 10), &key, now),
        FetchOutcome::Replayed
    );
    let foreign = ed25519_dalek::SigningKey::from_bytes(&[8; 32]);
    assert_eq!(
        st.on_fetch(Some(200), &envelope(&foreign, &[], now), &key, now),
        FetchOutcome::BadSignature
    );
    assert_eq!(
        st.on_fetch(Some(200), b"{}", &key, now),
        FetchOutcome::Malformed
    );
    assert!(
        st.held().is_some_and(|l| l.is_experiment_killed("x")),
        "failures keep the list"
    );

    // Adoption from another worker: newer only.
    let mut other = KillState::new();
    assert!(other.adopt(&e1, &key));
    assert!(!other.adopt(&e1, &key));
    assert!(
        !other.adopt(&envelope(&signer, &[], now - 100), &key),
        "older is not adopted"
    );
    assert!(
        !other.adopt(&envelope(&foreign, &[], now), &key),
        "unsigned is not adopted"
    );
    assert!(other.adopt(&envelope(&signer, &[], now), &key));
}

#[test]
fn a_pushed_kill_list_needs_the_kill_switch_key_and_is_kept_as_bytes() {
    let doc = json!({"snapshot": snapshot(Some("https://idp")), "settings": {}, "killList": "{}"});
    let err = Config::from_bytes(doc.to_string().as_bytes()).expect_err("no key to verify it");
    assert!(err.to_string().contains("killList"), "{err}");
    let doc = json!({"snapshot": snapshot(Some("https://idp")), "killList": "{\"x\":1}",
        "settings": {"killSwitch": {"cluster": "k", "url": "http://127.0.0.1:9/k", "token": "t", "pubkey": kill_pem(1)}}});
    let c = Config::from_bytes(doc.to_string().as_bytes()).expect("accepted");
    assert_eq!(c.kill_list.as_deref(), Some(&br#"{"x":1}"#[..]));
}

#[test]
fn start_warnings_name_an_unusable_kill_key_and_a_missing_identity() {
    let fine = config(json!({})).expect("config");
    assert!(fine.start_warnings().is_empty());
    let junk_key = config(
        json!({"killSwitch": {"cluster": "k", "url": "http://127.0.0.1:9/k",
        "token": "t", "pubkey": "junk"}}),
    )
    .expect("an unusable key is accepted");
    let w = junk_key.start_warnings();
    assert_eq!(w.len(), 1);
    assert!(w[0].contains("x-halo-killswitch: misconfigured"), "{w:?}");
    let doc = json!({"snapshot": snapshot(None), "settings": {}});
    let no_identity = Config::from_bytes(doc.to_string().as_bytes()).expect("config");
    assert!(
        no_identity
            .start_warnings()
            .iter()
            .any(|w| w.contains("every request is answered 503"))
    );
}

#[test]
fn a_stamped_header_sent_once_is_not_removed_first_but_a_repeated_one_is() {
    let h = |n: &str, v: &str| (n.to_string(), v.to_string());
    let removals = vec!["x-halo-ring".to_string(), "x-halo-user".to_string()];
    let stamps = vec![h("x-halo-ring", "general")];
    let once = vec![h("x-halo-ring", "canary"), h("x-halo-user", "a")];
    assert_eq!(
        crate::hygiene::to_remove(&removals, &once, &stamps).collect::<Vec<_>>(),
        ["x-halo-user"]
    );
    let twice = vec![h("x-halo-ring", "a"), h("x-halo-ring", "b")];
    assert_eq!(
        crate::hygiene::to_remove(&removals, &twice, &stamps).collect::<Vec<_>>(),
        ["x-halo-ring", "x-halo-user"]
    );
}

#[test]
fn a_translation_drop_cause_is_reported_once() {
    assert!(crate::attempt::first_report_of("test-only cause"));
    assert!(!crate::attempt::first_report_of("test-only cause"));
}

#[test]
fn nothing_pushed_starts_with_no_list_and_no_outcome() {
    let c = config(json!({})).expect("config");
    let (kill, outcome) = crate::killstate::KillState::at_start(&c, 0);
    assert!(kill.held().is_none());
    assert_eq!(outcome, None);
}

#[test]
fn test_panic_is_a_named_hook_or_refused() {
    assert_eq!(config(json!({})).expect("cfg").test_panic, None);
    let c = config(json!({"testPanic": "requestBody"})).expect("cfg");
    assert_eq!(c.test_panic, Some(crate::config::TestPanic::RequestBody));
    let err = config(json!({"testPanic": "everywhere"})).expect_err("unknown hook");
    assert!(err.contains("testPanic"), "{err}");
}

#[test]
fn breaker_settings_default_to_the_spec_and_are_decoded_strictly() {
    let c = config(json!({})).expect("defaults");
    assert_eq!(
        (c.breaker.consecutive_failures, c.breaker.open_seconds),
        (5, 30)
    );
    let c = config(json!({"breaker": {"openSeconds": 2}})).expect("partial");
    assert_eq!(
        (c.breaker.consecutive_failures, c.breaker.open_seconds),
        (5, 2)
    );
    let e = config(json!({"breaker": {"openSecs": 2}})).expect_err("a misspelt key");
    assert!(
        e.contains("settings.breaker") && e.contains("openSecs"),
        "{e}"
    );
    let e = config(json!({"breaker": {"consecutiveFailures": 0}})).expect_err("zero");
    assert!(e.contains("settings.breaker"), "{e}");
}
