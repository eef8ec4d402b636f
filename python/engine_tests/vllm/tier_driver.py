"""Drives vLLM's own ``TieringOffloadingManager`` (built by vLLM's
``TieringOffloadingSpec``, as the ``OffloadingConnector`` builds it) as the
connector drives it: stores put chunks in the CPU tier (standing in for the
worker's GPU-to-CPU copy) and complete them, which cascades them to the
secondary tiers; loads look a request's chunks up step by step until they
resolve, then read the promoted chunks out of the CPU tier.

Chunks are laid out as vLLM lays out an MLA model's CPU tier: one row per
chunk (rows page-aligned), ``layers x tokens`` latents of 576 values in
bf16 or fp8_ds_mla bytes each.

Run as a script, it is a second engine process storing chunks:
``python tier_driver.py TIERS_JSON ENGINE_ID DTYPE SEED N``.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Sequence

import numpy as np
from vllm.v1.kv_offload.base import (
    LookupResult,
    ReqContext,
    ScheduleEndContext,
    make_offload_key,
)
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

LAYERS = 3
TOKENS = 16
# Bytes of one token's latent in one layer.
TOKEN_BYTES = {"bfloat16": 576 * 2, "fp8_ds_mla": 656}
ROWS = 24


def chunk_bytes(dtype: str, token_bytes: int | None = None) -> int:
    return LAYERS * TOKENS * (token_bytes or TOKEN_BYTES[dtype])


def make_manager(
    tiers: list[dict[str, Any]],
    engine_id: str,
    dtype: str = "bfloat16",
    model: str = "deepseek-ai/DeepSeek-V2-Lite",
    events: bool = False,
    token_bytes: int | None = None,
    world_size: int = 1,
):
    """vLLM's tiering manager with a CPU tier of ``ROWS`` chunks and ``tiers``
    (``token_bytes``: a token's bytes in one layer, by default an MLA
    latent's in ``dtype``)."""
    row = -(-chunk_bytes(dtype, token_bytes) // 4096) * 4096
    config = OffloadingConfig(
        groups=(
            OffloadingGroupConfig(
                TOKENS, tuple(f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)), 0
            ),
        ),
        worker_kv_bytes_per_block=chunk_bytes(dtype, token_bytes),
        enable_kv_cache_events=events,
        extra_config={
            "spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": ROWS * row,
            "secondary_tiers": [dict(t) for t in tiers],
        },
        engine_id=engine_id,
        model=OffloadingModelConfig(name=model, dtype=dtype, max_model_len=4096),
        cache=OffloadingCacheConfig(tokens_per_hash=TOKENS, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0,
            world_size=world_size,
            tp_size=world_size,
            pp_size=1,
            pcp_size=1,
            dcp_size=1,
            data_parallel_index=0,
            data_parallel_size=1,
            data_parallel_rank_local=None,
            is_parallelism_agnostic=False,
        ),
    )
    return TieringOffloadingSpec(config).get_manager()


def keys(seed: int, n: int) -> list[bytes]:
    """A chain of ``n`` offload keys (32-byte hashes, group 0)."""
    return [make_offload_key(bytes([seed % 256, i % 256]) * 16, 0) for i in range(n)]


def payload(key: bytes, dtype: str) -> bytes:
    """The chunk of ``key``: bytes drawn from it."""
    rng = np.random.default_rng(int.from_bytes(key[:8], "little"))
    return rng.integers(0, 256, chunk_bytes(dtype), dtype=np.uint8).tobytes()


def rows(manager) -> np.ndarray:
    view = manager.primary_tier.get_kv_memoryview()
    return np.frombuffer(view, dtype=np.uint8).reshape(view.shape)


def end_step(manager, ctx: ReqContext | None = None) -> None:
    new = [ctx.req_id] if ctx is not None else []
    manager.on_schedule_end(ScheduleEndContext(new_req_ids=new, preempted_req_ids=[]))


def settle(manager, timeout: float = 20.0) -> None:
    """Steps until no tier has work pending (cascades and promotions done)."""
    deadline = time.monotonic() + timeout
    while manager.has_pending_work():
        assert time.monotonic() < deadline, "the tiers did not settle"
        end_step(manager)
        time.sleep(0.002)
    end_step(manager)


def store(manager, req_id: str, chunk_keys: Sequence[bytes], dtype: str) -> None:
    """Puts the chunks into the CPU tier as the worker would, completes the
    store (cascading them down) and waits for the tiers."""
    ctx = ReqContext(req_id=req_id)
    manager.on_new_request(ctx)
    out = manager.prepare_store(list(chunk_keys), ctx)
    assert out is not None, "the CPU tier has no room"
    table = rows(manager)
    for key, chunk in zip(out.keys_to_store, out.store_spec.block_ids):
        table[chunk, : chunk_bytes(dtype)] = np.frombuffer(payload(key, dtype), np.uint8)
    manager.complete_store(out.keys_to_store, ctx)
    end_step(manager, ctx)
    settle(manager)
    manager.on_request_finished(ctx)
    settle(manager)


def lookup(manager, req_id: str, chunk_keys: Sequence[bytes], timeout: float = 20.0):
    """Looks the chain up as the connector does (the longest prefix, retried
    each step while a tier answers RETRY or a promotion is pending). Returns
    the request context, the hit count and every step's answers."""
    ctx = ReqContext(req_id=req_id)
    manager.on_new_request(ctx)
    rounds: list[list[str]] = []
    deadline = time.monotonic() + timeout
    while True:
        answers = []
        for key in chunk_keys:
            result = manager.lookup(key, ctx)
            answers.append(result.name)
            if result is not LookupResult.HIT:
                break
        rounds.append(answers)
        last = answers[-1]
        if last == "MISS" or (last == "HIT" and len(answers) == len(chunk_keys)):
            hits = len(answers) - (last == "MISS")
            return ctx, hits, rounds
        assert time.monotonic() < deadline, f"lookups did not resolve: {rounds[-3:]}"
        end_step(manager, ctx)
        time.sleep(0.002)


def load(manager, req_id: str, chunk_keys: Sequence[bytes], dtype: str):
    """The chain's hit count and its hit chunks' bytes, read out of the CPU
    tier as the worker would copy them to the GPU."""
    ctx, hits, _ = lookup(manager, req_id, chunk_keys)
    got = []
    if hits:
        spec = manager.prepare_load(list(chunk_keys[:hits]), ctx)
        table = rows(manager)
        got = [table[c, : chunk_bytes(dtype)].tobytes() for c in spec.block_ids]
        manager.complete_load(list(chunk_keys[:hits]), ctx)
    manager.on_request_finished(ctx)
    settle(manager)
    return hits, got


if __name__ == "__main__":
    tiers_json, engine_id, dtype, seed, n = sys.argv[1:]
    m = make_manager(json.loads(tiers_json), engine_id, dtype)
    store(m, "writer", keys(int(seed), int(n)), dtype)
    m.shutdown()
    print("stored")
