"""mla_cache.EventPublisher on the wire, read the way a vLLM router reads it.

Runs in the vLLM venv (``scripts/engine-tests.sh vllm-0.34 -k kv_events_wire``):
a pyzmq subscriber decodes every message with vLLM's own
``vllm.distributed.kv_events.KVEventBatch`` (msgspec) and with the small
msgpack decoder below, written from the msgpack spec alone.
"""

from __future__ import annotations

import pathlib
import random
import struct
import subprocess
import time
from typing import Any, List, Tuple

import msgspec
import pytest
import zmq
from vllm.distributed import kv_events as vk

import mla_cache
from mla_cache import AllBlocksCleared, BlockRemoved, BlockStored

END_SEQ = (-1).to_bytes(8, "big", signed=True)


# --- an independent msgpack decoder (the subset a KVEventBatch uses) -------


def unpack(buf: bytes) -> Any:
    value, end = _unpack(buf, 0)
    assert end == len(buf), "trailing bytes"
    return value


def _unpack(b: bytes, i: int) -> Tuple[Any, int]:
    m = b[i]
    i += 1
    if m <= 0x7F:
        return m, i
    if 0x80 <= m <= 0x8F:
        return _map(b, i, m & 0x0F)
    if 0x90 <= m <= 0x9F:
        return _array(b, i, m & 0x0F)
    if 0xA0 <= m <= 0xBF:
        n = m & 0x1F
        return b[i : i + n].decode(), i + n
    if m == 0xC0:
        return None, i
    if m in (0xC2, 0xC3):
        return m == 0xC3, i
    if m == 0xCB:
        return struct.unpack(">d", b[i : i + 8])[0], i + 8
    sizes = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}
    if m in sizes:
        n = sizes[m]
        return int.from_bytes(b[i : i + n], "big"), i + n
    if m in (0xD9, 0xDA, 0xDB):
        w = {0xD9: 1, 0xDA: 2, 0xDB: 4}[m]
        n = int.from_bytes(b[i : i + w], "big")
        i += w
        return b[i : i + n].decode(), i + n
    if m in (0xDC, 0xDD):
        w = 2 if m == 0xDC else 4
        return _array(b, i + w, int.from_bytes(b[i : i + w], "big"))
    if m in (0xDE, 0xDF):
        w = 2 if m == 0xDE else 4
        return _map(b, i + w, int.from_bytes(b[i : i + w], "big"))
    raise AssertionError(f"unexpected msgpack marker {m:#x} at {i - 1}")


def _array(b: bytes, i: int, n: int) -> Tuple[List[Any], int]:
    out = []
    for _ in range(n):
        v, i = _unpack(b, i)
        out.append(v)
    return out, i


def _map(b: bytes, i: int, n: int) -> Tuple[List[Tuple[Any, Any]], int]:
    """A map as its (key, value) pairs, so the key order can be checked."""
    out = []
    for _ in range(n):
        k, i = _unpack(b, i)
        v, i = _unpack(b, i)
        out.append((k, v))
    return out, i


# --- helpers ---------------------------------------------------------------


def loopback(endpoint: str) -> str:
    return "tcp://127.0.0.1:" + endpoint.rsplit(":", 1)[1]


def publisher(**kw: Any) -> mla_cache.EventPublisher:
    args = dict(
        endpoint="tcp://*:0",
        replay_endpoint="tcp://*:0",
        topic="kv",
        max_batch_events=32,
        max_batch_delay_s=0.001,
    )
    args.update(kw)
    return mla_cache.EventPublisher(**args)


def subscribe(ctx: zmq.Context, pub: mla_cache.EventPublisher) -> zmq.Socket:
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    sub.connect(loopback(pub.endpoint))
    return sub


