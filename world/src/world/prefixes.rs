//! Client prefixes: IPv4 /24s and IPv6 /48s handed out in order, skipping reserved space.

use std::net::{Ipv4Addr, Ipv6Addr};

use anyhow::{ensure, Result};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// Share of prefixes that are IPv6 /48s.
pub const V6_SHARE: f64 = 0.10;

/// IPv4 blocks never allocated to map units: private, loopback, link-local, CGNAT, benchmarking
/// (used for cluster addresses), documentation; everything from 224.0.0.0 on is skipped too.
pub(super) const V4_RESERVED: [(u32, u8); 11] = [
    (0x0A00_0000, 8),  // 10.0.0.0/8
    (0x6440_0000, 10), // 100.64.0.0/10
    (0x7F00_0000, 8),  // 127.0.0.0/8
    (0xA9FE_0000, 16), // 169.254.0.0/16
    (0xAC10_0000, 12), // 172.16.0.0/12
    (0xC000_0000, 24), // 192.0.0.0/24
    (0xC000_0200, 24), // 192.0.2.0/24
    (0xC0A8_0000, 16), // 192.168.0.0/16
    (0xC612_0000, 15), // 198.18.0.0/15
    (0xC633_6400, 24), // 198.51.100.0/24
    (0xCB00_7100, 24), // 203.0.113.0/24
];
/// 224.0.0.0: multicast and above.
pub(super) const V4_END: u32 = 0xE000_0000;

/// Hands out /24s and /48s in order.
pub(super) struct PrefixAllocator {
    /// Network address of the next /24 to consider.
    next_v4: u64,
    /// Index of the next /48 within 2a00::/12.
    next_v6: u64,
}

impl PrefixAllocator {
    pub(super) fn new() -> Self {
        PrefixAllocator {
            next_v4: 0x0100_0000, // 1.0.0.0
            next_v6: 0,
        }
    }

    pub(super) fn v4(&mut self) -> Result<IpNet> {
        loop {
            ensure!(
                self.next_v4 < u64::from(V4_END),
                "IPv4 unicast space exhausted: too many map units"
            );
            let addr = self.next_v4 as u32;
            let reserved = V4_RESERVED.iter().find(|&&(net, len)| {
                let mask = u32::MAX << (32 - u32::from(len));
                addr & mask == net
            });
            match reserved {
                Some(&(net, len)) => self.next_v4 = u64::from(net) + (1u64 << (32 - len)),
                None => {
                    self.next_v4 += 256;
                    return Ok(IpNet::V4(Ipv4Net::new(Ipv4Addr::from(addr), 24)?));
                }
            }
        }
    }

    pub(super) fn v6(&mut self) -> Result<IpNet> {
        ensure!(
            self.next_v6 < 1 << 36,
            "2a00::/12 exhausted: too many map units"
        );
        let addr = (0x2a00u128 << 112) | (u128::from(self.next_v6) << 80);
        self.next_v6 += 1;
        Ok(IpNet::V6(Ipv6Net::new(Ipv6Addr::from(addr), 48)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v4_allocator_skips_reserved() {
        let mut a = PrefixAllocator::new();
        a.next_v4 = 0x09FF_FF00; // 9.255.255.0
        assert_eq!(a.v4().unwrap().to_string(), "9.255.255.0/24");
        assert_eq!(a.v4().unwrap().to_string(), "11.0.0.0/24");
        a.next_v4 = 0xC611_FF00; // 198.17.255.0
        assert_eq!(a.v4().unwrap().to_string(), "198.17.255.0/24");
        assert_eq!(a.v4().unwrap().to_string(), "198.20.0.0/24");
        a.next_v4 = 0xDFFF_FF00;
        assert_eq!(a.v4().unwrap().to_string(), "223.255.255.0/24");
        assert!(a.v4().is_err());
        let mut b = PrefixAllocator::new();
        assert_eq!(b.v6().unwrap().to_string(), "2a00::/48");
        assert_eq!(b.v6().unwrap().to_string(), "2a00:0:1::/48");
    }
}
