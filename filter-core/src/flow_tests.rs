//! The flows end to end against a fake Envoy ([`crate::fake`]), for what the live suites
//! check in a real one: each refusal and its JSON body, each identity mode, the kill
//! states, the attempt plan per provider kind and wire, header hygiene, bodies in
//! pieces. Each runs against both kinds of host (piecewise as the native build,
//! buffering as the wasm build) where the body matters.

use halo_policy::cluster_names::EndpointFacts;
use serde_json::{Value, json};

use crate::config::Config;
use crate::fake::{self, FakeEnvoy, Run, TestPolicy};
use crate::host::Next;
use crate::pipeline::VerifiedClaims;

const NOW: i64 = 1_800_000_000;

/// The unit tests' snapshot with a canary on `sonnet` (half its users to upstream b).
fn snapshot(identity: bool) -> Value {
    let mut s = crate::tests::snapshot(identity.then_some("https://idp"));
    s["experiments"] = json!([
        {"name": "sonnet-canary", "type": "canary", "axis": "traffic", "status": "running",
         "rings": ["general"], "salt": "s1",
         "variants": [{"name": "control", "weight": 50},
                      {"name": "canary", "weight": 50,
                       "routes": {"sonnet": [{"upstream": "b", "model": "sonnet-canary-model"}]}}]},
    ]);
    s
}

fn policy_with(identity: bool, settings: Value, extra: Value) -> TestPolicy {
    let mut doc = json!({"snapshot": snapshot(identity), "settings": settings});
    if let (Some(d), Some(e)) = (doc.as_object_mut(), extra.as_object()) {
        d.extend(e.clone());
    }
    let cfg = Config::from_bytes(doc.to_string().as_bytes()).expect("config");
    TestPolicy::new(cfg, NOW)
}

fn policy(settings: Value) -> TestPolicy {
    policy_with(true, settings, json!({}))
}

fn claims(user: &str) -> Option<VerifiedClaims> {
    Some(VerifiedClaims {
        user: Some(user.into()),
        email_verified: Some(true),
        groups: vec![],
    })
}

/// A user the canary experiment puts in the variant numbered `variant`.
fn user_in(p: &TestPolicy, variant: usize) -> String {
    let e = p
        .cfg
        .snapshot
        .experiment("sonnet-canary")
        .expect("experiment");
    (0..10_000)
        .map(|i| format!("u{i}@acme.test"))
        .find(|u| halo_policy::decide::assigned_variant(e, u) == Some(variant))
        .expect("a user")
}

