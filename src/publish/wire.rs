//! vLLM's KV event wire encoding: the msgpack form msgspec gives
//! `vllm.distributed.kv_events.KVEventBatch`.
//!
//! A batch is an array `[ts, events, data_parallel_rank]` (`ts` a float64 of
//! seconds since the Unix epoch). Each event is a map whose first key is
//! `"type"` (the class name: msgspec's tagged structs), then the fields in
//! vLLM's declaration order; fields left at their default are omitted
//! (msgspec's `omit_defaults`). See docs/events.md for the byte layout.

use rmp::encode;

use crate::CacheEvent;

/// Where the blocks of an event live (vLLM's `medium`): `"GPU"` for the
/// device cache, `"CPU"` for the host tier, a remote tier's name for it.
pub const MEDIUM_GPU: &str = "GPU";
/// The host-memory tier's `medium`.
pub const MEDIUM_CPU: &str = "CPU";

/// One event with the medium its blocks live in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireEvent {
    /// What happened.
    pub event: CacheEvent,
    /// vLLM's `medium` (`"GPU"`, `"CPU"`, a remote tier's name).
    pub medium: std::sync::Arc<str>,
}

/// Encodes one batch: `[ts, [event...], data_parallel_rank]`.
pub fn encode_batch(ts: f64, events: &[WireEvent], data_parallel_rank: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + events.len() * 96);
    // Writes into a Vec cannot fail.
    let w = &mut out;
    encode::write_array_len(w, 3).expect("vec write");
    encode::write_f64(w, ts).expect("vec write");
    encode::write_array_len(w, len32(events.len())).expect("vec write");
    for e in events {
        encode_event(w, e);
    }
    encode::write_uint(w, u64::from(data_parallel_rank)).expect("vec write");
    out
}

fn len32(n: usize) -> u32 {
    u32::try_from(n).expect("msgpack arrays hold at most 2^32 - 1 items")
}

fn key(w: &mut Vec<u8>, k: &str) {
    encode::write_str(w, k).expect("vec write");
}

fn uints(w: &mut Vec<u8>, values: impl ExactSizeIterator<Item = u64>) {
    encode::write_array_len(w, len32(values.len())).expect("vec write");
    for v in values {
        encode::write_uint(w, v).expect("vec write");
    }
}

fn opt_uint(w: &mut Vec<u8>, v: Option<u64>) {
    match v {
        Some(v) => {
            encode::write_uint(w, v).expect("vec write");
        }
        None => encode::write_nil(w).expect("vec write"),
    }
}

fn opt_str(w: &mut Vec<u8>, v: Option<&str>) {
    match v {
        Some(s) => encode::write_str(w, s).expect("vec write"),
        None => encode::write_nil(w).expect("vec write"),
    }
}

fn encode_event(w: &mut Vec<u8>, e: &WireEvent) {
    match &e.event {
        CacheEvent::BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
            adapter,
        } => {
            // type, block_hashes, parent_block_hash, token_ids, block_size,
            // lora_id, medium, lora_name, group_idx (extra_keys and the later
            // optional fields stay at their defaults and are omitted). msgspec
            // writes a map16 header for a struct of more than 15 fields.
            w.push(0xde);
            w.extend_from_slice(&9u16.to_be_bytes());
            key(w, "type");
            key(w, "BlockStored");
            key(w, "block_hashes");
            uints(w, block_hashes.iter().copied());
            key(w, "parent_block_hash");
            opt_uint(w, *parent_block_hash);
            key(w, "token_ids");
            uints(w, token_ids.iter().map(|&t| u64::from(t)));
            key(w, "block_size");
            encode::write_uint(w, *block_size as u64).expect("vec write");
            // The integer LoRA id is deprecated in vLLM; routers key on the name.
            key(w, "lora_id");
            opt_uint(w, None);
            key(w, "medium");
            key(w, &e.medium);
            key(w, "lora_name");
            opt_str(w, adapter.as_deref());
            key(w, "group_idx");
            encode::write_uint(w, 0).expect("vec write");
        }
        CacheEvent::BlockRemoved { block_hashes } => {
            encode::write_map_len(w, 4).expect("vec write");
            key(w, "type");
            key(w, "BlockRemoved");
            key(w, "block_hashes");
            uints(w, block_hashes.iter().copied());
            key(w, "medium");
            key(w, &e.medium);
            key(w, "group_idx");
            encode::write_uint(w, 0).expect("vec write");
        }
        CacheEvent::AllBlocksCleared => {
            encode::write_map_len(w, 1).expect("vec write");
            key(w, "type");
            key(w, "AllBlocksCleared");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(event: CacheEvent) -> WireEvent {
        WireEvent {
            event,
            medium: MEDIUM_GPU.into(),
        }
    }

    /// The bytes msgspec writes for the same batch of vLLM's classes
    /// (`msgspec.msgpack.encode(KVEventBatch(...))`, checked in the vLLM venv
    /// by python/engine_tests/vllm/test_kv_events_wire.py on live traffic).
    #[test]
    fn batch_matches_msgspec_bytes() {
        let events = [
            gpu(CacheEvent::BlockStored {
                block_hashes: vec![1, 2],
                parent_block_hash: None,
                token_ids: vec![1, 2, 3, 4],
                block_size: 2,
                adapter: None,
            }),
            WireEvent {
                event: CacheEvent::BlockRemoved {
                    block_hashes: vec![3],
                },
                medium: MEDIUM_CPU.into(),
            },
            gpu(CacheEvent::AllBlocksCleared),
        ];
        let got = encode_batch(1.5, &events, 0);
        let want = concat!(
            "93cb3ff8000000000000", // [1.5,
            "93",                   // [3 events
            "de0009a474797065ab426c6f636b53746f726564",
            "ac626c6f636b5f686173686573920102",
            "b1706172656e745f626c6f636b5f68617368c0",
            "a9746f6b656e5f6964739401020304",
            "aa626c6f636b5f73697a6502",
            "a76c6f72615f6964c0",
            "a66d656469756da3475055",
            "a96c6f72615f6e616d65c0",
            "a967726f75705f69647800",
            "84a474797065ac426c6f636b52656d6f766564",
            "ac626c6f636b5f6861736865739103",
            "a66d656469756da3435055",
            "a967726f75705f69647800",
            "81a474797065b0416c6c426c6f636b73436c6561726564",
            "00", // rank 0]
        );
        assert_eq!(hex(&got), want);
    }

    #[test]
    fn large_hashes_use_uint64() {
        let e = gpu(CacheEvent::BlockRemoved {
            block_hashes: vec![u64::MAX],
        });
        let got = hex(&encode_batch(0.0, &[e], 7));
        assert!(got.contains("91cfffffffffffffffff"), "{got}");
        assert!(got.ends_with("07"));
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }
}
