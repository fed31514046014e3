//! A test EC2 instance metadata service, IMDSv2 only, as the real one behaves: `PUT
//! /latest/api/token` needs `X-aws-ec2-metadata-token-ttl-seconds` (1-21600, else 400) and
//! answers the token as text with the TTL header; every `GET` needs a live token (401
//! without one or with an expired one); an absent notice is 404; bodies are the reference's.
//! Like EC2's (`Server: EC2ws`), every answer says `Connection: close` and the connection
//! ends after it: a client opens one connection per request.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::Request;

use crate::http::{respond, Server};

/// A fault the service can be put into.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ImdsFault {
    /// Answers like the real service.
    #[default]
    None,
    /// Every request: 500, as the real service's error page.
    ServerError,
    /// Every answer comes this late.
    Slow(Duration),
}

/// What the service holds.
#[derive(Debug, Default)]
pub struct ImdsState {
    /// The fault it is in.
    pub fault: ImdsFault,
    /// `spot/instance-action` body, if a notice is up.
    pub spot: Option<String>,
    /// `events/recommendations/rebalance` body.
    pub rebalance: Option<String>,
    /// `events/maintenance/scheduled` body (`[]` when `None`).
    pub scheduled: Option<String>,
    /// `instance-life-cycle` (`None`: `spot`, the instance a Spot notice can come to).
    pub life_cycle: Option<String>,
    /// Tokens handed out, with their expiry.
    tokens: HashMap<String, Instant>,
    /// GETs answered, by path.
    pub gets: Vec<String>,
}

/// A running test IMDS.
#[derive(Debug)]
pub struct FakeImds {
    /// Shared state.
    pub state: Arc<Mutex<ImdsState>>,
    server: Server,
}

impl FakeImds {
    /// Start on a free loopback port.
    pub fn start() -> Self {
        let (state, server) = crate::http::start_with_state(|req, state| async {
            let mut answer = handle(req, state).await;
            let headers = answer.headers_mut();
            headers.insert(
                hyper::header::CONNECTION,
                hyper::header::HeaderValue::from_static("close"),
            );
            headers.insert(
                hyper::header::SERVER,
                hyper::header::HeaderValue::from_static("EC2ws"),
            );
            answer
        });
        Self { state, server }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.server.addr)
    }

    /// Set or clear the Spot notice.
    pub fn set_spot(&self, body: Option<&str>) {
        self.state.lock().expect("state").spot = body.map(str::to_string);
    }

    /// Post a Spot `terminate` notice for `in_` from now; its deadline as IMDS writes it.
    pub fn spot_terminate_in(&self, in_: std::time::Duration) -> String {
        let deadline = crate::trainer::rfc3339(std::time::SystemTime::now() + in_);
        self.set_spot(Some(&format!(
            r#"{{"action": "terminate", "time": "{deadline}"}}"#
        )));
        deadline
    }

    /// Set or clear the rebalance recommendation.
    pub fn set_rebalance(&self, body: Option<&str>) {
        self.state.lock().expect("state").rebalance = body.map(str::to_string);
    }

    /// Set the scheduled events (a JSON array).
    pub fn set_scheduled(&self, body: &str) {
        self.state.lock().expect("state").scheduled = Some(body.to_string());
    }

    /// What `instance-life-cycle` answers (`on-demand`, `spot`).
    pub fn set_life_cycle(&self, value: &str) {
        self.state.lock().expect("state").life_cycle = Some(value.to_string());
    }

    /// GETs of `path` (under `/latest/meta-data/`) answered so far.
    pub fn gets_of(&self, path: &str) -> usize {
        let full = format!("/latest/meta-data/{path}");
        let s = self.state.lock().expect("state");
        s.gets.iter().filter(|p| **p == full).count()
    }

    /// Put the service into a fault mode (or back with [`ImdsFault::None`]).
    pub fn set_fault(&self, fault: ImdsFault) {
        self.state.lock().expect("state").fault = fault;
    }

    /// GETs answered so far (with a live token).
    pub fn gets(&self) -> usize {
        self.state.lock().expect("state").gets.len()
    }

    /// Session tokens handed out so far (one `PUT /latest/api/token` each).
    pub fn tokens_issued(&self) -> usize {
        self.state.lock().expect("state").tokens.len()
    }

    /// Expire every token handed out (the client must fetch a new one).
    pub fn expire_tokens(&self) {
        for expiry in self.state.lock().expect("state").tokens.values_mut() {
            *expiry = Instant::now();
        }
    }
}

