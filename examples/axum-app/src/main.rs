//! Run with: `cargo run -p axum-app -- [--listen ADDR] [--redis-url URL] [--config FILE]`
//!
//! `kill -HUP <pid>` reloads the policy file: a valid file replaces the
//! routes' policies (each key's use carries over to the new limits, as
//! state belongs to the policy's name); a bad one is refused with the
//! field named, and the old policies stay.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, PoisonError, RwLock};

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use metrics_exporter_prometheus::PrometheusHandle;
use tower::ServiceExt;
use tower::util::Oneshot;

use axum_app::dashboard::{Dashboard, Sources};
use axum_app::topkeys::{DemoLabel, demo_top_keys};
use axum_app::{
    AdminToken, AppConfig, AppLedger, AppOverrides, AppTopKeys, Overload, app_with_overrides,
    install_metrics, metrics_route, policy_table,
};
use clap::Parser;
use tollgate::ledger::{Ledger, MemoryLedger, MeteredStore};
use tollgate::topkeys::WatchedStore;
use tollgate::{BoxStore, MemoryStore};
use tollgate_redis::{RedisLedger, RedisOverrides, RedisStore, RedisStoreBuilder, RedisTopKeys};

/// How often each instance publishes its top keys to Redis.
const TOP_KEYS_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// Writes a line to stdout, as `println!` does, but carries on if stdout
/// is closed (a pipe whose reader is gone): the server keeps serving.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// Tollgate's demo API: per-route rate limits from a policy file.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Address to listen on.
    #[arg(long, env = "TOLLGATE_LISTEN", default_value = "127.0.0.1:3000")]
    listen: SocketAddr,
    /// Redis to share limits through (`redis://host:port`, or
    /// `redis+sentinel://host:port[,host:port...]/service` for the master
    /// Sentinel names); the in-memory store when absent.
    #[arg(long, env = "REDIS_URL")]
    redis_url: Option<String>,
    /// The prefix of every Redis key the limits keep.
    #[arg(long, env = "TOLLGATE_REDIS_PREFIX", default_value = "tollgate")]
    redis_prefix: String,
    /// The policy file.
    #[arg(long, env = "TOLLGATE_CONFIG", default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/policies.toml"))]
    config: PathBuf,
    /// The token of `DELETE /admin/rate_limit/{policy}/{user}`, sent as
    /// `Authorization: Bearer <token>`; without one the admin routes answer 404.
    #[arg(long, env = "TOLLGATE_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// The secret the top keys hash IP addresses and other keys with
    /// (users appear by id). Every instance on one Redis must share it for
    /// their counts to merge; without one, each process makes its own.
    /// Not the admin token: a label and a known address would let anyone
    /// who reads Redis test guesses of the token offline.
    #[arg(long, env = "TOLLGATE_LABEL_SECRET", hide_env_values = true)]
    label_secret: Option<String>,
    /// How long a decision waits for Redis, in milliseconds, before the
    /// failure policy answers it (the store's deadline).
    #[arg(long, env = "TOLLGATE_REDIS_DEADLINE_MS", default_value_t = 50)]
    redis_deadline_ms: u64,
    /// How long a client may take to send a request's headers, in
    /// milliseconds, before its connection is closed.
    #[arg(long, env = "TOLLGATE_HEADER_TIMEOUT_MS", default_value_t = axum_app::listen::HEADER_TIMEOUT_MS)]
    header_timeout_ms: u64,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", chain(&*e));
            ExitCode::FAILURE
        }
    }
}

/// `error` and every [`source`](std::error::Error::source) under it, each
/// after a colon, so that a startup error always says why. A source whose
/// message its error already shows (as ours include their cause) is not
/// repeated.
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(cause) = next {
        let said = cause.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        next = cause.source();
    }
    text
}

/// Reads and checks the policy file.
fn load(path: &Path) -> Result<AppConfig, String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        format!(
            "cannot read the config file {}: {}",
            path.display(),
            chain(&e)
        )
    })?;
    AppConfig::parse(&text).map_err(|e| format!("{}: {}", path.display(), chain(&e)))
}

