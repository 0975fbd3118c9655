//! halo-server: the Halos web API for admins and fleets, and the signed kill switch
//! (ADR-0009).
//!
//! Code map:
//! - [`config`]: flags > `HALO_SERVER_<FLAG>` env > `--config` YAML > defaults.
//! - [`server`]: startup (policy, keys, tokens, store) and the two listeners.
//! - [`api`]: routes, per-route authentication, JSON errors.
//! - [`killswitch`]: the kill log, kill state, signed list and its `watch` channel
//!   (what the xDS server subscribes to, to push kills).
//! - [`listener`]: the TCP listener that turns hyper's own bare refusals (400, 414, 431)
//!   into JSON, so every answer is JSON.
//! - [`auth`]: admin OIDC JWTs against the policy issuer's JWKS.
//! - [`fleet`]: enrollment tokens, device tokens, reports.
//! - [`token`]: shared-secret rules (ADR-0009 final amendment), digests, minting.
//! - [`throttle`]: per-address slowing and blocking of failed token attempts.
//! - [`controller`]: halo-controller's kill-switch port onto this server's switch.
//! - [`store`]: the append-only log trait and its file and memory implementations.
//! - [`metrics`]: Prometheus text for /metrics.
//! - [`evidence`]: the OTLP evidence receivers per trust zone, the evidence store and
//!   the samples query.
//! - [`shadow`]: the mirror service (`--shadow-listen`, `POST /mirror`): shadow jobs sent
//!   to the shadow variant's target, their answers recorded as evidence (source shadow).
//! - [`sigv4`]: the mirror's SigV4 signature for Bedrock jobs (the AWS SDK's signer, the
//!   environment's key pair).
//! - [`budget`]: the budget service (Envoy's rate-limit service), counts in the evidence
//!   store's database.

pub mod api;
pub mod auth;
pub mod budget;
pub mod config;
pub mod console;
pub mod controller;
pub mod evidence;
pub mod fleet;

pub mod listener;
pub mod metrics;
pub mod server;
pub mod shadow;
pub mod sigv4;

pub mod throttle;
pub mod token;
pub mod xds;
