//! The kill switch's API against its own state (ADR-0009): who may kill, what a kill
//! needs, what it writes, and the signed list gateways and devices fetch.

use std::sync::Arc;

use axum::Router;
use axum::http::{StatusCode, header};
use halo_killswitch::{Action, KillSwitch, Target};
use halo_metrics::{Collect as _, Text};
use halo_policy::killswitch::verify;
use halo_store::Log;
use serde_json::json;

use super::{
    Fixture, GATEWAY_TOKEN, Reply, WRONG_TOKEN, assert_error, get, kill_switch, now, post, request,
    send,
};
use crate::fleet::Devices;
use crate::http::finish;
use crate::http::secret::SecretGate;
use crate::kill::{Kill, KillMetrics, KillParts, MAX_REASON};
use crate::token::TokenDigest;

const OPUS_KILL: &str = "/api/v1/experiments/claude-opus-default/kill";

/// The kill feature as the server builds it with a kill key and a gateway token.
struct KillFx {
    fx: Fixture,
    kill: Arc<Kill>,
    switch: Arc<KillSwitch>,
    key: ed25519_compact::PublicKey,
    devices: Arc<Devices>,
    router: Router,
}

fn kill_fx() -> KillFx {
    let fx = Fixture::new();
    let (switch, key) = kill_switch(&fx.store);
    let devices = fx.devices();
    let kill = Kill::new(KillParts {
        switch: Arc::clone(&switch),
        store: Arc::clone(&fx.store),
        policy: fx.policy.clone(),
        gateway_token: Some(TokenDigest::of(GATEWAY_TOKEN)),
        gate: Arc::new(SecretGate::default()),
        admin: Arc::clone(&fx.admin),
        devices: Arc::clone(&devices),
    });
    let router = finish(kill.router(), 4096, None);
    KillFx {
        fx,
        kill,
        switch,
        key,
        devices,
        router,
    }
}

impl KillFx {
    async fn post(&self, path: &str, bearer: Option<&str>, body: serde_json::Value) -> Reply {
        send(&self.router, post(path, bearer, &body)).await
    }

    async fn get(&self, path: &str, bearer: Option<&str>) -> Reply {
        send(&self.router, get(path, bearer)).await
    }

    fn nothing_written(&self) {
        assert!(self.fx.log(Log::Killswitch).is_empty());
        assert!(self.fx.log(Log::Audit).is_empty());
    }

    async fn metrics(&self) -> String {
        let mut text = Text::new();
        KillMetrics(Some(Arc::clone(&self.kill)))
            .collect(&mut text)
            .await;
        text.finish()
    }
}

#[tokio::test]
async fn a_kill_without_a_token_is_401_with_www_authenticate() {
    let k = kill_fx();
    let r = k.post(OPUS_KILL, None, json!({"reason": "x"})).await;
    assert_error(&r, StatusCode::UNAUTHORIZED, "authentication_error");
    assert_eq!(r.header(header::WWW_AUTHENTICATE), "Bearer realm=\"halos\"");
    assert!(
        r.message().contains("Authorization: Bearer"),
        "{}",
        r.message()
    );
    let forged = k.fx.issuer.mint_with_foreign_key(json!({
        "aud": "api://halos", "email": "mallory@acme.com", "groups": ["halos-admins"]
    }));
    let r = k
        .post(OPUS_KILL, Some(&forged), json!({"reason": "x"}))
        .await;
    assert_error(&r, StatusCode::UNAUTHORIZED, "authentication_error");
    k.nothing_written();
    assert!(
        !k.switch
            .state()
            .await
            .is_killed(Target::Experiment, "claude-opus-default")
    );
}

#[tokio::test]
async fn a_non_admin_is_403_on_kills_and_on_the_kill_state() {
    let k = kill_fx();
    let user = k.fx.user_token();
    let r = k.post(OPUS_KILL, Some(&user), json!({"reason": "x"})).await;
    assert_error(&r, StatusCode::FORBIDDEN, "forbidden");
    let r = k
        .post(
            "/api/v1/toggles/deep-reasoning/unkill",
            Some(&user),
            json!({"reason": "x"}),
        )
        .await;
    assert_error(&r, StatusCode::FORBIDDEN, "forbidden");
    let r = k.get("/api/v1/killswitch", Some(&user)).await;
    assert_error(&r, StatusCode::FORBIDDEN, "forbidden");
    k.nothing_written();
}

