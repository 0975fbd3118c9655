//! `GET /api/v1/capabilities` reports the features as built and the policy served now.

use std::sync::Arc;

use axum::http::{StatusCode, header};
use halo_store::LogStore as _;

use super::{Fixture, get, send};
use crate::capabilities::Capabilities;

#[tokio::test]
async fn capabilities_report_the_features_as_built_and_the_policy_now() {
    let fx = Fixture::new();
    let storage = fx.memory.describe();
    let caps = Arc::new(Capabilities {
        kill_switch: true,
        fleet_token: false,
        storage: storage.clone(),
        policy: fx.policy.clone(),
    });
    let router = caps.router();
    // Unauthenticated.
    let r = send(&router, get("/api/v1/capabilities", None)).await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.body["killSwitch"], true);
    assert_eq!(r.body["fleetToken"], false);
    assert_eq!(r.body["enrollment"], true);
    assert_eq!(r.body["adminAuth"], true);
    assert_eq!(r.body["storage"], storage.as_str());
    assert!(storage.starts_with("memory"), "{storage}");
    assert_eq!(r.body["policy"]["org"], "acme-corp");
    let version = fx.policy.now().version.clone();
    assert!(!version.is_empty());
    assert_eq!(r.body["policy"]["version"], version.as_str());

    // A policy without an identity: no admin API, and a new version.
    fx.edit_policy(|org, compiled| {
        org.root.identity = None;
        compiled.identity = None;
    });
    let r = send(&router, get("/api/v1/capabilities", None)).await;
    assert_eq!(r.body["adminAuth"], false);
    assert_ne!(r.body["policy"]["version"], version.as_str());
    assert_eq!(
        r.body["policy"]["version"],
        fx.policy.now().version.as_str()
    );
}

#[tokio::test]
async fn the_other_flags_as_built() {
    let fx = Fixture::new();
    let router = Arc::new(Capabilities {
        kill_switch: false,
        fleet_token: true,
        storage: "files in /var/lib/halos".into(),
        policy: fx.policy.clone(),
    })
    .router();
    let r = send(&router, get("/api/v1/capabilities", None)).await;
    assert_eq!(r.body["killSwitch"], false);
    assert_eq!(r.body["fleetToken"], true);
    assert_eq!(r.body["storage"], "files in /var/lib/halos");
}

#[tokio::test]
async fn the_openapi_document_is_served_as_json() {
    let fx = Fixture::new();
    let router = Arc::new(Capabilities {
        kill_switch: false,
        fleet_token: false,
        storage: String::new(),
        policy: fx.policy.clone(),
    })
    .router();
    let r = send(&router, get("/api/v1/openapi.json", None)).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header(header::CONTENT_TYPE), "application/json");
    assert!(r.body["openapi"].is_string(), "{:?}", r.body);
    assert!(r.body["paths"]["/api/v1/capabilities"].is_object());
}
