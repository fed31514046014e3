//! Linux cpulist strings (`0-3,96-99`), as sysfs prints them and the kubelet takes them.

use std::collections::BTreeSet;
use std::fmt;

/// A set of CPU ids.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CpuSet(pub BTreeSet<u32>);

/// Why a cpulist did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a cpulist: {0:?} (expected e.g. \"0-3,96-99\")")]
pub struct CpuListError(pub String);

impl CpuSet {
    /// Parse `0-3,8,10-11` (empty string: empty set).
    pub fn parse(text: &str) -> Result<Self, CpuListError> {
        let err = || CpuListError(text.to_string());
        let mut set = BTreeSet::new();
        for part in text.trim().split(',').filter(|p| !p.is_empty()) {
            let (lo, hi) = match part.split_once('-') {
                Some((lo, hi)) => (
                    lo.parse::<u32>().map_err(|_| err())?,
                    hi.parse::<u32>().map_err(|_| err())?,
                ),
                None => {
                    let v = part.parse::<u32>().map_err(|_| err())?;
                    (v, v)
                }
            };
            if lo > hi || hi - lo > 65_536 {
                return Err(err());
            }
            set.extend(lo..=hi);
        }
        Ok(Self(set))
    }

    /// Number of CPUs.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Empty?
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Contains `cpu`?
    pub fn contains(&self, cpu: u32) -> bool {
        self.0.contains(&cpu)
    }

    /// Every CPU of `self` is in `other`.
    pub fn is_subset(&self, other: &CpuSet) -> bool {
        self.0.is_subset(&other.0)
    }
}

impl FromIterator<u32> for CpuSet {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut iter = self.0.iter().copied().peekable();
        while let Some(start) = iter.next() {
            let mut end = start;
            while iter.peek() == Some(&(end + 1)) {
                end += 1;
                iter.next();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        for text in ["0-3,96-99", "0", "", "0,2,4", "1-2,5-7"] {
            assert_eq!(CpuSet::parse(text).expect("parses").to_string(), text);
        }
        assert_eq!(CpuSet::parse("0-1,2").expect("parses").to_string(), "0-2");
        assert!(CpuSet::parse("3-1").is_err());
        assert!(CpuSet::parse("a").is_err());
    }
}
