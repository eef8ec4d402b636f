//! The options of `mla-cache simulate` and what they build: the workload,
//! the simulation's and the manager's configuration (read by `simulate.rs`
//! and `sweep.rs`).

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use mla_cache::tier::WritePolicy;
use mla_cache::{CacheConfig, Dtype, EvictionPolicyKind, ModelGeometry};
use mla_cache_sim::SimRemoteTier;
use mla_cache_sim::{
    generate_mix, generated_workload, OnMalformed, SimConfig, Trace, MOONCAKE_SYNTHETIC_TRACE,
};

use crate::args;

/// The built-in workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Workload {
    /// Mooncake's FAST'25 synthetic trace (3,993 requests over 17 minutes),
    /// embedded in the binary.
    Mooncake,
    /// Generated multi-turn chat with shared system prompts (see `--seed`).
    Chat,
    /// Generated multi-turn chat whose users think 1 to 10 minutes between
    /// turns, longer than the cache remembers.
    ChatLongThink,
    /// Generated flood of one-off documents behind 64 shared system prompts.
    PromptFlood,
    /// Generated agent sessions returning to long private contexts every 10
    /// to 120 seconds.
    Agents,
    /// Generated long multi-turn conversations over shared system prompts,
    /// each turn returning after about one turnover of the cache.
    Multiturn,
    /// The chat-long-think conversations served beside the prompt-flood
    /// one-off documents, on one deployment.
    ChatUnderFlood,
}

/// Options of `mla-cache simulate`.
#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// Built-in workload to replay (ignored with --trace).
    #[arg(long, value_enum, default_value = "mooncake")]
    pub workload: Workload,
    /// Replay this Mooncake-format JSONL trace instead of a built-in workload.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Fail on the first malformed trace line instead of skipping it.
    #[arg(long)]
    pub strict: bool,
    /// Conversations of a generated workload (default: the workload's own,
    /// 1,000 for chat).
    #[arg(long)]
    pub conversations: Option<usize>,
    /// Seed of the chat workload and of the block hashes.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Model preset: deepseek-v3 (also r1, v3.1), deepseek-v3.2 (with its indexer keys),
    /// deepseek-v2, deepseek-v2-lite, kimi-k2.
    #[arg(long, value_parser = args::model, default_value = "deepseek-v3")]
    pub model: ModelGeometry,
    /// Storage format of the latent cache.
    #[arg(long, value_parser = args::dtype(), default_value = "fp8_ds_mla")]
    pub dtype: Dtype,
    /// Cache memory (all layers). The default is roughly what an H200
    /// (140 GiB) keeps for the cache beside DeepSeek-V3's FP8 weights at
    /// tensor parallelism 8, once activations are set aside (see `plan`):
    /// 16,770 blocks of 64 in fp8_ds_mla, 1.07M tokens.
    #[arg(long, value_name = "SIZE", value_parser = args::bytes, default_value = "40GiB", conflicts_with = "blocks")]
    pub cache_mem: u64,
    /// Cache size in blocks, instead of --cache-mem.
    #[arg(long, value_name = "N")]
    pub blocks: Option<usize>,
    /// Tokens per block.
    #[arg(long, default_value_t = CacheConfig::DEFAULT_BLOCK_SIZE)]
    pub block_size: usize,
    /// Eviction policy.
    #[arg(long, value_parser = args::eviction(), default_value = "arc")]
    pub eviction: EvictionPolicyKind,
    /// Decode time per output token, in milliseconds.
    #[arg(long, value_name = "MS", value_parser = args::non_negative, default_value = "40")]
    pub tpot_ms: f64,
    /// Prefill throughput for uncached prompt tokens, on one serial lane
    /// (tokens/s); 0 makes prefill instantaneous.
    #[arg(long, value_name = "TOKENS_PER_S", value_parser = args::non_negative, default_value = "0")]
    pub prefill_tps: f64,
    /// Host-memory tier (L2) below the device cache: its size (0: none).
    #[arg(long, value_name = "SIZE", value_parser = args::bytes, default_value = "0")]
    pub host_mem: u64,
    /// Remote tier (L3) shared by a fleet: `sim:SIZE` for an in-process
    /// store, a Valkey/Redis URL (`redis://`, `rediss://` for TLS, ACL
    /// credentials as `redis://user:password@host:port`), or `cluster:`
    /// followed by comma-separated node URLs.
    #[arg(long, value_name = "SPEC")]
    pub remote: Option<String>,
    /// When device blocks go down to the lower tiers: write-through,
    /// write-through-selective[:N] or write-back.
    #[arg(long, value_name = "POLICY", default_value = "write-through", value_parser = args::write_policy)]
    pub write_policy: WritePolicy,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Write the replayed workload as a Mooncake JSONL trace.
    #[arg(long, value_name = "FILE")]
    pub save_trace: Option<PathBuf>,
    /// Sweep cache sizes for every format and plot hit rate against cache memory.
    #[arg(long)]
    pub sweep: bool,
    /// Where --sweep writes its SVG plot.
    #[arg(
        long,
        value_name = "FILE",
        default_value = "sweep.svg",
        requires = "sweep"
    )]
    pub out: PathBuf,
}

