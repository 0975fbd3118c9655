//! Parity of the two modes (#18 item 7): one policy, the standalone bootstrap
//! (halo-envoy-config) and the xDS resources (halo-xds), two real Envoys side by side.
//! Their `/config_dump` clusters, listener and routes are the same once what legitimately
//! differs between the modes is taken out ([`normalize`], the list in docs/design/gateway.md
//! "What legitimately differs between the modes"); the same requests (JSON, SSE, a 5 MB
//! conversation, an over-limit body, failover on 503, 429, a refused connection and a
//! hanging primary, Bedrock signed with SigV4 and checked by a fake that recomputes the
//! signature) get the same answers from both. scripts/test.sh runs this with both filter
//! builds.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use halo_e2e::bedrock::{ACCESS_KEY, FakeBedrock, SECRET_KEY};
use halo_e2e::*;
use halo_policy::Snapshot;
use halo_testkit::envoy::aws_chain_env;
use halo_testkit::free_port;
use reqwest::StatusCode;
use serde_json::{Value, json};

const MIB: usize = 1024 * 1024;
const BEDROCK_MODEL: &str = "us.anthropic.claude-sonnet-4-5-20250929-v1:0";

struct Fixture {
    issuer: Issuer,
    snapshot: Snapshot,
    primary: Provider,
    backup: Provider,
    bedrock: FakeBedrock,
    hang: Hang,
    keyed: Provider,
    keyless: Provider,
}

/// A key in both Envoys' environment, and one that is in neither.
const KEY_ENV: &str = "HALO_PARITY_KEY";
const KEY: &str = "parity-gateway-key";
const MISSING_KEY_ENV: &str = "HALO_PARITY_MISSING_KEY";

/// A loopback URL nothing listens on: connections to it are refused.
fn refused_url() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let port = l.local_addr().expect("addr").port();
    drop(l);
    format!("http://127.0.0.1:{port}")
}

async fn fixture() -> Fixture {
    let issuer = Issuer::start().await;
    let primary = Provider::start("primary").await;
    let backup = Provider::start("backup").await;
    let down = Provider::behaving("down", Behaviour::Status(503)).await;
    let limited = Provider::behaving("limited", Behaviour::Status(429)).await;
    let bedrock = FakeBedrock::start("us-east-1", StatusCode::OK).await;
    let hang = Hang::start().await;
    let keyed = Provider::start("keyed").await;
    let keyless = Provider::start("keyless").await;
    let failover = |first: &str, extra: Value| {
        let mut t = json!({"upstream": first, "model": format!("model-{first}")});
        if let (Some(t), Some(extra)) = (t.as_object_mut(), extra.as_object()) {
            t.extend(extra.clone());
        }
        json!([t, {"upstream": "backup", "model": format!("after-{first}"), "priority": 1}])
    };
    let doc = json!({
        "schema": 1,
        "org": "parity-org",
        "identity": {"issuer": issuer.url, "audience": AUDIENCE,
                     "claims": {"user": "email", "groups": "groups"}},
        "protocols": {"claude-code": "anthropic-messages"},
        "upstreams": {
            "primary": {"url": primary.url, "kind": "anthropic"},
            "backup": {"url": backup.url, "kind": "anthropic"},
            "down": {"url": down.url, "kind": "anthropic"},
            "limited": {"url": limited.url, "kind": "anthropic"},
            "refused": {"url": refused_url(), "kind": "anthropic"},
            "hang": {"url": hang.url, "kind": "anthropic"},
            "bedrock": {"url": bedrock.url, "kind": "bedrock", "region": "us-east-1"},
            // A host outside AWS and signHosts: it may not receive the signature.
            "unsigned": {"url": bedrock.url.replace("127.0.0.1", "localhost"),
                         "kind": "bedrock", "region": "us-east-1"},
            "keyed": {"url": keyed.url, "kind": "anthropic", "credential": {"env": KEY_ENV}},
            "keyless": {"url": keyless.url, "kind": "anthropic",
                        "credential": {"env": MISSING_KEY_ENV}},
        },
        "models": {
            "chat": [{"upstream": "primary", "model": "model-primary"}],
            "on-503": failover("down", json!({})),
            "on-429": failover("limited", json!({})),
            "on-refused": failover("refused", json!({})),
            "on-hang": failover("hang", json!({"timeoutSeconds": 1})),
            "claude": [{"upstream": "bedrock", "model": BEDROCK_MODEL}],
            "on-unsigned": failover("unsigned", json!({})),
            "keyed": [{"upstream": "keyed", "model": "model-keyed"}],
            "keyless": [{"upstream": "keyless", "model": "model-keyless"}],
        },
        "rings": [{"name": "general", "order": 0, "membership": {"default": true}}],
        "experiments": [],
        "toggles": [],
    });
    let snapshot = Snapshot::from_bytes(doc.to_string().as_bytes()).expect("policy decodes");
    Fixture {
        issuer,
        snapshot,
        primary,
        backup,
        bedrock,
        hang,
        keyed,
        keyless,
    }
}

