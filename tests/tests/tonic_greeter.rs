//! A real Tonic client against the limited greeter over TCP.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpListener;
use tollgate::{FakeClock, HeaderKey, MemoryStore, PeerIp, Timestamp};
use tonic::Code;
use tonic_greeter::{GreeterClient, GreeterKey, HelloRequest, default_policy, serve};
use tonic_types::StatusExt;

async fn start(key: GreeterKey) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let clock = FakeClock::new(Timestamp::from_secs(1_700_000_040));
    let store = MemoryStore::builder().clock(clock).build().unwrap();
    tokio::spawn(serve(listener, default_policy().unwrap(), key, store));
    addr
}

fn hello(name: &str, api_key: Option<&str>) -> tonic::Request<HelloRequest> {
    let mut request = tonic::Request::new(HelloRequest {
        name: name.to_owned(),
    });
    if let Some(k) = api_key {
        request
            .metadata_mut()
            .insert("x-api-key", k.parse().unwrap());
    }
    request
}

#[tokio::test]
async fn the_eleventh_call_from_a_peer_is_resource_exhausted() {
    let addr = start(GreeterKey::Peer(PeerIp::new())).await;
    let mut client = GreeterClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    for i in 0..10u64 {
        let reply = client.say_hello(hello("ada", None)).await.unwrap();
        assert_eq!(reply.get_ref().message, "Hello ada!");
        assert_eq!(
            reply.metadata().get("x-ratelimit-remaining").unwrap(),
            &(9 - i).to_string()
        );
    }
    let status = client.say_hello(hello("ada", None)).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(status.message(), "limit 'greeter' exceeded, retry in 66 s");
    let md = status.metadata();
    assert_eq!(md.get("x-ratelimit-limit").unwrap(), "10");
    assert_eq!(md.get("x-ratelimit-remaining").unwrap(), "0");
    assert_eq!(md.get("x-ratelimit-resource").unwrap(), "greeter");
    // Sliding window: the 10 weigh 10 * (60 - e) / 60 in the next minute;
    // an 11th fits once that is at most 9, 6 s into it.
    assert_eq!(md.get("retry-after").unwrap(), "66");
    // The same wait as gRFC A6's pushback and as google.rpc.RetryInfo,
    // read by tonic's client and tonic-types.
    assert_eq!(md.get("grpc-retry-pushback-ms").unwrap(), "66000");
    let retry = status.get_details_retry_info().unwrap();
    assert_eq!(retry.retry_delay, Some(Duration::from_secs(66)));
    // The limit that fired: a google.rpc.QuotaFailure naming the policy
    // and its limit, and the same in the metadata.
    let failure = status.get_details_quota_failure().unwrap();
    assert_eq!(failure.violations.len(), 1);
    assert_eq!(failure.violations[0].subject, "greeter");
    assert_eq!(failure.violations[0].description, "limit 10/min exceeded");
    assert_eq!(
        md.get("tollgate-exceeded").unwrap(),
        "greeter; limit=10/min"
    );
}

#[tokio::test]
async fn keyed_by_metadata_each_api_key_has_its_own_limit() {
    let key = GreeterKey::Metadata(HeaderKey::new(http::HeaderName::from_static("x-api-key")));
    let addr = start(key).await;
    let mut client = GreeterClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    for _ in 0..10 {
        client.say_hello(hello("a", Some("key-a"))).await.unwrap();
    }
    assert_eq!(
        client
            .say_hello(hello("a", Some("key-a")))
            .await
            .unwrap_err()
            .code(),
        Code::ResourceExhausted
    );
    client.say_hello(hello("b", Some("key-b"))).await.unwrap();
    // No key at all: the client's mistake, INVALID_ARGUMENT naming the
    // metadata, never a shared bucket.
    let missing = client.say_hello(hello("c", None)).await.unwrap_err();
    assert_eq!(missing.code(), Code::InvalidArgument);
    assert!(missing.message().contains("x-api-key"), "{missing:?}");
}

#[tokio::test]
async fn a_denial_carries_the_exact_wait_as_pushback_and_retry_info() {
    // 7 a second: the wait after a burst is no whole number of milliseconds.
    let policy = tollgate::Policy::new("greeter", tollgate::Algorithm::Gcra, "7/s").unwrap();
    let now = Timestamp::from_secs(1_700_000_040);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let store = MemoryStore::builder()
        .clock(FakeClock::new(now))
        .build()
        .unwrap();
    let key = GreeterKey::Peer(PeerIp::new());
    tokio::spawn(serve(listener, policy.clone(), key, store));
    let mut client = GreeterClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    // The reference decides the same eight requests at the same time.
    let mut reference = tollgate_core::state::PolicyState::new(&policy, now);
    for _ in 0..7 {
        assert!(reference.decide(&policy, now, 1).is_allowed());
        client.say_hello(hello("ada", None)).await.unwrap();
    }
    let wait = reference.decide(&policy, now, 1).retry_after().unwrap();
    assert_ne!(wait.subsec_micros() % 1_000, 0, "{wait:?}");
    let status = client.say_hello(hello("ada", None)).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    let pushback = status.metadata().get("grpc-retry-pushback-ms").unwrap();
    assert_eq!(
        pushback.to_str().unwrap(),
        wait.as_micros().div_ceil(1_000).to_string()
    );
    let retry = status.get_details_retry_info().unwrap();
    assert_eq!(retry.retry_delay, Some(wait));
}
