//! What the tool prints and writes: the JSON object and its keys, the SVG per configuration,
//! progress only on stderr, the help, and usage errors (exit 2).

mod common;

use common::{QUICK, data, run, scratch};
use devcmd_trace::presets::{FIELDS, PRESETS};
use serde_json::Value;

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("{v} is not a number"))
}

/// The `--json` object of a quick replay of the tiny fixture with presets `a` and `b`.
fn tiny_json(a: &str, b: &str) -> Value {
    let trace = data("tiny.csv.gz");
    let mut args = vec![trace.as_str(), "--json", "-c", a, "-c", b];
    args.extend(QUICK);
    run(&args).json()
}

#[test]
fn json_has_the_keys_and_they_agree() {
    let j = tiny_json("default", "pages");
    for key in [
        "trace",
        "ops",
        "live_peak",
        "held_peak",
        "held_over_live",
        "held_over_live_time",
        "map_calls_per_op",
        "ns_per_op",
        "pages",
    ] {
        assert!(!j[key].is_null(), "top-level {key} missing: {j}");
    }
    let configs = j["configs"].as_array().unwrap();
    let names: Vec<&str> = configs
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["default", "pages"]);
    for key in [
        "live_peak",
        "held_peak",
        "held_over_live",
        "held_over_live_time",
        "map_calls_per_op",
        "ns_per_op",
        "pages",
    ] {
        assert_eq!(
            j[key], configs[0][key],
            "top-level {key} is the first config's"
        );
    }
    assert_eq!(j["live_peak"], j["trace_live_peak"]);
    // Pages: every device call that maps or unmaps is a page allocated or freed.
    let pages = &configs[1];
    assert_eq!(
        f(&pages["map_calls"]),
        f(&pages["pages_allocated"]) + f(&pages["pages_freed"]),
        "{pages}"
    );
    for c in configs {
        let (live, held) = (f(&c["live_peak"]), f(&c["held_peak"]));
        assert!(held >= live && live > 0.0, "{c}");
        assert!((f(&c["held_over_live"]) - held / live).abs() < 1e-9, "{c}");
        // Held covers what is live after every operation, so over time too.
        assert!(f(&c["held_over_live_time"]) >= 1.0, "{c}");
        let ops = f(&j["ops"]);
        assert!((f(&c["map_calls_per_op"]) - f(&c["map_calls"]) / ops).abs() < 1e-9);
        assert!(f(&c["map_calls_per_op_warm"]) >= 0.0, "{c}");
        assert!(f(&c["ns_per_op"]) > 0.0 && f(&c["ns_per_op_warm"]) > 0.0);
        let min = f(&c["min_budget"]);
        assert!(min >= live && min <= held * 2.0, "{c}");
        assert!(f(&c["pages"]) >= 1.0);
        assert!(f(&c["pages_allocated"]) >= f(&c["pages_freed"]));
        assert_eq!(c["failed_reservations"], 0);
        let pools = c["pools"].as_array().unwrap();
        assert!(!pools.is_empty());
        let held_max: f64 = pools.iter().map(|p| f(&p["held_max"])).sum();
        assert!(
            held_max >= held,
            "pools' maxima add up to at least the held peak: {c}"
        );
    }
}

#[test]
fn giving_idle_granules_back_holds_less_over_time() {
    let j = tiny_json("default", "give-back");
    let c = j["configs"].as_array().unwrap();
    let time = |i: usize| f(&c[i]["held_over_live_time"]);
    assert!(
        time(1) < time(0),
        "give-back {} against default {}",
        time(1),
        time(0)
    );
    let config = c[1]["config"].as_str().unwrap();
    assert!(
        config.contains("Slack { per_64: 64, floor: 0 }"),
        "{config}"
    );
}

#[test]
fn the_human_report_has_the_figures_side_by_side() {
    let trace = data("tiny.csv");
    let mut args = vec![
        trace.as_str(),
        "-c",
        "default",
        "-c",
        "pages",
        "--set",
        "arena_granule=2MiB",
    ];
    args.extend(QUICK);
    let r = run(&args);
    assert_eq!(r.code, 0, "{}", r.stderr);
    for needle in [
        "live peak",
        "held peak",
        "held / live",
        "held / live over time",
        "map+unmap calls / op",
        "pages at held peak",
        "pages allocated / freed",
        "ns per op (cold)",
        "ns per op (warm)",
        "failed reservations",
        "min budget",
        "within 1 MiB",
        "default",
        "pages",
        "arena_granule=2 MiB",
    ] {
        assert!(
            r.stdout.contains(needle),
            "{needle:?} missing:\n{}",
            r.stdout
        );
    }
}

