//! The three IMDS notice bodies, parsed into [`Notice`]s. Pure, so every shape is tested.

use std::time::{Duration, SystemTime};

use serde::Deserialize;

use crate::model::{Notice, NoticeKind, SourceKind};

/// Why a body did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct BodyError {
    /// The IMDS path.
    pub path: &'static str,
    /// What is wrong.
    pub reason: String,
}

#[derive(Deserialize)]
struct InstanceAction {
    action: String,
    time: String,
}

/// `spot/instance-action`: `{"action": "terminate", "time": "2017-09-18T08:22:00Z"}`.
pub fn spot(body: &str) -> Result<Notice, BodyError> {
    let err = |reason: String| BodyError {
        path: "spot/instance-action",
        reason,
    };
    let a: InstanceAction = serde_json::from_str(body).map_err(|e| err(e.to_string()))?;
    if !["terminate", "stop", "hibernate"].contains(&a.action.as_str()) {
        return Err(err(format!("unknown action {:?}", a.action)));
    }
    let deadline = humantime::parse_rfc3339_weak(a.time.trim_end_matches('Z'))
        .map_err(|e| err(format!("time {:?}: {e}", a.time)))?;
    Ok(Notice {
        id: format!("spot:{}:{}", a.action, a.time),
        kind: NoticeKind::Spot,
        deadline,
        detail: format!("Spot instance-action {} at {}", a.action, a.time),
        source: SourceKind::Imds,
    })
}

#[derive(Deserialize)]
struct Rebalance {
    #[serde(rename = "noticeTime")]
    notice_time: String,
}

