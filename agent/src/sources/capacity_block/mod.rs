//! The Capacity Block source: when this instance runs in an EC2 Capacity Block, its end is
//! known in advance. EC2 starts terminating an instance Capacity Block's instances 30 minutes
//! before the reservation's `EndDate`, and an UltraServer Capacity Block's 60 minutes before
//! it, so the notice's deadline is `EndDate - 30 min` or `EndDate - 60 min`, and its detail
//! says which rule applied. (Karpenter drains every block at `EndDate - 40 min`: on an
//! UltraServer block, after termination has begun.)
//!
//! DescribeInstances (this instance) -> `CapacityReservationId` ->
//! DescribeCapacityReservations -> a `capacity-block` reservation's `EndDate` and
//! `CapacityBlockId` -> DescribeCapacityBlocks -> its `UltraserverType` (set for an
//! UltraServer block). Instance id and region come from IMDS; credentials from the default
//! chain (the instance role). A missing IAM permission is reported naming the action; where
//! only `ec2:DescribeCapacityBlocks` is missing, the end is known but not the kind of block,
//! and the earlier termination (60 minutes) is taken, saying so: a checkpoint half an hour
//! early costs less than one too late.

use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;

use super::ec2::{api_error, Ec2Error};
use crate::model::{Notice, NoticeKind, Observation, SourceKind, SourceState};
use crate::shutdown::Shutdown;

/// EC2 begins terminating an instance Capacity Block's instances this long before its end.
pub const TERMINATION_LEAD: Duration = Duration::from_secs(30 * 60);
/// ... and an UltraServer Capacity Block's this long before its end.
pub const ULTRASERVER_TERMINATION_LEAD: Duration = Duration::from_secs(60 * 60);

/// The longest one lookup may take.
pub(super) const LOOKUP_LIMIT: Duration = Duration::from_secs(60);

/// What the source needs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// IMDS endpoint override (instance id, region).
    pub imds_endpoint: Option<String>,
    /// EC2 endpoint override.
    pub ec2_endpoint: Option<String>,
    /// How often the reservation is read again.
    pub poll_interval: Duration,
    /// sysfs root (EC2 detection).
    pub sysfs_root: std::path::PathBuf,
}

/// The Capacity Block notice for this instance, if it runs in one. The EC2 client and the
/// instance id are made once and kept in `connected` (the client's credentials cache renews
/// the role's credentials itself): a later lookup is the EC2 calls alone, not IMDS reads, a
/// config load and a credentials fetch every `poll_interval`. A failed connect is tried
/// again at the next lookup.
async fn lookup(
    settings: &Settings,
    connected: &mut Option<(aws_sdk_ec2::Client, String)>,
) -> Result<Option<Notice>, Ec2Error> {
    let (client, instance_id) = match connected {
        Some(c) => c,
        None => connected.insert(
            super::ec2::connect(
                settings.imds_endpoint.as_deref(),
                settings.ec2_endpoint.as_deref(),
            )
            .await?,
        ),
    };
    notice_for(client, instance_id).await
}

/// The two EC2 calls and what is taken from their answers: the Capacity Block notice for
/// `instance_id`, if it runs in one.
pub async fn notice_for(
    client: &aws_sdk_ec2::Client,
    instance_id: &str,
) -> Result<Option<Notice>, Ec2Error> {
    let reservation_id = super::ec2::describe_instance(client, instance_id)
        .await?
        .and_then(|i| i.capacity_reservation_id().map(str::to_string));
    let Some(reservation_id) = reservation_id else {
        return Ok(None);
    };
    let reservations = client
        .describe_capacity_reservations()
        .capacity_reservation_ids(&reservation_id)
        .send()
        .await
        .map_err(|e| api_error("DescribeCapacityReservations", e))?;
    let Some(r) = reservations
        .capacity_reservations()
        .iter()
        .find(|r| r.capacity_reservation_id() == Some(reservation_id.as_str()))
    else {
        return Ok(None);
    };
    if r.reservation_type().map(|t| t.as_str()) != Some("capacity-block") {
        return Ok(None);
    }
    let Some(end) = r.end_date() else {
        return Ok(None);
    };
    let end = SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(end.secs()).unwrap_or(0));
    let (lead, rule) = match r.capacity_block_id() {
        Some(block) => termination_rule(client, block).await?,
        None => (
            TERMINATION_LEAD,
            "an instance Capacity Block (no UltraServer block named)".to_string(),
        ),
    };
    let deadline = end.checked_sub(lead).unwrap_or(end);
    Ok(Some(Notice {
        id: format!(
            "capacity-block:{reservation_id}:{}",
            crate::model::time::rfc3339(end)
        ),
        kind: NoticeKind::CapacityBlock,
        deadline,
        detail: format!(
            "Capacity Block {reservation_id} ends {}; {rule}: termination starts {} minutes before",
            crate::model::time::rfc3339(end),
            lead.as_secs() / 60
        ),
        source: SourceKind::CapacityBlock,
    }))
}

