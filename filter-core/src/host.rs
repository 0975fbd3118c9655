//! What the filter needs of Envoy, as a trait each build implements: the proxy-wasm build
//! over proxy-wasm's host calls, the native build over Envoy's dynamic-module ABI, and
//! the tests over a fake Envoy. The flows ([`crate::request`], [`crate::stage`]) are
//! written once against it.
//!
//! The two ABIs differ in how a body reaches the filter. proxy-wasm keeps the whole body
//! readable at offsets while the filter pauses, and edits it at offsets; the dynamic-module
//! ABI hands each piece once and edits only a piece's front and the buffered part's end.
//! The trait hides both behind "copy what arrived" and "write this edit", and says which
//! kind of host it is ([`Host::PIECEWISE`]) so the flow can write an edit before the body
//! has all arrived where that saves a copy.

use std::time::Duration;

use halo_contract::facts::Fact;

use crate::breaker::Breakers;
use crate::config::IdentitySettings;
use crate::metrics::Counter;
use crate::pipeline::{PrefixEdit, VerifiedClaims};

/// What a hook answers Envoy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    Continue,
    /// Hold the headers (a local reply was sent, or the body is awaited).
    Stop,
    /// Keep the body piece buffered and wait for more.
    Buffer,
}

/// Log levels the filter uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Info,
    Warn,
    Error,
    Critical,
}

/// Logs and counters, outside a stream as well as inside one (the kill-list poll).
/// Never a header value, a body or a user in a log line.
pub trait Telemetry {
    fn log(&self, level: Level, message: &str);
    /// Add `amount` to `counter`.
    fn add(&self, counter: Counter<'_>, amount: u64);
    /// Add one to `counter`.
    fn count(&self, counter: Counter<'_>) {
        self.add(counter, 1);
    }
}

/// One stream's Envoy, for the duration of a hook. Header names are lowercase.
pub trait Host: Telemetry {
    /// True when the body comes in pieces handed once (each must be copied as it
    /// passes), and an edit of the body's head can be written before the body has all
    /// arrived. False when the host keeps the whole body readable until the end.
    const PIECEWISE: bool;

    /// Every request header, names lowercase.
    fn request_headers(&self) -> Vec<(String, String)>;
    /// The first value of request header `name`.
    fn request_header(&self, name: &str) -> Option<String>;
    /// Set (replacing every value) or, with `None`, remove request header `name`.
    fn set_request_header(&mut self, name: &str, value: Option<&str>);
    /// The first value of response header `name`.
    fn response_header(&self, name: &str) -> Option<String>;
    /// Set or remove response header `name`.
    fn set_response_header(&mut self, name: &str, value: Option<&str>);

    /// The downstream peer's address (`ip:port`).
    fn peer_address(&self) -> Option<String>;
    /// The claims jwt_authn verified on this request (`headers` are the request's, read
    /// once by the flow), or `None` when it verified no token.
    fn verified_claims(
        &self,
        identity: &IdentitySettings,
        headers: &[(String, String)],
    ) -> Option<VerifiedClaims>;
    /// The response code sent downstream, once there is one.
    fn response_code(&self) -> Option<u32>;
    /// Envoy's response code details (`via_upstream`, `upstream_reset_before_response_started{...}`,
    /// a filter's local reply's), once there is an answer.
    fn response_code_details(&self) -> Option<String>;

    /// How many attempts the router made on this stream's upstream so far (Envoy's
    /// `upstream.request_attempt_count`), once there is an answer.
    fn attempt_count(&self) -> Option<u32>;
    /// Run `f` on the target breakers ([`crate::breaker`]), shared by every stream of the
    /// VM in the wasm build (one VM per worker thread) and of the process in the native
    /// build. The flow asks about one target at a time, so a build that locks holds its
    /// lock only that long.
    fn with_breakers<R>(&self, f: impl FnOnce(&mut Breakers) -> R) -> R;

    /// Leave the request filter's note for every attempt of this stream.
    fn set_attempt_note(&mut self, value: &[u8]);
    /// The note the request filter left (the per-attempt stage).
    fn attempt_note(&self) -> Option<Vec<u8>>;
    /// The picked endpoint's facts (`EndpointFacts` bytes; the per-attempt stage).
    fn endpoint_facts(&self) -> Option<Vec<u8>>;
    /// Make the router pick the route again (the request filter set its cluster header).
    fn refresh_route(&mut self);

    /// Answer the request locally.
    fn send_response(&mut self, status: u16, headers: &[(String, String)], body: &[u8]);

    /// The request body's length once what arrived in this hook is added to the `held`
    /// bytes the flow copied so far.
    fn request_body_total(&self, held: usize) -> usize;
    /// Append to `body` (the bytes copied so far) what arrived since. A host that keeps
    /// the body readable stops at `limit` bytes in all; a piecewise one copies the piece.
    /// A piecewise host may empty `body` first when it hands the whole body again.
    fn copy_request_body(&mut self, body: &mut Vec<u8>, limit: usize);
    /// Write `edit` of `body` (the request body as received, at least up to the edit's
    /// end) into the body Envoy sends on, copying what the ABI makes necessary.
    fn write_body_edit(&mut self, edit: &PrefixEdit, body: &[u8]);
    /// Replace the whole request body with `edit` of `body` (the body as received, all of
    /// it), whatever an earlier write left in Envoy's buffer.
    fn replace_request_body(&mut self, edit: &PrefixEdit, body: &[u8]);

    /// Wall-clock time now, since the Unix epoch (the time to an answer's first byte).
    fn now(&self) -> Duration;
    /// Write an evidence fact where Envoy's access log reads it (filter state under
    /// [`Fact::state_key`], the same key in both builds), replacing an earlier value.
    fn set_fact(&mut self, fact: Fact, value: &str);
    /// A string of the serving endpoint's `filter_metadata.halo` (its `upstream`,
    /// `model`): the request filter's response side reads which target served.
    fn served_metadata(&self, key: &str) -> Option<String>;

    /// Send `body` with `headers` (pseudo-headers included) to `cluster` as an HTTP
    /// callout Envoy runs on its own, answered nowhere: the stream does not wait for it.
    /// False when Envoy refused to start it (no such cluster, its circuit breaker open).
    /// A callout still running when the stream ends is cancelled by Envoy.
    fn dispatch(
        &mut self,
        cluster: &str,
        headers: &[(String, String)],
        body: &[u8],
        timeout_ms: u64,
    ) -> bool;

    /// The response body passed to the current response-body hook.
    fn response_body(&self) -> Vec<u8>;
    /// Replace the response body passed to the current response-body hook.
    fn set_response_body(&mut self, bytes: &[u8]);
}
