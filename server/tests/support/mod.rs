//! Test harness: a policy dir whose identity issuer is halo-testkit's fake OIDC issuer on
//! loopback, keys and tokens in a temp dir, and halo-server started in-process on
//! ephemeral loopback ports.
#![allow(dead_code)]

pub mod controller;
pub mod gateway;

use std::path::{Path, PathBuf};
use std::time::Duration;

use halo_server::config::Settings;
use halo_server::server::{Running, start};
use halo_testkit::oidc::FakeIssuer;
use serde_json::{Value, json};

pub const GATEWAY_TOKEN: &str = "3f9a1c7e5b2d8046af13ce97b0d24e6c58a7f31d9e0b6c24f8a5173d0e9c6b12";
pub const FLEET_TOKEN: &str = "c0ffee5a1b2d8046af13ce97b0d24e6c58a7f31d9e0b6c24f8a5173d0e9c6b77";

pub struct Env {
    pub dir: tempfile::TempDir,
    pub issuer: FakeIssuer,
    pub killswitch_pub: ed25519_compact::PublicKey,
}

impl Env {
    pub async fn new() -> Env {
        let issuer = FakeIssuer::start();
        let dir = tempfile::tempdir().unwrap();
        let policy = dir.path().join("policy");
        copy_dir(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/acme-corp"),
            &policy,
        );
        let root = policy.join("halos.yaml");
        let text = std::fs::read_to_string(&root).unwrap();
        let text = text.replace(
            "https://acme.okta.com/oauth2/aus9halos2acme7corp",
            &issuer.issuer,
        );
        std::fs::write(&root, text).unwrap();
        let pair = halo_policy::keys::generate().unwrap();
        std::fs::write(
            dir.path().join("killswitch.key"),
            pair.private_pem.as_bytes(),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("gateway.token"),
            format!("{GATEWAY_TOKEN}\n"),
        )
        .unwrap();
        std::fs::write(dir.path().join("fleet.token"), FLEET_TOKEN).unwrap();
        std::fs::write(dir.path().join("oidc-ca.pem"), &issuer.ca_pem).unwrap();
        let killswitch_pub = halo_policy::keys::public_key_from_pem(&pair.public_pem).unwrap();
        Env {
            dir,
            issuer,
            killswitch_pub,
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Set these running experiments of the policy dir to `status: paused` (before the
    /// server starts): the example's session-metric experiments, whose evidence the
    /// gateway's store does not compute, so a controller tick would fail on them.
    pub fn pause_experiments(&self, names: &[&str]) {
        for name in names {
            let f = self.path("policy").join(format!("experiments/{name}.yaml"));
            let text = std::fs::read_to_string(&f).unwrap();
            assert!(text.contains("\nstatus: running\n"), "{name} is running");
            std::fs::write(
                &f,
                text.replace("\nstatus: running\n", "\nstatus: paused\n"),
            )
            .unwrap();
        }
    }

    /// Settings with the kill switch on (key, gateway token, data dir) and the fleet token.
    pub fn settings(&self) -> Settings {
        Settings {
            listen: "127.0.0.1:0".parse().unwrap(),
            admin_listen: "127.0.0.1:0".parse().unwrap(),
            policy_dir: self.path("policy"),
            data_dir: Some(self.path("data")),
            killswitch_key_file: Some(self.path("killswitch.key")),
            gateway_token_file: Some(self.path("gateway.token")),
            token_file: Some(self.path("fleet.token")),
            device_ttl: Duration::from_secs(3600),
            enrollment_ttl: Duration::from_secs(3600),
            oidc_ca_file: Some(self.path("oidc-ca.pem")),
            max_body_bytes: 4096,
            xds_listen: None,
            xds_gateway_file: None,
            evidence: Default::default(),
            shadow: Default::default(),
            budget: Default::default(),
            console_url: None,
            controller: Default::default(),
        }
    }

    pub fn settings_without_kill_switch(&self) -> Settings {
        Settings {
            killswitch_key_file: None,
            gateway_token_file: None,
            ..self.settings()
        }
    }

    pub fn admin_token(&self) -> String {
        self.issuer.mint(json!({
            "aud": "api://halos", "sub": "u-alice", "email": "alice@acme.com",
            "email_verified": true, "groups": ["engineering", "halos-admins"],
        }))
    }

    pub fn user_token(&self) -> String {
        self.issuer.mint(json!({
            "aud": "api://halos", "sub": "u-dave", "email": "dave@acme.com",
            "email_verified": true, "groups": ["engineering"],
        }))
    }

    pub fn log_lines(&self, file: &str) -> Vec<Value> {
        match std::fs::read_to_string(self.path("data").join(file)) {
            Ok(text) => text
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(|l| serde_json::from_str(l).unwrap())
                .collect(),
            Err(_) => Vec::new(),
        }
    }
}

pub async fn serve(settings: &Settings) -> Server {
    let running = start(settings).await.unwrap();
    Server {
        base: format!("http://{}", running.api_addr),
        admin_base: format!("http://{}", running.admin_addr),
        running: Some(running),
        http: reqwest::Client::new(),
    }
}

pub struct Server {
    pub base: String,
    pub admin_base: String,
    pub running: Option<Running>,
    pub http: reqwest::Client,
}

/// A response: status and JSON body (Null if the body is not JSON).
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub body: Value,
    pub raw: Vec<u8>,
}

impl Server {
    /// The running server's kill switch (it has a kill key).
    pub fn killswitch(&self) -> std::sync::Arc<halo_killswitch::KillSwitch> {
        let running = self.running.as_ref().expect("running");
        running.killswitch().cloned().expect("a kill key")
    }

    /// The running server's controller (`--controller`).
    pub fn controller(&self) -> std::sync::Arc<halo_controller::controller::Controller> {
        let running = self.running.as_ref().expect("running");
        running.controller.clone().expect("the controller is on")
    }

    pub async fn stop(mut self) {
        if let Some(r) = self.running.take() {
            r.shutdown().await;
        }
    }

    pub async fn send(&self, req: reqwest::RequestBuilder) -> Reply {
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let raw = resp.bytes().await.unwrap().to_vec();
        let body = serde_json::from_slice(&raw).unwrap_or(Value::Null);
        Reply { status, body, raw }
    }

    pub async fn get(&self, path: &str, bearer: Option<&str>) -> Reply {
        let mut req = self.http.get(format!("{}{path}", self.base));
        if let Some(t) = bearer {
            req = req.bearer_auth(t);
        }
        self.send(req).await
    }

    pub async fn post(&self, path: &str, bearer: Option<&str>, body: Value) -> Reply {
        let mut req = self.http.post(format!("{}{path}", self.base)).json(&body);
        if let Some(t) = bearer {
            req = req.bearer_auth(t);
        }
        self.send(req).await
    }

    pub async fn post_raw(&self, path: &str, bearer: &str, body: Vec<u8>) -> Reply {
        let req = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(bearer)
            .header("content-type", "application/json")
            .body(body);
        self.send(req).await
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}
