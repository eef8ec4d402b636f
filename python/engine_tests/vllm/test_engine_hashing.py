"""Engine-compatible block hashes, checked against vLLM 0.33 itself.

Runs in the vLLM venv (``scripts/engine-tests.sh vllm-0.34 -k engine_hashing``).
For random prompts with LoRA, cache salt and multimodal inputs, the hashes
``BlockManager.block_hashes`` returns, and those its ``BlockStored`` events
carry, equal vLLM's ``hash_block_tokens`` chain (its ``NONE_HASH`` from
``PYTHONHASHSEED``, its extra keys from ``generate_block_hash_extra_keys``)
converted to 64 bits as vLLM publishes them (``maybe_convert_block_hash``).
"""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import List, Optional, Tuple

import pytest
from vllm.utils.hashing import sha256_cbor, xxhash_cbor
from vllm.v1.core import kv_cache_utils

import mla_cache

BLOCK = 16
FUNCTIONS = {"sha256_cbor": sha256_cbor, "xxhash_cbor": xxhash_cbor}

Image = Tuple[str, int, int]  # (identifier, offset, length)


def vllm_hashes(
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
    seed: int,
    tokens: List[int],
    lora: Optional[Tuple[str, str]],
    salt: Optional[str],
    images: List[Image],
) -> List[int]:
    """The 64-bit hashes vLLM publishes for the prompt's full blocks."""
    monkeypatch.setenv("PYTHONHASHSEED", str(seed))
    fn = FUNCTIONS[kind]
    kv_cache_utils.init_none_hash(fn)
    # The request fields vLLM's extra-key generator reads.
    request = SimpleNamespace(
        mm_features=[
            SimpleNamespace(identifier=h, mm_position=SimpleNamespace(offset=o, length=n))
            for h, o, n in images
        ],
        lora_request=(
            SimpleNamespace(lora_name=lora[0], lora_path=lora[1]) if lora else None
        ),
        cache_salt=salt,
        prompt_embeds=None,
    )
    out: List[int] = []
    parent = None
    mm_index = 0
    for start in range(0, len(tokens) - BLOCK + 1, BLOCK):
        extra, mm_index = kv_cache_utils.generate_block_hash_extra_keys(
            request, start, start + BLOCK, mm_index
        )
        parent = kv_cache_utils.hash_block_tokens(
            fn, parent, tokens[start : start + BLOCK], extra
        )
        out.append(kv_cache_utils.maybe_convert_block_hash(parent))
    return out


def random_request(rng: random.Random):
    tokens = [rng.randrange(0, 1 << 32) if rng.random() < 0.05 else rng.randrange(0, 150_000)
              for _ in range(rng.randrange(1, 12 * BLOCK))]
    lora = (f"lora-{rng.randrange(3)}", f"/adapters/{rng.randrange(3)}") if rng.random() < 0.5 else None
    salt = rng.choice([None, "", "tenant-a", "tenant-b"])
    images: List[Image] = []
    offset = rng.randrange(0, 2 * BLOCK)
    while rng.random() < 0.6 and offset < len(tokens):
        # Placeholders lie inside the prompt, as in vLLM's requests.
        length = rng.randrange(1, min(3 * BLOCK, len(tokens) - offset) + 1)
        images.append((f"img{rng.randrange(1000):03x}", offset, length))
        offset += length + rng.randrange(0, BLOCK)
    return tokens, lora, salt, images


@pytest.mark.parametrize("kind", sorted(FUNCTIONS))
def test_hashes_and_events_equal_vllms(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    rng = random.Random(kind)
    for case in range(60):
        seed = rng.randrange(0, 1 << 32)
        tokens, lora, salt, images = random_request(rng)
        expected = vllm_hashes(monkeypatch, kind, seed, tokens, lora, salt, images)
        manager = mla_cache.BlockManager(
            mla_cache.CacheConfig(
                64, block_size=BLOCK, block_hash=kind, hash_seed=seed, enable_events=True
            )
        )
        keys = mla_cache.ExtraKeys(
            adapter=lora[0] if lora else None,
            adapter_path=lora[1] if lora else None,
            salt=salt,
            mm=images,
        )
        assert manager.block_hashes(tokens, extra_keys=keys) == expected, case
        manager.admit(1, tokens, extra_keys=keys)
        stored = [
            h
            for e in manager.take_events()
            if isinstance(e, mla_cache.BlockStored)
            for h in e.block_hashes
        ]
        assert stored == expected, case


def test_the_default_seed_is_vllms(monkeypatch: pytest.MonkeyPatch) -> None:
    # Without PYTHONHASHSEED, vLLM seeds sha256_cbor's NONE_HASH with a fixed
    # string; a manager without hash_seed agrees.
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    kv_cache_utils.init_none_hash(sha256_cbor)
    tokens = list(range(3 * BLOCK))
    parent = None
    expected = []
    for start in range(0, len(tokens), BLOCK):
        parent = kv_cache_utils.hash_block_tokens(
            sha256_cbor, parent, tokens[start : start + BLOCK], None
        )
        expected.append(kv_cache_utils.maybe_convert_block_hash(parent))
    manager = mla_cache.BlockManager(
        mla_cache.CacheConfig(8, block_size=BLOCK, block_hash="sha256_cbor")
    )
    assert manager.block_hashes(tokens) == expected
