//! Log setup: journald (structured fields) when running under systemd, stderr otherwise.

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

/// Install the global subscriber. `RUST_LOG` overrides `default_level`.
pub fn init(default_level: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    let registry = tracing_subscriber::registry().with(filter);
    // systemd sets JOURNAL_STREAM for services whose stderr goes to the journal.
    if std::env::var_os("JOURNAL_STREAM").is_some() {
        if let Ok(journald) = tracing_journald::layer() {
            registry
                .with(
                    journald
                        .with_syslog_identifier("gpu-agent".into())
                        // Fields as they are named (FAULT=, CODE=, SEVERITY=), not F_FAULT=:
                        // `journalctl -u gpu-agent CODE=xid-79` finds them.
                        .with_field_prefix(None),
                )
                .init();
            return;
        }
    }
    registry
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_target(false),
        )
        .init();
}

/// A subscriber that formats what the daemon's own would (at its level) and writes it
/// nowhere: the fault-path rehearsal (`commands::rehearse`) runs the formatting of its log
/// lines, so their code is among the pages locked, and logs nothing.
pub fn discarding() -> tracing::Dispatch {
    let level = tracing::level_filters::LevelFilter::current();
    tracing::Dispatch::new(
        tracing_subscriber::registry().with(level).with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::sink)
                .with_target(false),
        ),
    )
}
