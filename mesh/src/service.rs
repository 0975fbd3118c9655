//! The halo gateway as a mesh service: the default mode of `halo istio render` and
//! `halo envoy-gateway render`, and the only one that serves every policy feature. Model
//! calls reach an Envoy of halo's own, booted from envoy/ads.yaml (the bootstrap the xDS
//! live suites run, rendered by [`halo_envoy_config::ads`]) and driven over xDS by
//! halo-server, so failover, splits, translation, SigV4, gateway keys, the Vertex token,
//! the kill-list push and evidence work as in the xDS mode; the mesh only routes to it
//! ([`crate::istio::render_service`], [`crate::envoy_gateway::render_service`]).
//!
//! Rendered here, for both meshes: halo-server ([`crate::control_plane`] with its xDS
//! server, gateway file, evidence receiver and data claim), and the gateway: a
//! ServiceAccount, the bootstrap ConfigMap, a Deployment (Envoy; halo-credentials beside
//! it when the policy routes to Vertex), its Service (the model-call port only), a
//! PodDisruptionBudget and a NetworkPolicy keeping Envoy's admin port to the monitoring
//! namespace.
//!
//! The filter module reaches the gateway pods as an image volume of the filter's
//! container image (`halo wasm publish`'s `-compat` digest, whose layer holds
//! `plugin.wasm`): pinned by digest like the in-proxy mode's, with no init step. No
//! secret is rendered: provider keys come from a Secret by reference (optional keys, so
//! a missing one fails its own targets, 502 `upstream_auth_error`, as on any gateway).

use std::collections::BTreeSet;

use halo_envoy_config::ads::AdsBootstrap;
use halo_envoy_config::credentials::{SecretSource, TargetCredential, target_credential};
use halo_envoy_config::plan::{GatewaySettings, plan, used_upstreams};
use halo_policy::Snapshot;
use halo_policy::types::UpstreamKind;
use serde_json::{Value, json};

use crate::control_plane::{self, API_PORT, ControlPlaneOptions, XdsServe};
use crate::{Image, KILLSWITCH_PATH, MeshError, metadata};

/// The gateway's Deployment, Service, ServiceAccount and pod label.
pub const GATEWAY_NAME: &str = "halo-gateway";
/// Envoy's admin port in the gateway pods (probes, /stats; never a Service port).
pub const ENVOY_ADMIN_PORT: u16 = 9901;
/// Where the filter's image volume is mounted; the module is its `plugin.wasm`.
pub const FILTER_DIR: &str = "/etc/halos/filter";
/// The module's file in the filter's container image (halo-release's `PLUGIN_FILE`,
/// asserted equal in cli/tests/mesh.rs: this pure crate does not depend on it).
pub const FILTER_FILE: &str = "plugin.wasm";
/// Where Envoy's bootstrap is mounted.
pub const BOOTSTRAP_DIR: &str = "/etc/halos/envoy";
/// The SDS file halo-credentials keeps the Vertex token in (a pod-local emptyDir).
pub const VERTEX_SDS_FILE: &str = "/run/halo/sds/vertex.yaml";
/// The AWS default chain's environment keys, taken from the provider-keys Secret when
/// present (a workload identity such as IRSA needs none).
pub const AWS_KEYS: [&str; 2] = ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"];

/// What the gateway-as-a-service manifests are rendered from, besides the snapshot.
#[derive(Debug, Clone)]
pub struct ServiceOptions {
    /// Namespace of halo-server and the gateway.
    pub namespace: String,
    /// Envoy 1.40's image (pin it by digest).
    pub envoy_image: String,
    /// halo-server's image (pin it by digest).
    pub server_image: String,
    /// The filter as a container image (`halo wasm publish`'s `-compat` variant).
    pub filter_image: Image,
    /// halo-credentials' image; needed when the policy routes to a Vertex upstream.
    pub credentials_image: Option<String>,
    /// The policy repo's files, for halo-server (path relative to the repo, contents).
    pub policy_files: Vec<(String, String)>,
    /// Gateway replicas.
    pub replicas: u32,
    /// Size of halo-server's data claim (enrollment, fleet, audit, evidence).
    pub data_size: String,
    /// The Secret holding provider keys, by the environment names the policy's
    /// `credential.env` uses (and AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY for SigV4).
    pub provider_keys_secret: String,
    /// The filter's `settings` object.
    pub settings: Value,
    /// The issuer's JWKS URL; default: halo-server reads the issuer's discovery document.
    pub jwks_uri: Option<String>,
    /// Namespace allowed to reach the admin ports (/metrics, /stats).
    pub monitoring_namespace: String,
    /// `IfNotPresent` or `Always`, for the filter's image volume.
    pub image_pull_policy: String,
}