def join(pub: mla_cache.EventPublisher, sub: zmq.Socket) -> int:
    """Sends probes until the subscriber hears one (PUB/SUB's slow joiner);
    returns the next sequence number to expect."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pub.publish([probe()])
        assert pub.flush()
        if sub.poll(50):
            last = -1
            while sub.poll(100):
                last = int.from_bytes(sub.recv_multipart()[1], "big")
            return last + 1
    raise AssertionError("subscriber never joined")


def probe() -> AllBlocksCleared:
    """An ``AllBlocksCleared`` event object, taken from a real manager."""
    m = mla_cache.BlockManager(mla_cache.CacheConfig(num_blocks=4, enable_events=True))
    assert m.reset_prefix_cache()
    (event,) = m.take_events()
    return event


def as_vllm(e: mla_cache.CacheEvent, medium: str = "GPU") -> vk.KVCacheEvent:
    """What vLLM's decoder must give for one of the manager's events."""
    if isinstance(e, BlockStored):
        return vk.BlockStored(
            block_hashes=list(e.block_hashes),
            parent_block_hash=e.parent_block_hash,
            token_ids=list(e.token_ids),
            block_size=e.block_size,
            lora_id=None,
            medium=medium,
            lora_name=e.adapter,
            group_idx=0,
        )
    if isinstance(e, BlockRemoved):
        return vk.BlockRemoved(block_hashes=list(e.block_hashes), medium=medium, group_idx=0)
    assert isinstance(e, AllBlocksCleared)
    return vk.AllBlocksCleared()


def workload(seed: int, requests: int) -> List[mla_cache.CacheEvent]:
    """The events of a replayed workload on a small cache, in order: shared
    system prompts, private tails, a LoRA adapter, evictions and one reset."""
    rng = random.Random(seed)
    m = mla_cache.BlockManager(
        mla_cache.CacheConfig(num_blocks=48, block_size=16, enable_events=True)
    )
    systems = [[rng.randrange(32000) for _ in range(64)] for _ in range(4)]
    events: List[mla_cache.CacheEvent] = []
    for rid in range(requests):
        prompt = rng.choice(systems) + [rng.randrange(32000) for _ in range(rng.randrange(1, 80))]
        lora = rng.choice([None, None, "sql-lora"])
        m.admit(rid, prompt, extra_keys={"adapter": lora} if lora else None)
        m.free(rid)
        if rid == requests // 2:
            assert m.reset_prefix_cache()
        events.extend(m.take_events())
    return events


# --- tests -----------------------------------------------------------------


def test_every_event_arrives_in_order_decoded_by_vllm() -> None:
    ctx = zmq.Context()
    pub = publisher()
    sub = subscribe(ctx, pub)
    first = join(pub, sub)
    events = workload(seed=1, requests=300)
    assert any(isinstance(e, BlockRemoved) for e in events), "the workload evicts"
    assert any(isinstance(e, BlockStored) and e.adapter for e in events)
    for start in range(0, len(events), 7):
        assert pub.publish(events[start : start + 7]) == len(events[start : start + 7])
    assert pub.flush()

    decoder = msgspec.msgpack.Decoder(vk.KVEventBatch)
    got: List[vk.KVCacheEvent] = []
    seqs: List[int] = []
    while len(got) < len(events):
        assert sub.poll(5000), f"only {len(got)} of {len(events)} events arrived"
        topic, seq, payload = sub.recv_multipart()
        assert topic == b"kv"
        seqs.append(int.from_bytes(seq, "big"))
        batch = decoder.decode(payload)
        assert batch.data_parallel_rank == 0
        assert abs(batch.ts - time.time()) < 60
        got.extend(batch.events)
        check_independently(payload, batch)
    assert seqs == list(range(first, first + len(seqs))), "no gaps"
    assert got == [as_vllm(e) for e in events]
    stats = pub.stats()
    assert stats["events_dropped"] == 0
    assert stats["batches_published"] == first + len(seqs)
    pub.shutdown()
    ctx.destroy(linger=0)


def test_tier_events_arrive_with_their_own_medium() -> None:
    c = mla_cache.CacheConfig(
        8, block_size=16, num_layers=2, hash_seed=42, enable_events=True
    )
    store = mla_cache.LatentStore(c)
    cache = mla_cache.TieredCache(c, store, host_mem=2 * c.bytes_per_block)
    prompt = list(range(3 * 16 + 1))
    cache.admit(1, prompt)
    cache.free(1)
    events = cache.take_events()
    assert [e.medium for e in events] == ["GPU", "CPU", "CPU", "CPU"]

    ctx = zmq.Context()
    pub = publisher()
    sub = subscribe(ctx, pub)
    join(pub, sub)
    assert pub.publish(events) == len(events)
    assert pub.flush()
    decoder = msgspec.msgpack.Decoder(vk.KVEventBatch)
    got: List[vk.KVCacheEvent] = []
    while len(got) < len(events):
        assert sub.poll(5000), f"only {len(got)} of {len(events)} events arrived"
        payload = sub.recv_multipart()[2]
        batch = decoder.decode(payload)
        check_independently(payload, batch)
        got.extend(batch.events)
    assert got == [as_vllm(e, e.medium) for e in events]
    # A medium given to publish overrides the events' own.
    assert pub.publish(events[:1], medium="GPU") == 1
    pub.shutdown()
    ctx.destroy(linger=0)


def check_independently(payload: bytes, batch: vk.KVEventBatch) -> None:
    """The second decoder agrees with vLLM's and sees vLLM's field order."""
    ts, raw_events, rank = unpack(payload)
    assert ts == batch.ts and rank == batch.data_parallel_rank
    assert len(raw_events) == len(batch.events)
    for pairs, event in zip(raw_events, batch.events):
        keys = [k for k, _ in pairs]
        assert keys[0] == "type" and pairs[0][1] == type(event).__name__
        order = list(type(event).__struct_fields__)
        assert keys[1:] == sorted(keys[1:], key=order.index), "vLLM's field order"
        for k, v in pairs[1:]:
            assert getattr(event, k) == v


def test_replay_returns_missed_batches_after_a_reconnect() -> None:
    ctx = zmq.Context()
    pub = publisher()
    sub = subscribe(ctx, pub)
    next_seq = join(pub, sub)
    sub.close(linger=0)  # the subscriber goes away ...

    events = workload(seed=2, requests=60)
    # ... and misses one batch per event, from the device cache and the host tier.
    media = ["GPU" if i % 3 else "CPU" for i in range(len(events))]
    for e, medium in zip(events, media):
        pub.publish([e], medium=medium)
        assert pub.flush()

    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(loopback(pub.replay_endpoint))
    dealer.send_multipart([b"", next_seq.to_bytes(8, "big")])
    decoder = msgspec.msgpack.Decoder(vk.KVEventBatch)
    replayed: List[vk.KVCacheEvent] = []
    seqs = []
    while True:
        assert dealer.poll(5000), "replay answers"
        empty, topic, seq, payload = dealer.recv_multipart()
        assert empty == b""
        if seq == END_SEQ:
            assert topic == b"" and payload == b""
            break
        assert topic == b"kv"
        seqs.append(int.from_bytes(seq, "big"))
        replayed.extend(decoder.decode(payload).events)
    assert seqs == list(range(next_seq, next_seq + len(events)))
    assert replayed == [as_vllm(e, m) for e, m in zip(events, media)]
    assert pub.stats()["replays_served"] == 1
    pub.shutdown()
    ctx.destroy(linger=0)


def test_a_stalled_subscriber_never_blocks_admission() -> None:
    ctx = zmq.Context()
    pub = publisher(hwm=2, replay_endpoint=None, max_queue_size=1_000_000)
    stalled = ctx.socket(zmq.SUB)
    stalled.setsockopt(zmq.RCVHWM, 1)
    stalled.setsockopt(zmq.SUBSCRIBE, b"")
    stalled.connect(loopback(pub.endpoint))  # and never reads
    m = mla_cache.BlockManager(
        mla_cache.CacheConfig(num_blocks=256, block_size=16, enable_events=True)
    )
    published = 0
    for rid in range(3000):
        m.admit(rid, [rid % 97] * 64 + list(range(rid, rid + 200)))
        m.free(rid)
        published += pub.publish(m.take_events())
    assert pub.flush(30)
    stats = pub.stats()
    assert stats["events_accepted"] == published > 0
    assert stats["events_dropped"] == 0
    pub.shutdown()
    ctx.destroy(linger=0)


def test_bad_arguments_raise_and_publish_checks_its_input() -> None:
    with pytest.raises(ValueError):
        mla_cache.EventPublisher(endpoint="tcp://*:0", max_queue_size=0)
    with pytest.raises(ValueError):
        mla_cache.EventPublisher(endpoint="udp://x:1", data_parallel_rank=1)
    with pytest.raises(ValueError):
        mla_cache.EventPublisher(endpoint="tcp://*:0", max_batch_delay_s=-1.0)
    pub = publisher(replay_endpoint=None)
    with pytest.raises(TypeError):
        pub.publish([object()])  # type: ignore[list-item]
    with pytest.raises(ValueError):
        pub.publish([probe()], medium="")
    assert pub.stats()["events_accepted"] == 0
    pub.shutdown()
    assert pub.publish([probe()]) == 0
    assert pub.stats()["events_dropped"] == 1


# --- a C program publishes, this subscriber reads ----------------------------

ROOT = pathlib.Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def c_publisher(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """tests/c/publisher_main.c built against the library's C ABI."""
    subprocess.run(["cargo", "build", "--release", "-p", "mla-cache-capi", "--quiet"], cwd=ROOT, check=True)
    lib = ROOT / "target" / "release"
    out = tmp_path_factory.mktemp("c")
    exe = out / "publisher_main"
    # The program records the library's SONAME; it finds it through a link.
    (out / "libmla_cache.so.0").symlink_to(lib / "libmla_cache.so")
    subprocess.run(
        ["gcc", "-std=c11", "-pedantic", "-Wall", "-Wextra", "-Werror", "-O1",
         f"-I{ROOT / 'include'}", str(ROOT / "tests/c/publisher_main.c"),
         f"-L{lib}", "-lmla_cache", f"-Wl,-rpath,{out}", "-o", str(exe)],
        check=True,
    )
    return exe


