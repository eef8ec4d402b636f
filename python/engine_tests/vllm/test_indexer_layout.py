"""mla_cache's indexer key cache against vLLM's own writer, run on the CPU by
Triton's interpreter (see indexer_writer_cpu.py, which needs a fresh process:
the interpreter and the device visibility are read when vLLM is imported)."""

import os
import subprocess
import sys
from pathlib import Path


def test_vllm_writes_the_indexer_keys_as_mla_cache_does():
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    script = Path(__file__).with_name("indexer_writer_cpu.py")
    run = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-4000:]
    assert "layout, scales and exact codes identical" in run.stdout