/// The gateway's Service FQDN.
pub fn gateway_host(ns: &str) -> String {
    format!("{GATEWAY_NAME}.{ns}.svc.cluster.local")
}

/// halo-server's Service FQDN.
pub fn server_host(ns: &str) -> String {
    format!("halo-server.{ns}.svc.cluster.local")
}

/// The gateway's model-call port: the gateway file's `listenPort`, default.
pub fn gateway_port() -> u16 {
    GatewaySettings::default().listen_port
}

/// envoy/ads.yaml for the gateway pods: admin on the pod's address (the kubelet probes
/// it; the NetworkPolicy keeps it from everyone else), ADS at halo-server's Service. The
/// node id is overridden per pod (`--service-node`), so /xds/status shows each replica.
pub fn envoy_bootstrap(ns: &str) -> String {
    AdsBootstrap {
        node_id: GATEWAY_NAME.into(),
        admin_address: "0.0.0.0".into(),
        admin_port: ENVOY_ADMIN_PORT,
        ads_host: server_host(ns),
        ads_port: control_plane::XDS_PORT,
    }
    .render()
}

/// Whether some route of `snap` goes to a Vertex upstream.
fn routes_to_vertex(snap: &Snapshot) -> bool {
    used_upstreams(snap).iter().any(|name| {
        snap.upstreams
            .get(*name)
            .is_some_and(|u| u.kind == UpstreamKind::Vertex)
    })
}

/// The gateway file halo-server serves the gateway pods with, checked by planning it.
pub fn gateway_settings(
    snap: &Snapshot,
    opts: &ServiceOptions,
) -> Result<GatewaySettings, MeshError> {
    let ns = opts.namespace.as_str();
    let mut filter_settings = opts.settings.clone();
    let Some(map) = filter_settings.as_object_mut() else {
        return Err(MeshError::Option("settings must be a JSON object".into()));
    };
    if map.get("killSwitch").and_then(|k| k.get("token")).is_some() {
        return Err(MeshError::Option(
            "settings.killSwitch.token: a gateway token is never rendered into a manifest; halo-server fills it into the pushed configuration".into(),
        ));
    }
    // halo-server fills in the key and token; the poll (the push's fallback) is plain http
    // to its in-cluster Service.
    let ks = map.entry("killSwitch").or_insert_with(|| json!({}));
    if let Some(ks) = ks.as_object_mut() {
        ks.insert("allowInsecureInCluster".into(), json!(true));
    }
    let mut settings = GatewaySettings {
        wasm_path: format!("{FILTER_DIR}/{FILTER_FILE}"),
        jwks_uri: opts.jwks_uri.clone(),
        killswitch_url: Some(format!(
            "http://{}:{API_PORT}{KILLSWITCH_PATH}",
            server_host(ns)
        )),
        evidence: Some(halo_envoy_config::evidence::Export {
            url: format!(
                "http://{}:{}",
                server_host(ns),
                control_plane::OTLP_GATEWAY_PORT
            ),
            // halo-server's own --otlp-gateway-token-file.
            token_file: None,
            token: String::new(),
        }),
        ..GatewaySettings::default()
    }
    .with_filter_settings(filter_settings)?;
    if routes_to_vertex(snap) {
        settings.vertex_token_sds = Some(VERTEX_SDS_FILE.into());
    }
    // Planned as halo-server will plan it, the evidence token it reads from its own file
    // stood in for (never serialized: `Export::token` is skipped).
    let mut planned = settings.clone();
    if let Some(e) = planned.evidence.as_mut() {
        e.token = "halo-server's --otlp-gateway-token-file".into();
    }
    plan(snap, &planned)?;
    Ok(settings)
}

