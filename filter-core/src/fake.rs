//! A fake Envoy for the flows' tests: one stream's headers, body and properties, what the
//! flow wrote into them, its local reply, logs and counts. `PIECEWISE` picks which kind
//! of host it plays: the native build's (each piece handed once) or the wasm build's (the
//! body readable at offsets until the end).

use std::cell::RefCell;
use std::sync::Arc;
use std::time::Duration;

use halo_contract::facts::Fact;

use halo_policy::Snapshot;

use crate::breaker::Breakers;
use crate::config::{Config, IdentitySettings};
use crate::host::{Host, Level, Next, Telemetry};
use crate::killstate::Enforced;
use crate::metrics::Counter;
use crate::pipeline::{PrefixEdit, VerifiedClaims};
use crate::request::{Policy, RequestFlow};
use crate::stage::StageFlow;

/// A local reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Sent {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }

    pub fn error_type(&self) -> String {
        self.json()["error"]["type"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }
}

/// Logs and counts, kept.
#[derive(Default)]
pub struct Recorder {
    pub logs: RefCell<Vec<(Level, String)>>,
    /// One entry per count or add.
    pub counts: RefCell<Vec<String>>,
    /// What was added to each counter in all.
    pub sums: RefCell<std::collections::BTreeMap<String, u64>>,
}

impl Telemetry for Recorder {
    fn log(&self, level: Level, message: &str) {
        self.logs.borrow_mut().push((level, message.to_string()));
    }

    fn add(&self, counter: Counter<'_>, amount: u64) {
        let name = counter.dotted();
        *self.sums.borrow_mut().entry(name.clone()).or_default() += amount;
        self.counts.borrow_mut().push(name);
    }
}

impl Recorder {
    /// What was added to counter `dotted` in all.
    pub fn sum_of(&self, dotted: &str) -> u64 {
        self.sums.borrow().get(dotted).copied().unwrap_or(0)
    }

    pub fn count_of(&self, dotted: &str) -> usize {
        self.counts.borrow().iter().filter(|c| *c == dotted).count()
    }
}

/// One stream in a fake Envoy.
#[derive(Default)]
pub struct FakeEnvoy<const PIECEWISE: bool> {
    /// Request headers as Envoy holds them (after the flow's writes: what goes upstream).
    pub request: Vec<(String, String)>,
    pub response: Vec<(String, String)>,
    pub peer: Option<String>,
    /// What jwt_authn verified (the fake's stand-in for metadata or the payload header).
    pub claims: Option<VerifiedClaims>,
    pub note: Option<Vec<u8>>,
    pub facts: Option<Vec<u8>>,
    pub response_code: Option<u32>,
    pub response_code_details: Option<String>,
    /// The request body Envoy holds (every piece so far, with the flow's edits).
    pub body: Vec<u8>,
    /// The length of the piece handed to the current body hook (piecewise).
    pub piece: usize,
    /// The response piece of the current response-body hook.
    pub response_piece: Vec<u8>,
    pub sent: Option<Sent>,
    pub route_refreshes: usize,
    /// How many body edits the flow wrote (early and at the end).
    pub edits: usize,
    pub rec: Recorder,
    /// The evidence facts the flow wrote (filter state), by key.
    pub state: std::collections::BTreeMap<&'static str, String>,
    /// How many fact writes the flow made.
    pub fact_writes: usize,
    /// The serving endpoint's `filter_metadata.halo` strings.
    pub served: Vec<(String, String)>,
    /// The clock [`Host::now`] reads.
    pub clock: Duration,
    /// Envoy's count of the stream's upstream attempts (`None`: not known).
    pub attempts: Option<u32>,
    /// The worker's breakers: give each stream of a test a clone of one.
    pub breakers: std::rc::Rc<RefCell<Breakers>>,
    /// The callouts the flow started: (cluster, headers, body, timeout ms).
    pub callouts: Vec<Callout>,
    /// Whether Envoy starts a callout (false: as with its circuit breaker open).
    pub refuse_callouts: bool,
}

/// One callout the flow started.
#[derive(Debug, Clone, Default)]
pub struct Callout {
    pub cluster: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub timeout_ms: u64,
}

impl<const P: bool> FakeEnvoy<P> {
    pub fn with_headers(headers: &[(&str, &str)]) -> Self {
        FakeEnvoy {
            request: headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
            ..FakeEnvoy::default()
        }
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.request
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn set_header(&mut self, name: &str, value: Option<&str>) {
        Self::set(&mut self.request, name, value);
    }

    fn set(map: &mut Vec<(String, String)>, name: &str, value: Option<&str>) {
        map.retain(|(n, _)| n != name);
        if let Some(v) = value {
            map.push((name.to_string(), v.to_string()));
        }
    }
}

impl<const P: bool> Telemetry for FakeEnvoy<P> {
    fn log(&self, level: Level, message: &str) {
        self.rec.log(level, message);
    }

    fn add(&self, counter: Counter<'_>, amount: u64) {
        self.rec.add(counter, amount);
    }
}

impl<const P: bool> Host for FakeEnvoy<P> {
    const PIECEWISE: bool = P;

