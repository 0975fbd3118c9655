//! The gateway benchmark (issue 3, item 11): requests/s and p50/p99 latency through Envoy
//! with the halo filter (jwt_authn + the filter) against the same Envoy without them
//! (listener -> router -> the same upstream), one Envoy worker, keep-alive, the same
//! closed-loop load generator, at request bodies of 4 KB, 100 KB and 1 MB. Both builds of
//! the filter run, interleaved with the baselines: the wasm module (V8) and the native
//! dynamic module. Also times the body model probe and rewrite natively at 1 MB against a
//! full serde_json parse.
//!
//! Run: `cargo bench -p halo-e2e --bench gateway` (after building both filter builds:
//! `cargo build -p halo-filter-wasm --target wasm32-unknown-unknown --release` and
//! `cargo build -p halo-filter-native --release`).
//!
//! How it times (the paired mode, the default): each Envoy compared with the bare one runs
//! beside it, and one loop sends a request to each in turn, on one keep-alive connection
//! each, alternating which goes first. The added latency is the median of the per-pair
//! differences, with a 95% confidence interval; requests/s is each side's one-connection
//! closed-loop rate. Every Envoy is pinned to one CPU and this process (the load generator
//! and the upstream) to another: the first two CPUs the process may run on. Why: on a
//! small shared machine the speed of the whole machine drifts by tens of percent between
//! runs seconds apart, which separate runs of each Envoy cannot tell from the filter; a
//! pair's two requests run within a millisecond of each other and see the same machine.
//! A second bare Envoy compared with the first shows the method's zero.
//!
//! Knobs: HALO_BENCH_SECS (default 5 per comparison), HALO_BENCH_SIZES (KiB,
//! comma-separated; default 4,100,1024), HALO_BENCH_NO_JWT (the filter alone, no
//! jwt_authn), HALO_BENCH_BUILDS (`wasm,native` by default), HALO_BENCH_BASELINE_WASM and
//! HALO_BENCH_BASELINE_NATIVE (an earlier build's module: run beside the build and compared
//! with it, paired, in the same run), HALO_BENCH_BUDGETS=0 (leave out the budget arm: each
//! build with Envoy's budget check asking halo-server's budget service, paired with the same
//! build without budgets). HALO_BENCH_LOAD=1 also runs
//! the closed-loop load table (each Envoy in turn, HALO_BENCH_CONNS connections, default
//! 4; HALO_BENCH_REPS interleaved repetitions with medians, default 1).
//! HALO_BENCH_ANSWER=json|sse: the upstream answers as Anthropic does, with usage (a 4 KB
//! message, or a 200-event stream), and each comparison prints the time to first byte
//! too: the response accounting's cost (issue 21).
//!
//! The shadow arms (issue 24): per build, the same gateway with a shadow experiment
//! enrolling the caller on every step (each bench request becomes a mirror job) and the
//! mirror service up (answers 202 at once), slow (answers after 10 s: each callout waits
//! out the filter's 2 s timeout, and the `halo-shadow` cluster's bound overflows) and down
//! (nothing listening), each paired with the build without shadow: what mirroring adds to
//! the live call. After each arm the jobs' fate is printed: the filter's
//! `halo_shadow_jobs` outcomes, Envoy's `halo-shadow` cluster stats and what the service
//! received.
//!
//! `HALO_BENCH_CALLGRIND=<requests>` counts instead of timing: every Envoy runs under
//! valgrind's callgrind and the bench reports the instructions Envoy executes per request
//! (user space, all threads) over that many sequential requests after a warm-up. Counts
//! repeat to a fraction of a percent on a busy machine, where times move by tens of
//! percent; they leave out the kernel's share (sockets), which is the same for all. The
//! baseline modules are counted too; HALO_BENCH_CALLGRIND_KEEP=<dir> keeps each Envoy's
//! profile there for callgrind_annotate.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use halo_e2e::shadow::{Mirror, Mode, SHADOW_TOKEN};
use halo_e2e::*;
use halo_testkit::envoy::Envoy;
use serde_json::json;

/// A conversation-shaped body of about `size` bytes: many short messages.
fn body(size: usize) -> Vec<u8> {
    let turn = json!({"role": "user", "content": "Refactor the parser so that it reports the line and column of every error it finds; keep the tests green."});
    let turn_len = turn.to_string().len() + 1;
    let n = (size.saturating_sub(80) / turn_len).max(1);
    let messages: Vec<_> = (0..n).map(|_| turn.clone()).collect();
    json!({"model": "haiku", "max_tokens": 16, "messages": messages})
        .to_string()
        .into_bytes()
}

struct Result {
    rps: f64,
    p50_us: f64,
    p99_us: f64,
    /// Envoy's own CPU time per request (all its threads): the cost that a busy shared
    /// machine disturbs least, where latency moves by hundreds of microseconds run to run.
    cpu_us: f64,
}

