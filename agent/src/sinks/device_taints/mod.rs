//! The device-taints sink: one bad GPU fenced on its own, in Kubernetes' words. Where the
//! NVIDIA DRA driver publishes this node's GPUs (ResourceSlices of driver `gpu.nvidia.com`,
//! pool = this node) and the API server serves `DeviceTaintRule` (found by discovery:
//! `resource.k8s.io/v1`, else `v1beta2`), a fault confined to one GPU becomes a rule on
//! that GPU and its MIG devices; the node condition leaves it out only once the rule is on
//! the server at `NoSchedule` or stronger (see
//! [`crate::model::HealthSnapshot::fenced_instead`]): until then, and after any failure,
//! the node condition carries it.
//!
//! - **Owned by the Node**: each rule has the Node (name and uid) as its owner, so garbage
//!   collection removes it with the Node, and names the instance (label
//!   `gpu-agent.io/instance`, from the Node's `providerID`). EKS node names are recycled
//!   private IPs: a rule found under this name of another Node uid or instance is an
//!   earlier node's, and is deleted.
//! - **Read again every refresh**: this node's rules are listed every `refresh`; a rule
//!   deleted behind the agent's back while its GPU's fault stands is written again (and
//!   logged): the fault, not the rule, is the truth. An operator releases a GPU with
//!   `gpu-agent clear`, which ends the fault.
//!
//! - **The ladder** ([`ladder::wanted`]): a warning `None`, a fatal fault `NoSchedule`,
//!   `NoExecute` by config or once the fault's checkpoint has settled. A rule's effect
//!   never goes down while a fault of its GPU lasts (a later, milder Xid does not lower
//!   it, nor does a restart: a rule already on the server is read first).
//! - **Lifted only on evidence**: a rule goes when its GPU has no fault left (the
//!   driver's recovery action back to None, `clear`, a new boot) and NVML has enumerated
//!   the GPUs this run (before that, absence of a fault is no evidence).
//! - **Devices named by the driver**: the GPU's device is the one whose `uuid` attribute is
//!   the GPU's UUID; its MIG devices by `parentUUID`. A GPU the driver does not publish is
//!   never guessed at: the node condition carries it.
//! - **Off, with the reason, and the node condition as before**: no DeviceTaintRule API
//!   (looked for again every refresh), no ResourceSlice of the driver (a device-plugin
//!   node), turned off. A rule the server refuses (403 without the RBAC, 422 from the
//!   admission policy) marks that GPU's fence failed: the node condition carries its faults.

mod ladder;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

pub use ladder::{wanted, Want};

use super::kubernetes::dra::{NodeOwner, SliceDevice, StoredRule, DRIVER};
use super::kubernetes::{ApiError, DraApi, Link};
use crate::model::{
    Fencing, GpuFence, HealthSnapshot, Observation, SinkStatus, SourceState, TaintEffect,
};
use crate::shutdown::Shutdown;

/// The sink's name in `status`.
pub const SINK: &str = "device-taints";

const MIN_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The sink's fault path run once, with no request: the fences `snapshot` calls for, and a
/// rule and its patch for a made-up GPU at `NoExecute`, built and dropped
/// (`host::resident` locks what this maps). The bytes built.
pub fn rehearse(snapshot: &HealthSnapshot) -> usize {
    let owner = NodeOwner {
        name: snapshot.node_name.clone(),
        uid: "rehearsal".into(),
        instance: None,
    };
    let mut wanted = wanted(snapshot, false, None, std::time::SystemTime::now());
    wanted.insert(
        "GPU-rehearsal".into(),
        Want {
            effect: TaintEffect::NoExecute,
            reason: "NvidiaXID79Error".into(),
            faults: vec!["Xid 79 (reboot)".into()],
        },
    );
    wanted
        .iter()
        .map(|(uuid, want)| {
            ladder::rule("v1", &owner, "gpu-0", uuid, want.effect, want)
                .to_string()
                .len()
                + ladder::patch(&owner, uuid, want.effect, want)
                    .to_string()
                    .len()
        })
        .sum()
}

