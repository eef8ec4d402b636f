"""mla_cache's shared remote tier (Valkey/Redis) as a secondary offload
tier of unmodified vLLM (0.33 and 0.34), under vLLM's own CPU tier::

    vllm serve deepseek-ai/DeepSeek-V3 --kv-transfer-config '{
      "kv_connector": "OffloadingConnector", "kv_role": "kv_both",
      "kv_connector_extra_config": {
        "spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 68719476736,
        "secondary_tiers": [{"type": "MlaRemoteTier",
                             "module_path": "mla_cache.vllm_tier",
                             "remote": "redis://valkey:6379/",
                             "namespace": "deepseek-v3-0324"}]}}'

vLLM copies blocks between the GPU and its CPU tier; this tier copies CPU
chunks to and from the remote store. Everything that touches the store
(keys, values with their header and checksum, batching, the worker
thread, the bounded queue, counters) is mla_cache's Rust remote tier
(:class:`mla_cache.ChunkTransfers`); this class maps vLLM's calls to it.

MLA: an MLA block's latent is the same on every tensor-parallel rank, and
vLLM keeps one copy of it in its CPU tier (its replicated layout), so the
tier, which runs once per engine in the scheduler process, writes each
block once, under a key without a rank; every engine with the same model,
weights, format and block geometry reads it. Layouts that keep a copy per
rank, and chunks that are not MLA latents, are refused at start-up.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, ClassVar

from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
)
from vllm.v1.kv_offload.file_mapper import FileMapper
from vllm.v1.kv_offload.tiering.async_lookup import AsyncLookupManager
from vllm.v1.kv_offload.tiering.base import (
    JobResult,
    SecondaryTierManager,
    TransferJob,
)

from ._native import ChunkTransfers

__all__ = ["MlaRemoteTier"]


class _Probes(AsyncLookupManager):
    """vLLM's per-step batched existence checks, each request's keys in one
    round trip to the store (``ChunkTransfers.probe``, within the lookup
    budget; past it, or on a failure, the keys are misses)."""

    def __init__(self, chunks: ChunkTransfers, tier_type: str) -> None:
        self._chunks = chunks
        super().__init__(tier_type=tier_type)

    def batch_lookup(self, keys: list[OffloadKey], req_context: ReqContext) -> Iterable[bool]:
        found = self._chunks.probe(keys)
        return found if found is not None else [False] * len(keys)


class MlaRemoteTier(SecondaryTierManager):
    """A vLLM secondary tier on mla_cache's remote tier.

    Tier settings (beside ``type`` and ``module_path``): ``remote``, a
    Valkey/Redis URL (``redis://host:port/``, ``rediss://`` for TLS,
    ``redis://user:password@host:port/``) or ``cluster:url,url,...``;
    ``namespace``, naming the model and weights (engines share blocks only
    under the same one; vLLM's model name, KV dtype, block geometry and
    layout are added to it); ``lookup_budget_ms`` (20), the longest a
    request's existence check may take before its blocks count as misses;
    ``queue_depth`` (64), jobs queued for the store at most, beyond which a
    job fails at once; ``enable_kv_events`` (false), report stored blocks
    as KV events (with vLLM's ``kv_events_config`` on); ``locality``
    (``"REMOTE"``), the events' locality.
    """

    # The store keeps blocks in its servers' memory.
    medium: ClassVar[Medium] = Medium.CPU

    def __init__(
        self,
        offloading_spec: Any,
        primary_kv_view: memoryview,
        tier_type: str,
        remote: str,
        namespace: str,
        lookup_budget_ms: float = 20.0,
        queue_depth: int = 64,
        enable_kv_events: bool = False,
        locality: str | None = "REMOTE",
        backpressure_detector: Any = None,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        config = offloading_spec.config
        if config.parallel.world_size > 1 and not config.replicated_layout:
            raise ValueError(
                "MlaRemoteTier stores one copy of each block, but vLLM keeps a copy per "
                "rank here: it needs vLLM's replicated MLA layout (an MLA model, "
                "tensor parallelism only, the mp executor, one node)"
            )
        if len(config.groups) != 1:
            raise ValueError(
                f"MlaRemoteTier needs one KV cache group (an MLA model), got {len(config.groups)}"
            )
        group = config.groups[0]
        blocks_per_chunk = config.cache.blocks_per_chunk
        # vLLM's own identity of a deployment's stored blocks (the fs tier's
        # directory name): model, KV dtype, block geometry, layout.
        identity = FileMapper.from_offloading_spec(
            root_dir="",
            offloading_spec=offloading_spec,
            blocks_per_file=blocks_per_chunk,
            parallel_agnostic=True,
        ).get_run_config()
        try:
            self._chunks = ChunkTransfers(
                remote,
                primary_kv_view,
                chunk_bytes=config.worker_kv_bytes_per_block * blocks_per_chunk,
                dtype=config.model.dtype,
                num_layers=len(group.layer_names),
                tokens_per_chunk=group.tokens_per_block * blocks_per_chunk,
                namespace=namespace + "\0" + json.dumps(identity, sort_keys=True),
                lookup_budget_ms=lookup_budget_ms,
                queue_depth=queue_depth,
                name=tier_type,
            )
        except ValueError as e:
            raise ValueError(f"MlaRemoteTier: {e}") from e
        self.locality = Locality(locality) if locality is not None else None
        self._probes = _Probes(self._chunks, tier_type)
        self._jobs: dict[int, TransferJob] = {}
        self._events: list[OffloadingEvent] | None = (
            [] if enable_kv_events and offloading_spec.kv_events_config.enable_kv_cache_events else None
        )

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        found = self._probes.lookup(key, req_context)
        if found is None:
            return LookupResult.RETRY
        return LookupResult.HIT if found else LookupResult.MISS

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        self._probes.flush()

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._probes.cleanup(req_context.req_id)

    def submit_store(self, job_metadata: TransferJob) -> None:
        self._jobs[job_metadata.job_id] = job_metadata
        self._chunks.submit_store(job_metadata.job_id, list(job_metadata.keys), job_metadata.chunk_ids)

    def submit_load(self, job_metadata: TransferJob) -> None:
        self._jobs[job_metadata.job_id] = job_metadata
        self._chunks.submit_load(job_metadata.job_id, list(job_metadata.keys), job_metadata.chunk_ids)

    def get_finished_jobs(self) -> Iterable[JobResult]:
        results = []
        for job_id, is_load, done, total, nbytes, seconds in self._chunks.take_finished():
            job = self._jobs.pop(job_id)
            keys = list(job.keys)
            if is_load and done < total:
                # The leading chunks are loaded; the rest are misses from now on.
                self._probes.mark_miss(keys[done:])
                results.append(
                    JobResult(
                        job_id=job_id,
                        success=False,
                        successful_keys=tuple(keys[:done]) or None,
                        transfer_time=seconds,
                        transfer_bytes=nbytes,
                    )
                )
                continue
            if not is_load and done == total:
                if hasattr(self._probes, "mark_present"):  # vLLM 0.34
                    self._probes.mark_present(keys)
                if self._events is not None and keys:
                    self._events.append(
                        OffloadingEvent(
                            keys=keys, medium=self.medium, removed=False, locality=self.locality
                        )
                    )
            results.append(
                JobResult(
                    job_id=job_id,
                    success=done == total,
                    transfer_time=seconds,
                    transfer_bytes=nbytes,
                )
            )
        return results

    def has_pending_work(self) -> bool:
        return self._chunks.in_flight > 0

    def take_events(self) -> Iterable[OffloadingEvent]:
        if self._events:
            events, self._events = self._events, []
            yield from events

    def drain_jobs(self) -> None:
        # Every job ends within the server timeouts; none is cut short.
        while not self._chunks.wait_idle(1.0):
            pass

    def stats(self) -> dict[str, int]:
        """The remote tier's counters (``ChunkTransfers.stats``)."""
        return self._chunks.stats()

    def shutdown(self) -> None:
        self._probes.shutdown()
        self._chunks.close()