async fn load(
    envoy: &Envoy,
    url: String,
    auth: Option<String>,
    body: Vec<u8>,
    conns: usize,
    secs: u64,
) -> Result {
    let body = Arc::new(body);
    let run = |dur: Duration| {
        let mut tasks = Vec::new();
        for _ in 0..conns {
            let url = url.clone();
            let auth = auth.clone();
            let body = body.clone();
            tasks.push(tokio::spawn(async move {
                // One keep-alive connection per task.
                let client = halo_e2e::client_builder()
                    .pool_max_idle_per_host(1)
                    .build()
                    .expect("client");
                let mut lat = Vec::new();
                let end = Instant::now() + dur;
                while Instant::now() < end {
                    let t = Instant::now();
                    let mut req = client.post(&url).body(body.as_ref().clone());
                    if let Some(a) = &auth {
                        req = req.header("authorization", a);
                    }
                    let resp = req.send().await.expect("send");
                    assert_eq!(resp.status().as_u16(), 200, "bench request failed");
                    let _ = resp.bytes().await.expect("body");
                    lat.push(t.elapsed());
                }
                lat
            }));
        }
        tasks
    };
    // Warm-up (connections, JWKS fetch, V8 tiering).
    for t in run(Duration::from_secs(1)) {
        t.await.expect("warmup");
    }
    let start = Instant::now();
    let cpu_start = envoy.cpu_time().unwrap_or_default();
    let mut all = Vec::new();
    for t in run(Duration::from_secs(secs)) {
        all.extend(t.await.expect("load task"));
    }
    let elapsed = start.elapsed().as_secs_f64();
    let cpu = envoy
        .cpu_time()
        .unwrap_or_default()
        .saturating_sub(cpu_start);
    all.sort();
    let pct =
        |p: f64| all[((all.len() as f64 * p) as usize).min(all.len() - 1)].as_secs_f64() * 1e6;
    Result {
        rps: all.len() as f64 / elapsed,
        p50_us: pct(0.50),
        p99_us: pct(0.99),
        cpu_us: cpu.as_secs_f64() * 1e6 / all.len() as f64,
    }
}

/// One side-by-side comparison ([the paired mode](self)): the latencies of requests sent
/// alternately to a reference Envoy and to another one.
struct Paired {
    /// Per pair: the other Envoy's latency minus the reference's, in microseconds.
    added_us: Vec<f64>,
    /// The same for the time to the answer's first body byte.
    added_ttfb_us: Vec<f64>,
    reference_us: Vec<f64>,
    other_us: Vec<f64>,
}

/// Send the same request to `reference` and to `other` in turn, on one keep-alive
/// connection each, for `secs` seconds after a one-second warm-up; which goes first
/// alternates, so neither side always runs just after the other.
async fn paired(
    reference: &str,
    other: &str,
    auth: Option<&str>,
    body: &[u8],
    secs: u64,
) -> Paired {
    let client = || {
        halo_e2e::client_builder()
            .pool_max_idle_per_host(1)
            .build()
            .expect("client")
    };
    let (reference_client, other_client) = (client(), client());
    let send = |client: &reqwest::Client, url: &str| {
        let mut req = client.post(url).body(body.to_vec());
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        async move {
            let t = Instant::now();
            let mut resp = req.send().await.expect("send");
            assert_eq!(resp.status().as_u16(), 200, "bench request failed");
            let mut ttfb = None;
            while let Some(_chunk) = resp.chunk().await.expect("body") {
                ttfb.get_or_insert_with(|| t.elapsed().as_secs_f64() * 1e6);
            }
            let total = t.elapsed().as_secs_f64() * 1e6;
            (ttfb.unwrap_or(total), total)
        }
    };
    let mut out = Paired {
        added_us: Vec::new(),
        added_ttfb_us: Vec::new(),
        reference_us: Vec::new(),
        other_us: Vec::new(),
    };
    for (phase, dur) in [(0, 1), (1, secs)] {
        let end = Instant::now() + Duration::from_secs(dur);
        let mut k = 0u64;
        // At least one pair, so every statistic has a sample.
        while k == 0 || Instant::now() < end {
            let (r, o) = if k.is_multiple_of(2) {
                let r = send(&reference_client, reference).await;
                (r, send(&other_client, other).await)
            } else {
                let o = send(&other_client, other).await;
                (send(&reference_client, reference).await, o)
            };
            k += 1;
            if phase == 1 {
                out.added_us.push(o.1 - r.1);
                out.added_ttfb_us.push(o.0 - r.0);
                out.reference_us.push(r.1);
                out.other_us.push(o.1);
            }
        }
    }
    out
}

impl Paired {
    /// The median added latency and its 95% confidence interval, from order statistics
    /// (no assumption about the distribution).
    fn added(&self) -> (f64, f64, f64) {
        median_interval(&self.added_us)
    }
}

/// The median of `added` and its 95% confidence interval, from order statistics (no
/// assumption about the distribution).
fn median_interval(added: &[f64]) -> (f64, f64, f64) {
    let mut d = added.to_vec();
    d.sort_by(f64::total_cmp);
    let n = d.len();
    let k = ((n as f64 - 1.96 * (n as f64).sqrt()) / 2.0)
        .floor()
        .max(0.0) as usize;
    (d[n / 2], d[k.min(n - 1)], d[(n - 1).saturating_sub(k)])
}

