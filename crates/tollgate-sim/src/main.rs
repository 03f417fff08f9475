//! `tollgate-sim`: replay a traffic log or a synthetic pattern through
//! rate-limit policies; report and chart what each would do.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use tollgate_core::{Limit, Policy};
use tollgate_sim::{
    EpochUnit, Log, Pattern, PatternOptions, SimOptions, Workload, chart, parse_policy, report,
    simulate,
};

/// Replays traffic through rate-limit policies with tollgate's algorithms
/// on a fake clock, and reports what each policy allows, denies and delays.
#[derive(Debug, Parser)]
#[command(version, about)]
#[command(group = clap::ArgGroup::new("input").required(true).args(["log", "pattern"]))]
struct Args {
    /// A CSV traffic log of `timestamp,key[,cost]` lines; timestamps in
    /// RFC 3339 or epoch seconds or milliseconds.
    #[arg(long, value_name = "FILE")]
    log: Option<PathBuf>,
    /// A synthetic pattern: steady, burst, burst-then-steady or boundary.
    #[arg(long, value_name = "NAME")]
    pattern: Option<Pattern>,
    /// A policy, `[NAME=]ALGORITHM:LIMIT[+LIMIT...][@BURST]`, e.g.
    /// `fixed=fixed_window:60/min`. Repeat to compare several.
    #[arg(long = "policy", value_name = "SPEC", required = true, value_parser = parse_policy)]
    policies: Vec<Policy>,
    /// Write the chart to PATH.svg and PATH.png.
    #[arg(long, value_name = "PATH")]
    chart: Option<PathBuf>,
    /// Retry each rejected request at its exact Retry-After until admitted
    /// (always on for burst-then-steady).
    #[arg(long)]
    retry: bool,
    /// The most retries of one request.
    #[arg(long, default_value_t = 1_000)]
    max_retries: u32,
    /// Stop at the first malformed log line instead of skipping it.
    #[arg(long)]
    strict: bool,
    /// How many of the most-denied keys to list per policy.
    #[arg(long, default_value_t = 10)]
    top: usize,
    /// The unit of numeric log timestamps: auto, s or ms.
    #[arg(long, default_value = "auto")]
    epoch_unit: EpochUnit,
    /// The steady pattern's rate.
    #[arg(long, default_value = "2/s", value_parser = parse_rate)]
    rate: (u64, Duration),
    /// Requests per burst (burst and boundary patterns).
    #[arg(long, default_value_t = 100)]
    burst: u64,
    /// Time between bursts (burst pattern), e.g. 30s, 1m.
    #[arg(long, default_value = "1m", value_parser = parse_duration)]
    every: Duration,
    /// How long the steady, burst and boundary patterns run.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    duration: Duration,
}

fn parse_rate(text: &str) -> Result<(u64, Duration), String> {
    let limit: Limit = text.parse().map_err(|e| format!("{e}"))?;
    Ok((limit.count(), limit.period()))
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    let d: jiff::SignedDuration = text
        .parse()
        .map_err(|e| format!("invalid duration {text:?}: {e}"))?;
    Duration::try_from(d).map_err(|_| format!("invalid duration {text:?}: must not be negative"))
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let started = Instant::now();
    let (workload, source) = match (&args.log, args.pattern) {
        (Some(path), _) => (read_log(path, &args)?, path.display().to_string()),
        (None, Some(pattern)) => {
            let options = PatternOptions {
                rate: args.rate,
                burst: args.burst,
                every: args.every,
                duration: args.duration,
                retry: args.retry,
                ..PatternOptions::default()
            };
            (pattern.workload(&options), format!("pattern {pattern}"))
        }
        (None, None) => return Err("give --log FILE or --pattern NAME".into()),
    };
    let read = started.elapsed();

    let bar = progress(
        args.policies.len() as u64,
        workload.len() >= 200_000,
        "policies",
    );
    let options = SimOptions {
        max_retries: args.max_retries,
    };
    let mut runs = Vec::new();
    for policy in &args.policies {
        bar.set_message(policy.name().to_owned());
        runs.push(simulate(&workload, policy, options)?);
        bar.inc(1);
    }
    bar.finish_and_clear();

    println!(
        "{} requests from {source}{}, replayed through {} {} in {:.2?} (read {:.2?})\n",
        workload.len(),
        if workload.retry {
            ", retried at Retry-After"
        } else {
            ""
        },
        runs.len(),
        if runs.len() == 1 {
            "policy"
        } else {
            "policies"
        },
        started.elapsed(),
        read,
    );
    print!("{}", report::text(&runs, &workload.keys, args.top));

    if let Some(path) = &args.chart {
        let svg = chart::svg(&runs, &format!("tollgate-sim: {source}"));
        let (svg_path, png_path) = (with_extension(path, "svg"), with_extension(path, "png"));
        std::fs::write(&svg_path, &svg)
            .map_err(|e| format!("cannot write {}: {e}", svg_path.display()))?;
        std::fs::write(&png_path, chart::png(&svg)?)
            .map_err(|e| format!("cannot write {}: {e}", png_path.display()))?;
        println!("\nchart: {} and {}", svg_path.display(), png_path.display());
    }
    Ok(())
}

fn read_log(path: &Path, args: &Args) -> Result<Workload, Box<dyn std::error::Error>> {
    let file = File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    let bar = progress(size, size >= 8 << 20, "reading");
    bar.set_style(
        ProgressStyle::with_template("{msg} {wide_bar} {bytes}/{total_bytes} {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let log = Log::read(
        BufReader::new(file),
        args.epoch_unit,
        args.strict,
        |bytes| {
            bar.set_position(bytes);
        },
    )
    .map_err(|e| format!("{}: {e}", path.display()))?;
    bar.finish_and_clear();
    for error in &log.errors {
        eprintln!("warning: {}: {error}", path.display());
    }
    if log.skipped > log.errors.len() as u64 {
        eprintln!(
            "warning: {}: {} more malformed lines not shown",
            path.display(),
            log.skipped - log.errors.len() as u64
        );
    }
    if log.skipped > 0 {
        eprintln!("skipped {} malformed lines", log.skipped);
    }
    let mut workload = log.workload;
    workload.retry = args.retry;
    Ok(workload)
}

/// A progress bar on stderr, if `show` and stderr is a terminal.
fn progress(len: u64, show: bool, message: &'static str) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len).with_message(message);
    bar.set_style(
        ProgressStyle::with_template("{msg:>12} {wide_bar} {pos}/{len} {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

/// `path` with `extension`, replacing `.svg` or `.png` if it has one.
fn with_extension(path: &Path, extension: &str) -> PathBuf {
    match path.extension().and_then(|e| e.to_str()) {
        Some("svg" | "png") => path.with_extension(extension),
        _ => {
            let mut os = path.as_os_str().to_owned();
            os.push(".");
            os.push(extension);
            PathBuf::from(os)
        }
    }
}
