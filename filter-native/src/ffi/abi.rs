//! The part of Envoy's dynamic-module C ABI (`abi.h`, ABI "v0.1.0") this module uses,
//! written by hand: the official Rust SDK is a git dependency on the Envoy repository,
//! which this project's registries do not reach.
//!
//! Every callback below is a dynamic symbol of the Envoy binary that loads the module
//! (check with `nm -D --defined-only $(envoy binary) | grep envoy_dynamic_module_callback_`),
//! and Envoy 1.40 (ABI "v0.2.0") keeps v0.1 signatures. A mismatch here is undefined
//! behaviour, so this file changes only against the header of the Envoy it targets, and
//! the live tests run every call it declares.
//!
//! Enums Envoy passes in are taken as `u32` (a value added by a newer Envoy must not be
//! undefined behaviour); the ones the module returns are `u32` constants.

use std::ffi::{c_char, c_void};
use std::marker::PhantomData;

/// Bytes owned by Envoy, valid until the current hook returns or a setter changes them.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EnvoyBuffer {
    pub ptr: *const c_char,
    pub length: usize,
}

impl EnvoyBuffer {
    pub const NULL: EnvoyBuffer = EnvoyBuffer {
        ptr: std::ptr::null(),
        length: 0,
    };

    /// The bytes, borrowed no longer than this value (copy them before it goes).
    ///
    /// # Safety
    /// Envoy wrote this buffer during the current hook, and no setter ran since.
    pub unsafe fn as_bytes(&self) -> &[u8] {
        if self.ptr.is_null() || self.length == 0 {
            return &[];
        }
        // SAFETY: the caller's contract; Envoy keeps these bytes alive for the hook.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.length) }
    }
}

/// Bytes owned by the module, borrowed for `'a`; Envoy copies them during the call.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ModuleBuffer<'a> {
    pub ptr: *const c_char,
    pub length: usize,
    _bytes: PhantomData<&'a [u8]>,
}

impl<'a> ModuleBuffer<'a> {
    pub fn of(bytes: &'a [u8]) -> ModuleBuffer<'a> {
        ModuleBuffer {
            ptr: bytes.as_ptr().cast(),
            length: bytes.len(),
            _bytes: PhantomData,
        }
    }

    pub const NULL: ModuleBuffer<'static> = ModuleBuffer {
        ptr: std::ptr::null(),
        length: 0,
        _bytes: PhantomData,
    };
}

#[repr(C)]
pub struct ModuleHeader<'a> {
    pub key_ptr: *const c_char,
    pub key_length: usize,
    pub value_ptr: *const c_char,
    pub value_length: usize,
    _bytes: PhantomData<&'a str>,
}

