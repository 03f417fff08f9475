//! The reference the Redis variants are measured against: the layer a
//! user would write first over `straightforward_gcra.lua`, one `EVALSHA`
//! per request on a redis-rs `MultiplexedConnection`, keyed by the
//! `Authorization` header. It adds no headers and answers 429 when the
//! script denies.
//!
//! The same layer on raw sockets (`PlainGcraLayer::connect_raw`): each
//! request takes a TCP connection of its own from a pool (opening one when
//! none is free), writes its `EVALSHA` and reads the reply itself. No task
//! sits between the request and the socket, and nothing is batched or
//! pipelined: a decision that crosses a socket with no client library.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::header::AUTHORIZATION;
use http::{Request, StatusCode};
use redis::aio::MultiplexedConnection;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tower::{Layer, Service};

use crate::common::QUOTA;

/// The script `redis_cpu` measures against too.
const SCRIPT: &str = include_str!("../straightforward_gcra.lua");

/// Makes [`PlainGcra`] services that share one connection and script.
#[derive(Clone)]
pub(crate) struct PlainGcraLayer {
    transport: Transport,
    script: Arc<redis::Script>,
    prefix: Arc<str>,
}

/// How the requests reach Redis.
#[derive(Clone)]
enum Transport {
    Multiplexed(MultiplexedConnection),
    Raw(Arc<RawPool>),
}

/// Idle connections, where to open more, and the command's parts that
/// do not change: all but the key.
struct RawPool {
    address: String,
    idle: Mutex<Vec<TcpStream>>,
    /// `EVALSHA <sha> 1`, as the array's first three bulk strings.
    head: Vec<u8>,
    /// `<interval> <burst> 1`, the last three.
    tail: Vec<u8>,
}

impl PlainGcraLayer {
    /// Keys are `prefix` and the header's value.
    pub(crate) async fn connect(url: &str, prefix: &str) -> Self {
        let client = redis::Client::open(url).unwrap();
        Self {
            transport: Transport::Multiplexed(
                client.get_multiplexed_async_connection().await.unwrap(),
            ),
            script: Arc::new(redis::Script::new(SCRIPT)),
            prefix: Arc::from(prefix),
        }
    }

    /// The same script on raw sockets, a connection per request in flight.
    pub(crate) async fn connect_raw(url: &str, prefix: &str) -> Self {
        let client = redis::Client::open(url).unwrap();
        let mut connection = client.get_multiplexed_async_connection().await.unwrap();
        let script = redis::Script::new(SCRIPT);
        let _: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(SCRIPT)
            .query_async(&mut connection)
            .await
            .unwrap();
        let address = url.trim_start_matches("redis://").trim_end_matches('/');
        let sha = script.get_hash().as_bytes();
        let (interval, burst) = ((1_000_000 / QUOTA).to_string(), QUOTA.to_string());
        let mut head = b"*7\r\n".to_vec();
        bulk(&mut head, b"EVALSHA");
        bulk(&mut head, sha);
        bulk(&mut head, b"1");
        let mut tail = Vec::new();
        bulk(&mut tail, interval.as_bytes());
        bulk(&mut tail, burst.as_bytes());
        bulk(&mut tail, b"1");
        Self {
            transport: Transport::Raw(Arc::new(RawPool {
                address: address.to_owned(),
                idle: Mutex::default(),
                head,
                tail,
            })),
            script: Arc::new(script),
            prefix: Arc::from(prefix),
        }
    }
}

impl RawPool {
    /// Sends the command for `key` on an idle connection (or a new one) and
    /// reads the script's reply, `*3` and three integers: whether it
    /// admitted.
    async fn admits(&self, key: &[u8]) -> std::io::Result<bool> {
        let mut command = Vec::with_capacity(self.head.len() + key.len() + 24 + self.tail.len());
        command.extend_from_slice(&self.head);
        bulk(&mut command, key);
        command.extend_from_slice(&self.tail);
        let idle = self.idle.lock().unwrap().pop();
        let mut stream = match idle {
            Some(stream) => stream,
            None => {
                let stream = TcpStream::connect(&self.address).await?;
                stream.set_nodelay(true)?;
                stream
            }
        };
        stream.write_all(&command).await?;
        let mut reply = [0u8; 128];
        let mut read = 0;
        // An array of three integers ends with its fourth CRLF; an error
        // with its first.
        loop {
            let n = stream.read(&mut reply[read..]).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            read += n;
            let lines = reply[..read].windows(2).filter(|w| w == b"\r\n").count();
            if reply[0] != b'*' && lines >= 1 {
                return Err(std::io::Error::other("error reply"));
            }
            if lines >= 4 {
                break;
            }
        }
        self.idle.lock().unwrap().push(stream);
        Ok(reply.starts_with(b"*3\r\n:1\r\n"))
    }
}

/// Appends `part` to `command` as a RESP bulk string.
fn bulk(command: &mut Vec<u8>, part: &[u8]) {
    command.push(b'$');
    command.extend_from_slice(itoa::Buffer::new().format(part.len()).as_bytes());
    command.extend_from_slice(b"\r\n");
    command.extend_from_slice(part);
    command.extend_from_slice(b"\r\n");
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
        let (transport, script) = (self.layer.transport.clone(), self.layer.script.clone());
        Box::pin(async move {
            let Some(key) = key else {
                return Ok(StatusCode::BAD_REQUEST.into_response());
            };
            // Interval in µs, burst, cost.
            let admits = match transport {
                Transport::Multiplexed(mut connection) => script
                    .key(key)
                    .arg(1_000_000 / QUOTA)
                    .arg(QUOTA)
                    .arg(1)
                    .invoke_async::<(i64, i64, i64)>(&mut connection)
                    .await
                    .map(|(admitted, _, _)| admitted == 1)
                    .map_err(|_| ()),
                Transport::Raw(pool) => pool.admits(&key).await.map_err(|_| ()),
            };
            match admits {
                Ok(true) => inner.call(request).await,
                Ok(false) => Ok(StatusCode::TOO_MANY_REQUESTS.into_response()),
                Err(()) => Ok(StatusCode::INTERNAL_SERVER_ERROR.into_response()),
            }
        })
    }
}
