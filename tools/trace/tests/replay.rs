//! Replays: the smallest budget really is one (it replays without a failed reservation and 1 MiB
//! less fails), `--verify` passes on the fixtures and on the stored traces, and the two devices
//! give the same figures.

mod common;

use common::{QUICK, data, run, stored_traces};

const MIB: u64 = 1 << 20;

fn replay_under(trace: &str, budget: u64) -> serde_json::Value {
    let b = budget.to_string();
    let mut args = vec![trace, "--json", "--no-search", "--budget", &b];
    args.extend(QUICK);
    run(&args).json()
}

#[test]
fn the_smallest_budget_replays_and_one_mib_less_fails() {
    for file in ["tiny.csv", "snapshot-tiny.pickle"] {
        let trace = data(file);
        let mut args = vec![
            trace.as_str(),
            "--json",
            "--budget-precision",
            "1MiB",
            "--no-timing",
        ];
        args.extend(QUICK);
        let j = run(&args).json();
        let c = &j["configs"][0];
        let min = c["min_budget"].as_u64().expect("a smallest budget");
        assert_eq!(c["min_budget_precision"], MIB);
        assert!(
            min - c["min_budget_fails_at"].as_u64().unwrap() <= MIB,
            "{c}"
        );
        let at = replay_under(&trace, min);
        assert_eq!(
            at["configs"][0]["failed_reservations"], 0,
            "{file} at {min}: {at}"
        );
        let below = replay_under(&trace, min - MIB);
        let failed = below["configs"][0]["failed_reservations"].as_u64().unwrap();
        assert!(
            failed > 0,
            "{file}: {} B (1 MiB under the smallest) did not fail",
            min - MIB
        );
        let first = below["configs"][0]["first_failure"].as_str().unwrap();
        assert!(
            first.contains("op ") && first.contains("line") || first.contains("device_traces"),
            "{first}"
        );
    }
}

#[test]
fn verify_passes_on_the_fixtures_on_both_devices() {
    for file in ["tiny.csv", "snapshot-tiny.pickle"] {
        let trace = data(file);
        let mut figures = Vec::new();
        for pages in ["std", "address"] {
            let r = run(&[
                &trace,
                "--verify",
                "--json",
                "--timing-seconds",
                "0",
                "--pages",
                pages,
            ]);
            let j = r.json();
            let c = &j["configs"][0];
            assert_eq!(c["verified"], true);
            assert_eq!(c["verified_ops"], j["ops"]);
            figures.push((
                c["held_peak"].clone(),
                c["pages"].clone(),
                c["pages_allocated"].clone(),
                c["pages_freed"].clone(),
                c["min_budget"].clone(),
                c["pools"].clone(),
            ));
        }
        assert_eq!(
            figures[0], figures[1],
            "{file}: std and address pages disagree"
        );
    }
}

/// `--verify` on every stored trace (`traces/` at the workspace root), on the address-only device
/// (the std device would need RAM for each trace's held peak). The timeline is written too.
#[test]
fn verify_passes_on_the_stored_traces() {
    let traces = stored_traces();
    if traces.is_empty() {
        eprintln!("skipped: no stored traces");
    }
    for t in traces {
        let path = t.to_string_lossy().into_owned();
        let svg = common::scratch(&format!("{}.svg", t.file_name().unwrap().to_string_lossy()));
        let mut args = vec![
            path.as_str(),
            "--verify",
            "--json",
            "--no-search",
            "--svg",
            &svg,
        ];
        args.extend(QUICK);
        let j = run(&args).json();
        let c = &j["configs"][0];
        assert_eq!(c["verified"], true, "{path}");
        assert_eq!(c["failed_reservations"], 0, "{path}");
        assert!(std::fs::read_to_string(&svg).unwrap().starts_with("<svg"));
        eprintln!(
            "{path}: {} ops, held/live {:.3}, verified",
            j["ops"],
            c["held_over_live"].as_f64().unwrap()
        );
    }
}

#[test]
fn a_budget_below_the_live_peak_fails_and_says_where() {
    let trace = data("tiny.csv");
    let j = replay_under(&trace, 16 * MIB);
    let c = &j["configs"][0];
    assert!(c["failed_reservations"].as_u64().unwrap() > 0);
    let first = c["first_failure"].as_str().unwrap();
    assert!(first.contains("line "), "{first}");
}

#[test]
fn fenced_replays_verify_and_take_retiring_granules_back_without_a_call() {
    let trace = data("tiny.csv.gz");
    let figures = |fenced: bool| {
        let mut args = vec![
            trace.as_str(),
            "--json",
            "--verify",
            "-c",
            "default",
            "-c",
            "give-back",
        ];
        if fenced {
            args.push("--fenced");
        }
        args.extend(QUICK);
        let r = run(&args);
        assert_eq!(r.code, 0, "fenced {fenced}: {}", r.stderr);
        r.json()
    };
    let (now, fenced) = (figures(false), figures(true));
    for i in 0..2 {
        let (a, b) = (&now["configs"][i], &fenced["configs"][i]);
        assert_eq!(b["verified"], true, "{b}");
        assert_eq!(a["live_peak"], b["live_peak"]);
    }
    // On this fixture, growth at the peak swaps idle granules: fenced, a placement takes the
    // retiring ones back before their fence instead of mapping new ones.
    let calls = |j: &serde_json::Value| j["configs"][0]["map_calls"].as_u64().unwrap();
    assert!(
        calls(&fenced) < calls(&now),
        "{} against {}",
        calls(&fenced),
        calls(&now)
    );
}
