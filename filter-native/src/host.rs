//! Safe calls into Envoy for one stream, and the answers its hooks give: every `unsafe`
//! FFI call of the module is here.
//!
//! A [`Stream`] is only built inside a hook Envoy called for that stream, on its worker
//! thread, so its pointer is live; buffers Envoy hands back are copied before the next
//! call that could change them.

use std::ffi::c_char;

use halo_envoy_config::names::{ENDPOINT_FACTS_KEY, METADATA_NAMESPACE};
use halo_filter_core::attempt::ATTEMPT_PROPERTY;
use halo_filter_core::config::IdentitySettings;
use halo_filter_core::host::{Host, Level, Next, Telemetry};
use halo_filter_core::jwt::{self, Verified};
use halo_filter_core::metrics::Counter;
use halo_filter_core::pipeline::{PrefixEdit, VerifiedClaims};

use crate::abi::{
    self, EnvoyBuffer, EnvoyHeader, FilterConfigEnvoyPtr, FilterEnvoyPtr, ModuleBuffer,
    ModuleHeader,
};
use crate::body_edit;
use crate::plugin::Meter;

const JWT_METADATA: &str = "envoy.filters.http.jwt_authn";

/// One stream's Envoy side, valid for the duration of the hook that made it.
#[derive(Clone, Copy)]
pub struct Stream(FilterEnvoyPtr);

/// The ABI status of a request-headers answer.
pub fn headers_status(next: Next) -> u32 {
    match next {
        Next::Continue => abi::HEADERS_CONTINUE,
        Next::Stop | Next::Buffer => abi::HEADERS_STOP_ITERATION,
    }
}

/// The ABI status of a request-body answer.
pub fn body_status(next: Next) -> u32 {
    match next {
        Next::Continue => abi::BODY_CONTINUE,
        // After a local reply Envoy ignores the answer; stop either way.
        Next::Stop | Next::Buffer => abi::BODY_STOP_AND_BUFFER,
    }
}

/// Which body a body call reads or edits.
#[derive(Clone, Copy)]
pub enum Body {
    /// The piece handed to the current body hook.
    Received,
    /// What earlier body hooks stopped and buffered.
    Buffered,
}

impl Body {
    fn request(self) -> u32 {
        match self {
            Body::Received => abi::RECEIVED_REQUEST_BODY,
            Body::Buffered => abi::BUFFERED_REQUEST_BODY,
        }
    }
}

fn buf(s: &str) -> ModuleBuffer {
    ModuleBuffer::of(s.as_bytes())
}

impl Stream {
    /// # Safety
    /// `ptr` is the `filter_envoy_ptr` of the hook being run.
    pub unsafe fn new(ptr: FilterEnvoyPtr) -> Stream {
        Stream(ptr)
    }

    /// Every request header, names as Envoy holds them (lowercase).
    pub fn request_headers(self) -> Vec<(String, String)> {
        self.headers(abi::REQUEST_HEADER)
    }

    fn headers(self, kind: u32) -> Vec<(String, String)> {
        // SAFETY: live stream (type invariant); the array is sized by the call just before.
        unsafe {
            let n = abi::envoy_dynamic_module_callback_http_get_headers_size(self.0, kind);
            let mut out = vec![
                EnvoyHeader {
                    key_ptr: std::ptr::null(),
                    key_length: 0,
                    value_ptr: std::ptr::null(),
                    value_length: 0,
                };
                n
            ];
            if n == 0
                || !abi::envoy_dynamic_module_callback_http_get_headers(
                    self.0,
                    kind,
                    out.as_mut_ptr(),
                )
            {
                return Vec::new();
            }
            out.iter()
                .map(|h| {
                    // Envoy's header maps hold names lowercase.
                    let key = bytes(h.key_ptr, h.key_length);
                    let value = bytes(h.value_ptr, h.value_length);
                    (owned(key), owned(value))
                })
                .collect()
        }
    }

    /// The first value of request header `name`.
    pub fn request_header(self, name: &str) -> Option<String> {
        self.header(abi::REQUEST_HEADER, name)
    }

    /// The first value of response header `name`.
    pub fn response_header(self, name: &str) -> Option<String> {
        self.header(abi::RESPONSE_HEADER, name)
    }

