//! halo-server: the Halos web API for admins and fleets, and the signed kill switch
//! (ADR-0009).
//!
//! Features composed in one place: each feature owns its state and its routes, and
//! [`server`] is the only module that knows them all (it builds each one from its own
//! parts, registers its metrics, mounts its routes). Beneath the features, leaves they
//! share and that import none of them:
//! - [`http`]: the one error type and JSON error body, the `Admin` extractor, shared
//!   secrets under the per-address throttle, the router of a feature that is off, the
//!   JSON listener;
//! - [`auth`]: admin OIDC JWTs against the policy issuer's JWKS;
//! - [`token`]: shared-secret rules (ADR-0009 final amendment), digests, minting;
//! - [`policy`]: the policy served now.
//!
//! The features:
//! - [`capabilities`]: what this server serves, and the OpenAPI document;
//! - [`kill`]: kill and unkill, the kill state, the signed list for gateways and
//!   devices (the kill log is halo-killswitch's);
//! - [`fleet`]: enrollment tokens, enrollment, rings, reports, devices;
//! - [`evidence`]: the OTLP evidence receivers per trust zone and the samples API;
//! - [`budget`]: the budget service (Envoy's rate-limit service) and its status API;
//! - [`shadow`]: the mirror service (`--shadow-listen`, `POST /mirror`), with [`sigv4`]
//!   for Bedrock jobs;
//! - [`controller`]: halo-controller's loop on this server's ports, its status API;
//! - [`xds`]: the xDS host (`--xds-listen`) and `/xds/status`;
//! - [`console`]: the admin console, a view over kill, fleet and the controller.
//!
//! [`config`] resolves flags > `HALO_SERVER_<FLAG>` env > `--config` YAML > defaults into
//! each feature's settings.

pub mod auth;
pub mod budget;
pub mod capabilities;
pub mod config;
pub mod console;
pub mod controller;
pub mod evidence;
pub mod fleet;
pub mod http;
pub mod kill;
pub mod policy;
pub mod server;
pub mod shadow;
pub mod sigv4;
pub mod token;
pub mod xds;

// Each feature's handlers against its own state, without starting the server.
#[cfg(test)]
mod tests;
