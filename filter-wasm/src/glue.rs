//! The proxy-wasm trait impls (wasm32 only). Read Envoy state, call the core flows,
//! write Envoy state. No decisions here.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use foldhash::fast::FixedState;
use halo_contract::facts::Fact;
use halo_contract::names::{ENDPOINT_FACTS_KEY, METADATA_NAMESPACE};
use halo_filter_core::attempt::ATTEMPT_PROPERTY;
use halo_filter_core::breaker::Breakers;
use halo_filter_core::config::{Config, IdentitySettings, Plugin};
use halo_filter_core::host::{Host, Level, Next, Telemetry};
use halo_filter_core::killstate::{Enforced, FetchOutcome};
use halo_filter_core::metrics::{self, Counter};
use halo_filter_core::pipeline::{PrefixEdit, VerifiedClaims};
use halo_filter_core::request::{self, Policy, RequestFlow};
use halo_filter_core::stage::StageFlow;
use halo_policy::Snapshot;
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType, MetricType};

/// Shared-data keys (one VM id is shared by every worker's copy of the plugin).
const SHARED_ENVELOPE: &str = "halo.killswitch.envelope";
const SHARED_NEXT_POLL: &str = "halo.killswitch.next_poll_ms";
const JWT_METADATA: &str = "envoy.filters.http.jwt_authn";

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root::default()) });
}}

/// This VM's metric ids by name (a name is defined once per VM), the buffer a counter's
/// name is written into on each count (counting allocates nothing once the name is
/// known), and the per-request counts not yet handed to Envoy ([`Counter::per_request`]:
/// summed here, handed over on the root's tick as the native build does).
#[derive(Default)]
struct Metrics {
    ids: RefCell<HashMap<String, u32, FixedState>>,
    name: RefCell<String>,
    tally: RefCell<HashMap<u32, u64, FixedState>>,
}

impl Telemetry for Metrics {
    fn log(&self, level: Level, message: &str) {
        let level = match level {
            Level::Info => LogLevel::Info,
            Level::Warn => LogLevel::Warn,
            Level::Error => LogLevel::Error,
            Level::Critical => LogLevel::Critical,
        };
        let _ = hostcalls::log(level, message);
    }

    fn add(&self, counter: Counter<'_>, amount: u64) {
        let id = {
            let mut name = self.name.borrow_mut();
            name.clear();
            counter.write_dotted(&mut name);
            self.define(&name)
        };
        let Some(id) = id else { return };
        if counter.per_request() {
            *self.tally.borrow_mut().entry(id).or_default() += amount;
        } else {
            increment(id, amount);
        }
    }
}

fn increment(id: u32, amount: u64) {
    let _ = hostcalls::increment_metric(id, i64::try_from(amount).unwrap_or(i64::MAX));
}

impl Metrics {
    /// The id of counter `name`, defined in this VM on first use.
    fn define(&self, name: &str) -> Option<u32> {
        let known = self.ids.borrow().get(name).copied();
        match known {
            Some(id) => Some(id),
            None => {
                let id = hostcalls::define_metric(MetricType::Counter, name).ok()?;
                self.ids.borrow_mut().insert(name.to_owned(), id);
                Some(id)
            }
        }
    }

    /// Hand the summed per-request counts to Envoy.
    fn flush(&self) {
        for (id, amount) in self.tally.borrow_mut().drain() {
            increment(id, amount);
        }
    }

    /// Define the counters without tags now, so they read 0 until counted (as the native
    /// build's do) instead of missing.
    fn define_untagged(&self) {
        for d in metrics::ALL.iter().filter(|d| d.tags.is_empty()) {
            let _ = self.define(&d.stat_name());
        }
    }
}

/// Per-VM state shared by the root context and this worker's HTTP contexts.
struct State {
    cfg: Config,
    enforced: Enforced,
}

impl Policy for State {
    fn config(&self) -> &Config {
        &self.cfg
    }

    fn snapshot(&self) -> Arc<Snapshot> {
        self.enforced.effective().clone()
    }
}

type Shared = Rc<RefCell<Option<State>>>;

#[derive(Default)]
struct Root {
    state: Shared,
    metrics: Rc<Metrics>,
    inflight: Option<u32>,
    /// This instance is the per-attempt stage (an upstream filter), not the request filter.
    attempt_stage: bool,
}

