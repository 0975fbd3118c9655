//! halo-envoy-config: the compiled policy as Envoy configuration, shared by the filter
//! (cluster names it routes to), `halo envoy bootstrap` (the standalone bootstrap) and the
//! xDS server (halo-xds), which both emit the one gateway plan made here.
//!
//! The names, facts and job shapes it shares with the filter and halo-server are
//! halo-contract's; this crate emits them.
//!
//! Pure: no I/O, no Envoy protobuf types; every builder returns `serde_json::Value` in
//! Envoy's JSON/YAML shape, and [`yaml::to_yaml`] prints it deterministically.
//!
//! Code map:
//! - [`ads`]: envoy/ads.yaml (the xDS-driven Envoy's bootstrap) with its marked values
//!   filled in, for every Envoy booted from it.
//! - [`plan`]: snapshot + gateway settings -> the [`plan::Plan`], every decision about the
//!   gateway's Envoy resources, made once (both modes).
//! - [`bootstrap`]: the standalone (static resources) bootstrap, the plan's JSON emitter
//!   (halo-xds's `envoy` module is its protobuf emitter), and the filters' Envoy JSON.
//! - [`budget`]: the budget check, Envoy's ratelimit filter asking halo-server's
//!   rate-limit service with the filter's facts.
//! - [`credentials`]: the per-attempt credential chain (SigV4, keys) after the stage.
//! - [`evidence`]: the OpenTelemetry access logger that sends the per-call evidence record
//!   to halo-server's gateway receiver (halo-contract's facts and attribute names).
//! - [`tls`]: upstream TLS verification (CA bundle, SAN, SNI) of every https cluster.
//! - [`yaml`]: a small deterministic YAML printer for JSON values.

pub mod ads;
pub mod bootstrap;
pub mod budget;
pub mod credentials;
pub mod evidence;
pub mod plan;
pub mod tls;
pub mod yaml;