impl Paired {
    /// The other Envoy's one-connection requests/s over the reference's.
    fn rate_ratio(&self) -> f64 {
        self.reference_us.iter().sum::<f64>() / self.other_us.iter().sum::<f64>()
    }

    fn print(&self, size: &str, what: &str) {
        let pct = |v: &[f64], p: f64| {
            let mut v = v.to_vec();
            v.sort_by(f64::total_cmp);
            v[((v.len() as f64 * p) as usize).min(v.len() - 1)]
        };
        let (median, low, high) = self.added();
        println!(
            "{size:>7}  {what:<38} p50 {:>5.0} -> {:>5.0} us, added {median:>+5.0} us (95% CI {low:+.0} .. {high:+.0}), p99 {:>5.0} -> {:>5.0} us, {:.2}x requests/s, {} pairs",
            pct(&self.reference_us, 0.5),
            pct(&self.other_us, 0.5),
            pct(&self.reference_us, 0.99),
            pct(&self.other_us, 0.99),
            self.rate_ratio(),
            self.added_us.len(),
        );
        // With a model's answer (HALO_BENCH_ANSWER), the first byte's time too: what the
        // response accounting could delay.
        if answer_shape().is_some() {
            let (median, low, high) = median_interval(&self.added_ttfb_us);
            println!(
                "{:>7}  {:<38} time to first byte: added {median:>+5.0} us (95% CI {low:+.0} .. {high:+.0})",
                "", ""
            );
        }
    }

    /// Item 11's targets at this size, if it has any: met, not met, or within the
    /// interval's reach (the interval straddles the bound).
    fn verdict(&self, kib: usize, what: &str) {
        let (median, low, high) = self.added();
        let p50_bound = match kib {
            4 => 50.0,
            1024 => 500.0,
            _ => return,
        };
        let p50 = if high <= p50_bound {
            "met"
        } else if low > p50_bound {
            "not met"
        } else {
            "not decided (the interval contains the bound)"
        };
        let mut line = format!("{what}: added p50 <= {p50_bound:.0} us: {p50} ({median:+.0} us)");
        if kib == 4 {
            let ratio = self.rate_ratio();
            let rate = if ratio >= 0.9 { "met" } else { "not met" };
            line.push_str(&format!("; >= 0.90x requests/s: {rate} ({ratio:.2}x)"));
        }
        println!("           target {line}");
    }
}

/// A build's gateways with shadow on ([the shadow arms](self)): one whose mirror service
/// is up or slow (switched between arms), one whose mirror service is down.
struct ShadowArms {
    /// The build's name, whose gateway without shadow is the reference.
    build: String,
    mirror: Mirror,
    up: Gateway,
    down: Gateway,
}

/// What became of the jobs, cumulative: the filter's outcomes, Envoy's `halo-shadow`
/// cluster stats, and the mirror service's count.
fn shadow_fate(gw: &Gateway, mirror: Option<&Mirror>) -> Vec<(&'static str, u64)> {
    let filter = |outcome: &str| {
        gw.filter_series()
            .iter()
            .filter(|(k, _)| {
                k.starts_with(&format!("halo_shadow_jobs{{halo_outcome=\"{outcome}\""))
            })
            .map(|(_, v)| v)
            .sum::<u64>()
    };
    let cluster = |stat: &str| {
        gw.envoy
            .stat(&format!("cluster.halo-shadow.{stat}"))
            .unwrap_or(0)
    };
    vec![
        ("sent", filter("sent")),
        ("not_sent", filter("not_sent")),
        ("too_large", filter("too_large")),
        ("completed", cluster("upstream_rq_completed")),
        ("overflow", cluster("upstream_rq_pending_overflow")),
        ("timeout", cluster("upstream_rq_timeout")),
        ("connect_fail", cluster("upstream_cx_connect_fail")),
        ("received", mirror.map_or(0, Mirror::received)),
    ]
}

/// The change in [`shadow_fate`] over one arm, printed under its line.
fn print_fate(before: &[(&str, u64)], after: &[(&str, u64)]) {
    let parts: Vec<String> = before
        .iter()
        .zip(after)
        .map(|((name, b), (_, a))| format!("{name} {}", a.saturating_sub(*b)))
        .collect();
    println!("           jobs: {}", parts.join(", "));
}

/// Pin this process (the load generator and the upstream) to the first CPU it may run on
/// and every Envoy to the second, when there are two. Says what it did.
fn pin(envoys: &[&Envoy]) {
    let cpus = match halo_testkit::cpu::allowed() {
        Ok(cpus) if cpus.len() >= 2 => cpus,
        Ok(_) => {
            println!("one CPU: nothing pinned");
            return;
        }
        Err(e) => {
            println!("not pinned ({e}): expect more noise");
            return;
        }
    };
    let (generator, gateways) = (cpus[0], cpus[1]);
    let pinned = halo_testkit::cpu::pin_process(std::process::id(), generator)
        .and_then(|()| envoys.iter().try_for_each(|e| e.pin_to_cpu(gateways)));
    match pinned {
        Ok(()) => println!(
            "pinned: every Envoy on CPU {gateways}, the load generator and the upstream on CPU {generator}"
        ),
        Err(e) => println!("not pinned ({e}): expect more noise"),
    }
}

