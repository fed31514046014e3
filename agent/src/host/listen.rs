//! The one policy every local server follows (the status socket, the NVRx health check and
//! the metrics endpoint), because their clients may be tenants: at most so many connections
//! at once, clients beyond the cap either wait in the kernel's listen backlog (a slot is
//! taken *before* `accept`) or are turned away at once, holding none of the agent's
//! descriptors either way, and each accepted connection is dropped when its lifetime ends,
//! whatever it is doing. With every server capped, a thousand idle clients
//! cannot starve the procfs scan of descriptors (and make the next notice signal nobody).
//! Also the Unix sockets themselves: binding (a stale socket replaced, a live daemon's never),
//! their mode, a private directory for the admin socket, and a group's access by ACL.

use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, UnixListener, UnixStream};
use tokio::sync::Semaphore;

use crate::shutdown::Shutdown;

/// How many clients a server serves at once and for how long each.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections served at once.
    pub clients: usize,
    /// A connection is closed this long after it was accepted.
    pub lifetime: Duration,
    /// What a client beyond `clients` gets.
    pub when_full: WhenFull,
}

/// What a client gets while every slot is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenFull {
    /// It waits in the listen backlog until a slot frees (NVRx: a refused health check
    /// would count as a pass; metrics: the scraper waits).
    Wait,
    /// It is accepted and closed at once (the status socket: `gpu-agent status` asks again,
    /// and gets in between a flood's clients instead of behind all of them).
    TurnAway,
}

/// A listener whose connections [`serve`] accepts.
pub trait Accept: Send + 'static {
    /// One accepted connection.
    type Stream: Send + 'static;
    /// The next connection.
    fn next(&self) -> impl Future<Output = std::io::Result<Self::Stream>> + Send;
}

impl Accept for UnixListener {
    type Stream = UnixStream;
    async fn next(&self) -> std::io::Result<UnixStream> {
        self.accept().await.map(|(stream, _)| stream)
    }
}

impl Accept for TcpListener {
    type Stream = tokio::net::TcpStream;
    async fn next(&self) -> std::io::Result<tokio::net::TcpStream> {
        self.accept().await.map(|(stream, _)| stream)
    }
}

/// Accept connections on `listener` within `limits` until shutdown, each handled by a task
/// from `handle`; `server` names the server in the journal.
pub async fn serve<L, F, Fut>(
    listener: L,
    limits: Limits,
    server: &'static str,
    mut shutdown: Shutdown,
    mut handle: F,
) where
    L: Accept,
    F: FnMut(L::Stream) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let permits = Arc::new(Semaphore::new(limits.clients));
    loop {
        let waited = if limits.when_full == WhenFull::Wait {
            tokio::select! {
                permit = Arc::clone(&permits).acquire_owned() => match permit {
                    Ok(permit) => Some(permit),
                    Err(_) => return,
                },
                () = shutdown.wait() => return,
            }
        } else {
            None
        };
        let stream = tokio::select! {
            accepted = listener.next() => match accepted {
                Ok(stream) => stream,
                Err(e) => {
                    tracing::warn!(server, error = %e, "Accepting a connection failed.");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = shutdown.wait() => return,
        };
        let Some(permit) = waited.or_else(|| Arc::clone(&permits).try_acquire_owned().ok()) else {
            drop(stream);
            continue;
        };
        let task = handle(stream);
        tokio::spawn(async move {
            let _ = tokio::time::timeout(limits.lifetime, task).await;
            drop(permit);
        });
    }
}

/// Who may reach a Unix socket's directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Directory {
    /// As it is (or made with the default mode): pods may share it (the NVRx socket).
    Shared,
    /// Mode 0750: the admin socket's, never shared with pods.
    Private,
}

