//! The event hooks Envoy resolves in the shared object. Each turns Envoy's pointers into
//! the module's objects and hands over to halo-filter-core's flows (through
//! [`NativeHost`]) or to [`crate::plugin`]. Envoy requires every per-stream hook to exist,
//! so the ones this filter has no use for (callouts per stream, streams, watermarks)
//! answer nothing.
//!
//! Three rules hold for every hook:
//! - A stream's filter is borrowed through a `RefCell`, never as a `&mut` made from the
//!   pointer: Envoy re-enters a hook while another runs (a local reply runs the encoder
//!   chain, this filter's response hooks included, from inside `send_response`). A hook
//!   re-entered that way finds the filter borrowed and lets the stream pass.
//! - Every hook runs behind `catch_unwind`: a panic never crosses into Envoy (which would
//!   abort the process). A request hook that panicked answers its request 500 with a JSON
//!   body; the panic is counted (`halo_panics`) and logged, and the stream's filter steps
//!   aside for the rest of it.
//! - References made from Envoy's pointers live only inside the hook (closures with a
//!   lifetime the caller cannot choose).

use std::cell::{Cell, RefCell};
use std::ffi::c_char;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use halo_filter_core::config::TestPanic;
use halo_filter_core::host::{Level, Next};
use halo_filter_core::metrics::Counter;
use halo_filter_core::request::RequestFlow;
use halo_filter_core::stage::StageFlow;

use super::abi::{
    self, EnvoyBuffer, EnvoyHeader, FilterConfigEnvoyPtr, FilterConfigModulePtr, FilterEnvoyPtr,
    FilterModulePtr,
};
use super::envoy::{ConfigPtr, MainThread, Stream, log};
use crate::host::NativeHost;
use crate::plugin::{
    AttemptPlugin, Meter, Plugin, RequestPlugin, SHADOW_EVENT, STAGE_COUNTS, TICK_EVENT,
};

/// A stream's filter: the flow and its configuration.
// One per stream and boxed once (`filter_new`): boxing the larger variant as well would
// add an allocation per request to save a stage's stream a few hundred bytes.
#[allow(clippy::large_enum_variant)]
enum Filter {
    Request {
        plugin: Arc<RequestPlugin>,
        flow: RequestFlow,
    },
    Stage {
        plugin: Arc<AttemptPlugin>,
        flow: StageFlow,
    },
}

impl Filter {
    fn meter(&self) -> &Meter {
        match self {
            Filter::Request { plugin, .. } => &plugin.meter,
            Filter::Stage { plugin, .. } => &plugin.meter,
        }
    }

    /// `settings.testPanic`: panic here when the configuration asks (the live test).
    fn panic_if(&self, at: TestPanic) {
        if let Filter::Request { plugin, .. } = self
            && plugin.cfg.test_panic == Some(at)
        {
            panic!("halo: testPanic at {at:?}");
        }
    }
}

/// What a filter module pointer points at.
struct Slot {
    filter: RefCell<Filter>,
    /// The configuration's panics counter, kept apart so a panic is counted without
    /// the filter (borrowed by the hook that panicked).
    panics: Option<usize>,
    /// A hook of this stream panicked: the filter steps aside for the rest of it.
    failed: Cell<bool>,
}

/// Per-config object behind a config module pointer. `Arc`s so that each stream holds
/// its configuration's parts without a lifetime tied to Envoy's pointer.
enum Config {
    Request(Arc<RequestPlugin>),
    Attempt(Arc<AttemptPlugin>),
}

/// The answer to a request whose hook panicked.
const PANIC_BODY: &[u8] = br#"{"type":"error","error":{"type":"api_error","message":"the halo filter failed on this request"}}"#;

/// The ABI status of a headers answer.
fn headers_status(next: Next) -> u32 {
    match next {
        Next::Continue => abi::HEADERS_CONTINUE,
        Next::Stop | Next::Buffer => abi::HEADERS_STOP_ITERATION,
    }
}

/// The ABI status of a body answer.
fn body_status(next: Next) -> u32 {
    match next {
        Next::Continue => abi::BODY_CONTINUE,
        // After a local reply Envoy ignores the answer; stop either way.
        Next::Stop | Next::Buffer => abi::BODY_STOP_AND_BUFFER,
    }
}

/// Which stream hook runs, for [`stream_hook`].
#[derive(Clone, Copy, Debug)]
enum Hook {
    RequestHeaders,
    RequestBody,
    ResponseHeaders,
    ResponseBody,
    StreamComplete,
}

impl Hook {
    /// The answer that lets the stream pass.
    fn pass(self) -> u32 {
        match self {
            Hook::RequestHeaders | Hook::ResponseHeaders => abi::HEADERS_CONTINUE,
            Hook::RequestBody | Hook::ResponseBody => abi::BODY_CONTINUE,
            Hook::StreamComplete => 0,
        }
    }