/// The Envoys without the filter the halo gateway is compared with, each listener ->
/// router -> the same cluster and upstream.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Baseline {
    /// Nothing else.
    Bare,
    /// Envoy's buffer filter first holds each request until its last byte, as the halo
    /// filter must (the model decides the route): the store-and-forward floor.
    ReadInFull,
    /// Read in full, and the halo route's retry policy, which keeps each request body for
    /// replay on the next target: the floor of any gateway that inspects the model and
    /// fails over, before the filter's own work.
    ReadInFullFailover,
}

impl Baseline {
    const ALL: [Baseline; 3] = [
        Baseline::Bare,
        Baseline::ReadInFull,
        Baseline::ReadInFullFailover,
    ];

    fn label(self) -> &'static str {
        match self {
            Baseline::Bare => "bare Envoy",
            Baseline::ReadInFull => "+ read in full",
            Baseline::ReadInFullFailover => "+ read in full + failover",
        }
    }
}

fn bare_bootstrap(port: u16, admin: u16, upstream: &str, baseline: Baseline) -> String {
    let router = json!({"name": "envoy.filters.http.router", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}});
    let buffer = json!({"name": "envoy.filters.http.buffer", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer",
        "max_request_bytes": 33 * 1024 * 1024}});
    let http_filters = if baseline == Baseline::Bare {
        vec![router]
    } else {
        vec![buffer, router]
    };
    let mut route = json!({"cluster": "halo-upstream-prov-a", "timeout": "0s"});
    if baseline == Baseline::ReadInFullFailover {
        route["retry_policy"] =
            halo_envoy_config::bootstrap::retry_policy(&halo_envoy_config::plan::RoutePlan::new(
                &halo_envoy_config::plan::GatewaySettings::default(),
            ));
    }
    let cluster = halo_envoy_config::plan::ServicePlan::new(
        "upstream",
        "halo-upstream-prov-a",
        upstream,
        halo_envoy_config::tls::DEFAULT_UPSTREAM_CA_FILE,
    )
    .expect("url");
    let doc = json!({
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
        "static_resources": {
            "listeners": [{
                "name": "bare",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
                "per_connection_buffer_limit_bytes": 33 * 1024 * 1024,
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "bare",
                        "route_config": {"virtual_hosts": [{"name": "b", "domains": ["*"], "routes": [
                            {"match": {"prefix": "/"}, "route": route}]}]},
                        "http_filters": http_filters,
                    },
                }]}],
            }],
            "clusters": [halo_envoy_config::bootstrap::service_cluster(&cluster)],
        },
    });
    halo_envoy_config::yaml::to_yaml(&doc)
}

fn micro_rewrite() {
    let b = body(1024 * 1024);
    let snap_doc = json!({"schema": 1, "org": "b",
        "protocols": {"claude-code": "anthropic-messages", "codex": "openai-responses", "gemini-cli": "gemini"},
        "upstreams": {"a": {"url": "http://x", "kind": "anthropic"}},
        "models": {"haiku": [{"upstream": "a", "model": "claude-haiku-4-5"}]},
        "rings": [], "experiments": [], "toggles": []});
    let snap = halo_policy::Snapshot::from_bytes(snap_doc.to_string().as_bytes()).expect("snap");
    let iters = 50;
    let time = |f: &dyn Fn()| {
        let t = Instant::now();
        for _ in 0..iters {
            f();
        }
        t.elapsed().as_secs_f64() * 1e6 / f64::from(iters)
    };
    let admit = time(&|| {
        let _ = std::hint::black_box(halo_policy::admit::admit(&snap, "POST", "/v1/messages", &b));
    });
    let rewrite = time(&|| {
        let _ = std::hint::black_box(halo_policy::admit::rewrite_body_model(
            &b,
            "claude-haiku-4-5",
        ));
    });
    let span = match halo_policy::admit::admit(&snap, "POST", "/v1/messages", &b) {
        Ok(halo_policy::admit::Admission::Model(call)) => match call.model_in {
            halo_policy::admit::ModelLocation::Body { start, end } => (start, end),
            halo_policy::admit::ModelLocation::Path => {
                unreachable!("messages carry the model in the body")
            }
        },
        other => panic!("the bench body must be admitted: {other:?}"),
    };
    let splice = time(&|| {
        let _ = std::hint::black_box(halo_policy::admit::splice_model(
            &b,
            span.0,
            span.1,
            "claude-haiku-4-5",
        ));
    });
    let full = time(&|| {
        let v: serde_json::Value = serde_json::from_slice(&b).expect("json");
        let _ = std::hint::black_box(serde_json::to_vec(&v));
    });
    println!(
        "\nBody model handling at {} bytes, native (per request, mean of {iters}):",
        b.len()
    );
    println!("  admit (probe model + stream, records the span) {admit:>8.0} us");
    println!("  rewrite_body_model (probe + splice)           {rewrite:>9.0} us");
    println!("  splice_model at admit's span (the filter)     {splice:>9.0} us");
    println!("  full serde_json::Value parse + re-serialise   {full:>9.0} us");
}

