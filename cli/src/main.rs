//! `mla-cache`: what an MLA cache does for a serving deployment.
//!
//! - `simulate` replays a workload (the embedded Mooncake trace by default)
//!   through the block manager and reports hit rates, evictions, usage,
//!   queueing and the manager's own cost; `--sweep` plots hit rate against
//!   cache memory for every storage format.
//! - `plan` sizes the cache of a deployment: tokens, blocks and sequences
//!   per GPU for each format, beside MHA and GQA-8 caches of the same model.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod args;
mod plan;
mod plot;
mod progress;
mod simulate;
mod simulate_args;
mod sweep;

/// Paged KV cache for Multi-head Latent Attention (DeepSeek-V2/V3/R1, Kimi-K2).
#[derive(Debug, Parser)]
#[command(name = "mla-cache", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Replay a serving workload through the block manager.
    Simulate(simulate_args::SimulateArgs),
    /// Size the cache of a deployment: tokens and sequences per GPU.
    Plan(plan::PlanArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Simulate(args) => simulate::run(&args),
        Command::Plan(args) => plan::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}
