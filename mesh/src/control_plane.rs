//! halo-server in Kubernetes: ServiceAccount, the policy as a ConfigMap, Deployment,
//! Service (the API port only) and a NetworkPolicy that keeps the admin port (/healthz,
//! /metrics) private to the monitoring namespace.
//!
//! Secrets are referenced, never rendered: the kill-switch signing key, the gateway token
//! and the fleet token are mounted read-only from Secrets the operator creates
//! (`kubectl create secret generic ...`), so no secret value passes through this
//! renderer or lands in a manifest file.

use serde_json::{Value, json};

use crate::{MeshError, labels};

/// halo-server's API port (admin API, enrollment, fleet, kill list).
pub const API_PORT: u16 = 8080;
/// halo-server's admin port (/healthz, /metrics).
pub const ADMIN_PORT: u16 = 9090;

/// What the control-plane manifests are rendered from.
#[derive(Debug, Clone)]
pub struct ControlPlaneOptions {
    pub namespace: String,
    /// The halo-server container image (pin it by digest).
    pub image: String,
    /// The policy repo's files: (path relative to the repo root, contents).
    pub policy_files: Vec<(String, String)>,
    /// Secret holding `killswitch.key` (the ed25519 signing key, PEM).
    pub killswitch_key_secret: String,
    /// Secret holding `gateway.token` (the token gateways present for the kill list).
    pub gateway_token_secret: String,
    /// Secret holding `fleet.token` (devices' report token).
    pub fleet_token_secret: String,
    /// PersistentVolumeClaim for halo-server's data dir.
    pub data_claim: String,
    /// Namespace label value allowed to scrape the admin port.
    pub monitoring_namespace: String,
}

fn metadata(name: &str, ns: &str) -> Value {
    json!({"name": name, "namespace": ns, "labels": labels()})
}

/// The ConfigMap key of a policy file: `/` is not allowed in keys.
fn key_of(path: &str) -> String {
    path.replace('/', "__")
}

/// Every control-plane manifest.
pub fn render(opts: &ControlPlaneOptions) -> Result<Vec<Value>, MeshError> {
    let ns = opts.namespace.as_str();
    let app = json!({"app.kubernetes.io/name": "halo-server"});
    let mut data = serde_json::Map::new();
    let mut items = Vec::new();
    for (path, text) in &opts.policy_files {
        let key = key_of(path);
        let valid = !key.is_empty()
            && key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !valid || data.contains_key(&key) {
            return Err(MeshError::Option(format!(
                "policy file {path:?} cannot be a ConfigMap key (letters, digits, - _ . and / only)"
            )));
        }
        data.insert(key.clone(), json!(text));
        items.push(json!({"key": key, "path": path}));
    }
    let secret_volume = |name: &str, secret: &str, key: &str| json!({"name": name, "secret": {"secretName": secret, "defaultMode": 0o400, "items": [{"key": key, "path": key}]}});
    let mut meta = metadata("halo-server", ns);
    meta["labels"]["app.kubernetes.io/name"] = json!("halo-server");
    Ok(vec![
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta,
               // halo-server calls no Kubernetes API.
               "automountServiceAccountToken": false}),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata("halo-policy", ns), "data": data}),
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta,
            "spec": {
                // One writer: the data dir is a ReadWriteOnce volume.
                "replicas": 1,
                "strategy": {"type": "Recreate"},
                "selector": {"matchLabels": app},
                "template": {
                    "metadata": {"labels": app},
                    "spec": {
                        "serviceAccountName": "halo-server",
                        "automountServiceAccountToken": false,
                        "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "fsGroup": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
                        "containers": [{
                            "name": "halo-server",
                            "image": opts.image,
                            "args": [
                                "--listen", format!("0.0.0.0:{API_PORT}"),
                                // Pod-wide so the kubelet's probes reach it; the
                                // NetworkPolicy keeps it from everyone else.
                                "--admin-listen", format!("0.0.0.0:{ADMIN_PORT}"),
                                "--policy-dir", "/etc/halos/policy",
                                "--data-dir", "/var/lib/halos",
                                "--killswitch-key-file", "/etc/halos/killswitch/killswitch.key",
                                "--gateway-token-file", "/etc/halos/gateway/gateway.token",
                                "--token-file", "/etc/halos/fleet/fleet.token",
                            ],
                            "ports": [
                                {"name": "api", "containerPort": API_PORT},
                                {"name": "admin", "containerPort": ADMIN_PORT},
                            ],
                            "readinessProbe": {"httpGet": {"path": "/healthz", "port": "admin"}, "periodSeconds": 5},
                            "livenessProbe": {"httpGet": {"path": "/healthz", "port": "admin"}, "periodSeconds": 20},
                            "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true, "capabilities": {"drop": ["ALL"]}},
                            "volumeMounts": [
                                {"name": "policy", "mountPath": "/etc/halos/policy", "readOnly": true},
                                {"name": "data", "mountPath": "/var/lib/halos"},
                                {"name": "killswitch-key", "mountPath": "/etc/halos/killswitch", "readOnly": true},
                                {"name": "gateway-token", "mountPath": "/etc/halos/gateway", "readOnly": true},
                                {"name": "fleet-token", "mountPath": "/etc/halos/fleet", "readOnly": true},
                            ],
                        }],
                        "volumes": [
                            {"name": "policy", "configMap": {"name": "halo-policy", "items": items}},
                            {"name": "data", "persistentVolumeClaim": {"claimName": opts.data_claim}},
                            secret_volume("killswitch-key", &opts.killswitch_key_secret, "killswitch.key"),
                            secret_volume("gateway-token", &opts.gateway_token_secret, "gateway.token"),
                            secret_volume("fleet-token", &opts.fleet_token_secret, "fleet.token"),
                        ],
                    },
                },
            },
        }),
        json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta,
            // The API port only: the admin port is never a Service port.
            "spec": {"selector": app, "ports": [{"name": "api", "port": API_PORT, "targetPort": "api"}]},
        }),
        json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": meta,
            "spec": {
                "podSelector": {"matchLabels": app},
                "policyTypes": ["Ingress"],
                "ingress": [
                    {"ports": [{"protocol": "TCP", "port": API_PORT}]},
                    {
                        "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": opts.monitoring_namespace}}}],
                        "ports": [{"protocol": "TCP", "port": ADMIN_PORT}],
                    },
                ],
            },
        }),
    ])
}
