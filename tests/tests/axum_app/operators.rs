//! The operator routes: `GET /rate_limit`, and an admin's status, reset
//! and block of a user, over every plan's policy of a route; on memory and
//! on Redis alike.

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum_app::app;
use http::Request;
use tollgate::{BoxStore, FakeClock, MemoryStore, Timestamp};
use tollgate_redis::RedisStore;
use tollgate_tests::{require_redis, unique_prefix};
use tower::ServiceExt;

use super::flaky::Flaky;
use super::{T0, burst, config, json};

/// `GET /rate_limit` shows what the headers show, only user-keyed limits,
/// and changes nothing; an operator's reset lets a spent user in again,
/// with the admin token only.
async fn operators(store: BoxStore, clock: &FakeClock) -> Vec<serde_json::Value> {
    clock.set(Timestamp::from_secs(T0));
    let admin = axum_app::AdminToken::new("s3cret");
    let app = axum_app::app_with_admin(&config(), store, admin)
        .layer(MockConnectInfo(SocketAddr::from(([198, 51, 100, 9], 5555))));
    let (_, seen) = burst(&app, "/api/items", "ada", 3).await;
    assert_eq!(burst(&app, "/api/search", "ada", 1).await.0, 1);
    let shown = |user: &str| {
        Request::get("/rate_limit")
            .header("authorization", format!("Bearer demo-{user}"))
            .body(Body::empty())
            .unwrap()
    };
    let (status, first) = json(&app, shown("ada")).await;
    assert_eq!(status, 200);
    let items = &first["resources"]["items-read"];
    for field in ["limit", "remaining", "used", "reset"] {
        let header = seen.get(&format!("x-ratelimit-{field}")).unwrap();
        assert_eq!(items[field].to_string(), header, "{field}");
    }
    // `used` is limit - remaining, in the body as in the headers.
    let number = |name: &str| seen.get(name).unwrap().parse::<u64>().unwrap();
    assert_eq!(
        items["used"],
        number("x-ratelimit-limit") - number("x-ratelimit-remaining")
    );
    // Every limit of a policy with several: search's 2/s and 100/h, each
    // after the one search; the binding one (the 2/s) beside them, with
    // the policy's name as GitHub's `resource`.
    assert_eq!(
        first["resources"]["search"],
        serde_json::json!({
            "limit": 2,
            "remaining": 1,
            "used": 1,
            "reset": T0 + 1,
            "resource": "search",
            "limits": [
                { "rate": "2/s", "limit": 2, "remaining": 1, "used": 1, "reset": T0 + 1 },
                { "rate": "100/h", "limit": 100, "remaining": 99, "used": 1, "reset": T0 + 3_600 },
            ],
        })
    );
    // Every user-keyed policy of the free plan, and nothing keyed by IP.
    let mut names: Vec<&String> = first["resources"].as_object().unwrap().keys().collect();
    names.sort();
    let expected = [
        "completion-tokens",
        "export",
        "items-read",
        "items-write",
        "reports",
        "search",
    ];
    assert_eq!(names, expected);
    // GitHub's `rate` repeats the first resource: the file's first
    // user-keyed route.
    assert_eq!(first["rate"], first["resources"]["items-read"]);
    // A pro user sees the pro plan's policies where a route has them.
    let (_, pro) = json(&app, shown("pro-bob")).await;
    assert_eq!(pro["resources"]["items-read-pro"]["limit"], 40);
    assert!(pro["resources"].get("items-read").is_none());
    for _ in 0..100 {
        assert_eq!(json(&app, shown("ada")).await, (200, first.clone()));
    }
    // Spent: 5 exports of 10 from a bucket of 50.
    assert_eq!(burst(&app, "/api/export", "ada", 6).await.0, 5);
    let reset = |path: &str, token: Option<&str>| {
        let mut request = Request::delete(path);
        if let Some(token) = token {
            request = request.header("authorization", token);
        }
        request.body(Body::empty()).unwrap()
    };
    let ada = "/admin/rate_limit/export/ada";
    assert_eq!(json(&app, reset(ada, None)).await.0, 401);
    assert_eq!(json(&app, reset(ada, Some("Bearer demo-ada"))).await.0, 403);
    assert_eq!(json(&app, reset(ada, Some("Bearer s3cre"))).await.0, 403);
    assert_eq!(json(&app, reset(ada, Some("s3cret"))).await.0, 401);
    // The scheme's case does not matter (it was a 401).
    let lower = Request::get(ada).header("authorization", "bearer s3cret");
    assert_eq!(json(&app, lower.body(Body::empty()).unwrap()).await.0, 200);
    let unknown = "/admin/rate_limit/api-ip/ada";
    assert_eq!(
        json(&app, reset(unknown, Some("Bearer s3cret"))).await.0,
        404
    );
    // Still spent after every refusal.
    assert_eq!(burst(&app, "/api/export", "ada", 1).await.0, 0);
    assert_eq!(json(&app, reset(ada, Some("Bearer s3cret"))).await.0, 204);
    assert_eq!(burst(&app, "/api/export", "ada", 6).await.0, 5);
    let (_, after) = json(&app, shown("ada")).await;

    // Blocked for 90 s: denied with the rest of the block as Retry-After,
    // shown spent until it ends; then a fresh bucket.
    let block = |path: &str, token: &str| {
        Request::post(path)
            .header("authorization", token)
            .body(Body::empty())
            .unwrap()
    };
    let blocking = "/admin/rate_limit/export/ada/block?seconds=90";
    assert_eq!(json(&app, block(blocking, "Bearer nope")).await.0, 403);
    // A query is read only once the token is: no token is a 401 whatever
    // the query says (it was a 400 naming the missing field).
    for query in ["", "?seconds=x"] {
        let bare = Request::post(format!("/admin/rate_limit/export/ada/block{query}"));
        assert_eq!(json(&app, bare.body(Body::empty()).unwrap()).await.0, 401);
        let put = Request::put(format!("/admin/rate_limit/export/ada/override{query}"));
        assert_eq!(
            json(&app, put.body(Body::from("deny")).unwrap()).await.0,
            401
        );
    }
    let no_seconds = "/admin/rate_limit/export/ada/block";
    assert_eq!(json(&app, block(no_seconds, "Bearer s3cret")).await.0, 400);
    // A block, or an override, of no time is refused (a block of 0 s
    // forgot the user's use, as a reset does, and answered 204).
    let no_time = "/admin/rate_limit/export/ada/block?seconds=0";
    assert_eq!(json(&app, block(no_time, "Bearer s3cret")).await.0, 400);
    let mut instant = as_admin("PUT", "/admin/rate_limit/export/ada/override?seconds=0");
    *instant.body_mut() = Body::from("deny");
    assert_eq!(json(&app, instant).await.0, 400);
    assert_eq!(json(&app, block(blocking, "Bearer s3cret")).await.0, 204);
    let (admitted, denied) = burst(&app, "/api/export", "ada", 1).await;
    assert_eq!((admitted, denied.get("retry-after")), (0, Some("90")));
    clock.advance(Duration::from_secs(30));
    let (_, denied) = burst(&app, "/api/export", "ada", 1).await;
    assert_eq!(denied.get("retry-after"), Some("60"));
    let (_, blocked) = json(&app, shown("ada")).await;
    let export = &blocked["resources"]["export"];
    assert_eq!(export["remaining"], 0);
    assert_eq!(export["reset"], T0 + 90);
    clock.advance(Duration::from_secs(60));
    assert_eq!(burst(&app, "/api/export", "ada", 6).await.0, 5);
    vec![first, pro, after, blocked]
}

