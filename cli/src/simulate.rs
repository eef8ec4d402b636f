//! `mla-cache simulate`: replay a workload through the block manager.

use mla_cache_sim::simulate;

use crate::progress::progress_bar;
use crate::simulate_args::SimulateArgs;
use crate::sweep;

/// Runs `mla-cache simulate`.
pub fn run(args: &SimulateArgs) -> Result<(), String> {
    let (name, trace) = args.load()?;
    if let Some(path) = &args.save_trace {
        std::fs::write(path, trace.to_jsonl())
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    if args.sweep {
        return sweep::run(args, &name, &trace);
    }
    let config = args.with_tiers(args.sim_config(args.dtype, args.num_blocks()?))?;
    let bar = progress_bar(trace.requests.len() as u64, "simulating");
    let report = simulate(&name, &trace.requests, &config, |done, _| {
        bar.set_position(done as u64)
    })
    .map_err(|e| e.to_string())?;
    bar.finish_and_clear();
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("a report always serializes")
        );
    } else {
        print!("{report}");
    }
    Ok(())
}
