//! The remote tier on real Valkey/Redis servers: sharing between two
//! processes through one server and through a Cluster, a Cluster node
//! killed and restarted, a stopped (SIGSTOP) server, a refused connection,
//! and damaged values.
//!
//! The servers come from `scripts/redis.sh start`, which exports
//! `MLA_CACHE_REDIS_URL`, `MLA_CACHE_REDIS_CLUSTER` and `MLA_CACHE_REDIS_DIR`.
//! Without them these tests pass vacuously, unless `MLA_CACHE_REQUIRE_REDIS=1`,
//! which makes them fail.

mod tier_common;

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mla_cache::store::HostStore;
use mla_cache::tier::remote::{BlockFormat, RedisOptions, RedisRemote};
use mla_cache::tier::{HostTier, RemoteOptions, RemoteTier, TierOptions, TieredCache, WritePolicy};
use mla_cache::{AdmitOptions, BlockManager, CacheConfig, CacheEvent, Dtype, ExtraKeys};
use tier_common::*;
use xxhash_rust::xxh3::xxh3_64;

const PROMPT: usize = 3 * BLOCK + 1;

/// The tests share servers and stop or kill them: one at a time.
static SERVERS: Mutex<()> = Mutex::new(());

struct Servers {
    single: String,
    cluster: String,
    dir: String,
}

/// The servers, or `None` (with a note) when none are configured and not required.
fn servers() -> Option<Servers> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    match (
        var("MLA_CACHE_REDIS_URL"),
        var("MLA_CACHE_REDIS_CLUSTER"),
        var("MLA_CACHE_REDIS_DIR"),
    ) {
        (Some(single), Some(cluster), Some(dir)) => Some(Servers {
            single,
            cluster: format!("cluster:{cluster}"),
            dir,
        }),
        _ if var("MLA_CACHE_REQUIRE_REDIS").as_deref() == Some("1") => {
            panic!("MLA_CACHE_REQUIRE_REDIS=1 but no servers: run `eval \"$(scripts/redis.sh start)\"`")
        }
        _ => {
            eprintln!("no Valkey/Redis servers configured (scripts/redis.sh start): not run");
            None
        }
    }
}

/// A namespace no earlier run used.
fn fresh_namespace(what: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("test-{what}-{}-{nanos}", std::process::id())
}

fn quick() -> RedisOptions {
    RedisOptions {
        connect_timeout: Duration::from_millis(200),
        io_timeout: Duration::from_millis(500),
        retry_after: Duration::from_millis(100),
    }
}

fn format() -> BlockFormat {
    format_for(&config(Dtype::Fp8DsMla, 8))
}

fn format_for(c: &CacheConfig) -> BlockFormat {
    BlockFormat::new(c, c.bytes_per_block())
}

fn node(
    spec: &str,
    namespace: &str,
    budget: Duration,
    host: Option<usize>,
) -> (TieredCache, std::sync::Arc<HostStore>) {
    node_with(config(Dtype::Fp8DsMla, 8), spec, namespace, budget, host)
}

fn node_with(
    config: CacheConfig,
    spec: &str,
    namespace: &str,
    budget: Duration,
    host: Option<usize>,
) -> (TieredCache, std::sync::Arc<HostStore>) {
    let backend = RedisRemote::from_spec(spec, quick()).unwrap();
    let options = RemoteOptions {
        namespace: namespace.into(),
        lookup_budget: budget,
        queue_depth: 16,
        ..RemoteOptions::default()
    };
    let remote = RemoteTier::new(Box::new(backend), format_for(&config), options).unwrap();
    cache_with(config, WritePolicy::WriteThrough, host, Some(remote))
}

fn digests(store: &HostStore, blocks: &[u32]) -> Vec<u64> {
    block_bytes(store, blocks)
        .iter()
        .map(|b| xxh3_64(b))
        .collect()
}

