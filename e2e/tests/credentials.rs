//! Per-attempt credentials in a real Envoy 1.40 (issue 8): Envoy's own filters, placed as
//! upstream HTTP filters on the aggregate cluster and each wrapped in a match_delegate
//! keyed on the attempt's target, sign for Bedrock (SigV4 over the final body) and inject
//! an Anthropic key read from an SDS file, once per attempt.
//!
//! The translation stage is the halo filter's job; here a Lua filter stands in for it
//! (it sets the path and body each target expects), so these tests pin the credential
//! mechanism on its own. The chain built below is the shape docs/design/credentials.md
//! ("Per-attempt credentials") describes.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use axum::http::StatusCode;
use halo_e2e::bedrock::{ACCESS_KEY, FakeBedrock, SECRET_KEY};
use halo_e2e::{Provider, client_builder};
use halo_testkit::envoy::Envoy;
use halo_testkit::{free_port, wait_until};
use serde_json::{Value, json};

const REGION: &str = "us-east-1";
/// The invoke path of `us.anthropic.claude-sonnet-4-5-20250929-v1:0`: the ':' is escaped,
/// so the fake checks that Envoy signs the escaped path the way AWS does (double-encoded).
const BEDROCK_PATH: &str = "/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke";
const ANTHROPIC_MODEL: &str = "claude-sonnet-4-5-20250929";

/// One target cluster: a one-endpoint cluster whose endpoint metadata names it.
struct Target<'a> {
    cluster: &'a str,
    kind: &'a str,
    port: u16,
}

fn target_cluster(t: &Target<'_>) -> Value {
    json!({
        "name": t.cluster,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {"cluster_name": t.cluster, "endpoints": [{"lb_endpoints": [{
            "endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": t.port}}},
            "metadata": {"filter_metadata": {"halo": {"target": t.cluster, "kind": t.kind}}}
        }]}]}
    })
}

/// Run `filter` only on attempts whose target is `cluster`: match_delegate skips it for
/// every other value of the per-attempt marker header.
fn only_for(name: &str, cluster: &str, filter: Value) -> Value {
    json!({
        "name": name,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.common.matching.v3.ExtensionWithMatcher",
            "extension_config": filter,
            "xds_matcher": {"matcher_list": {"matchers": [{
                "predicate": {"not_matcher": {"single_predicate": {
                    "input": {"name": "target", "typed_config": {
                        "@type": "type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput",
                        "header_name": "x-halo-target"}},
                    "value_match": {"exact": cluster}
                }}},
                "on_match": {"action": {"name": "skip", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.common.matcher.action.v3.SkipFilter"}}}
            }]}}
        }
    })
}

/// The stand-in for the halo filter's per-attempt translation: each target gets its own
/// path and body, set on every attempt (headers, :path included, carry over between
/// attempts; the body does not).
const TRANSLATE_LUA: &str = r#"
local bedrock_body = '{"anthropic_version":"bedrock-2023-05-31","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}'
function envoy_on_request(h)
  local t = h:headers():get("x-halo-target")
  local body = h:body()
  if t == "t-bedrock" then
    h:headers():replace(":path", "BEDROCK_PATH")
    body:setBytes(bedrock_body)
  elseif t == "t-anthropic" then
    h:headers():replace(":path", "/v1/messages")
    body:setBytes('{"model":"ANTHROPIC_MODEL","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}')
  end
  h:headers():remove("content-length")
end
"#;

/// Refuse a Bedrock attempt the signer left unsigned (it forwards unsigned when the AWS
/// chain finds no credentials): 502 upstream_auth_error, nothing sent.
const REQUIRE_SIGNATURE_LUA: &str = r#"
function envoy_on_request(h)
  local auth = h:headers():get("authorization")
  if auth == nil or string.sub(auth, 1, 17) ~= "AWS4-HMAC-SHA256 " then
    h:respond({[":status"] = "502", ["content-type"] = "application/json"},
      '{"type":"error","error":{"type":"upstream_auth_error","message":"no AWS credentials for this upstream"}}')
  end
end
"#;

fn lua(name: &str, code: &str) -> Value {
    json!({"name": name, "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
        "default_source_code": {"inline_string": code}}})
}

