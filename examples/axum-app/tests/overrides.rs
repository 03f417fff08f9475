//! The demo's override endpoints, two instances on one Redis: an override
//! set by `PUT /admin/rate_limit/{policy}/{user}/override` on instance A
//! changes the next response's `x-ratelimit-limit` on instance B within
//! 1 s, and what B's `/rate_limit` shows; `DELETE` of it restores the plan there; a bad override is a 400
//! naming the problem, and the routes want the admin token.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum_app::{AdminToken, AppConfig, AppOverrides, app_with_overrides};
use http::{Request, StatusCode};
use tollgate::BoxStore;
use tollgate_redis::{RedisOverrides, RedisStore};
use tower::ServiceExt;

const TOKEN: &str = "s3cret";

fn config() -> AppConfig {
    AppConfig::parse(
        "[[route]]\nmethod = \"GET\"\npath = \"/api/items\"\nname = \"items\"\n\
         key = \"user\"\nalgorithm = \"token_bucket\"\nlimits = [\"10/h\"]\n",
    )
    .unwrap()
}

/// One instance of the demo on the Redis at `REDIS_URL` (or the local
/// one), under `prefix`.
async fn instance(prefix: &str) -> Router {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let store = RedisStore::builder()
        .prefix(prefix)
        .connect(url.as_str())
        .await
        .unwrap();
    // Kept a minute after the test, not the default 30 days.
    let overrides = RedisOverrides::builder()
        .retention(Duration::from_secs(60))
        .start(&store)
        .await
        .unwrap();
    let admin = AdminToken::new(TOKEN);
    let app = app_with_overrides(
        &config(),
        BoxStore::with_slots(store),
        admin,
        AppOverrides::Redis(overrides),
    );
    app.layer(MockConnectInfo(SocketAddr::from(([127, 0, 0, 1], 4000))))
}

/// `GET /api/items` as `user`: status and `x-ratelimit-limit`.
async fn items(app: &Router, user: &str) -> (StatusCode, String) {
    let request = Request::get("/api/items")
        .header("authorization", format!("Bearer demo-{user}"))
        .body(Body::empty())
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let limit = response.headers().get("x-ratelimit-limit");
    let limit = limit.map_or(String::new(), |v| v.to_str().unwrap().to_owned());
    (response.status(), limit)
}

async fn admin(app: &Router, method: &str, path: &str, body: &str, token: &str) -> StatusCode {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("authorization", format!("Bearer {token}"))
        .body(Body::from(body.to_owned()))
        .unwrap();
    app.clone().oneshot(request).await.unwrap().status()
}

/// Asks B every 10 ms until `ada`'s limit there is `limit`: how long it
/// took, and how many requests it made.
async fn until_limit(b: &Router, limit: &str) -> (Duration, u64) {
    let start = Instant::now();
    let mut made = 0;
    loop {
        made += 1;
        if items(b, "ada").await.1 == limit {
            return (start.elapsed(), made);
        }
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "limit never {limit}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn an_override_set_on_instance_a_changes_the_limit_on_instance_b() {
    let nanos = std::time::SystemTime::UNIX_EPOCH
        .elapsed()
        .unwrap()
        .as_nanos();
    let prefix = format!("tgtest-demo-overrides-{}-{nanos}", std::process::id());
    let (a, b) = (instance(&prefix).await, instance(&prefix).await);
    assert_eq!(items(&b, "ada").await, (StatusCode::OK, "10".into()));

    let path = "/admin/rate_limit/items/ada/override";
    assert_eq!(
        admin(&a, "PUT", path, "1000/h", "wrong").await,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        admin(&a, "PUT", path, "often", TOKEN).await,
        StatusCode::BAD_REQUEST
    );
    let unknown = "/admin/rate_limit/nope/ada/override";
    assert_eq!(
        admin(&a, "PUT", unknown, "1000/h", TOKEN).await,
        StatusCode::NOT_FOUND
    );

    assert_eq!(
        admin(&a, "PUT", path, "1000/h", TOKEN).await,
        StatusCode::NO_CONTENT
    );
    let (took, made) = until_limit(&b, "1000").await;
    println!("override applied on B after {took:?}");
    assert!(took <= Duration::from_secs(1), "took {took:?}");
    assert_eq!(items(&b, "bob").await.1, "10");
    // `/rate_limit` on B shows ada's own limit, and her use under it.
    let request = Request::get("/rate_limit")
        .header("authorization", "Bearer demo-ada")
        .body(Body::empty())
        .unwrap();
    let shown = b.clone().oneshot(request).await.unwrap();
    let body = http_body_util::BodyExt::collect(shown.into_body())
        .await
        .unwrap();
    let json: serde_json::Value = serde_json::from_slice(&body.to_bytes()).unwrap();
    assert_eq!(json["resources"]["items"]["limit"], 1000);
    // What she used under the plan (her first request and those before B
    // applied the override, up to the plan's 10), and the one after.
    assert_eq!(json["resources"]["items"]["used"], made.min(10) + 1);

    // Denied, for a minute: 403 on B.
    let deny = format!("{path}?seconds=60");
    assert_eq!(
        admin(&a, "PUT", &deny, "deny", TOKEN).await,
        StatusCode::NO_CONTENT
    );
    let start = Instant::now();
    while items(&b, "ada").await.0 != StatusCode::FORBIDDEN {
        assert!(start.elapsed() < Duration::from_secs(1), "deny not applied");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    assert_eq!(
        admin(&a, "DELETE", path, "", TOKEN).await,
        StatusCode::NO_CONTENT
    );
    let (took, _) = until_limit(&b, "10").await;
    assert!(took <= Duration::from_secs(1), "took {took:?}");
}