    fn request_headers(&self) -> Vec<(String, String)> {
        self.request.clone()
    }

    fn request_header(&self, name: &str) -> Option<String> {
        self.header(name).map(str::to_string)
    }

    fn set_request_header(&mut self, name: &str, value: Option<&str>) {
        Self::set(&mut self.request, name, value);
    }

    fn response_header(&self, name: &str) -> Option<String> {
        self.response
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    }

    fn set_response_header(&mut self, name: &str, value: Option<&str>) {
        Self::set(&mut self.response, name, value);
    }

    fn peer_address(&self) -> Option<String> {
        self.peer.clone()
    }

    fn verified_claims(
        &self,
        _identity: &IdentitySettings,
        _headers: &[(String, String)],
    ) -> Option<VerifiedClaims> {
        self.claims.clone()
    }

    fn response_code(&self) -> Option<u32> {
        self.response_code
    }

    fn response_code_details(&self) -> Option<String> {
        self.response_code_details.clone()
    }

    fn attempt_count(&self) -> Option<u32> {
        self.attempts
    }

    fn with_breakers<R>(&self, f: impl FnOnce(&mut Breakers) -> R) -> R {
        f(&mut self.breakers.borrow_mut())
    }

    fn set_attempt_note(&mut self, value: &[u8]) {
        self.note = Some(value.to_vec());
    }

    fn attempt_note(&self) -> Option<Vec<u8>> {
        self.note.clone()
    }

    fn endpoint_facts(&self) -> Option<Vec<u8>> {
        self.facts.clone()
    }

    fn refresh_route(&mut self) {
        self.route_refreshes += 1;
    }

    fn send_response(&mut self, status: u16, headers: &[(String, String)], body: &[u8]) {
        assert!(self.sent.is_none(), "one local reply per stream");
        self.sent = Some(Sent {
            status,
            headers: headers.to_vec(),
            body: body.to_vec(),
        });
    }

    fn request_body_total(&self, held: usize) -> usize {
        if P {
            held + self.piece
        } else {
            self.body.len()
        }
    }

    fn copy_request_body(&mut self, body: &mut Vec<u8>, limit: usize) {
        let from = if P {
            self.body.len() - self.piece
        } else {
            body.len()
        };
        let to = if P {
            self.body.len()
        } else {
            self.body.len().min(limit).max(from)
        };
        body.extend_from_slice(&self.body[from..to]);
    }

    fn write_body_edit(&mut self, edit: &PrefixEdit, body: &[u8]) {
        // The contract: `body` is the body as received; Envoy holds it untouched (plus,
        // when the edit is written early, nothing more).
        assert!(
            self.body.starts_with(body.get(..edit.drop).unwrap_or(body)),
            "an edit written over a body already edited"
        );
        self.edits += 1;
        self.body = edit.apply(&self.body);
    }

    fn replace_request_body(&mut self, edit: &PrefixEdit, body: &[u8]) {
        self.edits += 1;
        self.body = edit.apply(body);
    }

    fn now(&self) -> Duration {
        self.clock
    }

    fn set_fact(&mut self, fact: Fact, value: &str) {
        self.fact_writes += 1;
        self.state.insert(fact.state_key(), value.to_string());
    }

    fn served_metadata(&self, key: &str) -> Option<String> {
        self.served
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    }

    fn response_body(&self) -> Vec<u8> {
        self.response_piece.clone()
    }

    fn set_response_body(&mut self, bytes: &[u8]) {
        self.response_piece = bytes.to_vec();
    }

    fn dispatch(
        &mut self,
        cluster: &str,
        headers: &[(String, String)],
        body: &[u8],
        timeout_ms: u64,
    ) -> bool {
        if self.refuse_callouts {
            return false;
        }
        self.callouts.push(Callout {
            cluster: cluster.to_string(),
            headers: headers.to_vec(),
            body: body.to_vec(),
            timeout_ms,
        });
        true
    }
}

/// A policy for the tests: the configuration and the kill list in force.
pub struct TestPolicy {
    pub cfg: Config,
    pub enforced: Enforced,
    pub rec: Recorder,
}

impl TestPolicy {
    pub fn new(cfg: Config, now_unix: i64) -> TestPolicy {
        let rec = Recorder::default();
        let enforced = Enforced::start(&cfg, now_unix, &rec);
        TestPolicy { cfg, enforced, rec }
    }
}

impl Policy for TestPolicy {
    fn config(&self) -> &Config {
        &self.cfg
    }

