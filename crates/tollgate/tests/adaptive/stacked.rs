//! The adaptive limit under a per-user rate limit, as the guide stacks
//! them: what a request the service sheds costs its user.

use super::*;
use tollgate::{Algorithm, HeaderKey, Policy, RateLimitLayer, Settle};

/// Ada's answers (status, `Retry-After`) on a route limited per user at
/// 2 a minute outside a limit of 1 request at a time that Bob holds, then,
/// once Bob is done, a second after she was told to come back.
async fn shed_twice_then_retried(per_user: RateLimitLayer<HeaderKey>) -> Vec<(u16, String)> {
    let held = Held::default();
    let protect = layer(AdaptiveLimit::builder("api").fixed(1).build().unwrap());
    let app = held.app(protect).layer(per_user);
    let send = |user: &'static str| {
        let mut request = request(Priority::Default);
        request
            .headers_mut()
            .insert("x-user", user.parse().unwrap());
        app.clone().oneshot(request)
    };
    let bob = tokio::spawn(send("bob"));
    while held.started.lock().unwrap().is_empty() {
        tokio::task::yield_now().await;
    }
    let answer = |response: http::Response<_>| {
        let retry = response.headers().get(http::header::RETRY_AFTER);
        let retry = retry.map_or("", |v| v.to_str().unwrap()).to_owned();
        (response.status().as_u16(), retry)
    };
    let mut seen = Vec::new();
    for _ in 0..2 {
        seen.push(answer(send("ada").await.unwrap()));
    }
    held.go.add_permits(2);
    assert_eq!(bob.await.unwrap().unwrap().status(), StatusCode::OK);
    tokio::time::sleep(Duration::from_secs(1)).await;
    seen.push(answer(send("ada").await.unwrap()));
    seen
}

fn per_user() -> RateLimitLayer<HeaderKey> {
    RateLimitLayer::new(
        Policy::new("per-user", Algorithm::Gcra, "2/min").unwrap(),
        HeaderKey::new(http::HeaderName::from_static("x-user")),
    )
}

/// Settling 503s as the guide does, a request the service sheds gives its
/// user's unit back: Ada, shed twice and told a second, is served when she
/// comes back after it. Without it her two shed requests spent her limit,
/// the second's answer was raised to the limit's 30 s, and after the
/// second she was first told she met a 429.
#[tokio::test(start_paused = true)]
async fn a_request_the_service_sheds_gives_its_users_unit_back_when_503s_settle() {
    let settled = per_user().settle(Settle::count_only(|status| {
        status != StatusCode::SERVICE_UNAVAILABLE
    }));
    let seen = shed_twice_then_retried(settled).await;
    assert_eq!(
        seen,
        [(503, "1".into()), (503, "1".into()), (200, String::new())]
    );
    let unsettled = shed_twice_then_retried(per_user()).await;
    assert_eq!(
        unsettled,
        [(503, "1".into()), (503, "30".into()), (429, "30".into())]
    );
}