    fn header(self, kind: u32, name: &str) -> Option<String> {
        let mut out = EnvoyBuffer::NULL;
        // SAFETY: live stream; the result is copied before any other call.
        unsafe {
            abi::envoy_dynamic_module_callback_http_get_header(
                self.0,
                kind,
                buf(name),
                &mut out,
                0,
                std::ptr::null_mut(),
            )
            .then(|| owned(out.as_bytes()))
        }
    }

    /// How many values request header `name` has.
    pub fn request_header_count(self, name: &str) -> usize {
        let mut out = EnvoyBuffer::NULL;
        let mut count = 0usize;
        // SAFETY: live stream.
        unsafe {
            abi::envoy_dynamic_module_callback_http_get_header(
                self.0,
                abi::REQUEST_HEADER,
                buf(name),
                &mut out,
                0,
                &mut count,
            );
        }
        count
    }

    /// Set (replacing every value) or, with `None`, remove request header `name`.
    pub fn set_request_header(self, name: &str, value: Option<&str>) {
        self.set_header(abi::REQUEST_HEADER, name, value);
    }

    /// Set or remove response header `name`.
    pub fn set_response_header(self, name: &str, value: Option<&str>) {
        self.set_header(abi::RESPONSE_HEADER, name, value);
    }

    fn set_header(self, kind: u32, name: &str, value: Option<&str>) {
        let value = value.map_or(ModuleBuffer::NULL, buf);
        // SAFETY: live stream; Envoy copies both buffers.
        unsafe {
            abi::envoy_dynamic_module_callback_http_set_header(self.0, kind, buf(name), value);
        }
    }

    /// Make the router pick the route again (its cluster comes from a header the filter
    /// set). Envoy's cheaper "cluster only" refresh does not re-read a `cluster_header`
    /// (seen in 1.40). The downstream filter's call, never an upstream one's.
    pub fn refresh_route(self) {
        // SAFETY: live stream.
        unsafe { abi::envoy_dynamic_module_callback_http_clear_route_cache(self.0) }
    }

    /// Answer the request locally.
    pub fn send_response(self, status: u16, headers: &[(String, String)], body: &[u8]) {
        let headers: Vec<ModuleHeader> = headers
            .iter()
            .map(|(n, v)| ModuleHeader::of(n, v))
            .collect();
        // SAFETY: live stream; every buffer outlives the call, which copies them.
        unsafe {
            abi::envoy_dynamic_module_callback_http_send_response(
                self.0,
                u32::from(status),
                headers.as_ptr(),
                headers.len(),
                ModuleBuffer::of(body),
                buf("halo"),
            );
        }
    }

    /// Append every piece of a request body to `out`.
    pub fn copy_request_body(self, which: Body, out: &mut Vec<u8>) {
        // SAFETY: live stream; the slices are read before any body setter.
        unsafe {
            let kind = which.request();
            let n = abi::envoy_dynamic_module_callback_http_get_body_chunks_size(self.0, kind);
            if n == 0 {
                return;
            }
            let mut chunks = vec![EnvoyBuffer::NULL; n];
            if !abi::envoy_dynamic_module_callback_http_get_body_chunks(
                self.0,
                kind,
                chunks.as_mut_ptr(),
            ) {
                return;
            }
            for chunk in chunks {
                out.extend_from_slice(chunk.as_bytes());
            }
        }
    }

    /// The size of a request body.
    pub fn request_body_size(self, which: Body) -> usize {
        // SAFETY: live stream.
        unsafe { abi::envoy_dynamic_module_callback_http_get_body_size(self.0, which.request()) }
    }

    /// True when the received piece is an earlier filter's buffer handed on whole.
    pub fn received_is_buffered(self) -> bool {
        // SAFETY: live stream.
        unsafe { abi::envoy_dynamic_module_callback_http_received_buffered_request_body(self.0) }
    }

    /// Replace a request body's bytes with the concatenation of `parts` (each copied
    /// once, into Envoy's buffer).
    pub fn replace_request_body(self, which: Body, parts: &[&[u8]]) {
        let kind = which.request();
        // SAFETY: live stream; Envoy copies each part during its call.
        unsafe {
            abi::envoy_dynamic_module_callback_http_drain_body(self.0, kind, usize::MAX);
            for part in parts.iter().filter(|p| !p.is_empty()) {
                abi::envoy_dynamic_module_callback_http_append_body(
                    self.0,
                    kind,
                    ModuleBuffer::of(part),
                );
            }
        }
    }