/// The gateway file as halo-server reads it: only what differs from the defaults, so the
/// file says what this deployment chose.
fn gateway_file(settings: &GatewaySettings) -> Result<String, MeshError> {
    let ser = |s: &GatewaySettings| {
        serde_json::to_value(s).map_err(|e| MeshError::Option(format!("gateway file: {e}")))
    };
    let (Value::Object(mine), Value::Object(defaults)) =
        (ser(settings)?, ser(&GatewaySettings::default())?)
    else {
        return Err(MeshError::Option("gateway file: not an object".into()));
    };
    let diff: serde_json::Map<String, Value> = mine
        .into_iter()
        .filter(|(k, v)| defaults.get(k) != Some(v))
        .collect();
    Ok(halo_envoy_config::yaml::to_yaml(&Value::Object(diff)))
}

/// The environment variables the gateway's Envoy reads provider keys from: each routed
/// upstream's `credential.env` as the credential chain uses it, and the AWS keys when a
/// target is signed. File credentials are the operator's to mount.
fn provider_env(snap: &Snapshot, settings: &GatewaySettings, secret: &str) -> Vec<Value> {
    let hosts = settings.hosts();
    let mut names = BTreeSet::new();
    for name in used_upstreams(snap) {
        let Some(upstream) = snap.upstreams.get(name) else {
            continue;
        };
        match target_credential(name, upstream, &hosts).0 {
            TargetCredential::Key {
                source: SecretSource::Env(var),
                ..
            } => {
                names.insert(var);
            }
            TargetCredential::SigV4 { .. } => names.extend(AWS_KEYS.map(String::from)),
            _ => {}
        }
    }
    names
        .into_iter()
        .map(|var| {
            json!({"name": var, "valueFrom": {"secretKeyRef": {
                "name": secret, "key": var,
                // A missing key fails its own targets (502 upstream_auth_error), not the pod.
                "optional": true,
            }}})
        })
        .collect()
}

fn labeled(name: &str, ns: &str) -> Value {
    let mut meta = metadata(name, ns);
    meta["labels"]["app.kubernetes.io/name"] = json!(name);
    meta
}

