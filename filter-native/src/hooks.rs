//! The event hooks Envoy resolves in the shared object. Each turns Envoy's pointers into
//! the module's objects and hands over to halo-filter-core's flows (through
//! [`NativeHost`]) or to [`crate::plugin`]. Envoy requires every per-stream hook to exist, so the ones this
//! filter has no use for (callouts per stream, streams, watermarks) answer nothing.

use std::ffi::c_char;
use std::sync::Arc;

use crate::abi::{
    self, EnvoyBuffer, EnvoyHeader, FilterConfigEnvoyPtr, FilterConfigModulePtr, FilterEnvoyPtr,
    FilterModulePtr,
};
use halo_filter_core::host::Level;
use halo_filter_core::request::RequestFlow;
use halo_filter_core::stage::StageFlow;

use crate::host::{self, ConfigHandle, NativeHost, Stream, log};
use crate::plugin::{AttemptPlugin, Plugin, RequestPlugin, TICK_EVENT};

/// Per-stream object behind a filter module pointer: the flow and its configuration.
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

/// Per-config object behind a config module pointer. `Arc`s so that each stream holds
/// its configuration's parts without a lifetime tied to Envoy's pointer.
enum Config {
    Request(Arc<RequestPlugin>),
    Attempt(Arc<AttemptPlugin>),
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
    // SAFETY: Envoy's buffer, valid during this call.
    let bytes = unsafe { config.as_bytes() };
    // SAFETY: Envoy's live config pointer, in config_new on the main thread; the plugin
    // uses it from the configuration's main-thread hooks until config_destroy stops it.
    let handle = unsafe { ConfigHandle::new(envoy) };
    match Plugin::new(handle, bytes) {
        Ok(Plugin::Request(p)) => Box::into_raw(Box::new(Config::Request(Arc::new(*p)))).cast(),
        Ok(Plugin::Attempt(p)) => Box::into_raw(Box::new(Config::Attempt(Arc::new(p)))).cast(),
        Err(e) => {
            log(Level::Critical, &e);
            std::ptr::null()
        }
    }
}

/// # Safety
/// `config` came from `config_new` and is destroyed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(
    config: FilterConfigModulePtr,
) {
    // SAFETY: made by Box::into_raw in config_new; Envoy destroys it once.
    let config = unsafe { Box::from_raw(config as *mut Config) };
    if let Config::Request(p) = &*config {
        p.stop();
    }
}

/// # Safety
/// `config` came from `config_new` and is alive.
unsafe fn config_ref<'a>(config: FilterConfigModulePtr) -> &'a Config {
    // SAFETY: the caller's contract.
    unsafe { &*(config as *const Config) }
}

/// # Safety
/// `filter` came from `filter_new` and is alive; only its worker thread calls.
unsafe fn filter_mut<'a>(filter: FilterModulePtr) -> &'a mut Filter {
    // SAFETY: the caller's contract; Envoy calls one stream's hooks on one thread.
    unsafe { &mut *(filter as *mut Filter) }
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
    if let Config::Request(p) = unsafe { config_ref(config) }
        && event_id == TICK_EVENT
    {
        p.on_tick();
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
    // SAFETY: a live config (Envoy's contract).
    let Config::Request(p) = (unsafe { config_ref(config) }) else {
        return;
    };
    let mut status = None;
    let mut body = Vec::new();
    if result == abi::CALLOUT_SUCCESS {
        // SAFETY: Envoy's arrays of the given sizes, valid during this call.
        unsafe {
            if !headers.is_null() {
                for h in std::slice::from_raw_parts(headers, headers_size) {
                    let key = EnvoyBuffer {
                        ptr: h.key_ptr,
                        length: h.key_length,
                    }
                    .as_bytes();
                    if key == b":status" {
                        let value = EnvoyBuffer {
                            ptr: h.value_ptr,
                            length: h.value_length,
                        }
                        .as_bytes();
                        status = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok());
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
    p.on_poll_answer(callout_id, status, &body);
}

/// # Safety
/// Envoy's live pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_new(
    config: FilterConfigModulePtr,
    _envoy: FilterEnvoyPtr,
) -> FilterModulePtr {
    // SAFETY: a live config (Envoy's contract).
    let filter = match unsafe { config_ref(config) } {
        Config::Request(p) => Filter::Request {
            plugin: p.clone(),
            flow: RequestFlow::new(),
        },
        Config::Attempt(p) => Filter::Stage {
            plugin: p.clone(),
            flow: StageFlow::new(),
        },
    };
    Box::into_raw(Box::new(filter)).cast()
}

/// # Safety
/// `filter` came from `filter_new`; destroyed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_destroy(filter: FilterModulePtr) {
    // SAFETY: made by Box::into_raw in filter_new; Envoy destroys it once.
    drop(unsafe { Box::from_raw(filter as *mut Filter) });
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
    let (s, f) = unsafe { (Stream::new(envoy), filter_mut(filter)) };
    host::headers_status(match f {
        Filter::Request { plugin, flow } => flow.on_request_headers(
            &mut NativeHost::new(s, &plugin.meter),
            &**plugin,
            end_of_stream,
        ),
        Filter::Stage { plugin, flow } => {
            flow.on_request_headers(&mut NativeHost::new(s, &plugin.meter), end_of_stream)
        }
    })
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
    let (s, f) = unsafe { (Stream::new(envoy), filter_mut(filter)) };
    host::body_status(match f {
        Filter::Request { plugin, flow } => flow.on_request_body(
            &mut NativeHost::new(s, &plugin.meter),
            &**plugin,
            end_of_stream,
        ),
        Filter::Stage { plugin, flow } => {
            flow.on_request_body(&mut NativeHost::new(s, &plugin.meter), end_of_stream)
        }
    })
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
    _end_of_stream: bool,
) -> u32 {
    // SAFETY: Envoy's contract for this hook.
    let (s, f) = unsafe { (Stream::new(envoy), filter_mut(filter)) };
    if let Filter::Stage { plugin, flow } = f {
        flow.on_response_headers(&mut NativeHost::new(s, &plugin.meter));
    }
    abi::HEADERS_CONTINUE
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
    let (s, f) = unsafe { (Stream::new(envoy), filter_mut(filter)) };
    if let Filter::Stage { plugin, flow } = f {
        flow.on_response_body(&mut NativeHost::new(s, &plugin.meter), end_of_stream);
    }
    abi::BODY_CONTINUE
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
    let (s, f) = unsafe { (Stream::new(envoy), filter_mut(filter)) };
    if let Filter::Request { plugin, flow } = f {
        flow.on_stream_complete(&mut NativeHost::new(s, &plugin.meter));
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
