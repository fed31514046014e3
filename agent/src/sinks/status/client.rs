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

/// Send one request and read the answer.
pub async fn query(path: &Path, request: &Request) -> Result<Response, ClientError> {
    let exchange = |reason: String| ClientError::Exchange {
        path: path.to_path_buf(),
        reason,
    };
    let mut stream = match tokio::time::timeout(TIMEOUT, UnixStream::connect(path)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(source)) => {
            return Err(ClientError::Connect {
                path: path.to_path_buf(),
                source,
            })
        }
        Err(_) => return Err(exchange("timed out connecting".into())),
    };
    let conversation = async {
        let mut bytes = serde_json::to_vec(request).map_err(|e| e.to_string())?;
        bytes.push(b'\n');
        stream.write_all(&bytes).await.map_err(|e| e.to_string())?;
        let mut answer = Vec::new();
        stream
            .read_to_end(&mut answer)
            .await
            .map_err(|e| e.to_string())?;
        serde_json::from_slice::<Response>(&answer).map_err(|e| format!("bad response: {e}"))
    };
    match tokio::time::timeout(TIMEOUT, conversation).await {
        Ok(result) => result.map_err(exchange),
        Err(_) => Err(exchange("timed out waiting for the answer".into())),
    }
}