/// `HALO_BENCH_ANSWER`: `json` (a 4 KB message with usage) or `sse` (a 200-event stream
/// with usage), as Anthropic answers: the upstream answers every request so, and each
/// comparison prints the time to first byte too. Unset: a short JSON answer without
/// usage (the figures before the response accounting).
fn answer_shape() -> Option<AnswerShape> {
    match std::env::var("HALO_BENCH_ANSWER").as_deref() {
        Err(_) => None,
        Ok("json") => Some(AnswerShape::Json4k),
        Ok("sse") => Some(AnswerShape::Sse(200)),
        Ok(other) => panic!("HALO_BENCH_ANSWER: {other:?} is not json or sse"),
    }
}

/// The body sizes to run, in KiB: `HALO_BENCH_SIZES` (comma-separated), else the issue's
/// 4 KB, 100 KB and 1 MB.
fn sizes_kib() -> Vec<usize> {
    match std::env::var("HALO_BENCH_SIZES") {
        Ok(list) => list
            .split(',')
            .map(|s| {
                s.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("HALO_BENCH_SIZES: {s:?} is not a size in KiB"))
            })
            .collect(),
        Err(_) => vec![4, 100, 1024],
    }
}

/// The budget service's token in the bench.
const BUDGET_TOKEN: &str = "9d3b7f1a2c6e4058b1a7f3c9e2d5b8a0c4f6e1d3a9b7c5e2f0a8d6b4c2e1f3a5";

