"""mla_cache's scheduler classes reach vLLM the way a user names them
(``--scheduler-cls``), and refuse what they cannot serve at start-up."""

from __future__ import annotations

import pytest
import vllm
from vllm.config import KVTransferConfig
from vllm.engine.arg_utils import EngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched import scheduler as scheduler_module
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec
from vllm.v1.structured_output import StructuredOutputManager

import mla_cache.vllm as ours
from mla_cache import vllm_scheduler
from harness import Driver, make_request, make_scheduler, mla_spec, model_dir

BS = 16


def engine_config(*flags: str):
    """The ``VllmConfig`` vLLM's command line makes of ``flags``."""
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(
        ["--model", model_dir(), "--skip-tokenizer-init", "--max-model-len", "4096",
         "--block-size", str(BS), "--enable-prefix-caching", *flags]
    )
    return EngineArgs.from_cli_args(args).create_engine_config()


def build_as_engine_core(vllm_config, num_blocks: int = 500):
    """The scheduler ``EngineCore`` builds: the configured class, given the
    KV cache config and EngineCore's keywords."""
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], mla_spec(BS))],
    )
    vllm_config.cache_config.num_gpu_blocks = num_blocks
    block_size, hash_block_size = resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)
    cls = vllm_config.scheduler_config.get_scheduler_cls()
    return cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        include_finished_set=False,
        log_stats=True,
        block_size=block_size,
        hash_block_size=hash_block_size,
    )


@pytest.mark.parametrize("name", ["MlaAsyncScheduler", "MlaScheduler"])
def test_engine_core_builds_the_class_named_on_the_command_line(name):
    config = engine_config("--scheduler-cls", f"mla_cache.vllm_scheduler.{name}")
    scheduler = build_as_engine_core(config)
    assert type(scheduler) is getattr(vllm_scheduler, name)
    assert isinstance(scheduler, AsyncScheduler) == (name == "MlaAsyncScheduler")
    km = scheduler.kv_cache_manager
    assert isinstance(km, ours.KVCacheManager)
    assert km.block_pool.get_num_free_blocks() == 499
    # vLLM's own name is vLLM's manager again once ours is built.
    assert scheduler_module.KVCacheManager is not ours.KVCacheManager
    prompt = list(range(3, 3 + 4 * BS))
    d = Driver(scheduler)
    d.run({0: [make_request("a", prompt, max_tokens=4)], 1: [make_request("b", prompt + [1], max_tokens=4)]})
    hits = {r: h for rec in d.records for r, h in rec.new_hits.items()}
    assert hits == {"a": 0, "b": 4 * BS}


def test_a_stock_scheduler_built_after_ours_gets_vllms_manager():
    ours_first = make_scheduler(True)
    stock = make_scheduler(False)
    assert isinstance(ours_first.kv_cache_manager, ours.KVCacheManager)
    assert not isinstance(stock.kv_cache_manager, ours.KVCacheManager)


def test_an_untested_vllm_version_is_refused_naming_the_tested_ones():
    vllm_scheduler.check_vllm_version(vllm.__version__)
    for version in ("0.32.1", "0.35.0", "1.0.0"):
        with pytest.raises(vllm_scheduler.UnsupportedVllm, match=r"0\.33\.\*, 0\.34\.\*"):
            vllm_scheduler.check_vllm_version(version)


def test_an_untested_vllm_version_fails_at_start_up(monkeypatch):
    monkeypatch.setattr(vllm_scheduler.vllm, "__version__", "0.35.0")
    with pytest.raises(vllm_scheduler.UnsupportedVllm, match="this is vLLM 0.35.0"):
        make_scheduler(True)


def test_a_layout_mla_does_not_have_fails_at_start_up_naming_it():
    from vllm.v1.kv_cache_interface import FullAttentionSpec
    import torch

    config = engine_config("--scheduler-cls", "mla_cache.vllm_scheduler.MlaScheduler")
    kv_cache_config = KVCacheConfig(
        num_blocks=100, kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], FullAttentionSpec(
            block_size=BS, num_kv_heads=8, head_size=64, dtype=torch.bfloat16))],
    )
    config.cache_config.num_gpu_blocks = 100
    with pytest.raises(ours.UnsupportedLayout, match="FullAttentionSpec with 8 KV heads"):
        vllm_scheduler.MlaScheduler(
            vllm_config=config, kv_cache_config=kv_cache_config,
            structured_output_manager=StructuredOutputManager(config),
            log_stats=False, block_size=BS,
        )


def test_a_connector_that_manages_vllms_own_pool_is_refused(tmp_path):
    config = engine_config("--scheduler-cls", "mla_cache.vllm_scheduler.MlaScheduler")
    config.kv_transfer_config = KVTransferConfig(kv_connector="SimpleCPUOffloadConnector", kv_role="kv_both")
    with pytest.raises(vllm_scheduler.UnsupportedVllm, match="SimpleCPUOffloadConnector"):
        build_as_engine_core(config)
