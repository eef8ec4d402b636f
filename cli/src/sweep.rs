//! `mla-cache simulate --sweep`: hit rate against cache memory, per format
//! and per eviction policy, beside the offline optimum.
//!
//! The manager never looks at the bytes, so the hit rate depends only on
//! how many blocks the cache holds. The sweep therefore simulates each cache
//! size once and places it on the memory axis once per format: the format
//! decides how many tokens a GiB holds. Markers show the memory an MHA and a
//! GQA-8 cache of the same model would need for the tokens of the configured
//! cache.
//!
//! Every policy is replayed through the manager (the event-driven
//! simulation) and through the cache-only model, whose offline optimum
//! (Belady, see `mla_cache_sim::belady`) bounds what any policy of that
//! model can hit.

use std::fmt::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use mla_cache::{Dtype, EvictionPolicyKind};
use mla_cache_sim::units::{format_bytes, gib, thousands};
use mla_cache_sim::{
    belady, cache_only, simulate, BlockKeys, CacheModelReport, SimConfig, SimReport, Trace,
};

use crate::plot::{Chart, Marker, Series};
use crate::progress::progress_bar;
use crate::simulate_args::SimulateArgs;

/// Token capacities swept: 2^18 to 2^24 in steps of sqrt(2).
fn token_grid() -> impl Iterator<Item = usize> {
    (36..=48).map(|half_log2| 2f64.powf(half_log2 as f64 / 2.0).round() as usize)
}

/// Plot colour of each format.
fn color(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::Bf16 => "#1f77b4",
        Dtype::Fp8DsMla => "#d62728",
        Dtype::Mxfp6 => "#2ca02c",
        Dtype::Nvfp4DsMla => "#9467bd",
    }
}

/// Plot colours of the policies' curves, by their place in the registry.
const POLICY_COLORS: [&str; 6] = [
    "#8c564b", "#9467bd", "#17becf", "#ff7f0e", "#2ca02c", "#e377c2",
];

/// Plot colour of each policy's curve and of the bound (configured format).
fn policy_color(policy: Option<EvictionPolicyKind>) -> &'static str {
    match policy {
        Some(p) => POLICY_COLORS[p as usize % POLICY_COLORS.len()],
        None => "#000000",
    }
}

/// One cache size: the manager's replay per policy, the cache-only model
/// per policy, and the bound.
#[derive(serde::Serialize)]
struct SizePoint {
    num_blocks: usize,
    cache_only: Vec<CacheModelReport>,
    belady: CacheModelReport,
}

