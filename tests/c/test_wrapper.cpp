// The C++ wrapper (include/mla_cache.hpp): move-only handles, errors as
// mla::Error, and a decode loop over the batched calls checked against the
// single calls, also from several threads. Built and run by capi/tests/c_abi.rs
// and scripts/c-tests.sh (under valgrind and ASan there).
#include <atomic>
#include <cstring>
#include <thread>
#include <type_traits>
#include <vector>

#include "fixture.h"
#include "mla_cache.hpp"

namespace {

static_assert(!std::is_copy_constructible_v<mla::Manager>, "handles are move-only");
static_assert(!std::is_copy_assignable_v<mla::Store>, "handles are move-only");
static_assert(std::is_nothrow_move_constructible_v<mla::Manager>, "moves do not throw");
static_assert(std::is_nothrow_move_assignable_v<mla::Publisher>, "moves do not throw");

mla::Config small_config(size_t num_blocks) {
    mla::Config config(num_blocks);
    config.block_size(BS).hash_seed(42);
    return config;
}

std::vector<MlaTokenId> tokens(size_t n, MlaTokenId first) {
    std::vector<MlaTokenId> t(n);
    fill_tokens(t.data(), n, first);
    return t;
}

// The status of the mla::Error `f` throws (MLA_STATUS_OK if none).
template <class F>
MlaStatus status_of(F f) {
    try {
        f();
    } catch (const mla::Error &e) {
        return e.status();
    }
    return MLA_STATUS_OK;
}

void test_errors_and_moves() {
    CHECK(status_of([] { mla::Config c(0); c.validate(); }) == MLA_STATUS_INVALID_CONFIG);
    CHECK(status_of([] { mla::Config::preset("no-such-model", 4, MLA_DTYPE_BF16); }) ==
          MLA_STATUS_INVALID_CONFIG);
    mla::Config config = small_config(8);
    CHECK(config.info().block_size == BS && config.info().num_blocks == 8);
    mla::Manager manager(config);
    try {
        manager.free(7);
        CHECK(false);
    } catch (const mla::Error &e) {
        CHECK(e.status() == MLA_STATUS_UNKNOWN_REQUEST);
        CHECK(std::strstr(e.what(), "mla_manager_free") != nullptr);
        CHECK(std::strstr(e.what(), "MLA_STATUS_UNKNOWN_REQUEST") != nullptr);
        CHECK(std::strstr(e.what(), "unknown request 7") != nullptr);
    }

    // A moved-from handle is empty; the moved-to one works; assignment
    // destroys what it replaces (valgrind and ASan see any leak or double free).
    manager.admit(1, tokens(5, 0));
    mla::Manager moved(std::move(manager));
    CHECK(manager.get() == nullptr && moved.get() != nullptr);
    CHECK(moved.num_tokens(1) == 5);
    CHECK(status_of([&] { manager.num_tokens(1); }) == MLA_STATUS_NULL_POINTER);
    mla::Manager other(small_config(4));
    other = std::move(moved);
    CHECK(other.num_tokens(1) == 5);
    other.check_invariants();
}

void test_requests() {
    mla::Manager manager(small_config(16));
    mla::Admission a = manager.admit(1, tokens(6, 0));
    CHECK(a.block_ids.size() == 2 && a.num_cached_tokens == 0);
    CHECK(manager.block_table(1) == a.block_ids);
    CHECK(manager.capacity(1) == 2 && manager.num_computed_tokens(1) == 6);
    MlaAdmitCheck check = manager.would_admit(tokens(6, 0));
    CHECK(check.fits && check.num_cached_tokens == 4 && check.new_blocks == 1);
    manager.fork(1, 2);
    mla::Growth g = manager.append(2, {100});
    CHECK(g.new_block_ids.empty() && g.copies.size() == 1);
    CHECK(g.copies[0].src == a.block_ids[1] && g.copies[0].position == 1);
    g = manager.reserve(1, 13);
    CHECK(g.new_block_ids.size() == 2 && g.copies.empty());
    CHECK(manager.slot_mapping(1, 0, 2) ==
          (std::vector<int64_t>{int64_t(a.block_ids[0] * BS), int64_t(a.block_ids[0] * BS + 1)}));
    CHECK(manager.pin(tokens(6, 0)) == 4 && manager.unpin(tokens(6, 0)) == 4);
    CHECK(status_of([&] { manager.unpin(tokens(6, 0)); }) == MLA_STATUS_NOT_PINNED);
    CHECK(manager.stats().num_requests == 2);
    manager.free_batch({1, 2});
    CHECK(manager.num_free_blocks() == 16);
}

void test_batched_decode_equals_single_calls() {
    // Two managers run the same decode: one through the batched calls,
    // one through single calls; every step must agree.
    constexpr size_t N = 6;
    mla::Manager batched(small_config(64)), single(small_config(64));
    std::vector<MlaRequestId> ids;
    for (MlaRequestId id = 0; id < N; id++) {
        ids.push_back(id);
        for (mla::Manager *m : {&batched, &single}) {
            if (id % 3 == 2) {
                m->fork(id - 1, id);  // shared tails: copies inside the batch
            } else {
                m->admit(id, tokens(3 + id, 0));
            }
        }
    }
    MlaTokenId next = 1000;
    for (int step = 0; step < 12; step++) {
        // Odd steps append 3 draft tokens to every other request.
        std::vector<MlaRequestId> these;
        std::vector<size_t> counts;
        std::vector<MlaTokenId> toks;
        for (MlaRequestId id : ids) {
            size_t k = step % 2 == 0 ? 1 : (id % 2 == 0 ? 3 : 0);
            if (k == 0) {
                continue;
            }
            these.push_back(id);
            counts.push_back(k);
            for (size_t i = 0; i < k; i++) {
                toks.push_back(next++);
            }
        }
        mla::BatchAppend out = batched.append_batch(these, toks, counts);
        std::vector<int64_t> slots;
        std::vector<MlaBlockId> fresh;
        size_t copy = 0, offset = 0;
        for (size_t i = 0; i < these.size(); i++) {
            size_t start = single.num_tokens(these[i]);
            std::vector<MlaTokenId> mine(toks.begin() + offset, toks.begin() + offset + counts[i]);
            offset += counts[i];
            mla::Growth g = single.append(these[i], mine);
            CHECK(out.new_block_counts[i] == g.new_block_ids.size());
            fresh.insert(fresh.end(), g.new_block_ids.begin(), g.new_block_ids.end());
            for (const MlaBlockCopy &c : g.copies) {
                CHECK(copy < out.copies.size() && out.copies[copy].request_index == i);
                CHECK(std::memcmp(&out.copies[copy].copy, &c, sizeof c) == 0);
                copy++;
            }
            std::vector<int64_t> s = single.slot_mapping(these[i], start, start + counts[i]);
            slots.insert(slots.end(), s.begin(), s.end());
        }
        CHECK(copy == out.copies.size());
        CHECK(out.new_block_ids == fresh);
        CHECK(out.slots == slots);

        // The step's padded tables and query slots, both ways.
        std::vector<MlaPositionRange> positions;
        for (MlaRequestId id : ids) {
            size_t len = single.num_tokens(id);
            positions.push_back({len - 1, len});
        }
        mla::BlockTables t = batched.block_tables(ids, -1, positions);
        for (size_t r = 0; r < N; r++) {
            std::vector<MlaBlockId> table = single.block_table(ids[r]);
            CHECK(table.size() <= t.max_blocks);
            for (size_t c = 0; c < t.max_blocks; c++) {
                int32_t want = c < table.size() ? int32_t(table[c]) : -1;
                CHECK(t.tables[r * t.max_blocks + c] == want);
            }
            CHECK(t.slots[r] ==
                  single.slot_mapping(ids[r], positions[r].start, positions[r].end)[0]);
        }
    }
    MlaCacheStats b = batched.stats(), s = single.stats();
    CHECK(std::memcmp(&b, &s, sizeof b) == 0 && b.cow_copies > 0);

    // Into the caller's arrays: too narrow a row throws BUFFER_TOO_SMALL and writes nothing.
    std::vector<int32_t> narrow(N, 7);
    CHECK(status_of([&] {
              batched.fill_block_tables(ids.data(), N, narrow.data(), 1, 0, nullptr, nullptr, 0);
          }) == MLA_STATUS_BUFFER_TOO_SMALL);
    CHECK(narrow == std::vector<int32_t>(N, 7));
    std::vector<int32_t> wide(16);
    MlaPositionRange first = {0, 2};
    int64_t two[2] = {0, 0};
    mla::TableSizes need =
        batched.fill_block_tables(ids.data(), 1, wide.data(), 16, 0, &first, two, 2);
    CHECK(need.max_blocks == batched.block_table(0).size() && need.num_slots == 2);
    CHECK(wide[0] == int32_t(batched.block_table(0)[0]) && wide[15] == 0);
    CHECK(two[1] == batched.slot_mapping(0, 1, 2)[0]);
    // All or nothing.
    MlaCacheStats before = batched.stats();
    CHECK(status_of([&] { batched.append_batch({0, 99}, {1, 2}); }) == MLA_STATUS_UNKNOWN_REQUEST);
    CHECK(status_of([&] { batched.free_batch({0, 99}); }) == MLA_STATUS_UNKNOWN_REQUEST);
    MlaCacheStats after = batched.stats();
    CHECK(std::memcmp(&before, &after, sizeof before) == 0);
    batched.free_batch(ids);
    single.free_batch(ids);
    CHECK(batched.num_free_blocks() == 64);
    batched.check_invariants();
}

void test_threads_batch_their_own_requests() {
    mla::Manager manager(small_config(256));
    std::atomic<int> failures{0};
    std::vector<std::thread> threads;
    for (MlaRequestId t = 0; t < 4; t++) {
        threads.emplace_back([&manager, &failures, t] {
            try {
                std::vector<MlaRequestId> ids;
                for (MlaRequestId r = 0; r < 8; r++) {
                    ids.push_back(t * 100 + r);
                    manager.admit(ids.back(), tokens(5, MlaTokenId(r)));  // shared prefixes
                }
                for (int step = 0; step < 20; step++) {
                    std::vector<MlaTokenId> toks(ids.size(), MlaTokenId(step));
                    mla::BatchAppend out = manager.append_batch(ids, toks);
                    mla::BlockTables tables = manager.block_tables(ids, -1);
                    failures += out.slots.size() != ids.size();
                    failures += tables.max_blocks != (6 + size_t(step) + BS - 1) / BS;  // ceil(len / BS)
                }
                manager.free_batch(ids);
            } catch (const mla::Error &) {
                failures++;
            }
        });
    }
    for (std::thread &t : threads) {
        t.join();
    }
    CHECK(failures == 0);
    CHECK(manager.num_free_blocks() == 256);
    manager.check_invariants();
}

void test_store_tier_publisher() {
    mla::Config config = small_config(8);
    config.num_layers(2).enable_events(true);
    mla::Store store = mla::Store::host(config);
    CHECK(store.info().num_layers == 2);
    enum { T = 2, NOPE = 512, ROPE = 64, W = NOPE + ROPE };
    static float c_kv[T][NOPE], k_pe[T][ROPE], out[T][W];
    for (size_t t = 0; t < T; t++) {
        for (size_t i = 0; i < NOPE; i++) c_kv[t][i] = float(t + 1);
        for (size_t i = 0; i < ROPE; i++) k_pe[t][i] = -float(t + 1);
    }
    MlaMatrix c = {c_kv, MLA_ELEM_TYPE_F32, T, NOPE, 0};
    MlaMatrix k = {k_pe, MLA_ELEM_TYPE_F32, T, ROPE, 0};
    store.write(1, c, k, {int64_t(3 * BS), int64_t(3 * BS + 1)});
    store.copy_blocks({{3, 5, 0}});
    MlaMatrix o = {out, MLA_ELEM_TYPE_F32, T, W, 0};
    store.gather(1, {5}, o);
    CHECK(out[0][0] == 1.0f && out[1][NOPE] == -2.0f);
    CHECK(store.layer_view(0).shape[0] == 8);
    CHECK(status_of([&] { store.layer_view(2); }) == MLA_STATUS_INVALID_ARGUMENT);

    MlaTierOptions options;
    std::memset(&options, 0, sizeof options);
    options.host_mem_bytes = 1 << 20;
    mla::TieredCache cache(config, store, &options);
    mla::TieredAdmission a = cache.admit(1, tokens(9, 0));
    CHECK(a.block_ids.size() == 3 && cache.block_table(1) == a.block_ids);
    cache.append(1, {77});
    CHECK(cache.slot_mapping(1, 9, 10).size() == 1);
    CHECK(cache.lookup(tokens(9, 0)).device_tokens == 8);
    CHECK(cache.stats().has_host);

    MlaPublisherOptions po;
    std::memset(&po, 0, sizeof po);
    po.endpoint = "tcp://*:0";
    mla::Publisher publisher(po);
    CHECK(publisher.endpoint().rfind("tcp://", 0) == 0);
    CHECK(publisher.publish(cache) > 0);
    CHECK(publisher.stats().events_accepted > 0);
    cache.free(1);

    mla::Manager manager(config);
    manager.admit(1, tokens(9, 0));
    mla::EventList events = manager.take_events();
    CHECK(events.size() == 1 && events[0].kind == MLA_EVENT_KIND_BLOCK_STORED);
    manager.admit(2, tokens(9, 100));
    CHECK(publisher.publish(manager) == 1);
}

}  // namespace

int main() {
    test_errors_and_moves();
    test_requests();
    test_batched_decode_equals_single_calls();
    // The publisher first: the process-wide ZeroMQ context's I/O threads
    // then get stacks of their own (valgrind.supp), not the cached stacks
    // of the joined threads below.
    test_store_tier_publisher();
    test_threads_batch_their_own_requests();
    return CHECK_SUMMARY("test_wrapper");
}
