"""The remote tier under vLLM's real scheduler: ``Scheduler`` (stock, and
with mla_cache's manager through ``--scheduler-cls``) with the
``OffloadingConnector`` and ``TieringOffloadingSpec`` from one
``kv_transfer_config``; a stand-in worker copies blocks between "GPU" bytes
and vLLM's CPU tier as vLLM's offloading worker does, and reports its jobs
through ``KVConnectorOutput``. One engine serves prompts and offloads them;
a second engine (a new CPU tier) gets them from the store, byte for byte,
with the same hits as from vLLM's ``fs`` tier."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
import tier_driver as d
from harness import Driver, make_request, make_scheduler
from redis_servers import servers
from test_remote_tier import fs_tier, mla_tier
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingWorkerMetadata,
)
from vllm.v1.outputs import KVConnectorOutput

BLOCK = 16
CHUNK = BLOCK * 1152  # one MLA layer ("layer") of 16 bf16 latents
ROW = -(-CHUNK // 4096) * 4096


def content(block_hash) -> bytes:
    """The KV the stand-in model computes for a block: drawn from its hash."""
    seed = int.from_bytes(bytes(block_hash)[:8], "little")
    return np.random.default_rng(seed).integers(0, 256, CHUNK, dtype=np.uint8).tobytes()


def offloading(tiers) -> KVTransferConfig:
    return KVTransferConfig(
        kv_connector="OffloadingConnector",
        kv_role="kv_both",
        kv_connector_extra_config={
            "spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": 64 * ROW,
            "secondary_tiers": [dict(t) for t in tiers],
        },
    )


class Worker:
    """vLLM's offloading worker, standing in: loads before the forward,
    the forward (each full block's KV from its hash), stores after it."""

    def __init__(self, scheduler) -> None:
        self.scheduler = scheduler
        self.manager = scheduler.connector.connector_scheduler.manager
        self.gpu: dict[int, bytes] = {}
        self.loaded_blocks = 0

    def _hash_of(self, req_id: str, block_id: int):
        request = self.scheduler.requests[req_id]
        table = self.scheduler.kv_cache_manager.get_block_ids(req_id)[0]
        return request.block_hashes[list(table).index(block_id)]

    def output(self, driver: Driver, out):
        meta = out.kv_connector_metadata
        rows = d.rows(self.manager)
        completed, recving = {}, set()
        for job_id, job in meta.load_jobs.items():
            for chunk, block in zip(job.src_spec.block_ids, job.dst_spec.block_ids):
                data = rows[chunk, :CHUNK].tobytes()
                assert data == content(self._hash_of(job.req_id, int(block))), "wrong KV loaded"
                self.gpu[int(block)] = data
                self.loaded_blocks += 1
            completed[job_id] = 1
            if not job.sync:
                recving.add(job.req_id)
        for req_id in out.num_scheduled_tokens:
            request = self.scheduler.requests.get(req_id)
            if request is None:
                continue
            table = self.scheduler.kv_cache_manager.get_block_ids(req_id)[0]
            full = min(request.num_computed_tokens // BLOCK, len(request.block_hashes))
            for i in range(full):
                self.gpu[int(table[i])] = content(request.block_hashes[i])
        for job_id, job in meta.store_jobs.items():
            for block, chunk in zip(job.src_spec.block_ids, job.dst_spec.block_ids):
                rows[chunk, :CHUNK] = np.frombuffer(self.gpu[int(block)], np.uint8)
            completed[job_id] = 1
        output = driver.model_output(out)
        output.kv_connector_output = KVConnectorOutput(
            finished_recving=recving,
            kv_connector_worker_meta=OffloadingWorkerMetadata(completed_jobs=completed),
        )
        return output


def serve(adapter: bool, tiers, prompts) -> tuple[dict[str, int], int]:
    """Serves ``prompts`` on a fresh engine; returns each request's hit
    tokens when first scheduled, and the blocks loaded from the CPU tier."""
    scheduler = make_scheduler(adapter, num_blocks=200, kv_transfer_config=offloading(tiers))
    driver, worker = Driver(scheduler), Worker(scheduler)
    manager = worker.manager
    connector = scheduler.connector.connector_scheduler
    hits: dict[str, int] = {}
    try:
        for i, prompt in enumerate(prompts):
            scheduler.add_request(make_request(f"r{i}", prompt, max_tokens=2))
        for _ in range(2000):
            if not (
                scheduler.has_unfinished_requests()
                or connector._jobs
                or manager.has_pending_work()
                or scheduler.finished_req_ids
            ):
                break
            out = driver.schedule()
            for r in out.scheduled_new_reqs:
                hits.setdefault(r.req_id, r.num_computed_tokens)
            driver.update(out, worker.output(driver, out))
        else:
            raise AssertionError("the engine did not settle")
        d.settle(manager)
    finally:
        manager.shutdown()
    return hits, worker.loaded_blocks


def prompts(seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    shared = rng.integers(100, 30000, 5 * BLOCK).tolist()
    return [shared + rng.integers(100, 30000, n).tolist() for n in (3 * BLOCK + 5, 2 * BLOCK + 1)]


@pytest.mark.parametrize("adapter", [False, True], ids=["vllm-manager", "mla_cache-manager"])
def test_a_second_engine_loads_what_the_first_offloaded_as_from_vllms_fs_tier(adapter, tmp_path):
    remote = servers()["single"]
    work = prompts(5)
    first, second = {}, {}
    for name, tiers in {
        "fs": [fs_tier(tmp_path)],
        "mla": [mla_tier(remote, f"ns-{uuid.uuid4().hex}")],
    }.items():
        first[name] = serve(adapter, tiers, work)
        second[name] = serve(adapter, tiers, work)
    assert first["mla"] == first["fs"] and first["mla"][0]["r0"] == 0
    # The second engine's CPU tier starts empty: every full block of both
    # prompts (8 and 7; the shared 5 loaded once) comes from the tier below
    # it, verified byte for byte by the worker, as from vLLM's fs tier.
    assert second["mla"] == second["fs"] == ({"r0": 8 * BLOCK, "r1": 7 * BLOCK}, 10)
