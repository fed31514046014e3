//! `gpu-agent check`: a one-shot health check (this boot's kernel log and one NVML poll), no daemon needed
//! (launch-time preflight, Slurm `HealthCheckProgram`).

use super::{HostFacts, EXIT_UNREACHABLE};
use crate::config::Loaded;
use crate::model::{Observation, SourceKind, SourceState};
use crate::sources::{kmsg, nvml};

/// Read the kernel log once, classify, print, and exit 0 healthy / 1 unhealthy / 2 could not check.
pub fn check(loaded: &Loaded, json: bool) -> anyhow::Result<u8> {
    let config = &loaded.config;
    let host = HostFacts::read(config);
    let mut model = host.model(config);
    let counters = super::counters();
    let mut unreadable = false;
    if config.kmsg.enabled {
        let settings = host.kmsg_settings(config, None, crate::drill::Holder::Reader);
        match kmsg::read_snapshot(settings, std::sync::Arc::clone(&counters)) {
            Ok(reports) => {
                model.apply(Observation::Source(SourceKind::Kmsg, SourceState::On));
                for report in reports {
                    model.apply(Observation::Fault(report));
                }
            }
            Err(e) => {
                eprintln!("gpu-agent: {e}");
                unreadable = true;
                model.apply(Observation::Source(
                    SourceKind::Kmsg,
                    SourceState::Failed(e.to_string()),
                ));
            }
        }
    } else {
        model.apply(Observation::Source(
            SourceKind::Kmsg,
            SourceState::Off("disabled by [kmsg] enabled = false".into()),
        ));
    }
    if config.nvml.enabled {
        match nvml::load(&config.nvml.library) {
            Ok(lib) => {
                model.apply(Observation::Source(SourceKind::Nvml, SourceState::On));
                for observation in nvml::Poller::new(HostFacts::nvml_settings(config)).poll(&lib) {
                    model.apply(observation);
                }
            }
            Err(reason) => {
                model.apply(Observation::Source(
                    SourceKind::Nvml,
                    SourceState::Off(reason),
                ));
            }
        }
    } else {
        model.apply(Observation::Source(
            SourceKind::Nvml,
            SourceState::Off("disabled by [nvml] enabled = false".into()),
        ));
    }
    let snapshot = model.snapshot(counters.stats());
    super::print_snapshot(&snapshot, json)?;
    if unreadable {
        return Ok(EXIT_UNREACHABLE);
    }
    Ok(u8::try_from(snapshot.health.exit_code()).unwrap_or(1))
}