async fn handle(
    req: Request<Incoming>,
    state: Arc<Mutex<ImdsState>>,
) -> hyper::Response<http_body_util::Full<hyper::body::Bytes>> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let ttl = header("x-aws-ec2-metadata-token-ttl-seconds");
    let token = header("x-aws-ec2-metadata-token");
    let _ = req.into_body().collect().await;
    let fault = state.lock().expect("state").fault;
    match fault {
        ImdsFault::None => {}
        ImdsFault::ServerError => return respond(
            500,
            "text/html",
            "<?xml version=\"1.0\"?><html><body><h1>500 - Internal Server Error</h1></body></html>"
                .into(),
        ),
        ImdsFault::Slow(delay) => tokio::time::sleep(delay).await,
    }
    let mut s = state.lock().expect("state");
    if method == hyper::Method::PUT {
        if path != "/latest/api/token" {
            return respond(403, "text/plain", "Forbidden".into());
        }
        let Some(ttl) = ttl
            .and_then(|t| t.parse::<u64>().ok())
            .filter(|t| (1..=21_600).contains(t))
        else {
            return respond(400, "text/plain", "Bad Request".into());
        };
        let token = format!("AQAEAtest{}", s.tokens.len());
        s.tokens
            .insert(token.clone(), Instant::now() + Duration::from_secs(ttl));
        let mut r = respond(200, "text/plain", token);
        r.headers_mut().insert(
            "x-aws-ec2-metadata-token-ttl-seconds",
            hyper::header::HeaderValue::from(ttl),
        );
        return r;
    }
    if method != hyper::Method::GET {
        return respond(405, "text/plain", "Method Not Allowed".into());
    }
    let live = token
        .as_ref()
        .and_then(|t| s.tokens.get(t))
        .is_some_and(|expiry| *expiry > Instant::now());
    if !live {
        return respond(401, "text/plain", "Unauthorized".into());
    }
    s.gets.push(path.clone());
    let body = match path.trim_start_matches("/latest/meta-data/") {
        "spot/instance-action" => s.spot.clone(),
        "events/recommendations/rebalance" => s.rebalance.clone(),
        "events/maintenance/scheduled" => Some(s.scheduled.clone().unwrap_or_else(|| "[]".into())),
        "instance-life-cycle" => Some(s.life_cycle.clone().unwrap_or_else(|| "spot".into())),
        "instance-id" => Some("i-0123456789abcdef0".into()),
        "placement/region" => Some("us-west-2".into()),
        _ => None,
    };
    match body {
        Some(b) => respond(200, "text/plain", b),
        None => respond(
            404,
            "text/html",
            "<?xml version=\"1.0\"?><html><body><h1>404 - Not Found</h1></body></html>".into(),
        ),
    }
}

/// A scheduled-events body with one active system reboot at `not_before` (whole seconds, in
/// IMDS's own time format: `21 Jan 2019 09:00:43 GMT`).
pub fn scheduled_reboot(not_before: std::time::SystemTime) -> String {
    use std::time::{Duration, SystemTime};
    let secs = not_before
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after the epoch")
        .as_secs();
    let t = crate::trainer::rfc3339(SystemTime::UNIX_EPOCH + Duration::from_secs(secs));
    let months = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let imds_time = format!(
        "{} {} {} {} GMT",
        t[8..10].trim_start_matches('0'),
        months[t[5..7].parse::<usize>().expect("month") - 1],
        &t[0..4],
        &t[11..19]
    );
    format!(
        r#"[{{"NotBefore": "{imds_time}", "Code": "system-reboot", "Description": "scheduled reboot", "EventId": "instance-event-0d59937288b749b32", "NotAfter": "{imds_time}", "State": "active"}}]"#
    )
}
