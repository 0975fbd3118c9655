//! The fleet's API against its own state: enrollment tokens, enrollment, rings, reports,
//! the device list and revocation.

use std::sync::Arc;

use axum::Router;
use axum::http::{StatusCode, header};
use halo_store::Log;
use serde_json::{Value, json};

use super::{FLEET_TOKEN, Fixture, GATEWAY_TOKEN, Reply, assert_error, get, post, send};
use crate::fleet::{Devices, FleetApi};
use crate::http::finish;
use crate::http::secret::SecretGate;
use crate::token::TokenDigest;

struct FleetFx {
    fx: Fixture,
    devices: Arc<Devices>,
    router: Router,
}

fn fleet_fx() -> FleetFx {
    let fx = Fixture::new();
    let devices = fx.devices();
    let api = Arc::new(FleetApi {
        devices: Arc::clone(&devices),
        store: Arc::clone(&fx.store),
        policy: fx.policy.clone(),
        fleet_token: Some(TokenDigest::of(FLEET_TOKEN)),
        gate: Arc::new(SecretGate::default()),
        admin: Arc::clone(&fx.admin),
    });
    let router = finish(api.router(), 1 << 20, None);
    FleetFx {
        fx,
        devices,
        router,
    }
}

impl FleetFx {
    async fn post(&self, path: &str, bearer: Option<&str>, body: Value) -> Reply {
        send(&self.router, post(path, bearer, &body)).await
    }

    async fn get(&self, path: &str, bearer: Option<&str>) -> Reply {
        send(&self.router, get(path, bearer)).await
    }

