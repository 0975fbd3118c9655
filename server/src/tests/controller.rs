//! The controller's API without a controller: its status is off, a rollout's view is the
//! document as served.

use std::sync::Arc;

use axum::Router;
use axum::http::StatusCode;

use super::{Fixture, assert_error, get, send};
use crate::controller::ControllerApi;
use crate::http::finish;

fn router(fx: &Fixture) -> Router {
    let api = Arc::new(ControllerApi {
        controller: None,
        policy: fx.policy.clone(),
        admin: Arc::clone(&fx.admin),
    });
    finish(api.router(), 1 << 20, None)
}

#[tokio::test]
async fn without_a_controller_its_status_is_404_controller_disabled() {
    let fx = Fixture::new();
    let router = router(&fx);
    for bearer in [None, Some(fx.admin_token())] {
        let r = send(&router, get("/api/v1/controller/status", bearer.as_deref())).await;
        assert_error(&r, StatusCode::NOT_FOUND, "controller_disabled");
        assert!(r.message().contains("--controller"), "{}", r.message());
    }
}

#[tokio::test]
async fn an_unknown_rollout_is_404_naming_it() {
    let fx = Fixture::new();
    let r = send(
        &router(&fx),
        get("/api/v1/rollouts/unknown", Some(&fx.admin_token())),
    )
    .await;
    assert_error(&r, StatusCode::NOT_FOUND, "unknown_name");
    assert_eq!(r.body["target"], "rollout");
    assert_eq!(r.body["name"], "unknown");
    assert!(r.message().contains("\"unknown\""), "{}", r.message());
}

#[tokio::test]
async fn a_rollout_in_the_policy_is_its_document_with_no_controller_report() {
    let fx = Fixture::new();
    let router = router(&fx);
    let r = send(
        &router,
        get("/api/v1/rollouts/sonnet-bedrock", Some(&fx.admin_token())),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.body["rollout"]["name"], "sonnet-bedrock");
    assert_eq!(r.body["rollout"]["experiment"], "sonnet-bedrock-canary");
    assert_eq!(r.body["rollout"]["step"], 1);
    let object = r.body.as_object().expect("an object");
    assert!(
        object.get("controller").is_some_and(|c| c.is_null()),
        "{object:?}"
    );
    assert!(
        object.get("chain").is_some_and(|c| c.is_null()),
        "{object:?}"
    );

    // The document as served now: an edit reaches the next request.
    fx.edit_policy(|org, _| {
        org.rollouts
            .get_mut("sonnet-bedrock")
            .expect("in the example")
            .step = 2;
    });
    let r = send(
        &router,
        get("/api/v1/rollouts/sonnet-bedrock", Some(&fx.admin_token())),
    )
    .await;
    assert_eq!(r.body["rollout"]["step"], 2, "{:?}", r.body);
}

#[tokio::test]
async fn a_rollout_is_for_admins() {
    let fx = Fixture::new();
    let router = router(&fx);
    let r = send(&router, get("/api/v1/rollouts/sonnet-bedrock", None)).await;
    assert_error(&r, StatusCode::UNAUTHORIZED, "authentication_error");
    let r = send(
        &router,
        get("/api/v1/rollouts/sonnet-bedrock", Some(&fx.user_token())),
    )
    .await;
    assert_error(&r, StatusCode::FORBIDDEN, "forbidden");
}
