//! The `/metrics` HTTP endpoint (hyper, HTTP/1.1), bounded like every local server
//! ([`crate::host::listen`]): at most
//! [`MAX_CONNECTIONS`] at once (further clients wait in the listen backlog), each must send
//! its request headers within [`HEADER_TIMEOUT`] and is closed after [`CONNECTION_TIMEOUT`],
//! so idle or slow clients on a non-loopback address cannot pile up memory or descriptors.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

use crate::host::listen::Limits;
use crate::shutdown::Shutdown;

/// Connections served at once; more wait in the listen backlog until one ends.
pub const MAX_CONNECTIONS: usize = 16;
/// A client must send a request's headers within this.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(2);
/// A connection is closed after this, whatever it is doing (a scrape takes milliseconds;
/// Prometheus reconnects for the next one).
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);

const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Why the endpoint could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen for metrics on {addr}: {source}")]
pub struct ServeError {
    /// The address.
    pub addr: SocketAddr,
    /// The I/O error.
    pub source: std::io::Error,
}

/// Bind `addr`; the returned future serves until shutdown.
pub async fn serve(
    addr: SocketAddr,
    registry: Registry,
    shutdown: Shutdown,
) -> Result<(SocketAddr, impl std::future::Future<Output = ()>), ServeError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError { addr, source })?;
    let local = listener
        .local_addr()
        .map_err(|source| ServeError { addr, source })?;
    let registry = Arc::new(registry);
    Ok((local, accept_loop(listener, registry, shutdown)))
}

async fn accept_loop(listener: TcpListener, registry: Arc<Registry>, shutdown: Shutdown) {
    let limits = Limits {
        clients: MAX_CONNECTIONS,
        lifetime: CONNECTION_TIMEOUT,
        when_full: crate::host::listen::WhenFull::Wait,
    };
    crate::host::listen::serve(listener, limits, "metrics", shutdown, move |stream| {
        let registry = Arc::clone(&registry);
        async move {
            let service = hyper::service::service_fn(move |req| {
                let registry = Arc::clone(&registry);
                async move { Ok::<_, Infallible>(respond(&req, &registry)) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        }
    })
    .await;
}

fn respond(req: &Request<Incoming>, registry: &Registry) -> Response<Full<Bytes>> {
    let plain = |status: StatusCode, body: &'static str| {
        let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
        *response.status_mut() = status;
        response
    };
    if req.uri().path() != "/metrics" {
        return plain(
            StatusCode::NOT_FOUND,
            "not found; metrics are at /metrics\n",
        );
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "use GET\n");
    }
    match super::encode(registry) {
        Ok(text) => {
            let mut response = Response::new(Full::new(Bytes::from(text)));
            if let Ok(value) = hyper::header::HeaderValue::from_str(CONTENT_TYPE) {
                response
                    .headers_mut()
                    .insert(hyper::header::CONTENT_TYPE, value);
            }
            response
        }
        Err(_) => plain(StatusCode::INTERNAL_SERVER_ERROR, "cannot encode metrics\n"),
    }
}