    /// An enrollment token minted through the API by the admin.
    async fn mint(&self, body: Value) -> String {
        let r = self
            .post(
                "/api/v1/enrollment-tokens",
                Some(&self.fx.admin_token()),
                body,
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
        r.body["token"].as_str().expect("a token").to_string()
    }

    /// A device enrolled with a fresh token: (id, device token).
    async fn enroll(&self, mint: Value, host: &str) -> (String, String) {
        let token = self.mint(mint).await;
        let r = self
            .post(
                "/api/v1/enroll",
                None,
                json!({"enrollmentToken": token, "host": host}),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
        (
            r.body["deviceId"].as_str().expect("id").to_string(),
            r.body["deviceToken"].as_str().expect("token").to_string(),
        )
    }

    fn audit_actions(&self) -> Vec<String> {
        self.fx
            .log(Log::Audit)
            .iter()
            .map(|r| r["action"].as_str().expect("action").to_string())
            .collect()
    }
}

#[tokio::test]
async fn minting_an_enrollment_token_needs_an_admin_and_is_audited_first() {
    let f = fleet_fx();
    let path = "/api/v1/enrollment-tokens";
    let r = f.post(path, None, json!({})).await;
    assert_error(&r, StatusCode::UNAUTHORIZED, "authentication_error");
    let r = f.post(path, Some(&f.fx.user_token()), json!({})).await;
    assert_error(&r, StatusCode::FORBIDDEN, "forbidden");
    let admin = f.fx.admin_token();
    let r = f.post(path, Some(&admin), json!({"user": "  "})).await;
    assert_error(&r, StatusCode::UNPROCESSABLE_ENTITY, "invalid_body");
    assert!(f.fx.log(Log::Enrollments).is_empty());
    assert!(f.fx.log(Log::Audit).is_empty());

    let r = f
        .post(
            path,
            Some(&admin),
            json!({"user": "carol@acme.com", "groups": ["halos-canary"]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    let token = r.body["token"].as_str().expect("token");
    assert!(
        r.body["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("enr-"))
    );
    assert!(r.body["expiresAt"].is_string());
    let audit = f.fx.log(Log::Audit);
    assert_eq!(audit.len(), 1);
    assert_eq!(audit[0]["action"], "mint-enrollment");
    assert_eq!(audit[0]["actor"], "alice@acme.com");
    assert_eq!(audit[0]["user"], "carol@acme.com");
    // Only the token's digest is stored.
    let stored = serde_json::to_string(&f.fx.log(Log::Enrollments)).expect("json");
    assert!(!stored.contains(token));
    assert!(stored.contains(&TokenDigest::of(token).to_hex()));

    // No audit record, no token.
    f.fx.memory.set_failing(Log::Audit, true);
    let r = f.post(path, Some(&admin), json!({})).await;
    assert_error(&r, StatusCode::INTERNAL_SERVER_ERROR, "internal");
    assert!(r.body.get("token").is_none());
    assert_eq!(f.fx.log(Log::Enrollments).len(), 1);
}

#[tokio::test]
async fn enrolling_with_a_bad_token_is_401_naming_the_body_field() {
    let f = fleet_fx();
    let r = f
        .post("/api/v1/enroll", None, json!({"enrollmentToken": "nope"}))
        .await;
    assert_error(&r, StatusCode::UNAUTHORIZED, "authentication_error");
    assert!(!r.header(header::WWW_AUTHENTICATE).is_empty());
    let message = r.message();
    assert!(message.contains("enrollmentToken"), "{message}");
    assert!(
        message.contains("POST /api/v1/enrollment-tokens"),
        "{message}"
    );
    assert!(!message.contains("Authorization"), "{message}");
    let r = f
        .post("/api/v1/enroll", None, json!({"token": "nope"}))
        .await;
    assert_error(&r, StatusCode::UNPROCESSABLE_ENTITY, "invalid_body");
    assert!(f.fx.log(Log::Devices).is_empty());
    assert!(f.fx.log(Log::Audit).is_empty());
}

#[tokio::test]
async fn enrolling_is_201_audited_and_good_once() {
    let f = fleet_fx();
    let token = f.mint(json!({})).await;
    let body = json!({"enrollmentToken": token, "host": "carol-mbp"});
    let r = f.post("/api/v1/enroll", None, body.clone()).await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    let id = r.body["deviceId"].as_str().expect("id").to_string();
    let device_token = r.body["deviceToken"].as_str().expect("token").to_string();
    assert!(id.starts_with("dev-"), "{id}");
    assert!(r.body["expiresAt"].is_string());
    let audit = f.fx.log(Log::Audit);
    assert_eq!(f.audit_actions(), ["mint-enrollment", "enroll"]);
    assert_eq!(audit[1]["actor"], id.as_str());
    assert_eq!(audit[1]["host"], "carol-mbp");
    let stored = serde_json::to_string(&f.fx.log(Log::Devices)).expect("json");
    assert!(!stored.contains(&device_token));

    let again = f.post("/api/v1/enroll", None, body).await;
    assert_error(&again, StatusCode::UNAUTHORIZED, "authentication_error");
    assert!(
        again.message().contains("already used"),
        "{}",
        again.message()
    );
    assert_eq!(f.devices.list().await.len(), 1);

    let list = f.get("/api/v1/devices", Some(&f.fx.admin_token())).await;
    assert_eq!(list.status, StatusCode::OK, "{:?}", list.body);
    assert_eq!(list.body["devices"][0]["id"], id.as_str());
    assert_eq!(list.body["devices"][0]["host"], "carol-mbp");
    assert_eq!(list.body["devices"][0]["revoked"], false);
    let r = f.get("/api/v1/devices", Some(&f.fx.user_token())).await;
    assert_error(&r, StatusCode::FORBIDDEN, "forbidden");
}

#[tokio::test]
async fn an_unaudited_enrollment_keeps_no_device_token() {
    let f = fleet_fx();
    let token = f.mint(json!({})).await;
    f.fx.memory.set_failing(Log::Audit, true);
    let r = f
        .post("/api/v1/enroll", None, json!({"enrollmentToken": token}))
        .await;
    assert_error(&r, StatusCode::INTERNAL_SERVER_ERROR, "internal");
    assert!(r.body.get("deviceToken").is_none());
    let devices = f.devices.list().await;
    assert_eq!(devices.len(), 1);
    assert!(devices[0].revoked, "{devices:?}");
}

#[tokio::test]
async fn a_bound_device_asks_for_its_own_user_only() {
    let f = fleet_fx();
    let (_, token) = f
        .enroll(
            json!({"user": "carol@acme.com", "groups": ["halos-canary"]}),
            "carol-mbp",
        )
        .await;
    let r = f
        .get(
            "/api/v1/fleet/ring?user=carol@acme.com&host=carol-mbp",
            Some(&token),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.body["ring"], "canary");
    assert_eq!(r.body["subject"], "carol@acme.com");
    assert_eq!(r.body["groups"], json!(["halos-canary"]));
    // Without `user` the device's own.
    let r = f.get("/api/v1/fleet/ring", Some(&token)).await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.body["subject"], "carol@acme.com");

    let r = f
        .get("/api/v1/fleet/ring?user=bob@acme.com", Some(&token))
        .await;
    assert_error(&r, StatusCode::FORBIDDEN, "forbidden");
    let r = f.get("/api/v1/fleet/ring?user=carol@acme.com", None).await;
    assert_error(&r, StatusCode::UNAUTHORIZED, "authentication_error");
    let r = f
        .get(
            "/api/v1/fleet/ring?user=carol@acme.com",
            Some(GATEWAY_TOKEN),
        )
        .await;
    assert_error(&r, StatusCode::UNAUTHORIZED, "authentication_error");
}

#[tokio::test]
async fn an_unbound_device_names_the_user() {
    let f = fleet_fx();
    let (_, token) = f.enroll(json!({}), "shared-box").await;
    let r = f.get("/api/v1/fleet/ring", Some(&token)).await;
    assert_error(&r, StatusCode::BAD_REQUEST, "invalid_query");
    assert!(r.message().contains("user"), "{}", r.message());
    let r = f
        .get("/api/v1/fleet/ring?user=bob@acme.com", Some(&token))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.body["subject"], "bob@acme.com");
    // bob is a canary by name (rings.yaml), whatever the device's groups.
    assert_eq!(r.body["ring"], "canary");
    let r = f
        .get(
            "/api/v1/fleet/ring?user=bob@acme.com&colour=red",
            Some(&token),
        )
        .await;
    assert_error(&r, StatusCode::BAD_REQUEST, "invalid_query");
}

#[tokio::test]
async fn reports_take_the_fleet_token_or_a_device_token() {
    let f = fleet_fx();
    let (id, token) = f.enroll(json!({}), "carol-mbp").await;
    let status = json!({"ring": "canary", "digest": "sha256:ab", "outcome": "applied", "drift": ["settings.json"]});
    let r = f
        .post("/api/v1/fleet/report", Some(FLEET_TOKEN), status.clone())
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    assert_eq!(r.body, json!({"accepted": true}));
    let r = f
        .post("/api/v1/fleet/report", Some(&token), status.clone())
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    for bearer in [None, Some(GATEWAY_TOKEN)] {
        let r = f.post("/api/v1/fleet/report", bearer, status.clone()).await;
        assert_error(&r, StatusCode::UNAUTHORIZED, "authentication_error");
    }
    let reports = f.fx.log(Log::Reports);
    assert_eq!(reports.len(), 2, "{reports:?}");
    assert!(reports[0].get("device").is_none(), "{:?}", reports[0]);
    assert_eq!(reports[1]["device"], id.as_str());
    assert_eq!(reports[1]["status"], status);

    let list = f.get("/api/v1/devices", Some(&f.fx.admin_token())).await;
    let device = &list.body["devices"][0];
    assert!(device["lastReportAt"].is_string(), "{device:?}");
    assert_eq!(device["lastReport"]["ring"], "canary");
    assert_eq!(device["lastReport"]["drift"], json!(["settings.json"]));
}

#[tokio::test]
async fn a_revoked_device_is_refused_at_once_and_the_revoke_audited() {
    let f = fleet_fx();
    let (id, token) = f.enroll(json!({}), "carol-mbp").await;
    let admin = f.fx.admin_token();
    let path = format!("/api/v1/devices/{id}/revoke");
    let r = f.post(&path, Some(&f.fx.user_token()), json!({})).await;
    assert_error(&r, StatusCode::FORBIDDEN, "forbidden");
    let r = f.post(&path, Some(&admin), json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.body["revoked"], true);
    assert_eq!(r.body["id"], id.as_str());
    assert_eq!(
        f.audit_actions().last().map(String::as_str),
        Some("revoke-device")
    );
    let r = f
        .get("/api/v1/fleet/ring?user=carol@acme.com", Some(&token))
        .await;
    assert_error(&r, StatusCode::UNAUTHORIZED, "authentication_error");
    let r = f
        .post("/api/v1/fleet/report", Some(&token), json!({"ok": true}))
        .await;
    assert_error(&r, StatusCode::UNAUTHORIZED, "authentication_error");
    let r = f
        .post("/api/v1/devices/dev-nope/revoke", Some(&admin), json!({}))
        .await;
    assert_error(&r, StatusCode::NOT_FOUND, "unknown_device");
}
