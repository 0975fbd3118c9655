//! The halo-credentials binary against a fake Google on loopback: tokens from a
//! service-account key (the assertion verified with the key's public half) and from the
//! metadata server, published in an SDS file, refreshed before expiry, kept on failure.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use halo_testkit::wait_until;
use support::{
    FOREIGN_KEY_PEM, FakeGoogle, Process, SA_KEY_PEM, assert_no_secret, token_in, token_name,
    write_key_file,
};

const POLL: Duration = Duration::from_secs(30);

/// Poll (off the runtime's threads, so the fake keeps serving) until `probe` is Some.
async fn poll<T: Send + 'static>(
    what: &'static str,
    probe: impl FnMut() -> Option<T> + Send + 'static,
) -> T {
    tokio::task::spawn_blocking(move || wait_until(what, POLL, probe))
        .await
        .expect("poll")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_file_token_is_published_and_refreshed_before_it_expires() {
    // Six-second tokens, no margin: refreshed at half-life, 3 s after minting.
    let google = FakeGoogle::start(6).await;
    let dir = tempfile::tempdir().unwrap();
    let key = write_key_file(dir.path(), &google.token_uri(), SA_KEY_PEM);
    std::fs::create_dir(dir.path().join("sds")).unwrap();
    let sds = dir.path().join("sds/vertex.yaml");
    let mut process = Process::start(
        &[
            "vertex",
            "--sds-file",
            sds.to_str().unwrap(),
            "--secret-name",
            "vertex-token",
            "--key-file",
            key.to_str().unwrap(),
            "--refresh-before",
            "0",
        ],
        &[],
    );

    let path = sds.clone();
    poll("the first token in the SDS file", move || {
        (token_in(&path)? == token_name(1)).then_some(())
    })
    .await;
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&sds).unwrap()).unwrap();
    assert_eq!(
        doc,
        serde_json::json!({"resources": [{
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret",
            "name": "vertex-token",
            "generic_secret": {"secret": {"inline_string": "Bearer ya29.fake-1"}}}]})
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&sds).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the SDS file is owner-only");
    }

    let path = sds.clone();
    poll("the refreshed token in the SDS file", move || {
        (token_in(&path)? == token_name(2)).then_some(())
    })
    .await;
    let first = google.issued_at(1).unwrap();
    let second = google.issued_at(2).unwrap();
    assert!(
        second < first + 6.0,
        "the second token was minted before the first expired ({first} -> {second})"
    );
    assert!(
        second >= first + 2.0,
        "not refreshed before half-life ({first} -> {second})"
    );
    assert_eq!(google.refused(), 0, "every assertion verified");
    assert!(process.is_running());
    let names: Vec<_> = std::fs::read_dir(dir.path().join("sds"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["vertex.yaml"], "no temp file left beside it");
    assert_no_secret(&process.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_refresh_keeps_the_published_token_and_retries() {
    // Two-minute tokens: less than the default 5-minute margin, so refreshed after 1 s.
    let google = FakeGoogle::start(120).await;
    google.fail_after(1);
    let dir = tempfile::tempdir().unwrap();
    let key = write_key_file(dir.path(), &google.token_uri(), SA_KEY_PEM);
    let sds = dir.path().join("vertex.json");
    let process = Process::start(
        &[
            "vertex",
            "--sds-file",
            sds.to_str().unwrap(),
            "--key-file",
            key.to_str().unwrap(),
        ],
        &[],
    );
    let path = sds.clone();
    poll("the first token", move || {
        (token_in(&path)? == token_name(1)).then_some(())
    })
    .await;
    let published = std::fs::read(&sds).unwrap();

    let g = google.clone();
    poll("two failed refreshes", move || {
        (g.failed() >= 2).then_some(())
    })
    .await;
    assert_eq!(
        std::fs::read(&sds).unwrap(),
        published,
        "a failed refresh left the file as it was"
    );
    let logs = process.logs();
    assert!(
        logs.contains("refresh failed; the published token stays") && logs.contains("503"),
        "the failure is logged with its status:\n{logs}"
    );

    google.recover();
    let path = sds.clone();
    poll("a token after recovery", move || {
        (token_in(&path)? == token_name(2)).then_some(())
    })
    .await;
    assert_no_secret(&process.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metadata_server_serves_tokens_by_flag_and_by_adc() {
    let google = FakeGoogle::start(3600).await;
    let dir = tempfile::tempdir().unwrap();
    let sds = dir.path().join("vertex.yaml");
    let sds_arg = sds.to_str().unwrap().to_string();
    let base = google.metadata_base();
    let (code, logs) = tokio::task::spawn_blocking(move || {
        Process::run(
            &[
                "vertex",
                "--sds-file",
                &sds_arg,
                "--metadata-server",
                &base,
                "--once",
            ],
            &[],
        )
    })
    .await
    .unwrap();
    assert_eq!(code, 0, "{logs}");
    assert_eq!(token_in(&sds).as_deref(), Some("ya29.fake-1"));
    assert_no_secret(&logs);

    // No source given, no GOOGLE_APPLICATION_CREDENTIALS: GCE_METADATA_HOST, as Google's
    // libraries read it.
    let sds_arg = sds.to_str().unwrap().to_string();
    let host = format!("127.0.0.1:{}", google.port);
    let (code, logs) = tokio::task::spawn_blocking(move || {
        Process::run(
            &["vertex", "--sds-file", &sds_arg, "--once"],
            &[("GCE_METADATA_HOST", &host)],
        )
    })
    .await
    .unwrap();
    assert_eq!(code, 0, "{logs}");
    assert_eq!(token_in(&sds).as_deref(), Some("ya29.fake-2"));
    assert_eq!(
        google.metadata_flavors(),
        [Some("Google".to_string()), Some("Google".to_string())]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adc_reads_google_application_credentials() {
    let google = FakeGoogle::start(3600).await;
    let dir = tempfile::tempdir().unwrap();
    let key = write_key_file(dir.path(), &google.token_uri(), SA_KEY_PEM);
    let sds = dir.path().join("vertex.yaml");
    let sds_arg = sds.to_str().unwrap().to_string();
    let key_arg = key.to_str().unwrap().to_string();
    let (code, logs) = tokio::task::spawn_blocking(move || {
        Process::run(
            &["vertex", "--sds-file", &sds_arg, "--once"],
            // The metadata server is unreachable: only the key file can serve.
            &[
                ("GOOGLE_APPLICATION_CREDENTIALS", &key_arg),
                ("GCE_METADATA_HOST", "127.0.0.1:9"),
            ],
        )
    })
    .await
    .unwrap();
    assert_eq!(code, 0, "{logs}");
    assert_eq!(token_in(&sds).as_deref(), Some("ya29.fake-1"));
    assert_eq!(google.refused(), 0);
    assert!(google.metadata_flavors().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_assertion_signed_by_another_key_is_refused_and_nothing_is_written() {
    let google = FakeGoogle::start(3600).await;
    let dir = tempfile::tempdir().unwrap();
    let key = write_key_file(dir.path(), &google.token_uri(), FOREIGN_KEY_PEM);
    let sds = dir.path().join("vertex.yaml");
    let (sds_arg, key_arg) = (
        sds.to_str().unwrap().to_string(),
        key.to_str().unwrap().to_string(),
    );
    let (code, logs) = tokio::task::spawn_blocking(move || {
        Process::run(
            &[
                "vertex",
                "--sds-file",
                &sds_arg,
                "--key-file",
                &key_arg,
                "--once",
            ],
            &[],
        )
    })
    .await
    .unwrap();
    assert_eq!(code, 1, "{logs}");
    assert!(
        logs.contains("400") && logs.contains("invalid_grant"),
        "{logs}"
    );
    assert!(
        !logs.contains("Invalid JWT Signature"),
        "the error description is not logged:\n{logs}"
    );
    assert_eq!(google.refused(), 1);
    assert!(!sds.exists());
    assert_no_secret(&logs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_key_file_is_a_usage_error_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let key = write_key_file(
        dir.path(),
        "https://oauth2.googleapis.com/token",
        SA_KEY_PEM,
    );
    let mut doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&key).unwrap()).unwrap();
    doc["private_key_passphrase"] = "x".into();
    std::fs::write(&key, doc.to_string()).unwrap();
    let sds = dir.path().join("vertex.yaml");
    let (sds_arg, key_arg) = (
        sds.to_str().unwrap().to_string(),
        key.to_str().unwrap().to_string(),
    );
    let (code, logs) = tokio::task::spawn_blocking(move || {
        Process::run(
            &["vertex", "--sds-file", &sds_arg, "--key-file", &key_arg],
            &[],
        )
    })
    .await
    .unwrap();
    assert_eq!(code, 2, "{logs}");
    assert!(
        logs.contains("sa.json") && logs.contains("private_key_passphrase"),
        "{logs}"
    );
    assert_no_secret(&logs);
    assert!(!sds.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_not_a_metadata_server_is_not_trusted() {
    // Answers like the metadata server but without `Metadata-Flavor: Google`: a captive
    // portal or a proxy, whose "token" must not be published.
    let app = axum::Router::new().fallback(|| async {
        axum::Json(serde_json::json!({
            "access_token": "ya29.fake-impostor", "expires_in": 3600, "token_type": "Bearer"}))
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let dir = tempfile::tempdir().unwrap();
    let sds = dir.path().join("vertex.yaml");
    let sds_arg = sds.to_str().unwrap().to_string();
    let (code, logs) = tokio::task::spawn_blocking(move || {
        Process::run(
            &[
                "vertex",
                "--sds-file",
                &sds_arg,
                "--metadata-server",
                &base,
                "--once",
            ],
            &[],
        )
    })
    .await
    .unwrap();
    assert_eq!(code, 1, "{logs}");
    assert!(logs.contains("not a metadata server"), "{logs}");
    assert!(!sds.exists());
    assert_no_secret(&logs);
}
