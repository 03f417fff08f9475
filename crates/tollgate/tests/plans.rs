//! Plan maps: a request's plan mapped to its policy, checked when built;
//! the ready-made `GET /rate_limit`; an operator's block, reset and status
//! over every plan of a route.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
#![cfg(feature = "axum")] // RateLimitStatus

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{Request, Response, StatusCode};
use tollgate::{
    Algorithm, Choice, ConfigError, Decision, ExtensionKey, FakeClock, Key, MemoryStore,
    PlanExtension, PlanMap, Policy, RateLimitLayer, RateLimitReport, RateLimitStatus, Settlement,
    Store, StoreError, Timestamp, ToKey,
};
use tower::ServiceExt;

/// 10:00:40 UTC on 2023-11-14; a whole minute.
const T0: u64 = 1_700_000_040;

/// The plan an auth layer puts into a request.
#[derive(Clone)]
struct Plan(&'static str);

impl AsRef<str> for Plan {
    fn as_ref(&self) -> &str {
        self.0
    }
}

fn policy(name: &str, limit: &str) -> Policy {
    Policy::new(name, Algorithm::FixedWindow, limit).unwrap()
}

/// `export` (10/min) by default, `export-pro` (20/min, cost 2) for pro
/// and `export-team` (30/min) for team.
fn export_plans() -> PlanMap<PlanExtension<Plan>> {
    PlanMap::builder(policy("export", "10/min"))
        .plan("pro", Choice::new(policy("export-pro", "20/min")).cost(2))
        .plan("team", policy("export-team", "30/min"))
        .from_extension::<Plan>()
        .unwrap()
}

fn request(path: &str, user: Option<&str>, plan: Option<&'static str>) -> Request<Body> {
    let mut req = Request::get(path).body(Body::empty()).unwrap();
    if let Some(user) = user {
        req.extensions_mut().insert(user.to_owned());
    }
    if let Some(plan) = plan {
        req.extensions_mut().insert(Plan(plan));
    }
    req
}

fn header<'a>(res: &'a Response<Body>, name: &str) -> &'a str {
    res.headers()[name].to_str().unwrap()
}

async fn body_json(res: Response<Body>) -> serde_json::Value {
    let bytes = axum::body::to_bytes(res.into_body(), 1 << 20)
        .await
        .unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

fn clock_and_store() -> (FakeClock, MemoryStore) {
    let clock = FakeClock::new(Timestamp::from_secs(T0));
    let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    (clock, store)
}

/// `/export` under the export plans (route cost 3), and `/items`, one
/// policy of 5/min for every plan; `/rate_limit` shows both.
fn app(store: MemoryStore) -> Router {
    let user = ExtensionKey::<String>::new();
    let items = PlanMap::builder(policy("items", "5/min"))
        .from_extension::<Plan>()
        .unwrap();
    let status = RateLimitStatus::new(store.clone())
        .route(user.clone(), export_plans())
        .route(user.clone(), items.clone());
    Router::new()
        .route(
            "/export",
            get(|| async { "export" }).layer(
                RateLimitLayer::new(policy("export", "10/min"), user.clone())
                    .store(store.clone())
                    .cost(3)
                    .plans(export_plans()),
            ),
        )
        .route(
            "/items",
            get(|| async { "items" }).layer(
                RateLimitLayer::new(policy("items", "5/min"), user)
                    .store(store)
                    .plans(items),
            ),
        )
        .route("/rate_limit", get(status))
}

#[tokio::test]
async fn each_plan_is_limited_by_its_policy_and_cost_and_an_unknown_plan_by_the_default() {
    let (_, store) = clock_and_store();
    let app = app(store);
    // (plan, the policy named, remaining after one request)
    let cases = [
        (None, "export", "7"),             // no plan: the default, at the route's cost
        (Some("pro"), "export-pro", "18"), // the plan's cost
        (Some("team"), "export-team", "27"), // the route's cost
        (Some("gold"), "export", "4"),     // a plan the map does not name: the default
    ];
    for (plan, name, remaining) in cases {
        let res = app
            .clone()
            .oneshot(request("/export", Some("ada"), plan))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{plan:?}");
        assert_eq!(header(&res, "x-ratelimit-resource"), name, "{plan:?}");
        assert_eq!(header(&res, "x-ratelimit-remaining"), remaining, "{plan:?}");
    }
    // The default holds 10 at cost 3: the fourth request of no plan (or of
    // an unknown one) is refused, under the default's name.
    let res = app
        .clone()
        .oneshot(request("/export", Some("ada"), Some("gold")))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, "x-ratelimit-remaining"), "1");
    let res = app
        .oneshot(request("/export", Some("ada"), None))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(body_json(res).await["violated-policies"][0], "export");
}