fn messages(model: &str, filler: usize) -> Vec<u8> {
    json!({"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "x".repeat(filler)}]})
        .to_string()
        .into_bytes()
}

/// A Claude Code request from `user` (verified) with `body`, its length announced.
fn post<const P: bool>(user: Option<&str>, body: &[u8], extra: &[(&str, &str)]) -> FakeEnvoy<P> {
    let length = body.len().to_string();
    let mut h = vec![
        (":method", "POST"),
        (":path", "/v1/messages"),
        (":authority", "gw"),
        ("authorization", "Bearer tok"),
        ("content-type", "application/json"),
        ("content-length", length.as_str()),
    ];
    h.extend_from_slice(extra);
    let mut e = FakeEnvoy::with_headers(&h);
    e.claims = user.and_then(claims);
    e.peer = Some("127.0.0.1:5555".into());
    e
}

fn pieces(body: &[u8], size: usize) -> Vec<&[u8]> {
    body.chunks(size).collect()
}

fn routed<const P: bool>(p: &TestPolicy, user: &str, body: &[u8], piece: usize) -> Run<P> {
    fake::request(
        p,
        post::<P>(Some(user), body, &[]),
        &pieces(body, piece),
        200,
    )
}

fn routed_rewritten_stamped_and_counted<const P: bool>() {
    let p = policy(json!({}));
    let user = user_in(&p, 0);
    let body = messages("sonnet", 10);
    let r = routed::<P>(&p, &user, &body, 7);
    let e = &r.envoy;
    assert_eq!(
        r.answers.first(),
        Some(&Next::Stop),
        "the headers wait for the body"
    );
    assert_eq!(r.answers.last(), Some(&Next::Continue));
    let between = &r.answers[1..r.answers.len() - 1];
    assert!(
        between.iter().all(|a| *a == Next::Buffer),
        "{:?}",
        r.answers
    );
    let expected = String::from_utf8(body.clone()).expect("utf8").replacen(
        "\"sonnet\"",
        "\"claude-sonnet\"",
        1,
    );
    assert_eq!(String::from_utf8_lossy(&e.body), expected);
    assert_eq!(
        e.header("content-length"),
        Some(expected.len().to_string().as_str())
    );
    assert_eq!(e.header("x-halo-route"), Some("sonnet-0"));
    assert_eq!(e.header("x-halo-ring"), Some("general"));
    assert_eq!(e.header("x-halo-release"), Some("r1"));
    assert_eq!(e.header("x-halo-experiment"), Some("sonnet-canary"));
    assert_eq!(e.header("x-halo-variant"), Some("control"));
    assert_eq!(
        e.header("authorization"),
        None,
        "the caller's token never goes upstream"
    );
    assert_eq!(
        e.route_refreshes, 1,
        "the route is picked again for the stamped cluster"
    );
    assert!(e.note.is_some(), "the attempt note is left for the stage");
    assert_eq!(
        e.rec
            .count_of("halo.decisions.ring.general.variant.control.source.gateway"),
        1,
        "{:?}",
        e.rec.counts
    );
    assert_eq!(
        e.rec
            .count_of("halo.requests.ring.general.variant.control.status.200"),
        1
    );
}

#[test]
fn a_verified_caller_is_routed_rewritten_stamped_and_counted() {
    routed_rewritten_stamped_and_counted::<true>();
    routed_rewritten_stamped_and_counted::<false>();
}

fn identity_refusals<const P: bool>() {
    let p = policy(json!({}));
    let body = messages("sonnet", 1);
    let check = |user: Option<VerifiedClaims>, extra: &[(&str, &str)]| {
        let mut e = post::<P>(None, &body, extra);
        e.claims = user;
        fake::request(&p, e, &[&body], 0).envoy
    };
    // No token jwt_authn verified: 401, with the challenge.
    let e = check(None, &[]);
    let sent = e.sent.as_ref().expect("answered");
    assert_eq!(sent.status, 401);
    assert_eq!(sent.error_type(), "authentication_error");
    assert!(
        sent.headers
            .contains(&("www-authenticate".into(), "Bearer realm=\"halos\"".into()))
    );
    assert!(
        sent.headers
            .contains(&("content-type".into(), "application/json".into()))
    );
    assert_eq!(e.rec.count_of("halo.auth_failures"), 1);
    assert_eq!(
        e.rec
            .count_of("halo.requests.ring.unknown.variant.none.status.401"),
        1
    );
    // An unverified email.
    let mut unverified = claims("u@x");
    if let Some(c) = unverified.as_mut() {
        c.email_verified = Some(false);
    }
    assert_eq!(check(unverified, &[]).sent.map(|s| s.status), Some(401));
    // Two credentials: 400, counted as an identity refusal too.
    let e = check(
        claims("u@x"),
        &[("x-goog-api-key", "a"), ("x-goog-api-key", "b")],
    );
    let sent = e.sent.as_ref().expect("answered");
    assert_eq!(sent.status, 400);
    assert_eq!(sent.json()["type"], "error");
    assert_eq!(e.rec.count_of("halo.auth_failures"), 1);
}

#[test]
fn identity_refusals_are_json_bodies_and_counted() {
    identity_refusals::<true>();
    identity_refusals::<false>();
    // No identity configuration at all: 503, and the start warning says why.
    let p = policy_with(false, json!({}), json!({}));
    assert!(
        p.rec
            .logs
            .borrow()
            .iter()
            .any(|(_, m)| m.contains("no identity configuration"))
    );
    let r = fake::request(&p, post::<true>(Some("u@x"), b"{}", &[]), &[b"{}"], 0);
    let sent = r.envoy.sent.expect("answered");
    assert_eq!(sent.status, 503);
    assert_eq!(sent.error_type(), "policy_unavailable");
}

#[test]
fn trusted_header_identity_is_honoured_only_from_trusted_peers() {
    let p = policy_with(
        false,
        json!({"identity": {"identityHeader": "x-user", "trustedProxyCIDRs": ["10.0.0.0/8"]}}),
        json!({}),
    );
    let body = messages("sonnet", 1);
    let run = |peer: &str, extra: &[(&str, &str)]| {
        let mut e = post::<true>(None, &body, extra);
        e.peer = Some(peer.into());
        fake::request(&p, e, &[&body], 200)
    };
    let r = run("10.1.2.3:40000", &[("x-user", "bob")]);
    assert!(r.envoy.sent.is_none(), "trusted: {:?}", r.envoy.sent);
    assert_eq!(
        r.envoy.header("x-user"),
        None,
        "the identity header never goes upstream"
    );
    assert!(r.envoy.header("x-halo-route").is_some(), "routed");
    let r = run("192.168.1.1:40000", &[("x-user", "bob")]);
    assert_eq!(r.envoy.sent.map(|s| s.status), Some(401));
    let r = run("10.1.2.3:40000", &[("x-user", "bob"), ("x-user", "eve")]);
    let sent = r.envoy.sent.expect("answered");
    assert_eq!(sent.status, 400);
    assert!(String::from_utf8_lossy(&sent.body).contains("x-user"));
    // The peer is read only in this mode.
    let jwt = policy(json!({}));
    let mut e = post::<true>(Some("u@x"), &body, &[]);
    e.peer = None;
    assert!(fake::request(&jwt, e, &[&body], 200).envoy.sent.is_none());
}

fn request_refusals<const P: bool>() {
    let p = policy(json!({"maxBodyBytes": 1000}));
    let send = |body: &[u8], piece: usize, extra: &[(&str, &str)]| {
        fake::request(
            &p,
            post::<P>(Some("u@x"), body, extra),
            &pieces(body, piece),
            0,
        )
    };
    // An unknown model.
    let r = send(&messages("gpt-4", 1), 10, &[]);
    assert_eq!(r.envoy.sent.as_ref().map(|s| s.status), Some(400));
    assert_eq!(r.envoy.header("x-halo-route"), None);
    // Larger than maxBodyBytes, announced: refused with the headers.
    let big = messages("sonnet", 2000);
    let r = send(&big, 100, &[]);
    let sent = r.envoy.sent.as_ref().expect("answered");
    assert_eq!(sent.status, 413);
    assert_eq!(sent.error_type(), "request_too_large");
    assert_eq!(r.answers, [Next::Stop], "refused before the body");
    // Larger than announced (a chunked client): refused at the piece past the bound.
    let mut chunked = post::<P>(Some("u@x"), &big, &[]);
    chunked.set_header("content-length", None);
    let r = fake::request(&p, chunked, &pieces(&big, 100), 0);
    assert_eq!(r.envoy.sent.map(|s| s.status), Some(413));
    assert_eq!(
        r.answers.len(),
        12,
        "refused at the piece that crossed the bound"
    );
    // Invalid JSON early: refused before the rest arrives.
    let mut bad = br#"{"model":"sonnet",}"#.to_vec();
    bad.extend(std::iter::repeat_n(b' ', 500));
    let r = send(&bad, 30, &[]);
    let sent = r.envoy.sent.as_ref().expect("answered");
    assert_eq!(sent.status, 400);
    assert!(String::from_utf8_lossy(&sent.body).contains("not valid JSON"));
    assert_eq!(r.answers.len(), 2, "refused at the first piece");
}

#[test]
fn request_refusals_name_the_problem_before_any_upstream() {
    request_refusals::<true>();
    request_refusals::<false>();
}

#[test]
fn hygiene_strips_credentials_and_spoofed_halo_headers_unless_forward_auth() {
    let body = messages("sonnet", 1);
    let spoofed = [
        ("x-api-key", "client-key"),
        ("x-halo-ring", "canary"),
        ("x-halo-route", "evil-cluster"),
        ("x-halo-whatever", "x"),
    ];
    let p = policy(json!({}));
    let user = user_in(&p, 0);
    let r = fake::request(
        &p,
        post::<true>(Some(&user), &body, &spoofed),
        &[&body],
        200,
    );
    let e = &r.envoy;
    assert_eq!(e.header("x-api-key"), None);
    assert_eq!(e.header("authorization"), None);
    assert_eq!(e.header("x-halo-whatever"), None);
    assert_eq!(
        e.header("x-halo-ring"),
        Some("general"),
        "the filter's stamp, not the client's"
    );
    assert_eq!(e.header("x-halo-route"), Some("sonnet-0"));
    let copies = e.request.iter().filter(|(n, _)| n == "x-halo-ring").count();
    assert_eq!(copies, 1);
    let p = policy(json!({"forwardAuth": true}));
    let r = fake::request(
        &p,
        post::<false>(Some(&user), &body, &spoofed),
        &[&body],
        200,
    );
    assert_eq!(r.envoy.header("x-api-key"), Some("client-key"));
    assert_eq!(r.envoy.header("authorization"), Some("Bearer tok"));
    assert_eq!(r.envoy.header("x-halo-whatever"), None);
}

#[test]
fn a_long_body_in_pieces_is_forwarded_with_only_the_model_changed() {
    let p = policy(json!({}));
    let user = user_in(&p, 0);
    let body = messages("sonnet", 300_000);
    let expected = String::from_utf8(body.clone())
        .expect("utf8")
        .replacen("\"sonnet\"", "\"claude-sonnet\"", 1)
        .into_bytes();
    // Piecewise: the edit is written while the model is in the first piece, once.
    let r = routed::<true>(&p, &user, &body, 16 * 1024);
    assert_eq!(r.envoy.body, expected);
    assert_eq!(r.envoy.edits, 1);
    assert_eq!(
        r.envoy.header("content-length"),
        Some(expected.len().to_string().as_str())
    );
    // Buffering: the edit at the end.
    let r = routed::<false>(&p, &user, &body, 16 * 1024);
    assert_eq!(r.envoy.body, expected);
    assert_eq!(r.envoy.edits, 1);
    // A chunked body (no length): the same body, sent chunked.
    let mut e = post::<true>(Some(&user), &body, &[]);
    e.set_header("content-length", None);
    let r = fake::request(&p, e, &pieces(&body, 16 * 1024), 200);
    assert_eq!(r.envoy.body, expected);
    assert_eq!(r.envoy.header("content-length"), None);
}

/// A kill list signed by `key` killing `experiments`, issued `age` seconds before NOW.
fn envelope(key: &ed25519_dalek::SigningKey, experiments: &[&str], age: i64) -> Vec<u8> {
    let payload = halo_policy::killswitch::KillPayload {
        version: 1,
        experiments: experiments.iter().map(|s| s.to_string()).collect(),
        toggles: Default::default(),
        issued_at: time::OffsetDateTime::from_unix_timestamp(NOW - age).expect("time"),
    };
    halo_policy::killswitch::sign(&payload, key).expect("sign")
}

fn kill_settings(seed: u8) -> Value {
    let key = ed25519_dalek::SigningKey::from_bytes(&[seed; 32]);
    let pem = halo_policy::keys::KeyPair::from_signing_key(&key)
        .expect("pair")
        .public_pem;
    json!({"killSwitch": {"cluster": "k", "url": "http://127.0.0.1:9/k", "token": "t", "pubkey": pem}})
}

#[test]
fn the_kill_list_in_force_routes_a_killed_experiment_to_its_control() {
    let signer = ed25519_dalek::SigningKey::from_bytes(&[7; 32]);
    let body = messages("sonnet", 1);
    // Nothing killed: the canary user gets the canary's target.
    let mut p = policy(kill_settings(7));
    let canary = user_in(&p, 1);
    let r = routed::<true>(&p, &canary, &body, 100);
    assert_eq!(r.envoy.header("x-halo-variant"), Some("canary"));
    assert!(String::from_utf8_lossy(&r.envoy.body).contains("sonnet-canary-model"));
    // A poll accepts a list killing it: the next request goes to control.
    let killed = envelope(&signer, &["sonnet-canary"], 5);
    assert!(
        p.enforced
            .on_poll_answer(&p.cfg, Some(200), &killed, NOW, &p.rec)
    );
    assert_eq!(p.rec.count_of("halo.killswitch_fetch.outcome.accepted"), 1);
    let r = routed::<true>(&p, &canary, &body, 100);
    assert_ne!(r.envoy.header("x-halo-variant"), Some("canary"));
    assert!(String::from_utf8_lossy(&r.envoy.body).contains("\"claude-sonnet\""));
    // Refused lists keep it killed: stale, replayed, foreign, the server down.
    let foreign = ed25519_dalek::SigningKey::from_bytes(&[8; 32]);
    for (status, list, outcome) in [
        (Some(200), envelope(&signer, &[], 700), "stale"),
        (Some(200), envelope(&signer, &[], 10), "replayed"),
        (Some(200), envelope(&foreign, &[], 0), "bad_signature"),
        (None, Vec::new(), "http_error"),
    ] {
        assert!(
            !p.enforced
                .on_poll_answer(&p.cfg, status, &list, NOW, &p.rec)
        );
        assert_eq!(
            p.rec
                .count_of(&format!("halo.killswitch_fetch.outcome.{outcome}")),
            1
        );
    }
    let r = routed::<false>(&p, &canary, &body, 100);
    assert_ne!(r.envoy.header("x-halo-variant"), Some("canary"));
    // An unkill (a newer empty list) restores it.
    assert!(
        p.enforced
            .on_poll_answer(&p.cfg, Some(200), &envelope(&signer, &[], 0), NOW, &p.rec)
    );
    let r = routed::<false>(&p, &canary, &body, 100);
    assert_eq!(r.envoy.header("x-halo-variant"), Some("canary"));
    // A list pushed with the configuration is in force from the start.
    let pushed = String::from_utf8(killed).expect("utf8");
    let p = policy_with(true, kill_settings(7), json!({"killList": pushed}));
    assert_eq!(p.rec.count_of("halo.killswitch_fetch.outcome.accepted"), 1);
    let r = routed::<true>(&p, &canary, &body, 100);
    assert_ne!(r.envoy.header("x-halo-variant"), Some("canary"));
}

#[test]
fn an_unusable_kill_key_keeps_traffic_flowing_with_the_header() {
    let p = policy(
        json!({"killSwitch": {"cluster": "k", "url": "http://127.0.0.1:9/k", "token": "t", "pubkey": "not a key"}}),
    );
    assert!(
        p.rec
            .logs
            .borrow()
            .iter()
            .any(|(_, m)| m.contains("kill-switch public key is unusable"))
    );
    let body = messages("sonnet", 1);
    let r = routed::<true>(&p, "u@x", &body, 100);
    assert!(r.envoy.sent.is_none());
    assert_eq!(r.envoy.header("x-halo-killswitch"), Some("misconfigured"));
}

/// The request filter's run for `body`, then an attempt of it on the endpoint `facts`,
/// the request as the request filter left it.
fn attempt_on<const P: bool>(
    body: &[u8],
    facts: Option<EndpointFacts>,
    piece: usize,
) -> (Run<P>, Run<P>) {
    let p = policy(json!({"forwardAuth": false}));
    let user = user_in(&p, 0);
    let first = routed::<P>(&p, &user, body, piece);
    let mut e = FakeEnvoy::<P> {
        request: first.envoy.request.clone(),
        note: first.envoy.note.clone(),
        facts: facts.map(|f| f.encode().into_bytes()),
        ..FakeEnvoy::default()
    };
    e.request.push(("x-amz-date".into(), "stale".into()));
    let sent = first.envoy.body.clone();
    let stage = fake::attempt(e, &pieces(&sent, piece));
    (first, stage)
}

fn facts(model: &str, kind: &str) -> EndpointFacts {
    EndpointFacts {
        model: model.into(),
        kind: kind.into(),
        host: format!("{kind}.example"),
        region: (kind == "bedrock").then(|| "us-east-1".into()),
        project: None,
        api_version: None,
    }
}

fn first_pick_passes<const P: bool>() {
    let body = messages("sonnet", 50);
    let (first, stage) = attempt_on::<P>(&body, Some(facts("claude-sonnet", "anthropic")), 30);
    assert!(
        stage.answers.iter().all(|a| *a == Next::Continue),
        "{:?}",
        stage.answers
    );
    let mut left = first.envoy.request.clone();
    left.push(("x-amz-date".into(), "stale".into()));
    assert_eq!(stage.envoy.request, left, "no header written");
    assert_eq!(stage.envoy.body, first.envoy.body);
    assert_eq!(stage.envoy.edits, 0);
}

#[test]
fn the_first_picks_attempt_passes_as_the_request_filter_left_it() {
    first_pick_passes::<true>();
    first_pick_passes::<false>();
}

#[test]
fn a_failover_to_another_model_of_the_same_kind_gets_its_model_spliced() {
    let body = messages("sonnet", 5000);
    let expected = String::from_utf8(body.clone())
        .expect("utf8")
        .replacen("\"sonnet\"", "\"model-b\"", 1)
        .into_bytes();
    let (_, stage) = attempt_on::<true>(&body, Some(facts("model-b", "anthropic")), 1000);
    assert_eq!(stage.answers[0], Next::Stop, "the body is awaited");
    assert_eq!(stage.envoy.body, expected);
    assert_eq!(stage.envoy.header("content-length"), None, "sent chunked");
    assert_eq!(stage.envoy.rec.count_of("halo.attempt_rewrites"), 1);
    let (_, stage) = attempt_on::<false>(&body, Some(facts("model-b", "anthropic")), 1000);
    assert_eq!(stage.envoy.body, expected);
    assert_eq!(stage.envoy.rec.count_of("halo.attempt_rewrites"), 1);
}

fn bedrock_translated<const P: bool>() {
    let body = messages("sonnet", 100);
    let (_, s) = attempt_on::<P>(&body, Some(facts("us.anthropic.claude:0", "bedrock")), 64);
    let e = &s.envoy;
    assert_eq!(s.answers.first(), Some(&Next::Stop), "the body is awaited");
    assert_eq!(s.answers.last(), Some(&Next::Continue));
    assert_eq!(
        e.header(":path"),
        Some("/model/us.anthropic.claude%3A0/invoke")
    );
    assert_eq!(e.header(":authority"), Some("bedrock.example"));
    assert_eq!(
        e.header("x-amz-date"),
        None,
        "every x-amz- header is the signer's to write"
    );
    let v: Value = serde_json::from_slice(&e.body).expect("json");
    assert_eq!(v["anthropic_version"], "bedrock-2023-05-31");
    assert!(v.get("model").is_none());
    assert_eq!(e.rec.count_of("halo.attempt_rewrites"), 1);
}

#[test]
fn a_bedrock_target_gets_the_request_translated_and_signed_headers_cleared() {
    bedrock_translated::<true>();
    bedrock_translated::<false>();
}

#[test]
fn a_target_that_cannot_serve_the_wire_is_answered_502_bad_upstream() {
    let body = messages("sonnet", 10);
    let (_, stage) = attempt_on::<true>(&body, Some(facts("gemini-2.5-pro", "gemini")), 64);
    assert_eq!(stage.answers, [Next::Stop]);
    let sent = stage.envoy.sent.expect("answered");
    assert_eq!(sent.status, 502);
    assert_eq!(sent.error_type(), "bad_upstream");
    assert!(
        sent.headers
            .contains(&("content-type".into(), "application/json".into()))
    );
}

#[test]
fn an_attempt_without_a_note_or_with_a_garbled_one_passes() {
    let body = messages("sonnet", 10);
    let mut e = FakeEnvoy::<true>::with_headers(&[(":path", "/v1/messages")]);
    e.facts = Some(facts("x", "anthropic").encode().into_bytes());
    let r = fake::attempt(e, &[&body]);
    assert_eq!(r.answers, [Next::Continue, Next::Continue]);
    let mut e = FakeEnvoy::<false>::with_headers(&[(":path", "/v1/messages")]);
    e.note = Some(b"garbage".to_vec());
    let r = fake::attempt(e, &[&body]);
    assert_eq!(r.answers, [Next::Continue, Next::Continue]);
    assert!(r.envoy.sent.is_none());
}

#[test]
fn an_error_answer_from_a_translated_target_goes_to_the_client_as_written() {
    let body = messages("sonnet", 10);
    let p = policy(json!({}));
    let user = user_in(&p, 0);
    let first = routed::<true>(&p, &user, &body, 64);
    let mut e = FakeEnvoy::<true> {
        request: first.envoy.request.clone(),
        note: first.envoy.note.clone(),
        facts: Some(
            facts("us.anthropic.claude:0", "bedrock")
                .encode()
                .into_bytes(),
        ),
        ..FakeEnvoy::default()
    };
    let mut flow = crate::stage::StageFlow::new();
    flow.on_request_headers(&mut e, false);
    e.body = first.envoy.body.clone();
    e.piece = e.body.len();
    flow.on_request_body(&mut e, true);
    let error = br#"{"message":"throttled"}"#;
    let out = fake::answer(
        &mut flow,
        &mut e,
        &[(":status", "429"), ("content-type", "application/json")],
        &[error],
    );
    assert_eq!(out, error);
    assert!(
        e.response
            .contains(&("content-type".into(), "application/json".into()))
    );
}

/// The last answer of a routed model call, as the request filter sees it: `status` with
/// Envoy's response code `details`, on the `path` of a `body` call.
fn last_answer(path: &str, body: &[u8], status: u32, details: &str) -> Run<true> {
    let p = policy(json!({}));
    let user = user_in(&p, 0);
    let mut e = post::<true>(Some(&user), body, &[]);
    e.set_header(":path", Some(path));
    fake::request_answered(&p, e, &[body], status, details)
}

#[test]
fn every_target_failing_is_answered_503_no_available_target_in_the_wires_shape() {
    let anthropic = messages("sonnet", 10);
    // A provider's 5xx or 429 after the last attempt, Envoy's own failure to connect, or
    // every breaker open: the wire's error shape, never the provider's body.
    for (status, details) in [
        (503, "via_upstream"),
        (500, "via_upstream"),
        (429, "via_upstream"),
        (
            503,
            "upstream_reset_before_response_started{remote_connection_failure}",
        ),
        (504, "upstream_per_try_timeout"),
        (503, "no_healthy_upstream"),
    ] {
        let r = last_answer("/v1/messages", &anthropic, status, details);
        assert_eq!(r.response, Some(Next::Stop), "{status} {details}");
        let sent = r.envoy.sent.expect("answered");
        assert_eq!(sent.status, 503, "{status} {details}");
        assert_eq!(sent.json()["type"], "error");
        assert_eq!(sent.error_type(), "no_available_target");
        assert_eq!(
            sent.json()["error"]["message"],
            crate::request::ALL_FAILED_MESSAGE
        );
        // Counted once, as the client got it (the stream's end runs after the reply).
        let counts = r.envoy.rec.counts.borrow();
        let requests: Vec<_> = counts
            .iter()
            .filter(|c| c.starts_with("halo.requests."))
            .collect();
        assert_eq!(requests.len(), 1, "{requests:?}");
        assert!(requests[0].ends_with(".status.503"), "{requests:?}");
    }
    // OpenAI's shape for Codex.
    let responses = json!({"model": "sonnet", "input": "hi"}).to_string();
    let r = last_answer("/v1/responses", responses.as_bytes(), 502, "via_upstream");
    let sent = r.envoy.sent.expect("answered");
    assert_eq!(sent.json()["error"]["code"], "no_available_target");
    assert_eq!(sent.json()["error"]["type"], "no_available_target");
    assert!(sent.json().get("type").is_none(), "{}", sent.json());
}

#[test]
fn a_success_a_client_error_or_the_gateways_own_refusal_passes_untouched() {
    let body = messages("sonnet", 10);
    for (status, details) in [
        // A success (a stream starts with it) and a provider's answer that is not a
        // failure to move on from.
        (200, "via_upstream"),
        (400, "via_upstream"),
        // The per-attempt chain's own refusals (a Lua or module local reply).
        (502, "lua_response"),
        (502, "dynamic_module"),
    ] {
        let r = last_answer("/v1/messages", &body, status, details);
        assert_eq!(r.response, Some(Next::Continue), "{status} {details}");
        assert!(r.envoy.sent.is_none(), "{status} {details}");
    }
    // A refusal of the request filter's own is not looked at again.
    let p = policy(json!({}));
    let r = fake::request_answered(&p, post::<true>(None, &body, &[]), &[&body], 503, "");
    assert_eq!(r.envoy.sent.map(|s| s.status), Some(401));
    assert_eq!(r.response, None);
}

#[test]
fn the_error_shapes_of_no_available_target_per_wire() {
    use crate::pipeline::Reply;
    use halo_policy::types::WireProtocol;
    let json = |r: &Reply| serde_json::from_slice::<Value>(&r.body).expect("json");
    let r = Reply::no_available_target(WireProtocol::Gemini, "m");
    assert_eq!(json(&r)["error"]["status"], "UNAVAILABLE");
    assert_eq!(json(&r)["error"]["code"], 503);
    assert_eq!(
        json(&r)["error"]["details"][0]["reason"],
        "no_available_target"
    );
    let r = Reply::no_available_target(WireProtocol::BedrockInvoke, "m");
    assert_eq!(json(&r), json!({"message": "m"}));
    assert!(r.headers.contains(&(
        "x-amzn-errortype".into(),
        "ServiceUnavailableException".into()
    )));
    for wire in [
        WireProtocol::AnthropicMessages,
        WireProtocol::OpenaiResponses,
        WireProtocol::Gemini,
        WireProtocol::BedrockInvoke,
    ] {
        let r = Reply::no_available_target(wire, "m");
        assert_eq!(r.status, 503);
        assert!(
            r.headers
                .contains(&("content-type".into(), "application/json".into()))
        );
    }
}

// The response side's account of decided calls ([`crate::account`]), per wire.

use std::time::Duration;

use halo_contract::facts::Fact;
use halo_providers::eventstream::chunk_frame;

/// The test snapshot with an upstream of every kind, an alias per wire, and prices for
/// all but the Vertex upstream.
fn account_policy() -> TestPolicy {
    account_policy_with(json!({}))
}

/// [`account_policy`] with `budgets` (the snapshot's, by name).
fn account_policy_with(budgets: Value) -> TestPolicy {
    let mut s = snapshot(true);
    s["budgets"] = budgets;
    s["upstreams"]["o"] = json!({"url": "http://127.0.0.1:4", "kind": "openai"});
    s["upstreams"]["br"] =
        json!({"url": "http://127.0.0.1:5", "kind": "bedrock", "region": "us-east-1"});
    s["upstreams"]["vx"] = json!({"url": "http://127.0.0.1:6", "kind": "vertex", "region": "us-east5", "project": "p"});
    s["models"]["gpt"] = json!([{"upstream": "o", "model": "gpt-5"}]);
    s["models"]["opus"] = json!([{"upstream": "br", "model": "anthropic.claude-opus"}]);
    s["prices"] = json!({
        "a": {"claude-sonnet": {"input": 3.0, "output": 15.0, "cacheWrite": 3.75, "cacheRead": 0.3}},
        "o": {"gpt-5": {"input": 1.25, "output": 10.0, "cacheRead": 0.125}},
        "br": {"anthropic.claude-opus": {"input": 15.0, "output": 75.0}},
        "g": {"gemini-2.5-pro": {"input": 1.25, "output": 10.0, "cacheRead": 0.31}},
    });
    let doc = json!({"snapshot": s, "settings": {}});
    let cfg = Config::from_bytes(doc.to_string().as_bytes()).expect("config");
    TestPolicy::new(cfg, NOW)
}

/// A call from a verified user on `path` with `body`, answered by `served`
/// (upstream, model) with `headers` and `answer` in pieces of `piece` bytes, 50 ms
/// apart; `cut`: reset after them. Returns the run and the bytes the client got.
#[allow(clippy::too_many_arguments)]
fn metered<const P: bool>(
    p: &TestPolicy,
    path: &str,
    body: &[u8],
    served: (&str, &str),
    headers: &[(&str, &str)],
    answer: &[u8],
    piece: usize,
    cut: bool,
) -> (Run<P>, Vec<u8>) {
    let mut e = post::<P>(Some("alice@acme.test"), body, &[]);
    e.set_header(":path", Some(path));
    e.served = vec![
        ("upstream".into(), served.0.into()),
        ("model".into(), served.1.into()),
    ];
    let answer = fake::Answer {
        headers,
        pieces: answer.chunks(piece.max(1)).collect(),
        step: Duration::from_millis(50),
        cut,
    };
    fake::call(p, e, &[body], &answer)
}

fn fact<const P: bool>(r: &Run<P>, fact: Fact) -> Option<&str> {
    r.envoy.state.get(fact.state_key()).map(String::as_str)
}

/// Every token fact, in the record's terms (input counts the cache's prompt tokens).
fn tokens<const P: bool>(r: &Run<P>) -> [Option<u64>; 4] {
    [
        Fact::InputTokens,
        Fact::OutputTokens,
        Fact::CacheWriteTokens,
        Fact::CacheReadTokens,
    ]
    .map(|f| fact(r, f).map(|v| v.parse().expect("a count")))
}

fn cost<const P: bool>(r: &Run<P>) -> Option<f64> {
    fact(r, Fact::CostUsd).map(|v| v.parse().expect("a number"))
}

fn close(a: Option<f64>, b: f64) -> bool {
    a.is_some_and(|a| (a - b).abs() < 1e-12)
}

const JSON: &[(&str, &str)] = &[(":status", "200"), ("content-type", "application/json")];
const SSE: &[(&str, &str)] = &[(":status", "200"), ("content-type", "text/event-stream")];

const ANTHROPIC_JSON: &str = r#"{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet","content":[{"type":"text","text":"{\"usage\": 1}"}],"stop_reason":"end_turn","usage":{"input_tokens":2095,"cache_creation_input_tokens":2051,"cache_read_input_tokens":10240,"output_tokens":503}}"#;

fn anthropic_sse(with_end: bool) -> String {
    let mut events = vec![
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-sonnet\",\"usage\":{\"input_tokens\":25,\"cache_creation_input_tokens\":100,\"cache_read_input_tokens\":4000,\"output_tokens\":1}}}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        "event: ping\ndata: {\"type\": \"ping\"}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"usage: 99\"}}\n\n",
    ];
    if with_end {
        events.extend([
            "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":342}}\n\n",
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        ]);
    }
    events.concat()
}

fn anthropic_json_and_sse<const P: bool>() {
    let p = account_policy();
    let body = messages("sonnet", 10);
    let (r, out) = metered::<P>(
        &p,
        "/v1/messages",
        &body,
        ("a", "claude-sonnet"),
        JSON,
        ANTHROPIC_JSON.as_bytes(),
        64,
        false,
    );
    assert_eq!(
        out,
        ANTHROPIC_JSON.as_bytes(),
        "the answer passes unchanged"
    );
    assert!(r.answers.iter().skip(2).all(|a| *a == Next::Continue));
    assert_eq!(
        tokens(&r),
        [
            Some(2095 + 2051 + 10240),
            Some(503),
            Some(2051),
            Some(10240)
        ]
    );
    let want = (2095.0 * 3.0 + 503.0 * 15.0 + 2051.0 * 3.75 + 10240.0 * 0.3) / 1e6;
    assert!(close(cost(&r), want), "{:?}", cost(&r));
    assert_eq!(fact(&r, Fact::Complete), Some("true"));
    assert_eq!(fact(&r, Fact::Alias), Some("sonnet"));
    assert_eq!(fact(&r, Fact::TimeToFirstToken), Some("0.050"));
    let unit = fact(&r, Fact::Unit).expect("unit");
    assert_eq!(unit.len(), 32);
    assert!(!unit.contains("alice"), "never the subject");
    let salt = match r.envoy.header("x-halo-experiment") {
        Some(_) => halo_policy::assign::unit_salt(Some("s1"), "general"),
        None => halo_policy::assign::unit_salt(None, "general"),
    };
    assert_eq!(unit, halo_policy::assign::unit(&salt, "alice@acme.test"));
    // Prometheus: tokens by kind and the cost in millionths, by ring, variant, upstream.
    let variant = r
        .envoy
        .header("x-halo-variant")
        .unwrap_or("none")
        .to_string();
    let tag = format!("ring.general.variant.{variant}.upstream.a");
    assert_eq!(
        r.envoy
            .rec
            .sum_of(&format!("halo.tokens.{tag}.kind.cache_read")),
        10240
    );
    assert_eq!(
        r.envoy.rec.sum_of(&format!("halo.cost_micro_usd.{tag}")),
        (want * 1e6).round() as u64
    );

    // The same usage streamed: message_start's counts, then message_delta's output, in
    // pieces cut anywhere (7 bytes).
    let sse = anthropic_sse(true);
    let (r, out) = metered::<P>(
        &p,
        "/v1/messages",
        &body,
        ("a", "claude-sonnet"),
        SSE,
        sse.as_bytes(),
        7,
        false,
    );
    assert_eq!(out, sse.as_bytes());
    assert_eq!(tokens(&r), [Some(4125), Some(342), Some(100), Some(4000)]);
    assert_eq!(fact(&r, Fact::Complete), Some("true"));
    assert_eq!(fact(&r, Fact::TimeToFirstToken), Some("0.050"));
    // Written as they change, not once per piece: unit, alias, ttft, four counts and the
    // cost at message_start; output and cost again at message_delta; complete.
    assert_eq!(
        r.envoy.fact_writes,
        2 + 1 + 5 + 2 + 1,
        "{:?}",
        r.envoy.state
    );

    // Cut after message_start: what was seen, incomplete.
    let sse = anthropic_sse(false);
    let (r, _) = metered::<P>(
        &p,
        "/v1/messages",
        &body,
        ("a", "claude-sonnet"),
        SSE,
        sse.as_bytes(),
        100,
        true,
    );
    assert_eq!(tokens(&r), [Some(4125), Some(1), Some(100), Some(4000)]);
    assert_eq!(fact(&r, Fact::Complete), None);
}

#[test]
fn an_anthropic_answer_is_metered_as_it_streams_json_and_sse() {
    anthropic_json_and_sse::<true>();
    anthropic_json_and_sse::<false>();
}

fn openai_responses<const P: bool>() {
    let p = account_policy();
    let body = json!({"model": "gpt", "input": "hi"})
        .to_string()
        .into_bytes();
    let usage = r#"{"input_tokens":1200,"input_tokens_details":{"cached_tokens":1000},"output_tokens":80,"output_tokens_details":{"reasoning_tokens":64},"total_tokens":1280}"#;
    let answer = format!(
        r#"{{"id":"resp_1","object":"response","status":"completed","model":"gpt-5","output":[],"usage":{usage}}}"#
    );
    let (r, _) = metered::<P>(
        &p,
        "/v1/responses",
        &body,
        ("o", "gpt-5"),
        JSON,
        answer.as_bytes(),
        33,
        false,
    );
    // OpenAI counts the cache in input_tokens, as the record does.
    assert_eq!(tokens(&r), [Some(1200), Some(80), None, Some(1000)]);
    let want = (200.0 * 1.25 + 80.0 * 10.0 + 1000.0 * 0.125) / 1e6;
    assert!(close(cost(&r), want), "{:?}", cost(&r));
    assert_eq!(fact(&r, Fact::Complete), Some("true"));

    let sse = format!(
        "event: response.created\ndata: {{\"type\":\"response.created\",\"response\":{{\"id\":\"resp_1\",\"usage\":null}}}}\n\n\
         event: response.output_text.delta\ndata: {{\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}}\n\n\
         event: response.completed\ndata: {{\"type\":\"response.completed\",\"response\":{{\"id\":\"resp_1\",\"status\":\"completed\",\"usage\":{usage}}}}}\n\n"
    );
    let (r, out) = metered::<P>(
        &p,
        "/v1/responses",
        &body,
        ("o", "gpt-5"),
        SSE,
        sse.as_bytes(),
        11,
        false,
    );
    assert_eq!(out, sse.as_bytes());
    assert_eq!(tokens(&r), [Some(1200), Some(80), None, Some(1000)]);
    assert_eq!(fact(&r, Fact::Complete), Some("true"));
}

#[test]
fn an_openai_responses_answer_is_metered_json_and_sse() {
    openai_responses::<true>();
    openai_responses::<false>();
}

fn bedrock_invoke<const P: bool>() {
    let p = account_policy();
    let body = json!({"anthropic_version": "bedrock-2023-05-31", "max_tokens": 1, "messages": []})
        .to_string()
        .into_bytes();
    let answer = r#"{"id":"msg_1","type":"message","content":[],"usage":{"input_tokens":30,"output_tokens":7}}"#;
    let (r, _) = metered::<P>(
        &p,
        "/model/opus/invoke",
        &body,
        ("br", "anthropic.claude-opus"),
        JSON,
        answer.as_bytes(),
        16,
        false,
    );
    assert_eq!(tokens(&r), [Some(30), Some(7), None, None]);
    assert!(close(cost(&r), (30.0 * 15.0 + 7.0 * 75.0) / 1e6));
    assert_eq!(fact(&r, Fact::Complete), Some("true"));

    // invoke-with-response-stream: the AWS event stream, Anthropic events in its chunks.
    let mut stream = Vec::new();
    for event in anthropic_sse(true).split("\n\n").filter(|e| !e.is_empty()) {
        let data = event
            .lines()
            .find_map(|l| l.strip_prefix("data: "))
            .expect("data");
        stream.extend(chunk_frame(data));
    }
    let headers = &[
        (":status", "200"),
        ("content-type", "application/vnd.amazon.eventstream"),
    ];
    let (r, out) = metered::<P>(
        &p,
        "/model/opus/invoke-with-response-stream",
        &body,
        ("br", "anthropic.claude-opus"),
        headers,
        &stream,
        50,
        false,
    );
    assert_eq!(out, stream, "the event stream passes unchanged");
    assert_eq!(tokens(&r), [Some(4125), Some(342), Some(100), Some(4000)]);
    assert_eq!(fact(&r, Fact::Complete), Some("true"));
    // No cache prices: cache tokens at the input price.
    let want = (25.0 * 15.0 + 342.0 * 75.0 + 4100.0 * 15.0) / 1e6;
    assert!(close(cost(&r), want), "{:?}", cost(&r));
}

#[test]
fn a_bedrock_answer_is_metered_json_and_event_stream() {
    bedrock_invoke::<true>();
    bedrock_invoke::<false>();
}

fn bedrock_converse<const P: bool>() {
    let p = account_policy();
    let body = json!({"messages": [{"role": "user", "content": [{"text": "hi"}]}]})
        .to_string()
        .into_bytes();
    let answer = r#"{"output":{"message":{"role":"assistant","content":[{"text":"Hi"}]}},"stopReason":"end_turn","usage":{"inputTokens":30,"outputTokens":7,"totalTokens":537,"cacheReadInputTokens":400,"cacheWriteInputTokens":100},"metrics":{"latencyMs":310}}"#;
    let (r, out) = metered::<P>(
        &p,
        "/model/opus/converse",
        &body,
        ("br", "anthropic.claude-opus"),
        JSON,
        answer.as_bytes(),
        16,
        false,
    );
    assert_eq!(out, answer.as_bytes(), "the answer passes unchanged");
    // The record's input counts the cache's prompt tokens too (30 + 100 + 400).
    assert_eq!(tokens(&r), [Some(530), Some(7), Some(100), Some(400)]);
    // No cache prices: cache tokens at the input price.
    assert!(close(cost(&r), (530.0 * 15.0 + 7.0 * 75.0) / 1e6));
    assert_eq!(fact(&r, Fact::Complete), Some("true"));

    // converse-stream: the usage is in the stream's last event, `metadata`.
    let event = |kind: &str, payload: &str| {
        halo_providers::eventstream::encode_frame(
            &[(":message-type", "event"), (":event-type", kind)],
            payload.as_bytes(),
        )
    };
    let stream = [
        event("messageStart", r#"{"role":"assistant"}"#),
        event(
            "contentBlockDelta",
            r#"{"contentBlockIndex":0,"delta":{"text":"Hi"}}"#,
        ),
        event("messageStop", r#"{"stopReason":"end_turn"}"#),
        event(
            "metadata",
            r#"{"usage":{"inputTokens":12,"outputTokens":9,"totalTokens":21},"metrics":{"latencyMs":500}}"#,
        ),
    ]
    .concat();
    let headers = &[
        (":status", "200"),
        ("content-type", "application/vnd.amazon.eventstream"),
    ];
    let (r, out) = metered::<P>(
        &p,
        "/model/opus/converse-stream",
        &body,
        ("br", "anthropic.claude-opus"),
        headers,
        &stream,
        20,
        false,
    );
    assert_eq!(out, stream, "the event stream passes unchanged");
    assert_eq!(tokens(&r), [Some(12), Some(9), None, None]);
    assert!(close(cost(&r), (12.0 * 15.0 + 9.0 * 75.0) / 1e6));
    assert_eq!(fact(&r, Fact::Complete), Some("true"));

    // Cut before its metadata: no usage, not complete.
    let cut_at = stream.len() - 10;
    let (r, _) = metered::<P>(
        &p,
        "/model/opus/converse-stream",
        &body,
        ("br", "anthropic.claude-opus"),
        headers,
        &stream[..cut_at],
        20,
        true,
    );
    assert_eq!(tokens(&r), [None, None, None, None]);
    assert_ne!(fact(&r, Fact::Complete), Some("true"));
}

#[test]
fn a_bedrock_converse_answer_is_metered_json_and_event_stream() {
    bedrock_converse::<true>();
    bedrock_converse::<false>();
}

fn vertex_without_a_price<const P: bool>() {
    let p = account_policy();
    let body = messages("sonnet", 10);
    // An Anthropic call served by Vertex (rawPredict answers in the Messages shape): the
    // tokens are read; the Vertex model has no price, so its cost is unknown, not zero.
    let (r, _) = metered::<P>(
        &p,
        "/v1/messages",
        &body,
        ("vx", "claude-sonnet@20250929"),
        JSON,
        ANTHROPIC_JSON.as_bytes(),
        1000,
        false,
    );
    assert_eq!(tokens(&r)[1], Some(503));
    assert_eq!(fact(&r, Fact::CostUsd), None);
    assert_eq!(fact(&r, Fact::Complete), Some("true"));
    assert!(
        !r.envoy
            .rec
            .counts
            .borrow()
            .iter()
            .any(|c| c.starts_with("halo.cost")),
        "an unknown cost adds nothing"
    );
}

#[test]
fn a_vertex_answer_is_metered_and_an_unpriced_model_costs_unknown() {
    vertex_without_a_price::<true>();
    vertex_without_a_price::<false>();
}

fn gemini<const P: bool>() {
    let p = account_policy();
    let body = json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]})
        .to_string()
        .into_bytes();
    let usage = r#"{"promptTokenCount":500,"cachedContentTokenCount":100,"candidatesTokenCount":40,"thoughtsTokenCount":10,"totalTokenCount":550}"#;
    let answer = format!(
        r#"{{"candidates":[{{"content":{{"parts":[{{"text":"hello"}}]}},"finishReason":"STOP"}}],"usageMetadata":{usage}}}"#
    );
    let (r, _) = metered::<P>(
        &p,
        "/v1beta/models/gem:generateContent",
        &body,
        ("g", "gemini-2.5-pro"),
        JSON,
        answer.as_bytes(),
        20,
        false,
    );
    assert_eq!(tokens(&r), [Some(500), Some(50), None, Some(100)]);
    assert!(close(
        cost(&r),
        (400.0 * 1.25 + 50.0 * 10.0 + 100.0 * 0.31) / 1e6
    ));
    assert_eq!(fact(&r, Fact::Complete), Some("true"));

    let sse = format!(
        "data: {{\"candidates\":[{{\"content\":{{\"parts\":[{{\"text\":\"he\"}}]}}}}],\"usageMetadata\":{{\"promptTokenCount\":500}}}}\r\n\r\n\
         data: {{\"candidates\":[{{\"content\":{{\"parts\":[{{\"text\":\"llo\"}}]}},\"finishReason\":\"STOP\"}}],\"usageMetadata\":{usage}}}\r\n\r\n"
    );
    let (r, out) = metered::<P>(
        &p,
        "/v1beta/models/gem:streamGenerateContent?alt=sse",
        &body,
        ("g", "gemini-2.5-pro"),
        SSE,
        sse.as_bytes(),
        9,
        false,
    );
    assert_eq!(out, sse.as_bytes());
    assert_eq!(tokens(&r), [Some(500), Some(50), None, Some(100)]);
    assert_eq!(fact(&r, Fact::Complete), Some("true"));
}