    /// Remove the first `len` bytes of a request body (all of it for `usize::MAX`).
    pub fn drain_request_body(self, which: Body, len: usize) {
        if len == 0 {
            return;
        }
        // SAFETY: live stream.
        unsafe {
            abi::envoy_dynamic_module_callback_http_drain_body(self.0, which.request(), len);
        }
    }

    /// Append `bytes` (copied) at the end of a request body. Appending to the buffered
    /// body creates it when Envoy has none yet, ahead of the current piece.
    pub fn append_request_body(self, which: Body, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        // SAFETY: live stream; Envoy copies the bytes during the call.
        unsafe {
            abi::envoy_dynamic_module_callback_http_append_body(
                self.0,
                which.request(),
                ModuleBuffer::of(bytes),
            );
        }
    }

    /// The response piece handed to the current response body hook, copied.
    pub fn received_response_body(self) -> Vec<u8> {
        let mut out = Vec::new();
        // SAFETY: live stream; the slices are read before any body setter.
        unsafe {
            let kind = abi::RECEIVED_RESPONSE_BODY;
            let n = abi::envoy_dynamic_module_callback_http_get_body_chunks_size(self.0, kind);
            let mut chunks = vec![EnvoyBuffer::NULL; n];
            if n > 0
                && abi::envoy_dynamic_module_callback_http_get_body_chunks(
                    self.0,
                    kind,
                    chunks.as_mut_ptr(),
                )
            {
                for chunk in chunks {
                    out.extend_from_slice(chunk.as_bytes());
                }
            }
        }
        out
    }

    /// Replace the response piece of the current response body hook.
    pub fn replace_received_response_body(self, with: &[u8]) {
        let kind = abi::RECEIVED_RESPONSE_BODY;
        // SAFETY: live stream; Envoy copies `with`.
        unsafe {
            abi::envoy_dynamic_module_callback_http_drain_body(self.0, kind, usize::MAX);
            if !with.is_empty() {
                abi::envoy_dynamic_module_callback_http_append_body(
                    self.0,
                    kind,
                    ModuleBuffer::of(with),
                );
            }
        }
    }

    /// Store `value` in the stream's filter state under `key` (upstream filters of every
    /// attempt share the stream's filter state).
    pub fn set_filter_state(self, key: &str, value: &[u8]) {
        // SAFETY: live stream; Envoy copies both buffers.
        unsafe {
            abi::envoy_dynamic_module_callback_http_set_filter_state_bytes(
                self.0,
                buf(key),
                ModuleBuffer::of(value),
            );
        }
    }

    /// A filter state value set with [`Stream::set_filter_state`].
    pub fn filter_state(self, key: &str) -> Option<Vec<u8>> {
        let mut out = EnvoyBuffer::NULL;
        // SAFETY: live stream; copied at once.
        unsafe {
            abi::envoy_dynamic_module_callback_http_get_filter_state_bytes(
                self.0,
                buf(key),
                &mut out,
            )
            .then(|| out.as_bytes().to_vec())
        }
    }

    /// A string in the picked upstream host's metadata (upstream filters).
    pub fn host_metadata_string(self, namespace: &str, key: &str) -> Option<Vec<u8>> {
        self.metadata_string(abi::METADATA_HOST, namespace, key)
    }

    /// A string in the stream's dynamic metadata.
    pub fn dynamic_metadata_string(self, namespace: &str, key: &str) -> Option<Vec<u8>> {
        self.metadata_string(abi::METADATA_DYNAMIC, namespace, key)
    }

    fn metadata_string(self, source: u32, namespace: &str, key: &str) -> Option<Vec<u8>> {
        let mut out = EnvoyBuffer::NULL;
        // SAFETY: live stream; copied at once.
        unsafe {
            abi::envoy_dynamic_module_callback_http_get_metadata_string(
                self.0,
                source,
                buf(namespace),
                buf(key),
                &mut out,
            )
            .then(|| out.as_bytes().to_vec())
        }
    }

