//! Decoding NVLink5 Xids 144-150 with NVIDIA's decode sheet.
//!
//! Line shape: `<Xid> <unit> <Fatal|Nonfatal> <XC> <injected> Link <n> (<intrInfo>
//! <errorStatus> <debug0> .. <debug4>)`. `intrInfo` is matched against the sheet's bit masks
//! for the driver branch (the masks moved in R575), `errorStatus` against the listed values.

use super::nvlink5_table::NVLINK5_RULES;
use super::{Bucket, Nvlink5Rule};

/// Which NVIDIA driver branch printed the line; the intrInfo layout changed in R575.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverBranch {
    /// Before R575.
    PreR575,
    /// R575 or later.
    R575Plus,
    /// Not known: try the R575 layout first, then the older one.
    Unknown,
}

impl DriverBranch {
    /// From the driver version string (`570.133.20`, `580.65.06`).
    pub fn from_version(version: &str) -> Self {
        match version
            .trim()
            .split('.')
            .next()
            .and_then(|m| m.parse::<u32>().ok())
        {
            Some(major) if major >= 575 => Self::R575Plus,
            Some(_) => Self::PreR575,
            None => Self::Unknown,
        }
    }
}

/// The decoded meaning of one NVLink5 line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Decoded {
    pub unit: &'static str,
    pub bucket: Bucket,
    pub fatal: bool,
}

/// The first two registers of the parenthesised hex list.
fn registers(text: &str) -> Option<(u32, u32)> {
    let open = text.rfind('(')?;
    let mut words = text[open + 1..]
        .split(|c: char| c.is_whitespace() || c == ')' || c == ',')
        .filter(|w| !w.is_empty())
        .map(|w| w.strip_prefix("0x").or_else(|| w.strip_prefix("0X")))
        .map(|w| w.and_then(|h| u32::from_str_radix(h, 16).ok()));
    Some((words.next()??, words.next()??))
}

pub(super) fn decode(xid: u32, text: &str, branch: DriverBranch) -> Option<Decoded> {
    let (intr, status) = registers(text)?;
    let layouts: &[bool] = match branch {
        DriverBranch::R575Plus => &[true],
        DriverBranch::PreR575 => &[false],
        DriverBranch::Unknown => &[true, false],
    };
    layouts.iter().find_map(|&v2| {
        NVLINK5_RULES
            .iter()
            .filter(|r| r.xid == xid)
            .find(|r| {
                let mask = if v2 { r.v2 } else { r.v1 };
                mask.is_some_and(|m| m.matches(intr))
                    && (r.error_status.is_empty() || r.error_status.contains(&status))
            })
            .map(|r| apply(r, intr, v2))
    })
}

fn apply(rule: &Nvlink5Rule, intr: u32, v2: bool) -> Decoded {
    let action2 = if v2 { rule.action2_v2 } else { rule.action2_v1 };
    let bucket = match (action2, rule.action2) {
        (Some(mask), Some(bucket)) if mask.matches(intr) => bucket,
        _ => rule.action,
    };
    Decoded {
        unit: rule.unit,
        bucket,
        fatal: rule.fatal || bucket == Bucket::ResetGpu,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_saw_mvb_by_error_status() {
        // V2 layout: subcode 1 in intrInfo[6:0].
        let d = decode(
            144,
            "SAW_MVB Nonfatal XC0 i0 Link 04 (0x00000001 0x00000001 0x0 0x0 0x0 0x0 0x0)",
            DriverBranch::R575Plus,
        )
        .expect("decodes");
        assert_eq!(
            (d.unit, d.bucket, d.fatal),
            ("SAW_MVB", Bucket::Ignore, false)
        );
        let d = decode(
            144,
            "SAW_MVB Fatal XC0 i0 Link 04 (0x00000001 0x00000002 0x0 0x0 0x0 0x0 0x0)",
            DriverBranch::R575Plus,
        )
        .expect("decodes");
        assert_eq!((d.bucket, d.fatal), (Bucket::ResetGpu, true));
    }

    #[test]
    fn undecodable_lines_are_none() {
        assert_eq!(
            decode(144, "no registers here", DriverBranch::Unknown),
            None
        );
        assert_eq!(decode(144, "(0xzz 0x1)", DriverBranch::Unknown), None);
        assert_eq!(decode(79, "(0x1 0x1)", DriverBranch::Unknown), None);
    }

    #[test]
    fn branch_from_version() {
        assert_eq!(
            DriverBranch::from_version("570.133.20"),
            DriverBranch::PreR575
        );
        assert_eq!(
            DriverBranch::from_version("580.65.06\n"),
            DriverBranch::R575Plus
        );
        assert_eq!(DriverBranch::from_version(""), DriverBranch::Unknown);
    }
}
