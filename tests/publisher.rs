//! The KV event publisher through its public API: a ZeroMQ subscriber (and a
//! replay client) on loopback read what a block manager's workload published.

use std::time::{Duration, Instant};

use mla_cache::publish::{EventPublisher, PublisherConfig};
use mla_cache::{AdmitOptions, BlockManager, CacheConfig, CacheEvent};

fn config() -> PublisherConfig {
    PublisherConfig {
        endpoint: "tcp://*:0".into(),
        replay_endpoint: Some("tcp://*:0".into()),
        max_batch_events: 16,
        max_batch_delay: Duration::from_millis(1),
        ..PublisherConfig::default()
    }
}

/// `tcp://0.0.0.0:PORT` as a loopback address to connect to.
fn loopback(endpoint: &str) -> String {
    let port = endpoint.rsplit(':').next().unwrap();
    format!("tcp://127.0.0.1:{port}")
}

fn subscriber(publisher: &EventPublisher, topic: &str) -> zmq::Socket {
    let sub = zmq::Context::new().socket(zmq::SUB).unwrap();
    sub.set_subscribe(topic.as_bytes()).unwrap();
    sub.set_rcvtimeo(5000).unwrap();
    sub.connect(&loopback(publisher.endpoint())).unwrap();
    sub
}

/// Publishes an empty-handed probe until the subscriber sees traffic (the
/// slow-joiner rule of PUB/SUB); returns the sequence number it saw.
fn join(publisher: &EventPublisher, sub: &zmq::Socket) -> u64 {
    sub.set_rcvtimeo(20).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        publisher.publish(vec![CacheEvent::AllBlocksCleared]);
        publisher.flush(Duration::from_secs(5));
        if let Ok(frames) = sub.recv_multipart(0) {
            sub.set_rcvtimeo(5000).unwrap();
            // Drain the probes already sent.
            let mut last = seq(&frames);
            sub.set_rcvtimeo(50).unwrap();
            while let Ok(f) = sub.recv_multipart(0) {
                last = seq(&f);
            }
            sub.set_rcvtimeo(5000).unwrap();
            return last;
        }
        assert!(Instant::now() < deadline, "subscriber never joined");
    }
}

fn seq(frames: &[Vec<u8>]) -> u64 {
    assert_eq!(frames.len(), 3, "multipart [topic, seq, payload]");
    u64::from_be_bytes(frames[1].as_slice().try_into().expect("8-byte sequence"))
}

/// Events in one payload: `[ts, [events...], rank]`.
fn event_count(payload: &[u8], rank: u32) -> u32 {
    let mut r = payload;
    assert_eq!(rmp::decode::read_array_len(&mut r).unwrap(), 3);
    let ts = rmp::decode::read_f64(&mut r).unwrap();
    assert!(ts > 1.6e9, "ts is seconds since the epoch: {ts}");
    let n = rmp::decode::read_array_len(&mut r).unwrap();
    let tail = payload.last().copied().unwrap();
    assert_eq!(u32::from(tail), rank, "rank is the last item");
    n
}

fn workload(manager: &BlockManager, requests: u64) {
    for id in 0..requests {
        let prompt: Vec<u32> = (0..256).map(|t| (t + id as u32 * 7) % 300).collect();
        manager
            .admit(id, &prompt, &AdmitOptions::default())
            .unwrap();
        manager.free(id).unwrap();
    }
}

#[test]
fn every_event_arrives_in_order_without_gaps() {
    let mut cc = CacheConfig::new(64);
    cc.enable_events = true;
    let manager = BlockManager::new(cc).unwrap();
    let publisher = EventPublisher::new(PublisherConfig {
        topic: "kv".into(),
        data_parallel_rank: 0,
        ..config()
    })
    .unwrap();
    let sub = subscriber(&publisher, "kv");
    let first = join(&publisher, &sub) + 1;

    let mut expected = 0u64;
    for round in 0..20 {
        workload(&manager, 5 + round);
        let events = manager.take_events();
        expected += events.len() as u64;
        assert_eq!(publisher.publish(events.clone()), events.len());
    }
    assert!(publisher.flush(Duration::from_secs(5)));

    let mut got = 0u64;
    let mut next = first;
    while got < expected {
        let frames = sub.recv_multipart(0).expect("every batch arrives");
        assert_eq!(frames[0], b"kv");
        assert_eq!(seq(&frames), next, "no gap");
        next += 1;
        got += u64::from(event_count(&frames[2], 0));
    }
    assert_eq!(got, expected);
    let stats = publisher.stats();
    assert_eq!(stats.events_dropped, 0);
    assert_eq!(stats.batches_published, next);
}

