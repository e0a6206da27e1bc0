//! `hotpath`: run an x86-64 Linux program under the dynamic binary translator and profile it
//! (see the library's root for the commands).

use std::process::ExitCode;

use clap::Parser;
use hotpath::cli::{Cli, Command};

fn main() -> ExitCode {
    // Read the usable CPUs before any thread is pinned (children inherit masks).
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    match Cli::parse().command {
        Command::Run(args) => hotpath::session::run(args, &cores),
        Command::Report(args) => hotpath::report(args),
        Command::Merge(args) => hotpath::merge(args),
        Command::Bench(args) => hotpath::bench::bench(args),
    }
}
