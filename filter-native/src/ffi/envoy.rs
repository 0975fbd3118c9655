//! Safe calls into Envoy, for a stream and for a configuration: every FFI call of the
//! module is here, and the types say where each may be made.
//!
//! - A [`Stream`] is made only by a stream hook (`hooks`), for that hook: its lifetime
//!   is the hook's, so it cannot be kept past it. Buffers Envoy hands back are copied
//!   before the next call that could change them.
//! - A [`ConfigHandle`] (calls on a configuration, which Envoy allows on the main thread
//!   only) is made from a [`MainThread`] token, which only the configuration's hooks make
//!   and which cannot leave the thread (it is neither `Send` nor `Sync`). What a
//!   configuration keeps is a [`ConfigPtr`], which makes no call by itself.

use std::ffi::c_char;
use std::marker::PhantomData;

use halo_filter_core::host::Level;

use super::abi::{
    self, EnvoyBuffer, EnvoyHeader, FilterConfigEnvoyPtr, FilterEnvoyPtr, ModuleBuffer,
    ModuleHeader,
};

/// One stream's Envoy side, for the duration of the hook `'h` that made it.
#[derive(Clone, Copy)]
pub struct Stream<'h> {
    ptr: FilterEnvoyPtr,
    _hook: PhantomData<&'h ()>,
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

fn buf(s: &str) -> ModuleBuffer<'_> {
    ModuleBuffer::of(s.as_bytes())
}

/// A callout's headers as the ABI borrows them for one call.
fn module_headers<'a>(headers: &[(&'a str, &'a str)]) -> Vec<ModuleHeader<'a>> {
    headers
        .iter()
        .map(|(n, v)| ModuleHeader::of(n, v))
        .collect()
}

