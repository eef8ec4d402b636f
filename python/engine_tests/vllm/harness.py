"""Builds vLLM's real ``Scheduler`` (0.33 or 0.34, whichever is installed) on
the CPU, with vLLM's own KV cache manager or with
``mla_cache.vllm.KVCacheManager``, and drives it step by step with a
deterministic stand-in for the model runner.

The adapter goes in as a user puts it in: the scheduler class is
``mla_cache.vllm_scheduler``'s (``--scheduler-cls``); nothing of vLLM
changes. The model is a tiny config written to a temporary folder (no
download, no tokenizer); its KV cache is one ``MLAAttentionSpec`` group
(DeepSeek's 576-element latent). ``cpu_platform`` (imported first) makes
vLLM 0.34's CPU platform build configs on this machine.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import cpu_platform  # noqa: F401  (before vLLM's configs are built)
import torch
from vllm.config import (
    CacheConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    VllmConfig,
)
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, MLAAttentionSpec
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

import mla_cache.vllm as ours
from mla_cache.vllm_scheduler import MlaAsyncScheduler, MlaScheduler

EOS = 2
"""The tiny model's end-of-sequence token (never sampled: runs end on max_tokens)."""
VOCAB = 1000

_MODEL = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 1,
    "num_attention_heads": 1,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "vocab_size": VOCAB,
    "max_position_embeddings": 1 << 18,
    "torch_dtype": "bfloat16",
    "eos_token_id": EOS,
}
"""A tiny decoder. Not an MLA model config on purpose: vLLM's CPU platform
turns prefix caching and chunked prefill off for MLA models (no CPU MLA
kernel); the scheduler only sees the KV cache group, which is MLA's."""

_model_dir: Optional[str] = None


def model_dir() -> str:
    """A folder holding the tiny model's ``config.json`` (made once)."""
    global _model_dir
    if _model_dir is None:
        _model_dir = tempfile.mkdtemp(prefix="mla-cache-model-")
        Path(_model_dir, "config.json").write_text(json.dumps(_MODEL))
    return _model_dir


def mla_spec(block_size: int) -> MLAAttentionSpec:
    """DeepSeek's latent cache spec: one head of 576 elements."""
    return MLAAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=576, dtype=torch.bfloat16
    )


def scheduler_class(adapter: bool, async_scheduling: bool) -> type:
    """vLLM's scheduler class, or mla_cache's (``--scheduler-cls``)."""
    if adapter:
        return MlaAsyncScheduler if async_scheduling else MlaScheduler
    return AsyncScheduler if async_scheduling else Scheduler


def make_scheduler(
    adapter: bool,
    *,
    num_blocks: int = 1000,
    block_size: int = 16,
    max_num_seqs: int = 16,
    max_num_batched_tokens: int = 1024,
    max_model_len: int = 4096,
    enable_prefix_caching: bool = True,
    async_scheduling: bool = False,
    num_speculative_tokens: Optional[int] = None,
    policy: str = "fcfs",
    kv_cache_spec=None,
    enable_chunked_prefill: bool = True,
    connector_storage: Optional[str] = None,
    async_loads: bool = False,
    watermark: float = 0.0,
    kv_transfer_config: Optional[KVTransferConfig] = None,
    **scheduler_extra: Any,
) -> Scheduler:
    """vLLM's scheduler (``AsyncScheduler`` with ``async_scheduling``) with
    the stock manager or the adapter; with ``connector_storage``, vLLM's
    bundled ``ExampleConnector`` (a KV consumer and producer) over that
    folder, its loads asynchronous with ``async_loads``
    (``async_connector.AsyncLoadConnector``), or any ``kv_transfer_config``;
    ``watermark``: the fraction of blocks kept free when admitting
    waiting or preempted requests; ``scheduler_extra``: more
    ``SchedulerConfig`` fields (those of one vLLM version)."""
    model_config = ModelConfig(
        model=model_dir(),
        dtype="bfloat16",
        seed=0,
        max_model_len=max_model_len,
        skip_tokenizer_init=True,
    )
    scheduler_config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        enable_chunked_prefill=enable_chunked_prefill,
        async_scheduling=async_scheduling,
        is_encoder_decoder=False,
        watermark=watermark,
        policy=policy,
        **scheduler_extra,
    )
    cache_config = CacheConfig(
        block_size=block_size,
        gpu_memory_utilization=0.9,
        cache_dtype="auto",
        enable_prefix_caching=enable_prefix_caching,
    )
    speculative_config = None
    if num_speculative_tokens is not None:
        speculative_config = SpeculativeConfig(
            model="ngram", num_speculative_tokens=num_speculative_tokens
        )
    if connector_storage is not None:
        kv_transfer_config = KVTransferConfig(
            kv_connector="AsyncLoadConnector" if async_loads else "ExampleConnector",
            kv_connector_module_path="async_connector" if async_loads else None,
            kv_role="kv_both",
            kv_connector_extra_config={"shared_storage_path": connector_storage},
            kv_load_failure_policy="recompute",
        )
    vllm_config = VllmConfig(
        scheduler_config=scheduler_config,
        model_config=model_config,
        cache_config=cache_config,
        speculative_config=speculative_config,
        kv_transfer_config=kv_transfer_config,
    )
    # vLLM's CPU platform turns async scheduling off (its model runner does
    # not overlap steps); the scheduler side runs it as on a GPU.
    vllm_config.scheduler_config.async_scheduling = async_scheduling
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(["layer"], kv_cache_spec or mla_spec(block_size))
        ],
    )
    cache_config.num_gpu_blocks = num_blocks
    register_all_kvcache_specs(vllm_config)
    return scheduler_class(adapter, async_scheduling)(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        block_size=block_size,
        log_stats=True,
        structured_output_manager=StructuredOutputManager(vllm_config),
    )


