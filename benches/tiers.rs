//! Tier bandwidth: host tier (L2) stores and loads of whole DeepSeek-V3
//! fp8_ds_mla blocks (61 layers x 64 tokens x 656 B = 2.56 MB), and remote
//! tier (L3) batch puts and gets on a Valkey/Redis server given by
//! `MLA_CACHE_REDIS_URL` (skipped without it). Compare the remote figures
//! with `redis-benchmark -p PORT -t set,get -d 2560832 -n 200 -P 1`.

use std::time::{Duration, Instant};

use mla_cache::store::HostStore;
use mla_cache::tier::remote::{BlockFormat, RedisOptions, RedisRemote, RemoteBackend};
use mla_cache::tier::HostTier;
use mla_cache::{BlockHash, CacheConfig, Dtype};

const BLOCKS: usize = 64;
const ROUNDS: usize = 8;

fn gbps(bytes: usize, t: Duration) -> f64 {
    bytes as f64 / t.as_secs_f64() / 1e9
}

fn main() {
    let config = CacheConfig {
        hash_seed: Some(1),
        ..CacheConfig::preset("deepseek-v3", BLOCKS, Dtype::Fp8DsMla).unwrap()
    };
    let store = HostStore::new(&config).unwrap();
    let bytes = store.block_bytes();
    let tier = HostTier::new(bytes, BLOCKS).unwrap();
    let mut buf = vec![0u8; bytes];
    for b in 0..BLOCKS as u32 {
        buf.iter_mut()
            .enumerate()
            .for_each(|(i, x)| *x = (i as u32 ^ b) as u8);
        store.write_block(b, &buf).unwrap();
    }
    println!("block: {bytes} bytes ({} layers)", config.num_layers);
    let (mut stored, mut loaded) = (Duration::ZERO, Duration::ZERO);
    for round in 0..ROUNDS {
        let start = Instant::now();
        for b in 0..BLOCKS as u32 {
            let h = BlockHash(((round * BLOCKS) as u128) << 32 | b as u128);
            tier.insert(h, |out| store.read_block(b, out)).unwrap();
        }
        stored += start.elapsed();
        let start = Instant::now();
        for b in 0..BLOCKS as u32 {
            let h = BlockHash(((round * BLOCKS) as u128) << 32 | b as u128);
            tier.read(h, |data| store.write_block(b, data)).unwrap();
        }
        loaded += start.elapsed();
    }
    let total = bytes * BLOCKS * ROUNDS;
    println!(
        "host tier store (device -> L2): {:.2} GB/s",
        gbps(total, stored)
    );
    println!(
        "host tier load  (L2 -> device): {:.2} GB/s",
        gbps(total, loaded)
    );

    let Ok(url) = std::env::var("MLA_CACHE_REDIS_URL") else {
        println!("remote: MLA_CACHE_REDIS_URL not set, skipped");
        return;
    };
    let format = BlockFormat::new(&config, bytes);
    let mut remote = RedisRemote::single(
        &url,
        RedisOptions {
            io_timeout: Duration::from_secs(10),
            ..RedisOptions::default()
        },
    )
    .unwrap();
    let prefix = format!("{}{}:", format.key_prefix("bench"), std::process::id());
    let value = format
        .encode::<()>(BlockHash(7), |p| {
            p.copy_from_slice(&buf);
            Ok(())
        })
        .unwrap();
    // 32 blocks per batch size, 96 in all (246 MB of 61-layer blocks): well
    // under the test servers' 512 MB `maxmemory`, whose LRU would otherwise
    // evict blocks before the bench reads them back.
    for batch in [1usize, 8, 32] {
        let rounds = 32 / batch;
        let (mut put, mut get) = (Duration::ZERO, Duration::ZERO);
        for r in 0..rounds {
            let keys: Vec<Vec<u8>> = (0..batch)
                .map(|i| format!("{prefix}{batch}:{r}:{i}").into_bytes())
                .collect();
            let entries: Vec<(Vec<u8>, Vec<u8>)> =
                keys.iter().map(|k| (k.clone(), value.clone())).collect();
            let start = Instant::now();
            remote.put_if_absent(&entries).unwrap();
            put += start.elapsed();
            let start = Instant::now();
            let got = remote.get(&keys).unwrap();
            get += start.elapsed();
            assert!(got.iter().all(|v| v
                .as_ref()
                .is_some_and(|v| format.check(BlockHash(7), v).is_ok())));
        }
        let n = rounds * batch;
        let total = n * value.len();
        println!(
            "remote batch {batch:>2}: put {:.2} GB/s, get {:.2} GB/s, {:.2} ms per block get",
            gbps(total, put),
            gbps(total, get),
            get.as_secs_f64() * 1e3 / n as f64
        );
    }
}
