//! An IMDS answer body: the first byte picks the path (Spot instance-action, rebalance
//! recommendation, scheduled events), the rest is the body.
#![no_main]

use gpu_agent::sources::imds::notices;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((which, body)) = data.split_first() else {
        return;
    };
    let body = String::from_utf8_lossy(body);
    match which % 4 {
        0 => drop(notices::spot(&body)),
        1 => drop(notices::rebalance(&body)),
        2 => drop(notices::scheduled(&body)),
        _ => drop(notices::parse_imds_time(&body)),
    }
});
