//! The IMDS poller: one poll of the three notice paths (on the light IMDSv2 session,
//! [`super::session`]), the source's task, and the aws-config IMDS client the Capacity Block
//! source's credentials and region use. The Spot notice is polled every `poll_interval`
//! only on a Spot instance (`instance-life-cycle`, read once; unknown counts as Spot):
//! elsewhere no Spot notice can come, and it is read with the rebalance recommendation.

use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::mpsc;

use super::session::Session;
use super::{ec2, notices};
use crate::model::{Notice, Observation, SourceKind, SourceState};
use crate::shutdown::Shutdown;
use crate::tick::Ticker;

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

/// What this instance was bought as (`instance-life-cycle`): a Spot notice can only come to
/// a Spot instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LifeCycle {
    /// `spot`.
    Spot,
    /// Anything else IMDS says (`on-demand`; a Capacity Block's, whatever it is).
    Other,
    /// Not read yet (IMDS did not answer): taken as Spot, and read again each poll.
    Unknown,
}

impl LifeCycle {
    /// Read `instance-life-cycle`.
    pub async fn read(session: &mut Session) -> Self {
        match session.get("instance-life-cycle").await {
            Ok(Some(value)) if value.trim() == "spot" => Self::Spot,
            Ok(Some(_)) => Self::Other,
            Ok(None) | Err(_) => Self::Unknown,
        }
    }

    /// How often the notice paths are looked at: the Spot notice's `poll_interval` on a
    /// Spot instance (or one not known not to be); elsewhere, where no Spot notice can come,
    /// the Spot path is read with the rebalance recommendation (the faster of the slow
    /// intervals): a tenth of the requests or fewer, and a notice that came anyway is
    /// still seen.
    pub fn period(self, settings: &Settings) -> Duration {
        match self {
            Self::Spot | Self::Unknown => settings.poll_interval,
            Self::Other => settings
                .slow_intervals
                .iter()
                .copied()
                .min()
                .unwrap_or(settings.poll_interval)
                .max(settings.poll_interval),
        }
    }
}

impl std::fmt::Display for LifeCycle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Spot => "spot",
            Self::Other => "not spot",
            Self::Unknown => "unknown (taken as spot)",
        })
    }
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
    let mut life_cycle = LifeCycle::read(&mut session).await;
    let mut period = life_cycle.period(&settings);
    tracing::info!(endpoint = explicit.as_deref().unwrap_or("instance default"), life_cycle = %life_cycle, interval = ?period, "Polling IMDS.");
    let mut tick = Ticker::new(period);
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
            () = tick.tick() => {}
            () = shutdown.wait() => return,
        }
        if life_cycle == LifeCycle::Unknown {
            life_cycle = LifeCycle::read(&mut session).await;
            if life_cycle.period(&settings) != period {
                period = life_cycle.period(&settings);
                tracing::info!(life_cycle = %life_cycle, interval = ?period, "IMDS: the purchase option is known; polling the Spot notice at its pace.");
                tick = Ticker::new(period);
            }
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