/// What the sink needs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// A fatal fault taints `NoExecute` at once.
    pub no_execute: bool,
    /// How often discovery and the driver's ResourceSlices are read again.
    pub refresh: Duration,
    /// A slow GPU (`gpu-slow`) is fenced `NoSchedule` once it has lasted this long;
    /// `None`: never (it stays a `None`-effect fence, visible only).
    pub slow_after: Option<Duration>,
}

/// A rule on the server, as this agent wrote or found it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Applied {
    uuid: String,
    device: String,
    effect: TaintEffect,
    value: String,
}

/// A GPU whose rules could not be written.
#[derive(Debug, Clone)]
struct Failed {
    want: Want,
    why: String,
}

struct Fencer {
    link: Link,
    settings: Settings,
    node: Option<String>,
    /// The version serving DeviceTaintRule; `None`: not found (or not looked for yet).
    version: Option<&'static str>,
    /// When discovery last ran.
    discovered_at: Option<Instant>,
    /// The driver's devices for this node, and when they were read.
    devices: Vec<SliceDevice>,
    devices_at: Option<Instant>,
    /// This node's Node object (its rules' owner); `None` until read.
    owner: Option<NodeOwner>,
    /// This agent's rules for this node, by name; `None` until read from the server.
    applied: Option<BTreeMap<String, Applied>>,
    /// When they were last read from the server (read again every refresh: a rule deleted
    /// behind the agent's back is written again).
    applied_at: Option<Instant>,
    /// GPUs (by UUID) whose rules the server refused in the last pass.
    failed: BTreeMap<String, Failed>,
}

/// Where the last pass left fencing.
enum Pass {
    /// Fencing runs (possibly with GPUs failed).
    On,
    /// Off, for this reason.
    Off(String),
}

impl Fencer {
    fn new(link: Link, settings: Settings) -> Self {
        Self {
            link,
            settings,
            node: None,
            version: None,
            discovered_at: None,
            devices: Vec::new(),
            devices_at: None,
            owner: None,
            applied: None,
            applied_at: None,
            failed: BTreeMap::new(),
        }
    }

    /// Is `rule`, found under this node's name, another Node's (one deleted and created
    /// again under the recycled name) or another instance's?
    fn of_another_node(rule: &StoredRule, owner: &NodeOwner) -> bool {
        rule.owner_uid.as_ref().is_some_and(|uid| *uid != owner.uid)
            || rule
                .instance
                .as_ref()
                .zip(owner.instance.as_ref())
                .is_some_and(|(theirs, ours)| theirs != ours)
    }

    /// Read this node's rules from the server again: a rule of an earlier Node or instance
    /// under this name is deleted (it fences a GPU of hardware gone), and one this agent
    /// wrote that is no longer there is noticed (and written again by the pass).
    async fn read_rules(
        &mut self,
        api: &DraApi,
        version: &str,
        owner: &NodeOwner,
        now: Instant,
    ) -> Result<(), ApiError> {
        let mut mine = Vec::new();
        for r in api.my_rules(version).await? {
            if Self::of_another_node(&r, owner) {
                api.delete(version, &r.name).await?;
                tracing::warn!(rule = %r.name, device = %r.device, owner_uid = ?r.owner_uid, instance = ?r.instance, "DeviceTaintRule of an earlier node under this name deleted.");
                continue;
            }
            mine.push(r);
        }
        let read: BTreeMap<String, Applied> = mine
            .into_iter()
            .map(|r| {
                let applied = Applied {
                    uuid: r
                        .annotations
                        .get(ladder::GPU_ANNOTATION)
                        .cloned()
                        .unwrap_or_default(),
                    device: r.device,
                    effect: TaintEffect::parse(&r.effect),
                    value: r.value,
                };
                (r.name, applied)
            })
            .collect();
        for (name, gone) in self
            .applied
            .iter()
            .flatten()
            .filter(|(name, _)| !read.contains_key(*name))
        {
            tracing::warn!(rule = %name, gpu = %gone.uuid, device = %gone.device, "A DeviceTaintRule of this agent was deleted on the server; the GPU's fault still stands, so it is written again.");
        }
        self.applied = Some(read);
        self.applied_at = Some(now);
        Ok(())
    }

