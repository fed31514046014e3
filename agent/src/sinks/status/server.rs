//! The daemon side of the status socket.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{watch, Semaphore};

use super::{Request, Response};
use crate::core::CoreHandle;
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

/// Clients served at once; more wait briefly, then are turned away.
const MAX_CLIENTS: usize = 32;
/// A client must send its request and take the answer within this.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest request line accepted.
const MAX_REQUEST: u64 = 4096;

/// Why the socket could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The socket's directory could not be created.
    #[error("cannot create socket directory {path}: {source}")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Another daemon answers on the socket.
    #[error("socket {path} is in use by another running gpu-agent")]
    InUse {
        /// The socket.
        path: PathBuf,
    },
    /// Binding failed.
    #[error("cannot bind socket {path}: {source}")]
    Bind {
        /// The socket.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// A bound Unix socket (the status socket, the NVRx health-check socket), removed when
/// dropped.
#[derive(Debug)]
pub struct Listener {
    listener: UnixListener,
    path: RemoveOnDrop,
}

/// A socket path removed when dropped.
#[derive(Debug)]
pub struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

impl Listener {
    /// Bind `path`, replacing a stale socket left by a crashed daemon (but never one a live
    /// daemon answers on). The socket is mode 0660: root and the socket's group may ask.
    pub async fn bind(path: &Path) -> Result<Self, ServerError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| ServerError::CreateDir {
                path: dir.to_path_buf(),
                source,
            })?;
        }
        if path.exists() {
            if UnixStream::connect(path).await.is_ok() {
                return Err(ServerError::InUse {
                    path: path.to_path_buf(),
                });
            }
            let _ = std::fs::remove_file(path);
        }
        let bind_err = |source| ServerError::Bind {
            path: path.to_path_buf(),
            source,
        };
        let listener = UnixListener::bind(path).map_err(bind_err)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660)).map_err(bind_err)?;
        Ok(Self {
            listener,
            path: RemoveOnDrop(path.to_path_buf()),
        })
    }

    /// The listening socket, and the guard that removes its path.
    pub fn into_parts(self) -> (UnixListener, RemoveOnDrop) {
        (self.listener, self.path)
    }
}

/// Answer status requests until shutdown.
pub async fn serve(
    listener: Listener,
    snapshots: watch::Receiver<Arc<HealthSnapshot>>,
    core: CoreHandle,
    holders: Holders,
    counters: Arc<KmsgCounters>,
    mut shutdown: Shutdown,
) {
    let permits = Arc::new(Semaphore::new(MAX_CLIENTS));
    loop {
        let stream = tokio::select! {
            accepted = listener.listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "Status socket accept failed.");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = shutdown.wait() => return,
        };
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            // Flooded: drop the connection rather than queue without bound.
            drop(stream);
            continue;
        };
        let snapshots = snapshots.clone();
        let core = core.clone();
        let holders = holders.clone();
        let counters = Arc::clone(&counters);
        tokio::spawn(async move {
            let answer = answer(stream, snapshots, core, holders, counters);
            let _ = tokio::time::timeout(CLIENT_TIMEOUT, answer).await;
            drop(permit);
        });
    }
}

async fn answer(
    stream: UnixStream,
    snapshots: watch::Receiver<Arc<HealthSnapshot>>,
    core: CoreHandle,
    holders: Holders,
    counters: Arc<KmsgCounters>,
) -> std::io::Result<()> {
    let root = stream.peer_cred().is_ok_and(|c| c.uid() == 0);
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
        Ok(Request::Clear { .. }) if !root => Response::Error {
            message: "clearing faults needs root".into(),
        },
        Ok(Request::Clear { selector }) => match core.clear(selector).await {
            Some(faults) => Response::Cleared { faults },
            None => Response::Error {
                message: "the daemon is stopping".into(),
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
