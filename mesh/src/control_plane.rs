//! halo-server in Kubernetes: ServiceAccount, the policy as a ConfigMap, Deployment,
//! Service (the API port only) and a NetworkPolicy that keeps the admin port (/healthz,
//! /metrics) private to the monitoring namespace. With [`XdsServe`] (the gateway as a
//! mesh service, [`crate::service`]) it also serves xDS and receives the gateway's
//! evidence, both ports open to the gateway pods alone (the pushed configuration carries
//! the kill list's gateway token and the evidence token), and may render its data claim.
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

/// halo-server's xDS (ADS) port.
pub const XDS_PORT: u16 = 18000;
/// halo-server's OTLP gateway receiver (evidence from the gateway's Envoy; spec :4319).
pub const OTLP_GATEWAY_PORT: u16 = 4319;

/// halo-server driving the halo gateway over xDS.
#[derive(Debug, Clone)]
pub struct XdsServe {
    /// The `--xds-gateway-file` contents (YAML).
    pub gateway_file: String,
    /// Labels of the gateway pods: the only clients of the xDS and evidence ports.
    pub gateway_pods: Value,
    /// Secret holding `otlp-gateway.token` (the token the gateway's evidence carries).
    pub otlp_token_secret: String,
}

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
    /// Serve the gateway over xDS (none: the API alone, as for the in-proxy mode).
    pub xds: Option<XdsServe>,
    /// Render the data claim with this size (none: the operator's, e.g. istio/base's).
    pub data_claim_size: Option<String>,
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
    let mut args: Vec<Value> = [
        "--listen".to_string(),
        format!("0.0.0.0:{API_PORT}"),
        // Pod-wide so the kubelet's probes reach it; the NetworkPolicy keeps it from
        // everyone else.
        "--admin-listen".into(),
        format!("0.0.0.0:{ADMIN_PORT}"),
        "--policy-dir".into(),
        "/etc/halos/policy".into(),
        "--data-dir".into(),
        "/var/lib/halos".into(),
        "--killswitch-key-file".into(),
        "/etc/halos/killswitch/killswitch.key".into(),
        "--gateway-token-file".into(),
        "/etc/halos/gateway/gateway.token".into(),
        "--token-file".into(),
        "/etc/halos/fleet/fleet.token".into(),
    ]
    .into_iter()
    .map(Value::String)
    .collect();
    let mut ports = vec![
        json!({"name": "api", "containerPort": API_PORT}),
        json!({"name": "admin", "containerPort": ADMIN_PORT}),
    ];
    let mut mounts = vec![
        json!({"name": "policy", "mountPath": "/etc/halos/policy", "readOnly": true}),
        json!({"name": "data", "mountPath": "/var/lib/halos"}),
        json!({"name": "killswitch-key", "mountPath": "/etc/halos/killswitch", "readOnly": true}),
        json!({"name": "gateway-token", "mountPath": "/etc/halos/gateway", "readOnly": true}),
        json!({"name": "fleet-token", "mountPath": "/etc/halos/fleet", "readOnly": true}),
    ];
    let mut volumes = vec![
        json!({"name": "policy", "configMap": {"name": "halo-policy", "items": items}}),
        json!({"name": "data", "persistentVolumeClaim": {"claimName": opts.data_claim}}),
        secret_volume(
            "killswitch-key",
            &opts.killswitch_key_secret,
            "killswitch.key",
        ),
        secret_volume("gateway-token", &opts.gateway_token_secret, "gateway.token"),
        secret_volume("fleet-token", &opts.fleet_token_secret, "fleet.token"),
    ];
    let mut service_ports = vec![json!({"name": "api", "port": API_PORT, "targetPort": "api"})];
    let mut ingress = vec![
        json!({"ports": [{"protocol": "TCP", "port": API_PORT}]}),
        json!({
            "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": opts.monitoring_namespace}}}],
            "ports": [{"protocol": "TCP", "port": ADMIN_PORT}],
        }),
    ];
    let mut extra = Vec::new();
    if let Some(xds) = &opts.xds {
        args.extend(
            [
                "--xds-listen".to_string(),
                format!("0.0.0.0:{XDS_PORT}"),
                "--xds-gateway-file".into(),
                "/etc/halos/xds/xds-gateway.yaml".into(),
                "--otlp-gateway-listen".into(),
                format!("0.0.0.0:{OTLP_GATEWAY_PORT}"),
                "--otlp-gateway-token-file".into(),
                "/etc/halos/otlp/otlp-gateway.token".into(),
            ]
            .into_iter()
            .map(Value::String),
        );
        ports.push(json!({"name": "grpc-xds", "containerPort": XDS_PORT}));
        ports.push(json!({"name": "grpc-otlp", "containerPort": OTLP_GATEWAY_PORT}));
        mounts
            .push(json!({"name": "xds-gateway", "mountPath": "/etc/halos/xds", "readOnly": true}));
        mounts.push(
            json!({"name": "otlp-gateway-token", "mountPath": "/etc/halos/otlp", "readOnly": true}),
        );
        volumes.push(json!({"name": "xds-gateway", "configMap": {"name": "halo-xds-gateway"}}));
        volumes.push(secret_volume(
            "otlp-gateway-token",
            &xds.otlp_token_secret,
            "otlp-gateway.token",
        ));
        // Port names tell Istio the protocol (gRPC over h2c).
        service_ports.push(json!({"name": "grpc-xds", "port": XDS_PORT, "targetPort": "grpc-xds"}));
        service_ports.push(
            json!({"name": "grpc-otlp", "port": OTLP_GATEWAY_PORT, "targetPort": "grpc-otlp"}),
        );
        ingress.push(json!({
            "from": [{"podSelector": {"matchLabels": xds.gateway_pods}}],
            "ports": [{"protocol": "TCP", "port": XDS_PORT}, {"protocol": "TCP", "port": OTLP_GATEWAY_PORT}],
        }));
        extra.push(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata("halo-xds-gateway", ns),
                          "data": {"xds-gateway.yaml": xds.gateway_file}}));
    }
    if let Some(size) = &opts.data_claim_size {
        extra.push(json!({
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": metadata(&opts.data_claim, ns),
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}},
        }));
    }
    let mut docs = vec![
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
                            "args": args,
                            "ports": ports,
                            "readinessProbe": {"httpGet": {"path": "/healthz", "port": "admin"}, "periodSeconds": 5},
                            "livenessProbe": {"httpGet": {"path": "/healthz", "port": "admin"}, "periodSeconds": 20},
                            "resources": {
                                "requests": {"cpu": "100m", "memory": "128Mi"},
                                "limits": {"memory": "512Mi"},
                            },
                            "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true, "capabilities": {"drop": ["ALL"]}},
                            "volumeMounts": mounts,
                        }],
                        "volumes": volumes,
                    },
                },
            },
        }),
        json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta,
            // The API port (with xDS, the gateway's two ports too): the admin port is never
            // a Service port.
            "spec": {"selector": app, "ports": service_ports},
        }),
        json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": meta,
            "spec": {
                "podSelector": {"matchLabels": app},
                "policyTypes": ["Ingress"],
                "ingress": ingress,
            },
        }),
    ];
    docs.extend(extra);
    Ok(docs)
}
