//! The IMDS poller: one poll of the three notice paths (on the light IMDSv2 session,
//! [`super::session`]), the source's task, and the aws-config IMDS client the Capacity Block
//! source's credentials and region use.

use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::mpsc;

use super::session::Session;
use super::{ec2, notices};
use crate::model::{Notice, Observation, SourceKind, SourceState};
use crate::shutdown::Shutdown;

/// How often a non-EC2 host is looked at again.
const RECHECK: Duration = Duration::from_secs(600);

/// What the source needs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Endpoint override; `None`: the standard variable, else the link-local default.
    pub endpoint: Option<String>,
    /// Poll period of the Spot instance-action.
    pub poll_interval: Duration,
    /// Poll periods of the rebalance recommendation and scheduled events.
    pub slow_intervals: [Duration; 2],
    /// sysfs root (EC2 detection).
    pub sysfs_root: PathBuf,
}

/// The HTTP(S) client every AWS call goes through: hyper on rustls with ring (the provider
/// kube uses too), built once and shared (its connection pool with it).
pub fn http_client() -> aws_sdk_ec2::config::SharedHttpClient {
    use aws_smithy_http_client::tls;
    static CLIENT: std::sync::OnceLock<aws_sdk_ec2::config::SharedHttpClient> =
        std::sync::OnceLock::new();
    CLIENT
        .get_or_init(|| {
            aws_smithy_http_client::Builder::new()
                .tls_provider(tls::Provider::Rustls(
                    tls::rustls_provider::CryptoMode::Ring,
                ))
                .build_https()
        })
        .clone()
}

/// Build the SDK's IMDS client (the Capacity Block source's credentials and region): short
/// timeouts, two attempts.
pub fn client(endpoint: Option<&str>) -> Result<aws_config::imds::Client, String> {
    let mut builder = aws_config::imds::Client::builder()
        .configure(
            &aws_config::provider_config::ProviderConfig::without_region()
                .with_http_client(http_client()),
        )
        .max_attempts(2)
        .connect_timeout(Duration::from_secs(1))
        .read_timeout(Duration::from_secs(1));
    if let Some(endpoint) = endpoint {
        builder = builder
            .endpoint(endpoint)
            .map_err(|e| format!("[imds] endpoint {endpoint:?}: {e}"))?;
    }
    Ok(builder.build())
}

/// Why one notice path could not be read.
#[derive(Debug, Clone, PartialEq)]
pub struct PathError {
    /// What failed, naming the path.
    pub reason: String,
}

/// The notice paths, polled and parsed each on its own: a malformed rebalance or
/// scheduled-events body never hides a Spot notice.
pub const PATHS: [&str; 3] = [
    "spot/instance-action",
    "events/recommendations/rebalance",
    "events/maintenance/scheduled",
];

/// One poll of the paths in `due`: for each of [`PATHS`], its current notices, why it could
/// not be read, or `None` when it was not due.
pub async fn poll(
    session: &mut Session,
    due: [bool; 3],
) -> [Option<Result<Vec<Notice>, PathError>>; 3] {
    let parsed = |path: &str, body: Option<String>| -> Result<Vec<Notice>, PathError> {
        let Some(body) = body else {
            return Ok(Vec::new());
        };
        let result = match path {
            "spot/instance-action" => notices::spot(&body).map(|n| vec![n]),
            "events/recommendations/rebalance" => notices::rebalance(&body).map(|n| vec![n]),
            _ => notices::scheduled(&body),
        };
        result.map_err(|e| PathError {
            reason: format!("{path}: {e}"),
        })
    };
    let mut out = [None, None, None];
    for ((slot, path), due) in out.iter_mut().zip(PATHS).zip(due) {
        if due {
            *slot = Some(match session.get(path).await {
                Ok(body) => parsed(path, body),
                Err(e) => Err(PathError {
                    reason: e.to_string(),
                }),
            });
        }
    }
    out
}

/// Run until shutdown.
pub async fn run(settings: Settings, tx: mpsc::Sender<Observation>, mut shutdown: Shutdown) {
    let state = |s| Observation::Source(SourceKind::Imds, s);
    let explicit = settings
        .endpoint
        .clone()
        .or_else(|| std::env::var("AWS_EC2_METADATA_SERVICE_ENDPOINT").ok());
    if explicit.is_none() {
        let mut reported = false;
        loop {
            match ec2(&settings.sysfs_root) {
                Ok(()) => break,
                Err(reason) => {
                    if !reported {
                        tracing::info!(%reason, "IMDS source is off.");
                        let _ = tx.send(state(SourceState::Off(reason))).await;
                        reported = true;
                    }
                }
            }
            tokio::select! {
                () = tokio::time::sleep(RECHECK) => {}
                () = shutdown.wait() => return,
            }
        }
    }
    let mut session = match Session::new(explicit.as_deref()) {
        Ok(s) => s,
        Err(e) => {
            let _ = tx.send(state(SourceState::Failed(e.to_string()))).await;
            return;
        }
    };
    let _ = tx.send(state(SourceState::On)).await;
    tracing::info!(endpoint = explicit.as_deref().unwrap_or("instance default"), interval = ?settings.poll_interval, "Polling IMDS.");
    let mut tick = tokio::time::interval(settings.poll_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_error: Option<String> = None;
    let mut last: Option<Vec<Notice>> = None;
    // Each path's notices as last read; a path that fails keeps what it had (an unreachable
    // IMDS is no all-clear).
    let mut known: [Vec<Notice>; 3] = Default::default();
    // The slow paths' next poll; a failing path is retried every tick until it answers.
    let start = tokio::time::Instant::now();
    let mut next_due = [start, start];
    // Each path's last error, until it answers again.
    let mut path_errors: [Option<String>; 3] = Default::default();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shutdown.wait() => return,
        }
        let now = tokio::time::Instant::now();
        let due = [
            true,
            now >= next_due[0] || path_errors[1].is_some(),
            now >= next_due[1] || path_errors[2].is_some(),
        ];
        for (next, (interval, polled)) in next_due
            .iter_mut()
            .zip(settings.slow_intervals.iter().zip(&due[1..]))
        {
            if *polled {
                *next = now + *interval;
            }
        }
        for (i, result) in poll(&mut session, due).await.into_iter().enumerate() {
            match result {
                None => {}
                Some(Ok(notices)) => {
                    known[i] = notices;
                    path_errors[i] = None;
                }
                Some(Err(e)) => {
                    path_errors[i] = Some(e.reason);
                }
            }
        }
        let errors: Vec<String> = path_errors.iter().flatten().cloned().collect();
        let notices: Vec<Notice> = known.iter().flatten().cloned().collect();
        if last.as_ref() != Some(&notices) {
            last = Some(notices.clone());
            let sent = tx
                .send(Observation::Notices {
                    source: SourceKind::Imds,
                    notices,
                })
                .await;
            if sent.is_err() {
                return;
            }
        }
        if errors.is_empty() {
            if last_error.take().is_some() {
                tracing::info!("IMDS answers again.");
                let _ = tx.send(state(SourceState::On)).await;
            }
        } else {
            let reason = errors.join("; ");
            if last_error.as_deref() != Some(&reason) {
                tracing::warn!(%reason, "IMDS poll failed for a notice path; keeping what that path had.");
                let _ = tx.send(state(SourceState::Failed(reason.clone()))).await;
                last_error = Some(reason);
            }
        }
    }
}