/// The per-attempt chain on the aggregate cluster.
fn attempt_filters(sds_path: &Path) -> Vec<Value> {
    let strip: Vec<Value> = [
        "authorization",
        "x-api-key",
        "api-key",
        "x-goog-api-key",
        "proxy-authorization",
        "x-amz-date",
        "x-amz-content-sha256",
        "x-amz-security-token",
    ]
    .iter()
    .map(|h| json!({"remove": h}))
    .collect();
    let mut reset = strip;
    reset.push(json!({"append": {
        "header": {"key": "x-halo-target", "value": "%UPSTREAM_METADATA(halo:target)%"},
        "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}}));
    let translate = TRANSLATE_LUA
        .replace("BEDROCK_PATH", BEDROCK_PATH)
        .replace("ANTHROPIC_MODEL", ANTHROPIC_MODEL);
    vec![
        // 1. Every attempt starts clean: credentials of a previous attempt (and the
        //    client's) removed, the marker set from the chosen endpoint's metadata.
        json!({"name": "halo.attempt", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
            "mutations": {"request_mutations": reset}}}),
        // 2. Translation (the halo filter's upstream stage in the product).
        lua("halo.translate", &translate),
        // 3. SigV4 for the Bedrock target, over the final body.
        only_for(
            "halo.sign.t-bedrock",
            "t-bedrock",
            json!({"name": "envoy.filters.http.aws_request_signing", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.aws_request_signing.v3.AwsRequestSigning",
                "service_name": "bedrock",
                "region": REGION,
                "use_unsigned_payload": false,
                "match_excluded_headers": [
                    {"prefix": "x-envoy"}, {"prefix": "x-halo"},
                    {"exact": "x-forwarded-proto"}, {"exact": "x-request-id"}]}}),
        ),
        only_for(
            "halo.require-signature.t-bedrock",
            "t-bedrock",
            json!({"name": "envoy.filters.http.lua", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
                "default_source_code": {"inline_string": REQUIRE_SIGNATURE_LUA}}}),
        ),
        // 4. The Anthropic key from an SDS file (rotation by replacing the file).
        only_for(
            "halo.cred.t-anthropic",
            "t-anthropic",
            json!({"name": "envoy.filters.http.credential_injector", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.credential_injector.v3.CredentialInjector",
                "overwrite": true,
                "credential": {"name": "envoy.http.injected_credentials.generic", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.http.injected_credentials.generic.v3.Generic",
                    "credential": {"name": "anthropic-key", "sds_config": {
                        "path_config_source": {"path": sds_path.display().to_string()}}},
                    "header": "x-api-key"}}}}),
        ),
        // 5. The marker never leaves Envoy.
        json!({"name": "halo.unmark", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
            "mutations": {"request_mutations": [{"remove": "x-halo-target"}]}}}),
        json!({"name": "envoy.filters.http.upstream_codec", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.upstream_codec.v3.UpstreamCodec"}}),
    ]
}

fn bootstrap(port: u16, admin: u16, targets: &[Target<'_>], sds_path: &Path) -> String {
    let mut clusters: Vec<Value> = targets.iter().map(target_cluster).collect();
    clusters.push(json!({
        "name": "agg",
        "connect_timeout": "1s",
        "lb_policy": "CLUSTER_PROVIDED",
        "cluster_type": {"name": "envoy.clusters.aggregate", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.clusters.aggregate.v3.ClusterConfig",
            "clusters": targets.iter().map(|t| t.cluster).collect::<Vec<_>>()}},
        "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http_protocol_options": {}},
            "http_filters": attempt_filters(sds_path)}}
    }));
    let config = json!({
        "node": {"id": "halo-e2e", "cluster": "halo-e2e"},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
        "static_resources": {
            "listeners": [{"name": "main",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
                "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                    "stat_prefix": "main",
                    "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [{
                        "match": {"prefix": "/"},
                        "route": {"cluster": "agg", "retry_policy": {
                            "retry_on": "5xx,connect-failure,retriable-status-codes",
                            "retriable_status_codes": [429],
                            "num_retries": 2,
                            "retry_priority": {"name": "envoy.retry_priorities.previous_priorities", "typed_config": {
                                "@type": "type.googleapis.com/envoy.extensions.retry.priority.previous_priorities.v3.PreviousPrioritiesConfig",
                                "update_frequency": 1}}}}}]}]},
                    "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]
                }}]}]}],
            "clusters": clusters
        }
    });
    // JSON is YAML: Envoy reads it from the .yaml bootstrap as is.
    config.to_string()
}

/// The SDS file holding the Anthropic key, replaced atomically to rotate it.
fn write_key(path: &Path, key: &str) {
    let doc = json!({"resources": [{
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret",
        "name": "anthropic-key",
        "generic_secret": {"secret": {"inline_string": key}}}]});
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, doc.to_string()).expect("write key");
    std::fs::rename(&tmp, path).expect("rename key");
}