    fn stale(&self, at: Option<Instant>, now: Instant) -> bool {
        at.is_none_or(|t| now.duration_since(t) >= self.settings.refresh)
    }

    /// Bring the rules in line with `snapshot`. A failure before a GPU's rules could be
    /// written (listing, discovery, connecting) marks every GPU that needs a rule and has none
    /// as failed: the node condition carries those until the rules are written.
    async fn sync(&mut self, snapshot: &HealthSnapshot) -> Result<Pass, ApiError> {
        let result = self.pass(snapshot).await;
        if let Err(e) = &result {
            for (uuid, want) in ladder::wanted(
                snapshot,
                self.settings.no_execute,
                self.settings.slow_after,
                std::time::SystemTime::now(),
            ) {
                let fenced = self
                    .applied
                    .iter()
                    .flat_map(BTreeMap::values)
                    .any(|a| a.uuid == uuid && a.effect >= want.effect);
                if !fenced {
                    self.failed.entry(uuid).or_insert_with(|| Failed {
                        want,
                        why: e.to_string(),
                    });
                }
            }
        }
        result
    }

    async fn pass(&mut self, snapshot: &HealthSnapshot) -> Result<Pass, ApiError> {
        let api = self.link.dra().await?;
        if self.node.as_deref() != Some(api.node()) {
            // First connection, or the node resolved anew: nothing is known of it.
            *self = Self::new(self.link.clone(), self.settings.clone());
            self.node = Some(api.node().to_string());
        }
        let now = Instant::now();
        if self.version.is_none() && self.stale(self.discovered_at, now) {
            self.version = api.discover().await?;
            self.discovered_at = Some(now);
            if let Some(version) = self.version {
                tracing::info!(api = %format!("resource.k8s.io/{version}"), "DeviceTaintRule served: per-GPU fencing is possible.");
            }
        }
        let Some(version) = self.version else {
            return Ok(Pass::Off(
                "the API server serves no DeviceTaintRule (resource.k8s.io v1, or v1beta2 with \
                 the DRADeviceTaintRules feature gate): the node condition carries every fault"
                    .into(),
            ));
        };
        if self.stale(self.devices_at, now) {
            match api.gpu_devices(version).await {
                Ok(devices) => {
                    self.devices = devices;
                    self.devices_at = Some(now);
                }
                Err(e) => {
                    if e.code() == Some(404) {
                        // The version went away (a downgrade): look again.
                        self.version = None;
                    }
                    return Err(e);
                }
            }
        }
        let owner = match &self.owner {
            Some(owner) => owner.clone(),
            None => {
                let owner = api.owner().await?;
                self.owner = Some(owner.clone());
                owner
            }
        };
        if self.applied.is_none() || self.stale(self.applied_at, now) {
            self.read_rules(&api, version, &owner, now).await?;
        }
        if self.devices.is_empty() && self.applied.as_ref().is_none_or(BTreeMap::is_empty) {
            return Ok(Pass::Off(format!(
                "no ResourceSlice of driver {DRIVER} for node {}: this node's GPUs are not \
                 published by the NVIDIA DRA driver (a device-plugin node); the node condition \
                 carries every fault",
                api.node()
            )));
        }
        let wants = ladder::wanted(
            snapshot,
            self.settings.no_execute,
            self.settings.slow_after,
            std::time::SystemTime::now(),
        );
        let mut first_error = None;
        let mut failed = BTreeMap::new();
        for (uuid, want) in &wants {
            let migs = snapshot
                .gpus
                .iter()
                .filter_map(|g| g.nvml.as_ref())
                .find(|n| n.uuid.as_deref() == Some(uuid.as_str()))
                .map(|n| n.mig_uuids.clone())
                .unwrap_or_default();
            let devices: Vec<String> = ladder::devices_of(uuid, &migs, &self.devices)
                .into_iter()
                .map(str::to_string)
                .collect();
            for device in devices {
                if let Err(e) = self.fence(&api, version, &owner, &device, uuid, want).await {
                    tracing::warn!(gpu = %uuid, %device, error = %e, "Cannot fence the GPU on its own; the node condition carries its faults.");
                    failed.insert(
                        uuid.clone(),
                        Failed {
                            want: want.clone(),
                            why: e.to_string(),
                        },
                    );
                    first_error.get_or_insert(e);
                    break;
                }
            }
        }
        self.failed = failed;
        // Lift the fences of GPUs with no fault left, once NVML has named this run's GPUs.
        if snapshot.gpus.iter().any(|g| g.nvml.is_some()) {
            let lift: Vec<String> = self
                .applied
                .iter()
                .flatten()
                .filter(|(_, a)| !wants.contains_key(&a.uuid))
                .map(|(name, _)| name.clone())
                .collect();
            for name in lift {
                match api.delete(version, &name).await {
                    Ok(()) => {
                        if let Some(gone) = self.applied.as_mut().and_then(|a| a.remove(&name)) {
                            tracing::info!(rule = %name, gpu = %gone.uuid, device = %gone.device, "Device fence lifted: the GPU's faults cleared.");
                        }
                    }
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(Pass::On),
        }
    }

    /// Write the rule fencing `device` of GPU `uuid` as `want` asks, never lowering the
    /// effect the server holds.
    async fn fence(
        &mut self,
        api: &DraApi,
        version: &str,
        owner: &NodeOwner,
        device: &str,
        uuid: &str,
        want: &Want,
    ) -> Result<(), ApiError> {
        let name = ladder::rule_name(&owner.name, device);
        let value = ladder::taint_value(&want.reason);
        let current = self.applied.as_ref().and_then(|a| a.get(&name)).cloned();
        let mut effect = current
            .as_ref()
            .map_or(want.effect, |a| a.effect.max(want.effect));
        if current
            .as_ref()
            .is_some_and(|a| a.effect == effect && a.value == value && a.uuid == uuid)
        {
            return Ok(());
        }
        let rule = |effect| ladder::rule(version, owner, device, uuid, effect, want);
        if current.is_some() {
            match api
                .patch(version, &name, &ladder::patch(owner, uuid, effect, want))
                .await
            {
                // Deleted behind our back: write it again.
                Err(e) if e.code() == Some(404) => api.create(version, &rule(effect)).await?,
                other => other?,
            }
        } else {
            match api.create(version, &rule(effect)).await {
                Err(e) if e.code() == Some(409) => {
                    // Already there (written before a restart): never lower what it holds.
                    let stored = api.get(version, &name).await?;
                    effect = effect.max(TaintEffect::parse(&stored.effect));
                    api.patch(version, &name, &ladder::patch(owner, uuid, effect, want))
                        .await?;
                }
                other => other?,
            }
        }
        tracing::warn!(rule = %name, gpu = %uuid, %device, effect = %effect, reason = %want.reason, "GPU fenced on its own (DeviceTaintRule).");
        self.applied.get_or_insert_with(BTreeMap::new).insert(
            name,
            Applied {
                uuid: uuid.to_string(),
                device: device.to_string(),
                effect,
                value,
            },
        );
        Ok(())
    }

    /// What fencing can do and does now, for the core (`None`: off).
    fn view(&self, on: bool) -> Option<Fencing> {
        let version = self.version.filter(|_| on)?;
        let gpus = self
            .devices
            .iter()
            .filter(|d| d.parent_uuid.is_none())
            .filter_map(|d| d.uuid.clone())
            .filter(|u| !u.starts_with("MIG-"))
            .collect();
        let mut fences: BTreeMap<String, GpuFence> = BTreeMap::new();
        for a in self.applied.iter().flat_map(BTreeMap::values) {
            let fence = fences.entry(a.uuid.clone()).or_insert_with(|| GpuFence {
                uuid: a.uuid.clone(),
                effect: a.effect,
                reason: a.value.clone(),
                devices: Vec::new(),
                failed: None,
            });
            fence.effect = fence.effect.max(a.effect);
            fence.devices.push(a.device.clone());
        }
        for (uuid, f) in &self.failed {
            let fence = fences.entry(uuid.clone()).or_insert_with(|| GpuFence {
                uuid: uuid.clone(),
                effect: f.want.effect,
                reason: f.want.reason.clone(),
                devices: Vec::new(),
                failed: None,
            });
            fence.failed = Some(f.why.clone());
        }
        Some(Fencing {
            api_version: version.to_string(),
            gpus,
            fences: fences.into_values().collect(),
        })
    }
}

/// Run until shutdown. Reports the sink's state and what fencing does to the core.
pub async fn run(
    settings: Settings,
    link: Link,
    mut snapshots: watch::Receiver<Arc<HealthSnapshot>>,
    status: mpsc::Sender<Observation>,
    mut shutdown: Shutdown,
) {
    let refresh = settings.refresh;
    let mut fencer = Fencer::new(link, settings);
    let mut due = Instant::now();
    // A change is written at once, but never sooner than the backoff after a failure.
    let mut not_before = Instant::now();
    let mut backoff = MIN_BACKOFF;
    let mut reported_state: Option<SourceState> = None;
    let mut reported_view: Option<Option<Fencing>> = None;
    loop {
        tokio::select! {
            changed = snapshots.changed() => {
                if changed.is_err() {
                    return;
                }
                due = due.min(not_before.max(Instant::now()));
            }
            () = tokio::time::sleep_until(due.into()) => {}
            () = shutdown.wait() => return,
        }
        let now = Instant::now();
        if due > now {
            continue;
        }
        let snapshot = Arc::clone(&snapshots.borrow_and_update());
        let result = fencer.sync(&snapshot).await;
        let (state, on) = match &result {
            Ok(Pass::On) => (SourceState::On, true),
            Ok(Pass::Off(why)) => (SourceState::Off(why.clone()), false),
            Err(ApiError::NotConfigured { .. }) => (
                SourceState::Off("no kubeconfig: standalone mode".into()),
                false,
            ),
            Err(e) => (SourceState::Failed(e.to_string()), fencer.version.is_some()),
        };
        let view = fencer.view(on);
        if reported_view.as_ref() != Some(&view) {
            let _ = status.send(Observation::Fencing(view.clone())).await;
            reported_view = Some(view);
        }
        if reported_state.as_ref() != Some(&state) {
            match &state {
                SourceState::Off(why) => {
                    tracing::info!(reason = %why, "Per-GPU fencing is off.");
                }
                SourceState::Failed(why) => {
                    tracing::warn!(error = %why, retry_in = ?backoff, "Per-GPU fencing failed; retrying.");
                }
                _ => tracing::info!("Per-GPU fencing is on."),
            }
            let _ = status
                .send(Observation::Sink(SinkStatus {
                    sink: SINK.into(),
                    state: state.clone(),
                }))
                .await;
            reported_state = Some(state);
        }
        match result {
            Ok(_) | Err(ApiError::NotConfigured { .. }) => {
                backoff = MIN_BACKOFF;
                due = now + refresh;
                not_before = now;
            }
            Err(e) => {
                fencer.link.after_error(&e);
                due = now + backoff;
                not_before = due;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}
