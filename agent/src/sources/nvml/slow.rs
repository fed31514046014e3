//! Slow but not broken: a GPU held back while it works drags every rank of a synchronous
//! job down to its speed. Judged only while the GPU is busy (utilisation at or over
//! [`Limits::busy_percent`]): an idle GPU clocks down and drops its PCIe generation to save
//! power, which is no fault. The evidence, each poll:
//!
//! | evidence | why |
//! |---|---|
//! | clock-event reasons hardware slowdown (0x8), software thermal (0x20), hardware thermal (0x40), power brake (0x80) | the GPU is told to slow down |
//! | the enforced power limit under the GPU's default | someone (or something) lowered it |
//! | the SM clock under [`Limits::clock_ratio`] of the median of the node's other busy GPUs in the same power state | this one is the straggler |
//! | the PCIe link under the best generation or width this GPU and its slot allow together | the link trained low |
//! | the PCIe replay counter rising | the link retransmits |
//!
//! The software power cap (0x4) is not evidence: a busy GPU at its power limit is a GPU doing
//! its work. Nor is a capped GPU's clock under uncapped peers' (a heavy kernel at its power
//! limit beside lighter work on the other GPUs, as on a node shared by several pods): clocks
//! are compared only among busy GPUs that are all capped (one job's ranks, where the
//! straggler is the one that reaches the cap at the lowest clock) or all not.
//!
//! Evidence on [`Limits::polls`] busy polls in a row makes the GPU `slow`: a warning on the
//! GPU (`gpu-slow`), never a node condition; the core clears it a window after the last poll
//! that saw it. Pure: readings in, verdicts out.

use std::collections::HashMap;

use super::probe::GpuReading;

/// When a GPU is judged, and how long its evidence must last.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Utilisation (percent) from which a GPU is busy, and judged.
    pub busy_percent: u32,
    /// Busy polls in a row with evidence before the GPU is slow.
    pub polls: u32,
    /// An SM clock under this share of the busy peers' median is evidence.
    pub clock_ratio: f64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            busy_percent: 80,
            polls: 3,
            clock_ratio: 0.8,
        }
    }
}

/// `nvmlClocksEventsReasonSwPowerCap`: the GPU is at its power limit, as a busy GPU is.
const SW_POWER_CAP: u64 = 0x04;

/// `nvmlClocksEventReasons` bits that mean the GPU is told to slow down, with their names.
const SLOW_BITS: [(u64, &str); 4] = [
    (0x08, "hardware slowdown"),
    (0x20, "software thermal slowdown"),
    (0x40, "hardware thermal slowdown"),
    (0x80, "power brake"),
];

/// Each GPU's streak of busy polls with evidence, and its PCIe replay count at the last
/// poll, by GPU key (UUID, else PCI address).
#[derive(Debug, Default)]
pub struct Slow {
    streak: HashMap<String, u32>,
    replays: HashMap<String, u32>,
}

