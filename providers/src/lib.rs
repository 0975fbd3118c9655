//! halo-providers: what one upstream attempt sends, per upstream kind (spec: traffic plane,
//! Providers; low-level design, request path steps 7, 10 and 11).
//!
//! Pure code, no I/O, built for wasm32-unknown-unknown: it runs inside the halo filter's
//! per-attempt stage, once for every attempt, so failing over from a Bedrock target to an
//! Anthropic target builds each its own path, body and headers from the client's original
//! request.
//!
//! - [`translate`]: (client request as admit saw it, target kind, model and upstream
//!   settings) -> an [`Outbound`] request, or a [`Skip`] saying why this target cannot
//!   serve it.
//! - [`eventstream::EventStreamToSse`]: the Bedrock `invoke-with-response-stream` answer
//!   (AWS event stream, binary frames) turned into Anthropic SSE incrementally, for an
//!   Anthropic client.
//! - [`usage::Meter`]: the token usage of an answer, read as it streams by (JSON, SSE,
//!   AWS event stream), for the evidence record.
//!
//! Credentials are not here: the per-attempt stage never holds a secret. Envoy's own
//! filters add them after this stage (docs/design/credentials.md, "Per-attempt credentials").

pub mod eventstream;
mod json;
mod translate;
pub mod usage;

pub use translate::{
    BEDROCK_ANTHROPIC_VERSION, Dropped, Inbound, Outbound, ResponseConversion, Skip,
    VERTEX_ANTHROPIC_VERSION, encode_path_segment, translate, vertex_host,
};
