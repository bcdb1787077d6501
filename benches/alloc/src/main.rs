//! B1: the RMM `random_allocations` trace, replayed through devcmd's `MemoryManager` (over the std
//! shim), cubecl's `MemoryManagement` (over `BytesStorage`) and the system allocator, in one run.
//!
//! ```text
//! cd benches/alloc && cargo run --release -- [options]
//!   --n 1000,10000,100000     trace sizes (allocations per trace)
//!   --max-mib 1,4,64          largest allocation, MiB (sizes uniform in [1, max] bytes)
//!   --cells 1000:1,10000:64   explicit cells N:MAX_MIB (overrides --n/--max-mib)
//!   --cap-gib 4               live-bytes cap of the trace
//!   --seed 1                  SplitMix64 seed
//!   --contenders devcmd,cubecl,system
//!   --no-warm                 skip the second (warm) replay on the same manager
//! ```
//!
//! Per cell: the op list is generated once; each contender gets a fresh manager, replays the whole
//! list once (cold: ns/op = replay time / ops, peak held measured here), then replays it again on
//! the same manager (warm). Contenders run one after the other, each dropped before the next; the
//! order rotates from cell to cell. The table lists them in the order they ran.

mod contender;
mod cubecl;
#[cfg(feature = "devcmd")]
mod devcmd;
mod trace;

use contender::{Contender, Replay, System, replay};
use std::fmt::Write as _;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

struct Args {
    cells: Vec<(usize, u64)>,
    cap: u64,
    seed: u64,
    contenders: Vec<String>,
    warm: bool,
}

fn parse_list<T: std::str::FromStr>(s: &str) -> Vec<T> {
    s.split(',')
        .map(|x| x.trim().parse().unwrap_or_else(|_| panic!("bad value {x:?}")))
        .collect()
}

fn parse_args() -> Args {
    let mut ns: Vec<usize> = vec![1_000, 10_000, 100_000];
    let mut maxes: Vec<u64> = vec![1, 4, 64];
    let mut cells: Option<Vec<(usize, u64)>> = None;
    let mut cap_gib = 4u64;
    let mut seed = 1u64;
    let mut contenders: Vec<String> = ["devcmd", "cubecl", "system"].map(String::from).to_vec();
    let mut warm = true;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--n" => ns = parse_list(&val()),
            "--max-mib" => maxes = parse_list(&val()),
            "--cells" => {
                cells = Some(
                    val()
                        .split(',')
                        .map(|c| {
                            let (n, m) = c.split_once(':').expect("cell is N:MAX_MIB");
                            (n.parse().expect("N"), m.parse().expect("MAX_MIB"))
                        })
                        .collect(),
                )
            }
            "--cap-gib" => cap_gib = val().parse().expect("cap"),
            "--seed" => seed = val().parse().expect("seed"),
            "--contenders" => contenders = val().split(',').map(String::from).collect(),
            "--no-warm" => warm = false,
            "-h" | "--help" => {
                println!("see the header of benches/alloc/src/main.rs");
                std::process::exit(0);
            }
            other => panic!("unknown argument {other}"),
        }
    }
    let cells = cells.unwrap_or_else(|| {
        ns.iter()
            .flat_map(|&n| maxes.iter().map(move |&m| (n, m)))
            .collect()
    });
    #[cfg(not(feature = "devcmd"))]
    contenders.retain(|c| c != "devcmd");
    Args {
        cells,
        cap: cap_gib * GIB,
        seed,
        contenders,
        warm,
    }
}

struct Row {
    n: usize,
    max_mib: u64,
    contender: &'static str,
    cold: Replay,
    warm: Option<Replay>,
    live_peak: u64,
}

fn run<C: Contender>(mut c: C, ops: &[trace::Op], live_cap: usize, warm: bool) -> (&'static str, Replay, Option<Replay>) {
    let name = c.name();
    let cold = replay(&mut c, ops, live_cap);
    let warm = warm.then(|| replay(&mut c, ops, live_cap));
    drop(c);
    give_back_heap();
    (name, cold, warm)
}