/// Run in a child process by the sharing tests: computes prompt 7 as node
/// A and prints its blocks' digests.
#[test]
#[ignore = "a helper process of the sharing tests"]
fn helper_node_writes_blocks() {
    let (Ok(spec), Ok(namespace)) = (
        std::env::var("TIER_HELPER_SPEC"),
        std::env::var("TIER_HELPER_NAMESPACE"),
    ) else {
        return;
    };
    let (a, store) = node(&spec, &namespace, Duration::from_secs(5), None);
    let table = run_prefill(&a, &store, 1, 7, PROMPT);
    assert!(a.remote().unwrap().flush(Duration::from_secs(10)));
    let stats = a.remote().unwrap().stats();
    assert_eq!((stats.put_blocks, stats.errors), (3, 0), "{stats:?}");
    for d in digests(&store, &table[..3]) {
        println!("DIGEST {d}");
    }
}

/// Node A (another process) writes prompt 7; node B loads the same bytes.
fn share_between_processes(spec: &str) {
    let namespace = fresh_namespace("share");
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "helper_node_writes_blocks",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("TIER_HELPER_SPEC", spec)
        .env("TIER_HELPER_NAMESPACE", &namespace)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "helper failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let written: Vec<u64> = stdout
        .lines()
        .filter_map(|l| l.split("DIGEST ").nth(1)?.trim().parse().ok())
        .collect();
    assert_eq!(written.len(), 3, "{stdout}");

    let (b, store) = node(spec, &namespace, Duration::from_secs(5), Some(8));
    let a = b
        .admit(1, &prompt(7, PROMPT), &AdmitOptions::default())
        .unwrap();
    assert_eq!(
        a.hits.remote_tokens,
        3 * BLOCK,
        "{:?}",
        b.remote().unwrap().stats()
    );
    assert_eq!(
        digests(&store, &a.block_ids[..3]),
        written,
        "node B loaded other bytes"
    );
    // Another namespace shares nothing.
    let (c, _) = node(
        spec,
        &fresh_namespace("other"),
        Duration::from_secs(5),
        None,
    );
    assert_eq!(
        c.admit(1, &prompt(7, PROMPT), &AdmitOptions::default())
            .unwrap()
            .num_cached_tokens,
        0
    );
}

#[test]
fn two_processes_share_blocks_through_one_server() {
    let _serial = SERVERS.lock().unwrap_or_else(|e| e.into_inner());
    let Some(s) = servers() else { return };
    share_between_processes(&s.single);
}

#[test]
fn two_processes_share_blocks_through_a_cluster() {
    let _serial = SERVERS.lock().unwrap_or_else(|e| e.into_inner());
    let Some(s) = servers() else { return };
    wait_for_cluster();
    share_between_processes(&s.cluster);
}