_INDEXED_OUTPUTS = "req_id_to_index" in ModelRunnerOutput.__dataclass_fields__
"""vLLM 0.33's model output carries each request's row (0.34 uses ``req_ids``'s order)."""

_hash_ready = False


def make_request(
    request_id: str,
    prompt: Sequence[int],
    *,
    max_tokens: int = 8,
    block_size: int = 16,
    priority: int = 0,
    arrival_time: float = 0.0,
    prompt_logprobs: Optional[int] = None,
    sampling: Optional[Dict[str, Any]] = None,
    **extra: Any,
) -> Request:
    """A vLLM ``Request`` with vLLM's own block hasher (as the engine builds it);
    ``sampling``: more ``SamplingParams`` keywords; ``extra``: more
    ``Request`` keywords (``lora_request``, ``cache_salt``, ``mm_features``)."""
    global _hash_ready
    if not _hash_ready:
        init_none_hash(sha256)
        _hash_ready = True
    params = SamplingParams(
        ignore_eos=True, max_tokens=max_tokens, prompt_logprobs=prompt_logprobs, **(sampling or {})
    )
    params.update_from_generation_config({}, EOS)
    return Request(
        request_id=request_id,
        prompt_token_ids=list(prompt),
        sampling_params=params,
        pooling_params=None,
        block_hasher=get_request_block_hasher(block_size, sha256),
        priority=priority,
        arrival_time=arrival_time,
        **extra,
    )


def next_token(request_id: str, position: int) -> int:
    """The stand-in model's token at ``position`` of a request."""
    return 3 + (hash((request_id, position)) & 0xFFFF) % (VOCAB - 3)


@dataclass
class StepRecord:
    """What one step decided, manager-independent."""

    scheduled: Dict[str, int]
    """Tokens scheduled per request."""
    spec: Dict[str, int]
    """Draft tokens scheduled for verification per request."""
    new_hits: Dict[str, int]
    """Computed tokens (prefix hit) of each newly scheduled request."""
    preempted: List[str]
    """Requests preempted in the step."""
    finished: List[str]
    """Requests finished by the step's output."""
    free_blocks: int
    """Free blocks after the step (vLLM's count: null block excluded)."""
    prefix_stats: Tuple[int, int, int, int, int, int] = ()
    """The step's prefix cache stats: requests, queries, hits, and the same
    for preempted requests."""


