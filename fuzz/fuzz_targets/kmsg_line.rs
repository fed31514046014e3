//! A kernel-log record, as /dev/kmsg hands it over: the record header parser (any facility),
//! the line parser and the report built from it (catalog lookup, NVLink5 decode for both
//! driver layouts, detail truncation).
#![no_main]

use gpu_agent::catalog::DriverBranch;
use gpu_agent::sources::kmsg;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let line = String::from_utf8_lossy(data);
    if let Ok(record) = kmsg::record::parse(&line) {
        let _ = kmsg::parse::parse(&record.message);
    }
    let _ = kmsg::parse::parse(&line);
    for branch in [
        DriverBranch::PreR575,
        DriverBranch::R575Plus,
        DriverBranch::Unknown,
    ] {
        if let Some(report) = kmsg::report(&line, Some(1), std::time::UNIX_EPOCH, branch) {
            // What the sinks do with it: a label, a reason, a detail within bounds.
            let _ = report.code.to_string();
            assert!(report.detail.len() <= 512 + 3, "detail not truncated");
        }
    }
});