#[test]
fn replay_returns_missed_batches_then_the_end_marker() {
    let publisher = EventPublisher::new(config()).unwrap();
    for i in 0..10u64 {
        publisher.publish(vec![CacheEvent::BlockRemoved {
            block_hashes: vec![i],
        }]);
        assert!(publisher.flush(Duration::from_secs(5)));
    }
    let dealer = zmq::Context::new().socket(zmq::DEALER).unwrap();
    dealer.set_rcvtimeo(5000).unwrap();
    dealer
        .connect(&loopback(publisher.replay_endpoint().unwrap()))
        .unwrap();
    dealer
        .send_multipart([&b""[..], &4u64.to_be_bytes()], 0)
        .unwrap();
    let mut seqs = Vec::new();
    loop {
        let frames = dealer.recv_multipart(0).expect("replay answers");
        assert_eq!(frames.len(), 4, "[empty, topic, seq, payload]");
        if frames[2] == (-1i64).to_be_bytes() {
            assert!(frames[3].is_empty());
            break;
        }
        assert_eq!(event_count(&frames[3], 0), 1);
        seqs.push(u64::from_be_bytes(frames[2].as_slice().try_into().unwrap()));
    }
    assert_eq!(seqs, (4..10).collect::<Vec<_>>());
    assert_eq!(publisher.stats().replays_served, 1);
}

#[test]
fn a_stalled_subscriber_never_blocks_publishing() {
    let publisher = EventPublisher::new(PublisherConfig {
        hwm: 4,
        max_queue_size: 1_000_000,
        replay_endpoint: None,
        ..config()
    })
    .unwrap();
    // Connected, subscribed, never reading.
    let _stalled = subscriber(&publisher, "");
    let event = CacheEvent::BlockStored {
        block_hashes: vec![1; 64],
        parent_block_hash: Some(2),
        token_ids: vec![3; 64 * 64],
        block_size: 64,
        adapter: None,
    };
    for _ in 0..2_000 {
        publisher.publish(vec![event.clone(); 8]);
    }
    assert!(publisher.flush(Duration::from_secs(30)));
    let stats = publisher.stats();
    assert_eq!(stats.events_accepted + stats.events_dropped, 16_000);
    assert_eq!(stats.events_accepted, 16_000);
}

#[test]
fn a_full_queue_drops_and_counts() {
    let publisher = EventPublisher::new(PublisherConfig {
        max_queue_size: 3,
        replay_endpoint: None,
        ..config()
    })
    .unwrap();
    let four = vec![CacheEvent::AllBlocksCleared; 4];
    assert_eq!(publisher.publish(four), 0);
    assert_eq!(publisher.publish(vec![CacheEvent::AllBlocksCleared]), 1);
    let stats = publisher.stats();
    assert_eq!((stats.events_accepted, stats.events_dropped), (1, 4));
    publisher.shutdown();
    assert_eq!(publisher.publish(vec![CacheEvent::AllBlocksCleared]), 0);
    assert_eq!(publisher.stats().events_dropped, 5);
}

#[test]
fn bad_configs_are_refused() {
    for bad in [
        PublisherConfig {
            max_queue_size: 0,
            ..config()
        },
        PublisherConfig {
            max_batch_events: 0,
            ..config()
        },
        PublisherConfig {
            endpoint: "tcp://*:notaport".into(),
            ..config()
        },
        PublisherConfig {
            endpoint: "bogus://x".into(),
            ..config()
        },
    ] {
        assert!(EventPublisher::new(bad).is_err());
    }
    let taken = EventPublisher::new(config()).unwrap();
    let port = taken.endpoint().rsplit(':').next().unwrap().to_owned();
    let again = EventPublisher::new(PublisherConfig {
        endpoint: format!("tcp://*:{port}"),
        ..config()
    });
    let err = again.unwrap_err().to_string();
    assert!(err.contains("bind"), "{err}");
}

/// A msgpack value of an event: what vLLM's fields hold.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Nil,
    Int(u64),
    Str(String),
    Array(Vec<Value>),
}

