//! A loopback HTTP/1.1 server on its own thread and runtime, for the test doubles of remote
//! services (Kubernetes API, IMDS). Stopping it closes the listener, like an outage.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};

/// A response future.
pub type Reply = Pin<Box<dyn Future<Output = Response<Full<Bytes>>> + Send>>;
/// A request handler.
pub type Handler = Arc<dyn Fn(Request<Incoming>) -> Reply + Send + Sync>;

/// A running server.
pub struct Server {
    /// Where it listens.
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").field("addr", &self.addr).finish()
    }
}

impl Server {
    /// Listen on `addr` (port 0: any free port) and answer with `handler`.
    pub fn start(addr: SocketAddr, handler: Handler) -> Self {
        let listener = std::net::TcpListener::bind(addr).expect("bind test server");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("addr");
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                loop {
                    let (stream, _) = tokio::select! {
                        accepted = listener.accept() => match accepted { Ok(a) => a, Err(_) => continue },
                        _ = &mut stopped => return,
                    };
                    let handler = Arc::clone(&handler);
                    tokio::spawn(async move {
                        let service = hyper::service::service_fn(move |req| {
                            let reply = handler(req);
                            async move { Ok::<_, Infallible>(reply.await) }
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                            .await;
                    });
                }
            });
        });
        Self {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Stop listening.
    pub fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Start a server on a free loopback port whose handler gets shared state `S`.
pub fn start_with_state<S, F, Fut>(handle: F) -> (Arc<std::sync::Mutex<S>>, Server)
where
    S: Default + Send + 'static,
    F: Fn(Request<Incoming>, Arc<std::sync::Mutex<S>>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let state = Arc::new(std::sync::Mutex::new(S::default()));
    let shared = Arc::clone(&state);
    let handler: Handler =
        Arc::new(move |req| -> Reply { Box::pin(handle(req, Arc::clone(&shared))) });
    (
        state,
        Server::start("127.0.0.1:0".parse().expect("addr"), handler),
    )
}

/// A response with a status, content type and body.
pub fn respond(status: u16, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() =
        hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    response
}
