//! `mla-cache simulate` end to end: traces written here, figures known by
//! construction.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

fn mla_cache(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mla-cache"))
        .args(args)
        .output()
        .expect("binary runs")
}

fn json(args: &[&str]) -> Value {
    let out = mla_cache(args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON document")
}

fn line(timestamp: u64, input: usize, output: usize, ids: &[u64]) -> String {
    let ids: Vec<String> = ids.iter().map(u64::to_string).collect();
    format!(
        "{{\"timestamp\": {timestamp}, \"input_length\": {input}, \"output_length\": {output}, \"hash_ids\": [{}]}}\n",
        ids.join(", ")
    )
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

/// Two 2,048-token requests that share 3 of their 4 hash blocks.
fn shared_prefix_trace() -> String {
    line(0, 2048, 16, &[10, 11, 12, 13]) + &line(2000, 2048, 16, &[10, 11, 12, 14])
}

#[test]
fn two_requests_sharing_three_of_four_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let trace = write(dir.path(), "t.jsonl", &shared_prefix_trace());
    let r = json(&["simulate", "--trace", &trace, "--json"]);
    assert_eq!(r["requests"], 2);
    assert_eq!(r["completed"], 2);
    assert_eq!(r["prompt_tokens"], 4096);
    assert_eq!(r["hit_tokens"], 1536);
    assert_eq!(r["token_hit_rate"], 0.375);
    assert_eq!(r["request_hit_rate"], 0.5);
    assert_eq!(r["output_tokens"], 32);
    assert_eq!(r["never_fit"], 0);
    assert_eq!(r["stats"]["prefix_hit_tokens"], 1536);
    assert_eq!(r["config"]["dtype"], "fp8_ds_mla");
    assert_eq!(r["config"]["eviction"], "arc");
    // 40 GiB of 61 x 656 B per token in blocks of 64.
    assert_eq!(r["config"]["num_blocks"], (40u64 << 30) / (61 * 656 * 64));
    assert_eq!(r["bytes_per_token"], 40_016);
}

#[test]
fn the_table_names_the_figures() {
    let dir = tempfile::tempdir().unwrap();
    let trace = write(dir.path(), "t.jsonl", &shared_prefix_trace());
    let out = mla_cache(&["simulate", "--trace", &trace]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "37.5 % of prompt tokens (1,536 / 4,096)",
        "50.0 % of requests (1 / 2)",
        "evictions",
        "copy-on-write copies",
        "queueing delay",
        "never fit",
        "µs per request",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from\n{text}");
    }
}

#[test]
fn a_small_cache_queues_and_evicts() {
    let dir = tempfile::tempdir().unwrap();
    let trace = write(
        dir.path(),
        "t.jsonl",
        &(line(0, 2048, 16, &[1, 2, 3, 4]) + &line(100, 2048, 16, &[5, 6, 7, 8])),
    );
    // 40 blocks hold one 33-block request at a time: the second waits for
    // the first's 16 tokens (15 x 40 ms after its arrival at 0).
    let r = json(&["simulate", "--trace", &trace, "--blocks", "40", "--json"]);
    assert_eq!(r["completed"], 2);
    assert_eq!(r["queue_delay_ms"]["max"], 500.0);
    assert!(r["evictions"].as_u64().unwrap() > 0);
    // A cache smaller than one request: never fits, reported, not fatal.
    let r = json(&["simulate", "--trace", &trace, "--blocks", "20", "--json"]);
    assert_eq!(r["never_fit"], 2);
    assert_eq!(r["completed"], 0);
}

#[test]
fn malformed_lines_are_skipped_by_default_and_fatal_with_strict() {
    let dir = tempfile::tempdir().unwrap();
    let text = line(0, 100, 1, &[1]) + &line(5, 2000, 1, &[1]) + &line(9, 100, 1, &[1]);
    let trace = write(dir.path(), "bad.jsonl", &text);

    let out = mla_cache(&["simulate", "--trace", &trace, "--json"]);
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("line 2"), "{stderr}");
    assert!(stderr.contains("needs 4 hash ids"), "{stderr}");
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["requests"], 2);

    let out = mla_cache(&["simulate", "--trace", &trace, "--strict"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("line 2"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn unusable_inputs_are_errors_not_panics() {
    let dir = tempfile::tempdir().unwrap();
    let empty = write(dir.path(), "empty.jsonl", "\n");
    let trace = write(dir.path(), "t.jsonl", &shared_prefix_trace());
    for (args, needle) in [
        (
            vec!["simulate", "--trace", "/nonexistent/trace.jsonl"],
            "cannot read",
        ),
        (vec!["simulate", "--trace", &empty], "no requests"),
        (
            vec!["simulate", "--trace", &trace, "--cache-mem", "40parsecs"],
            "unknown unit",
        ),
        (
            vec!["simulate", "--trace", &trace, "--cache-mem", "GiB"],
            "expected a number",
        ),
        (
            vec!["simulate", "--trace", &trace, "--cache-mem", "1KiB"],
            "holds no block",
        ),
        (
            vec!["simulate", "--trace", &trace, "--eviction", "fifo"],
            "lru",
        ),
        (
            vec!["simulate", "--trace", &trace, "--dtype", "int3"],
            "mxfp6",
        ),
        (
            vec!["simulate", "--trace", &trace, "--model", "gpt-4"],
            "deepseek-v3",
        ),
        (
            vec!["simulate", "--trace", &trace, "--tpot-ms=-1"],
            "non-negative",
        ),
        (
            vec!["simulate", "--trace", &trace, "--blocks", "0"],
            "num_blocks",
        ),
    ] {
        let out = mla_cache(&args);
        assert!(!out.status.success(), "{args:?} should fail");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(needle),
            "{args:?}: {needle:?} not in {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

#[test]
fn deepseek_v32_sizes_the_cache_with_its_indexer_keys() {
    let dir = tempfile::tempdir().unwrap();
    let trace = write(dir.path(), "t.jsonl", &shared_prefix_trace());
    let r = json(&[
        "simulate",
        "--trace",
        &trace,
        "--model",
        "deepseek-v3.2",
        "--json",
    ]);
    // 40 GiB of 61 x (656 + 132) B per token in blocks of 64.
    assert_eq!(r["bytes_per_token"], 48_068);
    assert_eq!(r["config"]["num_blocks"], (40u64 << 30) / (48_068 * 64));
    assert_eq!(r["hit_tokens"], 1536);
}

#[test]
fn sizes_parse_in_binary_and_decimal_units() {
    let dir = tempfile::tempdir().unwrap();
    let trace = write(dir.path(), "t.jsonl", &shared_prefix_trace());
    let block = 61 * 1152 * 64u64;
    for (size, bytes) in [
        ("80GB", 80_000_000_000u64),
        ("512MiB", 512 << 20),
        ("1.5TiB", 3 << 39),
    ] {
        let r = json(&[
            "simulate",
            "--trace",
            &trace,
            "--dtype",
            "bf16",
            "--cache-mem",
            size,
            "--json",
        ]);
        assert_eq!(r["config"]["num_blocks"], bytes / block, "{size}");
    }
}

#[test]
fn a_saved_chat_workload_replays_to_the_same_figures() {
    let dir = tempfile::tempdir().unwrap();
    let saved = dir.path().join("chat.jsonl");
    let saved = saved.to_str().unwrap();
    let common = ["--blocks", "2000", "--json"];
    let a = json(
        &[
            &[
                "simulate",
                "--workload",
                "chat",
                "--conversations",
                "40",
                "--save-trace",
                saved,
            ][..],
            &common,
        ]
        .concat(),
    );
    let b = json(&[&["simulate", "--trace", saved][..], &common].concat());
    for key in [
        "requests",
        "prompt_tokens",
        "hit_tokens",
        "evictions",
        "peak_usage",
        "mean_usage",
        "queue_delay_ms",
    ] {
        assert_eq!(a[key], b[key], "{key}");
    }
    assert!(
        a["hit_tokens"].as_u64().unwrap() > 0,
        "chat turns share prefixes"
    );
    let c = json(
        &[
            &[
                "simulate",
                "--workload",
                "chat",
                "--conversations",
                "40",
                "--seed",
                "1",
            ][..],
            &common,
        ]
        .concat(),
    );
    assert_ne!(
        a["prompt_tokens"], c["prompt_tokens"],
        "the seed changes the workload"
    );
}

#[test]
fn sweep_writes_an_svg_with_every_format_and_the_markers() {
    let dir = tempfile::tempdir().unwrap();
    let trace = write(dir.path(), "t.jsonl", &shared_prefix_trace());
    let svg = dir.path().join("sweep.svg");
    let out = mla_cache(&[
        "simulate",
        "--trace",
        &trace,
        "--sweep",
        "--out",
        svg.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(table.contains("37.5%"), "{table}");
    let svg = std::fs::read_to_string(svg).unwrap();
    assert!(svg.starts_with("<svg"));
    for needle in [
        "MLA bf16",
        "MLA fp8_ds_mla",
        "MLA mxfp6",
        "GQA-8 bf16",
        "MHA bf16",
        "this cache",
    ] {
        assert!(svg.contains(needle), "{needle} missing");
    }

    let svg = dir.path().join("sweep2.svg");
    let out = mla_cache(&[
        "simulate",
        "--trace",
        &trace,
        "--sweep",
        "--json",
        "--out",
        svg.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let tokens = doc["reference_tokens"].as_u64().unwrap();
    assert_eq!(tokens, (40u64 << 30) / (40_016 * 64) * 64);
    assert_eq!(doc["mha_bf16_bytes"], 61 * 32_768 * 2 * tokens);
    assert_eq!(doc["gqa8_bf16_bytes"], 61 * 2_048 * 2 * tokens);
    let reports = doc["reports"].as_array().unwrap();
    assert!(reports.len() >= 10);
    assert!(reports.iter().all(|r| r["hit_tokens"] == 1536));
}

#[test]
fn every_policy_is_selectable_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let trace = write(dir.path(), "t.jsonl", &shared_prefix_trace());
    for kind in mla_cache::EvictionPolicyKind::ALL {
        let r = json(&[
            "simulate",
            "--trace",
            &trace,
            "--eviction",
            kind.name(),
            "--json",
        ]);
        assert_eq!(r["config"]["eviction"], kind.name());
        assert_eq!(r["hit_tokens"], 1536, "{kind}: nothing to evict, same hits");
    }
}

#[test]
fn the_sweep_compares_policies_with_the_offline_bound() {
    let dir = tempfile::tempdir().unwrap();
    // A prefix used three times, a flood of one-offs between: ARC keeps the
    // reused prefix where LRU lets the flood push it out.
    let mut text = String::new();
    let mut t = 0;
    for round in 0..3u64 {
        text += &line(t, 4096, 1, &[1, 2, 3, 4, 5, 6, 7, 8]);
        t += 10_000;
        for k in 0..6u64 {
            let ids: Vec<u64> = (0..8).map(|i| 1000 + round * 100 + k * 10 + i).collect();
            text += &line(t, 4096, 1, &ids);
            t += 10_000;
        }
    }
    let trace = write(dir.path(), "t.jsonl", &text);
    let svg = dir.path().join("sweep.svg");
    let out = mla_cache(&[
        "simulate",
        "--trace",
        &trace,
        "--blocks",
        "200",
        "--eviction",
        "lru",
        "--sweep",
        "--json",
        "--out",
        svg.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let point = doc["cache_only"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["num_blocks"] == 200)
        .unwrap();
    let hits = |policy: &str| {
        point["cache_only"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["policy"] == policy)
            .unwrap()["hit_tokens"]
            .as_u64()
            .unwrap()
    };
    let bound = point["belady"]["hit_tokens"].as_u64().unwrap();
    // Two later uses of the 4,096-token prefix, each capped at 4,095 tokens.
    assert_eq!(bound, 2 * 4032);
    assert_eq!(hits("lru"), 0);
    assert_eq!(
        hits("arc"),
        4032,
        "the second use finds it in a ghost list, the third hits"
    );
    let replays = doc["policies"].as_array().unwrap();
    assert!(replays.iter().any(|r| r["config"]["eviction"] == "arc"));
    let svg = std::fs::read_to_string(svg).unwrap();
    assert!(svg.contains("Belady bound") && svg.contains("fp8_ds_mla, arc"));
}

#[test]
fn arc_beats_lru_on_returning_chats_under_a_flood_of_one_offs() {
    // Issue figures: the chat-long-think conversations beside the
    // prompt-flood documents, through a cache of 16,383 blocks.
    let hits = |policy: &str| {
        let r = json(&[
            "simulate",
            "--workload",
            "chat-under-flood",
            "--blocks",
            "16383",
            "--eviction",
            policy,
            "--json",
        ]);
        assert_eq!(r["config"]["eviction"], policy);
        assert_eq!(
            r["requests"], 24_676,
            "3,000 conversations and 2,000 one-offs"
        );
        r["hit_tokens"].as_u64().unwrap()
    };
    let (lru, arc) = (hits("lru"), hits("arc"));
    // LRU lets the one-off documents push the conversations out between
    // turns; ARC turns the flood over among blocks seen once.
    assert!(arc * 5 > lru * 6, "arc {arc} vs lru {lru} hit tokens");
}

#[test]
fn conversations_size_the_chats_and_leave_the_background_flood_alone() {
    let r = json(&[
        "simulate",
        "--workload",
        "chat-under-flood",
        "--conversations",
        "30",
        "--blocks",
        "4096",
        "--json",
    ]);
    // 2,000 one-off documents, and 30 conversations of 3 to 12 turns.
    let requests = r["requests"].as_u64().unwrap();
    assert!(
        (2_000 + 30 * 3..=2_000 + 30 * 12).contains(&requests),
        "{requests}"
    );
}

/// Prompt-token hit tokens of `workload` through `blocks` blocks under `policy`.
fn replay_hits(workload: &str, blocks: &str, policy: &str) -> u64 {
    let r = json(&[
        "simulate",
        "--workload",
        workload,
        "--blocks",
        blocks,
        "--eviction",
        policy,
        "--json",
    ]);
    assert_eq!(r["config"]["eviction"], policy);
    r["hit_tokens"].as_u64().unwrap()
}

#[test]
fn the_default_arc_hits_more_than_lru_on_the_mooncake_trace() {
    // About 1M and 4M tokens of cache: the default earns its place on the
    // real trace.
    for blocks in ["16383", "65535"] {
        let lru = replay_hits("mooncake", blocks, "lru");
        let arc = replay_hits("mooncake", blocks, "arc");
        assert!(arc > lru, "{blocks} blocks: arc {arc} vs lru {lru}");
    }
}

#[test]
fn multiturn_conversations_resend_their_history() {
    let run = |seed: &str| {
        json(&[
            "simulate",
            "--workload",
            "multiturn",
            "--conversations",
            "30",
            "--seed",
            seed,
            "--blocks",
            "16384",
            "--json",
        ])
    };
    let a = run("0");
    // 30 conversations of 6 to 12 turns each.
    let requests = a["requests"].as_u64().unwrap();
    assert!((180..=360).contains(&requests), "{requests}");
    assert!(a["workload"].as_str().unwrap().starts_with("multiturn"));
    // Everything fits: every turn after the first finds its history.
    assert!(a["token_hit_rate"].as_f64().unwrap() > 0.5, "{a}");
    assert_eq!(
        run("0")["hit_tokens"],
        a["hit_tokens"],
        "a seed names one run"
    );
}