    fn snapshot(&self) -> Arc<Snapshot> {
        self.enforced.effective().clone()
    }
}

/// What a request did: the hooks' answers and the fake Envoy after them.
pub struct Run<const P: bool> {
    pub envoy: FakeEnvoy<P>,
    /// The request hooks' answers.
    pub answers: Vec<Next>,
    /// The request filter's answer to the response headers (when it did not reply itself).
    pub response: Option<Next>,
}

/// Run the request filter on a request whose headers are in `envoy` and whose body
/// arrives in `pieces` (none: it ends with its headers), then complete the stream with
/// `status` (the reply's when the flow answered), an upstream's answer.
pub fn request<const P: bool>(
    policy: &TestPolicy,
    envoy: FakeEnvoy<P>,
    pieces: &[&[u8]],
    status: u32,
) -> Run<P> {
    request_answered(policy, envoy, pieces, status, "via_upstream")
}

/// [`request`], with the answer's status and Envoy's response code details (`details`)
/// passed to the request filter's answer path unless the flow answered itself.
pub fn request_answered<const P: bool>(
    policy: &TestPolicy,
    mut envoy: FakeEnvoy<P>,
    pieces: &[&[u8]],
    status: u32,
    details: &str,
) -> Run<P> {
    let mut flow = RequestFlow::new();
    let mut answers = vec![flow.on_request_headers(&mut envoy, policy, pieces.is_empty())];
    for (i, piece) in pieces.iter().enumerate() {
        if envoy.sent.is_some() {
            break;
        }
        envoy.body.extend_from_slice(piece);
        envoy.piece = piece.len();
        answers.push(flow.on_request_body(&mut envoy, policy, i + 1 == pieces.len()));
    }
    let mut response = None;
    if envoy.sent.is_none() {
        envoy.response = vec![(":status".into(), status.to_string())];
        envoy.response_code_details = Some(details.to_string());
        response = Some(flow.on_response_headers(&mut envoy, policy, false));
    }
    envoy.response_code = Some(envoy.sent.as_ref().map_or(status, |s| u32::from(s.status)));
    flow.on_stream_complete(&mut envoy);
    Run {
        envoy,
        answers,
        response,
    }
}

/// An upstream's answer as the request filter sees it: headers, then the body in
/// pieces, each arriving `step` after the one before (the first `step` after the
/// request); `cut`: the stream is reset after the last piece, without its end.
pub struct Answer<'a> {
    pub headers: &'a [(&'a str, &'a str)],
    pub pieces: Vec<&'a [u8]>,
    pub step: Duration,
    pub cut: bool,
}

/// Run the request filter on a request (as [`request`]), then on `answer`, then complete
/// the stream. Returns the run and the answer's bytes as the client got them.
pub fn call<const P: bool>(
    policy: &TestPolicy,
    mut envoy: FakeEnvoy<P>,
    pieces: &[&[u8]],
    answer: &Answer<'_>,
) -> (Run<P>, Vec<u8>) {
    let mut flow = RequestFlow::new();
    let mut answers = vec![flow.on_request_headers(&mut envoy, policy, pieces.is_empty())];
    for (i, piece) in pieces.iter().enumerate() {
        envoy.body.extend_from_slice(piece);
        envoy.piece = piece.len();
        answers.push(flow.on_request_body(&mut envoy, policy, i + 1 == pieces.len()));
    }
    envoy.response = answer
        .headers
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    envoy.response_code_details = Some("via_upstream".into());
    envoy.clock += answer.step;
    let no_body = answer.pieces.is_empty() && !answer.cut;
    let response = Some(flow.on_response_headers(&mut envoy, policy, no_body));
    let mut out = Vec::new();
    for (i, piece) in answer.pieces.iter().enumerate() {
        if i > 0 {
            envoy.clock += answer.step;
        }
        envoy.response_piece = piece.to_vec();
        let last = i + 1 == answer.pieces.len() && !answer.cut;
        answers.push(flow.on_response_body(&mut envoy, last));
        out.extend_from_slice(&envoy.response_piece);
    }
    envoy.response_code = envoy
        .response
        .iter()
        .find(|(n, _)| n == ":status")
        .and_then(|(_, v)| v.parse().ok());
    flow.on_stream_complete(&mut envoy);
    (
        Run {
            envoy,
            answers,
            response,
        },
        out,
    )
}

/// Run the per-attempt stage on an attempt (note, facts and headers in `envoy`) whose
/// body arrives in `pieces`.
pub fn attempt<const P: bool>(mut envoy: FakeEnvoy<P>, pieces: &[&[u8]]) -> Run<P> {
    let mut flow = StageFlow::new();
    let mut answers = vec![flow.on_request_headers(&mut envoy, pieces.is_empty())];
    for (i, piece) in pieces.iter().enumerate() {
        if envoy.sent.is_some() {
            break;
        }
        envoy.body.extend_from_slice(piece);
        envoy.piece = piece.len();
        answers.push(flow.on_request_body(&mut envoy, i + 1 == pieces.len()));
    }
    Run {
        envoy,
        answers,
        response: None,
    }
}

/// Run the stage's response side on an answer with `headers` in `pieces`.
pub fn answer<const P: bool>(
    flow: &mut StageFlow,
    envoy: &mut FakeEnvoy<P>,
    headers: &[(&str, &str)],
    pieces: &[&[u8]],
) -> Vec<u8> {
    envoy.response = headers
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    flow.on_response_headers(envoy);
    let mut out = Vec::new();
    for (i, piece) in pieces.iter().enumerate() {
        envoy.response_piece = piece.to_vec();
        flow.on_response_body(envoy, i + 1 == pieces.len());
        out.extend_from_slice(&envoy.response_piece);
    }
    out
}
