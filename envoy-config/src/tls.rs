//! Upstream TLS: every https cluster (providers, the JWKS, the kill list) verifies the
//! server's certificate against a CA bundle and matches its subject alt name to the host
//! the URL names, in both modes. The decision ([`UpstreamTls::for_host`]) is made once,
//! in the gateway plan; the standalone bootstrap prints it as Envoy JSON
//! ([`UpstreamTls::transport_socket`]) and halo-xds's `envoy` module as protobuf, field
//! for field.
//!
//! Envoy has no "system trust store" of its own on Linux (its `system_root_certs` is not
//! implemented), so the store is a file: the distribution's CA bundle by default
//! ([`SYSTEM_CA_BUNDLES`]), or an operator's private CA (`--upstream-ca-file`,
//! `upstreamCaFile`). A certificate from any other CA, or for another name, fails the
//! handshake: nothing is sent, the client gets Envoy's 503 (`upstream connect error`), and
//! the cluster counts `ssl.fail_verify_error` / `ssl.fail_verify_san`.

use serde::Serialize;
use serde_json::{Value, json};

/// Where distributions keep the system CA bundle, in the order they are looked for:
/// - `/etc/ssl/certs/ca-certificates.crt`: Debian, Ubuntu, Alpine (`ca-certificates`), and
///   the official `envoyproxy/envoy` image (Ubuntu-based);
/// - `/etc/pki/tls/certs/ca-bundle.crt`: RHEL, Fedora, CentOS, Amazon Linux;
/// - `/etc/ssl/cert.pem`: Alpine without `ca-certificates` (LibreSSL's), macOS, the BSDs.
pub const SYSTEM_CA_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

/// The CA bundle when none is configured and none is found: Debian's path, which is also
/// the official Envoy image's.
pub const DEFAULT_UPSTREAM_CA_FILE: &str = SYSTEM_CA_BUNDLES[0];

/// The first of [`SYSTEM_CA_BUNDLES`] present on this host. The one function of this crate
/// that looks at the file system: `halo envoy bootstrap` runs on (or for) the Envoy host.
pub fn system_ca_bundle() -> Option<&'static str> {
    SYSTEM_CA_BUNDLES
        .iter()
        .copied()
        .find(|p| std::path::Path::new(p).is_file())
}

/// The name the server's certificate must carry: the URL's host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum San {
    /// A host name: a DNS SAN, also sent as SNI.
    Dns(String),
    /// An IP literal (a loopback or in-cluster service): an IP SAN, no SNI (RFC 6066
    /// forbids an address there).
    IpAddress(String),
}

/// How one https cluster verifies its server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamTls {
    /// SNI; `None` for an IP literal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sni: Option<String>,
    pub san: San,
    /// The CA bundle (PEM file, as Envoy sees it) the chain must lead to.
    pub trusted_ca: String,
    /// The one protocol offered by ALPN: [`ALPN`] (HTTP/1.1) but for a gRPC service
    /// ([`ALPN_H2`]), whose server may refuse a handshake that offers no h2.
    #[serde(skip_serializing_if = "is_http11")]
    pub alpn: String,
}

fn is_http11(alpn: &str) -> bool {
    alpn == ALPN
}

/// The ALPN the clusters offer: the sub-clusters speak HTTP/1.1 (the aggregate's protocol
/// options), so a server must not pick h2.
pub const ALPN: &str = "http/1.1";

/// The ALPN of an HTTP/2 (gRPC) service cluster: halo-server's evidence receiver.
pub const ALPN_H2: &str = "h2";

impl UpstreamTls {
    /// Verification of `host` (as parsed from the URL, brackets removed) against
    /// `trusted_ca`.
    pub fn for_host(host: &str, trusted_ca: &str) -> UpstreamTls {
        let is_ip = host.parse::<std::net::IpAddr>().is_ok();
        UpstreamTls {
            sni: (!is_ip).then(|| host.to_string()),
            san: if is_ip {
                San::IpAddress(host.to_string())
            } else {
                San::Dns(host.to_string())
            },
            trusted_ca: trusted_ca.to_string(),
            alpn: ALPN.to_string(),
        }
    }

    /// Envoy's SAN type name and the exact value.
    pub fn san_type_and_value(&self) -> (&'static str, &str) {
        match &self.san {
            San::Dns(h) => ("DNS", h),
            San::IpAddress(ip) => ("IP_ADDRESS", ip),
        }
    }

    /// The cluster's `transport_socket`, Envoy JSON.
    pub fn transport_socket(&self) -> Value {
        let (san_type, value) = self.san_type_and_value();
        let mut tls = json!({
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
            "common_tls_context": {
                "alpn_protocols": [self.alpn],
                "validation_context": {
                    "trusted_ca": {"filename": self.trusted_ca},
                    "match_typed_subject_alt_names": [{
                        "san_type": san_type,
                        "matcher": {"exact": value},
                    }],
                },
            },
        });
        if let Some(sni) = &self.sni {
            tls["sni"] = json!(sni);
        }
        json!({"name": "envoy.transport_sockets.tls", "typed_config": tls})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_name_is_sni_and_dns_san_an_ip_is_an_ip_san_without_sni() {
        let t = UpstreamTls::for_host("api.anthropic.com", "/ca.pem");
        let s = t.transport_socket();
        let tc = &s["typed_config"];
        assert_eq!(tc["sni"], "api.anthropic.com");
        let vc = &tc["common_tls_context"]["validation_context"];
        assert_eq!(vc["trusted_ca"]["filename"], "/ca.pem");
        assert_eq!(
            vc["match_typed_subject_alt_names"],
            json!([{"san_type": "DNS", "matcher": {"exact": "api.anthropic.com"}}])
        );
        let t = UpstreamTls::for_host("::1", "/ca.pem");
        let s = t.transport_socket();
        assert_eq!(s["typed_config"]["sni"], Value::Null);
        assert_eq!(
            s["typed_config"]["common_tls_context"]["validation_context"]["match_typed_subject_alt_names"]
                [0]["san_type"],
            "IP_ADDRESS"
        );
    }
}
