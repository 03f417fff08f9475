//! Which requests are counted under which limit: users from an auth
//! layer and peers by IP, `route_layer`, plans chosen per request; and
//! bodies of any type.

use std::convert::Infallible;
use std::net::SocketAddr;

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::extract::connect_info::MockConnectInfo;
use axum::middleware::{self, Next};
use axum::routing::get;
use http::{Request, Response, StatusCode};
use tollgate::{
    Algorithm, ExtensionKey, GlobalKey, HeaderKey, Key, MemoryStore, PeerIp, Policy, RateLimitLayer,
};
use tower::{ServiceExt, service_fn};

use super::{body_json, clock_and_store, get_root, header};

#[tokio::test]
async fn users_from_an_auth_layer_and_peers_by_ip() {
    #[derive(Clone)]
    struct UserId(String);
    impl tollgate::ToKey for UserId {
        fn to_key(&self) -> Key {
            Key::user(&self.0)
        }
    }
    async fn auth(mut req: Request<Body>, next: Next) -> Response<Body> {
        if let Some(user) = req
            .headers()
            .get("x-demo-user")
            .and_then(|v| v.to_str().ok())
        {
            let user = UserId(user.to_owned());
            req.extensions_mut().insert(user);
        }
        next.run(req).await
    }
    let (_, store) = clock_and_store();
    let per_user = Policy::new("per-user", Algorithm::FixedWindow, "2/min").unwrap();
    let per_ip = Policy::new("per-ip", Algorithm::FixedWindow, "3/min").unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(per_user, ExtensionKey::<UserId>::new()).store(store.clone()))
        .layer(middleware::from_fn(auth))
        .layer(RateLimitLayer::new(per_ip, PeerIp::new()).store(store))
        .layer(MockConnectInfo(SocketAddr::from(([203, 0, 113, 9], 5000))));
    let as_user = |user: &str| {
        Request::get("/")
            .header("x-demo-user", user)
            .body(Body::empty())
            .unwrap()
    };
    let statuses: Vec<u16> = {
        let mut v = Vec::new();
        for user in ["ada", "ada", "ada", "bob"] {
            v.push(
                app.clone()
                    .oneshot(as_user(user))
                    .await
                    .unwrap()
                    .status()
                    .as_u16(),
            );
        }
        v
    };
    // ada's third request is over her own limit; bob's is the IP's fourth.
    assert_eq!(statuses, [200, 200, 429, 429]);
    let res = app.oneshot(as_user("bob")).await.unwrap();
    assert_eq!(header(&res, "x-ratelimit-resource"), Some("per-ip"));
}

#[tokio::test]
async fn keeping_the_body_type_changes_no_response() {
    // Each response as a client sees it: status, headers and body.
    async fn responses(app: Router) -> Vec<(u16, Vec<(String, String)>, Vec<u8>)> {
        let mut out = Vec::new();
        for _ in 0..4 {
            let res = app.clone().oneshot(get_root()).await.unwrap();
            let headers = res
                .headers()
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned()))
                .collect();
            let status = res.status().as_u16();
            let body = to_bytes(res.into_body(), usize::MAX).await.unwrap();
            out.push((status, headers, body.to_vec()));
        }
        out
    }
    let layer = || {
        let (_, store) = clock_and_store();
        let policy = Policy::new("core", Algorithm::FixedWindow, "3/min").unwrap();
        RateLimitLayer::new(policy, GlobalKey).store(store)
    };
    let route = || Router::new().route("/", get(|| async { "ok" }));
    let wrapped = responses(route().layer(layer())).await;
    let kept = responses(route().layer(layer().keep_body_type())).await;
    assert_eq!(kept, wrapped);
    let statuses: Vec<u16> = kept.iter().map(|(status, _, _)| *status).collect();
    assert_eq!(statuses, [200, 200, 200, 429]);
    assert_eq!(kept[0].2, b"ok");
    let rejection: serde_json::Value = serde_json::from_slice(&kept[3].2).unwrap();
    assert_eq!(rejection["violated-policies"][0], "core");
}