/// halo-server's budget service on loopback, its counts in an embedded store under `dir`,
/// serving `snap` plus a budget the bench's caller is under and never spends; and that
/// policy.
async fn budget_service(
    snap: &halo_policy::Snapshot,
    dir: &std::path::Path,
) -> (halo_server::budget::BudgetServer, halo_policy::Snapshot) {
    let mut budgeted = snap.clone();
    let budget: halo_policy::types::Budget = serde_json::from_value(json!({
        "appliesTo": {"users": ["dave@acme.test"]},
        "period": "day",
        "limit": {"tokens": 1_000_000_000_000u64},
    }))
    .expect("a budget");
    budgeted.budgets.insert("bench-daily".into(), budget);
    let token_file = dir.join("budget.token");
    std::fs::write(&token_file, BUDGET_TOKEN).expect("the budget token");
    let served = halo_xds::Served {
        org: halo_policy::Org::default(),
        version: budgeted.version(),
        compiled: budgeted.clone(),
    };
    let (_, policy) = tokio::sync::watch::channel(Arc::new(served));
    let service = halo_server::budget::start(
        &halo_server::budget::BudgetSettings {
            listen: Some("127.0.0.1:0".parse().expect("addr")),
            token_file: Some(token_file),
        },
        None,
        Some(dir),
        policy,
        None,
        halo_server::evidence::DEFAULT_RETENTION,
    )
    .await
    .expect("the budget service")
    .expect("listening");
    (service, budgeted)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let secs: u64 = std::env::var("HALO_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let conns: usize = std::env::var("HALO_BENCH_CONNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    let issuer = Issuer::start().await;
    let providers = Providers::start().await;
    let sink = Provider::sink("prov-a").await;
    if let Some(shape) = answer_shape() {
        sink.set_behaviour(Behaviour::Answer(shape));
    }
    let mut snap = test_snapshot(&issuer.url, &providers);
    if let Some(u) = snap.upstreams.get_mut("prov-a") {
        u.url = sink.url.clone();
    }
    // HALO_BENCH_NO_JWT=1: the wasm filter alone (identity mode none, no jwt_authn), to
    // split the added cost between JWT verification and the filter.
    let no_jwt = std::env::var_os("HALO_BENCH_NO_JWT").is_some();
    if no_jwt {
        snap.identity = None;
    }
    let builds: Vec<String> = std::env::var("HALO_BENCH_BUILDS")
        .unwrap_or_else(|_| "wasm,native".into())
        .split(',')
        .map(|b| b.trim().to_string())
        .collect();
    let callgrind: Option<usize> = std::env::var("HALO_BENCH_CALLGRIND").ok().map(|n| {
        n.parse()
            .expect("HALO_BENCH_CALLGRIND: a number of requests")
    });
    // Each build, then each build's baseline module when one is given
    // (HALO_BENCH_BASELINE_WASM, HALO_BENCH_BASELINE_NATIVE: an earlier build of the
    // filter), compared with the build in the same run.
    let mut modules: Vec<(String, std::path::PathBuf)> = builds
        .iter()
        .map(|build| {
            let module = match build.as_str() {
                "wasm" => halo_testkit::filter_wasm(),
                "native" => halo_testkit::filter_native_path(),
                other => panic!("HALO_BENCH_BUILDS: {other:?} is not wasm or native"),
            };
            (format!("halo {build}"), module)
        })
        .collect();
    let baselines_of: Vec<(String, String)> = builds
        .iter()
        .filter_map(|build| {
            let path = std::env::var_os(format!("HALO_BENCH_BASELINE_{}", build.to_uppercase()))?;
            let name = format!("halo {build} baseline");
            modules.push((name.clone(), path.into()));
            Some((format!("halo {build}"), name))
        })
        .collect();
    if let Some(requests) = callgrind {
        let token = bearer(&issuer.token("dave@acme.test", &["eng"]));
        count_instructions(&snap, &sink.url, no_jwt, &modules, &token, requests).await;
        return;
    }
    let gateways: Vec<(String, Gateway)> = modules
        .clone()
        .into_iter()
        .map(|(name, module)| {
            assert!(
                module.exists(),
                "{} is missing: build it first",
                module.display()
            );
            let mut opts = GatewayOptions {
                wasm_path: Some(module),
                ..GatewayOptions::default()
            };
            if no_jwt {
                opts.settings = json!({"identity": {"mode": "none"}});
            }
            (name, Gateway::start(snap.clone(), opts))
        })
        .collect();
    // HALO_BENCH_SHADOW=0 leaves the shadow arms out.
    let shadow_on = std::env::var("HALO_BENCH_SHADOW").map_or(true, |v| v != "0");
    let mut shadows = Vec::new();
    if shadow_on {
        // Every step mirrored (the bench bodies are first turns anyway), bodies up to the
        // largest size mirrored too.
        let shadow_snap =
            halo_e2e::shadow::with_experiment(snap.clone(), "bench-shadow", "haiku", "all");
        for build in &builds {
            let module = modules
                .iter()
                .find(|(n, _)| *n == format!("halo {build}"))
                .map(|(_, m)| m.clone())
                .expect("the build's module");
            let mut settings =
                json!({"shadow": {"token": SHADOW_TOKEN, "maxBytes": 4 * 1024 * 1024}});
            if no_jwt {
                settings["identity"] = json!({"mode": "none"});
            }
            let mirror = Mirror::start_counting().await;
            let start = |url: String| {
                Gateway::start(
                    shadow_snap.clone(),
                    GatewayOptions {
                        wasm_path: Some(module.clone()),
                        settings: settings.clone(),
                        shadow_url: Some(url),
                        ..GatewayOptions::default()
                    },
                )
            };
            let up = start(mirror.url.clone());
            // Down: a port nobody listens on.
            let down = start(format!(
                "http://127.0.0.1:{}/mirror",
                halo_testkit::free_port()
            ));
            shadows.push(ShadowArms {
                build: format!("halo {build}"),
                mirror,
                up,
                down,
            });
        }
    }
    // The budget check's arm (HALO_BENCH_BUDGETS=0 leaves it out): each build again,
    // its policy with a budget for the caller (never spent) and Envoy's ratelimit filter
    // asking halo-server's budget service (in this process, its counts in an embedded
    // store), compared with the same build without budgets.
    let budget_dir = tempfile::tempdir().expect("budget dir");
    let budget = if std::env::var("HALO_BENCH_BUDGETS").map_or(true, |v| v != "0") {
        Some(budget_service(&snap, budget_dir.path()).await)
    } else {
        None
    };
    let budgeted: Vec<(String, String, Gateway)> = match &budget {
        None => Vec::new(),
        Some((service, budgeted_snap)) => builds
            .iter()
            .map(|build| {
                let name = format!("halo {build}");
                let module = modules
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, m)| m.clone())
                    .expect("the build's module");
                let mut opts = GatewayOptions {
                    wasm_path: Some(module),
                    budgets: Some(halo_envoy_config::evidence::Export {
                        url: format!("http://{}", service.addr),
                        token_file: None,
                        token: BUDGET_TOKEN.into(),
                    }),
                    ..GatewayOptions::default()
                };
                if no_jwt {
                    opts.settings = json!({"identity": {"mode": "none"}});
                }
                (
                    format!("{name} budgets on"),
                    name,
                    Gateway::start(budgeted_snap.clone(), opts),
                )
            })
            .collect(),
    };
    let url_of = |name: &str| {
        gateways
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, gw)| format!("{}/v1/messages", gw.base))
            .expect("a started gateway")
    };
    let start_bare = |baseline: Baseline| {
        let port = halo_testkit::free_port();
        let admin = halo_testkit::free_port();
        let envoy = tokio::task::block_in_place(|| {
            Envoy::start(&bare_bootstrap(port, admin, &sink.url, baseline), admin)
        });
        (
            baseline,
            envoy,
            format!("http://127.0.0.1:{port}/v1/messages"),
        )
    };
    let baselines: Vec<_> = Baseline::ALL.into_iter().map(start_bare).collect();
    // A second bare Envoy: compared with the first, the paired mode's zero.
    let (_, bare_again, bare_again_url) = start_bare(Baseline::Bare);
    let token = bearer(&issuer.token("dave@acme.test", &["eng"]));
    let reps: usize = std::env::var("HALO_BENCH_REPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let mut envoys: Vec<&Envoy> = baselines.iter().map(|(_, e, _)| e).collect();
    envoys.push(&bare_again);
    envoys.extend(gateways.iter().map(|(_, gw)| &gw.envoy));
    envoys.extend(shadows.iter().flat_map(|a| [&a.up.envoy, &a.down.envoy]));
    envoys.extend(budgeted.iter().map(|(_, _, gw)| &gw.envoy));
    pin(&envoys);

    let bare_url = &baselines[0].2;
    println!(
        "Paired: Envoy 1.40, one worker each, one keep-alive connection to each, {secs} s per comparison, each request to the bare Envoy paired with one to the other"
    );
    for kib in sizes_kib() {
        let label = size_label(kib);
        let b = body(kib * 1024);
        paired(bare_url, &bare_again_url, None, &b, secs)
            .await
            .print(&label, "bare Envoy vs itself (the zero)");
        for (baseline, _, url) in &baselines[1..] {
            paired(bare_url, url, None, &b, secs)
                .await
                .print(&label, &format!("{} vs bare", baseline.label()));
        }
        for (name, gw) in &gateways {
            let url = format!("{}/v1/messages", gw.base);
            let result = paired(bare_url, &url, Some(&token), &b, secs).await;
            result.print(&label, &format!("{name} vs bare"));
            result.verdict(kib, name);
        }
        // Shadow on against the same build with shadow off: what mirroring adds to the
        // live call, with the mirror service up, slow and down.
        for arms in &shadows {
            let off = url_of(&arms.build);
            for (what, gw, mode) in [
                ("up", &arms.up, Some(Mode::Take)),
                (
                    "slow 10 s",
                    &arms.up,
                    Some(Mode::Slow(Duration::from_secs(10))),
                ),
                ("down", &arms.down, None),
            ] {
                if let Some(mode) = mode {
                    arms.mirror.set(mode);
                }
                let mirror = mode.map(|_| &arms.mirror);
                let before = shadow_fate(gw, mirror);
                let on = format!("{}/v1/messages", gw.base);
                paired(&off, &on, Some(&token), &b, secs).await.print(
                    &label,
                    &format!("{} shadow, service {what} vs off", arms.build),
                );
                print_fate(&before, &shadow_fate(gw, mirror));
            }
            arms.mirror.set(Mode::Take);
        }
        // Each build with the budget check against the same build without.
        for (name, off, gw) in &budgeted {
            let on = format!("{}/v1/messages", gw.base);
            paired(&url_of(off), &on, Some(&token), &b, secs)
                .await
                .print(&label, &format!("{name} vs off"));
        }
        // Each build against its baseline directly: what the change between them costs.
        for (current, baseline) in &baselines_of {
            paired(&url_of(baseline), &url_of(current), Some(&token), &b, secs)
                .await
                .print(&label, &format!("{current} vs {baseline}"));
        }
    }
    if std::env::var_os("HALO_BENCH_LOAD").is_none() {
        drop(baselines);
        micro_rewrite();
        return;
    }
    println!();

    println!(
        "Envoy 1.40, one worker each, {conns} keep-alive connections, {secs} s per cell, closed loop, {reps} interleaved rep(s); cpu = Envoy's CPU per request"
    );
    let row = |body: &str, what: &str, r: &Result| {
        println!(
            "{body:>7}  {what:<26} {:>7.0} rps  p50 {:>6.0} us  p99 {:>6.0} us  cpu {:>6.0} us",
            r.rps, r.p50_us, r.p99_us, r.cpu_us
        );
    };
    for kib in sizes_kib() {
        let label = size_label(kib);
        let b = body(kib * 1024);
        // Per build, per rep: (rps ratio, +p50, +cpu) against bare, and (+p50, +cpu)
        // against the floor.
        let mut vs_bare = vec![Vec::new(); gateways.len()];
        let mut vs_floor = vec![Vec::new(); gateways.len()];
        // The floor itself against bare: what the halo route costs Envoy before the filter
        // does anything, the reference the targets sit on.
        let mut floor_vs_bare = Vec::new();
        for _ in 0..reps {
            let mut base = Vec::new();
            for (baseline, envoy, url) in &baselines {
                let r = load(envoy, url.clone(), None, b.clone(), conns, secs).await;
                row(&label, baseline.label(), &r);
                base.push(r);
            }
            // Baseline::ALL's order: bare first, read in full + failover last.
            let (bare_r, floor_r) = (&base[0], &base[2]);
            floor_vs_bare.push((
                floor_r.rps / bare_r.rps,
                floor_r.p50_us - bare_r.p50_us,
                floor_r.cpu_us - bare_r.cpu_us,
            ));
            for (i, (name, gw)) in gateways.iter().enumerate() {
                let halo_r = load(
                    &gw.envoy,
                    format!("{}/v1/messages", gw.base),
                    Some(token.clone()),
                    b.clone(),
                    conns,
                    secs,
                )
                .await;
                row(&label, name, &halo_r);
                vs_bare[i].push((
                    halo_r.rps / bare_r.rps,
                    halo_r.p50_us - bare_r.p50_us,
                    halo_r.cpu_us - bare_r.cpu_us,
                ));
                vs_floor[i].push((
                    halo_r.p50_us - floor_r.p50_us,
                    halo_r.cpu_us - floor_r.cpu_us,
                ));
            }
        }
        let med = |f: &dyn Fn(usize) -> f64| median(&mut (0..reps).map(f).collect::<Vec<_>>());
        let medians = if reps > 1 { " (medians)" } else { "" };
        println!(
            "{label:>7}  read in full + failover vs bare Envoy: {:.2}x rps, p50 {:+.0} us, cpu {:+.0} us{medians}",
            med(&|r| floor_vs_bare[r].0),
            med(&|r| floor_vs_bare[r].1),
            med(&|r| floor_vs_bare[r].2),
        );
        for (i, (name, _)) in gateways.iter().enumerate() {
            let (bare, floor) = (&vs_bare[i], &vs_floor[i]);
            println!(
                "{label:>7}  {name} vs bare Envoy: {:.2}x rps, p50 {:+.0} us, cpu {:+.0} us; vs read in full + failover: p50 {:+.0} us, cpu {:+.0} us{}",
                med(&|r| bare[r].0),
                med(&|r| bare[r].1),
                med(&|r| bare[r].2),
                med(&|r| floor[r].0),
                med(&|r| floor[r].1),
                medians,
            );
        }
    }
    drop(baselines);
    micro_rewrite();
}

