"""Token ids from every accepted container, and the errors for the rest."""

import array

import numpy as np
import pytest

from mla_cache import BlockManager

from conftest import small_config

INT_DTYPES = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64]


@pytest.fixture
def m():
    return BlockManager(small_config(num_blocks=64))


def blocks_for(m, tokens):
    m.admit("probe", tokens)
    table = list(m.block_table("probe"))
    n = m.num_tokens("probe")
    m.free("probe")
    return n, table


@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_every_integer_dtype(m, dtype):
    values = np.arange(10, dtype=dtype)
    m.admit(1, list(range(10)))
    hit = m.match_prefix(values)
    assert hit.num_tokens == 8
    m.admit(2, values)
    assert m.admit(3, values[::-1].copy()).num_cached_tokens == 0


def test_lists_tuples_ranges_iterables_and_numpy_scalars(m):
    m.admit(1, list(range(9)))
    for tokens in (tuple(range(9)), range(9), array.array("I", range(9)), iter(range(9)),
                   [np.int64(i) for i in range(9)]):
        assert m.match_prefix(tokens).num_tokens == 8


def test_non_contiguous_and_byte_swapped_arrays(m):
    base = np.arange(40, dtype=np.int64)
    m.admit(1, base[::2].copy())
    strided = base[::2]
    assert not strided.flags.c_contiguous
    assert m.match_prefix(strided).num_tokens == 20
    swapped = base[::2].astype(">i4")
    assert m.match_prefix(swapped).num_tokens == 20
    fortran_col = np.asfortranarray(np.stack([base[::2], base[::2]], axis=1))[:, 0]
    assert m.match_prefix(fortran_col).num_tokens == 20
    readonly = base[::2].copy()
    readonly.setflags(write=False)
    assert m.match_prefix(readonly).num_tokens == 20


@pytest.mark.parametrize("code", ["b", "B", "h", "H", "i", "I", "l", "L", "q", "Q"])
def test_integer_buffers_of_every_item_size(m, code):
    m.admit(1, list(range(9)))
    assert m.match_prefix(array.array(code, range(9))).num_tokens == 8
    assert m.match_prefix(memoryview(array.array(code, range(9)))[::2]).num_tokens == 0
    assert m.match_prefix(memoryview(array.array(code, range(9)))[:5]).num_tokens == 4


def test_packed_bytes_as_a_uint32_buffer(m):
    packed = np.arange(9, dtype="<u4").tobytes()
    m.admit(1, memoryview(packed).cast("I"))
    assert m.match_prefix(range(9)).num_tokens == 8


def test_bad_buffers(m):
    with pytest.raises(ValueError, match="outside"):
        m.admit(1, array.array("q", [3, -1]))
    with pytest.raises(ValueError, match="1-D"):
        m.admit(1, memoryview(array.array("I", range(6))).cast("B").cast("I", [2, 3]))
    with pytest.raises(TypeError):
        m.admit(1, array.array("d", [1.0]))
    with pytest.raises(TypeError, match="memoryview"):
        m.admit(1, bytearray(b"abcd"))
    with pytest.raises(KeyError):
        m.free(1)


def test_a_lone_int_is_one_token(m):
    m.admit(1, 5)
    assert m.num_tokens(1) == 1
    m.append(1, np.int64(6))
    assert m.num_tokens(1) == 2


@pytest.mark.parametrize(
    "tokens",
    [
        [1, -1],
        [2**32],
        [2**64],
        np.array([0, -5], dtype=np.int8),
        np.array([2**32], dtype=np.int64),
        np.array([2**63], dtype=np.uint64),
        np.array([-1], dtype=np.int64)[::1],
        -1,
    ],
)
def test_out_of_range_token_ids_are_value_errors(m, tokens):
    with pytest.raises(ValueError, match="outside"):
        m.admit(1, tokens)
    with pytest.raises(KeyError):
        m.free(1)


def test_largest_token_id_is_accepted(m):
    m.admit(1, [2**32 - 1, 0])
    m.admit(2, np.array([2**32 - 1], dtype=np.uint32))