/// `events/recommendations/rebalance`: `{"noticeTime": "2020-10-27T08:22:00Z"}`.
pub fn rebalance(body: &str) -> Result<Notice, BodyError> {
    let err = |reason: String| BodyError {
        path: "events/recommendations/rebalance",
        reason,
    };
    let r: Rebalance = serde_json::from_str(body).map_err(|e| err(e.to_string()))?;
    let at = humantime::parse_rfc3339_weak(r.notice_time.trim_end_matches('Z'))
        .map_err(|e| err(format!("noticeTime {:?}: {e}", r.notice_time)))?;
    Ok(Notice {
        id: format!("rebalance:{}", r.notice_time),
        kind: NoticeKind::Rebalance,
        deadline: at,
        detail: format!("rebalance recommendation at {}", r.notice_time),
        source: SourceKind::Imds,
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Scheduled {
    code: String,
    #[serde(default)]
    description: String,
    event_id: String,
    not_before: String,
    #[serde(default)]
    state: String,
}

/// Codes that end or interrupt the instance (system-maintenance is only "possible impact").
const ENDING_CODES: &[&str] = &[
    "instance-reboot",
    "system-reboot",
    "instance-stop",
    "instance-retirement",
];

/// `events/maintenance/scheduled`: an array; canceled and completed events are ignored.
pub fn scheduled(body: &str) -> Result<Vec<Notice>, BodyError> {
    let err = |reason: String| BodyError {
        path: "events/maintenance/scheduled",
        reason,
    };
    let events: Vec<Scheduled> = serde_json::from_str(body).map_err(|e| err(e.to_string()))?;
    let mut out = Vec::new();
    for e in events {
        if e.state == "canceled"
            || e.state == "completed"
            || !ENDING_CODES.contains(&e.code.as_str())
        {
            continue;
        }
        let deadline = parse_imds_time(&e.not_before).ok_or_else(|| {
            err(format!(
                "NotBefore {:?}: expected e.g. \"21 Jan 2019 09:00:43 GMT\"",
                e.not_before
            ))
        })?;
        out.push(Notice {
            id: format!("scheduled:{}:{}", e.event_id, e.not_before),
            kind: NoticeKind::ScheduledMaintenance,
            deadline,
            detail: format!(
                "{} ({}) not before {}: {}",
                e.code, e.event_id, e.not_before, e.description
            ),
            source: SourceKind::Imds,
        });
    }
    Ok(out)
}

/// `21 Jan 2019 09:00:43 GMT` (one- or two-digit day).
pub fn parse_imds_time(text: &str) -> Option<SystemTime> {
    let parts: Vec<&str> = text.split_whitespace().collect();
    let [day, month, year, time, "GMT"] = parts.as_slice() else {
        return None;
    };
    let day: u32 = day.parse().ok().filter(|d| (1..=31).contains(d))?;
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    .iter()
    .position(|m| m == month)? as u32
        + 1;
    let year: i64 = year.parse().ok().filter(|y| (1970..=9999).contains(y))?;
    let hms: Vec<u64> = time
        .split(':')
        .map(|p| p.parse().ok())
        .collect::<Option<_>>()?;
    let [h, m, s] = hms.as_slice() else {
        return None;
    };
    if *h > 23 || *m > 59 || *s > 60 {
        return None;
    }
    // Days since the epoch (Howard Hinnant's days_from_civil).
    let (y, mo) = if month <= 2 {
        (year - 1, month + 9)
    } else {
        (year, month - 3)
    };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * i64::from(mo) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = u64::try_from(era * 146_097 + doe - 719_468).ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(days * 86_400 + h * 3600 + m * 60 + s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spot_bodies() {
        let n = spot(r#"{"action": "terminate", "time": "2017-09-18T08:22:00Z"}"#).expect("parses");
        assert_eq!(n.id, "spot:terminate:2017-09-18T08:22:00Z");
        assert_eq!(
            crate::model::time::rfc3339(n.deadline),
            "2017-09-18T08:22:00Z"
        );
        assert!(spot(r#"{"action": "explode", "time": "2017-09-18T08:22:00Z"}"#).is_err());
        assert!(spot(r#"{"action": "stop", "time": "soon"}"#).is_err());
        assert!(spot("<html>").is_err());
    }

    #[test]
    fn rebalance_body() {
        let n = rebalance(r#"{"noticeTime": "2020-10-27T08:22:00Z"}"#).expect("parses");
        assert_eq!(n.kind, NoticeKind::Rebalance);
        assert!(rebalance("{}").is_err());
    }

    #[test]
    fn scheduled_events_keep_active_ending_ones() {
        let body = r#"[
          {"NotBefore": "21 Jan 2019 09:00:43 GMT", "Code": "system-reboot", "Description": "scheduled reboot",
           "EventId": "instance-event-0d59937288b749b32", "NotAfter": "21 Jan 2019 09:17:23 GMT", "State": "active"},
          {"NotBefore": "1 Feb 2019 09:00:43 GMT", "Code": "instance-stop", "Description": "stop",
           "EventId": "instance-event-1", "State": "active"},
          {"NotBefore": "21 Jan 2019 09:00:43 GMT", "Code": "system-reboot", "Description": "[Canceled] scheduled reboot",
           "EventId": "instance-event-2", "State": "canceled"},
          {"NotBefore": "21 Jan 2019 09:00:43 GMT", "Code": "system-maintenance", "Description": "network",
           "EventId": "instance-event-3", "State": "active"}
        ]"#;
        let n = scheduled(body).expect("parses");
        assert_eq!(n.len(), 2);
        assert_eq!(
            crate::model::time::rfc3339(n[0].deadline),
            "2019-01-21T09:00:43Z"
        );
        assert_eq!(
            crate::model::time::rfc3339(n[1].deadline),
            "2019-02-01T09:00:43Z"
        );
        assert!(scheduled("[]").expect("empty").is_empty());
        assert!(scheduled(
            r#"[{"NotBefore": "tomorrow", "Code": "system-reboot", "EventId": "e"}]"#
        )
        .is_err());
    }

    #[test]
    fn imds_time_format() {
        assert_eq!(
            parse_imds_time("1 Jan 1970 00:00:00 GMT"),
            Some(SystemTime::UNIX_EPOCH)
        );
        assert_eq!(
            parse_imds_time("29 Feb 2024 12:00:00 GMT")
                .map(crate::model::time::rfc3339)
                .as_deref(),
            Some("2024-02-29T12:00:00Z")
        );
        for bad in [
            "",
            "21 Jan 2019 09:00:43",
            "32 Jan 2019 09:00:43 GMT",
            "21 Foo 2019 09:00:43 GMT",
            "21 Jan 2019 25:00:43 GMT",
        ] {
            assert_eq!(parse_imds_time(bad), None, "{bad}");
        }
    }
}
