//! The policy halo-server serves now: what its policy source last accepted. A handler
//! reads it once ([`Policy::now`]) and keeps that copy for the request, so an edit to the
//! policy dir reaches the next request and never half of one.

use std::sync::Arc;

use halo_xds::Served;
use tokio::sync::watch;

/// A reader of the served policy (cheap to clone: a `watch` receiver).
#[derive(Debug, Clone)]
pub struct Policy(watch::Receiver<Arc<Served>>);

impl Policy {
    pub fn new(served: watch::Receiver<Arc<Served>>) -> Policy {
        Policy(served)
    }

    /// The policy served at this moment.
    pub fn now(&self) -> Arc<Served> {
        Arc::clone(&self.0.borrow())
    }

    /// The receiver itself, for a part that follows changes (the controller, the budget
    /// service).
    pub fn receiver(&self) -> watch::Receiver<Arc<Served>> {
        self.0.clone()
    }
}
