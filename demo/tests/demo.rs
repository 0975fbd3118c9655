//! halo-demo end to end: the binary starts halo-server (xDS), a real Envoy from
//! envoy/ads.yaml, the demo provider and the demo issuer; the curl line it prints works
//! as printed; its token gets a 200 from the demo provider through Envoy (JSON and SSE)
//! and no token gets a 401; Ctrl-C (SIGINT) stops it cleanly and takes Envoy down.
//! `--once` does the same checks itself and exits 0.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use halo_testkit::{free_port, http, wait_until};
use serde_json::Value;

/// Envoy compiling the wasm module plus the first ADS push, on a busy 2-core machine.
const START: Duration = Duration::from_secs(120);

struct Demo {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
    port: u16,
    admin: u16,
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(extra: &[&str]) -> Demo {
    let (port, admin) = (free_port(), free_port());
    let mut child = Command::new(env!("CARGO_BIN_EXE_halo-demo"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--envoy-admin", &format!("127.0.0.1:{admin}")])
        .args(["--xds-listen", "127.0.0.1:0"])
        .args(["--server-listen", "127.0.0.1:0"])
        .args(["--server-admin-listen", "127.0.0.1:0"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start halo-demo");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Demo {
        child,
        lines,
        seen: Vec::new(),
        port,
        admin,
    }
}

impl Demo {
    /// The first stdout line satisfying `want` (bounded); panics with what was printed.
    fn line(&mut self, what: &str, want: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + START;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.seen.push(l.clone());
                    if want(&l) {
                        return l;
                    }
                }
                Err(_) => panic!(
                    "halo-demo never printed {what} (exit: {:?}); it printed:\n{}",
                    self.child.try_wait().ok().flatten(),
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// POST through Envoy with a real HTTP client: the filter may answer (401) before it
    /// reads the body, and a probe client reading after `Connection: close` could then see
    /// the kernel's reset instead of the answer.
    fn post(&self, token: Option<&str>, body: &str) -> http::Response {
        // reqwest's rustls needs a process-wide provider; Err: already installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .expect("http client");
        let mut req = client
            .post(format!("http://127.0.0.1:{}/v1/messages", self.port))
            .header("content-type", "application/json")
            .body(body.to_string());
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().unwrap_or_else(|e| panic!("Envoy answers: {e}"));
        let status = resp.status().as_u16();
        let body = resp.text().unwrap_or_else(|e| panic!("Envoy's body: {e}"));
        http::Response { status, body }
    }
}

fn body(stream: bool) -> String {
    format!(
        r#"{{"model":"default","max_tokens":16,"stream":{stream},"messages":[{{"role":"user","content":"hi"}}]}}"#
    )
}

#[test]
fn the_printed_curl_line_and_token_work_through_envoy_and_ctrl_c_cleans_up() {
    let mut demo = start(&["--model", "default"]);
    let curl = demo.line("the curl line", |l| l.trim_start().starts_with("curl -s "));
    let printed = demo.seen.join("\n");
    // The overrides are said, not silent.
    assert!(printed.contains("demo mode overrides"), "{printed}");
    assert!(
        printed.contains("upstream anthropic-direct")
            && printed.contains("https://api.anthropic.com"),
        "{printed}"
    );
    assert!(
        printed.contains("identity.issuer https://acme.okta.com"),
        "{printed}"
    );
    let token = curl
        .split("authorization: Bearer ")
        .nth(1)
        .and_then(|rest| rest.split('\'').next())
        .expect("the curl line carries the token")
        .to_string();

    // The line works as printed (a real curl through a shell).
    let out = Command::new("sh")
        .args(["-c", curl.trim()])
        .output()
        .expect("run curl");
    let reply: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert_eq!(
        reply["type"],
        "message",
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    // With the token: 200 from the demo provider, the alias rewritten to a target's model.
    let r = demo.post(Some(&token), &body(false));
    assert_eq!(r.status, 200, "{}", r.body);
    let reply: Value = serde_json::from_str(&r.body).expect("JSON reply");
    assert_eq!(reply["role"], "assistant");
    let model = reply["model"].as_str().unwrap_or_default();
    assert!(
        model.starts_with("claude-") && model != "default",
        "the filter routed the alias to a policy target: {reply}"
    );
    // Streamed: Anthropic's SSE events through Envoy, to the end.
    let r = demo.post(Some(&token), &body(true));
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.starts_with("event: message_start"), "{}", r.body);
    assert!(r.body.contains("event: message_stop"), "{}", r.body);

    // Without a token, or with a forged one: 401.
    let r = demo.post(None, &body(false));
    assert_eq!(r.status, 401, "{}", r.body);
    let mut forged = token.clone();
    forged.truncate(forged.len() - 4);
    forged.push_str("AAAA");
    let r = demo.post(Some(&forged), &body(false));
    assert_eq!(r.status, 401, "{}", r.body);

    // Ctrl-C: a clean exit, and no Envoy left behind.
    let pid = demo.child.id().to_string();
    let sent = Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .expect("kill -INT");
    assert!(sent.success());
    let status = wait_until("halo-demo to exit", Duration::from_secs(30), || {
        demo.child.try_wait().ok().flatten()
    });
    assert!(status.success(), "exit {status:?}");
    let admin = demo.admin;
    wait_until(
        "Envoy's admin port to close",
        Duration::from_secs(10),
        || http::get(admin, "/ready").is_none().then_some(()),
    );
    demo.line("the stop line", |l| l.starts_with("halo-demo: stopped"));
}

#[test]
fn once_checks_200_stream_and_401_then_exits_0() {
    let mut demo = start(&["--once"]);
    demo.line("the passed checks", |l| l == "halo-demo: all checks passed");
    let status = wait_until("halo-demo --once to exit", Duration::from_secs(30), || {
        demo.child.try_wait().ok().flatten()
    });
    assert!(status.success(), "exit {status:?}");
    let printed = demo.seen.join("\n");
    assert!(printed.contains("check: 401 without a token"), "{printed}");
    assert!(
        printed.contains("check: 200 text/event-stream"),
        "{printed}"
    );
    assert!(http::get(demo.admin, "/ready").is_none(), "Envoy still up");
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

#[test]
fn a_policy_edit_while_running_is_pushed_with_the_demo_overrides() {
    let dir = tempfile::tempdir().expect("temp dir");
    let policy = dir.path().join("policy");
    copy_dir(
        &halo_testkit::workspace_root().join("examples/acme-corp"),
        &policy,
    );
    let mut demo = start(&["--policy-dir", policy.to_str().expect("utf-8 path")]);
    let curl = demo.line("the curl line", |l| l.trim_start().starts_with("curl -s "));
    let token = curl
        .split("authorization: Bearer ")
        .nth(1)
        .and_then(|rest| rest.split('\'').next())
        .expect("token")
        .to_string();
    let haiku = r#"{"model":"haiku","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}"#;
    let r = demo.post(Some(&token), haiku);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        serde_json::from_str::<Value>(&r.body).expect("JSON")["model"],
        "claude-haiku-4-5-20251001"
    );

    // haiku moves to an upstream that did not exist at start: it too is overridden to the
    // demo provider (its real URL would not even resolve), and the new model id arrives.
    let gateway = policy.join("gateway.yaml");
    let yaml = std::fs::read_to_string(&gateway).expect("gateway.yaml");
    let edited = yaml
        .replace(
            "upstreams:\n",
            "upstreams:\n  added-later:\n    url: https://added-later.invalid\n    kind: anthropic\n",
        )
        .replace(
            "    upstream: anthropic-direct\n    model: claude-haiku-4-5-20251001",
            "    upstream: added-later\n    model: claude-haiku-edited",
        );
    assert_ne!(edited, yaml, "the example's haiku route changed shape");
    std::fs::write(&gateway, edited).expect("edit gateway.yaml");
    wait_until("the edit to reach Envoy", Duration::from_secs(20), || {
        let r = demo.post(Some(&token), haiku);
        let v: Value = serde_json::from_str(&r.body).unwrap_or(Value::Null);
        (r.status == 200 && v["model"] == "claude-haiku-edited").then_some(())
    });
}
