//! Turning a snapshot into Prometheus metrics.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::model::{
    Component, FaultCode, FaultPathLock, Health, HealthSnapshot, KmsgCounters, SourceState,
};

/// Reads the latest snapshot on every scrape.
#[derive(Debug)]
pub struct SnapshotCollector {
    snapshots: watch::Receiver<Arc<HealthSnapshot>>,
    counters: Arc<KmsgCounters>,
}

impl SnapshotCollector {
    /// A collector over the core's snapshot channel; the kernel-log counters are read live
    /// at scrape time (the core publishes no snapshot for them, so an idle agent stays
    /// asleep).
    pub fn new(
        snapshots: watch::Receiver<Arc<HealthSnapshot>>,
        counters: Arc<KmsgCounters>,
    ) -> Self {
        Self {
            snapshots,
            counters,
        }
    }
}

/// Encode the registry in the Prometheus text format.
pub fn encode(registry: &Registry) -> Result<String, std::fmt::Error> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry)?;
    Ok(text)
}

fn gauge(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: i64) -> std::fmt::Result {
    let metric = ConstGauge::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

fn counter(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: u64,
) -> std::fmt::Result {
    let metric = ConstCounter::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

/// A labelled family from (labels, value) rows.
fn family<L: prometheus_client::encoding::EncodeLabelSet>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    metric_type: prometheus_client::metrics::MetricType,
    rows: &[(L, u64)],
) -> std::fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, None, metric_type)?;
    for (labels, value) in rows {
        match metric_type {
            prometheus_client::metrics::MetricType::Counter => {
                ConstCounter::new(*value).encode(family.encode_family(labels)?)?
            }
            _ => ConstGauge::new(i64::try_from(*value).unwrap_or(i64::MAX))
                .encode(family.encode_family(labels)?)?,
        }
    }
    Ok(())
}

/// Whether the fault path's pages are locked in memory, and how much is.
fn fault_path(encoder: &mut DescriptorEncoder, s: &HealthSnapshot) -> std::fmt::Result {
    let (state, locked_kib) = match &s.fault_path_lock {
        FaultPathLock::Kept { .. } => ("kept", 0),
        FaultPathLock::Watching => ("watching", 0),
        FaultPathLock::Locked { locked_kib, .. } => ("locked", *locked_kib),
        FaultPathLock::Refused { .. } => ("refused", 0),
    };
    let states = ["kept", "watching", "locked", "refused"]
        .map(|st| ([("state", st.to_string())], u64::from(st == state)));
    family(
        encoder,
        "gpu_agent_fault_path_lock",
        "1 for the fault path lock's state: kept (every page mapped, not handed back), watching (start-up pages handed back, the working set being found), locked, refused (the working set could not be locked, nothing handed back).",
        prometheus_client::metrics::MetricType::Gauge,
        &states,
    )?;
    gauge(
        encoder,
        "gpu_agent_fault_path_locked_bytes",
        "Bytes locked in memory for the fault path: the program's pages and its shared libraries' in use.",
        i64::try_from(locked_kib.saturating_mul(1024)).unwrap_or(i64::MAX),
    )
}

