//! `tollgate-sim`: replay a traffic log or a synthetic pattern through
//! rate-limit policies; report and chart what each would do. Or, with
//! `tollgate-sim overload`, simulate a backend at overload behind an
//! adaptive concurrency limit.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use tollgate_core::{AdaptiveLimit, Limit, LimitAlgorithm, Policy, Priority};
use tollgate_sim::overload::{self, Jitter, OverloadOptions, Plan, Protection, Scenario};
use tollgate_sim::{
    EpochUnit, Log, Pattern, PatternOptions, SimOptions, Workload, chart, parse_policy, report,
    simulate,
};

/// Replays traffic through rate-limit policies with tollgate's algorithms
/// on a fake clock, and reports what each policy allows, denies and delays.
#[derive(Debug, Parser)]
#[command(version, about)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
#[command(group = clap::ArgGroup::new("input").required(true).args(["log", "pattern"]))]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// A CSV traffic log of `timestamp,key[,cost]` lines; timestamps in
    /// RFC 3339 or epoch seconds, milliseconds or microseconds.
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
    /// Retry each rejected request after its Retry-After (whole seconds,
    /// as the layer sends it) until admitted (always on for
    /// burst-then-steady).
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
    /// The unit of numeric log timestamps: auto, s, ms or us.
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

#[derive(Debug, Subcommand)]
enum Command {
    /// Simulates a backend of fixed capacity at overload, behind an
    /// adaptive concurrency limit or nothing, and compares the algorithms.
    Overload(OverloadArgs),
}

/// What `--algorithm` may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Choice {
    Vegas,
    Gradient2,
    Aimd,
    None,
    All,
}

