//! The EC2 API for this instance, shared by the sources that ask it: the client (instance
//! id and region from IMDS, credentials from the default chain: the instance role), its
//! errors (a missing IAM permission named by its action), and the launch facts only EC2
//! knows: how many EFA interfaces this instance was launched with.

use std::time::Duration;

use aws_sdk_ec2::error::ProvideErrorMetadata;
use tokio::sync::watch;

use crate::shutdown::Shutdown;

/// Why EC2 could not be asked, or did not answer.
#[derive(Debug, thiserror::Error)]
pub enum Ec2Error {
    /// IMDS did not give the instance id or region.
    #[error("IMDS {what}: {reason}")]
    Imds {
        /// What was asked.
        what: &'static str,
        /// Why it failed.
        reason: String,
    },
    /// The instance role lacks a permission.
    #[error("missing IAM permission ec2:{action} ({code}): {message}")]
    Permission {
        /// The EC2 action.
        action: &'static str,
        /// EC2's error code.
        code: String,
        /// EC2's message.
        message: String,
    },
    /// The whole lookup (IMDS, credentials, the EC2 calls) did not finish in time.
    #[error("no answer within {}: IMDS or the EC2 endpoint is not answering", humantime::format_duration(*.0))]
    TimedOut(Duration),
    /// Any other EC2 failure.
    #[error("ec2:{action}: {reason}")]
    Ec2 {
        /// The EC2 action.
        action: &'static str,
        /// Why.
        reason: String,
    },
}

/// The error of EC2 action `action`, a missing permission told apart.
pub fn api_error<
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
>(
    action: &'static str,
    e: aws_sdk_ec2::error::SdkError<E, R>,
) -> Ec2Error {
    if let Some(service) = e.as_service_error() {
        let code = service.code().unwrap_or_default().to_string();
        let message = service.message().unwrap_or_default().to_string();
        if code == "UnauthorizedOperation"
            || code == "AccessDenied"
            || code.contains("NotAuthorized")
        {
            return Ec2Error::Permission {
                action,
                code,
                message,
            };
        }
        return Ec2Error::Ec2 {
            action,
            reason: format!("{code}: {message}"),
        };
    }
    Ec2Error::Ec2 {
        action,
        reason: format!("{}", aws_sdk_ec2::error::DisplayErrorContext(&e)),
    }
}

/// An EC2 client for this instance's region, and this instance's id (both from IMDS at
/// `imds_endpoint`, or the standard one); `ec2_endpoint` overrides the regional endpoint.
pub async fn connect(
    imds_endpoint: Option<&str>,
    ec2_endpoint: Option<&str>,
) -> Result<(aws_sdk_ec2::Client, String), Ec2Error> {
    let imds = super::imds::client(imds_endpoint).map_err(|reason| Ec2Error::Imds {
        what: "client",
        reason,
    })?;
    let get = |path: &'static str| {
        let imds = imds.clone();
        async move {
            imds.get(format!("/latest/meta-data/{path}"))
                .await
                .map(|v| v.as_ref().trim().to_string())
                .map_err(|e| Ec2Error::Imds {
                    what: path,
                    reason: e.to_string(),
                })
        }
    };
    let instance_id = get("instance-id").await?;
    let region = get("placement/region").await?;
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .http_client(super::imds::http_client())
        .region(aws_config::Region::new(region));
    if let Some(endpoint) = ec2_endpoint {
        loader = loader.endpoint_url(endpoint);
    }
    // The instance role's credentials come from the same (test) IMDS.
    if imds_endpoint.is_some() && std::env::var_os("AWS_ACCESS_KEY_ID").is_none() {
        let provider = aws_config::imds::credentials::ImdsCredentialsProvider::builder()
            .imds_client(imds.clone())
            .build();
        loader = loader.credentials_provider(provider);
    }
    Ok((aws_sdk_ec2::Client::new(&loader.load().await), instance_id))
}