fn pid_of(dir: &str, port: &str) -> i32 {
    std::fs::read_to_string(format!("{dir}/{port}/redis.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn signal(pid: i32, sig: i32) {
    // SAFETY: kill has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "kill({pid}, {sig})");
}

/// Polls `f` every 100 ms for up to 30 s.
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{what}: not within 30 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

const CLUSTER_PORTS: [&str; 3] = ["17001", "17002", "17003"];

/// Waits until every node of the cluster sees it whole (a restarted node
/// answers CLUSTERDOWN until it has heard from the others).
fn wait_for_cluster() {
    for port in CLUSTER_PORTS {
        eventually("the cluster is whole", || {
            redis_cli_ok(port, &["cluster", "info"], "cluster_state:ok")
        });
    }
}

fn redis_cli_ok(port: &str, args: &[&str], expect: &str) -> bool {
    Command::new("redis-cli")
        .args(["-p", port])
        .args(args)
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(expect))
}

#[test]
fn a_killed_cluster_node_costs_misses_then_the_cluster_recovers() {
    let _serial = SERVERS.lock().unwrap_or_else(|e| e.into_inner());
    let Some(s) = servers() else { return };
    wait_for_cluster();
    let namespace = fresh_namespace("kill");
    let (a, store_a) = node(&s.cluster, &namespace, Duration::from_millis(500), None);
    let (b, _) = node(&s.cluster, &namespace, Duration::from_millis(500), None);
    run_prefill(&a, &store_a, 1, 7, PROMPT);
    assert!(a.remote().unwrap().flush(Duration::from_secs(10)));
    assert_eq!(
        b.admit(1, &prompt(7, PROMPT), &AdmitOptions::default())
            .unwrap()
            .hits
            .remote_tokens,
        3 * BLOCK
    );

    let victim = "17002";
    signal(pid_of(&s.dir, victim), libc::SIGKILL);
    // Every admission and write succeeds while the node is gone; lookups miss.
    for id in 2..12u64 {
        let seed = 100 + id as u32;
        run_prefill(&a, &store_a, id, seed, PROMPT);
        a.free(id).unwrap();
        let hit = b
            .admit(id, &prompt(seed, PROMPT), &AdmitOptions::default())
            .unwrap();
        b.free(id).unwrap();
        assert!(hit.num_cached_tokens <= 3 * BLOCK);
    }
    assert!(a.remote().unwrap().flush(Duration::from_secs(10)));

    let status = Command::new("redis-server")
        .arg(format!("{}/{victim}/redis.conf", s.dir))
        .status()
        .unwrap();
    assert!(status.success());
    eventually("the node answers", || {
        redis_cli_ok(victim, &["ping"], "PONG")
    });
    wait_for_cluster();
    // New blocks round-trip again, wherever their slots are.
    let mut seed = 500;
    eventually("blocks shared again", || {
        seed += 1;
        let id = seed as u64;
        run_prefill(&a, &store_a, id, seed, PROMPT);
        a.free(id).unwrap();
        a.remote().unwrap().flush(Duration::from_secs(10));
        let hit = b
            .admit(id, &prompt(seed, PROMPT), &AdmitOptions::default())
            .unwrap();
        b.free(id).unwrap();
        hit.hits.remote_tokens == 3 * BLOCK
    });
    assert!(b.remote().unwrap().stats().errors + b.remote().unwrap().stats().miss_blocks > 0);
}

/// Resumes a stopped server even if the test fails.
struct Resume(i32);

impl Drop for Resume {
    fn drop(&mut self) {
        signal(self.0, libc::SIGCONT);
    }
}

/// A stopped server must not hold admissions beyond the lookup budget. The
/// bound asserted is 10x the budget, generous for a loaded machine; the
/// server stays stopped for the whole loop.
#[test]
fn a_stopped_server_does_not_stall_admission_beyond_the_budget() {
    let _serial = SERVERS.lock().unwrap_or_else(|e| e.into_inner());
    let Some(s) = servers() else { return };
    let namespace = fresh_namespace("stop");
    let budget = Duration::from_millis(100);
    let (a, store_a) = node(&s.single, &namespace, budget, None);
    run_prefill(&a, &store_a, 1, 7, PROMPT);
    assert!(a.remote().unwrap().flush(Duration::from_secs(10)));

    let resume = Resume(pid_of(&s.dir, "16379"));
    signal(resume.0, libc::SIGSTOP);
    let (b, _) = node(&s.single, &namespace, budget, None);
    for id in 1..6u64 {
        // Prompt 7 is on the server; the others are not, and are looked up too.
        let seed = if id == 1 { 7 } else { 1000 + id as u32 };
        let start = Instant::now();
        let hit = b
            .admit(id, &prompt(seed, PROMPT), &AdmitOptions::default())
            .unwrap();
        let took = start.elapsed();
        assert!(took < budget * 10, "admission took {took:?}");
        assert_eq!(hit.hits.remote_tokens, 0);
        b.free(id).unwrap();
    }
    assert!(b.remote().unwrap().stats().timeouts >= 1);
    drop(resume);
    let (c, _) = node(&s.single, &namespace, budget, None);
    let mut id = 100;
    eventually("the server serves again", || {
        id += 1;
        let hit = c
            .admit(id, &prompt(7, PROMPT), &AdmitOptions::default())
            .unwrap();
        c.free(id).unwrap();
        c.manager().reset_prefix_cache().unwrap();
        hit.hits.remote_tokens == 3 * BLOCK
    });
}

#[test]
fn a_refused_connection_is_a_miss() {
    // Port 1 on loopback: nothing listens there.
    let (c, store) = node(
        "redis://127.0.0.1:1/",
        "refused",
        Duration::from_secs(5),
        Some(8),
    );
    run_prefill(&c, &store, 1, 7, PROMPT);
    c.free(1).unwrap();
    let hit = c
        .admit(2, &prompt(8, PROMPT), &AdmitOptions::default())
        .unwrap();
    assert_eq!(hit.num_cached_tokens, 0);
    assert!(c.remote().unwrap().flush(Duration::from_secs(10)));
    assert!(c.remote().unwrap().stats().errors >= 1);
}

#[test]
fn damaged_values_on_the_server_are_rejected() {
    let _serial = SERVERS.lock().unwrap_or_else(|e| e.into_inner());
    let Some(s) = servers() else { return };
    let namespace = fresh_namespace("damage");
    let (a, store_a) = node(&s.single, &namespace, Duration::from_secs(5), None);
    run_prefill(&a, &store_a, 1, 7, PROMPT);
    assert!(a.remote().unwrap().flush(Duration::from_secs(10)));
    let hash = a
        .manager()
        .chain_hashes(&prompt(7, PROMPT), &ExtraKeys::default())[0];
    let key = format!("{}{:032x}", format().key_prefix(&namespace), hash.0);
    let mut conn = redis::Client::open(s.single.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let value: Vec<u8> = redis::cmd("GET").arg(&key).query(&mut conn).unwrap();
    assert_eq!(
        value.len(),
        format().value_len(),
        "the key layout is as documented"
    );
    for damaged in [value[..value.len() - 100].to_vec(), {
        let mut v = value.clone();
        v[1000] ^= 4;
        v
    }] {
        let () = redis::cmd("SET")
            .arg(&key)
            .arg(damaged)
            .query(&mut conn)
            .unwrap();
        let (b, _) = node(&s.single, &namespace, Duration::from_secs(5), None);
        let hit = b
            .admit(1, &prompt(7, PROMPT), &AdmitOptions::default())
            .unwrap();
        assert_eq!(hit.num_cached_tokens, 0);
        assert_eq!(b.remote().unwrap().stats().rejected, 1);
    }
}

#[test]
fn v32_blocks_come_back_from_the_server_whole_or_not_at_all() {
    let _serial = SERVERS.lock().unwrap_or_else(|e| e.into_inner());
    let Some(s) = servers() else { return };
    let namespace = fresh_namespace("v32");
    let c = config_v32(Dtype::Fp8DsMla, 8);
    let budget = Duration::from_secs(5);
    let (a, store_a) = node_with(c.clone(), &s.single, &namespace, budget, None);
    let table = run_prefill(&a, &store_a, 1, 7, PROMPT);
    assert!(a.remote().unwrap().flush(Duration::from_secs(10)));
    let original = block_bytes(&store_a, &table[..3]);
    let keys = indexer_parts(&store_a, &table[..3]);

    let (b, store_b) = node_with(c.clone(), &s.single, &namespace, budget, None);
    let hit = b
        .admit(1, &prompt(7, PROMPT), &AdmitOptions::default())
        .unwrap();
    assert_eq!(hit.hits.remote_tokens, 3 * BLOCK);
    assert_eq!(block_bytes(&store_b, &hit.block_ids[..3]), original);
    assert_eq!(indexer_parts(&store_b, &hit.block_ids[..3]), keys);

    // Damage the first block's indexer part (the payload's tail) on the server.
    let hash = a
        .manager()
        .chain_hashes(&prompt(7, PROMPT), &ExtraKeys::default())[0];
    let key = format!("{}{:032x}", format_for(&c).key_prefix(&namespace), hash.0);
    let mut conn = redis::Client::open(s.single.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let value: Vec<u8> = redis::cmd("GET").arg(&key).query(&mut conn).unwrap();
    assert_eq!(value.len(), format_for(&c).value_len());
    let indexer_part = c.num_layers * c.block_size * c.indexer_bytes_per_token_per_layer();
    for damaged in [value[..value.len() - indexer_part].to_vec(), {
        let mut v = value.clone();
        let at = v.len() - indexer_part / 2;
        v[at] ^= 0x10;
        v
    }] {
        let () = redis::cmd("SET")
            .arg(&key)
            .arg(damaged)
            .query(&mut conn)
            .unwrap();
        let (b, _) = node_with(c.clone(), &s.single, &namespace, budget, None);
        let hit = b
            .admit(1, &prompt(7, PROMPT), &AdmitOptions::default())
            .unwrap();
        assert_eq!(
            hit.num_cached_tokens, 0,
            "a block without its indexer keys loaded"
        );
        assert_eq!(b.remote().unwrap().stats().rejected, 1);
    }
}

/// The medium and kind of `e`, with its external block hashes.
fn summary(e: &mla_cache::publish::WireEvent) -> (String, &'static str, Vec<u64>) {
    let (kind, hashes) = match &e.event {
        CacheEvent::BlockStored { block_hashes, .. } => ("stored", block_hashes.clone()),
        CacheEvent::BlockRemoved { block_hashes } => ("removed", block_hashes.clone()),
        CacheEvent::AllBlocksCleared => ("cleared", Vec::new()),
    };
    (e.medium.to_string(), kind, hashes)
}

/// Blocks stored into the device tier, copied down to host memory (which
/// evicts) and to Valkey/Redis, evicted from the device and loaded back:
/// every tier's events, each with its medium, in order, on the same hashes.
#[test]
fn a_tier_round_trip_reports_every_medium_in_order() {
    let _one = SERVERS.lock().unwrap_or_else(|e| e.into_inner());
    let Some(s) = servers() else { return };
    let backend = RedisRemote::from_spec(&s.single, quick()).unwrap();
    let options = RemoteOptions {
        namespace: fresh_namespace("events"),
        lookup_budget: Duration::from_secs(5),
        name: "VALKEY".into(),
        ..RemoteOptions::default()
    };
    let remote = RemoteTier::new(Box::new(backend), format(), options).unwrap();
    let config = CacheConfig {
        enable_events: true,
        ..config(Dtype::Fp8DsMla, 4)
    };
    let store = Arc::new(HostStore::new(&config).unwrap());
    let tiers = TierOptions {
        write_policy: WritePolicy::WriteThrough,
        host: Some(HostTier::new(store.block_bytes(), 2).unwrap()),
        remote: Some(remote),
        ..TierOptions::default()
    };
    let cache = TieredCache::new(BlockManager::new(config).unwrap(), store.clone(), tiers).unwrap();

    // Prompt 1: 3 full blocks into the device tier, then down to both tiers.
    run_prefill(&cache, &store, 1, 1, PROMPT);
    cache.free(1).unwrap();
    let first: Vec<_> = cache.take_events().iter().map(summary).collect();
    let h = first[0].2.clone();
    assert_eq!(h.len(), 3, "{first:?}");
    let ev = |m: &str, k: &'static str, hs: &[u64]| (m.to_string(), k, hs.to_vec());
    assert_eq!(
        first,
        [
            ev("GPU", "stored", &h),
            ev("CPU", "stored", &h[..2]),
            ev("CPU", "removed", &h[..1]),
            ev("CPU", "stored", &h[2..]),
            ev("VALKEY", "stored", &h),
        ]
    );
    assert!(cache.remote().unwrap().flush(Duration::from_secs(10)));

    // Prompt 2 takes every device block: prompt 1's leave the device tier.
    run_prefill(&cache, &store, 2, 2, PROMPT);
    cache.free(2).unwrap();
    let second: Vec<_> = cache.take_events().iter().map(summary).collect();
    let removed: Vec<u64> = second
        .iter()
        .filter(|(m, k, _)| m == "GPU" && *k == "removed")
        .flat_map(|e| e.2.clone())
        .collect();
    assert!(h.iter().all(|x| removed.contains(x)), "{second:?}");

    // Prompt 1 again: loaded from the remote tier (host memory now holds
    // prompt 2's blocks), into the device tier and host memory.
    let opts = AdmitOptions {
        chunked_prefill: true,
        ..AdmitOptions::default()
    };
    let a = cache.admit(3, &prompt(1, PROMPT), &opts).unwrap();
    assert_eq!(a.hits.remote_tokens, 3 * BLOCK, "{:?}", a.hits);
    let third: Vec<_> = cache.take_events().iter().map(summary).collect();
    let gpu_stored: Vec<_> = third
        .iter()
        .filter(|(m, k, _)| m == "GPU" && *k == "stored")
        .flat_map(|e| e.2.clone())
        .collect();
    assert_eq!(gpu_stored, h, "{third:?}");
    let cpu_stored: Vec<_> = third
        .iter()
        .filter(|(m, k, _)| m == "CPU" && *k == "stored")
        .flat_map(|e| e.2.clone())
        .collect();
    assert_eq!(cpu_stored, h, "{third:?}");
    assert!(third.iter().all(|(m, _, _)| m != "VALKEY"), "{third:?}");
    assert_eq!(cache.stats().events_dropped, 0);
    cache.free(3).unwrap();
}
