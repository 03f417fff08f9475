//! A memory-store check with and without `WatchedStore` counting it in
//! `TopKeys` (8 shards of 128 counters), in paired blocks: what counting
//! the top keys costs a decision. Two key sets: 100 hot keys, which all
//! hold a counter (an increment), and 100,000 keys in turn, none of which
//! stays (each takes the smallest counter and is labelled: the worst
//! case). Each round times a block of plain checks, then the same block
//! through the wrapper; the ratio is taken per round.
//!
//! Run with: `cargo bench -p tollgate-core --bench topkeys_paired`
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::hint::black_box;

use tollgate_core::topkeys::{TopKeys, WatchedStore};
use tollgate_core::{Algorithm, Key, MemoryStore, Policy, Store};

mod common;
use common::spread;

const ROUNDS: usize = 21;
/// Checks per block.
const BLOCK: u64 = 500_000;

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let smoke = std::env::args().any(|a| a == "--test");
    let rounds = if smoke { 1 } else { ROUNDS };
    let policy = Policy::new("bench", Algorithm::Gcra, "4000000000/s").unwrap();
    println!("GCRA, 1 thread: medians of {rounds} paired rounds of {BLOCK} checks\n");
    println!("| keys | plain | watched | difference | ratio, median of rounds |");
    println!("|---:|---:|---:|---:|---:|");
    for keys in [100u64, 100_000] {
        let plain = MemoryStore::builder().max_keys(1_000_000).build().unwrap();
        let watched = WatchedStore::new(
            MemoryStore::builder().max_keys(1_000_000).build().unwrap(),
            TopKeys::new(),
        );
        let run = |store: &(dyn Fn(&Key) + Sync), offset: u64| {
            spread(offset..offset + BLOCK, 1, |i| {
                store(&Key::user((i % keys).to_be_bytes()))
            })
            .as_secs_f64()
                * 1e9
                / BLOCK as f64
        };
        let check_plain = |key: &Key| {
            let d = plain.try_check_now(key, &policy, 1).unwrap().unwrap();
            assert!(black_box(d).is_allowed());
        };
        let check_watched = |key: &Key| {
            let d = watched.try_check_now(key, &policy, 1).unwrap().unwrap();
            assert!(black_box(d).is_allowed());
        };
        run(&check_plain, 0);
        run(&check_watched, 0);
        let (mut p, mut w, mut r) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            let offset = (round as u64 + 1) * BLOCK;
            let a = run(&check_plain, offset);
            let b = run(&check_watched, offset);
            p.push(a);
            w.push(b);
            r.push(b / a);
        }
        let (pm, wm) = (median(&mut p), median(&mut w));
        println!(
            "| {keys} | {pm:.0} ns | {wm:.0} ns | {:.0} ns | {:.2} |",
            wm - pm,
            median(&mut r)
        );
    }
}
