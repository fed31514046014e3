//! PCI addresses: the join key between kernel-log faults, sysfs and NVML.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A PCI device address (`domain:bus:device.function`).
///
/// Kernel-log lines print it in several shapes (`PCI:0000:3b:00`, `0000:3b:00`,
/// `0000:3b:00.0`); NVML prints `00000000:3B:00.0`. All parse to the same value, and the
/// canonical form is sysfs's `0000:3b:00.0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PciAddress {
    /// PCI segment (domain).
    pub domain: u32,
    /// Bus number.
    pub bus: u8,
    /// Device number.
    pub device: u8,
    /// Function number; kernel-log lines omit it, which means function 0.
    pub function: u8,
}

/// Why a string is not a PCI address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a PCI address: {0:?} (expected DOMAIN:BUS:DEVICE[.FUNCTION], e.g. 0000:3b:00.0)")]
pub struct PciAddressError(pub String);

impl FromStr for PciAddress {
    type Err = PciAddressError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let err = || PciAddressError(text.to_string());
        let trimmed = text.trim();
        let body = trimmed.strip_prefix("PCI:").unwrap_or(trimmed);
        let (head, function) = match body.rsplit_once('.') {
            Some((head, func)) => (head, parse_hex(func, 1).ok_or_else(err)?),
            None => (body, 0),
        };
        let mut parts = head.split(':');
        let (domain, bus, device) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(d), Some(b), Some(v), None) => (d, b, v),
            (Some(b), Some(v), None, None) => ("0", b, v),
            _ => return Err(err()),
        };
        let domain = parse_hex(domain, 8).ok_or_else(err)?;
        let bus = parse_hex(bus, 2).ok_or_else(err)?;
        let device = parse_hex(device, 2).ok_or_else(err)?;
        if device > 0x1f || function > 7 {
            return Err(err());
        }
        Ok(Self {
            domain,
            bus: bus as u8,
            device: device as u8,
            function: function as u8,
        })
    }
}

fn parse_hex(text: &str, max_digits: usize) -> Option<u32> {
    if text.is_empty() || text.len() > max_digits || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(text, 16).ok()
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

impl Serialize for PciAddress {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PciAddress {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_shape_drivers_print() {
        let want = PciAddress {
            domain: 0,
            bus: 0x3b,
            device: 0,
            function: 0,
        };
        for text in [
            "PCI:0000:3b:00",
            "0000:3b:00",
            "0000:3b:00.0",
            "00000000:3B:00.0",
            "3b:00",
        ] {
            assert_eq!(text.parse::<PciAddress>(), Ok(want), "{text}");
        }
        assert_eq!(want.to_string(), "0000:3b:00.0");
    }

    #[test]
    fn keeps_domain_and_function() {
        let a: PciAddress = "PCI:0008:01:00.1".parse().expect("valid");
        assert_eq!((a.domain, a.bus, a.device, a.function), (8, 1, 0, 1));
    }

    #[test]
    fn rejects_junk() {
        for text in [
            "",
            "PCI:",
            "0000:3b",
            "zz:00:00",
            "0000:3b:00.9",
            "0000:3b:40",
            "0000:3b:00:00:00",
        ] {
            assert!(text.parse::<PciAddress>().is_err(), "{text}");
        }
    }
}
