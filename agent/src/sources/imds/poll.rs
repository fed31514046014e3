//! The IMDS poller: the aws-config IMDS client, one poll of the three notice paths, and the
//! source's task.

use std::path::PathBuf;
use std::time::Duration;

use aws_config::imds::client::error::ImdsError;
use tokio::sync::mpsc;

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
    /// Poll period.
    pub poll_interval: Duration,
    /// sysfs root (EC2 detection).
    pub sysfs_root: PathBuf,
}

/// Build the IMDS client: short timeouts (a poll must not pile up), two attempts.
pub fn client(endpoint: Option<&str>) -> Result<aws_config::imds::Client, String> {
    let mut builder = aws_config::imds::Client::builder()
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

/// GET a metadata path; `Ok(None)` for 404 (no notice).
async fn get(client: &aws_config::imds::Client, path: &str) -> Result<Option<String>, String> {
    match client.get(format!("/latest/meta-data/{path}")).await {
        Ok(body) => Ok(Some(body.as_ref().to_string())),
        Err(ImdsError::ErrorResponse(e)) if e.response().status().as_u16() == 404 => Ok(None),
        Err(e) => Err(format!("GET {path}: {e}")),
    }
}

/// One poll: every current notice, or why the poll failed.
pub async fn poll(client: &aws_config::imds::Client) -> Result<Vec<Notice>, String> {
    let mut out = Vec::new();
    if let Some(body) = get(client, "spot/instance-action").await? {
        out.push(notices::spot(&body).map_err(|e| e.to_string())?);
    }
    if let Some(body) = get(client, "events/recommendations/rebalance").await? {
        out.push(notices::rebalance(&body).map_err(|e| e.to_string())?);
    }
    if let Some(body) = get(client, "events/maintenance/scheduled").await? {
        out.extend(notices::scheduled(&body).map_err(|e| e.to_string())?);
    }
    Ok(out)
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
    let mut client = match client(settings.endpoint.as_deref()) {
        Ok(c) => c,
        Err(reason) => {
            let _ = tx.send(state(SourceState::Failed(reason))).await;
            return;
        }
    };
    let _ = tx.send(state(SourceState::On)).await;
    tracing::info!(endpoint = explicit.as_deref().unwrap_or("instance default"), interval = ?settings.poll_interval, "Polling IMDS.");
    let mut tick = tokio::time::interval(settings.poll_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_error: Option<String> = None;
    let mut last: Option<Vec<Notice>> = None;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shutdown.wait() => return,
        }
        match poll(&client).await {
            Ok(notices) => {
                if last_error.take().is_some() {
                    tracing::info!("IMDS answers again.");
                    let _ = tx.send(state(SourceState::On)).await;
                }
                if last.as_ref() != Some(&notices) {
                    last = Some(notices.clone());
                    if tx
                        .send(Observation::Notices {
                            source: SourceKind::Imds,
                            notices,
                        })
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
            Err(reason) => {
                // aws-config's client keeps its cached session token until the token's TTL
                // runs out, even when IMDS answers 401 (the token was invalidated early):
                // a fresh client fetches a new token on the next poll.
                if let Ok(fresh) = self::client(settings.endpoint.as_deref()) {
                    client = fresh;
                }
                // Keep the notices already known; an unreachable IMDS is no all-clear.
                if last_error.as_deref() != Some(&reason) {
                    tracing::warn!(%reason, "IMDS poll failed; keeping the notices already known.");
                    let _ = tx.send(state(SourceState::Failed(reason.clone()))).await;
                    last_error = Some(reason);
                }
            }
        }
    }
}