/// The two gateways for the fixture's policy: standalone, then xDS (with its ADS server).
async fn gateways(f: &Fixture) -> (Gateway, Gateway, halo_e2e::xds::Ads) {
    // Both Envoys sign with the test's key pair and nothing else of the AWS chain.
    let mut env = aws_chain_env(Some((ACCESS_KEY, SECRET_KEY)));
    env.push((KEY_ENV, Some(KEY)));
    env.push((MISSING_KEY_ENV, None));
    // The fakes listen on loopback: let them be signed for and receive the gateway's keys.
    let standalone = Gateway::start(
        f.snapshot.clone(),
        GatewayOptions {
            settings: json!({"signHosts": ["127.0.0.1"], "upstreamHosts": ["127.0.0.1"]}),
            env: env
                .iter()
                .map(|(n, v)| (n.to_string(), v.map(str::to_string)))
                .collect(),
            ..GatewayOptions::default()
        },
    );
    let settings = halo_xds::GatewaySettings {
        sign_hosts: vec!["127.0.0.1".into()],
        upstream_hosts: vec!["127.0.0.1".into()],
        ..halo_e2e::xds::settings(free_port())
    };
    let (ads, xds) = halo_e2e::xds::gateway(&f.snapshot, &settings, "gw-parity", &env).await;
    // The same readiness probe to both (an unauthenticated call), so both count it.
    halo_e2e::xds::wait_serving(&xds).await;
    halo_e2e::xds::wait_serving(&standalone).await;
    (standalone, xds, ads)
}

// ---------------------------------------------------------------------------------------
// Configuration

/// Every resource of one kind from an admin `/config_dump`, by name: the static and the
/// dynamic (active) ones alike.
fn dumped(dump: &Value, kind: &str) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    let Some(configs) = dump["configs"].as_array() else {
        return out;
    };
    for c in configs {
        let (lists, inner): (&[&str], &[&str]) = match kind {
            "cluster" => (
                &["static_clusters", "dynamic_active_clusters"],
                &["cluster"],
            ),
            "listener" => (
                &["static_listeners", "dynamic_listeners"],
                &["listener", "active_state"],
            ),
            "route" => (
                &["static_route_configs", "dynamic_route_configs"],
                &["route_config"],
            ),
            "ecds" => (&["ecds_filters"], &["ecds_filter"]),
            _ => unreachable!("a kind of this test"),
        };
        for list in lists {
            for item in c[*list].as_array().into_iter().flatten() {
                let mut v = item;
                for key in inner {
                    if let Some(next) = v.get(*key) {
                        v = next;
                    }
                }
                // A dynamic listener's active state wraps the listener once more.
                if let Some(l) = v.get("listener") {
                    v = l;
                }
                if let Some(name) = v["name"].as_str() {
                    out.insert(name.to_string(), v.clone());
                }
            }
        }
    }
    out
}