#[tokio::test]
async fn plans_makes_the_maps_default_the_layers_policy_and_choose_policy_takes_a_map_too() {
    let (_, store) = clock_and_store();
    let user = ExtensionKey::<String>::new();
    let layer = RateLimitLayer::new(policy("other", "1/min"), user.clone()).plans(export_plans());
    assert_eq!(layer.policy().name(), "export");
    // Under `choose_policy`, the layer keeps its own policy, but the map
    // answers every request: with its default where there is no plan.
    let chosen = RateLimitLayer::new(policy("other", "1/min"), user)
        .store(store)
        .choose_policy(export_plans());
    assert_eq!(chosen.policy().name(), "other");
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(chosen);
    for (plan, name, limit) in [(None, "export", "10"), (Some("pro"), "export-pro", "20")] {
        let res = app
            .clone()
            .oneshot(request("/", Some("bob"), plan))
            .await
            .unwrap();
        assert_eq!(header(&res, "x-ratelimit-resource"), name);
        assert_eq!(header(&res, "x-ratelimit-limit"), limit);
    }
}

#[test]
fn a_map_takes_the_plan_from_a_closure_as_well() {
    let plans = PlanMap::builder(policy("api", "10/min"))
        .plan("pro", policy("api-pro", "100/min"))
        .plan_from(|req: &Request<()>| {
            let key = req.headers().get("x-api-key")?.to_str().ok()?;
            Some(if key.starts_with("pro_") {
                "pro"
            } else {
                "free"
            })
        })
        .unwrap();
    let with_key = |key: &str| Request::get("/").header("x-api-key", key).body(()).unwrap();
    let chosen = |req: &Request<()>| plans.choose(req).policy().name().to_owned();
    assert_eq!(chosen(&with_key("pro_123")), "api-pro");
    assert_eq!(chosen(&with_key("abc")), "api");
    assert_eq!(chosen(&Request::get("/").body(()).unwrap()), "api");
    assert_eq!(plans.get("pro").unwrap().policy().name(), "api-pro");
    assert!(plans.get("free").is_none());
    let names: Vec<&str> = plans.plans().map(|(name, _)| name).collect();
    assert_eq!(names, ["pro"]);
    assert_eq!(
        format!("{plans:?}"),
        "PlanMap { default: \"api\", plans: [(\"pro\", \"api-pro\")], .. }"
    );
}

#[test]
fn an_invalid_map_is_a_typed_error_naming_the_plan() {
    let build = |plans: &[(&str, &str)]| {
        plans
            .iter()
            .fold(
                PlanMap::builder(policy("api", "10/min")),
                |b, (plan, name)| b.plan(*plan, policy(name, "20/min")),
            )
            .from_extension::<Plan>()
            .map(|_| ())
    };
    assert_eq!(build(&[("pro", "api-pro"), ("team", "api-team")]), Ok(()));
    let twice = build(&[("pro", "api-pro"), ("pro", "api-pro-2")]).unwrap_err();
    assert_eq!(twice, ConfigError::DuplicatePlan { plan: "pro".into() });
    assert_eq!(
        twice.to_string(),
        "plan \"pro\" is given twice: each plan needs a name of its own"
    );
    // A plan of the default's policy, or of an earlier plan's.
    assert_eq!(
        build(&[("pro", "api")]).unwrap_err(),
        ConfigError::SharedPlanPolicy {
            plan: "pro".into(),
            policy: "api".into()
        }
    );
    let shared = build(&[("pro", "api-pro"), ("team", "api-pro")]).unwrap_err();
    assert_eq!(
        shared.to_string(),
        "plan \"team\" has policy \"api-pro\", which the default or an earlier plan has \
         already: a policy's name identifies its state, so give each plan a policy of its own"
    );
}