/// The app of the current policy file, swapped whole on reload.
#[derive(Clone)]
struct Reloadable(Arc<RwLock<Router>>);

impl Reloadable {
    fn current(&self) -> Router {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn replace(&self, router: Router) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = router;
    }
}

impl tower::Service<Request> for Reloadable {
    type Response = Response;
    type Error = Infallible;
    type Future = Oneshot<Router, Request<Body>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        self.current().oneshot(request)
    }
}

/// What the app is built of, besides the policy file.
#[derive(Clone)]
struct Parts {
    store: BoxStore,
    /// Each user's overrides: in Redis with a Redis store, else in memory.
    overrides: AppOverrides,
    /// What the store records usage in: `GET /usage`.
    ledger: AppLedger,
    metrics: PrometheusHandle,
    admin: Option<AdminToken>,
    /// `GET /work` and its protection, made once: a reload keeps them.
    overload: Overload,
    /// Each policy's top keys: `GET /admin/top_keys/{policy}`.
    top: AppTopKeys,
    /// `GET /admin/dashboard`, made once: a reload keeps its history.
    /// Started with an admin token only: without one no one can see it,
    /// and its refreshes would read every policy's top keys for nothing.
    dashboard: Option<Dashboard>,
}

/// The whole app of `config`: its routes and the metrics route.
fn build(config: &AppConfig, parts: &Parts) -> Router {
    let (store, admin) = (parts.store.clone(), parts.admin.clone());
    app_with_overrides(config, store, admin, parts.overrides.clone())
        .merge(parts.overload.routes(parts.admin.clone()))
        .merge(axum_app::usage::routes(
            config,
            &parts.ledger,
            parts.admin.clone(),
        ))
        .merge(metrics_route(parts.metrics.clone()))
        .merge(operator_views(config, parts))
        // Every layer built once, not once per request (see `app`).
        .with_state(())
}

/// With an admin token, the dashboard and the top keys (of the policies
/// of `config`'s routes and their plans).
fn operator_views(config: &AppConfig, parts: &Parts) -> Router {
    let policies = (config.routes.iter())
        .flat_map(|r| std::iter::once(&r.policy).chain(r.plans.iter().map(|p| &p.policy)))
        .map(|policy| policy.name().to_owned())
        .collect();
    match (&parts.admin, &parts.dashboard) {
        (Some(token), Some(dashboard)) => {
            axum_app::serve::record_route(dashboard.routes(token.clone()).merge(
                axum_app::topkeys::routes(&parts.top, token.clone(), policies),
            ))
        }
        (None, _) | (Some(_), None) => Router::new(),
    }
}

/// Reloads the policy file on every SIGHUP until the process ends.
#[cfg(unix)]
fn reload_on_sighup(path: PathBuf, app: Reloadable, parts: Parts) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hangups) = signal(SignalKind::hangup()) else {
        tracing::warn!("cannot listen for SIGHUP; the policy file will not be reloaded");
        return;
    };
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            match load(&path) {
                Ok(config) => {
                    app.replace(build(&config, &parts));
                    tracing::info!(config = %path.display(), "reloaded the policy file");
                    say!("{}", policy_table(&config).trim_end());
                }
                Err(error) => {
                    tracing::error!(%error, "refused the new policy file; the old policies stay");
                }
            }
        }
    });
}

#[cfg(not(unix))]
fn reload_on_sighup(_: PathBuf, _: Reloadable, _: Parts) {}

/// Says so when Redis does not answer at startup: the demo serves all the
/// same, by its failure policy, until Redis answers.
async fn say_if_not_ready<C: tollgate_redis::RedisConnection>(
    store: &RedisStore<C>,
    config: &axum_app::AppConfig,
) {
    if let Err(e) = store.health_check().await {
        say!(
            "store: Redis is not answering yet ({}); serving by failure = {:?} until it does",
            chain(&e),
            config.failure
        );
    }
}

