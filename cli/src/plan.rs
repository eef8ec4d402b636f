//! `mla-cache plan`: how many tokens and sequences a deployment's cache holds.
//!
//! An MLA cache has a single latent "head" per layer, which every tensor-
//! parallel rank needs whole: it is replicated on all `tp` ranks, so tensor
//! parallelism does not divide it. DeepSeek-V3.2 keeps its indexer keys
//! (132 bytes per token and layer) beside the latent, replicated the same way. MHA and GQA caches are split by KV heads
//! across ranks (a GQA model with fewer KV heads than ranks replicates each
//! head on `tp / groups` ranks).

use clap::Args;
use mla_cache::{CacheConfig, Dtype, ModelGeometry};
use mla_cache_sim::units::{format_bytes, thousands};
use serde::Serialize;

use crate::args;

/// Options of `mla-cache plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Model preset: deepseek-v3 (also r1, v3.1), deepseek-v3.2 (with its indexer keys),
    /// deepseek-v2, deepseek-v2-lite, kimi-k2.
    #[arg(long, value_parser = args::model, default_value = "deepseek-v3")]
    pub model: ModelGeometry,
    /// Override the preset's layer count.
    #[arg(long)]
    pub layers: Option<usize>,
    /// Override the preset's attention heads (for the MHA comparison).
    #[arg(long)]
    pub heads: Option<usize>,
    /// Override the preset's per-head width (for the MHA and GQA comparisons).
    #[arg(long)]
    pub head_dim: Option<usize>,
    /// Override the preset's latent width (kv_lora_rank).
    #[arg(long)]
    pub kv_lora_rank: Option<usize>,
    /// Override the preset's decoupled RoPE width.
    #[arg(long)]
    pub rope_dim: Option<usize>,
    /// Memory of one GPU (the default is an H200's 143,771 MiB, rounded down).
    #[arg(long, value_name = "SIZE", value_parser = args::bytes, default_value = "140GiB")]
    pub gpu_mem: u64,
    /// Fraction of GPU memory the engine may use (vLLM's gpu_memory_utilization).
    #[arg(long, value_parser = args::non_negative, default_value = "0.9")]
    pub gpu_util: f64,
    /// Weights per GPU. Defaults to the preset's published checkpoint
    /// (parameters x bytes per parameter) divided by --tp.
    #[arg(long, value_name = "SIZE", value_parser = args::bytes)]
    pub weights_mem: Option<u64>,
    /// Tensor-parallel ranks per replica.
    #[arg(long, default_value_t = 8)]
    pub tp: usize,
    /// Data-parallel replicas.
    #[arg(long, default_value_t = 1)]
    pub dp: usize,
    /// Tokens per sequence (prompt + output) for the concurrency columns.
    #[arg(long, default_value_t = 32_768)]
    pub context: usize,
    /// Tokens per block.
    #[arg(long, default_value_t = CacheConfig::DEFAULT_BLOCK_SIZE)]
    pub block_size: usize,
    /// Print the plan as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Published checkpoint of a preset: parameters (billions), bytes each, precision.
fn published_weights(name: &str) -> Option<(f64, f64, &'static str)> {
    match name {
        // V3.2 adds only the small indexer to V3's 671B.
        "deepseek-v3" | "deepseek-v3.2" => Some((671.0, 1.0, "FP8")),
        "kimi-k2" => Some((1000.0, 1.0, "FP8")),
        "deepseek-v2" => Some((236.0, 2.0, "BF16")),
        "deepseek-v2-lite" => Some((15.7, 2.0, "BF16")),
        _ => None,
    }
}

/// One kind of cache in the plan.
#[derive(Debug, Serialize)]
struct Row {
    /// `MLA fp8_ds_mla`, `GQA-8 bf16`, ...
    cache: String,
    /// Elements cached per token and layer (whole model).
    elements_per_token_layer: usize,
    /// Bytes per token and layer (whole model).
    bytes_per_token_layer: usize,
    /// Bytes one GPU holds per token, all layers (its share).
    bytes_per_token_per_gpu: u64,
    /// How tensor parallelism lays the cache out.
    layout: String,
    /// Tokens whose cache fits on each GPU (and so in each replica).
    tokens_per_gpu: u64,
    /// Blocks per GPU.
    blocks_per_gpu: u64,
    /// Sequences of `context` tokens per replica.
    sequences_per_replica: u64,
    /// Sequences over all replicas.
    sequences_total: u64,
}

/// The whole plan.
#[derive(Debug, Serialize)]
struct Plan {
    model: String,
    num_layers: usize,
    gpu_mem_bytes: u64,
    gpu_util: f64,
    weights_bytes_per_gpu: u64,
    cache_bytes_per_gpu: u64,
    tp: usize,
    dp: usize,
    context: usize,
    block_size: usize,
    rows: Vec<Row>,
}