/// What the AWS default chain may read, pointed at nothing but (optionally) the test's key
/// pair.
fn aws_env(home: &str, with_credentials: bool) -> Vec<(&str, Option<&str>)> {
    let key = with_credentials.then_some((ACCESS_KEY, SECRET_KEY));
    let mut env = halo_testkit::envoy::aws_chain_env(key);
    env.push(("HOME", Some(home)));
    env
}

struct Setup {
    _envoy: Envoy,
    _dir: tempfile::TempDir,
    port: u16,
    sds_path: std::path::PathBuf,
}

fn start(targets: &[Target<'_>], with_credentials: bool) -> Setup {
    let dir = tempfile::tempdir().expect("temp dir");
    // The SDS file sits in a directory of its own: Envoy watches the whole directory.
    let sds_dir = dir.path().join("sds");
    let home = dir.path().join("home");
    std::fs::create_dir_all(&sds_dir).expect("sds dir");
    std::fs::create_dir_all(&home).expect("home dir");
    let sds_path = sds_dir.join("anthropic-key.yaml");
    write_key(&sds_path, "sk-ant-first");
    let (port, admin) = (free_port(), free_port());
    let home = home.display().to_string();
    let envoy = Envoy::start_with_env(
        &bootstrap(port, admin, targets, &sds_path),
        admin,
        &aws_env(&home, with_credentials),
    );
    Setup {
        _envoy: envoy,
        _dir: dir,
        port,
        sds_path,
    }
}

async fn post_messages(port: u16) -> (StatusCode, Value) {
    let client = client_builder().build().expect("client");
    let response = client
        .post(format!("http://127.0.0.1:{port}/v1/messages"))
        // A client credential that must never reach any provider.
        .header("authorization", "Bearer client-token")
        .header("x-api-key", "client-key")
        .header("content-type", "application/json")
        .body(r#"{"model":"opus","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}"#)
        .timeout(Duration::from_secs(20))
        .send()
        .await
        .expect("request through Envoy");
    let status = response.status();
    let body = response.json::<Value>().await.unwrap_or(Value::Null);
    (status, body)
}

#[test]
fn the_verifier_rejects_a_tampered_body() {
    // The fake must be able to fail: a request signed by aws-sigv4 verifies, and the same
    // request with one body byte changed does not.
    use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
    let identity =
        aws_credential_types::Credentials::new(ACCESS_KEY, SECRET_KEY, None, None, "t").into();
    let mut settings = SigningSettings::default();
    settings.payload_checksum_kind = aws_sigv4::http_request::PayloadChecksumKind::XAmzSha256;
    let params = aws_sigv4::sign::v4::SigningParams::builder()
        .identity(&identity)
        .region(REGION)
        .name("bedrock")
        .time(std::time::SystemTime::now())
        .settings(settings)
        .build()
        .expect("params")
        .into();
    let body = br#"{"anthropic_version":"bedrock-2023-05-31"}"#;
    let headers = [
        ("host", "bedrock-runtime.us-east-1.amazonaws.com"),
        ("content-type", "application/json"),
    ];
    let signable = SignableRequest::new(
        "POST",
        format!("https://bedrock-runtime.us-east-1.amazonaws.com{BEDROCK_PATH}"),
        headers.into_iter(),
        SignableBody::Bytes(body),
    )
    .expect("signable");
    let (instructions, _) = sign(signable, &params).expect("sign").into_parts();
    let mut received: Vec<(String, String)> = headers
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    received.extend(
        instructions
            .headers()
            .map(|(n, v)| (n.to_string(), v.to_string())),
    );
    let check = |body: &[u8]| {
        halo_e2e::bedrock::verify(
            "POST",
            BEDROCK_PATH,
            &received,
            body,
            REGION,
            ACCESS_KEY,
            SECRET_KEY,
        )
    };
    assert_eq!(check(body), Ok(()));
    let mut tampered = body.to_vec();
    tampered[5] ^= 1;
    assert!(check(&tampered).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bedrock_gets_a_sigv4_signature_over_the_final_body() {
    let bedrock = FakeBedrock::start(REGION, StatusCode::OK).await;
    let setup = start(
        &[Target {
            cluster: "t-bedrock",
            kind: "bedrock",
            port: bedrock.port,
        }],
        true,
    );
    let (status, body) = post_messages(setup.port).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["content"][0]["text"], "signed and served");

    let seen = bedrock.seen();
    assert_eq!(seen.len(), 1);
    let got = &seen[0];
    assert_eq!(
        got.verdict,
        Ok(()),
        "the fake recomputed a different signature"
    );
    assert_eq!(got.seen.path, BEDROCK_PATH);
    assert_eq!(got.seen.json()["anthropic_version"], "bedrock-2023-05-31");
    let auth = got.seen.header("authorization").unwrap_or_default();
    assert!(
        auth.contains(&format!("Credential={ACCESS_KEY}/")),
        "{auth}"
    );
    assert!(auth.contains("/us-east-1/bedrock/aws4_request"), "{auth}");
    // Neither the client's credentials nor the marker reach the provider.
    assert_eq!(got.seen.header("x-api-key"), None);
    assert_eq!(got.seen.header("x-halo-target"), None);
    assert!(!auth.contains("client-token"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_from_bedrock_gives_anthropic_its_own_credential_and_no_aws_header() {
    let bedrock = FakeBedrock::start(REGION, StatusCode::SERVICE_UNAVAILABLE).await;
    let anthropic = Provider::start("anthropic").await;
    let anthropic_port: u16 = anthropic
        .url
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("provider port");
    let setup = start(
        &[
            Target {
                cluster: "t-bedrock",
                kind: "bedrock",
                port: bedrock.port,
            },
            Target {
                cluster: "t-anthropic",
                kind: "anthropic",
                port: anthropic_port,
            },
        ],
        true,
    );
    let (status, body) = post_messages(setup.port).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["provider"], "anthropic");

    // The first attempt was signed (and verified) before Bedrock answered 503.
    let signed = bedrock.seen();
    assert_eq!(signed.len(), 1);
    assert_eq!(signed[0].verdict, Ok(()));

    let seen = anthropic.seen();
    assert_eq!(seen.len(), 1);
    let got = &seen[0];
    assert_eq!(got.path, "/v1/messages");
    assert_eq!(got.json()["model"], ANTHROPIC_MODEL);
    assert_eq!(got.header("x-api-key"), Some("sk-ant-first"));
    for leaked in [
        "authorization",
        "x-amz-date",
        "x-amz-content-sha256",
        "x-amz-security-token",
        "x-halo-target",
    ] {
        assert_eq!(
            got.header(leaked),
            None,
            "{leaked} reached the anthropic target"
        );
    }

    // Rotating the key file changes the credential without a restart.
    write_key(&setup.sds_path, "sk-ant-second");
    let port = setup.port;
    let handle = tokio::runtime::Handle::current();
    let anthropic2 = anthropic.clone();
    tokio::task::spawn_blocking(move || {
        wait_until("the rotated key in use", Duration::from_secs(15), || {
            let (status, _) = handle.block_on(post_messages(port));
            assert_eq!(status, StatusCode::OK);
            let last = anthropic2.seen().pop()?;
            (last.header("x-api-key") == Some("sk-ant-second")).then_some(())
        })
    })
    .await
    .expect("rotation poll");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_aws_credentials_is_502_and_nothing_is_sent_unsigned() {
    let bedrock = FakeBedrock::start(REGION, StatusCode::OK).await;
    let setup = start(
        &[Target {
            cluster: "t-bedrock",
            kind: "bedrock",
            port: bedrock.port,
        }],
        false,
    );
    let (status, body) = post_messages(setup.port).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert_eq!(body["error"]["type"], "upstream_auth_error");
    assert_eq!(bedrock.count(), 0, "an unsigned request reached Bedrock");
}

#[test]
fn the_fakes_signer_reproduces_the_aws_sigv4_test_suite_vector() {
    // aws-signing-test-suite v4/post-vanilla (shipped with aws-sigv4): the signer the fake
    // Bedrock verifies with must compute AWS's own expected signature.
    use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
    let identity = aws_credential_types::Credentials::new(
        "AKIDEXAMPLE",
        "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
        None,
        None,
        "suite",
    )
    .into();
    let time = std::time::UNIX_EPOCH + Duration::from_secs(1_440_938_160); // 2015-08-30T12:36:00Z
    let params = aws_sigv4::sign::v4::SigningParams::builder()
        .identity(&identity)
        .region("us-east-1")
        .name("service")
        .time(time)
        .settings(SigningSettings::default())
        .build()
        .expect("params")
        .into();
    let signable = SignableRequest::new(
        "POST",
        "https://example.amazonaws.com/",
        [("host", "example.amazonaws.com")].into_iter(),
        SignableBody::Bytes(b""),
    )
    .expect("signable");
    let (_, signature) = sign(signable, &params).expect("sign").into_parts();
    assert_eq!(
        signature,
        "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b"
    );
}