/// The secret the top keys' labels are hashed with: `--label-secret`, or
/// one of this process's own.
fn label_secret(given: Option<&str>) -> Vec<u8> {
    use std::hash::{BuildHasher, Hasher};
    match given {
        Some(secret) => secret.as_bytes().to_vec(),
        None => (0..4)
            .flat_map(|_| {
                let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
                hasher.write_u32(std::process::id());
                hasher.finish().to_le_bytes()
            })
            .collect(),
    }
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let config = load(&args.config)?;
    // Before the layers are built: they register their counters with it.
    let metrics =
        install_metrics().map_err(|e| format!("cannot install metrics: {}", chain(&e)))?;
    let mut overrides = AppOverrides::default();
    let label = DemoLabel::new(label_secret(args.label_secret.as_deref()));
    if args.redis_url.is_some() && args.label_secret.is_none() {
        say!(
            "top keys: no --label-secret, so this instance's hashed keys do not merge with others'"
        );
    }
    let redis_deadline = std::time::Duration::from_millis(args.redis_deadline_ms);
    let (store, ledger, top, store_kind) = match &args.redis_url {
        Some(url) if url.starts_with("redis+sentinel://") => {
            let store = RedisStore::builder()
                .prefix(args.redis_prefix.as_str())
                .deadline(redis_deadline)
                .connect_sentinel_url(url)
                .await
                .map_err(|e| format!("cannot use Redis through {}: {}", redact(url), chain(&e)))?;
            say!("store: Redis through Sentinel {}", redact(url));
            say_if_not_ready(&store, &config).await;
            let ledger = RedisLedger::builder(&store).build()?;
            let ledger = AppLedger::Sentinel(ledger);
            let top = RedisTopKeys::builder(&store, demo_top_keys(label.clone())?)
                .publish_interval(TOP_KEYS_INTERVAL)?
                .build()?;
            let watched = WatchedStore::new(store, top.local().clone());
            (
                BoxStore::with_slots(MeteredStore::new(watched, ledger.clone())),
                ledger,
                AppTopKeys::Sentinel(top),
                "redis (sentinel)",
            )
        }
        Some(url) => {
            let store = async {
                let info = RedisStoreBuilder::parse_url(url)?;
                RedisStore::builder()
                    .prefix(args.redis_prefix.as_str())
                    .deadline(redis_deadline)
                    .connect(info)
                    .await
            }
            .await
            .map_err(|e| format!("cannot use Redis at {}: {}", redact(url), chain(&e)))?;
            say!("store: Redis at {}", redact(url));
            say_if_not_ready(&store, &config).await;
            let shared = RedisOverrides::builder().start(&store).await;
            overrides = AppOverrides::Redis(shared.map_err(|e| format!("overrides: {e}"))?);
            let ledger = AppLedger::Redis(RedisLedger::builder(&store).build()?);
            let top = RedisTopKeys::builder(&store, demo_top_keys(label.clone())?)
                .publish_interval(TOP_KEYS_INTERVAL)?
                .build()?;
            let watched = WatchedStore::new(store, top.local().clone());
            (
                BoxStore::with_slots(MeteredStore::new(watched, ledger.clone())),
                ledger,
                AppTopKeys::Redis(top),
                "redis",
            )
        }
        None => {
            let store = MemoryStore::new();
            say!("store: in-memory (max {} keys)", store.max_keys());
            let ledger = AppLedger::Memory(MemoryLedger::new());
            let top = demo_top_keys(label.clone())?;
            let watched = WatchedStore::new(store, top.clone());
            (
                BoxStore::with_slots(MeteredStore::new(watched, ledger.clone())),
                ledger,
                AppTopKeys::Memory(top),
                "memory",
            )
        }
    };
    if args.header_timeout_ms == 0 {
        return Err("--header-timeout-ms: 0 would close every connection at once".into());
    }
    let header_timeout = std::time::Duration::from_millis(args.header_timeout_ms);
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {}", args.listen, chain(&e)))?;
    say!("listening on http://{}", listener.local_addr()?);
    say!("config: {}", args.config.display());
    say!("metrics: http://{}/metrics", listener.local_addr()?);
    say!("usage: GET /usage?granularity=hour|day|month&from=..&to=.. (authenticated)");
    say!("{}", policy_table(&config).trim_end());
    let admin = match args.admin_token.as_deref().map(AdminToken::new) {
        None => None,
        Some(None) => return Err("--admin-token: an empty token would let anyone in".into()),
        Some(token) => {
            say!("admin: DELETE /admin/rate_limit/{{policy}}/{{user}} with the admin token");
            say!("admin: PUT or DELETE /admin/rate_limit/{{policy}}/{{user}}/override");
            say!("admin: GET /admin/usage/{{user}} with the admin token");
            say!("admin: GET /admin/top_keys/{{policy}}?ranking=limited|active");
            say!(
                "dashboard: http://{}/admin/dashboard (asks for the admin token)",
                listener.local_addr()?
            );
            token
        }
    };
    let overload =
        Overload::new(&config.overload).map_err(|e| format!("[overload]: {}", chain(&e)))?;
    say!(
        "overload: GET /work on {} workers × {:?}, {}",
        config.overload.workers,
        config.overload.service,
        if config.overload.protect {
            "behind an adaptive concurrency limit (x-priority: critical | default | sheddable)"
        } else {
            "unprotected"
        }
    );
    let dashboard = admin.as_ref().map(|_| {
        Dashboard::start(Sources {
            metrics: metrics.clone(),
            top: top.clone(),
            overrides: overrides.clone(),
            ledger: ledger.clone(),
            store: store_kind,
            label,
        })
    });
    let parts = Parts {
        store,
        overrides,
        ledger: ledger.clone(),
        metrics,
        admin,
        overload,
        top,
        dashboard,
    };
    let current = Reloadable(Arc::new(RwLock::new(build(&config, &parts))));
    reload_on_sighup(args.config.clone(), current.clone(), parts);
    let stopping = Arc::new(tokio::sync::Notify::new());
    let signalled = stopping.clone();
    let serve = axum_app::listen::serve(
        listener,
        axum_app::serve_layers(Router::new().fallback_service(current)),
        header_timeout,
        async move {
            stop_signal().await;
            signalled.notify_one();
        },
    );
    // No longer than a grace period after the signal is spent waiting for
    // connections still open (they go on, on their own tasks, until the
    // runtime stops): the last usage is flushed well before `docker
    // stop`'s kill, 10 s after its signal.
    tokio::select! {
        () = serve => {}
        () = async {
            stopping.notified().await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } => say!("shutdown: connections still open after {SHUTDOWN_GRACE:?} are closed"),
    }
    // The usage recorded since the last flush (at most a second of it).
    if let Err(e) = ledger.flush().await {
        say!(
            "usage: the last records could not be written: {}",
            chain(&e)
        );
    }
    Ok(())
}

/// How long the demo waits for open connections after a stop signal.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Ctrl-C, or SIGTERM (what `docker stop`, Kubernetes and systemd send).
async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = terminate.recv() => {}
                }
                return;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM; Ctrl-C stops the demo")
            }
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// The URL without credentials.
fn redact(url: &str) -> String {
    match (url.split_once("://"), url.rsplit_once('@')) {
        (Some((scheme, _)), Some((_, host))) => format!("{scheme}://***@{host}"),
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error that says only what failed, keeping why in `source`.
    #[derive(Debug)]
    struct Terse(std::io::Error);

    impl std::fmt::Display for Terse {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("cannot connect")
        }
    }

    impl std::error::Error for Terse {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn the_chain_gives_every_cause_once() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(chain(&Terse(refused)), "cannot connect: refused");
        // Ours say their cause already: it is not repeated.
        let ours = tollgate_redis::RedisStoreError::from(tollgate::ConfigError::ZeroBurst);
        assert_eq!(
            chain(&ours),
            "invalid Redis store configuration: burst must be at least 1, got 0"
        );
    }
}
