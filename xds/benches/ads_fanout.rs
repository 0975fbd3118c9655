//! ADS fan-out benchmark (issue 4, item 7): 1,000 simulated Envoys, each its own tonic
//! client, HTTP/2 connection, ADS stream and node id, subscribed to a generated realistic
//! policy (50 aliases, 200 targets, 30 traffic experiments). Measures the time from a
//! policy change (translate + set) to every client having ACKed the new clusters, and the
//! server's peak memory (VmHWM of the server, which runs as a child process so the
//! clients' memory is not counted).
//!
//! Run: `cargo bench -p halo-xds --bench ads_fanout` (`-- --clients N` to change the
//! count). Prints a result table for BENCHMARKS.md. Not a test: nothing is asserted.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use halo_policy::snapshot::{Routes, SnapshotExperiment, SnapshotVariant};
use halo_policy::types::{Axis, ExperimentStatus, ExperimentType, Target, Upstream, UpstreamKind};
use halo_xds::{GatewaySettings, NodeKey, SnapshotCache, snapshot_of, type_url};
use tokio::sync::{Notify, mpsc};
use tokio_stream::wrappers::ReceiverStream;

/// Knobs for exploring (the child inherits them): HALO_BENCH_ALIASES,
/// HALO_BENCH_EXPERIMENTS, HALO_BENCH_PUSH_LIMIT.
fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

const ALIASES: usize = 50;
const TARGETS_PER_ALIAS: usize = 4;
const EXPERIMENTS: usize = 30;
const UPSTREAMS: usize = 10;

/// The generated policy; `generation` 2 is the change (weights and tiers of 10 aliases).
fn policy(generation: u32) -> halo_policy::Snapshot {
    let upstreams = (0..UPSTREAMS)
        .map(|u| {
            let up = Upstream {
                url: format!("https://llm-{u}.example.com"),
                kind: UpstreamKind::Anthropic,
                region: None,
                project: None,
                api_version: None,
                credential: None,
            };
            (format!("up-{u}"), up)
        })
        .collect();
    let route = |a: usize| -> Vec<Target> {
        let changed = generation >= 2 && a.is_multiple_of(5);
        (0..TARGETS_PER_ALIAS)
            .map(|j| Target {
                upstream: format!("up-{}", (a + j) % UPSTREAMS),
                model: format!("model-{a:02}-{j}"),
                weight: (j < 2).then(|| if changed { [10, 90][j] } else { [70, 30][j] }),
                priority: match (j, changed) {
                    (0 | 1, _) => 0,
                    (2, false) | (3, true) => 1,
                    _ => 2,
                },
                timeout_seconds: Some(30),
            })
            .collect()
    };
    let aliases = knob("HALO_BENCH_ALIASES", ALIASES);
    let models: Routes = (0..aliases)
        .map(|a| (format!("alias-{a:02}"), route(a)))
        .collect();
    let experiments = (0..knob("HALO_BENCH_EXPERIMENTS", EXPERIMENTS))
        .map(|e| {
            let alias = e % aliases;
            let mut treatment = route(alias);
            treatment.reverse();
            treatment.truncate(2);
            for t in &mut treatment {
                t.priority = 0;
            }
            SnapshotExperiment {
                name: format!("exp-{e:02}"),
                experiment_type: ExperimentType::Ab,
                axis: Axis::Traffic,
                status: ExperimentStatus::Running,
                rings: vec![],
                salt: format!("exp-{e:02}"),
                variants: vec![
                    SnapshotVariant {
                        name: "control".into(),
                        weight: 50,
                        routes: BTreeMap::new(),
                    },
                    SnapshotVariant {
                        name: "treatment".into(),
                        weight: 50,
                        routes: BTreeMap::from([(format!("alias-{alias:02}"), treatment)]),
                    },
                ],
                shadow_turns: None,
            }
        })
        .collect();
    halo_policy::Snapshot {
        schema: 1,
        org: "bench".into(),
        identity: None,
        protocols: BTreeMap::new(),
        upstreams,
        models,
        rings: vec![],
        experiments,
        toggles: vec![],
        prices: Default::default(),
        budgets: Default::default(),
        budget_service: None,
    }
}