impl Stream<'_> {
    /// # Safety
    /// `ptr` is the `filter_envoy_ptr` of the hook being run, and the stream is used only
    /// while it runs (the caller picks a lifetime no longer than the hook's).
    pub(super) unsafe fn new(ptr: FilterEnvoyPtr) -> Self {
        Stream {
            ptr,
            _hook: PhantomData,
        }
    }

    /// Every request header, names as Envoy holds them (lowercase).
    pub fn request_headers(self) -> Vec<(String, String)> {
        self.headers(abi::REQUEST_HEADER)
    }

    fn headers(self, kind: u32) -> Vec<(String, String)> {
        // SAFETY: live stream (type invariant); the array is sized by the call just before.
        unsafe {
            let n = abi::envoy_dynamic_module_callback_http_get_headers_size(self.ptr, kind);
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
                    self.ptr,
                    kind,
                    out.as_mut_ptr(),
                )
            {
                return Vec::new();
            }
            out.iter()
                .map(|h| {
                    // Envoy's header maps hold names lowercase.
                    (
                        owned_at(h.key_ptr, h.key_length),
                        owned_at(h.value_ptr, h.value_length),
                    )
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
                self.ptr,
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
                self.ptr,
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
            abi::envoy_dynamic_module_callback_http_set_header(self.ptr, kind, buf(name), value);
        }
    }

    /// Make the router pick the route again (its cluster comes from a header the filter
    /// set). Envoy's cheaper "cluster only" refresh does not re-read a `cluster_header`
    /// (seen in 1.40). The downstream filter's call, never an upstream one's.
    pub fn refresh_route(self) {
        // SAFETY: live stream.
        unsafe { abi::envoy_dynamic_module_callback_http_clear_route_cache(self.ptr) }
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
                self.ptr,
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
            let n = abi::envoy_dynamic_module_callback_http_get_body_chunks_size(self.ptr, kind);
            if n == 0 {
                return;
            }
            let mut chunks = vec![EnvoyBuffer::NULL; n];
            if !abi::envoy_dynamic_module_callback_http_get_body_chunks(
                self.ptr,
                kind,
                chunks.as_mut_ptr(),
            ) {
                return;
            }
            for chunk in &chunks {
                out.extend_from_slice(chunk.as_bytes());
            }
        }
    }

    /// The size of a request body.
    pub fn request_body_size(self, which: Body) -> usize {
        // SAFETY: live stream.
        unsafe { abi::envoy_dynamic_module_callback_http_get_body_size(self.ptr, which.request()) }
    }

    /// True when the received piece is an earlier filter's buffer handed on whole.
    pub fn received_is_buffered(self) -> bool {
        // SAFETY: live stream.
        unsafe { abi::envoy_dynamic_module_callback_http_received_buffered_request_body(self.ptr) }
    }

    /// Replace a request body's bytes with the concatenation of `parts` (each copied
    /// once, into Envoy's buffer).
    pub fn replace_request_body(self, which: Body, parts: &[&[u8]]) {
        let kind = which.request();
        // SAFETY: live stream; Envoy copies each part during its call.
        unsafe {
            abi::envoy_dynamic_module_callback_http_drain_body(self.ptr, kind, usize::MAX);
            for part in parts.iter().filter(|p| !p.is_empty()) {
                abi::envoy_dynamic_module_callback_http_append_body(
                    self.ptr,
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
            abi::envoy_dynamic_module_callback_http_drain_body(self.ptr, which.request(), len);
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
                self.ptr,
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
            let n = abi::envoy_dynamic_module_callback_http_get_body_chunks_size(self.ptr, kind);
            let mut chunks = vec![EnvoyBuffer::NULL; n];
            if n > 0
                && abi::envoy_dynamic_module_callback_http_get_body_chunks(
                    self.ptr,
                    kind,
                    chunks.as_mut_ptr(),
                )
            {
                for chunk in &chunks {
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
            abi::envoy_dynamic_module_callback_http_drain_body(self.ptr, kind, usize::MAX);
            if !with.is_empty() {
                abi::envoy_dynamic_module_callback_http_append_body(
                    self.ptr,
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
                self.ptr,
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
                self.ptr,
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
                self.ptr,
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
                self.ptr,
                abi::METADATA_DYNAMIC,
                ns,
            );
            if n == 0 {
                return Vec::new();
            }
            let mut keys = vec![EnvoyBuffer::NULL; n];
            if !abi::envoy_dynamic_module_callback_http_get_metadata_keys(
                self.ptr,
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
                self.ptr,
                abi::ATTRIBUTE_SOURCE_ADDRESS,
                &mut out,
            )
            .then(|| owned(out.as_bytes()))
        }
    }

    /// Envoy's response code details, once there is an answer.
    pub fn response_code_details(self) -> Option<String> {
        let mut out = EnvoyBuffer::NULL;
        // SAFETY: live stream; copied at once.
        unsafe {
            abi::envoy_dynamic_module_callback_http_filter_get_attribute_string(
                self.ptr,
                abi::ATTRIBUTE_RESPONSE_CODE_DETAILS,
                &mut out,
            )
            .then(|| owned(out.as_bytes()))
        }
    }

    /// How many attempts the router made upstream (`upstream.request_attempt_count`).
    pub fn attempt_count(self) -> Option<u32> {
        let mut out = 0u64;
        // SAFETY: live stream.
        unsafe {
            abi::envoy_dynamic_module_callback_http_filter_get_attribute_int(
                self.ptr,
                abi::ATTRIBUTE_UPSTREAM_REQUEST_ATTEMPT_COUNT,
                &mut out,
            )
        }
        .then(|| u32::try_from(out).ok())
        .flatten()
    }

    /// The response code sent downstream, once there is one.
    pub fn response_code(self) -> Option<u32> {
        let mut out = 0u64;
        // SAFETY: live stream.
        unsafe {
            abi::envoy_dynamic_module_callback_http_filter_get_attribute_int(
                self.ptr,
                abi::ATTRIBUTE_RESPONSE_CODE,
                &mut out,
            )
        }
        .then(|| u32::try_from(out).ok())
        .flatten()
    }

    /// Add `amount` to counter `id` (defined by this stream's filter config) with `labels`.
    pub fn increment<S: AsRef<str>>(self, id: usize, labels: &[S], amount: u64) {
        let labels: Vec<ModuleBuffer> = labels.iter().map(|l| buf(l.as_ref())).collect();
        // SAFETY: live stream; labels outlive the call.
        unsafe {
            abi::envoy_dynamic_module_callback_http_filter_increment_counter(
                self.ptr,
                id,
                labels.as_ptr(),
                labels.len(),
                amount,
            );
        }
    }
}

/// Envoy-owned bytes of a header entry, copied.
///
/// # Safety
/// `ptr`/`len` came from Envoy during the current hook.
unsafe fn owned_at(ptr: *const c_char, len: usize) -> String {
    let buffer = EnvoyBuffer { ptr, length: len };
    // SAFETY: the caller's contract.
    owned(unsafe { buffer.as_bytes() })
}

/// Envoy's bytes as a String (one copy; invalid UTF-8 replaced, as proxy-wasm does).
fn owned(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) => s.to_owned(),
        Err(_) => String::from_utf8_lossy(bytes).into_owned(),
    }
}

/// Proof that the code runs in one of a configuration's hooks, which Envoy calls on the
/// main thread. Only `hooks` makes one, for the hook's duration; it is neither `Send`
/// nor `Sync`, so what holds it stays on the main thread.
pub struct MainThread<'h> {
    _hook: PhantomData<&'h ()>,
    _not_send: PhantomData<*const ()>,
}

impl MainThread<'_> {
    /// # Safety
    /// Called in a configuration hook, on the main thread, and used only while it runs.
    pub(super) unsafe fn new() -> Self {
        MainThread {
            _hook: PhantomData,
            _not_send: PhantomData,
        }
    }
}

