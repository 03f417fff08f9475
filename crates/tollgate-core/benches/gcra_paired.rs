//! The memory store's GCRA check against `governor`'s keyed GCRA check, in
//! paired blocks: each round times a block of governor checks and then the
//! same block of tollgate checks, and the ratio is taken per round. On a
//! shared machine, whose speed drifts by tens of percent within a minute,
//! the median of paired ratios is steadier than two separate criterion
//! measurements.
//!
//! Both sides build their key per check, use their system clock, admit every
//! check, and keep every key's state live for the whole run (10/s with a
//! burst of four billion), as in the `memory_store` bench.
//!
//! Run with: `cargo bench -p tollgate-core --bench gcra_paired`
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::hint::black_box;
use std::num::NonZeroU32;

use governor::{Quota, RateLimiter};
use tollgate_core::{Key, MemoryStore, Policy};

mod common;
use common::spread;

const ROUNDS: usize = 21;
/// Checks per block, over all threads.
const BLOCK: u64 = 2_000_000;
const BURST: u32 = 4_000_000_000;

/// Runs `check(i)` for `i` in `offset..offset + BLOCK` spread over
/// `threads` threads; returns the time per check in nanoseconds.
fn block(threads: u64, offset: u64, check: impl Fn(u64) + Sync) -> f64 {
    spread(offset..offset + BLOCK, threads, check).as_secs_f64() * 1e9 / BLOCK as f64
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    // `cargo test --benches` runs bench targets with `--test`: one small
    // pass is enough there.
    let smoke = std::env::args().any(|a| a == "--test");
    let rounds = if smoke { 1 } else { ROUNDS };
    let quota = Quota::per_second(NonZeroU32::new(10).unwrap())
        .allow_burst(NonZeroU32::new(BURST).unwrap());
    let policy = Policy::builder("bench")
        .limit("10/s")
        .burst(u64::from(BURST))
        .build()
        .unwrap();

    println!("GCRA check, time per check: medians of {rounds} paired rounds of {BLOCK} checks\n");
    println!("| keys | threads | governor | tollgate | ratio, median of rounds |");
    println!("|---:|---:|---:|---:|---:|");
    for threads in [1u64, 2] {
        for keys in [1u64, 100_000] {
            let governor = RateLimiter::<u64, _, _>::dashmap(quota);
            let store = MemoryStore::builder().max_keys(1_000_000).build().unwrap();
            let run_governor = |offset| {
                block(threads, offset, |i| {
                    assert!(black_box(governor.check_key(&(i % keys))).is_ok());
                })
            };
            let run_tollgate = |offset| {
                block(threads, offset, |i| {
                    let key = Key::user((i % keys).to_be_bytes());
                    let decision = store.check_sync(&key, &policy, 1).unwrap();
                    assert!(black_box(decision).is_allowed());
                })
            };
            // Warm up: every key exists on both sides before timing.
            run_governor(0);
            run_tollgate(0);
            let (mut g, mut t, mut r) = (Vec::new(), Vec::new(), Vec::new());
            for round in 0..rounds {
                let offset = (round as u64 + 1) * BLOCK;
                let gov = run_governor(offset);
                let tg = run_tollgate(offset);
                g.push(gov);
                t.push(tg);
                r.push(tg / gov);
            }
            println!(
                "| {keys} | {threads} | {:.1} ns | {:.1} ns | {:.2} |",
                median(&mut g),
                median(&mut t),
                median(&mut r)
            );
        }
    }
}
