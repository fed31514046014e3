//! The human-readable status table.

use std::fmt::Write;

use crate::model::{Component, FaultPathLock, Health, HealthSnapshot, SourceState};

/// The `Fault path:` line: whether what a fault runs is locked in memory.
fn fault_path(lock: &FaultPathLock) -> String {
    match lock {
        FaultPathLock::Kept { reason } => format!("every page of the program kept mapped ({reason})"),
        FaultPathLock::Watching => {
            "start-up pages handed back; watching which pages the agent uses before locking them".into()
        }
        FaultPathLock::Locked {
            locked_kib,
            grown_kib: 0,
        } => format!("{locked_kib} KiB of code and data locked in memory; the rest handed back"),
        FaultPathLock::Locked {
            locked_kib,
            grown_kib,
        } => format!(
            "{locked_kib} KiB of code and data locked in memory, {grown_kib} KiB of it added after code outside the first set ran; the rest handed back"
        ),
        FaultPathLock::Refused { reason } => format!(
            "NOT LOCKED ({reason}); nothing handed back, every page kept mapped but reclaimable"
        ),
    }
}

/// Render a snapshot as the table `gpu-agent status` and `check` print.
pub fn render(s: &HealthSnapshot) -> String {
    let mut out = String::new();
    let health = match s.health {
        Health::Healthy => "HEALTHY",
        Health::Warning => "WARNING",
        Health::Fatal => "FATAL",
    };
    let _ = writeln!(
        out,
        "gpu-agent {} on {} (node name from {}; boot {})",
        s.version, s.node_name, s.node_name_source, s.boot_id
    );
    let _ = writeln!(out, "Health: {health}: {}", s.summary);
    if let Some(end) = &s.pending_end {
        let left = end
            .deadline
            .duration_since(std::time::SystemTime::now())
            .map_or(0, |d| d.as_secs());
        let now = std::time::SystemTime::now();
        let acted = match (&end.covered_by, end.due(now)) {
            (Some(by), _) => format!(
                "covered by {by} (one ending, one signal); {} more signalled",
                end.signalled
            ),
            (None, true) => format!("{} processes signalled to checkpoint", end.signalled),
            (None, false) => format!(
                "checkpoint signal at {}",
                end.act_at
                    .map_or_else(String::new, crate::model::time::rfc3339)
            ),
        };
        let _ = writeln!(
            out,
            "Pending end: {} at {} (in {left} s), {acted}",
            end.kind,
            crate::model::time::rfc3339(end.deadline),
        );
        if let (Some(why), false) = (&end.lead_from, end.due(now)) {
            let _ = writeln!(out, "Checkpoint lead: {why}");
        }
        if !end.waiting_for.is_empty() {
            let pids: Vec<String> = end.waiting_for.iter().map(ToString::to_string).collect();
            let _ = writeln!(
                out,
                "Waiting for {} signalled processes to finish their checkpoint and exit: {}",
                pids.len(),
                pids.join(", ")
            );
        }
    }

    if !s.conditions.is_empty() {
        let written: Vec<String> = s
            .conditions
            .iter()
            .map(|c| format!("{}={} ({})", c.type_, c.status, c.reason))
            .collect();
        let _ = writeln!(out, "Node conditions: {}", written.join(", "));
    }
    let _ = writeln!(out, "Fault path: {}", fault_path(&s.fault_path_lock));
    for h in &s.held_idle {
        let gpus: Vec<String> = h.gpus.iter().map(|g| format!("GPU {g}")).collect();
        let how = if h.busy_without_tensor_work {
            "busy with no tensor work"
        } else {
            "none busy"
        };
        let _ = writeln!(
            out,
            "Held but not working: {}/{} holds {}, {how} since {}",
            h.namespace,
            h.pod,
            gpus.join(", "),
            crate::model::time::rfc3339(h.since)
        );
    }
    if let Some(f) = &s.fencing {
        let _ = writeln!(
            out,
            "Per-GPU fencing: DeviceTaintRule resource.k8s.io/{}, {} GPUs published by the DRA driver, {} fenced",
            f.api_version,
            f.gpus.len(),
            f.fences.iter().filter(|x| x.failed.is_none()).count()
        );
    }
    if let Some(driver) = &s.driver_version {
        let _ = writeln!(out, "NVIDIA driver {driver}");
    }
    let _ = writeln!(
        out,
        "\n{:<4} {:<14} {:<24} {:<8} {:<5} {:<11} FAULTS",
        "GPU", "BUS ID", "NAME", "HEALTH", "UTIL", "FENCE"
    );
    if s.gpus.is_empty() {
        let _ = writeln!(out, "(no NVIDIA GPUs on the PCI bus)");
    }
    for g in &s.gpus {
        let faults = if g.faults.is_empty() {
            "-".to_string()
        } else {
            g.faults.join(", ")
        };
        let name = g
            .nvml
            .as_ref()
            .and_then(|n| n.name.as_deref())
            .unwrap_or("-");
        // The fence's effect (`NoSchedule`), `failed`, or `-`: unfenced.
        let fence = g.fence.as_ref().map_or("-", |f| {
            if f.failed.is_some() {
                "failed"
            } else {
                f.effect.name()
            }
        });
        // NVML's utilisation over its last sample period, or `-`: unknown.
        let util = g
            .nvml
            .as_ref()
            .and_then(|n| n.telemetry.utilization_gpu)
            .map_or_else(|| "-".to_string(), |u| format!("{u}%"));
        let _ = writeln!(
            out,
            "{:<4} {:<14} {:<24} {:<8} {util:<5} {fence:<11} {faults}",
            g.index,
            g.pci.to_string(),
            name,
            health_word(g.health)
        );
        if let Some(f) = &g.fence {
            let _ = writeln!(
                out,
                "     fenced on its own: DeviceTaintRule {} {} on {}{}",
                crate::model::TAINT_KEY,
                f.effect,
                f.devices.join(", "),
                f.failed
                    .as_deref()
                    .map_or_else(String::new, |why| format!(" (not written: {why})"))
            );
        }
        if let Some(f) = g.nvml.as_ref().and_then(|n| n.fabric.as_ref()) {
            let _ = writeln!(
                out,
                "     NVLink fabric {}: cluster {} clique {}{}",
                f.state,
                f.cluster_uuid,
                f.clique_id,
                f.health
                    .as_deref()
                    .map_or_else(String::new, |h| format!(" ({h})"))
            );
        }
        if !g.holders.is_empty() {
            let who: Vec<String> = g.holders.iter().map(ToString::to_string).collect();
            let _ = writeln!(out, "     held by {}", who.join(", "));
        }
    }
    if let Some(view) = &s.holders {
        if let Some(why) = &view.unavailable {
            let _ = writeln!(out, "(which pod holds each GPU is unknown: {why})");
        }
        for why in &view.unresolved {
            let _ = writeln!(out, "(device ID not mapped to a GPU: {why})");
        }
        for c in &view.dra {
            let _ = writeln!(
                out,
                "(DRA: {}/{} ({}) holds {} from {}; DRA devices are not mapped to GPUs)",
                c.namespace, c.pod, c.container, c.device, c.driver
            );
        }
    }

    if !s.efa.is_empty() {
        let _ = writeln!(
            out,
            "\n{:<12} {:<14} {:<5} {:<6} GPUS SERVED",
            "EFA", "BUS ID", "NUMA", "LINK"
        );
    }
    for d in &s.efa {
        let link = match d.link_up {
            Some(true) => "up",
            Some(false) => "DOWN",
            None => "-",
        };
        let gpus: Vec<String> = d
            .gpus
            .iter()
            .map(|pci| {
                s.gpus
                    .iter()
                    .find(|g| g.pci == *pci)
                    .map_or_else(|| pci.to_string(), |g| g.index.to_string())
            })
            .collect();
        let _ = writeln!(
            out,
            "{:<12} {:<14} {:<5} {:<6} {}",
            d.name,
            d.pci.map_or_else(|| "-".to_string(), |p| p.to_string()),
            d.numa_node
                .map_or_else(|| "-".to_string(), |n| n.to_string()),
            link,
            if gpus.is_empty() {
                "-".to_string()
            } else {
                gpus.join(",")
            }
        );
        if !d.holders.is_empty() {
            let who: Vec<String> = d.holders.iter().map(ToString::to_string).collect();
            let _ = writeln!(out, "             held by {}", who.join(", "));
        }
    }
    if let Some(imex) = &s.imex {
        let _ = writeln!(
            out,
            "\nIMEX (multi-node NVLink): {} {}, {} channel device{}",
            imex.unit,
            imex.active_state,
            imex.channels,
            if imex.channels == 1 { "" } else { "s" }
        );
    }

    if !s.faults.is_empty() {
        let _ = writeln!(
            out,
            "\n{:<8} {:<22} {:<11} {:<12} {:>7}  {:<20} NAME",
            "SEVERITY", "WHERE", "CODE", "ACTION", "COUNT", "LAST SEEN"
        );
        for f in &s.faults {
            let place = match (f.component, f.gpu_index) {
                (Component::Gpu { pci }, Some(i)) => format!("GPU {i} {pci}"),
                (Component::Gpu { pci }, None) => format!("GPU {pci}"),
                (Component::Nvswitch { pci }, _) => format!("NVSwitch {pci}"),
                (Component::Efa { pci }, _) => format!("EFA {pci}"),
                (Component::Node, _) => "node".to_string(),
            };
            let _ = writeln!(
                out,
                "{:<8} {:<22} {:<11} {:<12} {:>7}  {:<20} {}",
                f.class.severity.to_string(),
                place,
                f.code.to_string(),
                f.class.action.to_string(),
                f.count,
                crate::model::time::rfc3339(f.last_seen),
                f.class.name
            );
            if let Some(why) = &f.escalated {
                let _ = writeln!(out, "         escalated to {}: {why}", f.class.action);
            }
        }
        if s.faults
            .iter()
            .any(|f| f.code.is_gpu_gone() && f.class.severity == crate::model::Severity::Fatal)
        {
            let _ = writeln!(out, "Whole node: {}.", crate::model::WHOLE_NODE);
        }
    }

    if !s.checkpoints.is_empty() {
        let _ = writeln!(out, "\nCHECKPOINTS");
        for c in &s.checkpoints {
            let _ = writeln!(out, "{}: {}", c.notice_id, checkpoint_words(c));
            for why in &c.not_signalled {
                let _ = writeln!(out, "  not signalled: {why}");
            }
        }
    }

    let _ = writeln!(out, "\nSOURCES");
    for src in &s.sources {
        let _ = writeln!(
            out,
            "{:<8} {}",
            src.source.to_string(),
            state_words(&src.state)
        );
    }
    if !s.sinks.is_empty() {
        let _ = writeln!(out, "\nSINKS");
        for sink in &s.sinks {
            let _ = writeln!(out, "{:<14} {}", sink.sink, state_words(&sink.state));
        }
    }
    let k = &s.kmsg;
    let _ = writeln!(
        out,
        "kernel log: {} records read, {} lost, {} matched, {} unparsed, {} userspace fault lines ignored",
        k.records_read, k.records_lost, k.records_matched, k.records_unparsed, k.records_ignored
    );
    out
}

