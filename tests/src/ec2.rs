//! A test EC2 API endpoint for the three query actions the agent calls, answering in EC2's
//! XML: requests must be SigV4-signed form posts; `DescribeInstances`,
//! `DescribeCapacityReservations` and `DescribeCapacityBlocks` answer from the state; a
//! denied action answers 403 `UnauthorizedOperation` in EC2's error shape.

use std::sync::{Arc, Mutex};

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::Request;

use crate::http::{respond, Server};

/// What the endpoint holds.
#[derive(Debug, Default)]
pub struct Ec2State {
    /// The instance's Capacity Reservation, if any.
    pub reservation_id: Option<String>,
    /// The reservation's type (`capacity-block` or `default`) and `EndDate` (RFC 3339).
    pub reservation: Option<(String, String)>,
    /// The reservation's Capacity Block id, and its `UltraserverType` where it is an
    /// UltraServer block (`u-p6e-gb200x72`).
    pub capacity_block: Option<(String, Option<String>)>,
    /// The instance's network interfaces of type `efa` (the rest of its interfaces are
    /// `interface`, ENA only).
    pub efa_interfaces: u32,
    /// Actions answered with `UnauthorizedOperation`.
    pub denied: Vec<String>,
    /// Actions whose requests are read and never answered (an endpoint that hangs).
    pub stalled: Vec<String>,
    /// Actions received.
    pub actions: Vec<String>,
}

/// A running test EC2 endpoint.
#[derive(Debug)]
pub struct FakeEc2 {
    /// Shared state.
    pub state: Arc<Mutex<Ec2State>>,
    server: Server,
}

impl FakeEc2 {
    /// Start on a free loopback port.
    pub fn start() -> Self {
        let (state, server) = crate::http::start_with_state(handle);
        Self { state, server }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.server.addr)
    }
}

const NS: &str = "http://ec2.amazonaws.com/doc/2016-11-15/";

fn error(
    status: u16,
    code: &str,
    message: &str,
) -> hyper::Response<http_body_util::Full<hyper::body::Bytes>> {
    respond(
        status,
        "text/xml;charset=UTF-8",
        format!("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error></Errors><RequestID>5b6fe5a4-0a4c-4f2c-9f43-0c1f5b2e7a10</RequestID></Response>"),
    )
}

async fn handle(
    req: Request<Incoming>,
    state: Arc<Mutex<Ec2State>>,
) -> hyper::Response<http_body_util::Full<hyper::body::Bytes>> {
    let signed = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.starts_with("AWS4-HMAC-SHA256 Credential="));
    let form = req
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("application/x-www-form-urlencoded"));
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let body = String::from_utf8_lossy(&body).into_owned();
    if !signed {
        return error(
            401,
            "AuthFailure",
            "AWS was not able to validate the provided access credentials",
        );
    }
    if !form {
        return error(
            400,
            "InvalidParameterValue",
            "expected a form-encoded query request",
        );
    }
    let param = |name: &str| {
        body.split('&')
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .map(str::to_string)
    };
    let action = param("Action").unwrap_or_default();
    let stalled = {
        let mut s = state.lock().expect("state");
        s.actions.push(action.clone());
        s.stalled.contains(&action)
    };
    if stalled {
        tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
    }
    let s = state.lock().expect("state");
    if s.denied.contains(&action) {
        return error(
            403,
            "UnauthorizedOperation",
            "You are not authorized to perform this operation.",
        );
    }
    match action.as_str() {
        "DescribeInstances" => {
            let id = param("InstanceId.1").unwrap_or_default();
            let cr = s.reservation_id.as_ref().map_or(String::new(), |cr| format!("<capacityReservationId>{cr}</capacityReservationId><instanceLifecycle>capacity-block</instanceLifecycle>"));
            // The primary ENA interface, then the EFA ones, one per network card.
            let interfaces: String = std::iter::once(("interface", 0))
                .chain((1..=s.efa_interfaces).map(|card| ("efa", card)))
                .map(|(kind, card)| format!("<item><networkInterfaceId>eni-{card:017x}</networkInterfaceId><status>in-use</status><interfaceType>{kind}</interfaceType><attachment><deviceIndex>{}</deviceIndex><networkCardIndex>{card}</networkCardIndex><status>attached</status></attachment></item>", u32::from(card > 0)))
                .collect();
            let cr = format!("{cr}<networkInterfaceSet>{interfaces}</networkInterfaceSet>");
            respond(200, "text/xml;charset=UTF-8", format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<DescribeInstancesResponse xmlns=\"{NS}\"><requestId>8f7724cf-496f-496e-8fe3-example</requestId><reservationSet><item><reservationId>r-1234567890abcdef0</reservationId><ownerId>123456789012</ownerId><instancesSet><item><instanceId>{id}</instanceId><instanceType>p5.48xlarge</instanceType>{cr}</item></instancesSet></item></reservationSet></DescribeInstancesResponse>"
            ))
        }
        "DescribeCapacityReservations" => {
            let id = param("CapacityReservationId.1").unwrap_or_default();
            let item = match (&s.reservation_id, &s.reservation) {
                (Some(cr), Some((kind, end))) if *cr == id => format!(
                    "<item><capacityReservationId>{cr}</capacityReservationId><instanceType>p5.48xlarge</instanceType><reservationType>{kind}</reservationType><endDate>{end}</endDate><state>active</state>{}</item>",
                    s.capacity_block.as_ref().map_or(String::new(), |(block, _)| format!("<capacityBlockId>{block}</capacityBlockId>"))
                ),
                _ => String::new(),
            };
            respond(200, "text/xml;charset=UTF-8", format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<DescribeCapacityReservationsResponse xmlns=\"{NS}\"><requestId>2e8a-example</requestId><capacityReservationSet>{item}</capacityReservationSet></DescribeCapacityReservationsResponse>"
            ))
        }
        "DescribeCapacityBlocks" => {
            let id = param("CapacityBlockId.1").unwrap_or_default();
            let item = match (&s.capacity_block, &s.reservation_id, &s.reservation) {
                (Some((block, ultraserver)), Some(cr), Some((_, end))) if *block == id => format!(
                    "<item><capacityBlockId>{block}</capacityBlockId>{}<availabilityZone>us-west-2a</availabilityZone><capacityReservationIdSet><item>{cr}</item></capacityReservationIdSet><endDate>{end}</endDate><state>active</state></item>",
                    ultraserver.as_ref().map_or(String::new(), |u| format!("<ultraserverType>{u}</ultraserverType>"))
                ),
                _ => String::new(),
            };
            respond(200, "text/xml;charset=UTF-8", format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<DescribeCapacityBlocksResponse xmlns=\"{NS}\"><requestId>7c1a-example</requestId><capacityBlockSet>{item}</capacityBlockSet></DescribeCapacityBlocksResponse>"
            ))
        }
        other => error(
            400,
            "InvalidAction",
            &format!("The action {other} is not valid for this web service."),
        ),
    }
}