impl Slow {
    /// Judge one poll: for each GPU in `readings` (in order), `Some(evidence)` once it is
    /// slow, else `None`.
    pub fn judge(&mut self, readings: &[GpuReading], limits: &Limits) -> Vec<Option<String>> {
        let busy = |r: &GpuReading| {
            r.utilization
                .as_ref()
                .is_ok_and(|u| u.0 >= limits.busy_percent)
        };
        // At its power limit (unknown where the reasons could not be read).
        let capped = |r: &GpuReading| {
            r.clock_events
                .as_ref()
                .ok()
                .map(|bits| bits & SW_POWER_CAP != 0)
        };
        let clocks: Vec<(usize, Option<bool>, u32)> = readings
            .iter()
            .enumerate()
            .filter(|(_, r)| busy(r))
            .filter_map(|(i, r)| r.sm_clock.as_ref().ok().map(|c| (i, capped(r), c.0)))
            .collect();
        readings
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let key = super::checks::gpu_key(r);
                let replays = r.pcie_replay.as_ref().ok().copied();
                let before = replays.and_then(|now| self.replays.insert(key.clone(), now));
                if !busy(r) {
                    self.streak.remove(&key);
                    return None;
                }
                let mut evidence = Vec::new();
                if let Ok(bits) = r.clock_events {
                    evidence.extend(
                        SLOW_BITS
                            .iter()
                            .filter(|(bit, _)| bits & bit != 0)
                            .map(|(_, name)| format!("clock events: {name}")),
                    );
                }
                if let Ok((enforced, default)) = r.power_limit {
                    if enforced < default {
                        evidence.push(format!(
                            "power limit {} W, under its default {} W",
                            enforced / 1000,
                            default / 1000
                        ));
                    }
                }
                let cap = capped(r);
                let peers: Vec<u32> = clocks
                    .iter()
                    .filter(|(j, peer_cap, _)| *j != i && *peer_cap == cap)
                    .map(|(_, _, c)| *c)
                    .collect();
                if let (Some(peer), Ok((clock, _))) = (median(peers), &r.sm_clock) {
                    if f64::from(*clock) < limits.clock_ratio * f64::from(peer) {
                        evidence.push(format!("SM clock {clock} MHz, the busy peers' {peer} MHz"));
                    }
                }
                if let Ok(p) = &r.pcie {
                    let best_gen = p.max_gen.unwrap_or(p.gen);
                    if p.gen < best_gen || p.width < p.max_width {
                        evidence.push(format!(
                            "PCIe Gen{} x{} of Gen{best_gen} x{}",
                            p.gen, p.width, p.max_width
                        ));
                    }
                }
                if let (Some(now), Some(before)) = (replays, before) {
                    if now > before {
                        evidence.push(format!("PCIe replays rising (+{})", now - before));
                    }
                }
                if evidence.is_empty() {
                    self.streak.remove(&key);
                    return None;
                }
                let streak = self.streak.entry(key).or_default();
                *streak = streak.saturating_add(1);
                (*streak >= limits.polls.max(1)).then(|| evidence.join("; "))
            })
            .collect()
    }
}

/// The median of `values` (the lower middle of an even count); `None` when empty.
fn median(mut values: Vec<u32>) -> Option<u32> {
    values.sort_unstable();
    values.get(values.len().saturating_sub(1) / 2).copied()
}

#[cfg(test)]
mod tests {
    use super::super::probe::{PcieLink, Unread};
    use super::*;

    /// Eight busy H100s at full clock and power limit, on a Gen5 x16 link.
    fn busy_node() -> Vec<GpuReading> {
        (0..8)
            .map(|i| {
                let mut r = GpuReading::unreachable_for_test(i, Unread::NotSupported);
                r.uuid = Ok(format!("GPU-{i}"));
                r.utilization = Ok((97, 40));
                r.sm_clock = Ok((1980, 1980));
                r.power_limit = Ok((700_000, 700_000));
                r.clock_events = Ok(0x4); // the software power cap: a GPU at work
                r.pcie = Ok(PcieLink {
                    gen: 5,
                    max_gen: Some(5),
                    width: 16,
                    max_width: 16,
                });
                r.pcie_replay = Ok(0);
                r
            })
            .collect()
    }

    const LIMITS: Limits = Limits {
        busy_percent: 80,
        polls: 3,
        clock_ratio: 0.8,
    };

    fn polls(slow: &mut Slow, node: &[GpuReading], n: usize) -> Vec<Option<String>> {
        let mut last = Vec::new();
        for _ in 0..n {
            last = slow.judge(node, &LIMITS);
        }
        last
    }

    #[test]
    fn a_busy_node_at_its_power_cap_is_not_slow() {
        let mut slow = Slow::default();
        assert!(polls(&mut slow, &busy_node(), 5)
            .iter()
            .all(Option::is_none));
    }

