//! IMDSv2 for the notice poll, on the HTTP/1 client already in the binary (hyper): one
//! session token, and a connection kept while IMDS keeps it (EC2's IMDS answers every
//! request with `Connection: close`, so there a request opens a connection of its own). The
//! notice paths are read every second, and the SDK's orchestrator (retry classifiers,
//! interceptors, identity resolution) costs more CPU and touched memory per request than
//! the request itself (idle CPU 0.061 % of a core against 0.038 %, 2026-12-06); the SDK
//! stays for the EC2 API and credentials.
//!
//! - The token (`PUT /latest/api/token`, TTL [`TOKEN_TTL`]) is fetched before the first GET,
//!   again [`REFRESH_BEFORE`] before it expires, and at once when IMDS answers 401 (the
//!   service forgot it early), after which the GET is tried once more.
//! - Every request is limited to [`REQUEST_LIMIT`] as a whole (connect, send, the answer);
//!   a connection that failed is dropped and the next request opens a new one.
//! - 404 is "no notice" (`Ok(None)`); every other status is an error naming the path.

use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request, StatusCode};

/// The session token's lifetime asked for (IMDS allows 1 s to 6 h).
pub const TOKEN_TTL: Duration = Duration::from_secs(6 * 3600);

/// A token is replaced this long before it expires.
pub const REFRESH_BEFORE: Duration = Duration::from_secs(60);

/// The longest one request may take, connecting included.
pub const REQUEST_LIMIT: Duration = Duration::from_secs(2);

/// The largest answer read (a scheduled-events list is a few hundred bytes).
const MAX_BODY: usize = 64 * 1024;

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    /// The endpoint is not an `http://host[:port]` address.
    #[error("[imds] endpoint {0:?}: not an http://host[:port] address")]
    Endpoint(String),
    /// No answer: connecting, sending or reading failed or took too long.
    #[error("{what}: {reason}")]
    Unreachable {
        /// The request (`GET spot/instance-action`, `PUT token`).
        what: String,
        /// What failed.
        reason: String,
    },
    /// IMDS answered with this status.
    #[error("{what}: IMDS answered {status}")]
    Status {
        /// The request.
        what: String,
        /// The HTTP status.
        status: u16,
    },
}

/// An IMDSv2 session: the endpoint, the connection, the token.
pub struct Session {
    /// `host:port` to connect to.
    authority: String,
    connection: Option<SendRequest<Empty<Bytes>>>,
    token: Option<(String, Instant)>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("authority", &self.authority)
            .field("connected", &self.connection.is_some())
            .field("token_expires", &self.token.as_ref().map(|t| t.1))
            .finish()
    }
}

impl Session {
    /// A session with `endpoint` (`http://host[:port]`; `None`: the instance's
    /// `http://169.254.169.254`). Nothing is sent until the first [`Session::get`].
    pub fn new(endpoint: Option<&str>) -> Result<Self, SessionError> {
        let endpoint = endpoint.unwrap_or("http://169.254.169.254");
        let authority = endpoint
            .strip_prefix("http://")
            .map(|rest| rest.trim_end_matches('/'))
            .filter(|a| !a.is_empty() && !a.contains('/'))
            .ok_or_else(|| SessionError::Endpoint(endpoint.to_string()))?;
        let authority = if authority
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        {
            authority.to_string()
        } else {
            format!("{authority}:80")
        };
        Ok(Self {
            authority,
            connection: None,
            token: None,
        })
    }