impl PlanArgs {
    fn geometry(&self) -> ModelGeometry {
        let mut g = self.model;
        g.num_layers = self.layers.unwrap_or(g.num_layers);
        g.num_heads = self.heads.unwrap_or(g.num_heads);
        g.qk_nope_head_dim = self.head_dim.unwrap_or(g.qk_nope_head_dim);
        g.kv_lora_rank = self.kv_lora_rank.unwrap_or(g.kv_lora_rank);
        g.qk_rope_head_dim = self.rope_dim.unwrap_or(g.qk_rope_head_dim);
        g
    }

    fn overrides_dims(&self) -> bool {
        [
            self.layers,
            self.heads,
            self.head_dim,
            self.kv_lora_rank,
            self.rope_dim,
        ]
        .iter()
        .any(Option::is_some)
    }

    /// Weights per GPU and how they were obtained.
    fn weights(&self) -> Result<(u64, String), String> {
        if let Some(w) = self.weights_mem {
            return Ok((w, "given".to_string()));
        }
        if self.overrides_dims() {
            return Err("explicit model dimensions need --weights-mem".into());
        }
        let (billions, bytes, precision) = published_weights(self.model.name).ok_or_else(|| {
            format!(
                "no weight size known for {}: set --weights-mem",
                self.model.name
            )
        })?;
        let per_gpu = (billions * 1e9 * bytes / self.tp as f64) as u64;
        Ok((
            per_gpu,
            format!("{billions}B parameters in {precision} / tp {}", self.tp),
        ))
    }
}

fn build(args: &PlanArgs) -> Result<(Plan, String), String> {
    if args.tp == 0 || args.dp == 0 || args.context == 0 || args.block_size == 0 {
        return Err("--tp, --dp, --context and --block-size must be positive".into());
    }
    if args.gpu_util == 0.0 || args.gpu_util > 1.0 {
        return Err(format!(
            "--gpu-util must be in (0, 1], got {}",
            args.gpu_util
        ));
    }
    let g = args.geometry();
    let (weights, weights_note) = args.weights()?;
    let usable = (args.gpu_mem as f64 * args.gpu_util) as u64;
    let cache = usable
        .checked_sub(weights)
        .filter(|&c| c > 0)
        .ok_or_else(|| {
            format!(
                "weights ({}) leave no room in {} usable of {} per GPU",
                format_bytes(weights),
                format_bytes(usable),
                format_bytes(args.gpu_mem)
            )
        })?;
    let bs = args.block_size;
    let blocks_per_seq = args.context.div_ceil(bs) as u64;
    let row =
        |cache_name: String, elements: usize, bytes_layer: usize, per_gpu: u64, layout: String| {
            let blocks = cache / (per_gpu * bs as u64);
            let seqs = blocks / blocks_per_seq;
            Row {
                cache: cache_name,
                elements_per_token_layer: elements,
                bytes_per_token_layer: bytes_layer,
                bytes_per_token_per_gpu: per_gpu,
                layout,
                tokens_per_gpu: blocks * bs as u64,
                blocks_per_gpu: blocks,
                sequences_per_replica: seqs,
                sequences_total: seqs * args.dp as u64,
            }
        };
    let mut rows = Vec::new();
    for dtype in Dtype::ALL {
        let mut c = CacheConfig::for_model(&g, 1, dtype);
        c.block_size = bs;
        c.validate().map_err(|e| e.to_string())?;
        let whole = if g.indexer.is_some() {
            "whole latent + indexer key"
        } else {
            "whole latent"
        };
        let layout = if args.tp == 1 {
            whole.to_string()
        } else {
            format!("{whole} on each of {} ranks", args.tp)
        };
        rows.push(row(
            format!("MLA {dtype}"),
            g.mla_elements_per_token() + g.indexer.map_or(0, |i| i.head_dim),
            c.bytes_per_token_per_layer(),
            c.bytes_per_token() as u64,
            layout,
        ));
    }
    let split = |kv_heads: usize, what: &str| -> (usize, String) {
        if args.tp <= kv_heads {
            let per_rank = kv_heads.div_ceil(args.tp);
            (
                per_rank,
                format!("{per_rank} of {kv_heads} {what} per rank"),
            )
        } else {
            (
                1,
                format!(
                    "1 of {kv_heads} {what} per rank, each on {} ranks",
                    args.tp / kv_heads
                ),
            )
        }
    };
    for (name, kv_heads, elements) in [
        ("GQA-8", 8, g.gqa_elements_per_token(8)),
        ("MHA", g.num_heads, g.mha_elements_per_token()),
    ] {
        let (per_rank, layout) = split(kv_heads, if name == "MHA" { "heads" } else { "KV heads" });
        for (precision, bytes) in [("bf16", 2), ("fp8", 1)] {
            let per_gpu = (g.num_layers * g.gqa_elements_per_token(per_rank) * bytes) as u64;
            rows.push(row(
                format!("{name} {precision}"),
                elements,
                elements * bytes,
                per_gpu,
                layout.clone(),
            ));
        }
    }
    let plan = Plan {
        model: g.name.to_string(),
        num_layers: g.num_layers,
        gpu_mem_bytes: args.gpu_mem,
        gpu_util: args.gpu_util,
        weights_bytes_per_gpu: weights,
        cache_bytes_per_gpu: cache,
        tp: args.tp,
        dp: args.dp,
        context: args.context,
        block_size: bs,
        rows,
    };
    Ok((plan, weights_note))
}

