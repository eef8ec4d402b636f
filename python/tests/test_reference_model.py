"""1,000 random requests through the manager and a small pure-Python model of
its rules (docs/semantics.md): same block ids, hits (capped at len - 1),
free counts, evictions and copy-on-write copies at every step."""

import random
from collections import OrderedDict, deque

import numpy as np
import pytest

from mla_cache import BlockManager, OutOfBlocks

from conftest import small_config

BS = 4
NUM_BLOCKS = 48


class Model:
    """vLLM-style block pool: an unhashed FIFO reused first, then the least
    recently freed cached block; a block's identity is its whole prefix."""

    def __init__(self, n):
        self.n = n
        self.ref = [0] * n
        self.key = [None] * n
        self.unhashed = deque(range(n))
        self.lru = OrderedDict()
        self.index = {}
        self.free = n
        self.requests = {}
        self.evictions = 0

    def _allocate(self):
        if self.unhashed:
            b = self.unhashed.popleft()
        else:
            b, _ = self.lru.popitem(last=False)
            del self.index[self.key[b]]
            self.key[b] = None
            self.evictions += 1
        self.free -= 1
        self.ref[b] = 1
        return b

    def _acquire(self, b):
        if self.ref[b] == 0:
            del self.lru[b]
            self.free -= 1
        self.ref[b] += 1

    def _release(self, b):
        self.ref[b] -= 1
        if self.ref[b] == 0:
            if self.key[b] is not None:
                self.lru[b] = None
            else:
                self.unhashed.append(b)
            self.free += 1

    @staticmethod
    def _keys(salt, tokens, upto):
        return [(salt, tuple(tokens[: (i + 1) * BS])) for i in range(upto)]

    def _index(self, r):
        full = len(r["tokens"]) // BS
        for i in range(r["hashed"], full):
            k = (r["salt"], tuple(r["tokens"][: (i + 1) * BS]))
            b = r["blocks"][i]
            if self.key[b] is None and k not in self.index:
                self.index[k] = b
                self.key[b] = k
        r["hashed"] = max(r["hashed"], full)

    def admit(self, rid, tokens, decode, salt):
        needed = -(-(len(tokens) + decode) // BS)
        if needed > self.n:
            raise ValueError
        hits = []
        for k in self._keys(salt, tokens, (len(tokens) - 1) // BS):
            if k not in self.index:
                break
            hits.append(self.index[k])
        reviving = sum(1 for b in hits if self.ref[b] == 0)
        if needed - len(hits) > self.free - reviving:
            raise OutOfBlocks
        for b in hits:
            self._acquire(b)
        blocks = hits + [self._allocate() for _ in range(needed - len(hits))]
        r = dict(tokens=list(tokens), blocks=blocks, salt=salt, hashed=0)
        self._index(r)
        self.requests[rid] = r
        return blocks, len(hits) * BS

    def append(self, rid, new):
        r = self.requests[rid]
        length = len(r["tokens"])
        needed = -(-(length + len(new)) // BS)
        if needed > self.n:
            raise ValueError
        grow = max(0, needed - len(r["blocks"]))
        tail = length // BS
        cow = length % BS != 0 and self.ref[r["blocks"][tail]] > 1
        if grow + cow > self.free:
            raise OutOfBlocks
        copies = []
        if cow:
            src = r["blocks"][tail]
            dst = self._allocate()
            self._release(src)
            r["blocks"][tail] = dst
            copies.append((src, dst))
        added = [self._allocate() for _ in range(grow)]
        r["blocks"] += added
        r["tokens"] += list(new)
        self._index(r)
        return added, copies

    def fork(self, parent, child):
        p = self.requests[parent]
        c = dict(p, tokens=list(p["tokens"]), blocks=p["blocks"][: -(-len(p["tokens"]) // BS)])
        for b in c["blocks"]:
            self._acquire(b)
        self.requests[child] = c

    def release(self, rid):
        for b in reversed(self.requests.pop(rid)["blocks"]):
            self._release(b)


PREFIXES = [list(range(p * 1000, p * 1000 + 23)) for p in range(4)]


def prompt(rng):
    if rng.random() < 0.7:
        base = PREFIXES[rng.randrange(len(PREFIXES))][: rng.randrange(1, 24)]
    else:
        base = []
    tail = [rng.randrange(50) for _ in range(rng.randrange(0 if base else 1, 12))]
    return base + tail


@pytest.mark.parametrize("seed", [1, 2])
def test_thousand_random_requests_match_the_model(seed):
    rng = random.Random(seed)
    # The model evicts in vLLM's order.
    m = BlockManager(small_config(num_blocks=NUM_BLOCKS, block_size=BS, hash_seed=seed, eviction="lru"))
    model = Model(NUM_BLOCKS)
    live = []
    admitted = copies_seen = hits_seen = 0
    next_id = 0
    while admitted < 1000:
        op = rng.random()
        if op < 0.45 or not live:
            tokens = prompt(rng)
            decode = rng.randrange(0, 6)
            salt = rng.choice([None, None, "tenant"])
            rid = next_id if rng.random() < 0.5 else f"req-{next_id}"
            next_id += 1
            as_array = rng.random() < 0.5
            arg = np.array(tokens, dtype=rng.choice([np.int32, np.int64, np.uint32])) if as_array else tokens
            try:
                expected = model.admit(rid, tokens, decode, salt)
            except OutOfBlocks:
                with pytest.raises(OutOfBlocks):
                    m.admit(rid, arg, decode_slots=decode, salt=salt)
            else:
                a = m.admit(rid, arg, decode_slots=decode, salt=salt)
                assert (list(a.block_ids), a.num_cached_tokens) == expected
                hits_seen += a.num_cached_tokens > 0
                live.append(rid)
                admitted += 1
        elif op < 0.75:
            rid = rng.choice(live)
            new = [rng.randrange(50) for _ in range(rng.randrange(1, 4))]
            try:
                added, copies = model.append(rid, new)
            except OutOfBlocks:
                with pytest.raises(OutOfBlocks):
                    m.append(rid, new)
            else:
                o = m.append(rid, new)
                assert list(o.new_block_ids) == added
                assert o.copies == copies
                copies_seen += len(copies)
        elif op < 0.82:
            parent = rng.choice(live)
            child = f"fork-{next_id}"
            next_id += 1
            model.fork(parent, child)
            m.fork(parent, child)
            live.append(child)
        else:
            rid = live.pop(rng.randrange(len(live)))
            model.release(rid)
            m.free(rid)
        assert m.num_free_blocks == model.free
        if rng.random() < 0.05:
            m._check_invariants()
            for rid in live:
                assert list(m.block_table(rid)) == model.requests[rid]["blocks"]
            s = m.stats()
            assert s["cached_blocks"] == len(model.index)
            assert s["evictions"] == model.evictions
    for rid in live:
        m.free(rid)
        model.release(rid)
    assert m.num_free_blocks == model.free == NUM_BLOCKS
    m._check_invariants()
    # The scenario exercised what it is meant to.
    assert hits_seen > 50 and copies_seen > 0 and model.evictions > 0