    /// The top-level keys of a dynamic metadata namespace (no value is read, so no type
    /// is probed: Envoy logs an error for a getter of the wrong type).
    pub fn dynamic_metadata_keys(self, namespace: &str) -> Vec<String> {
        // SAFETY: live stream; the array is sized by the call just before; copied at once.
        unsafe {
            let ns = buf(namespace);
            let n = abi::envoy_dynamic_module_callback_http_get_metadata_keys_count(
                self.0,
                abi::METADATA_DYNAMIC,
                ns,
            );
            if n == 0 {
                return Vec::new();
            }
            let mut keys = vec![EnvoyBuffer::NULL; n];
            if !abi::envoy_dynamic_module_callback_http_get_metadata_keys(
                self.0,
                abi::METADATA_DYNAMIC,
                ns,
                keys.as_mut_ptr(),
            ) {
                return Vec::new();
            }
            keys.iter().map(|k| owned(k.as_bytes())).collect()
        }
    }

    /// The downstream peer's address (`ip:port`).
    pub fn source_address(self) -> Option<String> {
        let mut out = EnvoyBuffer::NULL;
        // SAFETY: live stream; copied at once.
        unsafe {
            abi::envoy_dynamic_module_callback_http_filter_get_attribute_string(
                self.0,
                abi::ATTRIBUTE_SOURCE_ADDRESS,
                &mut out,
            )
            .then(|| owned(out.as_bytes()))
        }
    }

    /// The response code sent downstream, once there is one.
    pub fn response_code(self) -> Option<u32> {
        let mut out = 0u64;
        // SAFETY: live stream.
        unsafe {
            abi::envoy_dynamic_module_callback_http_filter_get_attribute_int(
                self.0,
                abi::ATTRIBUTE_RESPONSE_CODE,
                &mut out,
            )
        }
        .then(|| u32::try_from(out).ok())
        .flatten()
    }

    /// Add one to counter `id` (defined by this stream's filter config) with `labels`.
    pub fn increment<S: AsRef<str>>(self, id: usize, labels: &[S]) {
        let labels: Vec<ModuleBuffer> = labels.iter().map(|l| buf(l.as_ref())).collect();
        // SAFETY: live stream; labels outlive the call.
        unsafe {
            abi::envoy_dynamic_module_callback_http_filter_increment_counter(
                self.0,
                id,
                labels.as_ptr(),
                labels.len(),
                1,
            );
        }
    }
}

/// Envoy-owned bytes of a header entry.
///
/// # Safety
/// `ptr`/`len` came from Envoy during the current hook.
unsafe fn bytes<'a>(ptr: *const c_char, len: usize) -> &'a [u8] {
    // SAFETY: the caller's contract.
    unsafe { EnvoyBuffer { ptr, length: len }.as_bytes() }
}

/// Envoy's bytes as a String (one copy; invalid UTF-8 replaced, as proxy-wasm does).
fn owned(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) => s.to_owned(),
        Err(_) => String::from_utf8_lossy(bytes).into_owned(),
    }
}

/// A filter configuration's Envoy side. Made in `config_new` and used from the
/// configuration's hooks, which Envoy runs on the main thread; Envoy keeps it alive until
/// `config_destroy`, which stops everything that uses it first.
#[derive(Clone, Copy)]
pub struct ConfigHandle(FilterConfigEnvoyPtr);
// SAFETY: only handed back to Envoy, from the main thread's hooks (see the type's doc).
unsafe impl Send for ConfigHandle {}
// SAFETY: as above.
unsafe impl Sync for ConfigHandle {}

impl ConfigHandle {
    /// # Safety
    /// `ptr` is the `filter_config_envoy_ptr` of the `config_new` hook being run, and the
    /// handle is used only on the main thread until `config_destroy`.
    pub unsafe fn new(ptr: FilterConfigEnvoyPtr) -> ConfigHandle {
        ConfigHandle(ptr)
    }

