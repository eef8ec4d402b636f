"""Many Python threads calling one manager at once."""

import random
import threading

import numpy as np

from mla_cache import BlockManager, OutOfBlocks

from conftest import small_config

THREADS = 8
STEPS = 400


def worker(m, t, errors, barrier):
    rng = random.Random(t)
    mine = []
    barrier.wait()
    try:
        for step in range(STEPS):
            op = rng.random()
            if op < 0.4 or not mine:
                rid = f"t{t}-{step}" if step % 2 else t * 1_000_000 + step
                prefix = np.arange(rng.choice([8, 16, 300]), dtype=np.int64)
                tokens = np.concatenate([prefix, rng.sample(range(100), 3)])
                try:
                    m.admit(rid, tokens, decode_slots=rng.randrange(4))
                    mine.append(rid)
                except OutOfBlocks:
                    pass
            elif op < 0.6:
                try:
                    m.append(rng.choice(mine), [rng.randrange(100)])
                except OutOfBlocks:
                    pass
            elif op < 0.7:
                # Every thread races on the same str id.
                try:
                    m.admit("shared", [1, 2, 3])
                except (ValueError, OutOfBlocks):
                    pass
                try:
                    m.free("shared")
                except KeyError:
                    pass
            elif op < 0.75:
                m.match_prefix(np.arange(300))
                m.stats()
            else:
                m.free(mine.pop(rng.randrange(len(mine))))
        for rid in mine:
            m.free(rid)
    except Exception as e:  # reported to the main thread
        errors.append(e)


def test_threads_share_one_manager():
    m = BlockManager(small_config(num_blocks=256, block_size=4))
    errors = []
    barrier = threading.Barrier(THREADS)
    threads = [threading.Thread(target=worker, args=(m, t, errors, barrier)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    m._check_invariants()
    try:
        m.free("shared")
    except KeyError:
        pass
    assert m.num_free_blocks == 256
    assert m.stats()["num_requests"] == 0
    m._check_invariants()