#[tokio::test]
async fn rate_limit_shows_the_policy_of_the_callers_plan_on_every_route_consuming_nothing() {
    let (_, store) = clock_and_store();
    let app = app(store);
    let call = |path: &str, plan: Option<&'static str>| {
        app.clone().oneshot(request(path, Some("ada"), plan))
    };
    call("/export", Some("pro")).await.unwrap();
    call("/items", Some("pro")).await.unwrap();
    call("/items", Some("pro")).await.unwrap();
    let entry = |name: &str, limit: u64, used: u64, rate: &str| {
        let reset = T0 + 60;
        serde_json::json!({
            "limit": limit, "used": used, "remaining": limit - used, "reset": reset,
            "resource": name,
            "limits": [{ "rate": rate, "limit": limit, "used": used, "remaining": limit - used, "reset": reset }],
        })
    };
    let pro = serde_json::json!({
        "resources": {
            "export-pro": entry("export-pro", 20, 2, "20/min"),
            "items": entry("items", 5, 2, "5/min"),
        },
        "rate": entry("export-pro", 20, 2, "20/min"),
    });
    for _ in 0..3 {
        let res = call("/rate_limit", Some("pro")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(header(&res, "content-type"), "application/json");
        assert_eq!(body_json(res).await, pro);
    }
    // On the free plan, the default's policy: nothing used there yet.
    let free = body_json(call("/rate_limit", None).await.unwrap()).await;
    assert_eq!(
        free["resources"]["export"],
        entry("export", 10, 0, "10/min")
    );
    assert_eq!(free["resources"]["items"], entry("items", 5, 2, "5/min"));
    assert_eq!(free["resources"].as_object().unwrap().len(), 2);
    // Without a key, no route applies: no resource, and no `rate`.
    let anonymous = app
        .clone()
        .oneshot(request("/rate_limit", None, None))
        .await
        .unwrap();
    assert_eq!(anonymous.status(), StatusCode::OK);
    assert_eq!(
        body_json(anonymous).await,
        serde_json::json!({ "resources": {} })
    );
}

/// A store that never answers in time.
#[derive(Clone)]
struct DownStore;

impl Store for DownStore {
    async fn check(&self, _: &Key, _: &Policy, _: u64) -> Result<Decision, StoreError> {
        Err(StoreError::Timeout(Duration::from_millis(50)))
    }

    async fn settle(&self, _: &Key, _: &Policy, _: Settlement) -> Result<Decision, StoreError> {
        Err(StoreError::Timeout(Duration::from_millis(50)))
    }

    async fn reset(&self, _: &Key, _: &Policy) -> Result<(), StoreError> {
        Err(StoreError::Timeout(Duration::from_millis(50)))
    }

    async fn block(&self, _: &Key, _: &Policy, _: Duration) -> Result<(), StoreError> {
        Err(StoreError::Timeout(Duration::from_millis(50)))
    }
}

#[tokio::test]
async fn rate_limit_is_503_when_the_store_fails() {
    let status =
        RateLimitStatus::new(DownStore).route(ExtensionKey::<String>::new(), export_plans());
    let app = Router::new().route("/rate_limit", get(status));
    let res = app
        .oneshot(request("/rate_limit", Some("ada"), None))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(&res, "retry-after"), "1");
    assert_eq!(header(&res, "content-type"), "application/problem+json");
    assert_eq!(
        body_json(res).await["detail"],
        "the rate limiter is unavailable"
    );
}

#[tokio::test]
async fn an_operator_blocks_resets_and_reads_a_user_on_every_plan_of_the_route() {
    let (clock, store) = clock_and_store();
    let app = app(store.clone());
    let plans = export_plans();
    let family = plans.family();
    assert_eq!(family.name(), "export");
    // The key `ExtensionKey::<String>` makes of bob's id.
    let key = "bob".to_owned().to_key();
    let export =
        |plan: Option<&'static str>| app.clone().oneshot(request("/export", Some("bob"), plan));

    export(Some("pro")).await.unwrap();
    family
        .block(&store, &key, Duration::from_secs(90))
        .await
        .unwrap();
    for plan in [None, Some("pro"), Some("team"), Some("gold")] {
        let res = export(plan).await.unwrap();
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS, "{plan:?}");
        assert_eq!(header(&res, "retry-after"), "90", "{plan:?}");
    }
    // The report of the family: every plan's policy, blocked to the end of
    // the block.
    let report = RateLimitReport::new(family.status(&store, &key).await.unwrap());
    let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
    let names: Vec<&String> = json["resources"].as_object().unwrap().keys().collect();
    assert_eq!(names, ["export", "export-pro", "export-team"]);
    for name in ["export", "export-pro", "export-team"] {
        assert_eq!(json["resources"][name]["remaining"], 0, "{name}");
        assert_eq!(json["resources"][name]["reset"], T0 + 90, "{name}");
    }
    assert_eq!(json["rate"], json["resources"]["export"]);

    clock.advance(Duration::from_secs(30));
    family.reset(&store, &key).await.unwrap();
    let res = export(Some("pro")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    // Afresh on every plan.
    assert_eq!(header(&res, "x-ratelimit-remaining"), "18");
    let res = export(None).await.unwrap();
    assert_eq!(header(&res, "x-ratelimit-remaining"), "7");
}