#[test]
fn a_gemini_answer_is_metered_json_and_sse() {
    gemini::<true>();
    gemini::<false>();
}

fn errors_and_token_counts<const P: bool>() {
    let p = account_policy();
    let body = messages("sonnet", 10);
    // An error answer: no usage read, not complete; its time to first byte still counts.
    let error =
        br#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens"}}"#;
    let headers = &[(":status", "400"), ("content-type", "application/json")];
    let (r, out) = metered::<P>(
        &p,
        "/v1/messages",
        &body,
        ("a", "claude-sonnet"),
        headers,
        error,
        1000,
        false,
    );
    assert_eq!(out, error);
    assert_eq!(tokens(&r), [None; 4]);
    assert_eq!(fact(&r, Fact::Complete), None);
    assert!(fact(&r, Fact::Unit).is_some() && fact(&r, Fact::TimeToFirstToken).is_some());
    // Token counting is not a model call: no account at all.
    let (r, _) = metered::<P>(
        &p,
        "/v1/messages/count_tokens",
        &body,
        ("a", "claude-sonnet"),
        JSON,
        br#"{"input_tokens":12}"#,
        1000,
        false,
    );
    assert!(r.envoy.state.is_empty(), "{:?}", r.envoy.state);
}

#[test]
fn an_error_answer_has_no_usage_and_token_counting_no_account() {
    errors_and_token_counts::<true>();
    errors_and_token_counts::<false>();
}