/// Runs the sweep, prints a table and writes the plot.
pub fn run(args: &SimulateArgs, name: &str, trace: &Trace) -> Result<(), String> {
    let bs = args.block_size;
    let reference_blocks = args.num_blocks()?;
    let largest = trace
        .requests
        .iter()
        .map(|r| (r.input_length + r.output_length).div_ceil(bs))
        .max()
        .unwrap_or(1);
    // Grid sizes too close to the configured one would crowd its point.
    let near = |b: usize| (b as f64 / reference_blocks as f64 - 1.0).abs() < 0.1;
    let mut blocks: Vec<usize> = token_grid()
        .map(|t| t / bs)
        .filter(|&b| b >= largest && !near(b))
        .collect();
    blocks.push(reference_blocks);
    blocks.sort_unstable();
    blocks.dedup();

    let runs: Vec<(usize, EvictionPolicyKind)> = blocks
        .iter()
        .flat_map(|&n| EvictionPolicyKind::ALL.map(|k| (n, k)))
        .collect();
    let all = run_all(args, name, trace, &runs)?;
    let keys = BlockKeys::new(&trace.requests, bs);
    let points: Vec<SizePoint> = blocks
        .iter()
        .map(|&n| SizePoint {
            num_blocks: n,
            cache_only: EvictionPolicyKind::ALL
                .map(|k| cache_only(&keys, n, k))
                .to_vec(),
            belady: belady(&keys, n),
        })
        .collect();
    let replay = |n: usize, k: EvictionPolicyKind| {
        all.iter()
            .find(|r| r.config.num_blocks == n && r.config.eviction == k)
            .expect("every size ran with every policy")
    };
    let reports: Vec<&SimReport> = blocks.iter().map(|&n| replay(n, args.eviction)).collect();

    let reference = args.cache_config(args.dtype, reference_blocks)?;
    let tokens = reference.num_tokens() as u64;
    let model = &args.model;
    let bf16_bytes = |elements: usize| (model.num_layers * elements * 2) as u64;
    let mha = bf16_bytes(model.mha_elements_per_token()) * tokens;
    let gqa = bf16_bytes(model.gqa_elements_per_token(8)) * tokens;

    let mut text = String::new();
    let _ = writeln!(
        text,
        "sweep: {name}, {}, eviction {}, {} ms per output token",
        model.name, args.eviction, args.tpot_ms
    );
    let _ = writeln!(
        text,
        "hit rates: replayed through the manager, and in the cache-only model beside its offline optimum (Belady)"
    );
    let _ = write!(text, "{:>9} {:>11}", "blocks", "tokens");
    for k in EvictionPolicyKind::ALL {
        let _ = write!(text, " {:>9}", k.name());
    }
    for k in EvictionPolicyKind::ALL {
        let _ = write!(text, " {:>9}", format!("{}*", k.name()));
    }
    let _ = write!(
        text,
        " {:>9} {:>11} {:>10}",
        "belady*", "evictions", "p99 queue"
    );
    for d in Dtype::ALL {
        let _ = write!(text, " {:>12}", d.name());
    }
    let _ = writeln!(text);
    let mut series: Vec<Series> = Dtype::ALL
        .iter()
        .map(|&d| Series {
            name: d.name().to_string(),
            color: color(d),
            points: Vec::new(),
        })
        .collect();
    let mut policy_series: Vec<Series> = EvictionPolicyKind::ALL
        .iter()
        .filter(|&&k| k != args.eviction)
        .map(|&k| Series {
            name: format!("{}, {}", args.dtype, k),
            color: policy_color(Some(k)),
            points: Vec::new(),
        })
        .collect();
    let mut bound = Series {
        name: format!("{}, Belady bound (cache-only model)", args.dtype),
        color: policy_color(None),
        points: Vec::new(),
    };
    for (r, point) in reports.iter().zip(&points) {
        let n = r.config.num_blocks;
        let marker = if n == reference_blocks { ">" } else { " " };
        let _ = write!(
            text,
            "{marker}{:>8} {:>11}",
            thousands(n as u64),
            thousands(r.cache_tokens as u64),
        );
        for k in EvictionPolicyKind::ALL {
            let _ = write!(text, " {:>8.1}%", 100.0 * replay(n, k).token_hit_rate);
        }
        for m in point.cache_only.iter().chain([&point.belady]) {
            let _ = write!(text, " {:>8.1}%", 100.0 * m.token_hit_rate);
        }
        let _ = write!(
            text,
            " {:>11} {:>9.1}s",
            thousands(r.evictions),
            r.queue_delay_ms.p99 / 1e3
        );
        let gib_here = gib(args.cache_config(args.dtype, n)?.total_bytes() as u64);
        for s in &mut policy_series {
            let kind = EvictionPolicyKind::ALL
                .into_iter()
                .find(|k| s.name.ends_with(k.name()))
                .expect("series are named after policies");
            s.points.push((gib_here, replay(n, kind).token_hit_rate));
        }
        bound.points.push((gib_here, point.belady.token_hit_rate));
        for (s, &d) in series.iter_mut().zip(Dtype::ALL.iter()) {
            let bytes = args.cache_config(d, r.config.num_blocks)?.total_bytes() as u64;
            let _ = write!(text, " {:>12}", format_bytes(bytes));
            s.points.push((gib(bytes), r.token_hit_rate));
        }
        let _ = writeln!(text);
    }
    let reference_hit = reports
        .iter()
        .find(|r| r.config.num_blocks == reference_blocks)
        .map(|r| {
            (
                r.token_hit_rate,
                format!(
                    "{:.1} % with {} tokens",
                    100.0 * r.token_hit_rate,
                    thousands(tokens)
                ),
            )
        });
    let _ = writeln!(
        text,
        "plain: replayed through the manager; *: the cache-only model (one request at a time, no decode); evictions and queueing: {}",
        args.eviction
    );
    let _ = writeln!(
        text,
        "> this cache: {} tokens, {} in {}. The same tokens take {} as GQA-8 bf16 and {} as MHA bf16.",
        thousands(tokens),
        format_bytes(reference.total_bytes() as u64),
        args.dtype,
        format_bytes(gqa),
        format_bytes(mha)
    );

    let chart = Chart {
        title: format!("Prefix hit rate against cache memory: {}, {}", model.name, name),
        subtitle: vec![
            "The hit rate depends only on the tokens the cache holds; the storage format sets how many fit in a GiB."
                .to_string(),
            format!(
                "Per format with eviction {}; for {}, every other policy and the offline bound of the cache-only model.",
                args.eviction, args.dtype
            ),
            format!(
                "Dashed lines: memory that the {} tokens of this cache take as MLA {}, GQA-8 bf16 and MHA bf16 (one copy, no TP).",
                thousands(tokens),
                args.dtype
            ),
        ],
        x_label: "cache memory, all layers (log scale)".to_string(),
        y_label: "prompt tokens served from cache".to_string(),
        series: series.into_iter().chain(policy_series).chain([bound]).collect(),
        markers: vec![
            Marker { label: format!("this cache: {}", format_bytes(reference.total_bytes() as u64)), gib: gib(reference.total_bytes() as u64), color: color(args.dtype) },
            Marker { label: format!("GQA-8 bf16: {}", format_bytes(gqa)), gib: gib(gqa), color: "#555555" },
            Marker { label: format!("MHA bf16: {}", format_bytes(mha)), gib: gib(mha), color: "#555555" },
        ],
        reference_hit,
    };
    std::fs::write(&args.out, chart.render())
        .map_err(|e| format!("cannot write {}: {e}", args.out.display()))?;
    if args.json {
        let doc = serde_json::json!({
            "reference_tokens": tokens,
            "gqa8_bf16_bytes": gqa,
            "mha_bf16_bytes": mha,
            "reports": reports,
            "policies": all,
            "cache_only": points,
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&doc).expect("reports always serialize")
        );
    } else {
        print!("{text}");
        println!("wrote {}", args.out.display());
    }
    Ok(())
}

/// Simulates every (cache size, policy), on as many threads as the machine offers.
fn run_all(
    args: &SimulateArgs,
    name: &str,
    trace: &Trace,
    runs: &[(usize, EvictionPolicyKind)],
) -> Result<Vec<SimReport>, String> {
    let bar = progress_bar((runs.len() * trace.requests.len()) as u64, "sweeping");
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<SimReport, String>>>> = Mutex::new(vec![None; runs.len()]);
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(runs.len());
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(n, kind)) = runs.get(i) else { break };
                let mut last = 0;
                let config = SimConfig {
                    eviction: kind,
                    ..args.sim_config(args.dtype, n)
                };
                let report = simulate(name, &trace.requests, &config, |done, _| {
                    bar.inc((done - last) as u64);
                    last = done;
                })
                .map_err(|e| e.to_string());
                results.lock().expect("no worker panics")[i] = Some(report);
            });
        }
    });
    bar.finish_and_clear();
    results
        .into_inner()
        .expect("no worker panics")
        .into_iter()
        .map(|r| r.expect("every size ran"))
        .collect()
}
