"""mla_cache's backend and SGLang's own RadixCache, driven through the same
scheduler call sequences on SGLang's real allocator, request rows and ``Req``:
both must report the same hit lengths and the same available / evictable /
protected sizes at every step, and :meth:`Engine.check` proves after every
step that no page is leaked or freed twice."""

from typing import Callable, List

import pytest
from conftest import BACKENDS
from driver import Engine

PS = 4


def both(scenario: Callable[[Engine], List], *, page_size: int = PS, **engine_args) -> List:
    """Runs ``scenario`` on an engine with each cache; asserts the two
    traces are equal and returns SGLang's."""
    traces = {}
    for name, cls in BACKENDS.items():
        traces[name] = scenario(Engine(cls, page_size=page_size, **engine_args))
    assert traces["mla_cache"] == traces["sglang"]
    return traces["sglang"]


def prompt(n: int, start: int = 0) -> List[int]:
    return list(range(start, start + n))


def test_prefix_hits_are_whole_pages_below_the_last_token():
    def scenario(e: Engine):
        trace = [e.run(e.request("a", prompt(30), max_new_tokens=3)), e.sizes()]
        # Same prompt: all but the last token may hit, in whole pages.
        trace.append(e.run(e.request("b", prompt(30), max_new_tokens=2)))
        # Shares 13 tokens: 3 pages.
        trace.append(e.run(e.request("c", prompt(13) + prompt(20, 500), max_new_tokens=2)))
        # A prompt of exactly 2 pages can hit only 1 (the last token is recomputed).
        trace.append(e.run(e.request("d", prompt(8), max_new_tokens=1)))
        trace.append(e.sizes())
        return trace

    trace = both(scenario, num_pages=64)
    assert trace[0] == 0 and trace[2] == 28 and trace[3] == 12 and trace[4] == 4


def test_decoded_tokens_are_cached_when_a_request_finishes():
    def scenario(e: Engine):
        first = e.request("turn1", prompt(10), max_new_tokens=9)
        e.run(first)
        history = list(first.origin_input_ids) + list(first.output_ids)
        # The next turn resends the history: prompt and decoded tokens hit.
        second = e.request("turn2", history + prompt(5, 900), max_new_tokens=2)
        return [e.run(second), e.sizes()]

    trace = both(scenario, num_pages=64)
    assert trace[0] == 16  # 10 + 8 computed tokens, page-aligned


def test_one_batch_with_the_same_prompt_twice_frees_the_duplicate_pages():
    def scenario(e: Engine):
        a = e.request("a", prompt(21), max_new_tokens=4)
        b = e.request("b", prompt(21), max_new_tokens=4)
        trace = [e.prefill([a, b]), e.sizes()]  # both miss, both compute 5 pages
        while not (a.finished() and b.finished()):
            e.decode([r for r in (a, b) if not r.finished()])
            trace.append(e.sizes())
        return trace

    trace = both(scenario, num_pages=32)
    assert trace[0] == [0, 0]
    # After the checkpoints the copy is gone: 5 pages cached, locked by both.
    available, evictable, protected = trace[1]
    assert protected == 20 and evictable == 0


def test_chunked_prefill_caches_each_chunk_for_other_requests():
    def scenario(e: Engine):
        long = e.request("long", prompt(50), max_new_tokens=2)
        trace = [e.prefill([long], chunk=16), e.sizes()]
        # A request arriving between chunks hits what the chunks cached.
        peer = e.request("peer", prompt(40) + [7, 7, 7], max_new_tokens=2)
        trace.append(e.prefill([long, peer], chunk=16))
        trace.append(e.sizes())
        while not long.finished():
            if long.extend_end < len(long.full_untruncated_fill_ids):
                e.prefill([long], chunk=16)
            else:
                e.decode([long])
        while not peer.finished():
            e.decode([peer])
        trace.append(e.sizes())
        return trace

    trace = both(scenario, num_pages=64)
    assert trace[0] == [0] and trace[2] == [16, 16]
    assert trace[1][2] == 16  # the first chunk is cached and locked by its request


def test_eviction_under_memory_pressure_takes_the_least_recently_used_prefix():
    # The shortfalls are whole cached runs: SGLang evicts whole tree nodes,
    # mla_cache exactly the pages asked for (see docs/adapters.md).
    def scenario(e: Engine):
        e.run(e.request("old", prompt(24), max_new_tokens=1))
        e.run(e.request("new", prompt(24, 1000), max_new_tokens=1))
        trace = [e.sizes()]  # 12 pages cached, 1 free
        e.match(e.request("probe", prompt(25)))  # a match makes "old" the recent one
        trace.append(e.run(e.request("big", prompt(24, 5000), max_new_tokens=1)))
        trace.append(e.sizes())
        trace.append(e.match(e.request("q-old", prompt(25))))
        trace.append(e.match(e.request("q-new", prompt(25, 1000))))
        return trace

    trace = both(scenario, num_pages=13)
    assert trace[0] == (4, 48, 0) and trace[3:] == [24, 0]


def test_eviction_takes_branches_before_the_prefix_they_share():
    def scenario(e: Engine):
        e.run(e.request("a", prompt(16) + prompt(8, 100), max_new_tokens=1))
        e.run(e.request("b", prompt(16) + prompt(8, 200), max_new_tokens=1))
        e.match(e.request("probe", prompt(16) + prompt(9, 100)))  # "a" is the recent branch
        trace = [e.sizes()]
        trace.append(e.run(e.request("c", prompt(5, 9000), max_new_tokens=1)))
        trace.append(e.sizes())
        trace.append(e.match(e.request("q-a", prompt(16) + prompt(9, 100))))
        trace.append(e.match(e.request("q-b", prompt(16) + prompt(9, 200))))
        return trace

    trace = both(scenario, num_pages=9)
    assert trace[3:] == [24, 16]  # "b"'s branch went, the shared pages stayed


