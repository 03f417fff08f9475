//! Run with: `cargo run --release -p log-replay -- replay --log FILE
//! --policies examples/axum-app/policies.toml [--policies OTHER.toml]`,
//! or `cargo run --release -p log-replay -- generate --out FILE` for a
//! seeded combined-format log.

use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use log_replay::generate::Generator;
use log_replay::{Replay, chart, report};
use tollgate_sim::access::{AccessFormat, AccessLog};

/// Replays a real access log through the demo's policy files.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Replays an access log through one or more policy files, side by
    /// side, and reports what each would have refused.
    Replay {
        /// The access log (`-` for standard input).
        #[arg(long, value_name = "FILE")]
        log: PathBuf,
        /// Its format: common, combined or json (JSON lines).
        #[arg(long, default_value = "combined")]
        format: AccessFormat,
        /// A policy file (the demo's TOML). Repeat to compare.
        #[arg(long = "policies", value_name = "FILE", required = true)]
        policies: Vec<PathBuf>,
        /// How many of the most refused clients to list.
        #[arg(long, default_value_t = 20)]
        top: usize,
        /// Write every client's refusals to this CSV file.
        #[arg(long, value_name = "FILE")]
        csv: Option<PathBuf>,
        /// Write the chart to PATH.svg and PATH.png.
        #[arg(long, value_name = "PATH")]
        chart: Option<PathBuf>,
    },
    /// Writes a seeded combined-format log against the demo's routes.
    Generate {
        /// Where to write it (`-` for standard output).
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
        /// How many lines.
        #[arg(long, default_value_t = 1_000_000)]
        lines: u64,
        /// How many clients.
        #[arg(long, default_value_t = 5_000)]
        clients: u32,
        /// The seed.
        #[arg(long, default_value_t = 34)]
        seed: u64,
        /// The seconds the log spans.
        #[arg(long, default_value_t = 7_200)]
        span_secs: u64,
    },
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

fn run(args: Args) -> Result<(), String> {
    match args.command {
        Command::Generate {
            out,
            lines,
            clients,
            seed,
            span_secs,
        } => {
            let generator = Generator {
                seed,
                lines,
                clients,
                span_secs,
                ..Generator::default()
            };
            let write = |w: &mut dyn Write| {
                let mut w = BufWriter::new(w);
                generator.write_combined(&mut w)?;
                w.flush()
            };
            let result = if out == Path::new("-") {
                write(&mut io::stdout().lock())
            } else {
                File::create(&out).and_then(|mut f| write(&mut f))
            };
            result.map_err(|e| format!("cannot write {}: {e}", out.display()))
        }
        Command::Replay {
            log,
            format,
            policies,
            top,
            csv,
            chart,
        } => replay(&log, format, &policies, top, csv, chart),
    }
}

fn load(path: &Path) -> Result<(String, axum_app::AppConfig), String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the policy file {}: {e}", path.display()))?;
    let config = axum_app::AppConfig::parse(&text).map_err(|e| {
        let mut message = format!("{}: {e}", path.display());
        let mut source = std::error::Error::source(&e);
        while let Some(cause) = source {
            message.push_str(&format!(": {cause}"));
            source = cause.source();
        }
        message
    })?;
    // The file's name, as the report's columns are narrow.
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    Ok((name, config))
}

fn replay(
    log: &Path,
    format: AccessFormat,
    policies: &[PathBuf],
    top: usize,
    csv: Option<PathBuf>,
    chart_path: Option<PathBuf>,
) -> Result<(), String> {
    let files = policies.iter().map(|p| load(p)).collect::<Result<_, _>>()?;
    let mut replay = Replay::new(files).map_err(|e| e.to_string())?;
    let (input, bar): (Box<dyn BufRead>, ProgressBar) = if log == Path::new("-") {
        (Box::new(io::stdin().lock()), ProgressBar::new_spinner())
    } else {
        let file =
            File::open(log).map_err(|e| format!("cannot open the log {}: {e}", log.display()))?;
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        let bar = ProgressBar::new(len);
        if let Ok(style) = ProgressStyle::with_template(
            "{elapsed_precise} [{wide_bar}] {bytes}/{total_bytes} ({eta}) {msg}",
        ) {
            bar.set_style(style);
        }
        (
            Box::new(BufReader::with_capacity(1 << 16, bar.wrap_read(file))),
            bar,
        )
    };
    let started = Instant::now();
    let mut log = AccessLog::new(input, format);
    let runtime = log_replay::runtime().map_err(|e| format!("cannot start the runtime: {e}"))?;
    runtime.block_on(async {
        while let Some(record) = log.next() {
            let record = record.map_err(|e| format!("cannot read the log: {e}"))?;
            replay.send(&record).await;
            if log.lines() % 65_536 == 0 {
                bar.set_message(format!("{} lines", log.lines()));
            }
        }
        Ok::<(), String>(())
    })?;
    bar.finish_and_clear();
    let elapsed = started.elapsed();
    println!(
        "read {} lines in {:.2} s: {} malformed, skipped",
        log.lines(),
        elapsed.as_secs_f64(),
        log.malformed()
    );
    for sample in log.samples() {
        println!("  {sample}");
    }
    print!("{}", report::text(&replay, top));
    if let Some(path) = csv {
        let write = || -> io::Result<()> {
            let mut out = BufWriter::new(File::create(&path)?);
            report::csv(&replay, &mut out)?;
            out.flush()
        };
        write().map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    if let Some(path) = chart_path {
        let svg = chart::svg(replay.lanes(), "refusals of each policy file over the log");
        let svg_path = path.with_extension("svg");
        std::fs::write(&svg_path, &svg)
            .map_err(|e| format!("cannot write {}: {e}", svg_path.display()))?;
        let png = tollgate_sim::chart::png(&svg).map_err(|e| e.to_string())?;
        let png_path = path.with_extension("png");
        std::fs::write(&png_path, png)
            .map_err(|e| format!("cannot write {}: {e}", png_path.display()))?;
        println!("chart: {} and {}", svg_path.display(), png_path.display());
    }
    Ok(())
}
