//! Body probe benchmark: the serde_json probe admit used to run against `body_scan::scan`,
//! in the same process, on conversation bodies of 4 KB, 100 KB and 1 MB and on a body
//! heavy with tool schemas (many small nested objects). Prints microseconds per call and
//! the speedup; then the scan fed in 64 KB pieces (`body_scan::Incremental`) against the
//! one-shot scan at 1 MB and on the tool schemas, and their ratio. Asserts nothing but
//! that the probes agree.
//!
//! `cargo bench -p halo-policy --bench body_probe` (`HALO_BENCH_MS`: time per cell, default 2000).

use std::hint::black_box;
use std::time::{Duration, Instant};

use halo_policy::body_scan;
use serde_json::json;

#[path = "../tests/reference/serde_probe.rs"]
mod serde_probe;

use serde_probe::model_start_and_stream as serde_probe;

fn scan_probe(body: &[u8]) -> Option<(usize, bool)> {
    let top = body_scan::scan(body).ok()?;
    let (start, _) = top.model?;
    Some((
        start,
        top.stream.is_some_and(|(a, b)| &body[a..b] == b"true"),
    ))
}

/// The body as the filter sees it in Envoy: fed in 64 KB pieces as they arrive, then
/// finished.
fn pieces_probe(body: &[u8]) -> Option<(usize, bool)> {
    let mut scan = body_scan::Incremental::new();
    let mut end = 0;
    while end < body.len() {
        end = (end + PIECE).min(body.len());
        scan.feed(&body[..end]).ok()?;
    }
    let top = scan.finish(body).ok()?;
    let (start, _) = top.model?;
    Some((
        start,
        top.stream.is_some_and(|(a, b)| &body[a..b] == b"true"),
    ))
}

const PIECE: usize = 64 * 1024;

/// The gateway bench's shape: many ~150-byte user turns.
fn conversation(size: usize) -> Vec<u8> {
    let turn = json!({"role": "user", "content": "Refactor the parser so that it reports the line and column of every error it finds; keep the tests green."});
    let turn_len = turn.to_string().len() + 1;
    let n = (size.saturating_sub(80) / turn_len).max(1);
    let messages: Vec<_> = (0..n).map(|_| turn.clone()).collect();
    json!({"model": "haiku", "max_tokens": 16, "stream": true, "messages": messages})
        .to_string()
        .into_bytes()
}

/// A coding agent's tool list: nested JSON Schemas, short keys and strings, many objects.
fn tool_schemas(tools: usize) -> Vec<u8> {
    let tool = |i: usize| {
        json!({
            "name": format!("tool_{i}"),
            "description": "Run a command in the workspace and return its output.",
            "input_schema": {
                "type": "object",
                "additionalProperties": false,
                "required": ["command", "timeout"],
                "properties": {
                    "command": {"type": "string", "description": "The command line."},
                    "timeout": {"type": "integer", "minimum": 0, "maximum": 600000},
                    "env": {"type": "object", "additionalProperties": {"type": "string"}},
                    "mode": {"enum": ["read", "write", "exec", null], "default": "read"},
                    "paths": {"type": "array", "items": {"type": "object", "properties": {
                        "path": {"type": "string"}, "line": {"type": "number"},
                        "flags": {"type": "array", "items": {"type": "boolean"}}}}}
                }
            }
        })
    };
    let tools: Vec<_> = (0..tools).map(tool).collect();
    json!({"model": "sonnet", "max_tokens": 4096, "tools": tools,
           "messages": [{"role": "user", "content": "hi"}]})
    .to_string()
    .into_bytes()
}

type ProbeFn = fn(&[u8]) -> Option<(usize, bool)>;

/// Microseconds per call of each probe: batches of about 20 ms, alternating between the
/// probes so that both see the same machine, for `budget`; the best batch of each counts
/// (on a shared machine the minimum is the reproducible number, other load only adds).
fn time(budget: Duration, body: &[u8], probes: [ProbeFn; 2]) -> [f64; 2] {
    let batch = |f: ProbeFn, n: u32| {
        let t = Instant::now();
        for _ in 0..n {
            black_box(f(black_box(body)));
        }
        t.elapsed().as_secs_f64() * 1e6 / f64::from(n)
    };
    let calls = probes.map(|f| {
        let t = Instant::now();
        let mut n = 0u32;
        while t.elapsed() < Duration::from_millis(20) {
            black_box(f(black_box(body)));
            n += 1;
        }
        n
    });
    let mut best = [f64::MAX; 2];
    let start = Instant::now();
    while start.elapsed() < budget {
        for k in 0..2 {
            best[k] = best[k].min(batch(probes[k], calls[k]));
        }
    }
    best
}

fn main() {
    let ms = std::env::var("HALO_BENCH_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let budget = Duration::from_millis(ms);
    let cases = [
        ("conversation 4 KB", conversation(4 * 1024)),
        ("conversation 100 KB", conversation(100 * 1024)),
        ("conversation 1 MB", conversation(1024 * 1024)),
        ("tool schemas", tool_schemas(400)),
    ];
    println!("| body                | bytes     | serde probe | body_scan | speedup | scan GB/s |");
    println!("|---------------------|----------:|------------:|----------:|--------:|----------:|");
    for (name, body) in &cases {
        assert_eq!(
            serde_probe(body),
            scan_probe(body),
            "{name}: probes disagree"
        );
        assert!(scan_probe(body).is_some(), "{name}: must be admitted");
        let [serde, scan] = time(budget, body, [serde_probe, scan_probe]);
        println!(
            "| {name:<19} | {:>9} | {serde:>8.1} us | {scan:>6.1} us | {:>6.1}x | {:>9.2} |",
            body.len(),
            serde / scan,
            body.len() as f64 / scan / 1e3,
        );
    }
    // Fed in pieces, the scan costs what it costs in one go: the pieces only move it off
    // the critical path (it overlaps the upload).
    println!();
    println!("| body                | body_scan | incremental, 64 KB pieces | ratio |");
    println!("|---------------------|----------:|--------------------------:|------:|");
    for (name, body) in &cases[2..] {
        assert_eq!(
            scan_probe(body),
            pieces_probe(body),
            "{name}: scans disagree"
        );
        let [scan, pieces] = time(budget, body, [scan_probe, pieces_probe]);
        println!(
            "| {name:<19} | {scan:>6.1} us | {pieces:>22.1} us | {:>5.2} |",
            pieces / scan,
        );
    }
}