/// `TypedStruct` (how halo-xds sends jwt_authn, the filter, the access log and the
/// per-attempt chain: the same JSON as the bootstrap's) replaced by the message it stands
/// for, so both modes' dumps compare field for field.
fn unwrap_typed_struct(v: &mut Value) {
    match v {
        Value::Object(m) => {
            if m.get("@type").and_then(Value::as_str)
                == Some("type.googleapis.com/xds.type.v3.TypedStruct")
            {
                let type_url = m.get("type_url").cloned().unwrap_or(Value::Null);
                let mut inner = m.get("value").cloned().unwrap_or_else(|| json!({}));
                if let Some(o) = inner.as_object_mut() {
                    o.insert("@type".into(), type_url);
                }
                *v = inner;
                unwrap_typed_struct(v);
                return;
            }
            for (_, x) in m.iter_mut() {
                unwrap_typed_struct(x);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(unwrap_typed_struct),
        _ => {}
    }
}

/// Remove every `key` anywhere in `v`.
fn strip(v: &mut Value, key: &str) {
    match v {
        Value::Object(m) => {
            m.remove(key);
            m.values_mut().for_each(|x| strip(x, key));
        }
        Value::Array(a) => a.iter_mut().for_each(|x| strip(x, key)),
        _ => {}
    }
}

/// One Envoy's clusters, listener and routes with what legitimately differs between the
/// modes taken out (docs/design/gateway.md lists each and why):
/// - where resources come from: the ADS cluster `halo-xds` (envoy/ads.yaml), the
///   listener's RDS source vs the inline route configuration, the filter's ECDS source vs
///   its inline configuration (the ECDS resource is put in its place), SDS sources
///   (`sds_config`) of the provider keys;
/// - the listener's port (each Envoy has its own);
/// - how typed JSON travels (`TypedStruct` in xDS, the message itself in the bootstrap).
fn normalize(dump: &Value) -> Value {
    let ecds = dumped(dump, "ecds");
    let mut clusters = dumped(dump, "cluster");
    clusters.remove("halo-xds");
    let mut listeners = dumped(dump, "listener");
    for l in listeners.values_mut() {
        if let Some(m) = l.as_object_mut() {
            m.remove("address");
        }
        for chain in l["filter_chains"].as_array_mut().into_iter().flatten() {
            for filter in chain["filters"].as_array_mut().into_iter().flatten() {
                let hcm = &mut filter["typed_config"];
                if let Some(m) = hcm.as_object_mut() {
                    m.remove("rds");
                    m.remove("route_config");
                }
                for f in hcm["http_filters"].as_array_mut().into_iter().flatten() {
                    let Some(m) = f.as_object_mut() else { continue };
                    if m.remove("config_discovery").is_some() {
                        let name = m.get("name").and_then(Value::as_str).unwrap_or_default();
                        let served = ecds.get(name).cloned().unwrap_or(Value::Null);
                        m.insert("typed_config".into(), served["typed_config"].clone());
                    }
                }
            }
        }
    }
    let routes = dumped(dump, "route");
    let mut v = json!({"clusters": clusters, "listeners": listeners, "routes": routes});
    unwrap_typed_struct(&mut v);
    strip(&mut v, "sds_config");
    v
}

/// The paths (`/clusters/<name>/...`) at which `a` and `b` differ, with both values.
fn differences(a: &Value, b: &Value, at: &str, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                differences(
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                    &format!("{at}/{k}"),
                    out,
                );
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                differences(p, q, &format!("{at}/{i}"), out);
            }
        }
        _ if a != b => out.push(format!("{at}: standalone {a} | xds {b}")),
        _ => {}
    }
}

// ---------------------------------------------------------------------------------------
// Requests

/// What a client sees of an answer that must be the same in both modes: the status, the
/// headers but those of the moment (`date`, Envoy's upstream time), and the body.
fn seen(a: &Answer) -> (u16, BTreeMap<String, String>, String) {
    let headers = a
        .headers
        .iter()
        .filter(|(n, _)| !matches!(n.as_str(), "date" | "x-envoy-upstream-service-time"))
        .map(|(n, v)| (n.clone(), v.clone()))
        .collect();
    (a.status, headers, a.text())
}