/// `instance_id` as DescribeInstances describes it (`None`: not listed).
pub async fn describe_instance(
    client: &aws_sdk_ec2::Client,
    instance_id: &str,
) -> Result<Option<aws_sdk_ec2::types::Instance>, Ec2Error> {
    let answer = client
        .describe_instances()
        .instance_ids(instance_id)
        .send()
        .await
        .map_err(|e| api_error("DescribeInstances", e))?;
    Ok(answer
        .reservations()
        .iter()
        .flat_map(|r| r.instances())
        .find(|i| i.instance_id().is_none_or(|id| id == instance_id))
        .cloned())
}

/// How many EFA interfaces `instance_id` was launched with (network interfaces of type
/// `efa` or `efa-only`): what this launch attached, not the type's maximum.
pub async fn efa_interfaces(
    client: &aws_sdk_ec2::Client,
    instance_id: &str,
) -> Result<u32, Ec2Error> {
    let count = describe_instance(client, instance_id)
        .await?
        .iter()
        .flat_map(|i| i.network_interfaces())
        .filter(|n| matches!(n.interface_type(), Some("efa" | "efa-only")))
        .count();
    Ok(u32::try_from(count).unwrap_or(u32::MAX))
}

/// Where to ask, and how often to try again after a failure.
#[derive(Debug, Clone)]
pub struct Settings {
    /// IMDS endpoint override (instance id, region).
    pub imds_endpoint: Option<String>,
    /// EC2 endpoint override.
    pub ec2_endpoint: Option<String>,
    /// How long after a failure to ask again.
    pub retry_interval: Duration,
    /// sysfs root (EC2 detection).
    pub sysfs_root: std::path::PathBuf,
}

/// Learn this launch's EFA interface count once, where the host has EFA devices, and
/// publish it on `count` (the EFA source
/// judges the devices against it); until then, and off EC2, it stays `None` and the EFA
/// source falls back to the count it saw once its start-up grace ended. A failure (no
/// permission, EC2 not answering) is logged once and tried again every `retry_interval`.
pub async fn learn_efa_interfaces(
    settings: Settings,
    count: watch::Sender<Option<u32>>,
    mut shutdown: Shutdown,
) {
    if settings.ec2_endpoint.is_none() && settings.imds_endpoint.is_none() {
        if let Err(reason) = super::imds::ec2(&settings.sysfs_root) {
            tracing::debug!(%reason, "Not on EC2: the EFA count is judged against this boot's.");
            return;
        }
    }
    let limit = settings
        .retry_interval
        .min(super::capacity_block::LOOKUP_LIMIT);
    let mut logged: Option<String> = None;
    loop {
        // Asked only where there is an EFA device to judge (they may initialise late).
        let root = settings.sysfs_root.clone();
        let has_efa = tokio::task::spawn_blocking(move || {
            !super::efa::sysfs::Devices::new(&root).read().is_empty()
        })
        .await
        .unwrap_or(false);
        if !has_efa {
            tokio::select! {
                () = tokio::time::sleep(settings.retry_interval) => continue,
                () = shutdown.wait() => return,
            }
        }
        let asked = tokio::time::timeout(limit, async {
            let (client, id) = connect(
                settings.imds_endpoint.as_deref(),
                settings.ec2_endpoint.as_deref(),
            )
            .await?;
            efa_interfaces(&client, &id).await
        })
        .await
        .unwrap_or(Err(Ec2Error::TimedOut(limit)));
        match asked {
            Ok(n) => {
                tracing::info!(
                    efa_interfaces = n,
                    "This instance's EFA interfaces, from EC2."
                );
                count.send_replace(Some(n));
                return;
            }
            Err(e) => {
                let reason = e.to_string();
                if logged.as_deref() != Some(&reason) {
                    tracing::warn!(%reason, "Cannot learn this instance's EFA interfaces from EC2; judging the EFA devices against this boot's count meanwhile.");
                    logged = Some(reason);
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(settings.retry_interval) => {}
            () = shutdown.wait() => return,
        }
    }
}
