//! The budgets' status API without the budget service.

use axum::http::StatusCode;

use super::{assert_error, get, send};
use crate::budget::{BudgetsApi, ROUTES};
use crate::http::finish;

#[tokio::test]
async fn without_the_budget_service_its_status_is_404_budgets_disabled() {
    let router = finish(BudgetsApi::router(None), 1 << 20, None);
    assert_eq!(ROUTES, [("GET", "/api/v1/budgets/status")]);
    for path in [
        "/api/v1/budgets/status",
        "/api/v1/budgets/status?user=carol@acme.com",
    ] {
        let r = send(&router, get(path, None)).await;
        assert_error(&r, StatusCode::NOT_FOUND, "budgets_disabled");
        assert!(r.message().contains("--budget-listen"), "{}", r.message());
    }
}