#[tokio::test]
async fn a_reason_is_required_and_at_most_max_reason_characters() {
    let k = kill_fx();
    let admin = k.fx.admin_token();
    let r = k
        .post(OPUS_KILL, Some(&admin), json!({"reason": " \t "}))
        .await;
    assert_error(&r, StatusCode::UNPROCESSABLE_ENTITY, "reason_required");
    let r = k.post(OPUS_KILL, Some(&admin), json!({})).await;
    assert_error(&r, StatusCode::UNPROCESSABLE_ENTITY, "invalid_body");
    assert!(r.message().contains("reason"), "{}", r.message());
    let long = "x".repeat(MAX_REASON + 1);
    let r = k
        .post(OPUS_KILL, Some(&admin), json!({"reason": long}))
        .await;
    assert_error(&r, StatusCode::UNPROCESSABLE_ENTITY, "reason_too_long");
    assert!(r.message().contains("1000"), "{}", r.message());
    k.nothing_written();

    // The bound counts characters, not bytes: 1000 two-byte characters pass.
    let at_bound = "é".repeat(MAX_REASON);
    let r = k
        .post(OPUS_KILL, Some(&admin), json!({"reason": at_bound}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(k.fx.log(Log::Killswitch)[0]["reason"], at_bound.as_str());
}

#[tokio::test]
async fn bad_bodies_name_the_problem_and_write_nothing() {
    let k = kill_fx();
    let admin = k.fx.admin_token();
    let r = k
        .post(OPUS_KILL, Some(&admin), json!({"reason": "x", "extra": 1}))
        .await;
    assert_error(&r, StatusCode::UNPROCESSABLE_ENTITY, "invalid_body");
    assert!(r.message().contains("extra"), "{}", r.message());
    let mut malformed = post(OPUS_KILL, Some(&admin), &json!({}));
    *malformed.body_mut() = axum::body::Body::from("{\"reason\": ");
    let r = send(&k.router, malformed).await;
    assert_error(&r, StatusCode::BAD_REQUEST, "malformed_json");
    let mut form = request(axum::http::Method::POST, OPUS_KILL, Some(&admin), None);
    *form.body_mut() = axum::body::Body::from("reason=x");
    let r = send(&k.router, form).await;
    assert_error(
        &r,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
    );
    let big = json!({"reason": "x".repeat(8192)});
    let r = k.post(OPUS_KILL, Some(&admin), big).await;
    assert_error(&r, StatusCode::PAYLOAD_TOO_LARGE, "body_too_large");
    k.nothing_written();
}

#[tokio::test]
async fn unknown_names_are_404_naming_the_target_and_the_name() {
    let k = kill_fx();
    let admin = k.fx.admin_token();
    for (path, target, name) in [
        (
            "/api/v1/experiments/no-such-experiment/kill",
            "experiment",
            "no-such-experiment",
        ),
        // A toggle's name is not an experiment's, nor the other way round.
        (
            "/api/v1/experiments/deep-reasoning/kill",
            "experiment",
            "deep-reasoning",
        ),
        (
            "/api/v1/toggles/claude-opus-default/kill",
            "toggle",
            "claude-opus-default",
        ),
        // Not in the policy and not killed: nothing to unkill either.
        (
            "/api/v1/toggles/no-such-toggle/unkill",
            "toggle",
            "no-such-toggle",
        ),
    ] {
        let r = k.post(path, Some(&admin), json!({"reason": "x"})).await;
        assert_error(&r, StatusCode::NOT_FOUND, "unknown_name");
        assert_eq!(r.body["target"], target, "{path}: {:?}", r.body);
        assert_eq!(r.body["name"], name, "{path}: {:?}", r.body);
        assert!(r.message().contains(name), "{}", r.message());
    }
    k.nothing_written();
}

#[tokio::test]
async fn an_admins_kill_is_applied_logged_audited_and_counted() {
    let k = kill_fx();
    let admin = k.fx.admin_token();
    let mut list = k.switch.subscribe();
    list.borrow_and_update();
    let r = k
        .post(
            OPUS_KILL,
            Some(&admin),
            json!({"reason": "  error rate 12%  "}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(
        r.body,
        json!({"target": "experiment", "name": "claude-opus-default", "killed": true, "version": 1})
    );
    assert!(
        k.switch
            .state()
            .await
            .is_killed(Target::Experiment, "claude-opus-default")
    );
    // Subscribers (the xDS push) see it at once.
    assert!(list.has_changed().expect("the switch lives"));

    let log = k.fx.log(Log::Killswitch);
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(log[0]["actor"], "alice@acme.com");
    assert_eq!(log[0]["action"], "kill");
    assert_eq!(log[0]["target"], "experiment");
    assert_eq!(log[0]["name"], "claude-opus-default");
    // The reason is kept trimmed.
    assert_eq!(log[0]["reason"], "error rate 12%");
    let audit = k.fx.log(Log::Audit);
    assert_eq!(audit.len(), 1, "{audit:?}");
    assert_eq!(audit[0]["actor"], "alice@acme.com");
    assert_eq!(audit[0]["action"], "kill");
    assert_eq!(audit[0]["name"], "claude-opus-default");
    assert_eq!(audit[0]["seq"], 1);

    let r = k
        .post(
            "/api/v1/toggles/deep-reasoning/kill",
            Some(&admin),
            json!({"reason": "latency"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.body["version"], 2);

    let state = k.get("/api/v1/killswitch", Some(&admin)).await;
    assert_eq!(state.status, StatusCode::OK, "{:?}", state.body);
    assert_eq!(state.body["enabled"], true);
    assert_eq!(state.body["version"], 2);
    assert_eq!(state.body["experiments"][0]["name"], "claude-opus-default");
    assert_eq!(state.body["experiments"][0]["by"], "alice@acme.com");
    assert_eq!(state.body["toggles"][0]["name"], "deep-reasoning");

    let text = k.metrics().await;
    for line in [
        "halo_server_kill_changes_total{action=\"kill\",target=\"experiment\"} 1",
        "halo_server_kill_changes_total{action=\"kill\",target=\"toggle\"} 1",
        "halo_server_killed{target=\"experiment\"} 1",
        "halo_server_killed{target=\"toggle\"} 1",
        "halo_server_kill_switch_enabled 1",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }
    let mut off = Text::new();
    KillMetrics(None).collect(&mut off).await;
    let off = off.finish();
    assert!(
        off.lines()
            .any(|l| l == "halo_server_kill_switch_enabled 0"),
        "{off}"
    );
    assert!(
        off.lines()
            .any(|l| l == "halo_server_killed{target=\"experiment\"} 0"),
        "{off}"
    );
}

#[tokio::test]
async fn an_unkill_of_a_name_the_policy_dropped_is_allowed_while_it_is_killed() {
    let k = kill_fx();
    let admin = k.fx.admin_token();
    let r = k
        .post(
            "/api/v1/experiments/gpt-shadow/kill",
            Some(&admin),
            json!({"reason": "cost"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    // The policy dir drops the experiment; the next request reads that policy.
    k.fx.edit_policy(|org, _| {
        assert!(org.experiments.remove("gpt-shadow").is_some());
    });
    let r = k
        .post(
            "/api/v1/experiments/gpt-shadow/kill",
            Some(&admin),
            json!({"reason": "again"}),
        )
        .await;
    assert_error(&r, StatusCode::NOT_FOUND, "unknown_name");

    let r = k
        .post(
            "/api/v1/experiments/gpt-shadow/unkill",
            Some(&admin),
            json!({"reason": "retired"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.body["killed"], false);
    assert_eq!(r.body["version"], 2);
    assert!(
        !k.switch
            .state()
            .await
            .is_killed(Target::Experiment, "gpt-shadow")
    );
    // Unkilled and out of the policy: nothing to unkill any more.
    let r = k
        .post(
            "/api/v1/experiments/gpt-shadow/unkill",
            Some(&admin),
            json!({"reason": "twice"}),
        )
        .await;
    assert_error(&r, StatusCode::NOT_FOUND, "unknown_name");
    let actions: Vec<_> =
        k.fx.log(Log::Killswitch)
            .iter()
            .map(|r| r["action"].as_str().expect("action").to_string())
            .collect();
    assert_eq!(actions, ["kill", "unkill"]);
    assert_eq!(k.fx.log(Log::Audit).len(), 2);
}

#[tokio::test]
async fn a_kill_whose_audit_fails_stands_and_answers_500() {
    let k = kill_fx();
    k.fx.memory.set_failing(Log::Audit, true);
    let r = k
        .post(
            OPUS_KILL,
            Some(&k.fx.admin_token()),
            json!({"reason": "breach"}),
        )
        .await;
    assert_error(&r, StatusCode::INTERNAL_SERVER_ERROR, "audit_failed");
    assert_eq!(r.body["killed"], true);
    assert_eq!(r.body["name"], "claude-opus-default");
    assert!(r.message().contains("applied"), "{}", r.message());
    // Fail safe: the kill is in force.
    assert!(
        k.switch
            .state()
            .await
            .is_killed(Target::Experiment, "claude-opus-default")
    );
    assert_eq!(k.fx.log(Log::Killswitch).len(), 1);
    assert!(k.fx.log(Log::Audit).is_empty());
}

#[tokio::test]
async fn an_unkill_whose_audit_fails_is_reverted_and_answers_500() {
    let k = kill_fx();
    let admin = k.fx.admin_token();
    let r = k
        .post(OPUS_KILL, Some(&admin), json!({"reason": "breach"}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    k.fx.memory.set_failing(Log::Audit, true);
    let r = k
        .post(
            "/api/v1/experiments/claude-opus-default/unkill",
            Some(&admin),
            json!({"reason": "looks fine"}),
        )
        .await;
    assert_error(&r, StatusCode::INTERNAL_SERVER_ERROR, "audit_failed");
    assert_eq!(r.body["killed"], true, "{:?}", r.body);
    assert_eq!(r.body["version"], 3, "{:?}", r.body);
    assert!(r.message().contains("reverted"), "{}", r.message());
    assert!(
        k.switch
            .state()
            .await
            .is_killed(Target::Experiment, "claude-opus-default")
    );
    let log = k.fx.log(Log::Killswitch);
    let actions: Vec<_> = log
        .iter()
        .map(|r| r["action"].as_str().expect("action"))
        .collect();
    assert_eq!(actions, ["kill", "unkill", "kill"]);
    assert_eq!(log[2]["actor"], "halo-server");
    assert_eq!(k.fx.log(Log::Audit).len(), 1, "only the first kill's");
    // The signed list a gateway fetches says killed too.
    let r = k
        .get("/api/v1/gateway/killswitch", Some(GATEWAY_TOKEN))
        .await;
    let list = verify(&r.raw, &k.key, now(), None).expect("verifies");
    assert!(list.is_experiment_killed("claude-opus-default"));
}

#[tokio::test]
async fn the_gateway_list_needs_the_gateway_token_and_verifies_with_the_kill_key() {
    let k = kill_fx();
    let path = "/api/v1/gateway/killswitch";
    for bearer in [None, Some(WRONG_TOKEN), Some(&*k.fx.admin_token())] {
        let r = k.get(path, bearer).await;
        assert_error(&r, StatusCode::UNAUTHORIZED, "authentication_error");
        assert!(!r.header(header::WWW_AUTHENTICATE).is_empty());
        assert!(r.message().contains("gateway token"), "{}", r.message());
    }
    let r = k.get(path, Some(GATEWAY_TOKEN)).await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.header(header::CACHE_CONTROL), "no-store");
    assert_eq!(r.header(header::CONTENT_TYPE), "application/json");
    let first = verify(&r.raw, &k.key, now(), None).expect("the list verifies");
    assert_eq!(first.version(), 0);
    assert!(first.experiments().is_empty());
    // Another key does not verify it.
    let (_, other) = super::kill_key();
    assert!(verify(&r.raw, &other, now(), None).is_err());

    let killed = k
        .post(
            OPUS_KILL,
            Some(&k.fx.admin_token()),
            json!({"reason": "guardrail"}),
        )
        .await;
    assert_eq!(killed.status, StatusCode::OK, "{:?}", killed.body);
    let r = k.get(path, Some(GATEWAY_TOKEN)).await;
    // Newer than the one held: a gateway takes it as an update.
    let second = verify(&r.raw, &k.key, now(), Some(&first)).expect("an update");
    assert_eq!(second.version(), 1);
    assert!(second.is_experiment_killed("claude-opus-default"));
}

#[tokio::test]
async fn the_fleet_list_takes_a_device_token_only() {
    let k = kill_fx();
    let path = "/api/v1/fleet/killswitch";
    let minted = k
        .devices
        .mint_enrollment("alice@acme.com", None, vec![])
        .await
        .expect("minted");
    let enrolled = k
        .devices
        .enroll(&minted.token, Some("carol-mbp".into()))
        .await
        .expect("enrolled");
    let r = k.get(path, Some(&enrolled.device_token)).await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.header(header::CACHE_CONTROL), "no-store");
    verify(&r.raw, &k.key, now(), None).expect("the list verifies");
    for bearer in [None, Some(GATEWAY_TOKEN), Some(minted.token.as_str())] {
        let r = k.get(path, bearer).await;
        assert_error(&r, StatusCode::UNAUTHORIZED, "authentication_error");
        assert!(r.message().contains("device token"), "{}", r.message());
    }
    // A revoked device's token stops working at once.
    k.devices
        .revoke(&enrolled.device_id, "alice@acme.com")
        .await
        .expect("revoked");
    let r = k.get(path, Some(&enrolled.device_token)).await;
    assert_error(&r, StatusCode::UNAUTHORIZED, "authentication_error");
}

#[tokio::test]
async fn the_console_and_the_api_change_the_same_switch() {
    let k = kill_fx();
    let admin = crate::auth::Admin {
        user: "bob@acme.com".into(),
        groups: vec!["halos-admins".into()],
    };
    let done = k
        .kill
        .change(
            &admin,
            Action::Kill,
            Target::Toggle,
            "haiku-bedrock",
            "from the console",
        )
        .await
        .expect("applied");
    assert!(done.killed);
    assert_eq!(done.version, 1);
    let r = k
        .post(
            "/api/v1/toggles/haiku-bedrock/unkill",
            Some(&k.fx.admin_token()),
            json!({"reason": "back"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.body["version"], 2);
    let actors: Vec<_> =
        k.fx.log(Log::Killswitch)
            .iter()
            .map(|r| r["actor"].as_str().expect("actor").to_string())
            .collect();
    assert_eq!(actors, ["bob@acme.com", "alice@acme.com"]);
}
