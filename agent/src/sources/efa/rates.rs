//! Counters turned into rates: how much each counter rose over the last window, per minute.
//! A counter that goes down was reset (a driver reload, a device reset): its history starts
//! again from the new value, never a negative rate.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

/// One counter's readings within the window, oldest first.
type Samples = VecDeque<(Instant, u64)>;

/// The samples of every device's counters within the window (a device's name is copied
/// once, when it is first seen; a poll allocates nothing here).
#[derive(Debug)]
pub struct Rates {
    window: Duration,
    samples: BTreeMap<String, BTreeMap<&'static str, Samples>>,
}

impl Rates {
    /// Rates over `window`.
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            samples: BTreeMap::new(),
        }
    }

    /// Record `value` of `device`'s `counter` at `at`; returns the rise over the window,
    /// per minute of the window (the rise within the window is counted whole however
    /// young the history: a burst at start-up is not stretched into a small rate, nor a
    /// short history into a large one). `None` while there is no earlier sample to rise
    /// from (the first reading, the first after a reset or a gap longer than the window):
    /// unknown, not zero.
    pub fn observe(
        &mut self,
        device: &str,
        counter: &'static str,
        value: u64,
        at: Instant,
    ) -> Option<f64> {
        if !self.samples.contains_key(device) {
            self.samples.insert(device.to_string(), BTreeMap::new());
        }
        let samples = self.samples.get_mut(device)?.entry(counter).or_default();
        if samples.back().is_some_and(|(_, last)| value < *last) {
            samples.clear();
        }
        samples.push_back((at, value));
        while samples
            .front()
            .is_some_and(|(t, _)| at.duration_since(*t) > self.window)
            && samples.len() > 1
        {
            samples.pop_front();
        }
        if samples.len() < 2 {
            return None;
        }
        let oldest = samples.front().map_or(value, |(_, v)| *v);
        let minutes = self.window.as_secs_f64() / 60.0;
        Some(if minutes > 0.0 {
            value.saturating_sub(oldest) as f64 / minutes
        } else {
            0.0
        })
    }

    /// Forget devices no longer present.
    pub fn retain(&mut self, devices: &[&str]) {
        self.samples
            .retain(|device, _| devices.contains(&device.as_str()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rise_counts_over_the_window_and_a_reset_is_not_negative() {
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let mut r = Rates::new(Duration::from_secs(60));
        assert_eq!(r.observe("d", "rx_drops", 1_000, at(0)), None, "no history");
        assert_eq!(r.observe("d", "rx_drops", 1_030, at(5)), Some(30.0));
        assert_eq!(r.observe("d", "rx_drops", 1_060, at(30)), Some(60.0));
        assert_eq!(r.observe("d", "rx_drops", 1_060, at(60)), Some(60.0));
        // Past the window, the oldest samples go, the newest stays.
        assert_eq!(r.observe("d", "rx_drops", 1_060, at(100)), Some(0.0));
        // The driver reloaded: the counter starts from 0, with no history.
        assert_eq!(r.observe("d", "rx_drops", 3, at(105)), None);
        assert_eq!(r.observe("d", "rx_drops", 13, at(110)), Some(10.0));
        r.retain(&[]);
        assert_eq!(r.observe("d", "rx_drops", 500, at(115)), None, "forgotten");
    }
}
