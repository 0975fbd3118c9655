//! The checked-in OpenAPI document (server/openapi.json) is valid OpenAPI 3.0,
//! is what the server serves, and lists exactly the routes the server routes.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeSet;

use halo_server::capabilities::OPENAPI;
use halo_server::server::routes;
use support::{Env, serve};

fn doc_routes(doc: &openapiv3::OpenAPI) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for (path, item) in &doc.paths.paths {
        let item = item.as_item().expect("paths are inline, not $ref");
        for (method, _) in item.iter() {
            out.insert((method.to_uppercase(), path.clone()));
        }
    }
    out
}

#[test]
fn document_is_valid_openapi_and_lists_exactly_the_routes() {
    let doc: openapiv3::OpenAPI =
        serde_json::from_str(OPENAPI).expect("openapi.json is a valid OpenAPI 3.0 document");
    assert!(doc.openapi.starts_with("3.0"));
    let expected: BTreeSet<(String, String)> = routes()
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    assert_eq!(doc_routes(&doc), expected);
    // Every $ref points at a schema the document defines.
    let schemas = &doc.components.as_ref().unwrap().schemas;
    for r in OPENAPI.split("\"$ref\": \"").skip(1) {
        let target = r.split('"').next().unwrap();
        let name = target
            .strip_prefix("#/components/schemas/")
            .unwrap_or_else(|| panic!("unexpected $ref {target}"));
        assert!(schemas.contains_key(name), "dangling $ref {target}");
    }
    // Every operation has an id, and they are unique.
    let mut ids = BTreeSet::new();
    for (_, item) in &doc.paths.paths {
        for (_, op) in item.as_item().unwrap().iter() {
            let id = op.operation_id.clone().expect("operationId");
            assert!(ids.insert(id.clone()), "duplicate operationId {id}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn served_document_matches_and_every_route_is_routed() {
    let env = Env::new().await;
    let server = serve(&env.settings()).await;
    let r = server.get("/api/v1/openapi.json", None).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.raw, OPENAPI.as_bytes());
    for (method, path) in routes() {
        let concrete = path.replace("{name}", "x").replace("{id}", "x");
        let url = format!("{}{concrete}", server.base);
        let req = match method {
            "GET" => server.http.get(url),
            "POST" => server.http.post(url).json(&serde_json::json!({})),
            other => panic!("unexpected method {other}"),
        };
        let reply = server.send(req).await;
        assert!(
            reply.body["error"] != "not_found" && reply.body["error"] != "method_not_allowed",
            "{method} {path} is not routed: {:?}",
            reply.body
        );
    }
    server.stop().await;
}