fn default_upstream<const P: bool>() {
    let get = |user: Option<&str>, path: &str| {
        let mut e = FakeEnvoy::<P>::with_headers(&[
            (":method", "GET"),
            (":path", path),
            (":authority", "gw"),
            ("authorization", "Bearer tok"),
        ]);
        e.claims = user.and_then(claims);
        e
    };
    let with = policy(json!({"defaultUpstreamCluster": "halo-default-upstream"}));
    // The model list and a path no policy route takes go to the default upstream, as
    // they came, less the client's credentials.
    for path in ["/v1/models", "/v1/files"] {
        let r = fake::request(&with, get(Some("u@x"), path), &[], 200);
        assert!(r.envoy.sent.is_none(), "{path}: not answered by the filter");
        assert_eq!(
            r.envoy.header("x-halo-route"),
            Some("halo-default-upstream"),
            "{path}"
        );
        assert_eq!(r.envoy.header(":path"), Some(path));
        assert_eq!(r.envoy.header("authorization"), None, "{path}");
    }
    // The caller is identified first.
    let r = fake::request(&with, get(None, "/v1/models"), &[], 0);
    assert_eq!(r.envoy.sent.as_ref().map(|s| s.status), Some(401));
    assert_eq!(r.envoy.header("x-halo-route"), None);
    // A model call the policy refuses is still refused, not sent there.
    let body = messages("gpt-4", 1);
    let r = fake::request(&with, post::<P>(Some("u@x"), &body, &[]), &[&body], 0);
    assert_eq!(r.envoy.sent.as_ref().map(|s| s.status), Some(400));
    // Without one, an unknown path is 404.
    let without = policy(json!({}));
    let r = fake::request(&without, get(Some("u@x"), "/v1/files"), &[], 0);
    assert_eq!(r.envoy.sent.as_ref().map(|s| s.status), Some(404));
}