/// The callgrind mode: instructions per request of each baseline and build, per size.
async fn count_instructions(
    snap: &halo_policy::Snapshot,
    upstream: &str,
    no_jwt: bool,
    modules: &[(String, std::path::PathBuf)],
    token: &str,
    requests: usize,
) {
    // HALO_BENCH_CALLGRIND_KEEP=<dir>: keep each Envoy's profile of the counted requests
    // there (`<kib>k-<name>.callgrind`), for callgrind_annotate.
    let keep = std::env::var_os("HALO_BENCH_CALLGRIND_KEEP").map(std::path::PathBuf::from);
    println!(
        "Envoy 1.40 under callgrind, one worker; instructions Envoy executes per request (user space, all threads), over {requests} sequential requests after 20 warm-up ones"
    );
    for kib in sizes_kib() {
        let b = body(kib * 1024);
        let mut bare = None;
        let mut rows: Vec<(String, f64)> = Vec::new();
        for baseline in Baseline::ALL {
            let port = halo_testkit::free_port();
            let admin = halo_testkit::free_port();
            let envoy = tokio::task::block_in_place(|| {
                Envoy::start_under_callgrind(
                    &bare_bootstrap(port, admin, upstream, baseline),
                    admin,
                )
            });
            let url = format!("http://127.0.0.1:{port}/v1/messages");
            let save = keep
                .as_ref()
                .map(|d| profile_path(d, kib, baseline.label()));
            let n = count(&envoy, &url, None, &b, requests, save.as_deref());
            bare.get_or_insert(n);
            rows.push((baseline.label().to_string(), n));
        }
        for (name, module) in modules {
            let mut opts = GatewayOptions {
                wasm_path: Some(module.clone()),
                callgrind: true,
                ..GatewayOptions::default()
            };
            if no_jwt {
                opts.settings = json!({"identity": {"mode": "none"}});
            }
            let gw = Gateway::start(snap.clone(), opts);
            let url = format!("{}/v1/messages", gw.base);
            let save = keep.as_ref().map(|d| profile_path(d, kib, name));
            let n = count(&gw.envoy, &url, Some(token), &b, requests, save.as_deref());
            rows.push((name.clone(), n));
        }
        let bare = bare.unwrap_or(1.0);
        for (name, n) in rows {
            println!(
                "{:>7} KB  {name:<26} {n:>10.0} instructions/request  {:>5.2}x bare",
                kib,
                n / bare
            );
        }
    }
}