/// Per EFA device: each counter's rate and the link.
fn efa(encoder: &mut DescriptorEncoder, s: &HealthSnapshot) -> std::fmt::Result {
    use prometheus_client::metrics::MetricType::Gauge;
    let mut rates = encoder.encode_descriptor(
        "gpu_agent_efa_counter_rate_per_minute",
        "How much each EFA counter rose over the [efa] window, per minute.",
        None,
        Gauge,
    )?;
    for d in &s.efa {
        for (counter, rate) in &d.rates {
            let labels = [("device", d.name.clone()), ("counter", counter.clone())];
            ConstGauge::new(*rate).encode(rates.encode_family(&labels)?)?;
        }
    }
    let links: Vec<([(&'static str, String); 1], u64)> = s
        .efa
        .iter()
        .filter_map(|d| {
            d.link_up
                .map(|up| ([("device", d.name.clone())], u64::from(up)))
        })
        .collect();
    family(
        encoder,
        "gpu_agent_efa_link_up",
        "1 while the EFA device's network interface has carrier (devices with one only).",
        Gauge,
        &links,
    )
}

/// Per GPU with an NVLink fabric: its domain (cluster UUID, clique id) and state as labels,
/// so an operator sees which NVLink domain each node's GPUs are in.
fn fabric(encoder: &mut DescriptorEncoder, s: &HealthSnapshot) -> std::fmt::Result {
    let rows: Vec<([(&'static str, String); 4], u64)> = s
        .gpus
        .iter()
        .filter_map(|g| {
            let f = g.nvml.as_ref()?.fabric.as_ref()?;
            Some((
                [
                    ("gpu", g.index.to_string()),
                    ("cluster_uuid", f.cluster_uuid.clone()),
                    ("clique_id", f.clique_id.to_string()),
                    ("state", f.state.clone()),
                ],
                u64::from(f.health.is_none()),
            ))
        })
        .collect();
    family(
        encoder,
        "gpu_agent_gpu_fabric_info",
        "Per GPU with an NVLink fabric (GB200/GB300 NVL72): its cluster UUID, clique id and \
         registration state; 1 while the fabric's health fields report nothing wrong.",
        prometheus_client::metrics::MetricType::Gauge,
        &rows,
    )
}

/// Per fenced GPU: 1 for the effect of its DeviceTaintRules (`None`, `NoSchedule`,
/// `NoExecute`), 0 for the others; `failed` 1 where the server refused them. GPUs not fenced
/// have no series.
fn fenced(encoder: &mut DescriptorEncoder, s: &HealthSnapshot) -> std::fmt::Result {
    let mut rows: Vec<([(&'static str, String); 2], u64)> = Vec::new();
    for g in &s.gpus {
        let Some(f) = &g.fence else {
            continue;
        };
        for effect in crate::model::TaintEffect::ALL {
            rows.push((
                [
                    ("gpu", g.index.to_string()),
                    ("effect", effect.name().into()),
                ],
                u64::from(f.failed.is_none() && f.effect == effect),
            ));
        }
        rows.push((
            [("gpu", g.index.to_string()), ("effect", "failed".into())],
            u64::from(f.failed.is_some()),
        ));
    }
    family(
        encoder,
        "gpu_agent_gpu_fenced",
        "Per GPU fenced on its own (a DRA DeviceTaintRule on it and its MIG devices): 1 for \
         its taint effect, or for failed where the API server refused the rules.",
        prometheus_client::metrics::MetricType::Gauge,
        &rows,
    )
}

/// Per-GPU NVML telemetry: ECC, remapped rows, NVLink, PCIe, utilisation.
fn telemetry(encoder: &mut DescriptorEncoder, s: &HealthSnapshot) -> std::fmt::Result {
    use prometheus_client::metrics::MetricType::{Counter, Gauge};
    type Rows = Vec<([(&'static str, String); 2], u64)>;
    let (mut ecc, mut remap, mut links, mut link_errors, mut gen, mut width, mut busy): (
        Rows,
        Rows,
        Rows,
        Rows,
        Rows,
        Rows,
        Rows,
    ) = Default::default();
    let (mut clock, mut power, mut replay, mut activity): (Rows, Rows, Rows, Rows) =
        Default::default();
    let mut mig_activity: Vec<([(&'static str, String); 3], u64)> = Vec::new();
    for g in &s.gpus {
        let Some(t) = g.nvml.as_ref().map(|n| &n.telemetry) else {
            continue;
        };
        let gpu = g.index.to_string();
        let row = |rows: &mut Rows, key: &'static str, kind: &str, value: Option<u64>| {
            if let Some(v) = value {
                rows.push(([("gpu", gpu.clone()), (key, kind.to_string())], v));
            }
        };
        row(&mut ecc, "counter", "volatile", t.ecc_uncorrected_volatile);
        row(
            &mut ecc,
            "counter",
            "aggregate",
            t.ecc_uncorrected_aggregate,
        );
        row(
            &mut remap,
            "kind",
            "correctable",
            t.remapped_rows_correctable.map(u64::from),
        );
        row(
            &mut remap,
            "kind",
            "uncorrectable",
            t.remapped_rows_uncorrectable.map(u64::from),
        );
        row(&mut links, "state", "up", t.nvlink_up.map(u64::from));
        row(&mut links, "state", "total", t.nvlink_total.map(u64::from));
        row(
            &mut link_errors,
            "counter",
            "replay",
            t.nvlink_replay_errors,
        );
        row(
            &mut link_errors,
            "counter",
            "recovery",
            t.nvlink_recovery_errors,
        );
        row(&mut link_errors, "counter", "crc", t.nvlink_crc_errors);
        row(&mut gen, "which", "current", t.pcie_gen.map(u64::from));
        row(&mut gen, "which", "max", t.pcie_gen_max.map(u64::from));
        row(&mut width, "which", "current", t.pcie_width.map(u64::from));
        row(&mut width, "which", "max", t.pcie_width_max.map(u64::from));
        // Pairs of readings, each labelled `which`.
        for (rows, pair) in [
            (
                &mut busy,
                [("gpu", t.utilization_gpu), ("memory", t.utilization_memory)],
            ),
            (
                &mut clock,
                [("current", t.sm_clock_mhz), ("max", t.sm_clock_max_mhz)],
            ),
            (
                &mut power,
                [
                    ("enforced", t.power_limit_mw),
                    ("default", t.power_limit_default_mw),
                ],
            ),
        ] {
            for (which, value) in pair {
                row(rows, "which", which, value.map(u64::from));
            }
        }
        row(
            &mut replay,
            "counter",
            "replay",
            t.pcie_replay_errors.map(u64::from),
        );
        for (which, value) in [
            ("sm", t.sm_active_percent),
            ("occupancy", t.sm_occupancy_percent),
            ("tensor", t.tensor_active_percent),
            ("dram", t.dram_bw_percent),
        ] {
            row(&mut activity, "which", which, value.map(u64::from));
        }
        for m in &t.mig_activity {
            for (which, value) in [
                ("sm", m.sm_active_percent),
                ("occupancy", m.sm_occupancy_percent),
                ("tensor", m.tensor_active_percent),
                ("dram", m.dram_bw_percent),
            ] {
                if let Some(v) = value {
                    let labels = [
                        ("gpu", gpu.clone()),
                        ("mig", m.uuid.clone()),
                        ("which", which.to_string()),
                    ];
                    mig_activity.push((labels, u64::from(v)));
                }
            }
        }
    }
    family(
        encoder,
        "gpu_agent_gpu_ecc_uncorrected_errors",
        "Uncorrectable ECC errors (volatile: since reset; aggregate: lifetime).",
        Gauge,
        &ecc,
    )?;
    family(
        encoder,
        "gpu_agent_gpu_remapped_rows",
        "Rows remapped, by cause.",
        Gauge,
        &remap,
    )?;
    family(
        encoder,
        "gpu_agent_gpu_nvlink_links",
        "NVLink links up, and links the GPU has.",
        Gauge,
        &links,
    )?;
    family(
        encoder,
        "gpu_agent_gpu_nvlink_errors",
        "NVLink error counters, all links.",
        Counter,
        &link_errors,
    )?;
    family(
        encoder,
        "gpu_agent_gpu_pcie_link_gen",
        "PCIe link generation, current and the highest this GPU and its slot allow.",
        Gauge,
        &gen,
    )?;
    family(
        encoder,
        "gpu_agent_gpu_pcie_link_width",
        "PCIe link width, current and the widest this GPU and its slot allow.",
        Gauge,
        &width,
    )?;
    family(
        encoder,
        "gpu_agent_gpu_utilization_percent",
        "Percent of NVML's last sample period a kernel ran on the GPU (which=gpu; a kernel \
         that waits counts too) and its memory was read or written (which=memory).",
        Gauge,
        &busy,
    )?;
    family(
        encoder,
        "gpu_agent_gpu_sm_clock_mhz",
        "The SM clock, now and its maximum, MHz.",
        Gauge,
        &clock,
    )?;
    family(
        encoder,
        "gpu_agent_gpu_power_limit_milliwatts",
        "The power limit the driver enforces, and the GPU's default one, mW.",
        Gauge,
        &power,
    )?;
    family(
        encoder,
        "gpu_agent_gpu_pcie_replay_errors",
        "PCIe link-level retransmissions since the driver loaded.",
        Counter,
        &replay,
    )?;
    family(
        encoder,
        "gpu_agent_gpu_activity_percent",
        "GPM (Hopper and later), over the last poll interval: SMs busy (which=sm), warps \
         resident (occupancy), any tensor pipe busy (tensor), DRAM bandwidth (dram); absent \
         where unknown.",
        Gauge,
        &activity,
    )?;
    family(
        encoder,
        "gpu_agent_mig_activity_percent",
        "In MIG mode, GPM's activity of each MIG device's GPU instance (mig: its UUID) over \
         the last poll interval, as gpu_agent_gpu_activity_percent; absent where unknown.",
        Gauge,
        &mig_activity,
    )
}

fn code_label(code: FaultCode) -> String {
    match code {
        FaultCode::Xid(c) => format!("xid-{c}"),
        FaultCode::Sxid(c) => format!("sxid-{c}"),
        other => other.slug().to_string(),
    }
}

impl Collector for SnapshotCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let s = Arc::clone(&self.snapshots.borrow());
        {
            let labels = [("version", s.version.as_str())];
            let metric = ConstGauge::new(1);
            let mut family = encoder.encode_descriptor(
                "gpu_agent_build_info",
                "Agent build information.",
                None,
                metric.metric_type(),
            )?;
            metric.encode(family.encode_family(&labels)?)?;
        }
        let health = match s.health {
            Health::Healthy => 0,
            Health::Warning => 1,
            Health::Fatal => 2,
        };
        gauge(
            &mut encoder,
            "gpu_agent_node_health",
            "Worst fault severity on the node: 0 healthy, 1 warning, 2 fatal.",
            health,
        )?;
        gauge(
            &mut encoder,
            "gpu_agent_gpus",
            "NVIDIA GPUs found on the PCI bus.",
            i64::try_from(s.gpus.len()).unwrap_or(i64::MAX),
        )?;
        if let Some(end) = &s.pending_end {
            let at = |t: std::time::SystemTime| {
                t.duration_since(std::time::SystemTime::UNIX_EPOCH)
                    .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
            };
            gauge(
                &mut encoder,
                "gpu_agent_instance_end_timestamp_seconds",
                "When the earliest known end of this instance is (Spot, maintenance, Capacity Block, shutdown), known or already pending.",
                at(end.deadline),
            )?;
            gauge(
                &mut encoder,
                "gpu_agent_instance_end_pending",
                "1 once that end is acted on (deadline - lead; at once for Spot and shutdown), else 0.",
                i64::from(end.due(std::time::SystemTime::now())),
            )?;
        }

        let fault_labels: Vec<[(&str, String); 5]> = s
            .faults
            .iter()
            .map(|f| {
                let gpu = match (f.component, f.gpu_index) {
                    (_, Some(i)) => i.to_string(),
                    (
                        Component::Gpu { pci }
                        | Component::Nvswitch { pci }
                        | Component::Efa { pci },
                        None,
                    ) => pci.to_string(),
                    (Component::Node, None) => "node".to_string(),
                };
                [
                    ("gpu", gpu),
                    (
                        "component",
                        match f.component {
                            Component::Gpu { .. } => "gpu",
                            Component::Nvswitch { .. } => "nvswitch",
                            Component::Efa { .. } => "efa",
                            Component::Node => "node",
                        }
                        .to_string(),
                    ),
                    ("code", code_label(f.code)),
                    ("severity", f.class.severity.to_string()),
                    ("action", f.class.action.to_string()),
                ]
            })
            .collect();
        {
            let mut family = encoder.encode_descriptor(
                "gpu_agent_fault_active",
                "A fault present in the health model (1), by GPU, code, severity and action.",
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            for labels in &fault_labels {
                ConstGauge::new(1i64).encode(family.encode_family(labels)?)?;
            }
        }
        {
            let mut family = encoder.encode_descriptor(
                "gpu_agent_fault_occurrences",
                "Times each fault in the health model was seen.",
                None,
                prometheus_client::metrics::MetricType::Counter,
            )?;
            for (labels, fault) in fault_labels.iter().zip(&s.faults) {
                ConstCounter::new(fault.count).encode(family.encode_family(labels)?)?;
            }
        }
        {
            let mut family = encoder.encode_descriptor(
                "gpu_agent_source_up",
                "Whether a source is running (1) or off, failed or ended (0).",
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            for src in &s.sources {
                let up = i64::from(matches!(src.state, SourceState::On));
                let labels = [("source", src.source.to_string())];
                ConstGauge::new(up).encode(family.encode_family(&labels)?)?;
            }
        }
        let kmsg = self.counters.stats();
        counter(
            &mut encoder,
            "gpu_agent_kmsg_records_read",
            "Kernel log records read.",
            kmsg.records_read,
        )?;
        counter(
            &mut encoder,
            "gpu_agent_kmsg_records_lost",
            "Kernel log records overwritten before they were read (overruns, or while the agent was stopped).",
            kmsg.records_lost,
        )?;
        counter(
            &mut encoder,
            "gpu_agent_kmsg_records_matched",
            "Kernel log records that were GPU or NVSwitch faults.",
            kmsg.records_matched,
        )?;
        counter(
            &mut encoder,
            "gpu_agent_kmsg_records_unparsed",
            "Kernel log records skipped because their header could not be parsed.",
            kmsg.records_unparsed,
        )?;
        counter(
            &mut encoder,
            "gpu_agent_kmsg_records_ignored",
            "Fault lines written by userspace (not the kernel, not a gpu-agent inject drill), ignored.",
            kmsg.records_ignored,
        )?;
        telemetry(&mut encoder, &s)?;
        fabric(&mut encoder, &s)?;
        fenced(&mut encoder, &s)?;
        fault_path(&mut encoder, &s)?;
        efa(&mut encoder, &s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::HealthModel;
    use crate::model::{KmsgStats, Observation, SourceKind};

    #[test]
    fn renders_faults_and_counters() {
        let mut model = HealthModel::for_test();
        let report = crate::sources::kmsg::report(
            "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.",
            Some(3),
            std::time::SystemTime::now(),
            crate::catalog::DriverBranch::Unknown,
        )
        .expect("fault");
        model.apply(Observation::Fault(report));
        model.apply(Observation::Source(SourceKind::Kmsg, SourceState::On));
        let stats = KmsgStats {
            records_read: 10,
            records_lost: 2,
            records_matched: 1,
            records_unparsed: 3,
            records_ignored: 4,
        };
        let (_tx, rx) = watch::channel(Arc::new(model.snapshot(stats)));
        let counters = Arc::new(KmsgCounters::default());
        for (counter, value) in [
            (&counters.read, 10),
            (&counters.lost, 2),
            (&counters.matched, 1),
            (&counters.unparsed, 3),
            (&counters.ignored, 4),
        ] {
            counter.store(value, std::sync::atomic::Ordering::Relaxed);
        }
        let mut registry = Registry::default();
        registry.register_collector(Box::new(SnapshotCollector::new(rx, counters)));
        let text = encode(&registry).expect("encode");
        assert!(text.contains("gpu_agent_node_health 2"), "{text}");
        assert!(text.contains(r#"gpu_agent_fault_active{gpu="0000:3b:00.0",component="gpu",code="xid-79",severity="fatal",action="reboot"} 1"#), "{text}");
        assert!(
            text.contains("gpu_agent_kmsg_records_lost_total 2")
                && text.contains("gpu_agent_kmsg_records_unparsed_total 3")
                && text.contains("gpu_agent_kmsg_records_ignored_total 4"),
            "{text}"
        );
        assert!(
            text.contains(r#"gpu_agent_source_up{source="kmsg"} 1"#),
            "{text}"
        );
        assert!(text.contains(r#"gpu_agent_build_info{version=""#), "{text}");
    }
}