#[tokio::test]
async fn works_with_any_body_type_outside_axum() {
    let (_, store) = clock_and_store();
    let policy = Policy::new("plain", Algorithm::SlidingWindow, "1/min").unwrap();
    let svc = tower::ServiceBuilder::new()
        .layer(
            RateLimitLayer::new(policy, |_: &Request<String>| Some(Key::custom("k"))).store(store),
        )
        .service(service_fn(|req: Request<String>| async move {
            Ok::<_, Infallible>(Response::new(http_body_util::Full::new(
                bytes::Bytes::from(req.into_body()),
            )))
        }));
    let res = svc
        .clone()
        .oneshot(Request::new("hi".to_owned()))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let body = http_body_util::BodyExt::collect(res.into_body())
        .await
        .unwrap()
        .to_bytes();
    assert_eq!(&body[..], b"hi");
    let res = svc.oneshot(Request::new("again".to_owned())).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn route_layer_counts_only_requests_a_handler_takes() {
    let policy = Policy::new("login", Algorithm::FixedWindow, "2/min").unwrap();
    let (_, store) = clock_and_store();
    let limited = RateLimitLayer::new(policy.clone(), GlobalKey).store(store.clone());
    let app = Router::new().route(
        "/",
        axum::routing::post(|| async { "welcome" }).route_layer(limited),
    );
    // Wrong method: 405, and nothing counted.
    for _ in 0..5 {
        let res = app.clone().oneshot(get_root()).await.unwrap();
        assert_eq!(res.status(), StatusCode::METHOD_NOT_ALLOWED);
    }
    let post = || Request::post("/").body(Body::empty()).unwrap();
    let res = app.clone().oneshot(post()).await.unwrap();
    assert_eq!(header(&res, "x-ratelimit-remaining"), Some("1"));
    // With `layer`, the 405s count.
    let counted = Router::new().route(
        "/",
        axum::routing::post(|| async { "welcome" })
            .layer(RateLimitLayer::new(policy, GlobalKey).store(store)),
    );
    let res = counted.oneshot(get_root()).await.unwrap();
    assert_eq!(res.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(header(&res, "x-ratelimit-remaining"), Some("0"));
}

/// Plans chosen per request, as an auth layer would mark them: here the
/// `x-plan` header stands in for the extension it would insert.
fn plans_app(store: MemoryStore) -> Router {
    let free = Policy::new("api-free", Algorithm::FixedWindow, "2/min").unwrap();
    let pro = Policy::new("api-pro", Algorithm::FixedWindow, "5/min").unwrap();
    let by_user = HeaderKey::new(http::HeaderName::from_static("x-user"));
    let layer = RateLimitLayer::new(free, by_user)
        .store(store)
        .choose_policy(move |req: &Request<Body>| {
            (req.headers().get("x-plan")? == "pro").then(|| pro.clone())
        });
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

fn as_user(user: &str, plan: &str) -> Request<Body> {
    Request::get("/")
        .header("x-user", user)
        .header("x-plan", plan)
        .body(Body::empty())
        .unwrap()
}

#[tokio::test]
async fn each_plan_has_its_own_limit_and_names_itself() {
    let (_, store) = clock_and_store();
    let app = plans_app(store);
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let res = app.clone().oneshot(as_user("ada", "free")).await.unwrap();
        assert_eq!(header(&res, "x-ratelimit-resource"), Some("api-free"));
        assert_eq!(header(&res, "x-ratelimit-limit"), Some("2"));
        statuses.push(res.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 429]);
    let res = app.clone().oneshot(as_user("ada", "free")).await.unwrap();
    assert_eq!(body_json(res).await["violated-policies"][0], "api-free");

    let mut statuses = Vec::new();
    for _ in 0..6 {
        let res = app.clone().oneshot(as_user("bob", "pro")).await.unwrap();
        assert_eq!(header(&res, "x-ratelimit-resource"), Some("api-pro"));
        assert_eq!(header(&res, "x-ratelimit-limit"), Some("5"));
        statuses.push(res.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);
    let res = app.clone().oneshot(as_user("bob", "pro")).await.unwrap();
    assert_eq!(body_json(res).await["violated-policies"][0], "api-pro");

    // Plans keep their state apart: ada, spent on free, starts on pro.
    let res = app.clone().oneshot(as_user("ada", "pro")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, "x-ratelimit-remaining"), Some("4"));
}

#[tokio::test]
async fn a_chosen_plan_may_set_the_cost_of_its_requests() {
    let (_, store) = clock_and_store();
    let free = Policy::new("export-free", Algorithm::FixedWindow, "10/min").unwrap();
    let pro = Policy::new("export-pro", Algorithm::FixedWindow, "5/min").unwrap();
    let layer = RateLimitLayer::new(free, GlobalKey)
        .store(store)
        .cost(3)
        .choose_policy(move |req: &Request<Body>| {
            (req.headers().get("x-plan")? == "pro")
                .then(|| tollgate::Choice::new(pro.clone()).cost(2))
        });
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let statuses = |plan: &'static str| {
        let app = app.clone();
        async move {
            let mut statuses = Vec::new();
            for _ in 0..4 {
                let req = Request::get("/")
                    .header("x-plan", plan)
                    .body(Body::empty())
                    .unwrap();
                statuses.push(app.clone().oneshot(req).await.unwrap().status().as_u16());
            }
            statuses
        }
    };
    // Pro: 2 + 2 of 5, then 6 would not fit. Free: 3 + 3 + 3 of 10.
    assert_eq!(statuses("pro").await, [200, 200, 429, 429]);
    assert_eq!(statuses("free").await, [200, 200, 200, 429]);
}