@pytest.mark.parametrize(
    "tokens",
    [
        np.arange(4, dtype=np.float32),
        np.array([True, False]),
        [1.0, 2.0],
        [1, "2"],
        [True],
        "abc",
        b"abc",
        None,
        3.5,
        {1: 2}.items(),
    ],
)
def test_non_integer_tokens_are_type_errors(m, tokens):
    with pytest.raises(TypeError):
        m.admit(1, tokens)


def test_wrong_shapes_are_value_errors(m):
    with pytest.raises(ValueError, match="1-D"):
        m.admit(1, np.zeros((2, 3), dtype=np.int32))
    with pytest.raises(ValueError, match="1-D"):
        m.admit(1, np.array(3))


def test_result_arrays_have_fixed_dtypes(m):
    a = m.admit(1, np.arange(7, dtype=np.int8), decode_slots=3)
    assert a.block_ids.dtype == np.int32 and a.block_ids.ndim == 1
    assert m.block_table(1).dtype == np.int32
    assert m.slot_mapping(1, 0, 10).dtype == np.int64
    assert m.append(1, [1]).new_block_ids.dtype == np.int32


@pytest.mark.parametrize("bad", [-1, 2**64, 1.5, "3", None])
def test_counts_are_checked(m, bad):
    error = TypeError if isinstance(bad, (float, str, type(None))) else ValueError
    with pytest.raises(error):
        m.admit(1, [1], decode_slots=bad)


@pytest.mark.parametrize(
    "offset,length",
    [(6, 3), (8, 1), (250, 8), (2, 0), (2**64 - 1, 1), (1, 2**64 - 1)],
    ids=["past-the-prompt", "at-its-end", "past-any-request", "empty", "offset-max", "length-max"],
)
def test_multimodal_ranges_outside_the_prompt_are_refused(m, offset, length):
    # An 8-token prompt.
    before = m.stats()
    with pytest.raises(ValueError, match="multimodal input 0"):
        m.admit(1, list(range(8)), extra_keys={"mm": [("image", offset, length)]})
    assert m.stats() == before
    assert m.num_free_blocks == 64
    m.admit(1, list(range(8)), extra_keys={"mm": [("image", 0, 8)]})
    m.admit(2, list(range(8)), extra_keys={"mm": [("image", 6, 2)]})


def test_a_cache_too_large_for_memory_is_a_memory_error():
    """Under a 4 GiB address-space limit (in a child process), 2^31 - 1 blocks
    raise MemoryError instead of aborting the interpreter."""
    import subprocess
    import sys

    script = (
        "import resource\n"
        "resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))\n"
        "from mla_cache import BlockManager, CacheConfig\n"
        "try:\n"
        "    BlockManager(CacheConfig((1 << 31) - 1))\n"
        "except MemoryError as e:\n"
        "    print('MemoryError', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("MemoryError out of memory"), out.stdout


@pytest.mark.parametrize("dtype", [np.int32, np.uint32, np.int64])
def test_an_array_prompt_is_the_list_prompt(m, dtype):
    # Contiguous arrays of these dtypes are converted block by block as the
    # manager hashes them: the same tokens, the same chain as a list's.
    tokens = [(i * 7919) % 50_000 for i in range(201)]
    m.admit(1, np.array(tokens, dtype=dtype))
    m.free(1)
    assert m.admit(2, tokens).num_cached_tokens == 200
    m.append(2, 3)
    assert m.num_tokens(2) == 202


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_a_late_out_of_range_array_token_changes_nothing(m, dtype):
    tokens = np.arange(200, dtype=dtype)
    tokens[150] = -1
    free = m.num_free_blocks
    with pytest.raises(ValueError, match="-1 at position 150 is outside"):
        m.admit(1, tokens)
    assert m.num_free_blocks == free
    assert m.match_prefix(np.arange(140)).num_tokens == 0
    with pytest.raises(KeyError):
        m.free(1)