    /// GET `/latest/meta-data/<path>`: its body, or `None` for 404.
    pub async fn get(&mut self, path: &str) -> Result<Option<String>, SessionError> {
        let mut fresh = false;
        loop {
            let token = self.token(fresh).await?;
            let what = format!("GET {path}");
            let request = Request::get(format!("/latest/meta-data/{path}"))
                .header(hyper::header::HOST, &self.authority)
                .header("x-aws-ec2-metadata-token", token)
                .body(Empty::new())
                .map_err(|e| unreachable(&what, &e))?;
            let (status, body) = self.send(&what, request).await?;
            match status {
                StatusCode::OK => return Ok(Some(body)),
                StatusCode::NOT_FOUND => return Ok(None),
                // The service forgot the token early: a fresh one, and once more.
                StatusCode::UNAUTHORIZED if !fresh => fresh = true,
                other => {
                    if other == StatusCode::UNAUTHORIZED {
                        self.token = None;
                    }
                    return Err(SessionError::Status {
                        what,
                        status: other.as_u16(),
                    });
                }
            }
        }
    }

    /// The session token: the one held, unless `fresh` or it expires within
    /// [`REFRESH_BEFORE`], else a new one.
    async fn token(&mut self, fresh: bool) -> Result<String, SessionError> {
        if let Some((token, expires)) = &self.token {
            if !fresh && Instant::now() + REFRESH_BEFORE < *expires {
                return Ok(token.clone());
            }
        }
        let what = "PUT /latest/api/token".to_string();
        let request = Request::builder()
            .method(Method::PUT)
            .uri("/latest/api/token")
            .header(hyper::header::HOST, &self.authority)
            .header(
                "x-aws-ec2-metadata-token-ttl-seconds",
                TOKEN_TTL.as_secs().to_string(),
            )
            .body(Empty::new())
            .map_err(|e| unreachable(&what, &e))?;
        let asked_at = Instant::now();
        let (status, body) = self.send(&what, request).await?;
        if status != StatusCode::OK {
            return Err(SessionError::Status {
                what,
                status: status.as_u16(),
            });
        }
        let token = body.trim().to_string();
        self.token = Some((token.clone(), asked_at + TOKEN_TTL));
        Ok(token)
    }

    /// Send on the kept connection (a new one if there is none or it closed), within
    /// [`REQUEST_LIMIT`]; a failure drops the connection.
    async fn send(
        &mut self,
        what: &str,
        request: Request<Empty<Bytes>>,
    ) -> Result<(StatusCode, String), SessionError> {
        let result = tokio::time::timeout(REQUEST_LIMIT, self.exchange(request)).await;
        match result {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(reason)) => {
                self.connection = None;
                Err(SessionError::Unreachable {
                    what: what.to_string(),
                    reason,
                })
            }
            Err(_) => {
                self.connection = None;
                Err(SessionError::Unreachable {
                    what: what.to_string(),
                    reason: format!(
                        "no answer within {}",
                        humantime::format_duration(REQUEST_LIMIT)
                    ),
                })
            }
        }
    }

    async fn exchange(
        &mut self,
        request: Request<Empty<Bytes>>,
    ) -> Result<(StatusCode, String), String> {
        if self.connection.as_ref().is_none_or(SendRequest::is_closed) {
            let stream = tokio::net::TcpStream::connect(&self.authority)
                .await
                .map_err(|e| format!("connecting to {}: {e}", self.authority))?;
            let _ = stream.set_nodelay(true);
            let (sender, connection) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                    .await
                    .map_err(|e| e.to_string())?;
            tokio::spawn(async move {
                let _ = connection.await;
            });
            self.connection = Some(sender);
        }
        let sender = self.connection.as_mut().ok_or("no connection")?;
        sender.ready().await.map_err(|e| e.to_string())?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status();
        // The server ends the connection after this answer: the next request opens one.
        let closes = response.version() < hyper::Version::HTTP_11
            || response
                .headers()
                .get(hyper::header::CONNECTION)
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
        let body = http_body_util::Limited::new(response.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        if closes {
            self.connection = None;
        }
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }
}

