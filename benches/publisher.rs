//! KV event publishing costs: events per second through the publisher
//! (encode + ZeroMQ send of 1,024-event batches, one subscriber reading on
//! loopback), and admit+free of a cold 4,096-token prompt with events off,
//! with events recorded and drained, and with them drained into a publisher.
//!
//! `cargo bench --bench publisher`

use std::hint::black_box;
use std::thread;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use mla_cache::publish::{EventPublisher, PublisherConfig};
use mla_cache::{AdmitOptions, BlockManager, CacheConfig, CacheEvent};

const PROMPT: u32 = 4096;

fn publisher() -> EventPublisher {
    EventPublisher::new(PublisherConfig {
        endpoint: "tcp://*:0".into(),
        max_queue_size: 10_000_000,
        ..PublisherConfig::default()
    })
    .unwrap()
}

/// A subscriber on another thread that reads everything until the socket
/// has been quiet for a second.
fn reader(endpoint: &str) -> thread::JoinHandle<()> {
    let port = endpoint.rsplit(':').next().unwrap().to_owned();
    let sub = zmq::Context::new().socket(zmq::SUB).unwrap();
    sub.set_subscribe(b"").unwrap();
    sub.set_rcvtimeo(1000).unwrap();
    sub.connect(&format!("tcp://127.0.0.1:{port}")).unwrap();
    thread::spawn(move || while sub.recv_multipart(0).is_ok() {})
}

/// One stored 64-token block, as admission produces.
fn stored(i: u64) -> CacheEvent {
    CacheEvent::BlockStored {
        block_hashes: vec![i.wrapping_mul(0x9e37_79b9_7f4a_7c15)],
        parent_block_hash: Some(i),
        token_ids: (0..64).collect(),
        block_size: 64,
        adapter: None,
    }
}

fn throughput(c: &mut Criterion) {
    let p = publisher();
    let _reader = reader(p.endpoint());
    let mut g = c.benchmark_group("publisher");
    g.throughput(Throughput::Elements(1024));
    g.bench_function("publish_1024_stored_events", |b| {
        b.iter_custom(|iters| {
            let events: Vec<Vec<CacheEvent>> = (0..iters)
                .map(|k| (0..1024).map(|i| stored(k * 1024 + i)).collect())
                .collect();
            let start = Instant::now();
            for batch in events {
                black_box(p.publish(batch));
            }
            assert!(p.flush(Duration::from_secs(60)));
            start.elapsed()
        })
    });
    g.finish();
    assert_eq!(p.stats().events_dropped, 0);
}

fn manager(events: bool) -> BlockManager {
    let mut c = CacheConfig::new(8192);
    c.hash_seed = Some(1);
    c.enable_events = events;
    BlockManager::new(c).unwrap()
}

fn admission(c: &mut Criterion) {
    let mut g = c.benchmark_group("admit_free_4096_cold");
    let options = AdmitOptions::default();
    for (name, events, publishing) in [
        ("events_off", false, false),
        ("events_drained", true, false),
        ("events_published", true, true),
    ] {
        let m = manager(events);
        let p = publishing.then(publisher);
        let _reader = p.as_ref().map(|p| reader(p.endpoint()));
        let mut next = 0u32;
        g.bench_function(name, |b| {
            b.iter(|| {
                next = next.wrapping_add(PROMPT);
                let prompt: Vec<u32> = (next..next + PROMPT).collect();
                m.admit(1, black_box(&prompt), &options).unwrap();
                m.free(1).unwrap();
                let events = m.take_events();
                match &p {
                    Some(p) => {
                        black_box(p.publish(events));
                    }
                    None => {
                        black_box(events);
                    }
                }
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(30)
        .measurement_time(Duration::from_secs(4))
        .warm_up_time(Duration::from_secs(1));
    targets = throughput, admission
}
criterion_main!(benches);