impl<'a> ModuleHeader<'a> {
    /// Borrow `name: value` for one call (Envoy copies it).
    pub fn of(name: &'a str, value: &'a str) -> ModuleHeader<'a> {
        ModuleHeader {
            key_ptr: name.as_ptr().cast(),
            key_length: name.len(),
            value_ptr: value.as_ptr().cast(),
            value_length: value.len(),
            _bytes: PhantomData,
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct EnvoyHeader {
    pub key_ptr: *const c_char,
    pub key_length: usize,
    pub value_ptr: *const c_char,
    pub value_length: usize,
}

pub type FilterConfigEnvoyPtr = *mut c_void;
pub type FilterConfigModulePtr = *const c_void;
pub type FilterEnvoyPtr = *mut c_void;
pub type FilterModulePtr = *const c_void;
pub type ConfigSchedulerPtr = *mut c_void;

/// `envoy_dynamic_module_type_http_header_type`.
pub const REQUEST_HEADER: u32 = 0;
pub const RESPONSE_HEADER: u32 = 2;

/// `envoy_dynamic_module_type_http_body_type`.
pub const RECEIVED_REQUEST_BODY: u32 = 0;
pub const BUFFERED_REQUEST_BODY: u32 = 1;
pub const RECEIVED_RESPONSE_BODY: u32 = 2;

/// `envoy_dynamic_module_type_log_level`.
pub const LOG_INFO: u32 = 2;
pub const LOG_WARN: u32 = 3;
pub const LOG_ERROR: u32 = 4;
pub const LOG_CRITICAL: u32 = 5;

/// `envoy_dynamic_module_type_metadata_source`.
pub const METADATA_DYNAMIC: u32 = 0;
pub const METADATA_HOST: u32 = 3;

/// `envoy_dynamic_module_type_attribute_id`.
pub const ATTRIBUTE_RESPONSE_CODE: u32 = 15;
pub const ATTRIBUTE_RESPONSE_CODE_DETAILS: u32 = 16;
pub const ATTRIBUTE_SOURCE_ADDRESS: u32 = 24;
pub const ATTRIBUTE_UPSTREAM_REQUEST_ATTEMPT_COUNT: u32 = 53;

/// `envoy_dynamic_module_type_http_callout_init_result`.
pub const CALLOUT_INIT_SUCCESS: u32 = 0;
/// `envoy_dynamic_module_type_http_callout_result`.
pub const CALLOUT_SUCCESS: u32 = 0;

/// `envoy_dynamic_module_type_metrics_result`.
pub const METRICS_SUCCESS: u32 = 0;

/// Request/response headers hook statuses.
pub const HEADERS_CONTINUE: u32 = 0;
pub const HEADERS_STOP_ITERATION: u32 = 1;
/// Request/response body hook statuses.
pub const BODY_CONTINUE: u32 = 0;
pub const BODY_STOP_AND_BUFFER: u32 = 1;
/// Trailers hook statuses.
pub const TRAILERS_CONTINUE: u32 = 0;

unsafe extern "C" {
    pub fn envoy_dynamic_module_callback_log(level: u32, message: ModuleBuffer<'_>);

    pub fn envoy_dynamic_module_callback_http_filter_config_define_counter(
        config: FilterConfigEnvoyPtr,
        name: ModuleBuffer<'_>,
        label_names: *const ModuleBuffer<'_>,
        label_names_length: usize,
        counter_id: *mut usize,
    ) -> u32;
    pub fn envoy_dynamic_module_callback_http_filter_increment_counter(
        filter: FilterEnvoyPtr,
        id: usize,
        label_values: *const ModuleBuffer<'_>,
        label_values_length: usize,
        value: u64,
    ) -> u32;
    pub fn envoy_dynamic_module_callback_http_filter_config_increment_counter(
        config: FilterConfigEnvoyPtr,
        id: usize,
        label_values: *const ModuleBuffer<'_>,
        label_values_length: usize,
        value: u64,
    ) -> u32;

    pub fn envoy_dynamic_module_callback_http_get_header(
        filter: FilterEnvoyPtr,
        header_type: u32,
        key: ModuleBuffer<'_>,
        result: *mut EnvoyBuffer,
        index: usize,
        optional_size: *mut usize,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_get_headers_size(
        filter: FilterEnvoyPtr,
        header_type: u32,
    ) -> usize;
    pub fn envoy_dynamic_module_callback_http_get_headers(
        filter: FilterEnvoyPtr,
        header_type: u32,
        result: *mut EnvoyHeader,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_set_header(
        filter: FilterEnvoyPtr,
        header_type: u32,
        key: ModuleBuffer<'_>,
        value: ModuleBuffer<'_>,
    ) -> bool;

    pub fn envoy_dynamic_module_callback_http_clear_route_cache(filter: FilterEnvoyPtr);

    pub fn envoy_dynamic_module_callback_http_send_response(
        filter: FilterEnvoyPtr,
        status_code: u32,
        headers: *const ModuleHeader<'_>,
        headers_size: usize,
        body: ModuleBuffer<'_>,
        details: ModuleBuffer<'_>,
    );

    pub fn envoy_dynamic_module_callback_http_get_body_chunks_size(
        filter: FilterEnvoyPtr,
        body_type: u32,
    ) -> usize;
    pub fn envoy_dynamic_module_callback_http_get_body_chunks(
        filter: FilterEnvoyPtr,
        body_type: u32,
        result: *mut EnvoyBuffer,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_get_body_size(
        filter: FilterEnvoyPtr,
        body_type: u32,
    ) -> usize;
    pub fn envoy_dynamic_module_callback_http_drain_body(
        filter: FilterEnvoyPtr,
        body_type: u32,
        number_of_bytes: usize,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_append_body(
        filter: FilterEnvoyPtr,
        body_type: u32,
        data: ModuleBuffer<'_>,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_received_buffered_request_body(
        filter: FilterEnvoyPtr,
    ) -> bool;

    pub fn envoy_dynamic_module_callback_http_set_filter_state_bytes(
        filter: FilterEnvoyPtr,
        key: ModuleBuffer<'_>,
        value: ModuleBuffer<'_>,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_get_filter_state_bytes(
        filter: FilterEnvoyPtr,
        key: ModuleBuffer<'_>,
        result: *mut EnvoyBuffer,
    ) -> bool;

    pub fn envoy_dynamic_module_callback_http_get_metadata_string(
        filter: FilterEnvoyPtr,
        source: u32,
        namespace: ModuleBuffer<'_>,
        key: ModuleBuffer<'_>,
        result: *mut EnvoyBuffer,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_get_metadata_keys_count(
        filter: FilterEnvoyPtr,
        source: u32,
        namespace: ModuleBuffer<'_>,
    ) -> usize;
    pub fn envoy_dynamic_module_callback_http_get_metadata_keys(
        filter: FilterEnvoyPtr,
        source: u32,
        namespace: ModuleBuffer<'_>,
        result: *mut EnvoyBuffer,
    ) -> bool;

    pub fn envoy_dynamic_module_callback_http_filter_get_attribute_string(
        filter: FilterEnvoyPtr,
        attribute: u32,
        result: *mut EnvoyBuffer,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_filter_get_attribute_int(
        filter: FilterEnvoyPtr,
        attribute: u32,
        result: *mut u64,
    ) -> bool;

    pub fn envoy_dynamic_module_callback_http_filter_config_scheduler_new(
        config: FilterConfigEnvoyPtr,
    ) -> ConfigSchedulerPtr;
    pub fn envoy_dynamic_module_callback_http_filter_config_scheduler_commit(
        scheduler: ConfigSchedulerPtr,
        event_id: u64,
    );
    pub fn envoy_dynamic_module_callback_http_filter_config_scheduler_delete(
        scheduler: ConfigSchedulerPtr,
    );
    pub fn envoy_dynamic_module_callback_http_filter_config_http_callout(
        config: FilterConfigEnvoyPtr,
        callout_id: *mut u64,
        cluster_name: ModuleBuffer<'_>,
        headers: *const ModuleHeader<'_>,
        headers_size: usize,
        body: ModuleBuffer<'_>,
        timeout_milliseconds: u64,
    ) -> u32;
}