fn snapshot(generation: u32) -> halo_xds::Snapshot {
    snapshot_of(&policy(generation), &GatewaySettings::default()).expect("bench policy translates")
}

fn main() {
    if let Ok(port) = std::env::var("HALO_BENCH_SERVER_PORT") {
        return server(port.parse().expect("port"));
    }
    let args: Vec<String> = std::env::args().collect();
    let clients = args
        .iter()
        .position(|a| a == "--clients")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(1000usize);
    raise_fd_limit();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run(clients));
}

/// The child: the ADS server; commands on stdin, answers on stdout.
fn server(port: u16) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let cache = SnapshotCache::with_push_limit(knob(
        "HALO_BENCH_PUSH_LIMIT",
        halo_xds::cache::DEFAULT_PUSH_LIMIT,
    ));
    cache.set(NodeKey::Default, snapshot(1));
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(("127.0.0.1", port)))
        .expect("bind");
    rt.spawn(halo_xds::serve(listener, cache.clone()));
    let mut out = std::io::stdout();
    let _ = writeln!(out, "ready");
    let _ = out.flush();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let reply = match line.split_whitespace().collect::<Vec<_>>().as_slice() {
            ["set", g] => {
                let started = Instant::now();
                let snap = snapshot(g.parse().unwrap_or(1));
                let translated = started.elapsed();
                cache.set(NodeKey::Default, snap);
                format!("translated-in-us {}", translated.as_micros())
            }
            ["mem"] => proc_status(&["VmHWM", "VmRSS"]),
            ["metrics"] => cache
                .metrics()
                .render_prometheus()
                .lines()
                .filter(|l| !l.starts_with('#'))
                .collect::<Vec<_>>()
                .join(" "),
            _ => "?".into(),
        };
        let _ = writeln!(out, "{reply}");
        let _ = out.flush();
    }
}

fn proc_status(keys: &[&str]) -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .filter(|l| keys.iter().any(|k| l.starts_with(k)))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join(" ")
}

fn raise_fd_limit() {
    // Each client holds a connection; the server child inherits the limit.
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let lim = getrlimit(Resource::Nofile);
    let _ = setrlimit(
        Resource::Nofile,
        Rlimit {
            current: lim.maximum,
            maximum: lim.maximum,
        },
    );
}

struct Progress {
    /// The CDS version every client must ACK.
    target: RwLock<String>,
    acked: AtomicUsize,
    done: Notify,
    clients: usize,
}