#[test]
fn with_a_default_upstream_an_unrouted_path_goes_there_after_identity() {
    default_upstream::<true>();
    default_upstream::<false>();
}

// The target breakers (crate::breaker) as the request flow uses them: which aggregate a
// call leads with, from the outcomes of earlier calls' attempts.

/// A policy whose `fo` routes to a (tier 0) then b (tier 1), with `breaker` settings.
fn failover_policy(breaker: Value) -> TestPolicy {
    let mut s = snapshot(true);
    s["models"]["fo"] = json!([
        {"upstream": "a", "model": "m-a"},
        {"upstream": "b", "model": "m-b", "priority": 1},
    ]);
    let doc = json!({"snapshot": s, "settings": {"breaker": breaker}});
    let cfg = Config::from_bytes(doc.to_string().as_bytes()).expect("config");
    TestPolicy::new(cfg, NOW)
}

/// One call to `model` at `secs` on the worker's `breakers`, answered after `attempts`
/// attempts with `status` (`details` as Envoy says). Returns the aggregate it led with
/// (`None` when the filter answered before any attempt) and the run.
fn call_at(
    p: &TestPolicy,
    breakers: &std::rc::Rc<std::cell::RefCell<crate::breaker::Breakers>>,
    model: &str,
    secs: u64,
    attempts: u32,
    status: u32,
    details: &str,
) -> (Option<String>, Run<true>) {
    let body = messages(model, 10);
    let mut e = post::<true>(Some("u@acme.test"), &body, &[]);
    e.breakers = breakers.clone();
    e.clock = std::time::Duration::from_secs(1_000 + secs);
    e.attempts = Some(attempts);
    let r = fake::request_answered(p, e, &[&body], status, details);
    let led = r.envoy.header("x-halo-route").map(str::to_string);
    (led, r)
}