impl SimulateArgs {
    /// The workload's name and requests; reports skipped lines on stderr.
    pub fn load(&self) -> Result<(String, Trace), String> {
        let on_malformed = if self.strict {
            OnMalformed::Fail
        } else {
            OnMalformed::Skip
        };
        let (name, trace) = match (&self.trace, self.workload) {
            (Some(path), _) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
                let trace = Trace::parse(&text, on_malformed)
                    .map_err(|e| format!("{}: {e} (--strict)", path.display()))?;
                (path.display().to_string(), trace)
            }
            (None, Workload::Mooncake) => {
                let trace = Trace::parse(MOONCAKE_SYNTHETIC_TRACE, on_malformed)
                    .map_err(|e| e.to_string())?;
                ("mooncake synthetic trace".to_string(), trace)
            }
            (None, generated) => {
                let label = generated
                    .to_possible_value()
                    .expect("every workload has a name")
                    .get_name()
                    .to_string();
                let mut populations =
                    generated_workload(&label).expect("every generated workload has presets");
                // --conversations sizes the first population; a background keeps its own.
                if let Some(n) = self.conversations {
                    populations[0].conversations = n;
                }
                let conversations = populations[0].conversations;
                (
                    format!("{label}, {conversations} conversations, seed {}", self.seed),
                    generate_mix(&populations, self.seed),
                )
            }
        };
        const SHOWN: usize = 10;
        for e in trace.skipped.iter().take(SHOWN) {
            eprintln!("warning: {name}: skipped {e}");
        }
        if trace.skipped.len() > SHOWN {
            eprintln!(
                "warning: {name}: ... and {} more",
                trace.skipped.len() - SHOWN
            );
        }
        if !trace.skipped.is_empty() {
            eprintln!(
                "warning: skipped {} malformed lines (--strict makes them fatal)",
                trace.skipped.len()
            );
        }
        if trace.requests.is_empty() {
            return Err(format!("{name}: no requests to replay"));
        }
        Ok((name, trace))
    }

    /// The simulation settings for a cache of `num_blocks` blocks.
    pub fn sim_config(&self, dtype: Dtype, num_blocks: usize) -> SimConfig {
        SimConfig {
            model: self.model.name.to_string(),
            dtype,
            num_blocks,
            block_size: self.block_size,
            eviction: self.eviction,
            tpot_ns: (self.tpot_ms * 1e6).round() as u64,
            prefill_ns_per_token: if self.prefill_tps > 0.0 {
                (1e9 / self.prefill_tps).round() as u64
            } else {
                0
            },
            hash_seed: self.seed,
            ..SimConfig::default()
        }
    }

    /// Adds the lower tiers the options name, sized in blocks of `config`.
    pub fn with_tiers(&self, mut config: SimConfig) -> Result<SimConfig, String> {
        let per_block = config
            .cache_config()
            .map_err(|e| e.to_string())?
            .bytes_per_block() as u64;
        config.host_blocks = (self.host_mem / per_block) as usize;
        config.write_policy = self.write_policy;
        config.remote = match self.remote.as_deref() {
            None => None,
            Some(spec) => Some(match spec.strip_prefix("sim:") {
                Some(size) => SimRemoteTier::InProcess {
                    blocks: (args::bytes(size)? / per_block) as usize,
                },
                None => SimRemoteTier::Redis {
                    spec: spec.to_string(),
                },
            }),
        };
        Ok(config)
    }

    /// The cache configuration the options describe (for sizes).
    pub fn cache_config(&self, dtype: Dtype, num_blocks: usize) -> Result<CacheConfig, String> {
        self.sim_config(dtype, num_blocks)
            .cache_config()
            .map_err(|e| e.to_string())
    }

    /// Blocks of the configured cache: --blocks, or what --cache-mem holds.
    pub fn num_blocks(&self) -> Result<usize, String> {
        if let Some(n) = self.blocks {
            return Ok(n);
        }
        let per_block = self.cache_config(self.dtype, 1)?.bytes_per_block() as u64;
        let n = (self.cache_mem / per_block) as usize;
        if n == 0 {
            return Err(format!(
                "--cache-mem {} B holds no block of {per_block} B",
                self.cache_mem
            ));
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_generated_workload_has_presets_in_the_library() {
        for w in Workload::value_variants() {
            let name = w.to_possible_value().unwrap().get_name().to_string();
            let presets = generated_workload(&name);
            assert_eq!(presets.is_some(), *w != Workload::Mooncake, "{name}");
        }
    }
}