#[derive(Debug, clap::Args)]
struct OverloadArgs {
    /// ramp (to --load × capacity), halving (workers halve mid-run) or
    /// slowdown (service time doubles mid-run).
    #[arg(long, default_value = "ramp")]
    scenario: Scenario,
    /// The protections to compare; repeat, or `all`.
    #[arg(long = "algorithm", value_enum, default_value = "all")]
    algorithms: Vec<Choice>,
    /// The backend's workers.
    #[arg(long, default_value_t = 40)]
    workers: u32,
    /// The backend's mean service time, in ms.
    #[arg(long, default_value_t = 20.0)]
    service_ms: f64,
    /// How service times vary: uniform (±20 %) or exponential.
    #[arg(long, default_value = "uniform")]
    jitter: Jitter,
    /// The peak offered load, as a multiple of the capacity.
    #[arg(long, default_value_t = 3.0)]
    load: f64,
    /// The clients' deadline, in ms: a later response is not goodput.
    #[arg(long, default_value_t = 1_000)]
    deadline_ms: u64,
    /// The seed of arrivals, classes and service times.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Clients go away at their deadline (the limit is told the request
    /// was abandoned; the backend still finishes it).
    #[arg(long)]
    give_up: bool,
    /// The limit's starting value (default the core's).
    #[arg(long)]
    initial: Option<u32>,
    /// AIMD's latency ceiling, in ms (default twice the service time).
    #[arg(long)]
    aimd_ceiling_ms: Option<f64>,
    /// The fewest latency samples the limit takes in at once (its sample
    /// window; default the core's).
    #[arg(long)]
    window_samples: Option<u32>,
    /// The shortest a sample window lasts, in ms (default the core's).
    #[arg(long)]
    window_ms: Option<u64>,
    /// The share of the limit kept for critical requests.
    #[arg(long, default_value_t = 0.2)]
    reserve_critical: f64,
    /// The share kept for default and critical requests below that.
    #[arg(long, default_value_t = 0.1)]
    reserve_default: f64,
    /// Write the chart to PATH.svg and PATH.png.
    #[arg(long, value_name = "PATH")]
    chart: Option<PathBuf>,
    /// Write every run's state every 10 ms to a CSV file.
    #[arg(long, value_name = "FILE")]
    csv: Option<PathBuf>,
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
    if let Some(Command::Overload(overload)) = &args.command {
        return run_overload(overload);
    }
    // A policy's name is what the report and the chart tell it by.
    for (i, policy) in args.policies.iter().enumerate() {
        if args.policies[..i].iter().any(|p| p.name() == policy.name()) {
            let name = policy.name();
            return Err(
                format!("two --policy specs are named {name:?}: name each NAME=SPEC").into(),
            );
        }
    }
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
            (pattern.workload(&options)?, format!("pattern {pattern}"))
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

fn run_overload(args: &OverloadArgs) -> Result<(), Box<dyn std::error::Error>> {
    let service = Duration::try_from_secs_f64(args.service_ms / 1e3)
        .map_err(|e| format!("invalid --service-ms {}: {e}", args.service_ms))?;
    let options = OverloadOptions {
        workers: args.workers,
        service,
        jitter: args.jitter,
        load: args.load,
        deadline: Duration::from_millis(args.deadline_ms),
        seed: args.seed,
        give_up: args.give_up,
        ..OverloadOptions::default()
    };
    let plan = Plan::new(args.scenario, &options)?;
    let ceiling_ms = args.aimd_ceiling_ms.unwrap_or(2.0 * args.service_ms);
    let latency_ceiling = Duration::try_from_secs_f64(ceiling_ms / 1e3)
        .map_err(|e| format!("invalid --aimd-ceiling-ms {ceiling_ms}: {e}"))?;
    let mut algorithms = Vec::new();
    for choice in &args.algorithms {
        let named: &[Option<LimitAlgorithm>] = match choice {
            Choice::Vegas => &[Some(LimitAlgorithm::Vegas)],
            Choice::Gradient2 => &[Some(LimitAlgorithm::Gradient2)],
            Choice::Aimd => &[Some(LimitAlgorithm::Aimd { latency_ceiling })],
            Choice::None => &[None],
            Choice::All => &[
                Some(LimitAlgorithm::Vegas),
                Some(LimitAlgorithm::Gradient2),
                Some(LimitAlgorithm::Aimd { latency_ceiling }),
                None,
            ],
        };
        for algorithm in named {
            if !algorithms.contains(algorithm) {
                algorithms.push(*algorithm);
            }
        }
    }
    let mut protections = Vec::new();
    for algorithm in algorithms {
        let Some(algorithm) = algorithm else {
            protections.push(Protection::None);
            continue;
        };
        let mut builder = AdaptiveLimit::builder("backend")
            .algorithm(algorithm)
            .reserve(Priority::Critical, args.reserve_critical)
            .reserve(Priority::Default, args.reserve_default);
        if let Some(initial) = args.initial {
            builder = builder.initial(initial);
        }
        let (min_time, min_samples) = builder.clone().build()?.sample_window();
        builder = builder.sample_window(
            args.window_ms.map_or(min_time, Duration::from_millis),
            args.window_samples.unwrap_or(min_samples),
        );
        protections.push(Protection::Adaptive(builder.build()?));
    }

    let started = Instant::now();
    let baselines = overload::Baselines::new(&plan);
    let runs: Vec<overload::OverloadRun> = protections
        .iter()
        .map(|protection| overload::simulate(&plan, protection))
        .collect();
    let summaries: Vec<overload::Summary> = runs
        .iter()
        .map(|run| overload::summarize(run, &baselines))
        .collect();
    println!(
        "{} protections simulated in {:.2?}; AIMD's latency ceiling {ceiling_ms} ms\n",
        runs.len(),
        started.elapsed()
    );
    print!("{}", overload::report::text(&plan, &summaries));

    if let Some(path) = &args.csv {
        std::fs::write(path, overload::report::csv(&runs))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        println!("\ntime series: {}", path.display());
    }
    if let Some(path) = &args.chart {
        let title = format!("tollgate-sim overload --scenario {}", plan.scenario);
        let setup = overload::report::setup(&plan);
        let svg = overload::chart::svg(&runs, &summaries, &title, &setup);
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
