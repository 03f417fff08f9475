//! Run with: `cargo run -p outbound -- [--seconds 60] [--processes 2] [--workers 4] [--redis-url URL]`
//!
//! Starts the stand-in partner (10 calls per second, 500 per day), then
//! `--processes` copies of itself that call it from `--workers` workers
//! each, sharing the partner's limits through Redis, and reports what the
//! partner saw. Exits with failure unless the partner answered no 429 and
//! at least 95 % of its allowance was used.

use std::process::{ExitCode, Stdio};
use std::time::Duration;

use clap::Parser;
use outbound::{Calls, Pacing, Partner, PartnerClient, PartnerLimits, PartnerQuota, Report};
use tokio::io::AsyncReadExt;
use tollgate::{Clock, Jitter, Key, SystemClock};
use tollgate_redis::RedisStore;

/// Workers in several processes share a partner's limits through Redis.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// How long the workers run, in seconds (at most a year).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(..=31_536_000))]
    seconds: u64,
    /// Worker processes, each with its own Redis connection.
    #[arg(long, default_value_t = 2)]
    processes: usize,
    /// Workers (tasks) per process.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// How the workers pace their calls.
    #[arg(long, value_enum, default_value_t = Pacing::Gcra)]
    pacing: Pacing,
    /// The jitter of waiting workers' wake-ups: `bulk` (Tollgate's
    /// default: one emission interval where a limit frees units in bulk),
    /// `none`, or a percent of one interval after every refusal.
    #[arg(long, default_value = "bulk", value_parser = jitter)]
    jitter: Jitter,
    /// Milliseconds added to the peak's period when pacing: how much the
    /// delay between a call let through and its arrival at the partner
    /// may vary before the partner sees one call too many in a second.
    #[arg(long, default_value_t = outbound::DEFAULT_HEADROOM.as_millis() as u64)]
    headroom_ms: u64,
    /// The partner's peak per second.
    #[arg(long, default_value_t = PartnerQuota::DEMO.peak)]
    peak: u64,
    /// The partner's daily quota.
    #[arg(long, default_value_t = PartnerQuota::DEMO.daily)]
    daily: u64,
    /// The Redis the processes share.
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    redis_url: String,
    /// Run as a worker process of the partner at this URL (the
    /// coordinator starts these).
    #[arg(long, hide = true, requires = "account")]
    worker_of: Option<String>,
    /// The partner account the worker processes share.
    #[arg(long, hide = true)]
    account: Option<String>,
}

impl Args {
    fn quota(&self) -> PartnerQuota {
        PartnerQuota {
            peak: self.peak,
            daily: self.daily,
            ..PartnerQuota::DEMO
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let result = match (&args.worker_of, &args.account) {
        (Some(partner), Some(account)) => worker_process(&args, partner, account).await,
        _ => coordinate(&args).await,
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprint!("error: {error}");
            let mut source = error.source();
            while let Some(cause) = source {
                eprint!(": {cause}");
                source = cause.source();
            }
            eprintln!();
            ExitCode::FAILURE
        }
    }
}

type Error = Box<dyn std::error::Error>;

/// How long a worker waits for a Redis decision before the limiters'
/// failure policy (closed) applies.
const JOB_DEADLINE: Duration = Duration::from_secs(1);

/// One worker process: its workers, on one Redis connection, report their
/// calls on standard output.
async fn worker_process(args: &Args, partner: &str, account: &str) -> Result<bool, Error> {
    // A job can wait for Redis longer than a request path can: a reply
    // that is late on a busy machine is still an answer, not a failure.
    let store = RedisStore::builder()
        .deadline(JOB_DEADLINE)
        .response_timeout(JOB_DEADLINE)
        .connect(args.redis_url.as_str())
        .await?;
    let headroom = std::time::Duration::from_millis(args.headroom_ms);
    let limits = PartnerLimits::new(args.quota(), args.pacing, args.jitter, headroom, store)?;
    let client = PartnerClient::new(partner)?;
    let run = Duration::from_secs(args.seconds);
    let calls = outbound::instance(limits, Key::custom(account), client, args.workers, run).await;
    println!("{}", calls.to_line());
    Ok(true)
}

/// The partner, the worker processes, and the report.
async fn coordinate(args: &Args) -> Result<bool, Error> {
    let quota = args.quota();
    let partner = Partner::new(quota, SystemClock);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let router = partner.router();
    tokio::spawn(async move { axum::serve(listener, router).await });
    // A fresh account per run, as the stand-in partner is fresh: the
    // limits' state in Redis is the account's.
    let account = format!(
        "partner-{}-{}",
        std::process::id(),
        SystemClock.now().as_micros()
    );
    println!(
        "partner at {base}: {} calls per {:?}, {} per day",
        quota.peak, quota.period, quota.daily
    );
    println!(
        "{} processes x {} workers for {} s, pacing {} with {} ms of headroom, jitter {}, Redis at {}",
        args.processes,
        args.workers,
        args.seconds,
        pacing_name(args.pacing),
        args.headroom_ms,
        jitter_name(args.jitter),
        args.redis_url
    );
    let me = std::env::current_exe()?;
    let mut children = Vec::new();
    for _ in 0..args.processes {
        let child = tokio::process::Command::new(&me)
            .args(["--worker-of", &base, "--account", &account])
            .args(["--seconds", &args.seconds.to_string()])
            .args(["--workers", &args.workers.to_string()])
            .args(["--jitter", &jitter_name(args.jitter)])
            .args(["--headroom-ms", &args.headroom_ms.to_string()])
            .args(["--peak", &args.peak.to_string()])
            .args(["--daily", &args.daily.to_string()])
            .args(["--redis-url", &args.redis_url])
            .arg("--pacing")
            .arg(pacing_name(args.pacing))
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        children.push(child);
    }
    let mut calls = Calls::default();
    let mut reported = true;
    for mut child in children {
        let mut out = String::new();
        if let Some(stdout) = child.stdout.as_mut() {
            stdout.read_to_string(&mut out).await?;
        }
        let status = child.wait().await?;
        match out.lines().find_map(Calls::from_line) {
            Some(theirs) if status.success() => calls += theirs,
            _ => reported = false,
        }
    }
    let report = Report {
        quota,
        run: Duration::from_secs(args.seconds),
        log: partner.log(),
        calls,
    };
    println!("{report}");
    if !reported {
        println!("a worker process failed");
    }
    Ok(reported && report.passed())
}

/// The name clap knows a pacing by.
fn pacing_name(pacing: Pacing) -> &'static str {
    match pacing {
        Pacing::Gcra => "gcra",
        Pacing::SlidingLog => "sliding-log",
    }
}

/// A jitter as the command line gives it: `bulk`, `none` or a percent.
fn jitter(text: &str) -> Result<Jitter, String> {
    match text {
        "bulk" => Ok(Jitter::BULK),
        "none" => Ok(Jitter::NONE),
        percent => {
            let percent = percent.parse().map_err(|_| "bulk, none or 0 to 100")?;
            Jitter::percent_of_interval(percent).map_err(|e| e.to_string())
        }
    }
}

/// The command line's name of `jitter`.
fn jitter_name(jitter: Jitter) -> String {
    if jitter == Jitter::BULK {
        "bulk".to_owned()
    } else if jitter == Jitter::NONE {
        "none".to_owned()
    } else {
        jitter.percent().to_string()
    }
}