#[test]
fn five_failures_in_a_row_keep_a_target_from_leading_until_one_probe_after_the_cool_down() {
    let p = failover_policy(json!({}));
    let b = std::rc::Rc::default();
    // a fails (b answers after it) four times: a still leads.
    for _ in 0..4 {
        let (led, _) = call_at(&p, &b, "fo", 0, 2, 200, "via_upstream");
        assert_eq!(led.as_deref(), Some("fo-0"));
    }
    // The fifth failure in a row opens a's breaker: calls lead with b, whose aggregate
    // leaves a out (an earlier tier).
    call_at(&p, &b, "fo", 1, 2, 200, "via_upstream");
    for secs in [1, 10, 30] {
        let (led, r) = call_at(&p, &b, "fo", secs, 1, 200, "via_upstream");
        assert_eq!(led.as_deref(), Some("fo-1"), "at {secs} s");
        assert!(r.envoy.sent.is_none());
    }
    // 30 s after it opened: one call probes a, the others still skip it.
    let (probe, _) = call_at(&p, &b, "fo", 31, 1, 200, "via_upstream");
    assert_eq!(probe.as_deref(), Some("fo-0"));
    // (That call's answer was a's success: closed again, a leads every call.)
    for _ in 0..3 {
        assert_eq!(
            call_at(&p, &b, "fo", 31, 1, 200, "via_upstream")
                .0
                .as_deref(),
            Some("fo-0")
        );
    }
}

#[test]
fn a_failed_probe_opens_the_breaker_for_another_cool_down_and_a_429_is_a_failure() {
    let p = failover_policy(json!({"consecutiveFailures": 2, "openSeconds": 5}));
    let b = std::rc::Rc::default();
    // Two failures of a (a 429 or a 5xx: Envoy moved on to b), each answered by b: open.
    for _ in 0..2 {
        call_at(&p, &b, "fo", 0, 2, 200, "via_upstream");
    }
    assert_eq!(
        call_at(&p, &b, "fo", 1, 1, 200, "via_upstream")
            .0
            .as_deref(),
        Some("fo-1")
    );
    // The probe (a, then b after it fails with a 429): open again from then.
    let (probe, _) = call_at(&p, &b, "fo", 5, 2, 200, "via_upstream");
    assert_eq!(probe.as_deref(), Some("fo-0"));
    for secs in [5, 9] {
        assert_eq!(
            call_at(&p, &b, "fo", secs, 1, 200, "via_upstream")
                .0
                .as_deref(),
            Some("fo-1"),
            "at {secs} s"
        );
    }
    // A 429 as the last answer counts as well: the probe's one attempt answered 429
    // (as when no attempt is left), then a is open again.
    let (probe, r) = call_at(&p, &b, "fo", 10, 1, 429, "via_upstream");
    assert_eq!(probe.as_deref(), Some("fo-0"));
    assert_eq!(r.envoy.sent.map(|s| s.status), Some(503));
    assert_eq!(
        call_at(&p, &b, "fo", 11, 1, 200, "via_upstream")
            .0
            .as_deref(),
        Some("fo-1")
    );
}

#[test]
fn a_client_error_is_a_success_and_the_gateways_own_refusal_is_neither() {
    let p = failover_policy(json!({"consecutiveFailures": 2, "openSeconds": 5}));
    let b = std::rc::Rc::default();
    // a fails once, then answers 400 itself (the caller's mistake): the count starts over.
    call_at(&p, &b, "fo", 0, 2, 200, "via_upstream");
    call_at(&p, &b, "fo", 0, 1, 400, "via_upstream");
    call_at(&p, &b, "fo", 0, 2, 200, "via_upstream");
    assert_eq!(
        call_at(&p, &b, "fo", 0, 1, 200, "via_upstream")
            .0
            .as_deref(),
        Some("fo-0"),
        "one failure since the 400: closed"
    );
    // a fails, then the per-attempt chain refuses the call on a itself (a module's local
    // reply): a was never asked, the count stays at one.
    call_at(&p, &b, "fo", 0, 2, 200, "via_upstream");
    call_at(&p, &b, "fo", 0, 1, 502, "dynamic_module");
    assert_eq!(
        call_at(&p, &b, "fo", 0, 1, 200, "via_upstream")
            .0
            .as_deref(),
        Some("fo-0")
    );
    // A connect failure on a is a failure like a 5xx: with the one before, open.
    call_at(&p, &b, "fo", 0, 2, 200, "via_upstream");
    call_at(
        &p,
        &b,
        "fo",
        0,
        1,
        503,
        "upstream_reset_before_response_started{remote_connection_failure}",
    );
    assert_eq!(
        call_at(&p, &b, "fo", 0, 1, 200, "via_upstream")
            .0
            .as_deref(),
        Some("fo-1")
    );
}

