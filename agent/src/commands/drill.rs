//! `gpu-agent drill checkpoint [--dry-run]`: list the checkpoint targets and why each is in
//! or out; without `--dry-run`, signal them as a real notice would, so a team can test its
//! handler.

use std::time::SystemTime;

use super::HostFacts;
use crate::config::Loaded;
use crate::model::{Notice, NoticeKind, SourceKind};
use crate::sinks::checkpoint;

/// Run the drill. Exit 0 (even with no targets: that is an answer).
pub fn checkpoint(loaded: &Loaded, dry_run: bool) -> anyhow::Result<u8> {
    let selection = HostFacts::checkpoint_selection(&loaded.config);
    let candidates = checkpoint::scan(&selection);
    println!(
        "{:<8} {:<16} {:<8} {:<38} WHY",
        "PID", "NAME", "SIGNAL", "POD"
    );
    for c in &candidates {
        println!(
            "{:<8} {:<16} {:<8} {:<38} {}",
            c.pid,
            c.name,
            c.signal.as_deref().unwrap_or("-"),
            c.pod_uid.as_deref().unwrap_or("-"),
            c.why
        );
    }
    if candidates.is_empty() {
        println!(
            "(no process holds a GPU device matching {} or opted in with {})",
            loaded.config.checkpoint.device_glob,
            checkpoint::OPT_IN_VAR
        );
    }
    if dry_run {
        return Ok(0);
    }
    let notice = Notice {
        id: format!("drill:{}", crate::model::time::rfc3339(SystemTime::now())),
        kind: NoticeKind::Shutdown,
        deadline: SystemTime::now(),
        detail: "gpu-agent drill checkpoint".into(),
        source: SourceKind::Logind,
    };
    let (signalled, skipped) = checkpoint::signal_targets(&selection, &notice, &[], None);
    println!(
        "\ndrill: {} signalled, {} skipped",
        signalled.len(),
        skipped.len()
    );
    Ok(0)
}