    /// Define a counter with label names; only while Envoy builds the configuration
    /// (`config_new`), later definitions are refused.
    pub fn define_counter(self, name: &str, labels: &[&str]) -> Option<usize> {
        let labels: Vec<ModuleBuffer> = labels.iter().map(|l| buf(l)).collect();
        let mut id = 0usize;
        // SAFETY: live configuration (type invariant); buffers outlive the call.
        let result = unsafe {
            abi::envoy_dynamic_module_callback_http_filter_config_define_counter(
                self.0,
                buf(name),
                labels.as_ptr(),
                labels.len(),
                &mut id,
            )
        };
        (result == abi::METRICS_SUCCESS).then_some(id)
    }

    /// Add `n` to counter `id` with `labels`, outside any stream.
    pub fn increment<S: AsRef<str>>(self, id: usize, labels: &[S], n: u64) {
        let labels: Vec<ModuleBuffer> = labels.iter().map(|l| buf(l.as_ref())).collect();
        // SAFETY: live configuration, main thread; labels outlive the call.
        unsafe {
            abi::envoy_dynamic_module_callback_http_filter_config_increment_counter(
                self.0,
                id,
                labels.as_ptr(),
                labels.len(),
                n,
            );
        }
    }

    /// A scheduler that wakes this configuration's `config_scheduled` hook on the main
    /// thread.
    pub fn scheduler(self) -> Scheduler {
        // SAFETY: live configuration, main thread.
        Scheduler(unsafe {
            abi::envoy_dynamic_module_callback_http_filter_config_scheduler_new(self.0)
        })
    }

    /// Start a GET-style call to `cluster` (headers must include `:method`, `:path` and
    /// `host`); its answer comes to `config_http_callout_done` with the returned id.
    pub fn call_out(self, cluster: &str, headers: &[(&str, &str)], timeout_ms: u64) -> Option<u64> {
        let headers: Vec<ModuleHeader> = headers
            .iter()
            .map(|(n, v)| ModuleHeader::of(n, v))
            .collect();
        let mut id = 0u64;
        // SAFETY: live configuration, main thread; Envoy copies every buffer.
        let result = unsafe {
            abi::envoy_dynamic_module_callback_http_filter_config_http_callout(
                self.0,
                &mut id,
                buf(cluster),
                headers.as_ptr(),
                headers.len(),
                ModuleBuffer::NULL,
                timeout_ms,
            )
        };
        (result == abi::CALLOUT_INIT_SUCCESS).then_some(id)
    }
}

/// Envoy's configuration scheduler: [`Scheduler::wake`] may be called from any thread.
/// Deleted when dropped, so whoever holds it last must be done waking.
pub struct Scheduler(abi::ConfigSchedulerPtr);
// SAFETY: Envoy documents the scheduler's commit as callable from any thread; delete
// happens once, in Drop.
unsafe impl Send for Scheduler {}
// SAFETY: as above.
unsafe impl Sync for Scheduler {}

impl Scheduler {
    /// Run the configuration's `config_scheduled` hook with `event` on the main thread.
    pub fn wake(&self, event: u64) {
        // SAFETY: a live scheduler (deleted only in Drop); thread-safe by Envoy's contract.
        unsafe {
            abi::envoy_dynamic_module_callback_http_filter_config_scheduler_commit(self.0, event)
        }
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        // SAFETY: made by scheduler_new, deleted once.
        unsafe { abi::envoy_dynamic_module_callback_http_filter_config_scheduler_delete(self.0) }
    }
}

/// Log through Envoy's `dynamic_modules` logger. Never a header, a body or a user.
pub fn log(level: Level, message: &str) {
    let level = match level {
        Level::Info => abi::LOG_INFO,
        Level::Warn => abi::LOG_WARN,
        Level::Error => abi::LOG_ERROR,
        Level::Critical => abi::LOG_CRITICAL,
    };
    // SAFETY: Envoy copies the message; callable from any hook.
    unsafe { abi::envoy_dynamic_module_callback_log(level, buf(message)) }
}

/// The core's [`Host`] for one stream: its Envoy side and its configuration's counters.
pub struct NativeHost<'a> {
    s: Stream,
    meter: &'a Meter,
}

impl<'a> NativeHost<'a> {
    pub fn new(s: Stream, meter: &'a Meter) -> NativeHost<'a> {
        NativeHost { s, meter }
    }
}

impl Telemetry for NativeHost<'_> {
    fn log(&self, level: Level, message: &str) {
        log(level, message);
    }