/// Runs `mla-cache plan`.
pub fn run(args: &PlanArgs) -> Result<(), String> {
    let (plan, weights_note) = build(args)?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&plan).expect("a plan always serializes")
        );
        return Ok(());
    }
    let g = args.geometry();
    println!(
        "{}: {} layers, {} heads of {}, MLA latent {} + {} = {} elements per token and layer",
        plan.model,
        g.num_layers,
        g.num_heads,
        g.head_dim(),
        g.kv_lora_rank,
        g.qk_rope_head_dim,
        g.mla_elements_per_token()
    );
    if let Some(i) = g.indexer {
        println!(
            "  plus the sparse-attention indexer's key: {} e4m3 values + one fp32 scale = {} bytes per token and layer",
            i.head_dim,
            i.bytes_per_token()
        );
    }
    println!(
        "per GPU: {} x {} usable - {} weights ({weights_note}) = {} for the cache",
        format_bytes(plan.gpu_mem_bytes),
        plan.gpu_util,
        format_bytes(plan.weights_bytes_per_gpu),
        format_bytes(plan.cache_bytes_per_gpu)
    );
    println!(
        "deployment: tp {} x dp {} = {} GPUs; sequences of {} tokens ({} blocks of {})",
        plan.tp,
        plan.dp,
        plan.tp * plan.dp,
        thousands(plan.context as u64),
        thousands(plan.context.div_ceil(plan.block_size) as u64),
        plan.block_size
    );
    println!();
    println!(
        "{:<16} {:>13} {:>13} {:>12} {:>11} {:>13} {:>11}  layout on tensor-parallel ranks",
        "cache",
        "B/token/layer",
        "B/token/GPU",
        "tokens/GPU",
        "blocks/GPU",
        "seqs/replica",
        "seqs total"
    );
    for r in &plan.rows {
        println!(
            "{:<16} {:>13} {:>13} {:>12} {:>11} {:>13} {:>11}  {}",
            r.cache,
            thousands(r.bytes_per_token_layer as u64),
            thousands(r.bytes_per_token_per_gpu),
            thousands(r.tokens_per_gpu),
            thousands(r.blocks_per_gpu),
            thousands(r.sequences_per_replica),
            thousands(r.sequences_total),
            r.layout
        );
    }
    println!();
    println!(
        "An MLA cache has one latent head per layer, which every tensor-parallel rank needs whole:\n\
         it is replicated on every rank (tp {} here), so tensor parallelism does not divide it. MHA and GQA\n\
         caches are split by KV heads across ranks. B/token/layer is the whole model's; B/token/GPU\n\
         is what one GPU holds for a token over all {} layers.",
        plan.tp, plan.num_layers
    );
    if plan.tp > 1 {
        println!(
            "Engines therefore often run MLA attention data-parallel: `--tp 1 --dp {} --weights-mem\n\
             <per GPU>` shows each GPU caching its own sequences.",
            plan.tp * plan.dp
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        plan: PlanArgs,
    }

    fn plan(args: &[&str]) -> Result<Plan, String> {
        let w =
            Wrapper::try_parse_from(std::iter::once("plan").chain(args.iter().copied())).unwrap();
        build(&w.plan).map(|(p, _)| p)
    }

    #[test]
    fn mla_is_replicated_and_mha_split() {
        let p = plan(&[
            "--gpu-mem",
            "100GiB",
            "--gpu-util",
            "1",
            "--weights-mem",
            "60GiB",
            "--tp",
            "8",
        ])
        .unwrap();
        let fp8 = &p.rows[1];
        assert_eq!(fp8.cache, "MLA fp8_ds_mla");
        assert_eq!(fp8.bytes_per_token_per_gpu, 40_016);
        assert_eq!(fp8.blocks_per_gpu, (40u64 << 30) / (40_016 * 64));
        let mha = p.rows.iter().find(|r| r.cache == "MHA bf16").unwrap();
        // 16 of 128 heads per rank: 61 x 2 x 16 x 128 x 2 bytes.
        assert_eq!(mha.bytes_per_token_per_gpu, 61 * 2 * 16 * 128 * 2);
        assert_eq!(mha.elements_per_token_layer, 32_768);
    }

    #[test]
    fn gqa_beyond_its_groups_replicates_heads() {
        let p = plan(&["--tp", "16", "--weights-mem", "40GB"]).unwrap();
        let gqa = p.rows.iter().find(|r| r.cache == "GQA-8 bf16").unwrap();
        assert_eq!(gqa.bytes_per_token_per_gpu, 61 * 2 * 128 * 2);
        assert!(gqa.layout.contains("each on 2 ranks"));
    }

    #[test]
    fn impossible_plans_are_errors() {
        assert!(plan(&["--weights-mem", "200GiB"])
            .unwrap_err()
            .contains("leave no room"));
        assert!(plan(&["--layers", "10"])
            .unwrap_err()
            .contains("--weights-mem"));
        assert!(plan(&["--tp", "0"]).is_err());
        assert!(plan(&["--gpu-util", "1.5"]).is_err());
    }
}