async fn run(clients: usize) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port");
    let exe = std::env::current_exe().expect("own path");
    let mut child = Command::new(exe)
        .env("HALO_BENCH_SERVER_PORT", port.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the server child");
    let mut to_server = child.stdin.take().expect("stdin");
    let mut from_server = BufReader::new(child.stdout.take().expect("stdout"));
    let mut ask = move |cmd: &str| -> String {
        if !cmd.is_empty() {
            let _ = writeln!(to_server, "{cmd}");
            let _ = to_server.flush();
        }
        let mut line = String::new();
        let _ = from_server.read_line(&mut line);
        line.trim().to_string()
    };
    assert_eq!(ask(""), "ready");

    let v1 = snapshot(1);
    let v2 = snapshot(2);
    let cds_count = v1.resources[type_url::CLUSTER].len();
    let cds_bytes: usize = v1.resources[type_url::CLUSTER]
        .iter()
        .map(|r| r.body.value.len())
        .sum();
    let progress = Arc::new(Progress {
        target: RwLock::new(v1.version.clone()),
        acked: AtomicUsize::new(0),
        done: Notify::new(),
        clients,
    });

    let started = Instant::now();
    for i in 0..clients {
        let progress = progress.clone();
        let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
            .expect("endpoint")
            .connect()
            .await
            .expect("connect");
        tokio::spawn(client(channel, format!("bench-{i:04}"), progress));
    }
    wait_all(&progress).await;
    let initial = started.elapsed();
    let mem_after_initial = ask("mem");

    // The change: every client must ACK the new clusters.
    *progress.target.write().unwrap_or_else(|e| e.into_inner()) = v2.version.clone();
    progress.acked.store(0, Ordering::SeqCst);
    let changed = Instant::now();
    let translated = ask("set 2");
    wait_all(&progress).await;
    let converge = changed.elapsed();
    let mem = ask("mem");
    let metrics = ask("metrics");
    let _ = child.kill();
    let _ = child.wait();

    println!(
        "ADS fan-out: {clients} clients, {} aliases, {} targets, {} experiments",
        knob("HALO_BENCH_ALIASES", ALIASES),
        knob("HALO_BENCH_ALIASES", ALIASES) * TARGETS_PER_ALIAS,
        knob("HALO_BENCH_EXPERIMENTS", EXPERIMENTS)
    );
    println!(
        "  clusters per CDS response      {cds_count} ({} KiB)",
        cds_bytes / 1024
    );
    println!("  initial sync, all ACKed        {initial:?} (connect + first push)");
    println!("  change -> all ACKed            {converge:?}");
    println!("  translate (in that time)       {translated}");
    println!("  server memory after sync       {mem_after_initial}");
    println!("  server memory at end           {mem}");
    println!("  server counters                {metrics}");
}

async fn wait_all(progress: &Progress) {
    let deadline = tokio::time::sleep(Duration::from_secs(120));
    tokio::pin!(deadline);
    loop {
        let notified = progress.done.notified();
        if progress.acked.load(Ordering::SeqCst) >= progress.clients {
            return;
        }
        tokio::select! {
            _ = notified => {}
            _ = &mut deadline => panic!(
                "only {}/{} clients converged in 120 s",
                progress.acked.load(Ordering::SeqCst),
                progress.clients
            ),
        }
    }
}

/// One simulated Envoy: subscribes to CDS, LDS and RDS like Envoy does, ACKs everything.
async fn client(channel: tonic::transport::Channel, node: String, progress: Arc<Progress>) {
    let mut ads =
        AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(64 * 1024 * 1024);
    let (tx, rx) = mpsc::channel::<DiscoveryRequest>(8);
    let subscribe = |type_url: &str, names: Vec<String>, node: Option<Node>| DiscoveryRequest {
        node,
        type_url: type_url.to_string(),
        resource_names: names,
        ..DiscoveryRequest::default()
    };
    let me = Node {
        id: node.clone(),
        cluster: "bench".into(),
        ..Node::default()
    };
    let _ = tx
        .send(subscribe(type_url::CLUSTER, vec![], Some(me)))
        .await;
    let _ = tx.send(subscribe(type_url::LISTENER, vec![], None)).await;
    let _ = tx
        .send(subscribe(type_url::ROUTE, vec!["halo".into()], None))
        .await;
    let Ok(response) = ads
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
    else {
        eprintln!("{node}: stream refused");
        return;
    };
    let mut responses = response.into_inner();
    while let Ok(Some(r)) = responses.message().await {
        let DiscoveryResponse {
            version_info,
            type_url,
            nonce,
            ..
        } = r;
        let names = if type_url == type_url::ROUTE {
            vec!["halo".to_string()]
        } else {
            vec![]
        };
        let ack = DiscoveryRequest {
            version_info: version_info.clone(),
            type_url: type_url.clone(),
            response_nonce: nonce,
            resource_names: names,
            ..DiscoveryRequest::default()
        };
        if tx.send(ack).await.is_err() {
            return;
        }
        let target = progress
            .target
            .read()
            .map(|t| t.clone())
            .unwrap_or_default();
        if type_url == type_url::CLUSTER
            && version_info == target
            && progress.acked.fetch_add(1, Ordering::SeqCst) + 1 == progress.clients
        {
            progress.done.notify_one();
        }
    }
}