/// How long before its end EC2 starts terminating the instances of Capacity Block `block`,
/// and the rule in words: 60 minutes for an UltraServer block (`UltraserverType` set), 30
/// for an instance block; 60, saying why, where DescribeCapacityBlocks is not permitted.
async fn termination_rule(
    client: &aws_sdk_ec2::Client,
    block: &str,
) -> Result<(Duration, String), Ec2Error> {
    let answer = client
        .describe_capacity_blocks()
        .capacity_block_ids(block)
        .send()
        .await
        .map_err(|e| api_error("DescribeCapacityBlocks", e));
    let blocks = match answer {
        Ok(blocks) => blocks,
        Err(Ec2Error::Permission { .. }) => {
            return Ok((
                ULTRASERVER_TERMINATION_LEAD,
                format!(
                    "Capacity Block {block} of unknown kind (no ec2:DescribeCapacityBlocks permission), taken as an UltraServer block"
                ),
            ))
        }
        Err(e) => return Err(e),
    };
    let ultraserver = blocks
        .capacity_blocks()
        .iter()
        .find(|b| b.capacity_block_id() == Some(block))
        .and_then(|b| b.ultraserver_type())
        .filter(|t| !t.is_empty());
    Ok(match ultraserver {
        Some(kind) => (
            ULTRASERVER_TERMINATION_LEAD,
            format!("UltraServer Capacity Block {block} ({kind})"),
        ),
        None => (TERMINATION_LEAD, format!("instance Capacity Block {block}")),
    })
}

/// Run until shutdown.
pub async fn run(settings: Settings, tx: mpsc::Sender<Observation>, mut shutdown: Shutdown) {
    let state = |s| Observation::Source(SourceKind::CapacityBlock, s);
    if settings.ec2_endpoint.is_none() && settings.imds_endpoint.is_none() {
        if let Err(reason) = super::imds::ec2(&settings.sysfs_root) {
            let _ = tx.send(state(SourceState::Off(reason))).await;
            return;
        }
    }
    let mut last_error: Option<String> = None;
    let mut last: Option<Vec<Notice>> = None;
    let mut connected = None;
    // One lookup never outlasts the interval between lookups (nor a minute): an endpoint
    // that accepts and never answers shows as the source failed.
    let limit = settings.poll_interval.min(LOOKUP_LIMIT);
    loop {
        let looked_up = tokio::time::timeout(limit, lookup(&settings, &mut connected))
            .await
            .unwrap_or(Err(Ec2Error::TimedOut(limit)));
        match looked_up {
            Ok(notice) => {
                if last_error.take().is_some() || last.is_none() {
                    let _ = tx.send(state(SourceState::On)).await;
                }
                let notices: Vec<Notice> = notice.into_iter().collect();
                if last.as_ref() != Some(&notices) {
                    if let Some(n) = notices.first() {
                        tracing::info!(deadline = %crate::model::time::rfc3339(n.deadline), detail = %n.detail, "Capacity Block end known.");
                    }
                    last = Some(notices.clone());
                    let _ = tx
                        .send(Observation::Notices {
                            source: SourceKind::CapacityBlock,
                            notices,
                        })
                        .await;
                }
            }
            Err(e) => {
                let reason = e.to_string();
                if last_error.as_deref() != Some(&reason) {
                    tracing::warn!(%reason, "Cannot learn the Capacity Block end.");
                    let _ = tx.send(state(SourceState::Failed(reason.clone()))).await;
                    last_error = Some(reason);
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(settings.poll_interval) => {}
            () = shutdown.wait() => return,
        }
    }
}