/// A filter configuration's Envoy pointer as a configuration keeps it: shared with the
/// workers, it makes no call; [`ConfigPtr::on`] lends a [`ConfigHandle`] on the main
/// thread. Envoy keeps the pointer alive until `config_destroy`, which stops everything
/// that calls it first (`RequestPlugin::stop`).
#[derive(Clone, Copy)]
pub struct ConfigPtr(FilterConfigEnvoyPtr);
// SAFETY: the pointer is only dereferenced by Envoy, through a ConfigHandle, which needs
// the main thread's token.
unsafe impl Send for ConfigPtr {}
// SAFETY: as above.
unsafe impl Sync for ConfigPtr {}

impl ConfigPtr {
    /// # Safety
    /// `ptr` is the `filter_config_envoy_ptr` of the `config_new` hook being run.
    pub(super) unsafe fn new(ptr: FilterConfigEnvoyPtr) -> ConfigPtr {
        ConfigPtr(ptr)
    }

    /// The configuration's calls, for the main-thread hook `main` is the token of.
    pub fn on<'h>(self, _main: &'h MainThread<'_>) -> ConfigHandle<'h> {
        ConfigHandle {
            ptr: self.0,
            _main: PhantomData,
        }
    }
}

/// Calls on a filter configuration (main thread only: see [`MainThread`]).
#[derive(Clone, Copy)]
pub struct ConfigHandle<'h> {
    ptr: FilterConfigEnvoyPtr,
    _main: PhantomData<&'h MainThread<'h>>,
}

impl ConfigHandle<'_> {
    /// Define a counter with label names; only while Envoy builds the configuration
    /// (`config_new`), later definitions are refused.
    pub fn define_counter(self, name: &str, labels: &[&str]) -> Option<usize> {
        let labels: Vec<ModuleBuffer> = labels.iter().map(|l| buf(l)).collect();
        let mut id = 0usize;
        // SAFETY: live configuration (type invariant); buffers outlive the call.
        let result = unsafe {
            abi::envoy_dynamic_module_callback_http_filter_config_define_counter(
                self.ptr,
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
                self.ptr,
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
            abi::envoy_dynamic_module_callback_http_filter_config_scheduler_new(self.ptr)
        })
    }

    /// Start a call to `cluster` (headers must include `:method`, `:path` and `host`)
    /// carrying `body` (none when empty); its answer comes to `config_http_callout_done`
    /// with the returned id. It belongs to the configuration, not to a stream.
    pub fn call_out(
        self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout_ms: u64,
    ) -> Option<u64> {
        let headers = module_headers(headers);
        let mut id = 0u64;
        // SAFETY: live configuration, main thread; Envoy copies every buffer.
        let result = unsafe {
            abi::envoy_dynamic_module_callback_http_filter_config_http_callout(
                self.ptr,
                &mut id,
                buf(cluster),
                headers.as_ptr(),
                headers.len(),
                if body.is_empty() {
                    ModuleBuffer::NULL
                } else {
                    ModuleBuffer::of(body)
                },
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