#[test]
fn every_breaker_open_is_503_no_available_target_before_any_attempt() {
    let p = failover_policy(json!({"consecutiveFailures": 1, "openSeconds": 5}));
    let b = std::rc::Rc::default();
    // a and b both fail on one call (503 from the last, b): both open.
    let (_, r) = call_at(&p, &b, "fo", 0, 2, 503, "via_upstream");
    assert_eq!(r.envoy.sent.map(|s| s.status), Some(503));
    let (led, r) = call_at(&p, &b, "fo", 1, 0, 200, "via_upstream");
    assert_eq!(led, None, "no aggregate named: nothing is sent");
    let sent = r.envoy.sent.expect("answered by the filter");
    assert_eq!(sent.status, 503);
    assert_eq!(sent.error_type(), "no_available_target");
    assert_eq!(r.answers.last(), Some(&Next::Stop));
    // After the cool-down, a (first in order) is the probe.
    assert_eq!(
        call_at(&p, &b, "fo", 5, 1, 200, "via_upstream")
            .0
            .as_deref(),
        Some("fo-0")
    );
}

#[test]
fn a_route_with_one_target_has_no_breaker() {
    let p = failover_policy(json!({"consecutiveFailures": 1, "openSeconds": 5}));
    let b = std::rc::Rc::default();
    for _ in 0..3 {
        let (led, r) = call_at(&p, &b, "sonnet", 0, 1, 503, "via_upstream");
        assert!(
            led.is_some_and(|l| l.ends_with("sonnet-0")),
            "led with its one target"
        );
        assert_eq!(r.envoy.sent.map(|s| s.status), Some(503));
    }
    assert!(b.borrow().is_empty(), "nothing recorded");
}

#[test]
fn a_call_whose_answer_never_came_counts_the_attempts_before_its_last() {
    let p = failover_policy(json!({"consecutiveFailures": 2, "openSeconds": 5}));
    let b: std::rc::Rc<std::cell::RefCell<crate::breaker::Breakers>> = std::rc::Rc::default();
    for _ in 0..2 {
        // The client went away while b's attempt ran (a had failed): the stream ends
        // without an answer.
        let body = messages("fo", 10);
        let mut e = post::<true>(Some("u@acme.test"), &body, &[]);
        e.breakers = b.clone();
        e.attempts = Some(2);
        let mut flow = crate::request::RequestFlow::new();
        flow.on_request_headers(&mut e, &p, false);
        e.body = body.clone();
        e.piece = body.len();
        flow.on_request_body(&mut e, &p, true);
        flow.on_stream_complete(&mut e);
    }
    let a = halo_policy::cluster_names::target_cluster(&p.cfg.snapshot.models["fo"][0]);
    let bt = halo_policy::cluster_names::target_cluster(&p.cfg.snapshot.models["fo"][1]);
    assert!(b.borrow().is_open(&a), "a failed twice");
    assert!(!b.borrow().is_open(&bt), "b's outcome is unknown");
}

// ---------------------------------------------------------------------------------------
// Shadow jobs

const SHADOW_TOKEN: &str = "shadow-token-0123456789abcdef0123456789abcdef";

/// The unit tests' snapshot with a shadow experiment on `sonnet` mirroring every caller
/// (`turns`) to `target`, and a Bedrock upstream for a translated treatment.
fn shadow_snapshot(turns: &str, target: Value) -> Value {
    let mut s = crate::tests::snapshot(Some("https://idp"));
    s["upstreams"]["br"] = json!({"url": "https://bedrock-runtime.us-east-1.amazonaws.com",
                                  "kind": "bedrock", "region": "us-east-1"});
    s["experiments"] = json!([
        {"name": "sonnet-shadow", "type": "shadow", "axis": "traffic", "status": "running",
         "rings": ["general"], "salt": "shadow-salt", "shadowTurns": turns,
         "variants": [{"name": "control", "weight": 0},
                      {"name": "treatment", "weight": 100, "routes": {"sonnet": [target]}}]},
    ]);
    s
}

fn shadow_settings(max_bytes: u64) -> Value {
    json!({"cluster": "halo-shadow", "url": "http://127.0.0.1:9445/mirror",
           "token": SHADOW_TOKEN, "maxBytes": max_bytes})
}

fn shadow_policy(turns: &str, target: Value, settings: Value) -> TestPolicy {
    let doc = json!({"snapshot": shadow_snapshot(turns, target), "settings": settings});
    let cfg = Config::from_bytes(doc.to_string().as_bytes()).expect("config");
    TestPolicy::new(cfg, NOW)
}

fn treatment_b() -> Value {
    json!({"upstream": "b", "model": "shadow-model"})
}

/// A request carrying every kind of header a job must never carry.
fn shadowed_post<const P: bool>(body: &[u8]) -> FakeEnvoy<P> {
    post::<P>(
        Some("alice@acme.test"),
        body,
        &[
            ("x-api-key", "client-key"),
            ("cookie", "session=secret"),
            ("x-halo-experiment", "forged"),
            ("x-claude-code-session-id", "s-1"),
            ("x-user-email", "alice@acme.test"),
            ("anthropic-version", "2023-06-01"),
            ("anthropic-beta", "prompt-caching-2024-07-31"),
        ],
    )
}

fn envelope_of(callout: &fake::Callout) -> Value {
    serde_json::from_slice(&callout.body).expect("the envelope is JSON")
}

fn a_first_turn_is_mirrored_as_the_treatment_receives_it<const P: bool>() {
    let p = shadow_policy(
        "first",
        treatment_b(),
        json!({"shadow": shadow_settings(1 << 20)}),
    );
    let body = messages("sonnet", 100);
    let r = fake::request(&p, shadowed_post::<P>(&body), &pieces(&body, 64), 200);
    let e = &r.envoy;
    // The live call is untouched: control's target and model.
    assert_eq!(e.header("x-halo-route"), Some("sonnet-0"));
    assert!(String::from_utf8_lossy(&e.body).contains("\"claude-sonnet\""));
    assert_eq!(
        e.header("x-halo-experiment"),
        None,
        "shadow is not attributed"
    );
    assert_eq!(e.callouts.len(), 1, "one job");
    let c = &e.callouts[0];
    assert_eq!(c.cluster, "halo-shadow");
    assert_eq!(c.timeout_ms, crate::config::DEFAULT_SHADOW_TIMEOUT_MS);
    let h = |n: &str| {
        c.headers
            .iter()
            .find(|(k, _)| k == n)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(h(":path"), Some("/mirror"));
    assert_eq!(h(":authority"), Some("127.0.0.1:9445"));
    assert_eq!(
        h("authorization"),
        Some(format!("Bearer {SHADOW_TOKEN}").as_str())
    );
    assert_eq!(h("content-length"), Some(c.body.len().to_string().as_str()));
    let job = envelope_of(c);
    assert_eq!(job["experiment"], "sonnet-shadow");
    assert_eq!(job["variant"], "treatment");
    assert_eq!(job["ring"], "general");
    assert_eq!(job["alias"], "sonnet");
    assert_eq!(job["upstream"], "b");
    assert_eq!(job["model"], "shadow-model");
    assert_eq!(job["method"], "POST");
    assert_eq!(job["path"], "/v1/messages");
    assert_eq!(job["stream"], false);
    assert_eq!(
        job["unit"],
        halo_policy::assign::unit("unit:shadow-salt", "alice@acme.test")
    );
    // The request as the treatment's target receives it: its model, the rest as sent.
    let mut expected: Value = serde_json::from_slice(&body).expect("json");
    expected["model"] = json!("shadow-model");
    assert_eq!(job["body"], expected);
    // Allowlisted headers only.
    assert_eq!(
        job["headers"],
        json!([
            ["anthropic-version", "2023-06-01"],
            ["anthropic-beta", "prompt-caching-2024-07-31"],
            ["content-type", "application/json"]
        ])
    );
    let text = String::from_utf8_lossy(&c.body);
    for never in [
        "Bearer tok",
        "client-key",
        "secret",
        "forged",
        "s-1",
        "alice@acme.test",
    ] {
        assert!(!text.contains(never), "{never} leaked into the job: {text}");
    }
    assert_eq!(r.envoy.rec.count_of("halo.shadow_jobs.outcome.sent"), 1);
}

#[test]
fn a_first_turn_is_mirrored_as_the_treatment_receives_it_piecewise() {
    a_first_turn_is_mirrored_as_the_treatment_receives_it::<true>();
}

#[test]
fn a_first_turn_is_mirrored_as_the_treatment_receives_it_buffered() {
    a_first_turn_is_mirrored_as_the_treatment_receives_it::<false>();
}

fn later_turn() -> Vec<u8> {
    json!({"model": "sonnet", "max_tokens": 1, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "more"}]})
    .to_string()
    .into_bytes()
}

#[test]
fn later_turns_are_mirrored_only_with_turns_all() {
    let body = later_turn();
    let p = shadow_policy(
        "first",
        treatment_b(),
        json!({"shadow": shadow_settings(1 << 20)}),
    );
    let r = fake::request(&p, shadowed_post::<true>(&body), &[&body], 200);
    assert!(r.envoy.callouts.is_empty());
    assert_eq!(
        r.envoy.rec.count_of("halo.shadow_jobs.outcome.later_turn"),
        1
    );
    assert_eq!(r.envoy.header("x-halo-route"), Some("sonnet-0"));

    let p = shadow_policy(
        "all",
        treatment_b(),
        json!({"shadow": shadow_settings(1 << 20)}),
    );
    let r = fake::request(&p, shadowed_post::<true>(&body), &[&body], 200);
    assert_eq!(r.envoy.callouts.len(), 1);
    assert_eq!(
        envelope_of(&r.envoy.callouts[0])["body"]["messages"][1]["role"],
        "assistant"
    );
}