/// An operator's block, reset and status of a user on a route cover every
/// plan's policy of the route (its `PolicyFamily`): blocked as `export/bob`,
/// bob is blocked on the pro plan too; a plan's policy named directly is
/// that policy alone.
async fn families(store: BoxStore, clock: &FakeClock) -> Vec<serde_json::Value> {
    clock.set(Timestamp::from_secs(T0));
    let admin = axum_app::AdminToken::new("s3cret");
    let app = axum_app::app_with_admin(&config(), store, admin).layer(MockConnectInfo(
        SocketAddr::from(([198, 51, 100, 11], 5555)),
    ));
    let shown = |user: &str| {
        Request::get("/rate_limit")
            .header("authorization", format!("Bearer demo-{user}"))
            .body(Body::empty())
            .unwrap()
    };
    let remaining =
        |v: &serde_json::Value, policy: &str| v["resources"][policy]["remaining"].clone();
    let mut out = Vec::new();

    // Bob spends on both plans: 1 export of 10 on free (40 of 50 left),
    // 2 of 5 on pro (190 of 200 left). (The responses' headers show the
    // per-IP limit, the tightest; the admin status shows each policy.)
    assert_eq!(burst(&app, "/api/export", "bob", 1).await.0, 1);
    assert_eq!(burst(&app, "/api/export", "pro-bob", 2).await.0, 2);
    let (status, before) = json(&app, as_admin("GET", "/admin/rate_limit/export/bob")).await;
    assert_eq!(status, 200);
    let names: Vec<&String> = before["resources"].as_object().unwrap().keys().collect();
    assert_eq!(names, ["export", "export-pro"]);
    assert_eq!(remaining(&before, "export"), 40);
    assert_eq!(remaining(&before, "export-pro"), 190);
    out.push(before);

    // Reset `export/bob`: both plans' state is forgotten.
    assert_eq!(
        json(&app, as_admin("DELETE", "/admin/rate_limit/export/bob"))
            .await
            .0,
        204
    );
    let (_, reset) = json(&app, as_admin("GET", "/admin/rate_limit/export/bob")).await;
    assert_eq!(remaining(&reset, "export"), 50);
    assert_eq!(remaining(&reset, "export-pro"), 200);
    out.push(reset);

    // Block `export/bob` for 90 s: on the pro plan too, with the rest of
    // the block as Retry-After.
    let blocking = "/admin/rate_limit/export/bob/block?seconds=90";
    assert_eq!(json(&app, as_admin("POST", blocking)).await.0, 204);
    let (admitted, denied) = burst(&app, "/api/export", "pro-bob", 1).await;
    assert_eq!((admitted, denied.status), (0, 429));
    assert_eq!(denied.get("retry-after"), Some("90"));
    assert_eq!(denied.get("x-ratelimit-resource"), Some("export-pro"));
    let (admitted, denied) = burst(&app, "/api/export", "bob", 1).await;
    assert_eq!((admitted, denied.get("retry-after")), (0, Some("90")));
    clock.advance(Duration::from_secs(30));
    let (_, denied) = burst(&app, "/api/export", "pro-bob", 1).await;
    assert_eq!(denied.get("retry-after"), Some("60"));
    // `/rate_limit` shows a pro user the pro policy's limits, blocked.
    let (_, pro) = json(&app, shown("pro-bob")).await;
    let export = &pro["resources"]["export-pro"];
    assert_eq!(
        (&export["limit"], &export["remaining"], &export["reset"]),
        (&200.into(), &0.into(), &(T0 + 90).into())
    );
    assert_eq!(export["limits"][0]["rate"], "200/h");
    assert!(pro["resources"].get("export").is_none());
    let (_, blocked) = json(&app, as_admin("GET", "/admin/rate_limit/export/bob")).await;
    for policy in ["export", "export-pro"] {
        assert_eq!(remaining(&blocked, policy), 0, "{policy}");
        assert_eq!(blocked["resources"][policy]["reset"], T0 + 90, "{policy}");
    }
    out.push(pro);
    out.push(blocked);
    // A reset of the route lifts the block on every plan.
    assert_eq!(
        json(&app, as_admin("DELETE", "/admin/rate_limit/export/bob"))
            .await
            .0,
        204
    );
    assert_eq!(burst(&app, "/api/export", "pro-bob", 1).await.0, 1);
    let (_, after) = json(&app, as_admin("GET", "/admin/rate_limit/export/bob")).await;
    assert_eq!(remaining(&after, "export"), 50);
    assert_eq!(remaining(&after, "export-pro"), 195);
    assert_eq!(burst(&app, "/api/export", "bob", 6).await.0, 5);

    // A plan's policy named directly is that policy alone, as before.
    let blocking = "/admin/rate_limit/export-pro/cleo/block?seconds=60";
    assert_eq!(json(&app, as_admin("POST", blocking)).await.0, 204);
    let (_, denied) = burst(&app, "/api/export", "pro-cleo", 1).await;
    assert_eq!(
        (denied.status, denied.get("retry-after")),
        (429, Some("60"))
    );
    assert_eq!(burst(&app, "/api/export", "cleo", 1).await.0, 1);
    let (_, cleo) = json(&app, as_admin("GET", "/admin/rate_limit/export-pro/cleo")).await;
    let names: Vec<&String> = cleo["resources"].as_object().unwrap().keys().collect();
    assert_eq!(names, ["export-pro"]);
    // Status is for operators only, and for user-keyed policies of the file.
    let unauthenticated = Request::get("/admin/rate_limit/export/bob")
        .body(Body::empty())
        .unwrap();
    assert_eq!(json(&app, unauthenticated).await.0, 401);
    assert_eq!(
        json(&app, as_admin("GET", "/admin/rate_limit/api-ip/bob"))
            .await
            .0,
        404
    );
    out.push(cleo);
    out
}

