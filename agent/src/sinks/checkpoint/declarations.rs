//! What the pods on this node declare (`gpu-agent.io/checkpoint-*` annotations), read from
//! the API server when a notice arrives, again while it waits and just before acting, each
//! read time-limited: a hung API server falls back to what was read last, or the defaults.

use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::declared::ByPod;
#[cfg(feature = "clients")]
use super::declared::{self, Declared};
use super::Settings;
use crate::model::Observation;

/// How long a read of the pods' declarations may take before the last one read (or the
/// defaults) is used: a hung API server never holds a signal long.
#[cfg(feature = "clients")]
pub(super) const DECLARATIONS_LIMIT: Duration = Duration::from_secs(2);
/// While a notice waits for its time, the declarations are read again this often (pods
/// come and go).
pub(super) const DECLARATIONS_WHILE_WAITING: Duration = Duration::from_secs(60);
/// Declarations older than this are read again right before acting.
pub(super) const DECLARATIONS_FOR_ACTING: Duration = Duration::from_secs(5);

/// What the pods on this node declare, as last read.
#[derive(Debug, Default)]
pub(super) struct Declarations {
    pub(super) by_pod: ByPod,
    /// The pods (UIDs) holding GPUs (every declaring pod, when the kubelet cannot say).
    pub(super) gpu_pods: Vec<String>,
    /// The longest lead among the pods holding GPUs (read from Kubernetes: unused in a
    /// build without the clients).
    #[cfg_attr(not(feature = "clients"), allow(dead_code))]
    pub(super) lead: Option<crate::model::DeclaredLead>,
    pub(super) read_at: Option<Instant>,
}

impl Declarations {
    /// Read them again if older than `max_age` (bounded; on failure the last read stays),
    /// and tell the core the declared lead when it changed.
    pub(super) async fn refresh(
        &mut self,
        settings: &Settings,
        max_age: Duration,
        reports: &mpsc::Sender<Observation>,
    ) {
        if self.read_at.is_some_and(|at| at.elapsed() < max_age) {
            return;
        }
        #[cfg(feature = "clients")]
        if let Some(link) = &settings.kubernetes {
            let read = tokio::time::timeout(
                DECLARATIONS_LIMIT,
                read_declarations(link, settings.pod_resources.as_ref()),
            )
            .await;
            match read {
                Ok(Ok((by_pod, gpu_pods, lead))) => {
                    for d in by_pod.values() {
                        for problem in &d.problems {
                            tracing::warn!(pod = %d.pod, %problem, "Pod annotation ignored; the default applies.");
                        }
                    }
                    self.by_pod = by_pod;
                    self.gpu_pods = gpu_pods;
                    if lead != self.lead {
                        let _ = reports.send(Observation::DeclaredLead(lead.clone())).await;
                        self.lead = lead;
                    }
                }
                Ok(Err(e)) => {
                    tracing::info!(error = %e, "Cannot read the pods' checkpoint declarations; using the last read.");
                }
                Err(_) => tracing::warn!(
                    limit = ?DECLARATIONS_LIMIT,
                    "The API server did not answer for the pods' checkpoint declarations in time; using the last read."
                ),
            }
        }
        #[cfg(not(feature = "clients"))]
        let _ = (settings, reports);
        self.read_at = Some(Instant::now());
    }
}

/// The declarations of the pods on this node, and the longest lead among those holding a
/// GPU (every pod's, when the kubelet cannot say which hold one).
#[cfg(feature = "clients")]
pub(super) async fn read_declarations(
    link: &crate::sinks::kubernetes::Link,
    lookup: Option<&crate::sinks::pod_resources::Lookup>,
) -> Result<(ByPod, Vec<String>, Option<crate::model::DeclaredLead>), String> {
    let api = link.api().await.map_err(|e| e.to_string())?;
    let pods = api.pods_on_node().await.map_err(|e| e.to_string())?;
    let holders: Option<Vec<(String, String)>> = match lookup {
        Some(lookup) => lookup.assignments().await.ok().map(|a| {
            a.devices
                .iter()
                .map(|d| (d.namespace.clone(), d.pod.clone()))
                .chain(a.dra.iter().map(|d| (d.namespace.clone(), d.pod.clone())))
                .collect()
        }),
        None => None,
    };
    let mut by_pod = ByPod::new();
    let mut gpu_pods = ByPod::new();
    for pod in pods {
        let name = format!("{}/{}", pod.namespace, pod.name);
        if let Some(d) = Declared::from_annotations(&name, &pod.annotations) {
            let holds = holders.as_ref().is_none_or(|h| {
                h.iter()
                    .any(|(ns, p)| *ns == pod.namespace && *p == pod.name)
            });
            if holds {
                gpu_pods.insert(pod.uid.clone(), d.clone());
            }
            by_pod.insert(pod.uid, d);
        }
    }
    let lead = declared::longest_lead(&gpu_pods)
        .map(|(lead, pod)| crate::model::DeclaredLead { lead, pod });
    Ok((by_pod, gpu_pods.into_keys().collect(), lead))
}
