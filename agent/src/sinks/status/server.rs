//! The daemon side of the status socket.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::watch;

use super::{Request, Response};
use crate::core::CoreHandle;
use crate::host::listen::{Limits, Listener};
use crate::model::{HealthSnapshot, KmsgCounters};
use crate::shutdown::Shutdown;

/// Where `status` learns which pod holds each GPU (the pod-resources lookup); `None`: off.
#[cfg(feature = "clients")]
pub type Holders = Option<crate::sinks::pod_resources::Lookup>;
/// Where `status` learns which pod holds each GPU: not built in without `clients`.
#[cfg(not(feature = "clients"))]
pub type Holders = Option<NoLookup>;

/// The pod-resources lookup of a build without `clients`: there is none.
#[cfg(not(feature = "clients"))]
#[derive(Debug, Clone)]
pub enum NoLookup {}

/// The snapshot with each GPU's holders filled in, where the lookup is on.
#[cfg(feature = "clients")]
async fn with_holders(holders: &Holders, mut snapshot: HealthSnapshot) -> HealthSnapshot {
    if let Some(lookup) = holders {
        crate::sinks::pod_resources::fill(lookup, &mut snapshot).await;
    }
    snapshot
}

/// The snapshot as it is (no lookup in this build).
#[cfg(not(feature = "clients"))]
async fn with_holders(_holders: &Holders, snapshot: HealthSnapshot) -> HealthSnapshot {
    snapshot
}

/// Clients served at once (more wait in the backlog), each for at most 2 s: it must send
/// its request and take the answer within that.
const LIMITS: Limits = Limits {
    clients: 32,
    lifetime: Duration::from_secs(2),
    when_full: crate::host::listen::WhenFull::TurnAway,
};
/// Longest request line accepted.
const MAX_REQUEST: u64 = 4096;

/// Answer status requests until shutdown.
pub async fn serve(
    listener: Listener,
    snapshots: watch::Receiver<Arc<HealthSnapshot>>,
    core: CoreHandle,
    holders: Holders,
    counters: Arc<KmsgCounters>,
    shutdown: Shutdown,
) {
    let (listener, _remove) = listener.into_parts();
    crate::host::listen::serve(listener, LIMITS, "status", shutdown, move |stream| {
        answer(
            stream,
            snapshots.clone(),
            core.clone(),
            holders.clone(),
            Arc::clone(&counters),
        )
    })
    .await;
}

async fn answer(
    stream: UnixStream,
    snapshots: watch::Receiver<Arc<HealthSnapshot>>,
    core: CoreHandle,
    holders: Holders,
    counters: Arc<KmsgCounters>,
) {
    if let Err(e) = respond(stream, snapshots, core, holders, counters).await {
        tracing::debug!(error = %e, "Status client left.");
    }
}

/// Who may clear faults: root on the node itself. A container's root (the same uid 0 without
/// user namespaces) is refused, whatever it can reach.
fn may_clear(peer: Option<tokio::net::unix::UCred>) -> Result<(), String> {
    let peer = peer.ok_or("the caller's credentials are unknown")?;
    if peer.uid() != 0 {
        return Err("clearing faults needs root".into());
    }
    crate::host::peer::on_host(peer.pid()).map_err(|e| {
        format!("clearing faults needs root on the node itself, not in a container: {e}")
    })
}

async fn respond(
    stream: UnixStream,
    snapshots: watch::Receiver<Arc<HealthSnapshot>>,
    core: CoreHandle,
    holders: Holders,
    counters: Arc<KmsgCounters>,
) -> std::io::Result<()> {
    let peer = stream.peer_cred().ok();
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    BufReader::new(read.take(MAX_REQUEST))
        .read_line(&mut line)
        .await?;
    let response = match serde_json::from_str::<Request>(&line) {
        Ok(Request::Status) => {
            let mut current = snapshots.borrow().as_ref().clone();
            // Read live: the core publishes no snapshot just for these.
            current.kmsg = counters.stats();
            let snapshot = Box::new(with_holders(&holders, current).await);
            Response::Status { snapshot }
        }
        Ok(Request::Clear { selector }) => match may_clear(peer) {
            Err(message) => {
                tracing::warn!(reason = %message, "Refused to clear faults.");
                Response::Error { message }
            }
            Ok(()) => match core.clear(selector).await {
                Some(faults) => Response::Cleared { faults },
                None => Response::Error {
                    message: "the daemon is stopping".into(),
                },
            },
        },
        Err(e) => Response::Error {
            message: format!("bad request: {e}"),
        },
    };
    let mut bytes = serde_json::to_vec(&response).map_err(std::io::Error::other)?;
    bytes.push(b'\n');
    write.write_all(&bytes).await?;
    write.shutdown().await
}
