//! IP prefixes for trustedProxyCIDRs, and the peer address Envoy reports.

use std::net::IpAddr;

/// An IPv4 or IPv6 prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    bits: u8,
}

impl Cidr {
    /// `10.0.0.0/8`, `::1/128`, or a bare address (a /32 or /128).
    pub fn parse(text: &str) -> Option<Cidr> {
        let (addr, bits) = match text.split_once('/') {
            Some((a, b)) => (a.parse::<IpAddr>().ok()?, Some(b.parse::<u8>().ok()?)),
            None => (text.parse::<IpAddr>().ok()?, None),
        };
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let bits = bits.unwrap_or(max);
        (bits <= max).then_some(Cidr { addr, bits })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        // An IPv4-mapped IPv6 peer (dual-stack listener) is compared as IPv4.
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => prefix_eq(&net.octets(), &ip.octets(), self.bits),
            (IpAddr::V6(net), IpAddr::V6(ip)) => prefix_eq(&net.octets(), &ip.octets(), self.bits),
            _ => false,
        }
    }
}

fn prefix_eq(a: &[u8], b: &[u8], bits: u8) -> bool {
    let full = usize::from(bits / 8);
    let rest = bits % 8;
    if a[..full] != b[..full] {
        return false;
    }
    if rest == 0 {
        return true;
    }
    let mask = 0xffu8 << (8 - rest);
    (a[full] & mask) == (b[full] & mask)
}

/// The IP of Envoy's `source.address` property (`1.2.3.4:5678` or `[::1]:5678`).
pub fn peer_ip(address: &str) -> Option<IpAddr> {
    if let Ok(ip) = address.parse::<IpAddr>() {
        return Some(ip);
    }
    let host = match address.strip_prefix('[') {
        Some(v6) => v6.split(']').next()?,
        None => address.rsplit_once(':')?.0,
    };
    host.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes() {
        let c = Cidr::parse("10.1.0.0/16").unwrap();
        assert!(c.contains("10.1.200.3".parse().unwrap()));
        assert!(!c.contains("10.2.0.1".parse().unwrap()));
        assert!(
            Cidr::parse("127.0.0.1")
                .unwrap()
                .contains("127.0.0.1".parse().unwrap())
        );
        assert!(
            !Cidr::parse("127.0.0.1")
                .unwrap()
                .contains("127.0.0.2".parse().unwrap())
        );
        assert!(
            Cidr::parse("10.0.0.0/12")
                .unwrap()
                .contains("10.15.0.1".parse().unwrap())
        );
        assert!(
            !Cidr::parse("10.0.0.0/12")
                .unwrap()
                .contains("10.16.0.1".parse().unwrap())
        );
        assert!(
            Cidr::parse("::1/128")
                .unwrap()
                .contains("::1".parse().unwrap())
        );
        assert!(
            Cidr::parse("127.0.0.0/8")
                .unwrap()
                .contains("::ffff:127.0.0.9".parse().unwrap())
        );
        assert!(Cidr::parse("10.0.0.0/33").is_none());
        assert!(Cidr::parse("nonsense").is_none());
    }

    #[test]
    fn peer_addresses() {
        assert_eq!(
            peer_ip("127.0.0.1:5000"),
            Some("127.0.0.1".parse().unwrap())
        );
        assert_eq!(peer_ip("[::1]:5000"), Some("::1".parse().unwrap()));
        assert_eq!(peer_ip("garbage"), None);
    }
}