/// Where HALO_BENCH_CALLGRIND_KEEP keeps the profile of `name` at `kib`.
fn profile_path(dir: &std::path::Path, kib: usize, name: &str) -> std::path::PathBuf {
    dir.join(format!("{kib}k-{}.callgrind", name.replace([' ', '+'], "")))
}

/// Instructions per request over `requests` sequential requests on one connection (the
/// profile copied to `save`).
fn count(
    envoy: &Envoy,
    url: &str,
    auth: Option<&str>,
    body: &[u8],
    requests: usize,
    save: Option<&std::path::Path>,
) -> f64 {
    let handle = tokio::runtime::Handle::current();
    tokio::task::block_in_place(|| {
        let client = halo_e2e::client_builder()
            .pool_max_idle_per_host(1)
            .timeout(Duration::from_secs(120))
            .build()
            .expect("client");
        let send = |n: usize| {
            handle.block_on(async {
                for _ in 0..n {
                    let mut req = client.post(url).body(body.to_vec());
                    if let Some(a) = auth {
                        req = req.header("authorization", a);
                    }
                    let resp = req.send().await.expect("send");
                    assert_eq!(resp.status().as_u16(), 200, "bench request failed");
                    let _ = resp.bytes().await.expect("body");
                }
            })
        };
        send(20);
        let total = envoy
            .count_instructions(|| send(requests), save)
            .expect("callgrind counted nothing (is valgrind installed?)");
        total as f64 / requests as f64
    })
}

fn size_label(kib: usize) -> String {
    if kib >= 1024 && kib.is_multiple_of(1024) {
        format!("{} MB", kib / 1024)
    } else {
        format!("{kib} KB")
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}