fn msg(alias: &str, stream: bool, size: usize) -> Value {
    json!({"model": alias, "max_tokens": 5, "stream": stream,
           "messages": [{"role": "user", "content": "x".repeat(size)}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_modes_render_the_same_gateway_and_answer_alike() {
    let f = fixture().await;
    let (standalone, xds, _ads) = gateways(&f).await;

    // 1. The same clusters, listener and routes.
    let a =
        normalize(&serde_json::from_str(&standalone.envoy.admin("/config_dump")).expect("dump"));
    let b = normalize(&serde_json::from_str(&xds.envoy.admin("/config_dump")).expect("dump"));
    let mut diff = Vec::new();
    differences(&a, &b, "", &mut diff);
    assert!(
        diff.is_empty(),
        "the modes differ where they must not:\n{}",
        diff.join("\n")
    );
    assert!(
        a["clusters"].as_object().is_some_and(|c| c.len() > 10),
        "the dump holds the model clusters: {a}"
    );

    // 2. The same answers.
    let token = bearer(&f.issuer.token("dev@acme.test", &[]));
    let auth = [
        ("authorization", token.as_str()),
        ("content-type", "application/json"),
        ("anthropic-version", "2023-06-01"),
    ];
    let cases: Vec<(&str, Value, &str)> = vec![
        ("JSON", msg("chat", false, 2), "primary"),
        ("SSE", msg("chat", true, 2), ""),
        ("5 MB", msg("chat", false, 5 * MIB), "primary"),
        ("failover on 503", msg("on-503", false, 2), "backup"),
        ("failover on 429", msg("on-429", false, 2), "backup"),
        ("failover on refused", msg("on-refused", false, 2), "backup"),
        (
            "failover on a hanging primary",
            msg("on-hang", false, 2),
            "backup",
        ),
        ("Bedrock, signed", msg("claude", false, 2), ""),
        // Left out of the failover order at configuration time (#27 item 10): the first
        // attempt goes to the next target.
        (
            "a target that must refuse is skipped",
            msg("on-unsigned", false, 2),
            "backup",
        ),
    ];
    for (what, body, provider) in cases {
        let bytes = body.to_string().into_bytes();
        let stream = body["stream"] == json!(true);
        let mut answers = Vec::new();
        for gw in [&standalone, &xds] {
            if stream {
                // The fake's stream ends once released: a permit for this request's.
                f.primary.release_stream();
            }
            answers.push(
                gw.send(reqwest::Method::POST, "/v1/messages", &auth, bytes.clone())
                    .await,
            );
        }
        let (one, two) = (&answers[0], &answers[1]);
        assert_eq!(one.status, 200, "{what}, standalone: {}", one.text());
        if stream {
            assert!(
                one.text().contains("message_stop"),
                "{what}: {}",
                one.text()
            );
        }
        if !provider.is_empty() {
            assert_eq!(one.json()["provider"], provider, "{what}: {}", one.text());
        }
        assert_eq!(seen(one), seen(two), "{what}: the modes answer differently");
    }
    assert!(
        f.hang.accepted() >= 2,
        "the hanging primary was tried by both"
    );
    let signed = f.bedrock.seen();
    assert_eq!(signed.len(), 2, "each gateway sent Bedrock one call");
    for s in &signed {
        assert_eq!(s.verdict, Ok(()), "the fake recomputed another signature");
    }
    assert_eq!(
        f.primary
            .seen()
            .iter()
            .filter(|s| s.json()["messages"][0]["content"].as_str().map(str::len) == Some(5 * MIB))
            .count(),
        2,
        "both gateways sent the whole 5 MB conversation"
    );
    assert!(f.backup.count() >= 10, "every failover reached the backup");

    // The Bearer scheme is case-insensitive (RFC 7235, #27 item 7): a lowercase or
    // uppercase one is accepted by both.
    let raw_token = f.issuer.token("dev@acme.test", &[]);
    for scheme in ["bearer", "BEARER"] {
        let value = format!("{scheme} {raw_token}");
        for gw in [&standalone, &xds] {
            let a = gw
                .send(
                    reqwest::Method::POST,
                    "/v1/messages",
                    &[("authorization", value.as_str()), auth[1], auth[2]],
                    msg("chat", false, 2).to_string().into_bytes(),
                )
                .await;
            assert_eq!(a.status, 200, "{scheme}: {}", a.text());
        }
    }

    // A key missing from Envoy's environment fails its own target alone (#27 item 3):
    // both Envoys run (a secret Envoy read at load made it refuse the whole
    // configuration), the keyed target gets its key, the keyless one is refused 502
    // upstream_auth_error with nothing sent, and the log names the upstream and variable.
    for gw in [&standalone, &xds] {
        let body = |alias: &str| msg(alias, false, 2).to_string().into_bytes();
        let a = gw
            .send(reqwest::Method::POST, "/v1/messages", &auth, body("keyed"))
            .await;
        assert_eq!(a.status, 200, "{}", a.text());
        let a = gw
            .send(
                reqwest::Method::POST,
                "/v1/messages",
                &auth,
                body("keyless"),
            )
            .await;
        assert_eq!(a.status, 502, "{}", a.text());
        assert_eq!(
            a.json()["error"]["type"],
            "upstream_auth_error",
            "{}",
            a.text()
        );
        assert_eq!(
            a.header("x-halo-key-missing"),
            None,
            "the marker is the filter's"
        );
        let logs = gw.envoy.logs();
        assert!(
            logs.contains(&format!(
                "halo: upstream keyless has no key (environment variable {MISSING_KEY_ENV} is not set"
            )),
            "{logs}"
        );
        assert!(!logs.contains(KEY), "Envoy logged a key");
    }
    assert_eq!(f.keyless.count(), 0, "nothing reached the keyless target");
    let keys: Vec<_> = f
        .keyed
        .seen()
        .iter()
        .map(|s| s.header("x-api-key").map(str::to_string))
        .collect();
    assert_eq!(keys, [Some(KEY.to_string()), Some(KEY.to_string())]);

    // 3. An over-limit body: the filter's JSON 413 from both, announced and chunked.
    let over = msg("chat", false, 32 * MIB + MIB / 2)
        .to_string()
        .into_bytes();
    for chunked in [false, true] {
        let mut answers = Vec::new();
        for port in [standalone.port, xds.port] {
            let (auth, body) = (token.clone(), over.clone());
            let got = tokio::task::spawn_blocking(move || raw_post(port, &auth, body, chunked))
                .await
                .expect("join");
            answers.push(got);
        }
        assert_eq!(answers[0].0, 413, "chunked {chunked}: {:?}", answers[0]);
        assert_eq!(
            answers[0], answers[1],
            "chunked {chunked}: the modes refuse differently"
        );
    }

    // 4. The filter's metrics under the same Prometheus names and labels in both modes
    //    (the stats tags of the bootstrap and of envoy/ads.yaml).
    //    The native build hands its counts to Envoy once a second: a bounded poll.
    let metrics = |gw: &Gateway| -> std::collections::BTreeSet<String> {
        gw.filter_series().into_keys().collect()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let (one, two) = loop {
        let (one, two) = (metrics(&standalone), metrics(&xds));
        let counted = one.iter().any(|s| s.starts_with("halo_requests{"))
            && one
                .iter()
                .any(|s| s.starts_with("halo_upstream_auth_errors{") && s.contains("\"keyless\""));
        if (counted && one == two) || std::time::Instant::now() > deadline {
            break (one, two);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(
        one.iter().any(|s| s.starts_with("halo_requests{")),
        "the filter counted the requests: {one:?}"
    );
    assert!(
        one.iter()
            .any(|s| s.starts_with("halo_upstream_auth_errors{") && s.contains("\"keyless\"")),
        "the missing key is counted by upstream: {one:?}"
    );
    assert_eq!(one, two, "the modes name the filter's metrics differently");
}

/// Edge mode (#27 item 12, the spec's deploy mode (a)): with `nextHop` every model call
/// goes to the next hop after the decision, on the client's path, with the model rewritten
/// to the decided target's model id, untranslated (a Bedrock target too) and without a
/// key of the gateway's; the client's Authorization reaches it only with `forwardAuth`.
/// With `defaultUpstream`, a path no policy route takes (GET /v1/models) goes there, the
/// caller identified first (unauthenticated: 401, nothing sent).
/// Both modes: standalone with forwardAuth, xDS without.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edge_mode_forwards_each_call_to_the_next_hop_with_the_targets_model() {
    let issuer = Issuer::start().await;
    let hop = Provider::start("next-hop").await;
    let direct = Provider::start("direct").await;
    let fallback = Provider::start("default-upstream").await;
    let doc = json!({
        "schema": 1,
        "org": "edge-org",
        "identity": {"issuer": issuer.url, "audience": AUDIENCE,
                     "claims": {"user": "email", "groups": "groups"}},
        "protocols": {"claude-code": "anthropic-messages"},
        "upstreams": {
            "anthropic": {"url": direct.url, "kind": "anthropic",
                          "credential": {"env": "HALO_EDGE_KEY"}},
            "bedrock": {"url": refused_url(), "kind": "bedrock", "region": "us-east-1"},
        },
        "models": {
            "chat": [{"upstream": "anthropic", "model": "claude-upstream-id"}],
            "claude": [{"upstream": "bedrock", "model": BEDROCK_MODEL}],
        },
        "rings": [{"name": "general", "order": 0, "membership": {"default": true}}],
        "experiments": [],
        "toggles": [],
    });
    let snapshot = Snapshot::from_bytes(doc.to_string().as_bytes()).expect("policy decodes");
    let env = [("HALO_EDGE_KEY", Some("gateway-own-key"))];
    let standalone = Gateway::start(
        snapshot.clone(),
        GatewayOptions {
            settings: json!({"forwardAuth": true}),
            next_hop: Some(hop.url.clone()),
            default_upstream: Some(fallback.url.clone()),
            env: env
                .iter()
                .map(|(n, v)| (n.to_string(), v.map(str::to_string)))
                .collect(),
            ..GatewayOptions::default()
        },
    );
    let settings = halo_xds::GatewaySettings {
        next_hop: Some(hop.url.clone()),
        default_upstream: Some(fallback.url.clone()),
        ..halo_e2e::xds::settings(free_port())
    };
    let (_ads, xds) = halo_e2e::xds::gateway(&snapshot, &settings, "gw-edge", &env).await;
    halo_e2e::xds::wait_serving(&xds).await;
    halo_e2e::xds::wait_serving(&standalone).await;

    let token = bearer(&issuer.token("dev@acme.test", &[]));
    for (gw, forward_auth) in [(&standalone, true), (&xds, false)] {
        for (alias, model) in [("chat", "claude-upstream-id"), ("claude", BEDROCK_MODEL)] {
            let before = hop.count();
            let a = gw
                .send(
                    reqwest::Method::POST,
                    "/v1/messages",
                    &[
                        ("authorization", token.as_str()),
                        ("content-type", "application/json"),
                        ("anthropic-version", "2023-06-01"),
                    ],
                    msg(alias, false, 2).to_string().into_bytes(),
                )
                .await;
            let what = format!("{alias}, forwardAuth {forward_auth}");
            assert_eq!(a.status, 200, "{what}: {}", a.text());
            assert_eq!(a.json()["provider"], "next-hop", "{what}: {}", a.text());
            assert_eq!(hop.count(), before + 1, "{what}");
            let seen = hop.seen().pop().expect("the next hop saw it");
            assert_eq!(seen.path, "/v1/messages", "{what}: the client's path");
            assert_eq!(seen.json()["model"], model, "{what}: the target's model id");
            assert_eq!(
                seen.header("authorization"),
                forward_auth.then_some(token.as_str()),
                "{what}"
            );
            assert_eq!(
                seen.header("x-api-key"),
                None,
                "{what}: no key of the gateway's"
            );
        }
    }
    assert_eq!(direct.count(), 0, "nothing went to the policy's upstreams");

    // defaultUpstream: the model list is no policy route; it goes there once the caller
    // is identified, with Authorization only with forwardAuth.
    for (gw, forward_auth) in [(&standalone, true), (&xds, false)] {
        let before = fallback.count();
        let a = gw
            .send(reqwest::Method::GET, "/v1/models", &[], Vec::new())
            .await;
        assert_eq!(a.status, 401, "forwardAuth {forward_auth}: {}", a.text());
        assert_eq!(
            fallback.count(),
            before,
            "an unauthenticated call is not forwarded"
        );
        let a = gw
            .send(
                reqwest::Method::GET,
                "/v1/models",
                &[("authorization", token.as_str())],
                Vec::new(),
            )
            .await;
        assert_eq!(a.status, 200, "forwardAuth {forward_auth}: {}", a.text());
        assert_eq!(fallback.count(), before + 1);
        let seen = fallback.seen().pop().expect("the default upstream saw it");
        assert_eq!(
            (seen.method.as_str(), seen.path.as_str()),
            ("GET", "/v1/models")
        );
        assert_eq!(
            seen.header("authorization"),
            forward_auth.then_some(token.as_str()),
            "forwardAuth {forward_auth}"
        );
    }
    assert_eq!(hop.count(), 4, "the model list did not go to the next hop");
}
