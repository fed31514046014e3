//! EC2 API answers (EC2's query protocol: XML bodies) for the Capacity Block lookup: the
//! input, split at the first NUL, is the DescribeInstances answer and the
//! DescribeCapacityReservations answer. They go through aws-sdk-ec2's real deserializers (an
//! in-process HTTP client answers each request; nothing leaves the process) and then through
//! what the agent takes from them (`capacity_block::notice_for`).
#![no_main]

use std::sync::{Arc, Mutex, OnceLock};

use aws_sdk_ec2::config::{BehaviorVersion, Credentials, Region};
use aws_smithy_http_client::test_util::infallible_client_fn;
use aws_smithy_types::body::SdkBody;
use aws_smithy_types::retry::RetryConfig;
use gpu_agent::sources::capacity_block;
use libfuzzer_sys::fuzz_target;

type Answers = Arc<Mutex<(Vec<u8>, Vec<u8>)>>;

fn setup() -> &'static (tokio::runtime::Runtime, aws_sdk_ec2::Client, Answers) {
    static SETUP: OnceLock<(tokio::runtime::Runtime, aws_sdk_ec2::Client, Answers)> =
        OnceLock::new();
    SETUP.get_or_init(|| {
        let answers: Answers = Arc::default();
        let bodies = Arc::clone(&answers);
        let http = infallible_client_fn(move |req: http::Request<SdkBody>| {
            let form = req.body().bytes().unwrap_or_default();
            let (instances, reservations) = bodies.lock().expect("answers").clone();
            let body = if form.windows(17).any(|w| w == b"DescribeInstances") {
                instances
            } else {
                reservations
            };
            http::Response::builder()
                .status(200)
                .header("content-type", "text/xml;charset=UTF-8")
                .body(SdkBody::from(body))
                .expect("response")
        });
        let config = aws_sdk_ec2::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-west-2"))
            .credentials_provider(Credentials::new(
                "AKIDEXAMPLE",
                "secret",
                None,
                None,
                "fuzz",
            ))
            .endpoint_url("http://127.0.0.1:9")
            .retry_config(RetryConfig::disabled())
            .http_client(http)
            .build();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        (runtime, aws_sdk_ec2::Client::from_conf(config), answers)
    })
}

fuzz_target!(|data: &[u8]| {
    let (runtime, client, answers) = setup();
    let mut halves = data.splitn(2, |b| *b == 0);
    *answers.lock().expect("answers") = (
        halves.next().unwrap_or_default().to_vec(),
        halves.next().unwrap_or_default().to_vec(),
    );
    let _ = runtime.block_on(capacity_block::notice_for(client, "i-0123456789abcdef0"));
});
