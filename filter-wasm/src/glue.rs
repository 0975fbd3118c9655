//! The proxy-wasm trait impls (wasm32 only). Read Envoy state, call the pure modules,
//! write Envoy state. No decisions here.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, UNIX_EPOCH};

use halo_envoy_config::names::{ENDPOINT_FACTS_KEY, METADATA_NAMESPACE};
use halo_policy::Snapshot;
use halo_policy::admit;
use halo_policy::body_scan::Incremental;
use halo_policy::cluster_names::EndpointFacts;
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel, MetricType};

use crate::attempt::{self, ATTEMPT_PROPERTY, Note, Work};
use crate::cidr;
use crate::config::{Config, IdentityMode, Plugin};
use crate::hygiene;
use crate::killstate::{FetchOutcome, KillState};
use crate::metrics;
use crate::pipeline::{self, Forward, Head, Pending, Reply, VerifiedClaims};
use halo_providers::ResponseConversion;
use halo_providers::eventstream::EventStreamToSse;

/// Shared-data keys (one VM id is shared by every worker's copy of the plugin).
const SHARED_ENVELOPE: &str = "halo.killswitch.envelope";
const SHARED_NEXT_POLL: &str = "halo.killswitch.next_poll_ms";
const JWT_METADATA: &str = "envoy.filters.http.jwt_authn";

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root::default()) });
}}

/// Per-VM state shared by the root context and this worker's HTTP contexts.
struct State {
    cfg: Config,
    kill: KillState,
    /// The snapshot with the held kill list applied.
    effective: Rc<Snapshot>,
    metric_ids: HashMap<String, u32>,
}

impl State {
    fn count(&mut self, name: String) {
        let id = match self.metric_ids.get(&name) {
            Some(id) => *id,
            None => match hostcalls::define_metric(MetricType::Counter, &name) {
                Ok(id) => {
                    self.metric_ids.insert(name, id);
                    id
                }
                Err(_) => return,
            },
        };
        let _ = hostcalls::increment_metric(id, 1);
    }

    fn misconfigured(&self) -> bool {
        self.cfg
            .kill_switch
            .as_ref()
            .is_some_and(|k| k.key.is_err())
    }
}

type Shared = Rc<RefCell<Option<State>>>;

#[derive(Default)]
struct Root {
    state: Shared,
    inflight: Option<u32>,
    /// This instance is the per-attempt stage (an upstream filter), not the request filter.
    attempt_stage: bool,
    /// The stage's counter of attempts that got another target's model.
    attempt_rewrites: Option<u32>,
}

