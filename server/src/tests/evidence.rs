//! The samples API (`halo evidence query`) against an embedded evidence store.

use std::sync::Arc;

use axum::Router;
use axum::http::StatusCode;
use halo_evidence::sqlite::SqliteStore;
use halo_evidence::{Record, Source, Stamped, Store as _};

use super::{Fixture, assert_error, get, send};
use crate::evidence::SamplesApi;
use crate::http::finish;

const HOUR_MS: i64 = 3600 * 1000;

fn now_ms() -> i64 {
    super::now() * 1000
}

fn call(experiment: &str, variant: &str, unit: &str, status: u16, ago_ms: i64) -> Stamped {
    Stamped {
        source: Source::Gateway,
        record: Record {
            time_unix_ms: now_ms() - ago_ms,
            ring: "canary".into(),
            experiment: experiment.into(),
            variant: variant.into(),
            unit: unit.into(),
            status,
            attempts: 1,
            complete: true,
            ..Record::default()
        },
    }
}

/// The samples route over a SQLite store in `dir` holding a few calls: two units of
/// claude-opus-default within the day, one two days ago, one of another experiment.
fn samples_router(fx: &Fixture, dir: &std::path::Path) -> Router {
    let store = SqliteStore::open(&dir.join("evidence.db")).expect("the store opens");
    let stored = store
        .append(&[
            call("claude-opus-default", "control", "u-1", 200, HOUR_MS),
            call("claude-opus-default", "treatment", "u-2", 500, 2 * HOUR_MS),
            call("claude-opus-default", "treatment", "u-3", 200, 48 * HOUR_MS),
            call("gpt-shadow", "control", "u-1", 200, HOUR_MS),
        ])
        .expect("appended");
    assert_eq!(stored, 4);
    let api = Arc::new(SamplesApi {
        store: Arc::new(store),
        admin: Arc::clone(&fx.admin),
    });
    finish(SamplesApi::router(Some(api)), 1 << 20, None)
}

#[tokio::test]
async fn without_a_store_the_samples_are_404_evidence_disabled() {
    let router = finish(SamplesApi::router(None), 1 << 20, None);
    let r = send(
        &router,
        get(
            "/api/v1/evidence/samples?experiment=x&metric=error_rate",
            None,
        ),
    )
    .await;
    assert_error(&r, StatusCode::NOT_FOUND, "evidence_disabled");
    assert!(
        r.message().contains("--otlp-gateway-listen"),
        "{}",
        r.message()
    );
}

#[tokio::test]
async fn bad_queries_are_400_naming_the_problem() {
    let fx = Fixture::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let router = samples_router(&fx, dir.path());
    let admin = fx.admin_token();

    let r = send(
        &router,
        get(
            "/api/v1/evidence/samples?experiment=claude-opus-default&metric=happiness",
            Some(&admin),
        ),
    )
    .await;
    assert_error(&r, StatusCode::BAD_REQUEST, "unknown_metric");
    assert!(r.message().contains("error_rate"), "{}", r.message());
    assert!(r.message().contains("cost"), "{}", r.message());

    for query in [
        "",
        "?experiment=claude-opus-default",
        "?metric=error_rate",
        "?experiment=claude-opus-default&metric=error_rate&colour=red",
    ] {
        let r = send(
            &router,
            get(&format!("/api/v1/evidence/samples{query}"), Some(&admin)),
        )
        .await;
        assert_error(&r, StatusCode::BAD_REQUEST, "invalid_query");
    }
    let r = send(
        &router,
        get(
            "/api/v1/evidence/samples?experiment=claude-opus-default&metric=error_rate&since=a-while",
            Some(&admin),
        ),
    )
    .await;
    assert_error(&r, StatusCode::BAD_REQUEST, "invalid_since");
}

#[tokio::test]
async fn a_query_counts_the_samples_of_the_window() {
    let fx = Fixture::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let router = samples_router(&fx, dir.path());
    let admin = fx.admin_token();
    let path = "/api/v1/evidence/samples?experiment=claude-opus-default&metric=error_rate";

    // The last 24h by default: u-1 and u-2, not the call of two days ago.
    let r = send(&router, get(path, Some(&admin))).await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.body["experiment"], "claude-opus-default");
    assert_eq!(r.body["metric"], "error_rate");
    assert_eq!(r.body["since"], "1day");
    assert_eq!(r.body["samples"], 2, "{:?}", r.body);
    let variants = r.body["variants"].as_array().expect("variants");
    let treatment = variants
        .iter()
        .find(|v| v["variant"] == "treatment")
        .expect("treatment summarized");
    assert_eq!(treatment["n"], 1);
    assert_eq!(treatment["mean"], 1.0, "u-2's call failed");
    assert_eq!(treatment["source"], "gateway");

    let r = send(&router, get(&format!("{path}&since=72h"), Some(&admin))).await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.body["samples"], 3, "{:?}", r.body);
    assert_eq!(r.body["since"], "3days");
}

#[tokio::test]
async fn samples_are_for_admins() {
    let fx = Fixture::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let router = samples_router(&fx, dir.path());
    let path = "/api/v1/evidence/samples?experiment=claude-opus-default&metric=error_rate";
    let r = send(&router, get(path, None)).await;
    assert_error(&r, StatusCode::UNAUTHORIZED, "authentication_error");
    let r = send(&router, get(path, Some(&fx.user_token()))).await;
    assert_error(&r, StatusCode::FORBIDDEN, "forbidden");
}