fn unreachable(what: &str, e: &dyn std::fmt::Display) -> SessionError {
    SessionError::Unreachable {
        what: what.to_string(),
        reason: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// A loopback IMDS: counts token PUTs and connections; a GET with token `stale` is
    /// refused 401; with `close`, every answer ends its connection, as EC2's does.
    async fn serve(puts: Arc<AtomicUsize>, connections: Arc<AtomicUsize>, close: bool) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                connections.fetch_add(1, Ordering::SeqCst);
                let puts = Arc::clone(&puts);
                let service =
                    hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let puts = Arc::clone(&puts);
                        async move {
                            let (status, body) = if req.method() == Method::PUT {
                                let n = puts.fetch_add(1, Ordering::SeqCst);
                                (StatusCode::OK, format!("token-{n}"))
                            } else if req
                                .headers()
                                .get("x-aws-ec2-metadata-token")
                                .is_some_and(|t| t == "stale")
                            {
                                (StatusCode::UNAUTHORIZED, String::new())
                            } else {
                                (StatusCode::OK, "{}".to_string())
                            };
                            let mut response =
                                hyper::Response::new(http_body_util::Full::new(Bytes::from(body)));
                            *response.status_mut() = status;
                            if close {
                                response.headers_mut().insert(
                                    hyper::header::CONNECTION,
                                    hyper::header::HeaderValue::from_static("close"),
                                );
                            }
                            Ok::<_, std::convert::Infallible>(response)
                        }
                    });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service),
                );
            }
        });
        format!("http://{addr}")
    }

    #[tokio::test]
    async fn one_token_reused_refreshed_before_expiry_and_after_a_401() {
        let puts = Arc::new(AtomicUsize::new(0));
        let connections = Arc::new(AtomicUsize::new(0));
        let endpoint = serve(Arc::clone(&puts), Arc::clone(&connections), true).await;
        let mut session = Session::new(Some(&endpoint)).expect("session");
        for _ in 0..3 {
            assert_eq!(
                session.get("spot/instance-action").await,
                Ok(Some("{}".into()))
            );
        }
        assert_eq!(puts.load(Ordering::SeqCst), 1, "one token for many GETs");
        // About to expire: replaced before the GET.
        session.token = Some(("token-0".into(), Instant::now() + REFRESH_BEFORE / 2));
        session.get("spot/instance-action").await.expect("get");
        assert_eq!(puts.load(Ordering::SeqCst), 2);
        // Forgotten by the service (401): a fresh token, and the GET again.
        session.token = Some(("stale".into(), Instant::now() + TOKEN_TTL));
        assert_eq!(
            session.get("spot/instance-action").await,
            Ok(Some("{}".into()))
        );
        assert_eq!(puts.load(Ordering::SeqCst), 3);
        // EC2 closes each connection after its answer: each request had one of its own.
        assert_eq!(connections.load(Ordering::SeqCst), 9);
    }

    #[tokio::test]
    async fn a_connection_the_service_keeps_open_is_used_again() {
        let connections = Arc::new(AtomicUsize::new(0));
        let endpoint = serve(
            Arc::new(AtomicUsize::new(0)),
            Arc::clone(&connections),
            false,
        )
        .await;
        let mut session = Session::new(Some(&endpoint)).expect("session");
        for _ in 0..3 {
            assert_eq!(
                session.get("spot/instance-action").await,
                Ok(Some("{}".into()))
            );
        }
        assert_eq!(connections.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn endpoints_parse_to_an_authority() {
        let a = |e: Option<&str>| Session::new(e).map(|s| s.authority);
        assert_eq!(a(None).as_deref(), Ok("169.254.169.254:80"));
        assert_eq!(
            a(Some("http://127.0.0.1:8080/")).as_deref(),
            Ok("127.0.0.1:8080")
        );
        assert_eq!(
            a(Some("http://[fd00:ec2::254]")).as_deref(),
            Ok("[fd00:ec2::254]:80")
        );
        assert!(a(Some("https://169.254.169.254")).is_err());
        assert!(a(Some("http://host/path")).is_err());
    }
}