/// halo-server and the gateway, for either mesh.
pub fn render(snap: &Snapshot, opts: &ServiceOptions) -> Result<Vec<Value>, MeshError> {
    crate::check_pull_policy(&opts.image_pull_policy)?;
    if opts.replicas == 0 {
        return Err(MeshError::Option("--replicas must be at least 1".into()));
    }
    let ns = opts.namespace.as_str();
    let settings = gateway_settings(snap, opts)?;
    let vertex = routes_to_vertex(snap);
    if vertex && opts.credentials_image.is_none() {
        return Err(MeshError::Option(
            "the policy routes to a Vertex upstream, whose token halo-credentials mints beside Envoy: give --credentials-image (the halo-credentials image, pinned by digest)".into(),
        ));
    }
    let gateway_labels = json!({"app.kubernetes.io/name": GATEWAY_NAME});

    let mut docs = control_plane::render(&ControlPlaneOptions {
        namespace: ns.to_string(),
        image: opts.server_image.clone(),
        policy_files: opts.policy_files.clone(),
        killswitch_key_secret: "halo-killswitch-key".into(),
        gateway_token_secret: "halo-gateway-token".into(),
        fleet_token_secret: "halo-fleet-token".into(),
        data_claim: "halo-server-data".into(),
        monitoring_namespace: opts.monitoring_namespace.clone(),
        xds: Some(XdsServe {
            gateway_file: gateway_file(&settings)?,
            gateway_pods: gateway_labels.clone(),
            otlp_token_secret: "halo-otlp-gateway-token".into(),
        }),
        data_claim_size: Some(opts.data_size.clone()),
    })?;

    let meta = labeled(GATEWAY_NAME, ns);
    let restricted = json!({"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true, "capabilities": {"drop": ["ALL"]}});
    let mut mounts = vec![
        json!({"name": "bootstrap", "mountPath": BOOTSTRAP_DIR, "readOnly": true}),
        json!({"name": "filter", "mountPath": FILTER_DIR, "readOnly": true}),
        json!({"name": "tmp", "mountPath": "/tmp"}),
    ];
    let mut volumes = vec![
        json!({"name": "bootstrap", "configMap": {"name": GATEWAY_NAME}}),
        json!({"name": "filter", "image": {"reference": opts.filter_image.reference(), "pullPolicy": opts.image_pull_policy}}),
        json!({"name": "tmp", "emptyDir": {}}),
    ];
    let mut containers = Vec::new();
    let sds_dir = VERTEX_SDS_FILE
        .rsplit_once('/')
        .map_or("/run/halo/sds", |(d, _)| d);
    if vertex {
        mounts.push(json!({"name": "sds", "mountPath": sds_dir, "readOnly": true}));
        volumes.push(json!({"name": "sds", "emptyDir": {"medium": "Memory"}}));
    }
    let mut env = vec![
        json!({"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}),
    ];
    env.extend(provider_env(snap, &settings, &opts.provider_keys_secret));
    containers.push(json!({
        "name": "envoy",
        "image": opts.envoy_image,
        "command": ["envoy"],
        "args": [
            "-c", format!("{BOOTSTRAP_DIR}/envoy.yaml"),
            "--service-node", "$(POD_NAME)",
            "--log-level", "warn",
        ],
        "env": env,
        "ports": [
            {"name": "http", "containerPort": settings.listen_port},
            {"name": "admin", "containerPort": ENVOY_ADMIN_PORT},
        ],
        // /ready is 200 once Envoy has its listeners and clusters from halo-server.
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "admin"}, "periodSeconds": 5},
        "livenessProbe": {"httpGet": {"path": "/server_info", "port": "admin"}, "periodSeconds": 20, "failureThreshold": 3},
        "resources": {
            "requests": {"cpu": "500m", "memory": "256Mi"},
            "limits": {"memory": "1Gi"},
        },
        "securityContext": restricted,
        "volumeMounts": mounts,
    }));
    if let (true, Some(image)) = (vertex, &opts.credentials_image) {
        containers.push(json!({
            "name": "halo-credentials",
            "image": image,
            "args": ["vertex", "--sds-file", VERTEX_SDS_FILE],
            "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}},
            "securityContext": restricted,
            "volumeMounts": [{"name": "sds", "mountPath": sds_dir}],
        }));
    }

    docs.extend([
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta,
               // Envoy calls no Kubernetes API (a workload identity for SigV4 or Vertex
               // is annotated on this account by the operator).
               "automountServiceAccountToken": false}),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
               "data": {"envoy.yaml": envoy_bootstrap(ns)}}),
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta,
            "spec": {
                "replicas": opts.replicas,
                "selector": {"matchLabels": gateway_labels},
                "template": {
                    "metadata": {"labels": gateway_labels},
                    "spec": {
                        "serviceAccountName": GATEWAY_NAME,
                        "automountServiceAccountToken": false,
                        // Envoy's user in its image.
                        "securityContext": {"runAsNonRoot": true, "runAsUser": 101, "runAsGroup": 101, "fsGroup": 101, "seccompProfile": {"type": "RuntimeDefault"}},
                        // Model responses stream for minutes: let them finish on a rollout.
                        "terminationGracePeriodSeconds": 300,
                        "containers": containers,
                        "volumes": volumes,
                    },
                },
            },
        }),
        json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta,
            // The model-call port only; the admin port is never a Service port.
            "spec": {"selector": gateway_labels, "ports": [{"name": "http", "port": settings.listen_port, "targetPort": "http"}]},
        }),
        json!({
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": meta,
            // One pod at a time: keeps one serving with two replicas, never blocks a drain
            // with one.
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": gateway_labels}},
        }),
        json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": meta,
            "spec": {
                "podSelector": {"matchLabels": gateway_labels},
                "policyTypes": ["Ingress"],
                "ingress": [
                    {"ports": [{"protocol": "TCP", "port": settings.listen_port}]},
                    {
                        "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": opts.monitoring_namespace}}}],
                        "ports": [{"protocol": "TCP", "port": ENVOY_ADMIN_PORT}],
                    },
                ],
            },
        }),
    ]);
    Ok(docs)
}