#[test]
fn oversize_unconfigured_refused_and_killed_mirrors_send_nothing_and_the_call_goes_on() {
    let body = messages("sonnet", 2000);
    // Over maxBytes: counted, not sent.
    let p = shadow_policy(
        "first",
        treatment_b(),
        json!({"shadow": shadow_settings(1000)}),
    );
    let r = fake::request(&p, shadowed_post::<false>(&body), &[&body], 200);
    assert!(r.envoy.callouts.is_empty());
    assert_eq!(
        r.envoy.rec.count_of("halo.shadow_jobs.outcome.too_large"),
        1
    );
    assert_eq!(r.envoy.header("x-halo-route"), Some("sonnet-0"));
    // No shadow settings: the decision names a mirror, nothing is built.
    let p = shadow_policy("first", treatment_b(), json!({}));
    let r = fake::request(&p, shadowed_post::<false>(&body), &[&body], 200);
    assert!(r.envoy.callouts.is_empty());
    // Envoy refuses the callout (its circuit breaker open): counted, the call goes on.
    let p = shadow_policy(
        "first",
        treatment_b(),
        json!({"shadow": shadow_settings(1 << 20)}),
    );
    let mut e = shadowed_post::<false>(&body);
    e.refuse_callouts = true;
    let r = fake::request(&p, e, &[&body], 200);
    assert_eq!(r.envoy.rec.count_of("halo.shadow_jobs.outcome.not_sent"), 1);
    assert_eq!(r.envoy.header("x-halo-route"), Some("sonnet-0"));
    assert!(r.envoy.sent.is_none());
    // Killed: the experiment is paused, nothing is decided, nothing is built or counted.
    let signer = ed25519_dalek::SigningKey::from_bytes(&[7; 32]);
    let mut settings = kill_settings(7);
    settings["shadow"] = shadow_settings(1 << 20);
    let mut p = shadow_policy("all", treatment_b(), settings);
    let killed = envelope(&signer, &["sonnet-shadow"], 5);
    assert!(
        p.enforced
            .on_poll_answer(&p.cfg, Some(200), &killed, NOW, &p.rec)
    );
    let r = fake::request(&p, shadowed_post::<false>(&body), &[&body], 200);
    assert!(r.envoy.callouts.is_empty());
    for outcome in ["sent", "not_sent", "later_turn", "too_large", "not_served"] {
        assert_eq!(
            r.envoy
                .rec
                .count_of(&format!("halo.shadow_jobs.outcome.{outcome}")),
            0
        );
    }
}

#[test]
fn a_treatment_of_another_kind_gets_its_translation_without_client_credentials() {
    let target = json!({"upstream": "br", "model": "anthropic.claude-sonnet-4-5-v1:0"});
    let p = shadow_policy(
        "first",
        target,
        json!({"shadow": shadow_settings(1 << 20), "forwardAuth": true}),
    );
    let body = messages("sonnet", 10);
    let r = fake::request(&p, shadowed_post::<true>(&body), &[&body], 200);
    let job = envelope_of(&r.envoy.callouts[0]);
    assert_eq!(job["upstream"], "br");
    assert_eq!(
        job["path"],
        "/model/anthropic.claude-sonnet-4-5-v1%3A0/invoke"
    );
    assert_eq!(
        job["body"]["model"],
        Value::Null,
        "Bedrock takes the model in the path"
    );
    assert!(job["body"]["anthropic_version"].is_string());
    // With forwardAuth the live call keeps the client's credential; a job never does.
    let text = String::from_utf8_lossy(&r.envoy.callouts[0].body);
    assert!(
        !text.contains("Bearer tok") && !text.contains("client-key"),
        "{text}"
    );
}

#[test]
fn first_turns_are_read_from_each_wire() {
    use crate::shadow::first_turn;
    use halo_policy::types::WireProtocol::*;
    let yes = |w, v: Value| assert!(first_turn(w, v.to_string().as_bytes()), "{v}");
    let no = |w, v: Value| assert!(!first_turn(w, v.to_string().as_bytes()), "{v}");
    yes(
        AnthropicMessages,
        json!({"messages": [{"role": "user", "content": "a"}]}),
    );
    yes(
        AnthropicMessages,
        json!({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}),
    );
    no(
        AnthropicMessages,
        json!({"messages": [{"role": "user"}, {"role": "assistant"}, {"role": "user"}]}),
    );
    no(AnthropicMessages, json!({"messages": 3}));
    yes(OpenaiResponses, json!({"input": "hello"}));
    yes(
        OpenaiResponses,
        json!({"input": [{"role": "user", "content": "a"}]}),
    );
    no(
        OpenaiResponses,
        json!({"input": "more", "previous_response_id": "resp_1"}),
    );
    no(
        OpenaiResponses,
        json!({"input": [{"role": "user"}, {"type": "function_call_output", "output": "x"}]}),
    );
    no(
        OpenaiResponses,
        json!({"input": [{"role": "user"}, {"role": "assistant"}]}),
    );
    yes(
        Gemini,
        json!({"contents": [{"role": "user", "parts": [{"text": "a"}]}]}),
    );
    no(
        Gemini,
        json!({"contents": [{"role": "user"}, {"role": "model"}, {"role": "user"}]}),
    );
    yes(BedrockInvoke, json!({"messages": [{"role": "user"}]}));
}

/// Budgets (issue #25): a call under a budget names it, with the client's wire, for
/// Envoy's budget check, and reports the tokens and micro-USD it spent; a call under no
/// budget writes none of those facts (so the check asks nothing).
fn budget_facts<const P: bool>() {
    let p = account_policy();
    let body = messages("sonnet", 10);
    let (r, _) = metered::<P>(
        &p,
        "/v1/messages",
        &body,
        ("a", "claude-sonnet"),
        JSON,
        ANTHROPIC_JSON.as_bytes(),
        64,
        false,
    );
    for f in Fact::BUDGET {
        assert_eq!(fact(&r, f), None, "no budget applies: no {f:?}");
    }

    let p = account_policy_with(json!({"alice-daily": {
        "appliesTo": {"users": ["alice@acme.test"]},
        "period": "day",
        "limit": {"tokens": 1000},
    }}));
    let (r, _) = metered::<P>(
        &p,
        "/v1/messages",
        &body,
        ("a", "claude-sonnet"),
        JSON,
        ANTHROPIC_JSON.as_bytes(),
        64,
        false,
    );
    let key = halo_policy::budgets::subject_key("alice-daily", "alice@acme.test");
    assert_eq!(
        fact(&r, Fact::Budgets),
        Some(format!("alice-daily:{key}").as_str())
    );
    assert_eq!(fact(&r, Fact::Wire), Some("anthropic-messages"));
    assert_eq!(
        fact(&r, Fact::BudgetTokens),
        Some((2095 + 2051 + 10240 + 503).to_string().as_str())
    );
    let cost = (2095.0 * 3.0 + 503.0 * 15.0 + 2051.0 * 3.75 + 10240.0 * 0.3) / 1e6;
    assert_eq!(
        fact(&r, Fact::BudgetMicroUsd),
        Some(halo_policy::budgets::micro_usd(cost).to_string().as_str())
    );
}

#[test]
fn a_budgeted_call_names_its_budgets_and_reports_what_it_spent() {
    budget_facts::<true>();
    budget_facts::<false>();
}

/// Route to cheaper (issue #25): with the caller's `routeTo` budget in the pushed
/// exhausted list, a call for the alias it names goes to the cheaper alias's target (the
/// route, the body's model and the account's alias); once the entry's period has ended,
/// or for another alias or user, the call keeps its route.
fn rerouted_by_budget<const P: bool>() {
    // No canary: every route here is the alias's own.
    let mut s = crate::tests::snapshot(Some("https://idp"));
    s["models"]["haiku"] = json!([{"upstream": "a", "model": "claude-haiku"}]);
    s["budgets"] = json!({"alice-daily": {
        "appliesTo": {"users": ["alice@acme.test"]},
        "period": "day",
        "limit": {"tokens": 1000},
        "atLimit": {"routeTo": {"sonnet": "haiku"}},
    }});
    let key = halo_policy::budgets::subject_key("alice-daily", "alice@acme.test");
    let with_until = |until_ms: i64| {
        let doc = json!({"snapshot": s, "settings": {},
            "budgetsExhausted": [{"budget": "alice-daily", "subject": key, "untilMs": until_ms}]});
        TestPolicy::new(
            Config::from_bytes(doc.to_string().as_bytes()).expect("config"),
            NOW,
        )
    };
    let routed = |p: &TestPolicy, user: &str, model: &str| {
        let body = format!(r#"{{"model":"{model}","max_tokens":5}}"#);
        let r = fake::request_answered(
            p,
            post::<P>(Some(user), body.as_bytes(), &[]),
            &[body.as_bytes()],
            200,
            "",
        );
        let sent = String::from_utf8_lossy(&r.envoy.body).into_owned();
        (
            r.envoy.header("x-halo-route").map(str::to_string),
            sent,
            fact(&r, Fact::Alias).map(str::to_string),
        )
    };
    // The clock of the fake Envoy starts at 0: an entry until 1 s is in force.
    let p = with_until(1_000);
    let (route, sent, alias) = routed(&p, "alice@acme.test", "sonnet");
    assert_eq!(route.as_deref(), Some("haiku-0"));
    assert!(sent.contains(r#""model":"claude-haiku""#), "{sent}");
    assert_eq!(alias.as_deref(), Some("haiku"));
    // Another user under no budget, and an alias the budget does not name: unmoved.
    assert_eq!(
        routed(&p, "bob@acme.test", "sonnet").0.as_deref(),
        Some("sonnet-0")
    );
    assert_eq!(
        routed(&p, "alice@acme.test", "haiku").0.as_deref(),
        Some("haiku-0")
    );
    // The period is over (the entry's end passed): back on the normal route.
    let p = with_until(0);
    let (route, sent, alias) = routed(&p, "alice@acme.test", "sonnet");
    assert_eq!(route.as_deref(), Some("sonnet-0"));
    assert!(sent.contains(r#""model":"claude-sonnet""#), "{sent}");
    assert_eq!(alias.as_deref(), Some("sonnet"));
}

#[test]
fn an_exhausted_route_to_budget_sends_the_alias_to_the_cheaper_one() {
    rerouted_by_budget::<true>();
    rerouted_by_budget::<false>();
}