    /// The answer after a panic: a request hook answers the request 500 and stops it; a
    /// response hook can only let the answer pass.
    fn after_panic(self, s: Stream<'_>) -> u32 {
        match self {
            Hook::RequestHeaders | Hook::RequestBody => {
                s.send_response(
                    500,
                    &[("content-type".into(), "application/json".into())],
                    PANIC_BODY,
                );
                match self {
                    Hook::RequestHeaders => abi::HEADERS_STOP_ITERATION,
                    _ => abi::BODY_STOP_AND_BUFFER,
                }
            }
            _ => self.pass(),
        }
    }
}

/// Run a stream hook: `run` gets the stream and the filter, borrowed once (a re-entered
/// hook lets the stream pass), behind `catch_unwind`.
///
/// # Safety
/// `envoy` and `filter` are the pointers of the stream hook being run; `filter` came
/// from `filter_new` and is not yet destroyed.
unsafe fn stream_hook(
    envoy: FilterEnvoyPtr,
    filter: FilterModulePtr,
    hook: Hook,
    run: impl for<'h> FnOnce(Stream<'h>, &mut Filter) -> u32,
) -> u32 {
    // SAFETY: the caller's contract; a shared reference only (Envoy may re-enter).
    let slot = unsafe { &*filter.cast::<Slot>() };
    // SAFETY: the caller's contract; the stream is used only during this call.
    let s = unsafe { Stream::new(envoy) };
    if slot.failed.get() {
        return hook.pass();
    }
    let Ok(mut f) = slot.filter.try_borrow_mut() else {
        // Re-entered from inside this stream's own hook (a local reply).
        return hook.pass();
    };
    match catch_unwind(AssertUnwindSafe(|| run(s, &mut f))) {
        Ok(status) => status,
        Err(_) => {
            drop(f);
            slot.failed.set(true);
            match slot.panics {
                Some(id) => s.increment(id, &[] as &[&str], 1),
                // The per-attempt stage has no counters of its own.
                None => STAGE_COUNTS.add(&Counter::Panics, 1),
            }
            log(
                Level::Error,
                &format!(
                    "halo: the filter panicked in {hook:?}; the request is answered 500 if it still can be"
                ),
            );
            hook.after_panic(s)
        }
    }
}

/// Run a configuration hook behind `catch_unwind` (a panic is logged, never unwound into
/// Envoy); `None` when it panicked.
fn config_hook<R>(what: &str, run: impl FnOnce(&MainThread<'_>) -> R) -> Option<R> {
    // SAFETY: called only from the configuration hooks below, on the main thread, and
    // the token does not outlive this call.
    let main = unsafe { MainThread::new() };
    let result = catch_unwind(AssertUnwindSafe(|| run(&main)));
    if result.is_err() {
        log(
            Level::Critical,
            &format!("halo: the filter panicked in {what}"),
        );
    }
    result.ok()
}

/// The configuration behind a config module pointer, for the duration of `run`.
///
/// # Safety
/// `config` came from `config_new` and is not yet destroyed.
unsafe fn with_config<R>(config: FilterConfigModulePtr, run: impl FnOnce(&Config) -> R) -> R {
    // SAFETY: the caller's contract.
    run(unsafe { &*config.cast::<Config>() })
}

/// The ABI version this module's declarations follow (`abi.h`); Envoy 1.40 loads v0.1
/// modules and logs that a newer one exists.
static ABI_VERSION: &[u8] = b"v0.1.0\0";

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const c_char {
    ABI_VERSION.as_ptr().cast()
}

/// # Safety
/// Called by Envoy with its live config pointer and buffers valid for the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    envoy: FilterConfigEnvoyPtr,
    _name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> FilterConfigModulePtr {
    // SAFETY: Envoy's live config pointer, in config_new on the main thread; the plugin
    // calls it only through a main-thread token until config_destroy stops it.
    let ptr = unsafe { ConfigPtr::new(envoy) };
    let made = config_hook("config_new", |main| {
        // SAFETY: Envoy's buffer, valid during this call.
        let bytes = unsafe { config.as_bytes() };
        Plugin::new(ptr, main, bytes)
    });
    match made {
        Some(Ok(Plugin::Request(p))) => {
            Box::into_raw(Box::new(Config::Request(Arc::new(*p)))).cast()
        }
        Some(Ok(Plugin::Attempt(p))) => {
            Box::into_raw(Box::new(Config::Attempt(Arc::new(*p)))).cast()
        }
        Some(Err(e)) => {
            log(Level::Critical, &e);
            std::ptr::null()
        }
        None => std::ptr::null(),
    }
}

/// # Safety
/// `config` came from `config_new` and is destroyed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(
    config: FilterConfigModulePtr,
) {
    // SAFETY: made by Box::into_raw in config_new; Envoy destroys it once.
    let config = unsafe { Box::from_raw(config.cast_mut().cast::<Config>()) };
    config_hook("config_destroy", |main| {
        if let Config::Request(p) = &*config {
            p.stop(main);
        }
    });
}