#[tokio::test]
async fn operators_cover_every_plan_on_memory_and_the_same_on_redis() {
    let clock = FakeClock::default();
    let memory = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let on_memory = families(BoxStore::with_slots(memory), &clock).await;

    let url = require_redis().await;
    let redis = RedisStore::builder()
        .prefix(unique_prefix("app-family"))
        .deadline(Duration::from_secs(5))
        .test_clock(clock.clone())
        .connect(url.as_str())
        .await
        .unwrap();
    let on_redis = families(BoxStore::with_slots(redis), &clock).await;
    assert_eq!(on_memory, on_redis);
}

/// An admin's status of a user with limits of their own (an override
/// adding a daily limit to `search`'s 2/s and 100/h) shows them, and
/// leaves the user's use under them as it was: read under the plan's
/// limits, the daily limit was carried away and the user's next search
/// found a fresh day. A reset goes under them too.
async fn own_limits(store: BoxStore, clock: &FakeClock) -> Vec<serde_json::Value> {
    clock.set(Timestamp::from_secs(T0));
    let admin = axum_app::AdminToken::new("s3cret");
    let app = axum_app::app_with_admin(&config(), store, admin).layer(MockConnectInfo(
        SocketAddr::from(([198, 51, 100, 11], 5555)),
    ));
    let mut request = as_admin("PUT", "/admin/rate_limit/search/dora/override");
    *request.body_mut() = Body::from("2/s 100/h 4/day");
    assert_eq!(json(&app, request).await.0, 204);
    for _ in 0..4 {
        assert_eq!(burst(&app, "/api/search", "dora", 1).await.0, 1);
        clock.advance(Duration::from_secs(1));
    }
    let (admitted, denied) = burst(&app, "/api/search", "dora", 1).await;
    assert_eq!((admitted, denied.get("x-ratelimit-limit")), (0, Some("4")));
    let mut out = Vec::new();
    let (status, shown) = json(&app, as_admin("GET", "/admin/rate_limit/search/dora")).await;
    assert_eq!(status, 200);
    let search = &shown["resources"]["search"];
    assert_eq!(
        (&search["limit"], &search["remaining"]),
        (&4.into(), &0.into())
    );
    assert_eq!(search["limits"][2]["rate"], "4/day");
    out.push(shown);
    clock.advance(Duration::from_secs(1));
    let (admitted, denied) = burst(&app, "/api/search", "dora", 1).await;
    assert_eq!((admitted, denied.get("x-ratelimit-limit")), (0, Some("4")));
    // A reset lets her in again, and a status does not spend.
    let reset = as_admin("DELETE", "/admin/rate_limit/search/dora");
    assert_eq!(json(&app, reset).await.0, 204);
    let (_, fresh) = json(&app, as_admin("GET", "/admin/rate_limit/search/dora")).await;
    assert_eq!(fresh["resources"]["search"]["remaining"], 2);
    out.push(fresh);
    assert_eq!(burst(&app, "/api/search", "dora", 1).await.0, 1);
    out
}

