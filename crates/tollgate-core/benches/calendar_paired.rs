//! A fixed-window check on a calendar period (a month in Europe/Berlin)
//! against the same check on a period aligned to the epoch (a day), in
//! paired blocks, on the memory store: what the calendar costs a decision.
//! Each round times a block of epoch-aligned checks, then the same block
//! of calendar checks; the ratio is taken per round.
//!
//! Run with: `cargo bench -p tollgate-core --bench calendar_paired`
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::hint::black_box;

use tollgate_core::{Algorithm, Calendar, Key, MemoryStore, Policy};

mod common;
use common::spread;

const ROUNDS: usize = 21;
/// Checks per block.
const BLOCK: u64 = 1_000_000;
const KEYS: u64 = 10_000;

fn block(offset: u64, check: impl Fn(u64) + Sync) -> f64 {
    spread(offset..offset + BLOCK, 1, check).as_secs_f64() * 1e9 / BLOCK as f64
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let smoke = std::env::args().any(|a| a == "--test");
    let rounds = if smoke { 1 } else { ROUNDS };
    let epoch = Policy::builder("bench-day")
        .algorithm(Algorithm::FixedWindow)
        .limit("4000000000/day")
        .build()
        .unwrap();
    let calendar = Policy::builder("bench-month")
        .algorithm(Algorithm::FixedWindow)
        .limit("4000000000/month")
        .calendar(Calendar::new("Europe/Berlin").unwrap())
        .build()
        .unwrap();
    let store = MemoryStore::builder().max_keys(1_000_000).build().unwrap();
    let run = |policy: &Policy, offset| {
        block(offset, |i| {
            let key = Key::user((i % KEYS).to_be_bytes());
            let decision = store.check_sync(&key, policy, 1).unwrap();
            assert!(black_box(decision).is_allowed());
        })
    };
    run(&epoch, 0);
    run(&calendar, 0);
    let (mut e, mut c, mut r) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let offset = (round as u64 + 1) * BLOCK;
        let plain = run(&epoch, offset);
        let cal = run(&calendar, offset);
        e.push(plain);
        c.push(cal);
        r.push(cal / plain);
    }
    println!(
        "Fixed window, {KEYS} keys, 1 thread: medians of {rounds} paired rounds of {BLOCK} checks\n"
    );
    println!("| a day from the epoch | a month in Europe/Berlin | ratio, median of rounds |");
    println!("|---:|---:|---:|");
    println!(
        "| {:.0} ns | {:.0} ns | {:.2} |",
        median(&mut e),
        median(&mut c),
        median(&mut r)
    );
}