fn value(r: &mut &[u8]) -> Value {
    use rmp::Marker;
    let marker = rmp::decode::read_marker(r).unwrap();
    let take = |r: &mut &[u8], n: usize| {
        let (head, tail) = r.split_at(n);
        *r = tail;
        head.to_vec()
    };
    let be = |b: Vec<u8>| b.iter().fold(0u64, |a, &x| a << 8 | u64::from(x));
    match marker {
        Marker::Null => Value::Nil,
        Marker::FixPos(n) => Value::Int(n.into()),
        Marker::U8 => Value::Int(be(take(r, 1))),
        Marker::U16 => Value::Int(be(take(r, 2))),
        Marker::U32 => Value::Int(be(take(r, 4))),
        Marker::U64 => Value::Int(be(take(r, 8))),
        Marker::FixStr(n) => Value::Str(String::from_utf8(take(r, n.into())).unwrap()),
        Marker::Str8 => {
            let n = be(take(r, 1)) as usize;
            Value::Str(String::from_utf8(take(r, n)).unwrap())
        }
        Marker::FixArray(n) => Value::Array((0..n).map(|_| value(r)).collect()),
        Marker::Array16 => {
            let n = be(take(r, 2));
            Value::Array((0..n).map(|_| value(r)).collect())
        }
        m => panic!("unexpected marker {m:?}"),
    }
}

/// `(type, medium, block_hashes)` of every event of a payload.
fn decode_events(payload: &[u8]) -> Vec<(String, String, Vec<u64>)> {
    let mut r = payload;
    assert_eq!(rmp::decode::read_array_len(&mut r).unwrap(), 3);
    rmp::decode::read_f64(&mut r).unwrap();
    let n = rmp::decode::read_array_len(&mut r).unwrap();
    (0..n)
        .map(|_| {
            let fields = rmp::decode::read_map_len(&mut r).unwrap();
            let (mut kind, mut medium, mut hashes) = (String::new(), String::new(), Vec::new());
            for _ in 0..fields {
                let Value::Str(k) = value(&mut r) else {
                    panic!("string keys")
                };
                match (k.as_str(), value(&mut r)) {
                    ("type", Value::Str(t)) => kind = t,
                    ("medium", Value::Str(m)) => medium = m,
                    ("block_hashes", Value::Array(hs)) => {
                        hashes = hs
                            .into_iter()
                            .map(|h| match h {
                                Value::Int(h) => h,
                                v => panic!("hash {v:?}"),
                            })
                            .collect()
                    }
                    _ => {}
                }
            }
            (kind, medium, hashes)
        })
        .collect()
}

/// A tiered cache's events reach subscribers each with its own medium.
#[test]
fn tier_events_arrive_with_their_medium() {
    use mla_cache::store::HostStore;
    use mla_cache::tier::{HostTier, TierOptions, TieredCache, WritePolicy};
    use std::sync::Arc;

    let cache_config = CacheConfig {
        enable_events: true,
        block_size: 16,
        num_layers: 1,
        ..CacheConfig::new(8)
    };
    let store = Arc::new(HostStore::new(&cache_config).unwrap());
    let tiers = TierOptions {
        write_policy: WritePolicy::WriteThrough,
        host: Some(HostTier::new(store.block_bytes(), 8).unwrap()),
        ..TierOptions::default()
    };
    let cache = TieredCache::new(BlockManager::new(cache_config).unwrap(), store, tiers).unwrap();
    let prompt: Vec<u32> = (0..33).collect();
    cache.admit(1, &prompt, &AdmitOptions::default()).unwrap();
    cache.free(1).unwrap();
    let events = cache.take_events();
    let expected: Vec<(String, String, Vec<u64>)> = events
        .iter()
        .map(|e| match &e.event {
            CacheEvent::BlockStored { block_hashes, .. } => (
                "BlockStored".into(),
                e.medium.to_string(),
                block_hashes.clone(),
            ),
            other => panic!("only stores here: {other:?}"),
        })
        .collect();
    let media: Vec<&str> = expected.iter().map(|e| e.1.as_str()).collect();
    assert_eq!(media, ["GPU", "CPU"], "{expected:?}");
    assert_eq!(expected[0].2, expected[1].2);

    let publisher = EventPublisher::new(config()).unwrap();
    let sub = subscriber(&publisher, "");
    join(&publisher, &sub);
    assert_eq!(publisher.publish_events(events), 2);
    assert!(publisher.flush(Duration::from_secs(5)));
    let mut got = Vec::new();
    while got.len() < expected.len() {
        let frames = sub.recv_multipart(0).expect("the batch arrives");
        got.extend(decode_events(&frames[2]));
    }
    assert_eq!(got, expected);
}
