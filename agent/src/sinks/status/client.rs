//! The `gpu-agent status` side of the status socket.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use super::{Request, Response};

const TIMEOUT: Duration = Duration::from_secs(5);

/// Why the daemon could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing listens on the socket (daemon not running, or a different socket path).
    #[error("cannot reach the gpu-agent daemon at {path}: {source} (is `gpu-agent run` running?)")]
    Connect {
        /// The socket.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The conversation failed midway.
    #[error("status socket {path}: {reason}")]
    Exchange {
        /// The socket.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
}

/// How long to wait before asking again when the daemon turned the connection away.
const BUSY_RETRY: Duration = Duration::from_millis(100);

/// Send one request and read the answer. A daemon serving its maximum of clients closes
/// new connections at once; that is retried until [`TIMEOUT`], so `status` still answers
/// while the socket is flooded. A socket nobody listens on fails at once.
pub async fn query(path: &Path, request: &Request) -> Result<Response, ClientError> {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        match tokio::time::timeout_at(deadline, once(path, request)).await {
            Ok(Ok(response)) => return Ok(response),
            Ok(Err(Attempt::Failed(e))) => return Err(e),
            Ok(Err(Attempt::TurnedAway)) if tokio::time::Instant::now() + BUSY_RETRY < deadline => {
                tokio::time::sleep(BUSY_RETRY).await;
            }
            Ok(Err(Attempt::TurnedAway)) => {
                return Err(ClientError::Exchange {
                    path: path.to_path_buf(),
                    reason: "the daemon is serving too many clients; try again".into(),
                })
            }
            Err(_) => {
                return Err(ClientError::Exchange {
                    path: path.to_path_buf(),
                    reason: "timed out waiting for the answer".into(),
                })
            }
        }
    }
}

/// One try's outcome when it did not get an answer.
enum Attempt {
    /// Connected, but closed before any answer (the daemon is at its client limit).
    TurnedAway,
    /// Anything else: final.
    Failed(ClientError),
}

async fn once(path: &Path, request: &Request) -> Result<Response, Attempt> {
    let exchange = |reason: String| {
        Attempt::Failed(ClientError::Exchange {
            path: path.to_path_buf(),
            reason,
        })
    };
    let mut stream = UnixStream::connect(path).await.map_err(|source| {
        Attempt::Failed(ClientError::Connect {
            path: path.to_path_buf(),
            source,
        })
    })?;
    let mut bytes = serde_json::to_vec(request).map_err(|e| exchange(e.to_string()))?;
    bytes.push(b'\n');
    let mut answer = Vec::new();
    let io = async {
        stream.write_all(&bytes).await?;
        stream.read_to_end(&mut answer).await
    };
    match io.await {
        Ok(_) if answer.is_empty() => return Err(Attempt::TurnedAway),
        Ok(_) => {}
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
            ) =>
        {
            return Err(Attempt::TurnedAway)
        }
        Err(e) => return Err(exchange(e.to_string())),
    }
    serde_json::from_slice::<Response>(&answer).map_err(|e| exchange(format!("bad response: {e}")))
}