/// `signalled 2 processes in 1 pod, 2 confirmed in 3.2 s`.
fn checkpoint_words(c: &crate::model::CheckpointReport) -> String {
    let plural = |n: u32, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    let mut words = format!("signalled {}", plural(c.signalled, "process", "processes"));
    if c.pods > 0 {
        words.push_str(&format!(" in {}", plural(c.pods, "pod", "pods")));
    }
    if let Some(by) = &c.covered_by {
        words.push_str(&format!(" (covered by {by}: one ending, one signal)"));
    }
    if c.signalled > 0 {
        words.push_str(&format!(", {} confirmed", c.confirmed));
        if let Some(ms) = c.confirmed_in_ms {
            words.push_str(&format!(" in {:.1} s", ms as f64 / 1000.0));
        } else if !c.unconfirmed.is_empty() {
            let pids: Vec<String> = c.unconfirmed.iter().map(ToString::to_string).collect();
            words.push_str(&format!(
                "; unconfirmed at the deadline: {}",
                pids.join(", ")
            ));
        } else {
            words.push_str(", waiting");
        }
    }
    if c.skipped > 0 {
        words.push_str(&format!(", {} not signalled", c.skipped));
    }
    words
}

fn state_words(state: &SourceState) -> String {
    match state {
        SourceState::Starting => "starting".to_string(),
        SourceState::On => "on".to_string(),
        SourceState::Ended => "ended".to_string(),
        SourceState::Off(reason) => format!("off: {reason}"),
        SourceState::Failed(reason) => format!("FAILED: {reason}"),
    }
}

fn health_word(h: Health) -> &'static str {
    match h {
        Health::Healthy => "healthy",
        Health::Warning => "warning",
        Health::Fatal => "fatal",
    }
}
