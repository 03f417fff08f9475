//! The reference the Redis variants are measured against: the layer a
//! user would write first over `straightforward_gcra.lua`, one `EVALSHA`
//! per request on a redis-rs `MultiplexedConnection`, keyed by the
//! `Authorization` header. It adds no headers and answers 429 when the
//! script denies.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::header::AUTHORIZATION;
use http::{Request, StatusCode};
use redis::aio::MultiplexedConnection;
use tower::{Layer, Service};

use crate::common::QUOTA;

/// The script `redis_cpu` measures against too.
const SCRIPT: &str = include_str!("../straightforward_gcra.lua");

/// Makes [`PlainGcra`] services that share one connection and script.
#[derive(Clone)]
pub(crate) struct PlainGcraLayer {
    connection: MultiplexedConnection,
    script: Arc<redis::Script>,
    prefix: Arc<str>,
}

impl PlainGcraLayer {
    /// Keys are `prefix` and the header's value.
    pub(crate) async fn connect(url: &str, prefix: &str) -> Self {
        let client = redis::Client::open(url).unwrap();
        Self {
            connection: client.get_multiplexed_async_connection().await.unwrap(),
            script: Arc::new(redis::Script::new(SCRIPT)),
            prefix: Arc::from(prefix),
        }
    }
}

impl<S> Layer<S> for PlainGcraLayer {
    type Service = PlainGcra<S>;

    fn layer(&self, inner: S) -> Self::Service {
        PlainGcra {
            inner,
            layer: self.clone(),
        }
    }
}

/// One `EVALSHA` per request, then the inner service if it admits.
#[derive(Clone)]
pub(crate) struct PlainGcra<S> {
    inner: S,
    layer: PlainGcraLayer,
}

impl<S> Service<Request<Body>> for PlainGcra<S>
where
    S: Service<Request<Body>, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let key = request
            .headers()
            .get(AUTHORIZATION)
            .map(|value| [self.layer.prefix.as_bytes(), value.as_bytes()].concat());
        let (mut connection, script) = (self.layer.connection.clone(), self.layer.script.clone());
        Box::pin(async move {
            let Some(key) = key else {
                return Ok(StatusCode::BAD_REQUEST.into_response());
            };
            // Interval in µs, burst, cost.
            let reply: redis::RedisResult<(i64, i64, i64)> = script
                .key(key)
                .arg(1_000_000 / QUOTA)
                .arg(QUOTA)
                .arg(1)
                .invoke_async(&mut connection)
                .await;
            match reply {
                Ok((1, _, _)) => inner.call(request).await,
                Ok(_) => Ok(StatusCode::TOO_MANY_REQUESTS.into_response()),
                Err(_) => Ok(StatusCode::INTERNAL_SERVER_ERROR.into_response()),
            }
        })
    }
}