    #[test]
    fn the_power_brake_while_busy_is_slow_after_three_polls_and_an_idle_gpu_never() {
        let mut node = busy_node();
        node[3].clock_events = Ok(0x80);
        let mut slow = Slow::default();
        assert!(polls(&mut slow, &node, 2)[3].is_none(), "two polls");
        let verdict = slow.judge(&node, &LIMITS)[3].clone().expect("slow");
        assert!(verdict.contains("power brake"), "{verdict}");
        // The same GPU idle: no verdict, and the streak starts again.
        node[3].utilization = Ok((0, 0));
        node[3].sm_clock = Ok((345, 1980));
        node[3].pcie = Ok(PcieLink {
            gen: 1,
            max_gen: Some(5),
            width: 16,
            max_width: 16,
        });
        assert!(
            polls(&mut slow, &node, 5)[3].is_none(),
            "idle is never slow"
        );
        node[3].utilization = Ok((97, 40));
        node[3].sm_clock = Ok((1980, 1980));
        node[3].pcie = busy_node()[3].pcie.clone();
        assert!(slow.judge(&node, &LIMITS)[3].is_none(), "a new streak");
    }

    #[test]
    fn a_straggler_clock_a_lowered_limit_and_a_narrow_or_replaying_link() {
        let mut node = busy_node();
        node[1].sm_clock = Ok((1188, 1980)); // 60 % of its peers
        node[2].power_limit = Ok((400_000, 700_000));
        node[4].pcie = Ok(PcieLink {
            gen: 4,
            max_gen: Some(5),
            width: 16,
            max_width: 16,
        });
        node[5].sm_clock = Ok((1700, 1980)); // 86 %: within the ratio
        let mut slow = Slow::default();
        for replays in 1..=3 {
            node[6].pcie_replay = Ok(replays * 10);
            slow.judge(&node, &LIMITS);
        }
        node[6].pcie_replay = Ok(40);
        let verdicts = slow.judge(&node, &LIMITS);
        let said = |i: usize| verdicts[i].clone().unwrap_or_default();
        assert!(
            said(1).contains("SM clock 1188 MHz, the busy peers' 1980 MHz"),
            "{}",
            said(1)
        );
        assert!(
            said(2).contains("power limit 400 W, under its default 700 W"),
            "{}",
            said(2)
        );
        assert!(said(4).contains("PCIe Gen4 x16 of Gen5 x16"), "{}", said(4));
        assert!(said(6).contains("PCIe replays rising (+10)"), "{}", said(6));
        for i in [0, 3, 5, 7] {
            assert!(verdicts[i].is_none(), "GPU {i}: {:?}", verdicts[i]);
        }
    }

    #[test]
    fn a_gpu_at_its_power_cap_is_not_compared_with_uncapped_peers() {
        // GPU 0 runs a heavy kernel at its power limit; the others lighter work, uncapped.
        let mut node = busy_node();
        for r in node.iter_mut().skip(1) {
            r.clock_events = Ok(0);
        }
        node[0].sm_clock = Ok((1400, 1980)); // 71 % of its uncapped peers
        let mut slow = Slow::default();
        assert!(polls(&mut slow, &node, 5).iter().all(Option::is_none));
        // An uncapped GPU under its uncapped peers is held back by something else.
        node[2].sm_clock = Ok((1400, 1980));
        let verdicts = polls(&mut slow, &node, 3);
        assert!(
            verdicts[2]
                .as_deref()
                .is_some_and(|v| v.contains("SM clock 1400 MHz, the busy peers' 1980 MHz")),
            "{verdicts:?}"
        );
        assert!(verdicts[0].is_none(), "{verdicts:?}");
    }

    #[test]
    fn one_busy_gpu_alone_has_no_peers_to_be_compared_with() {
        let mut node = busy_node();
        for r in node.iter_mut().skip(1) {
            r.utilization = Ok((0, 0));
            r.sm_clock = Ok((345, 1980));
        }
        node[0].sm_clock = Ok((1200, 1980));
        let mut slow = Slow::default();
        assert!(polls(&mut slow, &node, 5).iter().all(Option::is_none));
        assert_eq!(median(vec![3, 1, 2, 4]), Some(2));
        assert_eq!(median(Vec::new()), None);
    }
}