/// # Safety
/// Envoy's live config pointer (main thread).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_config_scheduled(
    _envoy: FilterConfigEnvoyPtr,
    config: FilterConfigModulePtr,
    event_id: u64,
) {
    // SAFETY: a live config (Envoy's contract).
    unsafe {
        with_config(config, |c| {
            if let Config::Request(p) = c {
                match event_id {
                    TICK_EVENT => {
                        config_hook("config_scheduled", |main| p.on_tick(main));
                    }
                    SHADOW_EVENT => {
                        config_hook("config_scheduled", |main| p.send_shadow_jobs(main));
                    }
                    _ => {}
                }
            }
        });
    }
}

/// # Safety
/// Envoy's live config pointer, headers and chunks valid for the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_config_http_callout_done(
    _envoy: FilterConfigEnvoyPtr,
    config: FilterConfigModulePtr,
    callout_id: u64,
    result: u32,
    headers: *const EnvoyHeader,
    headers_size: usize,
    body_chunks: *const EnvoyBuffer,
    body_chunks_size: usize,
) {
    let mut status = None;
    let mut body = Vec::new();
    if result == abi::CALLOUT_SUCCESS {
        // SAFETY: Envoy's arrays of the given sizes, valid during this call; read here.
        unsafe {
            if !headers.is_null() {
                for h in std::slice::from_raw_parts(headers, headers_size) {
                    let key = EnvoyBuffer {
                        ptr: h.key_ptr,
                        length: h.key_length,
                    };
                    if key.as_bytes() == b":status" {
                        let value = EnvoyBuffer {
                            ptr: h.value_ptr,
                            length: h.value_length,
                        };
                        status = std::str::from_utf8(value.as_bytes())
                            .ok()
                            .and_then(|v| v.parse().ok());
                    }
                }
            }
            if !body_chunks.is_null() {
                for c in std::slice::from_raw_parts(body_chunks, body_chunks_size) {
                    body.extend_from_slice(c.as_bytes());
                }
            }
        }
    }
    // SAFETY: a live config (Envoy's contract).
    unsafe {
        with_config(config, |c| {
            if let Config::Request(p) = c {
                config_hook("config_http_callout_done", |main| {
                    p.on_poll_answer(main, callout_id, status, &body);
                });
            }
        });
    }
}

/// # Safety
/// Envoy's live pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_new(
    config: FilterConfigModulePtr,
    _envoy: FilterEnvoyPtr,
) -> FilterModulePtr {
    // SAFETY: a live config (Envoy's contract).
    let filter = unsafe {
        with_config(config, |c| match c {
            Config::Request(p) => Filter::Request {
                plugin: p.clone(),
                flow: RequestFlow::new(),
            },
            Config::Attempt(p) => Filter::Stage {
                plugin: p.clone(),
                flow: StageFlow::new(),
            },
        })
    };
    let slot = Slot {
        panics: filter.meter().panics,
        filter: RefCell::new(filter),
        failed: Cell::new(false),
    };
    Box::into_raw(Box::new(slot)).cast()
}

/// # Safety
/// `filter` came from `filter_new`; destroyed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_destroy(filter: FilterModulePtr) {
    // SAFETY: made by Box::into_raw in filter_new; Envoy destroys it once, outside any
    // other hook of the stream.
    let slot = unsafe { Box::from_raw(filter.cast_mut().cast::<Slot>()) };
    // Dropping a flow runs no code of ours that could panic, but Envoy must never see one.
    let _ = catch_unwind(AssertUnwindSafe(move || drop(slot)));
}

/// # Safety
/// Envoy's live pointers, on the stream's worker thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    envoy: FilterEnvoyPtr,
    filter: FilterModulePtr,
    end_of_stream: bool,
) -> u32 {
    // SAFETY: Envoy's contract for this hook.
    unsafe {
        stream_hook(envoy, filter, Hook::RequestHeaders, |s, f| {
            f.panic_if(TestPanic::RequestHeaders);
            headers_status(match f {
                Filter::Request { plugin, flow } => flow.on_request_headers(
                    &mut NativeHost::new(s, &plugin.meter),
                    &**plugin,
                    end_of_stream,
                ),
                Filter::Stage { plugin, flow } => {
                    flow.on_request_headers(&mut NativeHost::new(s, &plugin.meter), end_of_stream)
                }
            })
        })
    }
}