#[test]
fn svg_is_written_per_config_with_a_path_per_pool() {
    let trace = data("tiny.csv.gz");
    let out = scratch("timeline.svg");
    let mut args = vec![
        trace.as_str(),
        "--json",
        "--svg",
        &out,
        "-c",
        "default",
        "-c",
        "pages",
    ];
    args.extend(QUICK);
    let j = run(&args).json();
    for c in j["configs"].as_array().unwrap() {
        let name = c["name"].as_str().unwrap();
        let path = c["svg"].as_str().unwrap();
        assert!(path.ends_with(&format!("timeline-{name}.svg")), "{path}");
        let svg = std::fs::read_to_string(path).unwrap();
        assert!(svg.starts_with("<svg"), "{path}");
        assert!(svg.trim_end().ends_with("</svg>"), "{path}");
        assert_eq!(svg.matches("<svg").count(), 1);
        for p in c["pools"].as_array().unwrap() {
            let pool = p["name"].as_str().unwrap();
            for class in ["pool-held", "pool-used"] {
                let needle = format!(r#"<path class="{class}" data-pool="{pool}" d="M"#);
                assert!(svg.contains(&needle), "{path}: no {class} path for {pool}");
            }
        }
        for needle in [
            r#"class="total-held""#,
            r#"class="total-live""#,
            r#"class="min-budget""#,
            "held / live over time: ",
            "map + unmap calls / op: ",
            ">MiB<",
            "operation",
        ] {
            assert!(svg.contains(needle), "{path}: {needle} missing");
        }
        // Balanced elements (a cheap well-formedness check).
        for tag in ["g", "text"] {
            assert_eq!(
                svg.matches(&format!("<{tag}")).count(),
                svg.matches(&format!("</{tag}>")).count(),
                "<{tag}>"
            );
        }
    }
    // One config: the file as named.
    let single = scratch("single.svg");
    let mut args = vec![trace.as_str(), "--svg", &single, "--no-search"];
    args.extend(QUICK);
    assert_eq!(run(&args).code, 0);
    assert!(
        std::fs::read_to_string(&single)
            .unwrap()
            .starts_with("<svg")
    );
}

#[test]
fn progress_goes_to_stderr_only() {
    let trace = data("tiny.csv");
    let mut args = vec![trace.as_str(), "--json", "--progress"];
    args.extend(QUICK);
    let r = run(&args);
    let _ = r.json(); // stdout is exactly one JSON object
    assert!(
        r.stderr.contains("default: replay: ") && r.stderr.contains('%'),
        "{}",
        r.stderr
    );
    let mut args = vec![trace.as_str(), "--json", "--no-search"];
    args.extend(QUICK);
    assert!(
        run(&args).stderr.is_empty(),
        "no progress when stderr is not a terminal"
    );
}

#[test]
fn help_lists_every_option_preset_and_field() {
    let r = run(&["--help"]);
    assert_eq!(r.code, 0);
    for needle in [
        "--config",
        "--set",
        "--json",
        "--svg",
        "--verify",
        "--progress",
        "--budget",
        "--no-search",
        "--lenient",
        "--device",
        "--pages",
        "--total-memory",
        "--alignment",
        "--max-page",
        "--timing-seconds",
        "EXIT STATUS",
        "seq,action,id,size,stream",
    ] {
        assert!(r.stdout.contains(needle), "{needle} missing from --help");
    }
    for p in PRESETS {
        assert!(r.stdout.contains(p.name), "preset {} missing", p.name);
    }
    for f in FIELDS {
        assert!(r.stdout.contains(f.key), "field {} missing", f.key);
    }
    assert_eq!(run(&["-V"]).code, 0);
}

#[test]
fn usage_errors_exit_2_with_a_reason() {
    let trace = data("tiny.csv");
    for (args, needle) in [
        (vec![], "no trace given"),
        (vec![trace.as_str(), "--bogus"], "unknown option"),
        (vec![trace.as_str(), "--config", "nope"], "no such preset"),
        (
            vec![trace.as_str(), "-c", "default", "-c", "default"],
            "named twice",
        ),
        (vec![trace.as_str(), "--set", "nope=1"], "no field"),
        (
            vec![trace.as_str(), "--set", "arena_granule=lots"],
            "not a byte count",
        ),
        (vec![trace.as_str(), "--alignment", "300"], "power of two"),
        (vec![trace.as_str(), "--pages", "gpu"], "std"),
        (vec![trace.as_str(), "--svg"], "needs a file name"),
        (vec![trace.as_str(), trace.as_str()], "one trace at a time"),
        (vec!["/nonexistent/trace.csv"], "cannot open"),
    ] {
        let r = run(&args);
        assert_eq!(r.code, 2, "{args:?}: {}", r.stderr);
        assert!(
            r.stderr.contains(needle),
            "{args:?}: {needle:?} not in {}",
            r.stderr
        );
    }
}
