//! Admin authorization as a type: a handler that takes an [`Admin`] argument runs only
//! for a verified administrator (an OIDC JWT of the served policy's issuer whose groups
//! meet its `adminGroups`), checked before the body is read. A feature's state says where its
//! [`AdminAuth`] is ([`AdminState`]).

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};

use super::ApiError;
use crate::auth::{Admin, OidcVerifier};
use crate::policy::Policy;

/// What an admin check needs: the policy served now (its identity) and the verifier.
#[derive(Debug)]
pub struct AdminAuth {
    policy: Policy,
    oidc: OidcVerifier,
}

impl AdminAuth {
    pub fn new(policy: Policy, oidc: OidcVerifier) -> AdminAuth {
        AdminAuth { policy, oidc }
    }

    /// The administrator that `headers` authenticate.
    pub async fn verify(&self, headers: &HeaderMap) -> Result<Admin, ApiError> {
        let policy = self.policy.now();
        self.oidc
            .verify_admin(policy.org.root.identity.as_ref(), authorization(headers))
            .await
            .map_err(ApiError::from)
    }

    pub fn oidc(&self) -> &OidcVerifier {
        &self.oidc
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }
}

/// The `Authorization` header's value, if it is text.
pub fn authorization(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
}

/// A feature state whose handlers may take an [`Admin`].
pub trait AdminState: Send + Sync {
    fn admin_auth(&self) -> &AdminAuth;
}

impl<S: AdminState> FromRequestParts<Arc<S>> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<S>) -> Result<Admin, ApiError> {
        state.admin_auth().verify(&parts.headers).await
    }
}