fn now_ms() -> i64 {
    hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl Context for Root {
    /// The configuration is going away: the summed counts are handed over first.
    fn on_done(&mut self) -> bool {
        self.metrics.flush();
        true
    }

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
        state
            .enforced
            .on_poll_answer(&state.cfg, status, &body, now_ms() / 1000, &*self.metrics);
        publish(state);
    }
}

/// Make the shared envelope at least as new as the one this worker holds.
fn publish(state: &State) {
    let Some(Ok(key)) = state.cfg.kill_switch.as_ref().map(|k| &k.key) else {
        return;
    };
    let Some(held) = state.enforced.held() else {
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
        self.metrics.define_untagged();
        let bytes = self.get_plugin_configuration().unwrap_or_default();
        let cfg = match Plugin::from_bytes_with_env(&bytes, &crate::wasi::vm_env) {
            Ok(Plugin::Request(cfg)) => *cfg,
            Ok(Plugin::Attempt) => {
                self.attempt_stage = true;
                // Its counts are handed over on the tick too, should one be per request.
                self.set_tick_period(Duration::from_secs(1));
                return true;
            }
            Err(e) => {
                self.metrics.log(Level::Critical, &e.to_string());
                return false;
            }
        };
        // Every second: hand over the counts, and poll the kill list when one is set.
        self.set_tick_period(Duration::from_secs(1));
        let enforced = Enforced::start(&cfg, now_ms() / 1000, &*self.metrics);
        let state = State { cfg, enforced };
        publish(&state);
        *self.state.borrow_mut() = Some(state);
        true
    }

    fn on_tick(&mut self) {
        self.metrics.flush();
        let mut guard = self.state.borrow_mut();
        let Some(state) = guard.as_mut() else { return };
        let Some(ks) = state.cfg.kill_switch.clone().filter(|k| k.key.is_ok()) else {
            return;
        };
        // Adopt what another worker accepted.
        if let Ok((Some(bytes), _)) = hostcalls::get_shared_data(SHARED_ENVELOPE) {
            state.enforced.adopt(&state.cfg, &bytes);
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
            Err(_) => self.metrics.count(Counter::KillswitchFetch {
                outcome: FetchOutcome::HttpError.as_str(),
            }),
        }
    }

    fn create_http_context(&self, _id: u32) -> Option<Box<dyn HttpContext>> {
        if self.attempt_stage {
            return Some(Box::new(Attempt {
                metrics: self.metrics.clone(),
                flow: StageFlow::new(),
            }));
        }
        Some(Box::new(Http {
            state: self.state.clone(),
            metrics: self.metrics.clone(),
            flow: RequestFlow::new(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// The [`Host`] of the context Envoy is running (host calls act on it).
struct WasmHost<'a> {
    metrics: &'a Metrics,
    /// The body size the current body hook reported: what Envoy holds so far.
    body_size: usize,
}

impl WasmHost<'_> {
    fn header(map: MapType, name: &str) -> Option<String> {
        hostcalls::get_map_value(map, name).ok().flatten()
    }

    fn property(path: Vec<&str>) -> Option<Vec<u8>> {
        hostcalls::get_property(path).ok().flatten()
    }
}

impl Telemetry for WasmHost<'_> {
    fn log(&self, level: Level, message: &str) {
        self.metrics.log(level, message);
    }

    fn add(&self, counter: Counter<'_>, amount: u64) {
        self.metrics.add(counter, amount);
    }
}

impl Host for WasmHost<'_> {
    /// Envoy keeps the body while the filter pauses, readable and editable at offsets.
    const PIECEWISE: bool = false;

    fn request_headers(&self) -> Vec<(String, String)> {
        hostcalls::get_map(MapType::HttpRequestHeaders)
            .unwrap_or_default()
            .into_iter()
            .map(|(n, v)| (n.to_ascii_lowercase(), v))
            .collect()
    }

    fn request_header(&self, name: &str) -> Option<String> {
        Self::header(MapType::HttpRequestHeaders, name)
    }

    fn set_request_header(&mut self, name: &str, value: Option<&str>) {
        let _ = hostcalls::set_map_value(MapType::HttpRequestHeaders, name, value);
    }

    fn response_header(&self, name: &str) -> Option<String> {
        Self::header(MapType::HttpResponseHeaders, name)
    }

    fn set_response_header(&mut self, name: &str, value: Option<&str>) {
        let _ = hostcalls::set_map_value(MapType::HttpResponseHeaders, name, value);
    }

    fn peer_address(&self) -> Option<String> {
        Self::property(vec!["source", "address"]).and_then(|b| String::from_utf8(b).ok())
    }

    /// jwt_authn's verified payload, read from its dynamic metadata.
    fn verified_claims(
        &self,
        identity: &IdentitySettings,
        _headers: &[(String, String)],
    ) -> Option<VerifiedClaims> {
        let claim = |name: &str| {
            Self::property(vec![
                "metadata",
                "filter_metadata",
                JWT_METADATA,
                &identity.jwt_metadata_key,
                name,
            ])
        };
        let user = claim(&identity.user_claim).and_then(|b| String::from_utf8(b).ok())?;
        let email_verified = claim("email_verified").map(|b| b == [1] || b == b"true");
        let groups = claim(&identity.groups_claim)
            .map(|b| halo_filter_core::claims::parse_string_list(&b))
            .unwrap_or_default();
        Some(VerifiedClaims {
            user: Some(user),
            email_verified,
            groups,
        })
    }

    fn response_code(&self) -> Option<u32> {
        Self::property(vec!["response", "code"])
            .and_then(|b| b.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()))
            .map(u64::from_le_bytes)
            .and_then(|c| u32::try_from(c).ok())
    }

    fn response_code_details(&self) -> Option<String> {
        Self::property(vec!["response", "code_details"]).and_then(|b| String::from_utf8(b).ok())
    }

    /// Envoy writes an integer property as 8 little-endian bytes.
    fn attempt_count(&self) -> Option<u32> {
        let bytes = Self::property(vec!["upstream", "request_attempt_count"])?;
        let n = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
        u32::try_from(n).ok()
    }

    /// The VM's breakers: one VM per worker thread, shared by its streams.
    fn with_breakers<R>(&self, f: impl FnOnce(&mut Breakers) -> R) -> R {
        thread_local! {
            static BREAKERS: RefCell<Breakers> = RefCell::new(Breakers::new());
        }
        BREAKERS.with(|b| f(&mut b.borrow_mut()))
    }

    fn set_attempt_note(&mut self, value: &[u8]) {
        let _ = hostcalls::set_property(vec![ATTEMPT_PROPERTY], Some(value));
    }

    fn attempt_note(&self) -> Option<Vec<u8>> {
        Self::property(vec![ATTEMPT_PROPERTY])
    }

    fn endpoint_facts(&self) -> Option<Vec<u8>> {
        Self::property(vec![
            "xds",
            "upstream_host_metadata",
            "filter_metadata",
            METADATA_NAMESPACE,
            ENDPOINT_FACTS_KEY,
        ])
    }

    /// Nothing to do: Envoy's wasm filter clears the route cache itself whenever a
    /// request header changes.
    fn refresh_route(&mut self) {}

    fn send_response(&mut self, status: u16, headers: &[(String, String)], body: &[u8]) {
        let headers: Vec<(&str, &str)> = headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        let _ = hostcalls::send_http_response(u32::from(status), headers, Some(body));
    }

    fn request_body_total(&self, _held: usize) -> usize {
        self.body_size
    }

    fn copy_request_body(&mut self, body: &mut Vec<u8>, limit: usize) {
        let upto = self.body_size.min(limit);
        if upto <= body.len() {
            return;
        }
        let more =
            hostcalls::get_buffer(BufferType::HttpRequestBody, body.len(), upto - body.len())
                .ok()
                .flatten()
                .unwrap_or_default();
        if body.is_empty() {
            *body = more;
        } else {
            body.extend_from_slice(&more);
        }
    }

    /// At offset 0 Envoy drains `drop` bytes and prepends: the rest stays put.
    fn write_body_edit(&mut self, edit: &PrefixEdit, _body: &[u8]) {
        let _ = hostcalls::set_buffer(BufferType::HttpRequestBody, 0, edit.drop, &edit.prefix);
    }

    fn replace_request_body(&mut self, edit: &PrefixEdit, body: &[u8]) {
        let _ = hostcalls::set_buffer(
            BufferType::HttpRequestBody,
            0,
            self.body_size,
            &edit.apply(body),
        );
    }

    fn now(&self) -> Duration {
        hostcalls::get_current_time()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .unwrap_or_default()
    }

    /// A property the module sets is the filter state `wasm.<name>`.
    fn set_fact(&mut self, fact: Fact, value: &str) {
        let _ = hostcalls::set_property(vec![fact.property()], Some(value.as_bytes()));
    }

    fn served_metadata(&self, key: &str) -> Option<String> {
        Self::property(vec![
            "xds",
            "upstream_host_metadata",
            "filter_metadata",
            METADATA_NAMESPACE,
            key,
        ])
        .and_then(|b| String::from_utf8(b).ok())
    }

    fn response_body(&self) -> Vec<u8> {
        hostcalls::get_buffer(BufferType::HttpResponseBody, 0, self.body_size)
            .ok()
            .flatten()
            .unwrap_or_default()
    }

    fn set_response_body(&mut self, bytes: &[u8]) {
        let _ = hostcalls::set_buffer(BufferType::HttpResponseBody, 0, self.body_size, bytes);
    }

    fn dispatch(
        &mut self,
        cluster: &str,
        headers: &[(String, String)],
        body: &[u8],
        timeout_ms: u64,
    ) -> bool {
        let headers: Vec<(&str, &str)> = headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        // Through the SDK's Context method, which registers the call with the stream's
        // context: an answer for an unregistered token would trap the VM. The stream's
        // context ignores the answer ([`Http`]'s Context is the default).
        Callout
            .dispatch_http_call(
                cluster,
                headers,
                Some(body),
                vec![],
                Duration::from_millis(timeout_ms),
            )
            .is_ok()
    }
}

/// Starts a stream's callouts ([`Host::dispatch`]): the SDK's Context methods need a
/// Context, and this one holds nothing (the answer goes to the stream's own context).
struct Callout;

impl Context for Callout {}

fn action(next: Next) -> Action {
    match next {
        Next::Continue => Action::Continue,
        Next::Stop | Next::Buffer => Action::Pause,
    }
}

/// The request filter on one request.
struct Http {
    state: Shared,
    metrics: Rc<Metrics>,
    flow: RequestFlow,
}

impl Context for Http {}

impl HttpContext for Http {
    fn on_http_request_headers(&mut self, _num: usize, end_of_stream: bool) -> Action {
        let mut host = WasmHost {
            metrics: &self.metrics,
            body_size: 0,
        };
        let guard = self.state.borrow();
        let next = match guard.as_ref() {
            Some(state) => self
                .flow
                .on_request_headers(&mut host, state, end_of_stream),
            None => self.flow.reply(&mut host, request::unavailable()),
        };
        action(next)
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let mut host = WasmHost {
            metrics: &self.metrics,
            body_size,
        };
        let guard = self.state.borrow();
        let Some(state) = guard.as_ref() else {
            return Action::Continue;
        };
        action(self.flow.on_request_body(&mut host, state, end_of_stream))
    }

    fn on_http_response_headers(&mut self, _num: usize, end_of_stream: bool) -> Action {
        let mut host = WasmHost {
            metrics: &self.metrics,
            body_size: 0,
        };
        let guard = self.state.borrow();
        let Some(state) = guard.as_ref() else {
            return Action::Continue;
        };
        action(
            self.flow
                .on_response_headers(&mut host, state, end_of_stream),
        )
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let mut host = WasmHost {
            metrics: &self.metrics,
            body_size,
        };
        action(self.flow.on_response_body(&mut host, end_of_stream))
    }

    fn on_log(&mut self) {
        let mut host = WasmHost {
            metrics: &self.metrics,
            body_size: 0,
        };
        self.flow.on_stream_complete(&mut host);
    }
}

/// The per-attempt stage on one upstream attempt (see halo-filter-core's `attempt`).
struct Attempt {
    metrics: Rc<Metrics>,
    flow: StageFlow,
}

impl Context for Attempt {}

impl HttpContext for Attempt {
    fn on_http_request_headers(&mut self, _num: usize, end_of_stream: bool) -> Action {
        let mut host = WasmHost {
            metrics: &self.metrics,
            body_size: 0,
        };
        action(self.flow.on_request_headers(&mut host, end_of_stream))
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let mut host = WasmHost {
            metrics: &self.metrics,
            body_size,
        };
        action(self.flow.on_request_body(&mut host, end_of_stream))
    }

    fn on_http_response_headers(&mut self, _num: usize, _end_of_stream: bool) -> Action {
        let mut host = WasmHost {
            metrics: &self.metrics,
            body_size: 0,
        };
        action(self.flow.on_response_headers(&mut host))
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let mut host = WasmHost {
            metrics: &self.metrics,
            body_size,
        };
        action(self.flow.on_response_body(&mut host, end_of_stream))
    }
}