#[tokio::test]
async fn an_admin_status_of_a_user_with_own_limits_keeps_their_use_on_memory_and_redis() {
    let clock = FakeClock::default();
    let memory = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let on_memory = own_limits(BoxStore::with_slots(memory), &clock).await;

    let url = require_redis().await;
    let redis = RedisStore::builder()
        .prefix(unique_prefix("app-own-limits"))
        .deadline(Duration::from_secs(5))
        .test_clock(clock.clone())
        .connect(url.as_str())
        .await
        .unwrap();
    let on_redis = own_limits(BoxStore::with_slots(redis), &clock).await;
    assert_eq!(on_memory, on_redis);
}

#[tokio::test]
async fn without_an_admin_token_the_admin_routes_do_not_exist() {
    let app = app(&config(), BoxStore::with_slots(MemoryStore::new()));
    let request = Request::delete("/admin/rate_limit/export/ada")
        .header("authorization", "Bearer anything")
        .body(Body::empty())
        .unwrap();
    assert_eq!(app.oneshot(request).await.unwrap().status(), 404);
}

#[tokio::test]
async fn rate_limit_and_operator_reset_on_memory_and_the_same_on_redis() {
    let clock = FakeClock::default();
    let memory = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let on_memory = operators(BoxStore::with_slots(memory), &clock).await;

    let url = require_redis().await;
    let redis = RedisStore::builder()
        .prefix(unique_prefix("app-ops"))
        .deadline(Duration::from_secs(5))
        .test_clock(clock.clone())
        .connect(url.as_str())
        .await
        .unwrap();
    let on_redis = operators(BoxStore::with_slots(redis), &clock).await;
    assert_eq!(on_memory, on_redis);
}