    /// Request counts go to the tally (handed to Envoy on the next tick); the others,
    /// rare, to Envoy at once.
    fn count(&self, counter: Counter<'_>) {
        let id = self.meter.id(&counter);
        match counter {
            Counter::Requests { .. } | Counter::Decisions { .. } | Counter::AuthFailures => {
                self.meter.tally.add(id, &counter.values());
            }
            Counter::KillswitchFetch { .. } | Counter::AttemptRewrites | Counter::Panics => {
                if let Some(id) = id {
                    self.s.increment(id, &counter.values());
                }
            }
        }
    }
}

impl Host for NativeHost<'_> {
    /// Envoy hands each body piece once, and an edit of the head can be written into the
    /// buffered part before the body ends ([`body_edit`]).
    const PIECEWISE: bool = true;

    fn request_headers(&self) -> Vec<(String, String)> {
        self.s.request_headers()
    }

    fn request_header(&self, name: &str) -> Option<String> {
        self.s.request_header(name)
    }

    fn set_request_header(&mut self, name: &str, value: Option<&str>) {
        self.s.set_request_header(name, value);
    }

    fn response_header(&self, name: &str) -> Option<String> {
        self.s.response_header(name)
    }

    fn set_response_header(&mut self, name: &str, value: Option<&str>) {
        self.s.set_response_header(name, value);
    }

    fn peer_address(&self) -> Option<String> {
        self.s.source_address()
    }

    /// The payload jwt_authn forwarded in a header, believed only when jwt_authn's
    /// metadata says it verified a token on this request ([`halo_filter_core::jwt`]).
    fn verified_claims(
        &self,
        identity: &IdentitySettings,
        headers: &[(String, String)],
    ) -> Option<VerifiedClaims> {
        let verified = self
            .s
            .dynamic_metadata_keys(JWT_METADATA)
            .contains(&identity.jwt_metadata_key);
        if !verified {
            return None;
        }
        let values: Vec<String> = headers
            .iter()
            .filter(|(n, _)| n == jwt::PAYLOAD_HEADER)
            .map(|(_, v)| v.clone())
            .collect();
        match jwt::claims(&values, &identity.user_claim, &identity.groups_claim) {
            Verified::Claims(c) => Some(c),
            Verified::None | Verified::Unreadable => None,
        }
    }

    fn response_code(&self) -> Option<u32> {
        self.s.response_code()
    }

    fn set_attempt_note(&mut self, value: &[u8]) {
        self.s.set_filter_state(ATTEMPT_PROPERTY, value);
    }

    fn attempt_note(&self) -> Option<Vec<u8>> {
        self.s.filter_state(ATTEMPT_PROPERTY)
    }

    fn endpoint_facts(&self) -> Option<Vec<u8>> {
        self.s
            .host_metadata_string(METADATA_NAMESPACE, ENDPOINT_FACTS_KEY)
    }

    fn refresh_route(&mut self) {
        self.s.refresh_route();
    }

    fn send_response(&mut self, status: u16, headers: &[(String, String)], body: &[u8]) {
        self.s.send_response(status, headers, body);
    }

    fn request_body_total(&self, held: usize) -> usize {
        let received = self.s.request_body_size(Body::Received);
        // A piece that is an earlier filter's whole buffer is all of it.
        if self.s.received_is_buffered() {
            received
        } else {
            held + received
        }
    }

    fn copy_request_body(&mut self, body: &mut Vec<u8>, _limit: usize) {
        // The piece of this call; an earlier filter's whole buffer when it resumed (then
        // it is everything, and what was copied before is in it).
        if self.s.received_is_buffered() {
            body.clear();
        }
        self.s.copy_request_body(Body::Received, body);
    }

    fn write_body_edit(&mut self, edit: &PrefixEdit, body: &[u8]) {
        body_edit::write(self.s, edit, body);
    }

    fn replace_request_body(&mut self, edit: &PrefixEdit, body: &[u8]) {
        body_edit::replace(self.s, edit, body);
    }

    fn response_body(&self) -> Vec<u8> {
        self.s.received_response_body()
    }

    fn set_response_body(&mut self, bytes: &[u8]) {
        self.s.replace_received_response_body(bytes);
    }
}