/// # Safety
/// Envoy's live pointers, on the stream's worker thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_request_body(
    envoy: FilterEnvoyPtr,
    filter: FilterModulePtr,
    end_of_stream: bool,
) -> u32 {
    // SAFETY: Envoy's contract for this hook.
    unsafe {
        stream_hook(envoy, filter, Hook::RequestBody, |s, f| {
            f.panic_if(TestPanic::RequestBody);
            body_status(match f {
                Filter::Request { plugin, flow } => flow.on_request_body(
                    &mut NativeHost::new(s, &plugin.meter),
                    &**plugin,
                    end_of_stream,
                ),
                Filter::Stage { plugin, flow } => {
                    flow.on_request_body(&mut NativeHost::new(s, &plugin.meter), end_of_stream)
                }
            })
        })
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(
    _envoy: FilterEnvoyPtr,
    _filter: FilterModulePtr,
) -> u32 {
    abi::TRAILERS_CONTINUE
}

/// # Safety
/// Envoy's live pointers, on the stream's worker thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    envoy: FilterEnvoyPtr,
    filter: FilterModulePtr,
    end_of_stream: bool,
) -> u32 {
    // SAFETY: Envoy's contract for this hook.
    unsafe {
        stream_hook(envoy, filter, Hook::ResponseHeaders, |s, f| {
            f.panic_if(TestPanic::ResponseHeaders);
            headers_status(match f {
                Filter::Request { plugin, flow } => flow.on_response_headers(
                    &mut NativeHost::new(s, &plugin.meter),
                    &**plugin,
                    end_of_stream,
                ),
                Filter::Stage { plugin, flow } => {
                    flow.on_response_headers(&mut NativeHost::new(s, &plugin.meter))
                }
            })
        })
    }
}

/// # Safety
/// Envoy's live pointers, on the stream's worker thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_response_body(
    envoy: FilterEnvoyPtr,
    filter: FilterModulePtr,
    end_of_stream: bool,
) -> u32 {
    // SAFETY: Envoy's contract for this hook.
    unsafe {
        stream_hook(envoy, filter, Hook::ResponseBody, |s, f| {
            body_status(match f {
                Filter::Request { plugin, flow } => {
                    flow.on_response_body(&mut NativeHost::new(s, &plugin.meter), end_of_stream)
                }
                Filter::Stage { plugin, flow } => {
                    flow.on_response_body(&mut NativeHost::new(s, &plugin.meter), end_of_stream)
                }
            })
        })
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(
    _envoy: FilterEnvoyPtr,
    _filter: FilterModulePtr,
) -> u32 {
    abi::TRAILERS_CONTINUE
}

/// # Safety
/// Envoy's live pointers, on the stream's worker thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(
    envoy: FilterEnvoyPtr,
    filter: FilterModulePtr,
) {
    // SAFETY: Envoy's contract for this hook.
    unsafe {
        stream_hook(envoy, filter, Hook::StreamComplete, |s, f| {
            if let Filter::Request { plugin, flow } = f {
                flow.on_stream_complete(&mut NativeHost::new(s, &plugin.meter));
            }
            0
        });
    }
}

// Hooks Envoy requires and this filter does not use.

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_callout_done(
    _envoy: FilterEnvoyPtr,
    _filter: FilterModulePtr,
    _callout_id: u64,
    _result: u32,
    _headers: *const EnvoyHeader,
    _headers_size: usize,
    _body_chunks: *const EnvoyBuffer,
    _body_chunks_size: usize,
) {
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_headers(
    _envoy: FilterEnvoyPtr,
    _filter: FilterModulePtr,
    _stream_id: u64,
    _headers: *const EnvoyHeader,
    _headers_size: usize,
    _end_stream: bool,
) {
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_data(
    _envoy: FilterEnvoyPtr,
    _filter: FilterModulePtr,
    _stream_id: u64,
    _data: *const EnvoyBuffer,
    _data_count: usize,
    _end_stream: bool,
) {
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_trailers(
    _envoy: FilterEnvoyPtr,
    _filter: FilterModulePtr,
    _stream_id: u64,
    _trailers: *const EnvoyHeader,
    _trailers_size: usize,
) {
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_complete(
    _envoy: FilterEnvoyPtr,
    _filter: FilterModulePtr,
    _stream_id: u64,
) {
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_reset(
    _envoy: FilterEnvoyPtr,
    _filter: FilterModulePtr,
    _stream_id: u64,
    _reason: u32,
) {
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_scheduled(
    _envoy: FilterEnvoyPtr,
    _filter: FilterModulePtr,
    _event_id: u64,
) {
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(
    _envoy: FilterEnvoyPtr,
    _filter: FilterModulePtr,
) {
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(
    _envoy: FilterEnvoyPtr,
    _filter: FilterModulePtr,
) {
}
