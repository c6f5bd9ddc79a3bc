//! Addresses the egress proxy reaches only when the workflow listed them (or a name resolving to
//! them) exactly: this machine, the runner's networks and the cloud's metadata service are where a
//! prompt-injected agent would look first.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// What kind of special address `ip` is; `None` for an ordinary public one. An IPv6 address that
/// carries an IPv4 one (mapped, compatible, NAT64, 6to4) is judged by the IPv4 one.
pub fn special(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => special_v4(v4),
        IpAddr::V6(v6) => match embedded_v4(v6) {
            Some(v4) => special_v4(v4),
            None => special_v6(v6),
        },
    }
}

fn special_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = ip.octets();
    Some(match (a, b) {
        _ if ip.is_loopback() => "loopback",
        _ if ip.is_unspecified() || a == 0 => "unspecified",
        (169, 254) => "link-local (cloud metadata)",
        (10, _) | (192, 168) => "private",
        (172, 16..=31) => "private",
        (100, 64..=127) => "shared (carrier-grade NAT, cloud metadata)",
        (192, 0) if ip.octets()[2] == 0 => "reserved (IETF)",
        (198, 18 | 19) => "benchmarking",
        _ if ip.is_multicast() => "multicast",
        _ if a >= 240 => "reserved",
        _ => return None,
    })
}

fn special_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let first = ip.segments()[0];
    Some(match first {
        _ if ip.is_loopback() => "loopback",
        _ if ip.is_unspecified() => "unspecified",
        0xfe80..=0xfebf => "link-local",
        0xfec0..=0xfeff => "site-local",
        0xfc00..=0xfdff => "unique local (private, cloud metadata)",
        0xff00..=0xffff => "multicast",
        0x0100 if ip.segments()[1..4] == [0, 0, 0] => "discard",
        _ => return None,
    })
}

/// The IPv4 address inside an IPv4-mapped (`::ffff:a.b.c.d`), IPv4-compatible (`::a.b.c.d`),
/// NAT64 (`64:ff9b::/96`) or 6to4 (`2002::/16`) address.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let tail = || Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    match s {
        [0, 0, 0, 0, 0, 0xffff, _, _] => Some(tail()),
        [0, 0, 0, 0, 0, 0, hi, _] if hi != 0 => Some(tail()),
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(tail()),
        [0x2002, hi, lo, ..] => Some(Ipv4Addr::new(
            (hi >> 8) as u8,
            hi as u8,
            (lo >> 8) as u8,
            lo as u8,
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(s: &str) -> Option<&'static str> {
        special(s.parse().unwrap())
    }

    #[test]
    fn this_machine_the_runners_networks_and_metadata_are_special() {
        for ip in [
            "127.0.0.1",
            "127.9.9.9",
            "0.0.0.0",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.100.100.200",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fe80::1",
            "fd00:ec2::254",
            "fc00::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
            "2002:7f00:0001::",
            "::10.0.0.1",
        ] {
            assert!(kind(ip).is_some(), "{ip} must be special");
        }
        assert_eq!(kind("169.254.169.254"), Some("link-local (cloud metadata)"));
    }

    #[test]
    fn public_addresses_are_not() {
        for ip in [
            "1.1.1.1",
            "140.82.112.3",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
        ] {
            assert_eq!(kind(ip), None, "{ip}");
        }
    }
}
