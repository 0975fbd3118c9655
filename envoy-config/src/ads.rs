//! envoy/ads.yaml, the bootstrap of every Envoy driven over xDS by halo-server, compiled
//! in, with the three values it marks filled in: the node id, the admin address and the
//! ADS server's address. One function for everyone who boots such an Envoy (the xDS live
//! suites, halo-demo, and the gateway `halo istio render` / `halo envoy-gateway render`
//! deploy into a cluster), so the bootstrap a cluster gets is, by construction, the one
//! the live suites run.

/// envoy/ads.yaml as committed.
pub const ADS_YAML: &str = include_str!("../../envoy/ads.yaml");

/// The values envoy/ads.yaml marks, as the file writes them (each occurs exactly once;
/// `tests::every_marked_value_occurs_once` keeps it so).
const NODE_ID: &str = "id: halo-gateway";
const ADMIN: &str = "socket_address: { address: 127.0.0.1, port_value: 9901 }";
const ADS: &str = "socket_address: { address: 127.0.0.1, port_value: 18000 }";
const STATIC_CLUSTER: &str = "type: STATIC";

/// Where one Envoy's bootstrap points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdsBootstrap {
    /// The node id halo-server keys snapshots by.
    pub node_id: String,
    /// Envoy's admin listener (`127.0.0.1` keeps it private to the host or pod).
    pub admin_address: String,
    pub admin_port: u16,
    /// halo-server's ADS address: an IP literal, or a DNS name (a Kubernetes Service).
    pub ads_host: String,
    pub ads_port: u16,
}

impl AdsBootstrap {
    /// The file's own values (node `halo-gateway`, admin 127.0.0.1:9901, ADS
    /// 127.0.0.1:18000) with another node id and ports: what a test on loopback needs.
    pub fn loopback(node_id: &str, ads_port: u16, admin_port: u16) -> AdsBootstrap {
        AdsBootstrap {
            node_id: node_id.to_string(),
            admin_address: "127.0.0.1".into(),
            admin_port,
            ads_host: "127.0.0.1".into(),
            ads_port,
        }
    }

    /// envoy/ads.yaml with these values. A DNS name for the ADS server turns the
    /// `halo-xds` cluster from STATIC (IP literals only) to STRICT_DNS; nothing else
    /// changes.
    pub fn render(&self) -> String {
        let mut yaml = ADS_YAML
            .replace(NODE_ID, &format!("id: {}", self.node_id))
            .replace(
                ADMIN,
                &format!(
                    "socket_address: {{ address: {}, port_value: {} }}",
                    self.admin_address, self.admin_port
                ),
            )
            .replace(
                ADS,
                &format!(
                    "socket_address: {{ address: {}, port_value: {} }}",
                    self.ads_host, self.ads_port
                ),
            );
        if self.ads_host.parse::<std::net::IpAddr>().is_err() {
            yaml = yaml.replace(STATIC_CLUSTER, "type: STRICT_DNS");
        }
        yaml
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_marked_value_occurs_once() {
        for marked in [NODE_ID, ADMIN, ADS, STATIC_CLUSTER] {
            assert_eq!(
                ADS_YAML.matches(marked).count(),
                1,
                "envoy/ads.yaml must write `{marked}` exactly once (AdsBootstrap fills it in)"
            );
        }
    }

    #[test]
    fn only_the_marked_values_change() {
        let same = AdsBootstrap::loopback("halo-gateway", 18000, 9901).render();
        assert_eq!(same, ADS_YAML);
        let named = AdsBootstrap {
            node_id: "halo-gateway".into(),
            admin_address: "0.0.0.0".into(),
            admin_port: 9901,
            ads_host: "halo-server.halos.svc.cluster.local".into(),
            ads_port: 18000,
        }
        .render();
        let changed: Vec<(&str, &str)> = ADS_YAML
            .lines()
            .zip(named.lines())
            .filter(|(a, b)| a != b)
            .collect();
        assert_eq!(changed.len(), 3, "{changed:?}");
        assert!(named.contains("type: STRICT_DNS"));
        assert!(named.contains("address: halo-server.halos.svc.cluster.local, port_value: 18000"));
    }
}
