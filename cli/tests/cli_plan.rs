//! `mla-cache plan` figures against hand computation.

use std::process::{Command, Output};

use serde_json::Value;

fn mla_cache(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mla-cache"))
        .args(args)
        .output()
        .expect("binary runs")
}

fn plan_json(args: &[&str]) -> Value {
    let out = mla_cache(&[&["plan", "--json"][..], args].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn row<'a>(plan: &'a Value, cache: &str) -> &'a Value {
    plan["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["cache"] == cache)
        .unwrap()
}

#[test]
fn deepseek_v3_fp8_holds_40016_bytes_per_token() {
    // 100 GiB - 60 GiB of weights leaves exactly 40 GiB for the cache.
    let p = plan_json(&[
        "--gpu-mem",
        "100GiB",
        "--gpu-util",
        "1",
        "--weights-mem",
        "60GiB",
        "--dp",
        "2",
    ]);
    assert_eq!(p["cache_bytes_per_gpu"], 40u64 << 30);
    let fp8 = row(&p, "MLA fp8_ds_mla");
    assert_eq!(fp8["bytes_per_token_layer"], 656);
    assert_eq!(fp8["bytes_per_token_per_gpu"], 61 * 656); // 40,016
    let blocks = (40u64 << 30) / (40_016 * 64); // 16,770
    assert_eq!(fp8["blocks_per_gpu"], blocks);
    assert_eq!(fp8["tokens_per_gpu"], blocks * 64);
    // 32,768-token sequences take 512 blocks each.
    assert_eq!(fp8["sequences_per_replica"], blocks / 512);
    assert_eq!(fp8["sequences_total"], 2 * (blocks / 512));

    assert_eq!(row(&p, "MLA bf16")["bytes_per_token_per_gpu"], 61 * 1152);
    assert_eq!(row(&p, "MLA mxfp6")["bytes_per_token_per_gpu"], 61 * 528);
    // tp 8 splits MHA's 128 heads (16 per rank) and GQA-8's 8 KV heads (1 per rank).
    let mha = row(&p, "MHA bf16");
    assert_eq!(mha["bytes_per_token_layer"], 2 * 128 * 128 * 2);
    assert_eq!(mha["bytes_per_token_per_gpu"], 61 * 2 * 16 * 128 * 2);
    assert_eq!(
        mha["tokens_per_gpu"],
        (40u64 << 30) / (61 * 2 * 16 * 128 * 2 * 64) * 64
    );
    assert_eq!(
        row(&p, "GQA-8 fp8")["bytes_per_token_per_gpu"],
        61 * 2 * 128
    );
}

#[test]
fn deepseek_v32_counts_its_indexer_keys_in_every_format() {
    let p = plan_json(&[
        "--model",
        "deepseek-v3.2",
        "--gpu-mem",
        "100GiB",
        "--gpu-util",
        "1",
        "--weights-mem",
        "60GiB",
    ]);
    let fp8 = row(&p, "MLA fp8_ds_mla");
    assert_eq!(fp8["bytes_per_token_layer"], 656 + 132);
    assert_eq!(fp8["bytes_per_token_per_gpu"], 48_068); // (656 + 132) x 61
    assert_eq!(fp8["elements_per_token_layer"], 576 + 128);
    let blocks = (40u64 << 30) / (48_068 * 64);
    assert_eq!(fp8["tokens_per_gpu"], blocks * 64);
    assert!(fp8["layout"].as_str().unwrap().contains("indexer key"));
    assert_eq!(
        row(&p, "MLA bf16")["bytes_per_token_per_gpu"],
        61 * (1152 + 132)
    );
    assert_eq!(
        row(&p, "MLA mxfp6")["bytes_per_token_per_gpu"],
        61 * (528 + 132)
    );
    // The published checkpoint is known for V3.2 too.
    assert!(mla_cache(&["plan", "--model", "deepseek-v3.2"])
        .status
        .success());
}

#[test]
fn default_weights_come_from_the_published_checkpoint() {
    let p = plan_json(&[]);
    assert_eq!(p["weights_bytes_per_gpu"], 671_000_000_000u64 / 8);
    let usable = (140.0 * 1024f64.powi(3) * 0.9) as u64;
    assert_eq!(p["cache_bytes_per_gpu"], usable - 671_000_000_000 / 8);
    let p = plan_json(&[
        "--model",
        "deepseek-v2-lite",
        "--tp",
        "1",
        "--gpu-mem",
        "80GB",
    ]);
    assert_eq!(p["weights_bytes_per_gpu"], 31_400_000_000u64);
    assert_eq!(
        row(&p, "MLA fp8_ds_mla")["bytes_per_token_per_gpu"],
        27 * 656
    );
}

#[test]
fn the_table_says_mla_is_replicated_and_mha_split() {
    let out = mla_cache(&["plan"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("replicated on every rank (tp 8 here)"),
        "{text}"
    );
    assert!(text.contains("split by KV heads"), "{text}");
    assert!(text.contains("40,016"), "{text}");
    assert!(text.contains("16 of 128 heads per rank"), "{text}");
}

#[test]
fn explicit_dimensions() {
    let p = plan_json(&[
        "--layers",
        "10",
        "--kv-lora-rank",
        "256",
        "--weights-mem",
        "10GiB",
        "--tp",
        "1",
    ]);
    // 256 + 64 elements: fp8 = 256 + 4 x 2 scales + 128 RoPE bytes.
    assert_eq!(
        row(&p, "MLA fp8_ds_mla")["bytes_per_token_layer"],
        256 + 8 + 128
    );
    assert_eq!(row(&p, "MLA bf16")["bytes_per_token_per_gpu"], 10 * 640);
}

#[test]
fn bad_plans_are_errors() {
    for (args, needle) in [
        (vec!["plan", "--gpu-mem", "80XB"], "unknown unit"),
        (vec!["plan", "--weights-mem", "500GiB"], "leave no room"),
        (vec!["plan", "--layers", "4"], "--weights-mem"),
        (vec!["plan", "--tp", "0"], "positive"),
        (
            vec!["plan", "--kv-lora-rank", "100", "--weights-mem", "1GiB"],
            "multiple of",
        ),
    ] {
        let out = mla_cache(&args);
        assert!(!out.status.success(), "{args:?} should fail");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(needle),
            "{args:?}: {needle:?} not in {stderr}"
        );
    }
}
