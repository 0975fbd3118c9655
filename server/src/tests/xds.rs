//! The admin listener's `/xds/status` without `--xds-listen`.

use axum::http::StatusCode;

use super::{assert_error, get, send};
use crate::http::finish;

#[tokio::test]
async fn without_xds_its_status_says_so() {
    let router = finish(crate::xds::admin_router(None), 1 << 20, None);
    let r = send(&router, get("/xds/status", None)).await;
    assert_error(&r, StatusCode::NOT_FOUND, "not_found");
    assert!(r.message().contains("--xds-listen"), "{}", r.message());
}