/// Hands freed heap memory back to the kernel between contenders (glibc `malloc_trim`): the
/// pages both storages and the system anchor free mostly stay in glibc's heap (its mmap threshold
/// rises to 32 MiB after the first large free), already touched. Without this, the next contender
/// starts on warm, resident memory and the process' footprint adds up from cell to cell.
fn give_back_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        unsafe extern "C" {
            fn malloc_trim(pad: usize) -> i32;
        }
        // SAFETY: glibc's malloc_trim takes a byte count and has no other precondition.
        unsafe { malloc_trim(0) };
    }
}

/// Resident set of this process, MiB (Linux), for the progress lines.
fn rss_mib() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096 / MIB)
}

fn mib(b: u64) -> String {
    format!("{:.1}", b as f64 / MIB as f64)
}

fn opt<T>(v: Option<T>, f: impl Fn(T) -> String) -> String {
    v.map(f).unwrap_or_else(|| "—".into())
}

fn main() {
    let args = parse_args();
    let mut rows: Vec<Row> = Vec::new();
    eprintln!(
        "B1 random_allocations: cap {} GiB, seed {}, contenders {:?}, cells {:?}",
        args.cap / GIB,
        args.seed,
        args.contenders,
        args.cells
    );
    for (cell, &(n, max_mib)) in args.cells.iter().enumerate() {
        let t = trace::generate(n, max_mib * MIB, args.cap, args.seed);
        eprintln!(
            "cell N={n} max={max_mib} MiB: {} ops, {} allocs, live peak {} MiB ({} allocations)",
            t.ops.len(),
            t.allocs,
            mib(t.live_peak),
            t.live_count_peak
        );
        // Rotate the order from cell to cell, so no contender always runs first (on fresh memory).
        let k = args.contenders.len();
        for name in (0..k).map(|i| &args.contenders[(i + cell) % k]) {
            let (contender, cold, warm) = match name.as_str() {
                "system" => run(System, &t.ops, t.live_count_peak, args.warm),
                "cubecl" => run(cubecl::Cubecl::new(), &t.ops, t.live_count_peak, args.warm),
                #[cfg(feature = "devcmd")]
                "devcmd" => run(devcmd::Devcmd::new(), &t.ops, t.live_count_peak, args.warm),
                other => panic!("unknown contender {other}"),
            };
            eprintln!(
                "  {contender:7} cold {:8.1} ns/op  warm {:>8}  peak held {:>9} MiB  held after {:>9} MiB  failed {}  warm pages alloc/free {}  (rss now {} MiB)",
                cold.ns_per_op(),
                opt(warm, |w| format!("{:.1}", w.ns_per_op())),
                opt(cold.stats.peak_held, mib),
                opt(cold.stats.held_after, mib),
                cold.failed,
                opt(warm.and_then(|w| Some((w.stats.page_allocs?, w.stats.page_frees?))), |(a, f)| format!("{a}/{f}")),
                opt(rss_mib(), |r| r.to_string())
            );
            rows.push(Row {
                n,
                max_mib,
                contender,
                cold,
                warm,
                live_peak: t.live_peak,
            });
        }
    }
    println!("{}", table(&rows));
}

fn table(rows: &[Row]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| N | max MiB | contender | ns/op cold | ns/op warm | cubecl/this cold | cubecl/this warm | peak held MiB | peak live MiB | held/live | pages alloc/free | failed |"
    );
    let _ = writeln!(s, "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let anchor = rows
            .iter()
            .find(|a| a.n == r.n && a.max_mib == r.max_mib && a.contender == "cubecl");
        let cold_ratio = anchor.map(|a| a.cold.ns_per_op() / r.cold.ns_per_op());
        let warm_ratio = anchor.and_then(|a| Some(a.warm?.ns_per_op() / r.warm?.ns_per_op()));
        let st = r.cold.stats;
        let failed = r.cold.failed + r.warm.map_or(0, |w| w.failed);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.1} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.n,
            r.max_mib,
            r.contender,
            r.cold.ns_per_op(),
            opt(r.warm, |w| format!("{:.1}", w.ns_per_op())),
            opt(cold_ratio, |x| format!("{x:.2}×")),
            opt(warm_ratio, |x| format!("{x:.2}×")),
            opt(st.peak_held, mib),
            mib(r.live_peak),
            opt(st.peak_held, |h| format!("{:.3}", h as f64 / r.live_peak as f64)),
            match (st.page_allocs, st.page_frees) {
                (Some(a), Some(f)) => format!("{a}/{f}"),
                _ => "—".into(),
            },
            failed
        );
    }
    s
}