/// Why a socket could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// The socket's directory could not be created or made private.
    #[error("cannot prepare socket directory {path}: {source}")]
    Dir {
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
    pub async fn bind(path: &Path, directory: Directory) -> Result<Self, BindError> {
        if let Some(dir) = path.parent() {
            let dir_err = |source| BindError::Dir {
                path: dir.to_path_buf(),
                source,
            };
            std::fs::create_dir_all(dir).map_err(dir_err)?;
            if directory == Directory::Private {
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o750))
                    .map_err(dir_err)?;
            }
        }
        if path.exists() {
            if UnixStream::connect(path).await.is_ok() {
                return Err(BindError::InUse {
                    path: path.to_path_buf(),
                });
            }
            let _ = std::fs::remove_file(path);
        }
        let bind_err = |source| BindError::Bind {
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

/// The `system.posix_acl_access` value (acl(5); the kernel's `posix_acl_xattr.h`) granting
/// group `gid` what the owner and owning group have (read and write), and others nothing.
/// Entries go in tag order: owner, owning group, the named group, mask, others.
fn group_acl(gid: u32) -> Vec<u8> {
    const VERSION: u32 = 2;
    const UNNAMED: u32 = u32::MAX;
    const RW: u16 = 6;
    let entries: [(u16, u16, u32); 5] = [
        (0x01, RW, UNNAMED), // ACL_USER_OBJ
        (0x04, RW, UNNAMED), // ACL_GROUP_OBJ
        (0x08, RW, gid),     // ACL_GROUP
        (0x10, RW, UNNAMED), // ACL_MASK
        (0x20, 0, UNNAMED),  // ACL_OTHER
    ];
    let mut value = VERSION.to_le_bytes().to_vec();
    for (tag, perm, id) in entries {
        value.extend(tag.to_le_bytes());
        value.extend(perm.to_le_bytes());
        value.extend(id.to_le_bytes());
    }
    value
}

/// Let group `gid` connect to the socket at `path` (read and write on it) by an access ACL.
/// Not `chown`: the packaged unit's system-call filter refuses it (`@privileged`), and the
/// agent's user is no member of the group; setting an ACL on one's own file needs neither.
pub fn grant_group(path: &Path, gid: u32) -> std::io::Result<()> {
    rustix::fs::lsetxattr(
        path,
        "system.posix_acl_access",
        &group_acl(gid),
        rustix::fs::XattrFlags::empty(),
    )
    .map_err(std::io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_group_acl_is_acl5_binary_in_tag_order() {
        let value = group_acl(1234);
        assert_eq!(value.len(), 4 + 5 * 8);
        assert_eq!(&value[..4], &[2, 0, 0, 0]);
        // The named group: tag 0x08, rw, gid 1234.
        assert_eq!(&value[4 + 16..4 + 24], &[8, 0, 6, 0, 0xd2, 0x04, 0, 0]);
    }

    #[tokio::test]
    async fn a_private_directory_is_0750_and_a_live_socket_is_never_replaced() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("admin/agent.sock");
        let first = Listener::bind(&path, Directory::Private)
            .await
            .expect("bind");
        let mode = std::fs::metadata(dir.path().join("admin"))
            .expect("dir")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o750);
        assert!(matches!(
            Listener::bind(&path, Directory::Private).await,
            Err(BindError::InUse { .. })
        ));
        drop(first);
        assert!(!path.exists(), "removed when dropped");
    }

    #[tokio::test]
    async fn clients_beyond_the_cap_wait_and_each_is_dropped_after_its_lifetime() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.sock");
        let (listener, _remove) = Listener::bind(&path, Directory::Shared)
            .await
            .expect("bind")
            .into_parts();
        let served = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = Arc::clone(&served);
        let limits = Limits {
            clients: 2,
            lifetime: Duration::from_millis(300),
            when_full: WhenFull::Wait,
        };
        let (trigger, shutdown) = crate::shutdown::channel();
        tokio::spawn(serve(listener, limits, "test", shutdown, move |s| {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move {
                // An idle client: the handler waits on it for ever.
                let _s = s;
                std::future::pending::<()>().await;
            }
        }));
        let mut clients = Vec::new();
        for _ in 0..5 {
            clients.push(UnixStream::connect(&path).await.expect("connect"));
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(served.load(std::sync::atomic::Ordering::SeqCst), 2);
        tokio::time::sleep(Duration::from_millis(900)).await;
        assert_eq!(served.load(std::sync::atomic::Ordering::SeqCst), 5);
        trigger.fire();
    }
}