/// A request of an admin route, with the admin token of these tests.
fn as_admin(method: &str, path: &str) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri(path)
        .header("authorization", "Bearer s3cret")
        .body(Body::empty())
        .unwrap()
}

/// An operator's block holds on the app server that made it through an
/// outage of the store: it reaches the local fallback the layers decide
/// with while the store fails (`failure = "local"`; the store's checks
/// time out meanwhile, its blocks and resets do not fail). It went to the store
/// alone, and the fallback admitted the blocked user from a fresh quota.
/// A reset lifts it there too.
#[tokio::test]
async fn an_operators_block_holds_through_an_outage_and_a_reset_lifts_it() {
    let store = Flaky::new(MemoryStore::new());
    let admin = axum_app::AdminToken::new("s3cret");
    let app = axum_app::app_with_admin(&config(), BoxStore::new(store.clone()), admin).layer(
        MockConnectInfo(SocketAddr::from(([198, 51, 100, 10], 5555))),
    );
    // Unique users: the fallback is the process's, shared by every test.
    let (user, other) = ("blocked-in-outage", "free-in-outage");
    let blocking = format!("/admin/rate_limit/items-read/{user}/block?seconds=3600");
    assert_eq!(json(&app, as_admin("POST", &blocking)).await.0, 204);

    store.fail(true);
    let (admitted, denied) = burst(&app, "/api/items", user, 3).await;
    assert_eq!((admitted, denied.status), (0, 429));
    let retry: u64 = denied.get("retry-after").unwrap().parse().unwrap();
    assert!((3_590..=3_600).contains(&retry), "{retry}");
    // Other users are decided by the fallback as before.
    assert_eq!(burst(&app, "/api/items", other, 3).await.0, 3);

    store.fail(false);
    let lifting = format!("/admin/rate_limit/items-read/{user}");
    assert_eq!(json(&app, as_admin("DELETE", &lifting)).await.0, 204);
    store.fail(true);
    assert_eq!(burst(&app, "/api/items", user, 3).await.0, 3);
}

/// An operator's override whose limits hold less than a request of the
/// route costs is refused with 400, as the policy file refuses such
/// limits: `export` costs 10 on the free plan, so `5/h` would admit no
/// export of olga's again (it was taken with 204, and every export of hers
/// refused for good). The plan's policy named alone costs 5. A body too
/// long or not UTF-8 says so (it read as an empty override).
#[tokio::test]
async fn an_override_that_holds_less_than_a_request_costs_is_refused() {
    let admin = axum_app::AdminToken::new("s3cret");
    let app =
        axum_app::app_with_admin(&config(), BoxStore::with_slots(MemoryStore::new()), admin).layer(
            MockConnectInfo(SocketAddr::from(([198, 51, 100, 11], 5555))),
        );
    let set = |policy: &str, body: Body| {
        let mut request = as_admin("PUT", &format!("/admin/rate_limit/{policy}/olga/override"));
        *request.body_mut() = body;
        request
    };
    let status =
        async |request: Request<Body>| app.clone().oneshot(request).await.unwrap().status();
    assert_eq!(status(set("export", "5/h".into())).await, 400);
    assert_eq!(status(set("export", "100/h burst 9".into())).await, 400);
    assert_eq!(burst(&app, "/api/export", "olga", 6).await.0, 5);
    assert_eq!(status(set("export-pro", "5/h".into())).await, 204);
    assert_eq!(status(set("export", "10/h".into())).await, 204);
    assert_eq!(status(set("export", "x".repeat(2_000).into())).await, 400);
    assert_eq!(status(set("export", vec![0xff, 0xfe].into())).await, 400);
}