def test_locked_prefixes_are_never_evicted():
    def scenario(e: Engine):
        e.run(e.request("done", prompt(20), max_new_tokens=1))
        running = e.request("running", prompt(12) + prompt(8, 300), max_new_tokens=50)
        trace = [e.prefill([running]), e.sizes()]
        # Pressure: allocation evicts, but only the pages no lock holds.
        trace.append(e.prefill([e.request("other", prompt(16, 7000), max_new_tokens=1)]))
        trace.append(e.sizes())
        trace.append(e.match(e.request("q", prompt(21))))
        # Nothing evictable is left: SGLang's allocation fails, nothing leaks.
        with pytest.raises(RuntimeError, match="out of memory"):
            e.prefill([e.request("too-big", prompt(40, 8000), max_new_tokens=1)])
        e.check()
        e.decode([running])
        trace.append(e.sizes())
        return trace

    trace = both(scenario, num_pages=10)
    assert trace[0] == [12] and trace[3][2] == 20
    assert trace[4] == 12  # the running request's prefix survived the pressure


def test_retraction_frees_the_request_and_readmission_hits_its_cached_prefix():
    def scenario(e: Engine):
        req = e.request("r", prompt(18), max_new_tokens=20)
        trace = [e.prefill([req])]
        for _ in range(6):
            e.decode([req])
        trace.append(e.sizes())
        e.retract(req)
        trace.append(e.sizes())
        trace.append(e.prefill([req]))  # re-admitted: prompt + outputs re-matched
        trace.append(e.sizes())
        e.release(req, checkpoint=False)  # aborted
        trace.append(e.sizes())
        return trace

    trace = both(scenario, num_pages=32)
    assert trace[3] == [16]


def test_reset_forgets_every_prefix():
    def scenario(e: Engine):
        e.run(e.request("a", prompt(33), max_new_tokens=2))
        trace = [e.sizes()]
        e.flush()
        trace.append(e.sizes())
        trace.append(e.run(e.request("b", prompt(33), max_new_tokens=2)))
        return trace

    trace = both(scenario, num_pages=32)
    assert trace[1] == (128, 0, 0) and trace[2] == 0


def test_a_disabled_cache_shares_nothing_and_frees_everything():
    def scenario(e: Engine):
        trace = [e.run(e.request("a", prompt(20), max_new_tokens=3)), e.sizes()]
        trace.append(e.run(e.request("b", prompt(20), max_new_tokens=3)))
        return trace

    trace = both(scenario, num_pages=16, disable=True)
    assert trace == [0, (64, 0, 0), 0]


def test_extra_keys_isolate_prefixes():
    def scenario(e: Engine):
        e.run(e.request("a", prompt(20), max_new_tokens=1, extra_key="lora-1"))
        return [
            e.match(e.request("b", prompt(20), extra_key="lora-1")),
            e.match(e.request("c", prompt(20), extra_key="lora-2")),
            e.match(e.request("d", prompt(20))),
        ]

    assert both(scenario, num_pages=16) == [16, 0, 0]


@pytest.mark.parametrize("page_size", [1, 2, 16])
def test_page_sizes(page_size):
    def scenario(e: Engine):
        trace = [e.run(e.request("a", prompt(40), max_new_tokens=5))]
        trace.append(e.run(e.request("b", prompt(37) + [1, 2, 3], max_new_tokens=2)))
        trace.append(e.sizes())
        return trace

    trace = both(scenario, num_pages=256 // page_size, page_size=page_size)
    assert trace[1] == 37 // page_size * page_size


def test_abort_in_the_middle_of_a_chunked_prefill():
    def scenario(e: Engine):
        req = e.request("r", prompt(40), max_new_tokens=4)
        trace = [e.prefill([req], chunk=16), e.sizes()]
        e.release(req, checkpoint=False)  # aborted between chunks
        trace.append(e.sizes())
        trace.append(e.match(e.request("q", prompt(41))))  # the first chunk stays cached
        return trace

    trace = both(scenario, num_pages=16)
    assert trace[3] == 16 and trace[2] == (48, 16, 0)


def test_decode_under_memory_pressure_evicts_for_its_new_pages():
    # One-page leaves, so SGLang's node-sized evictions equal the pages needed.
    def scenario(e: Engine):
        e.run(e.request("x", prompt(4) + prompt(4, 500), max_new_tokens=1))
        e.run(e.request("y", prompt(4) + prompt(4, 600), max_new_tokens=1))
        a = e.request("a", prompt(12, 900), max_new_tokens=10)
        trace = [e.prefill([a]), e.sizes()]  # evicts "x"'s page
        while not a.finished():
            e.decode([a])  # new pages at 12 (free), 16 ("y" evicted), 20 (the shared page)
            trace.append(e.sizes())
        trace.append(e.match(e.request("q-y", prompt(4) + prompt(5, 600))))
        trace.append(e.match(e.request("q-a", prompt(13, 900))))
        return trace

    trace = both(scenario, num_pages=6)
    assert trace[-2:] == [0, 12]
