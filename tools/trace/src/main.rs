//! The `devcmd-trace` binary: parses the command line, runs, prints, and exits with 0 (done), 1
//! (`--verify` found an inconsistency) or 2 (bad usage or input). Everything else is in the
//! library (`lib.rs`).

use devcmd_trace::cli::{self, Command};
use devcmd_trace::{report, run};
use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    let result = cli::parse(std::env::args().skip(1)).and_then(|command| match command {
        Command::Help => {
            print!("{}", cli::help());
            Ok(())
        }
        Command::Version => {
            println!("devcmd-trace {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        Command::Run(options) => run(&options).map(|outcome| {
            let text = if options.json {
                report::json(&outcome) + "\n"
            } else {
                report::human(&outcome)
            };
            // A closed stdout (`| head`) is not an error worth a panic.
            let _ = std::io::stdout().lock().write_all(text.as_bytes());
        }),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("devcmd-trace: {failure}");
            ExitCode::from(failure.exit_code())
        }
    }
}