def test_a_c_program_publishes_to_a_python_subscriber(c_publisher: pathlib.Path) -> None:
    proc = subprocess.Popen(
        [str(c_publisher), "tcp://*:0"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    assert proc.stdin and proc.stdout

    def say(line: str) -> None:
        proc.stdin.write(line + "\n")
        proc.stdin.flush()

    try:
        word, endpoint = proc.stdout.readline().split()
        assert word == "endpoint"
        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"kv")
        sub.connect(loopback(endpoint))
        deadline = time.monotonic() + 10
        while not sub.poll(50):
            assert time.monotonic() < deadline, "subscriber never joined"
            say("probe")
        last = -1
        while sub.poll(200):
            last = int.from_bytes(sub.recv_multipart()[1], "big")
        say("run 200")
        word, published, batches, dropped = proc.stdout.readline().split()
        assert word == "published" and dropped == "0"

        decoder = msgspec.msgpack.Decoder(vk.KVEventBatch)
        seqs: List[int] = []
        got: List[vk.KVCacheEvent] = []
        while not seqs or seqs[-1] < int(batches) - 1:
            assert sub.poll(5000), f"batch {len(seqs)} never arrived"
            topic, seq, payload = sub.recv_multipart()
            seqs.append(int.from_bytes(seq, "big"))
            batch = decoder.decode(payload)
            check_independently(payload, batch)
            got.extend(batch.events)
        assert seqs == list(range(last + 1, int(batches))), "in order, no gaps"
        stored = [e for e in got if isinstance(e, vk.BlockStored)]
        removed = [e for e in got if isinstance(e, vk.BlockRemoved)]
        assert stored and removed, "the C workload stores and evicts"
        assert all(e.medium == "GPU" and e.block_size == 16 for e in stored)
        # Every evicted block was announced as stored first.
        seen: set = set()
        for e in got:
            if isinstance(e, vk.BlockStored):
                seen.update(e.block_hashes)
            elif isinstance(e, vk.BlockRemoved):
                assert set(e.block_hashes) <= seen
        say("quit")
        assert proc.wait(timeout=10) == 0
        ctx.destroy(linger=0)
    finally:
        if proc.poll() is None:
            proc.kill()