@dataclass
class Driver:
    """Runs a scheduler step by step; the model accepts drafts by a fixed rule."""

    scheduler: Scheduler
    num_spec: int = 0
    """Draft tokens proposed per decode step (spec decode)."""
    records: List[StepRecord] = field(default_factory=list)
    block_ids: Dict[str, Tuple[int, ...]] = field(default_factory=dict)
    """Each scheduled request's block table after its latest step."""

    def schedule(self):
        """One ``schedule()``; records its decisions (but not the output)."""
        out = self.scheduler.schedule()
        km = self.scheduler.kv_cache_manager
        for rid in out.num_scheduled_tokens:
            self.block_ids[rid] = tuple(km.get_block_ids(rid)[0])
        self.records.append(
            StepRecord(
                scheduled=dict(out.num_scheduled_tokens),
                spec={r: len(t) for r, t in out.scheduled_spec_decode_tokens.items()},
                new_hits={r.req_id: r.num_computed_tokens for r in out.scheduled_new_reqs},
                preempted=sorted(out.preempted_req_ids or ()),
                finished=[],
                free_blocks=km.block_pool.get_num_free_blocks(),
            )
        )
        return out

    def model_output(self, out) -> ModelRunnerOutput:
        """The stand-in model's output for a step: one token per request whose
        prompt is done, plus accepted drafts (request ``r`` at step ``s``
        accepts ``(s + len(r)) % (drafts + 1)`` of them)."""
        req_ids = list(out.num_scheduled_tokens)
        sampled: List[List[int]] = []
        step = len(self.records)
        for rid in req_ids:
            request = self.scheduler.requests.get(rid)
            if request is None:  # finished while the step was in flight
                sampled.append([])
                continue
            drafts = out.scheduled_spec_decode_tokens.get(rid, [])
            done = request.num_computed_tokens >= request.num_tokens - len(drafts)
            if not done:
                sampled.append([])
                continue
            accepted = (step + len(rid)) % (len(drafts) + 1)
            pos = request.num_tokens - len(drafts)
            toks = list(drafts[:accepted])
            toks.append(next_token(rid, pos + accepted))
            sampled.append(toks)
        fields = {
            "req_ids": req_ids,
            "sampled_token_ids": sampled,
            "logprobs": None,
            "prompt_logprobs_dict": {},
            "pooler_output": [],
        }
        if _INDEXED_OUTPUTS:
            fields["req_id_to_index"] = {r: i for i, r in enumerate(req_ids)}
        return ModelRunnerOutput(**fields)

    def update(self, out, model_output: Optional[ModelRunnerOutput] = None) -> None:
        """Feeds a step's output back; proposes drafts for the next step."""
        if model_output is None:
            model_output = self.model_output(out)
        outputs = self.scheduler.update_from_output(out, model_output)
        finished: List[str] = []
        for eco in outputs.values():
            for o in eco.outputs:
                if o.finish_reason is not None:
                    finished.append(o.request_id)
            st = eco.scheduler_stats
            if st is not None and st.prefix_cache_stats is not None:
                p = st.prefix_cache_stats
                self.records[-1].prefix_stats = (
                    p.requests, p.queries, p.hits,
                    p.preempted_requests, p.preempted_queries, p.preempted_hits,
                )
        self.records[-1].finished.extend(sorted(finished))
        if self.num_spec:
            ids, drafts = [], []
            for request in self.scheduler.running:
                if request.num_computed_tokens >= request.num_tokens - 1:
                    ids.append(request.request_id)
                    drafts.append(
                        [next_token(request.request_id, request.num_tokens + i) for i in range(self.num_spec)]
                    )
            if ids:
                self.scheduler.update_draft_token_ids(DraftTokenIds(ids, drafts))

    def step(self) -> None:
        """``schedule()`` then ``update_from_output()``."""
        out = self.schedule()
        self.update(out)

    def run(self, arrivals: Dict[int, List[Request]], max_steps: int = 500) -> None:
        """Steps until every request finished, adding ``arrivals[s]`` before
        step ``s``."""
        for s in range(max_steps):
            for r in arrivals.get(s, ()):
                self.scheduler.add_request(r)
            if s > max(arrivals, default=0) and not self.scheduler.has_unfinished_requests():
                return
            self.step()
        raise AssertionError("requests did not finish")


def decisions(records: Sequence[StepRecord]) -> list:
    """The records as plain tuples (what both managers must agree on)."""
    return [
        (r.scheduled, r.spec, r.new_hits, r.preempted, r.finished, r.free_blocks, r.prefix_stats)
        for r in records
    ]


__all__ = [
    "Driver",
    "RequestStatus",
    "decisions",
    "make_request",
    "make_scheduler",
    "scheduler_class",
    "mla_spec",
    "next_token",
]