fn now_ms() -> i64 {
    hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// WASI's environment calls, which Envoy provides to every wasm module: they return the
/// variables listed in the plugin's `vm_config.environment_variables`.
mod wasi {
    #[link(wasm_import_module = "wasi_snapshot_preview1")]
    unsafe extern "C" {
        pub fn environ_sizes_get(count: *mut usize, buf_size: *mut usize) -> u16;
        pub fn environ_get(environ: *mut *mut u8, environ_buf: *mut u8) -> u16;
    }
}

/// A variable of the plugin VM's environment (WASI's `NAME=value` entries).
fn vm_env(name: &str) -> Option<String> {
    let (mut count, mut size) = (0usize, 0usize);
    // SAFETY: environ_get writes `count` pointers and `size` bytes, the sizes the first
    // call reported, into buffers of exactly those sizes.
    let buf = unsafe {
        if wasi::environ_sizes_get(&mut count, &mut size) != 0 {
            return None;
        }
        let mut pointers: Vec<*mut u8> = vec![std::ptr::null_mut(); count];
        let mut buf = vec![0u8; size];
        if wasi::environ_get(pointers.as_mut_ptr(), buf.as_mut_ptr()) != 0 {
            return None;
        }
        buf
    };
    crate::config::env_entry(&buf, name)
}

fn log(level: LogLevel, message: &str) {
    let _ = hostcalls::log(level, message);
}

impl Context for Root {
    fn on_http_call_response(
        &mut self,
        token: u32,
        _headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        if self.inflight != Some(token) {
            return;
        }
        self.inflight = None;
        let status = self
            .get_http_call_response_header(":status")
            .and_then(|s| s.parse::<u16>().ok());
        let body = self
            .get_http_call_response_body(0, body_size)
            .unwrap_or_default();
        let mut guard = self.state.borrow_mut();
        let Some(state) = guard.as_mut() else { return };
        let Some(Ok(key)) = state.cfg.kill_switch.as_ref().map(|k| k.key.clone()) else {
            return;
        };
        let outcome = state.kill.on_fetch(status, &body, &key, now_ms() / 1000);
        if outcome != FetchOutcome::Accepted && outcome != FetchOutcome::Unchanged {
            // The outcome only: never the body or the token.
            log(
                LogLevel::Warn,
                &format!(
                    "halo: kill list poll refused: {}; keeping the list in force",
                    outcome.as_str()
                ),
            );
        }
        state.count(metrics::killswitch_fetch(outcome.as_str()));
        if outcome == FetchOutcome::Accepted {
            state.effective = Rc::new(state.kill.effective(&state.cfg.snapshot));
        }
        publish(state, &key);
    }
}

/// Make the shared envelope at least as new as the one this worker holds.
fn publish(state: &State, key: &ed25519_compact::PublicKey) {
    let Some(held) = state.kill.held() else {
        return;
    };
    let (shared, cas) = hostcalls::get_shared_data(SHARED_ENVELOPE).unwrap_or((None, None));
    if let Some(bytes) = &shared {
        if bytes.as_slice() == held.envelope() {
            return;
        }
        if let Ok(other) = halo_policy::killswitch::restore(bytes, key)
            && other.issued_at() >= held.issued_at()
        {
            return;
        }
    }
    // A CAS conflict means another worker just wrote; the next tick reconciles.
    let _ = hostcalls::set_shared_data(SHARED_ENVELOPE, Some(held.envelope()), cas);
}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let bytes = self.get_plugin_configuration().unwrap_or_default();
        let cfg = match Plugin::from_bytes_with_env(&bytes, &vm_env) {
            Ok(Plugin::Request(cfg)) => *cfg,
            Ok(Plugin::Attempt) => {
                self.attempt_stage = true;
                self.attempt_rewrites =
                    hostcalls::define_metric(MetricType::Counter, &metrics::attempt_rewrites())
                        .ok();
                return true;
            }
            Err(e) => {
                log(LogLevel::Critical, &e.to_string());
                return false;
            }
        };
        if cfg.kill_switch.as_ref().is_some_and(|k| k.key.is_ok()) {
            self.set_tick_period(Duration::from_secs(1));
        }
        for warning in cfg.start_warnings() {
            log(LogLevel::Error, &warning);
        }
        let (kill, pushed) = KillState::at_start(&cfg, now_ms() / 1000);
        let effective = Rc::new(kill.effective(&cfg.snapshot));
        let mut state = State {
            cfg,
            kill,
            effective,
            metric_ids: HashMap::new(),
        };
        if let Some(outcome) = pushed {
            if outcome != FetchOutcome::Accepted {
                log(
                    LogLevel::Error,
                    &format!("halo: pushed kill list refused: {}", outcome.as_str()),
                );
            }
            state.count(metrics::killswitch_fetch(outcome.as_str()));
            if let Some(Ok(key)) = state.cfg.kill_switch.as_ref().map(|k| k.key.clone()) {
                publish(&state, &key);
            }
        }
        *self.state.borrow_mut() = Some(state);
        true
    }

    fn on_tick(&mut self) {
        let mut guard = self.state.borrow_mut();
        let Some(state) = guard.as_mut() else { return };
        let Some(ks) = state.cfg.kill_switch.clone() else {
            return;
        };
        let Ok(key) = &ks.key else { return };
        // Adopt what another worker accepted.
        if let Ok((Some(bytes), _)) = hostcalls::get_shared_data(SHARED_ENVELOPE)
            && state.kill.adopt(&bytes, key)
        {
            state.effective = Rc::new(state.kill.effective(&state.cfg.snapshot));
        }
        if self.inflight.is_some() {
            return;
        }
        // One worker polls per interval: claim the slot with compare-and-swap.
        let now = now_ms();
        let (next, cas) = hostcalls::get_shared_data(SHARED_NEXT_POLL).unwrap_or((None, None));
        let due = next
            .and_then(|b| String::from_utf8(b).ok())
            .and_then(|s| s.parse::<i64>().ok())
            .is_none_or(|next| now >= next);
        if !due {
            return;
        }
        let next = (now + i64::from(ks.interval_secs) * 1000).to_string();
        if hostcalls::set_shared_data(SHARED_NEXT_POLL, Some(next.as_bytes()), cas).is_err() {
            return;
        }
        let auth = format!("Bearer {}", ks.token);
        let headers = vec![
            (":method", "GET"),
            (":path", ks.path.as_str()),
            (":authority", ks.authority.as_str()),
            ("authorization", auth.as_str()),
            ("accept", "application/json"),
        ];
        match self.dispatch_http_call(&ks.cluster, headers, None, vec![], Duration::from_secs(5)) {
            Ok(token) => self.inflight = Some(token),
            Err(_) => state.count(metrics::killswitch_fetch(FetchOutcome::HttpError.as_str())),
        }
    }

    fn create_http_context(&self, _id: u32) -> Option<Box<dyn HttpContext>> {
        if self.attempt_stage {
            return Some(Box::new(Attempt {
                rewrites: self.attempt_rewrites,
                note: None,
                work: Work::None,
                convert: None,
            }));
        }
        Some(Box::new(Http {
            state: self.state.clone(),
            pending: None,
            headers: Vec::new(),
            body: Vec::new(),
            scan: None,
            removals: Vec::new(),
            ring: None,
            variant: None,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Http {
    state: Shared,
    pending: Option<Pending>,
    /// The request headers as they reached this filter, names lowercase.
    headers: Vec<(String, String)>,
    /// The body received so far. Envoy hands it over in pieces while it arrives; each
    /// piece is copied in and scanned then, so when the last byte is in only the last
    /// piece is left to scan (the scan overlaps the upload).
    body: Vec<u8>,
    /// The scan of `body`, for requests whose body admit reads.
    scan: Option<Incremental>,
    removals: Vec<String>,
    ring: Option<String>,
    variant: Option<String>,
}

impl Http {
    fn reply(&mut self, reply: Reply) -> Action {
        if reply.reason == "auth"
            && let Some(state) = self.state.borrow_mut().as_mut()
        {
            state.count(metrics::auth_failures());
        }
        let headers: Vec<(&str, &str)> = reply
            .headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        self.send_http_response(u32::from(reply.status), headers, Some(&reply.body));
        Action::Pause
    }

    fn claims(&self, cfg: &Config) -> Option<VerifiedClaims> {
        let claim = |name: &str| {
            self.get_property(vec![
                "metadata",
                "filter_metadata",
                JWT_METADATA,
                &cfg.identity.jwt_metadata_key,
                name,
            ])
        };
        let user = claim(&cfg.identity.user_claim).and_then(|b| String::from_utf8(b).ok())?;
        let email_verified = claim("email_verified").map(|b| b == [1] || b == b"true");
        let groups = claim(&cfg.identity.groups_claim)
            .map(|b| crate::claims::parse_string_list(&b))
            .unwrap_or_default();
        Some(VerifiedClaims {
            user: Some(user),
            email_verified,
            groups,
        })
    }

    /// The body-time step and writing its result into the request.
    fn finish(&mut self, body: &[u8]) -> Action {
        let Some(pending) = self.pending.take() else {
            return Action::Continue;
        };
        let scanned = self.scan.take().map(|scan| scan.finish(body));
        let shared = self.state.clone();
        let result = match shared.borrow().as_ref() {
            None => Err(unavailable()),
            Some(state) => {
                let snap = state.effective.clone();
                pipeline::on_body(&state.cfg, &snap, &pending, body, scanned)
                    .map(|f| (f, state.misconfigured()))
            }
        };
        match result {
            Err(reply) => self.reply(reply),
            Ok((forward, misconfigured)) => {
                self.apply(forward, misconfigured);
                Action::Continue
            }
        }
    }

    fn apply(&mut self, mut forward: Forward, misconfigured: bool) {
        for name in hygiene::to_remove(&self.removals, &self.headers, &forward.stamps) {
            self.set_http_request_header(name, None);
        }
        if let Some(path) = &forward.path {
            self.set_http_request_header(":path", Some(path));
        }
        if let Some(edit) = &forward.body {
            // At offset 0 Envoy drains `drop` bytes and prepends: the rest stays put.
            self.set_http_request_body(0, edit.drop, &edit.prefix);
            if edit.prefix.len() != edit.drop {
                // The whole body is here, so its new length is known: keep the upstream
                // request framed by length (a chunked one costs Envoy and the provider
                // more). Without a length the client sent it chunked, and so does Envoy.
                let length = pipeline::content_length(&self.headers).map(|len| {
                    (len + edit.prefix.len() as u64)
                        .saturating_sub(edit.drop as u64)
                        .to_string()
                });
                self.set_http_request_header("content-length", length.as_deref());
            }
        }
        if let Some(mut note) = forward.attempt_note.take() {
            // Every attempt starts from the client's values of the headers a translation
            // changes: an earlier attempt's changes stay in the shared header map.
            // The client's credentials are still here only with forwardAuth (hygiene
            // removed them otherwise): noted so each pass-through attempt gets them back.
            // Read from the headers kept at request-headers time, less what hygiene removed:
            // nothing else changes them in between, and each read from Envoy is a call.
            note.headers = attempt::noted_headers(&self.headers, &self.removals);
            self.set_property(
                vec![ATTEMPT_PROPERTY],
                Some(&note.encode(forward.first_pick.as_ref())),
            );
        }
        for (name, value) in &forward.stamps {
            self.set_http_request_header(name, Some(value));
        }
        if misconfigured {
            self.set_http_request_header(
                hygiene::KILLSWITCH,
                Some(hygiene::KILLSWITCH_MISCONFIGURED),
            );
        }
        if let Some(d) = &forward.decision
            && let Some(state) = self.state.borrow_mut().as_mut()
        {
            state.count(metrics::decisions(
                &d.ring,
                forward.variant.as_deref(),
                d.source.as_str(),
            ));
        }
        self.ring = Some(forward.ring);
        self.variant = forward.variant;
    }
}

fn unavailable() -> Reply {
    Reply {
        status: 503,
        headers: vec![("content-type".into(), "application/json".into())],
        body: br#"{"type":"error","error":{"type":"policy_unavailable","message":"the halo filter has no policy"}}"#.to_vec(),
        reason: "config",
    }
}

impl Context for Http {}

impl HttpContext for Http {
    fn on_http_request_headers(&mut self, _num: usize, end_of_stream: bool) -> Action {
        let headers: Vec<(String, String)> = self
            .get_http_request_headers()
            .into_iter()
            .map(|(n, v)| (n.to_ascii_lowercase(), v))
            .collect();
        let shared = self.state.clone();
        let guard = shared.borrow();
        let head_result = if let Some(state) = guard.as_ref() {
            let cfg = &state.cfg;
            let claims = (cfg.identity.mode == Some(IdentityMode::Jwt))
                .then(|| self.claims(cfg))
                .flatten();
            // Only trusted_header mode looks at the peer: no property call otherwise.
            let peer = (cfg.identity.mode == Some(IdentityMode::TrustedHeader))
                .then(|| self.get_property(vec!["source", "address"]))
                .flatten()
                .and_then(|b| String::from_utf8(b).ok())
                .and_then(|a| cidr::peer_ip(&a));
            let head = Head::new(&headers, peer, claims);
            self.removals = hygiene::removals(cfg, &headers);
            pipeline::on_head(cfg, &head)
        } else {
            Err(unavailable())
        };
        drop(guard);
        self.headers = headers;
        match head_result {
            Err(reply) => self.reply(reply),
            Ok(pending) => {
                if admit::body_carries_model(&pending.method, &pending.path) {
                    self.scan = Some(Incremental::new());
                }
                self.pending = Some(pending);
                if end_of_stream {
                    self.finish(&[])
                } else {
                    Action::Pause
                }
            }
        }
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.pending.is_none() {
            return Action::Continue;
        }
        let max = self
            .state
            .borrow()
            .as_ref()
            .map_or(0, |s| s.cfg.max_body_bytes);
        if u64::try_from(body_size).unwrap_or(u64::MAX) > max {
            self.pending = None;
            return self.reply(Reply::too_large(max));
        }
        // Envoy reports everything it holds so far: copy in only what is new.
        if body_size > self.body.len() {
            let more = self
                .get_http_request_body(self.body.len(), body_size - self.body.len())
                .unwrap_or_default();
            // Grown as the bytes arrive, never from the announced length: a client could
            // announce maxBodyBytes and send nothing.
            if self.body.is_empty() {
                self.body = more;
            } else {
                self.body.extend_from_slice(&more);
            }
        }
        if !end_of_stream {
            if let Some(scan) = self.scan.as_mut()
                && scan.feed(&self.body).is_err()
            {
                // Invalid already, whatever follows: admit refuses it with the scan's
                // reason (the error sticks), without waiting for the rest.
                let body = std::mem::take(&mut self.body);
                return self.finish(&body);
            }
            return Action::Pause;
        }
        let body = std::mem::take(&mut self.body);
        self.finish(&body)
    }

    fn on_log(&mut self) {
        let status = self
            .get_property(vec!["response", "code"])
            .and_then(|b| {
                b.get(..8)
                    .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
            })
            .and_then(|c| u32::try_from(c).ok())
            .unwrap_or(0);
        let ring = self
            .ring
            .clone()
            .unwrap_or_else(|| halo_policy::decide::UNKNOWN_RING.to_string());
        if let Some(state) = self.state.borrow_mut().as_mut() {
            state.count(metrics::requests(&ring, self.variant.as_deref(), status));
        }
    }
}

/// The per-attempt stage on one upstream attempt (see [`crate::attempt`]).
struct Attempt {
    rewrites: Option<u32>,
    note: Option<Note>,
    /// What waits for the body.
    work: Work,
    /// The Bedrock event stream to SSE conversion of this attempt's answer.
    convert: Option<EventStreamToSse>,
}

impl Context for Attempt {}

impl HttpContext for Attempt {
    fn on_http_request_headers(&mut self, _num: usize, end_of_stream: bool) -> Action {
        let Some(value) = self.get_property(vec![ATTEMPT_PROPERTY]) else {
            return Action::Continue;
        };
        let facts = self.get_property(vec![
            "xds",
            "upstream_host_metadata",
            "filter_metadata",
            METADATA_NAMESPACE,
            ENDPOINT_FACTS_KEY,
        ]);
        // The first pick's attempt, as the request filter left it: nothing to do, and
        // nothing to decode.
        let path = self.get_http_request_header(":path");
        if attempt::passes_as_left(&value, facts.as_deref(), path.as_deref()) {
            return Action::Continue;
        }
        let Some(note) = Note::decode(&value) else {
            return Action::Continue;
        };
        let facts = facts.and_then(|b| EndpointFacts::decode(&b));
        let plan = attempt::plan(&note, facts.as_ref());
        if let Work::Skip(skip) = &plan.work {
            return self.skip(skip);
        }
        if plan.keeps_filtered_request(&note) && path.as_deref() == Some(note.path.as_str()) {
            return Action::Continue;
        }
        for (name, value) in &plan.restore {
            self.set_http_request_header(name, value.as_deref());
        }
        if path.as_deref() != Some(plan.path.as_str()) {
            self.set_http_request_header(":path", Some(&plan.path));
            if plan.path != note.path {
                self.counted();
            }
        }
        if let Some(authority) = &plan.authority {
            self.set_http_request_header(":authority", Some(authority));
        }
        self.remove_headers(&plan.remove, &plan.remove_prefixes);
        self.note = Some(note);
        self.work = plan.work;
        match &self.work {
            Work::None | Work::Skip(_) => Action::Continue,
            Work::Splice { .. } if end_of_stream => Action::Continue,
            Work::Splice { .. } => {
                // The length changes: Envoy sends the rewritten body chunked.
                self.set_http_request_header("content-length", None);
                Action::Pause
            }
            Work::Translate { .. } if end_of_stream => {
                if self.translate_body(0) {
                    Action::Continue
                } else {
                    Action::Pause
                }
            }
            Work::Translate { .. } => Action::Pause,
        }
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if matches!(self.work, Work::None | Work::Skip(_)) {
            return Action::Continue;
        }
        if !end_of_stream {
            return Action::Pause;
        }
        match std::mem::replace(&mut self.work, Work::None) {
            Work::Splice { start, end, model } => {
                // The model sits in the head: only that crosses the wasm boundary.
                let head = self
                    .get_http_request_body(0, end.min(body_size))
                    .unwrap_or_default();
                if let Some(edit) = attempt::rewrite_head(&head, start, end, &model) {
                    self.set_http_request_body(0, edit.drop, &edit.prefix);
                    self.counted();
                } else {
                    log(
                        LogLevel::Warn,
                        "halo: per-attempt stage: the model is not where the request filter noted it; attempt sent as is",
                    );
                }
                Action::Continue
            }
            work @ Work::Translate { .. } => {
                self.work = work;
                if self.translate_body(body_size) {
                    Action::Continue
                } else {
                    Action::Pause
                }
            }
            Work::None | Work::Skip(_) => Action::Continue,
        }
    }

    fn on_http_response_headers(&mut self, _num: usize, _end_of_stream: bool) -> Action {
        if self.convert.is_none() {
            return Action::Continue;
        }
        let status = self.get_http_response_header(":status");
        let content_type = self.get_http_response_header("content-type");
        if !attempt::converts_answer(status.as_deref(), content_type.as_deref()) {
            // An error answer (JSON) goes to the client as Bedrock wrote it.
            self.convert = None;
            return Action::Continue;
        }
        self.set_http_response_header("content-type", Some("text/event-stream"));
        self.set_http_response_header("content-length", None);
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.convert.is_none() {
            return Action::Continue;
        }
        let chunk = self
            .get_http_response_body(0, body_size)
            .unwrap_or_default();
        let Some(conv) = self.convert.as_mut() else {
            return Action::Continue;
        };
        let mut out = match attempt::convert_piece(conv, &chunk) {
            Ok(sse) => sse,
            Err((sse, why)) => {
                self.convert = None;
                log(
                    LogLevel::Warn,
                    &format!("halo: per-attempt stage: Bedrock event stream unreadable: {why}"),
                );
                sse
            }
        };
        if end_of_stream && let Some(conv) = self.convert.take() {
            out.extend(attempt::finish_conversion(&conv));
        }
        // Each chunk is replaced by the events it completed: streaming stays incremental.
        self.set_http_response_body(0, body_size, &out);
        Action::Continue
    }
}

impl Attempt {
    fn counted(&self) {
        if let Some(id) = self.rewrites {
            let _ = hostcalls::increment_metric(id, 1);
        }
    }

    /// Answer 502 bad_upstream for a target that cannot serve the request.
    fn skip(&mut self, skip: &halo_providers::Skip) -> Action {
        log(
            LogLevel::Info,
            &format!("halo: per-attempt stage: target skipped: {skip}"),
        );
        self.send_http_response(
            502,
            vec![("content-type", "application/json")],
            Some(&attempt::skip_reply(skip)),
        );
        Action::Pause
    }

    fn remove_headers(&self, names: &[&str], prefixes: &[&str]) {
        for name in names {
            self.set_http_request_header(name, None);
        }
        if prefixes.is_empty() {
            return;
        }
        for (name, _) in self.get_http_request_headers() {
            let lower = name.to_ascii_lowercase();
            if prefixes.iter().any(|p| lower.starts_with(p)) {
                self.set_http_request_header(&name, None);
            }
        }
    }

    /// Translate the whole body for this attempt's target; false when the attempt was
    /// answered instead (a Skip).
    fn translate_body(&mut self, body_size: usize) -> bool {
        let Work::Translate { upstream, model } = std::mem::replace(&mut self.work, Work::None)
        else {
            return true;
        };
        let Some(note) = self.note.as_ref() else {
            return true;
        };
        let body = if body_size == 0 {
            Vec::new()
        } else {
            self.get_http_request_body(0, body_size).unwrap_or_default()
        };
        let out = match attempt::translate(note, &upstream, &model, &body) {
            Ok(out) => out,
            Err(skip) => {
                self.skip(&skip);
                return false;
            }
        };
        self.set_http_request_header(":method", Some(out.method));
        self.set_http_request_header(":path", Some(&out.path));
        if let Some(authority) = &out.authority {
            self.set_http_request_header(":authority", Some(authority));
        }
        self.remove_headers(&out.remove_headers, &out.remove_header_prefixes);
        for (name, value) in &out.set_headers {
            self.set_http_request_header(name, Some(value));
        }
        self.set_http_request_body(0, body_size, &out.body);
        for cause in &out.dropped {
            let cause = cause.as_str();
            if attempt::first_report_of(cause) {
                log(
                    LogLevel::Info,
                    &format!("halo: per-attempt stage: translation drops {cause} (logged once)"),
                );
            }
        }
        if out.response == ResponseConversion::BedrockEventStreamToSse {
            self.convert = Some(EventStreamToSse::new());
        }
        self.counted();
        true
    }
}
