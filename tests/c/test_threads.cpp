// Eight threads run random operations against one shared manager through
// the C API; the gauges must add up after every call and, once every
// request is freed and every pin released, every block must be free.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "mla_cache.h"

namespace {

constexpr int kThreads = 8;
constexpr int kStepsPerThread = 4000;
constexpr size_t kBlocks = 256;
constexpr size_t kBlockSize = 16;

std::atomic<long> passed{0};
std::atomic<long> failed{0};

void check(bool ok, const char *what, int line) {
    if (ok) {
        passed.fetch_add(1, std::memory_order_relaxed);
    } else {
        failed.fetch_add(1, std::memory_order_relaxed);
        std::fprintf(stderr, "test_threads.cpp:%d: %s failed (last error: %s)\n", line, what,
                     mla_last_error());
    }
}

#define CHECK(cond) check((cond), #cond, __LINE__)

bool one_of(MlaStatus s, std::initializer_list<MlaStatus> allowed) {
    for (MlaStatus a : allowed) {
        if (s == a) return true;
    }
    std::fprintf(stderr, "unexpected %s: %s\n", mla_status_name(s), mla_last_error());
    return false;
}

struct Live {
    MlaRequestId id;
    size_t tokens;
};

// A prompt drawn from a few shared system prompts plus a private tail, so
// that threads hit, revive and evict each other's cached blocks.
std::vector<MlaTokenId> prompt(std::mt19937_64 &rng) {
    size_t shared = rng() % 4;
    size_t prefix = (rng() % 5) * kBlockSize;
    size_t tail = 1 + rng() % 40;
    std::vector<MlaTokenId> tokens;
    for (size_t i = 0; i < prefix; i++) tokens.push_back(static_cast<MlaTokenId>(shared * 100000 + i));
    for (size_t i = 0; i < tail; i++) tokens.push_back(static_cast<MlaTokenId>(rng() % 50000));
    return tokens;
}

void worker(MlaManager *manager, int thread) {
    std::mt19937_64 rng(1234 + thread);
    std::vector<Live> live;
    std::vector<std::vector<MlaTokenId>> pinned;
    MlaRequestId next = static_cast<MlaRequestId>(thread) << 32;
    std::vector<MlaBlockId> ids(kBlocks);
    std::vector<int64_t> slots(kBlocks * kBlockSize);
    MlaBlockCopy copies[MLA_MAX_COPIES_PER_APPEND];
    size_t n = 0, cached = 0, n_new = 0, n_copies = 0;

    for (int step = 0; step < kStepsPerThread; step++) {
        unsigned op = rng() % 100;
        if (op < 30 || live.empty()) {
            std::vector<MlaTokenId> tokens = prompt(rng);
            MlaAdmitOptions options;
            std::memset(&options, 0, sizeof options);
            options.decode_slots = rng() % 20;
            options.chunked_prefill = rng() % 4 == 0;
            MlaRequestId id = next++;
            MlaStatus s = mla_manager_admit(manager, id, tokens.data(), tokens.size(), &options,
                                            ids.data(), ids.size(), &n, &cached);
            CHECK(one_of(s, {MLA_STATUS_OK, MLA_STATUS_OUT_OF_BLOCKS}));
            if (s == MLA_STATUS_OK) {
                CHECK(n == (tokens.size() + options.decode_slots + kBlockSize - 1) / kBlockSize);
                CHECK(cached < tokens.size() && cached % kBlockSize == 0);
                if (options.chunked_prefill) {
                    CHECK(mla_manager_commit(manager, id, tokens.size()) == MLA_STATUS_OK);
                }
                live.push_back({id, tokens.size()});
            }
        } else if (op < 55) {
            Live &r = live[rng() % live.size()];
            std::vector<MlaTokenId> tokens(1 + rng() % 24);
            for (auto &t : tokens) t = static_cast<MlaTokenId>(rng() % 50000);
            MlaStatus s = mla_manager_append(manager, r.id, tokens.data(), tokens.size(), ids.data(),
                                             ids.size(), &n_new, copies,
                                             MLA_MAX_COPIES_PER_APPEND, &n_copies);
            CHECK(one_of(s, {MLA_STATUS_OK, MLA_STATUS_OUT_OF_BLOCKS, MLA_STATUS_REQUEST_TOO_LARGE}));
            if (s == MLA_STATUS_OK) {
                r.tokens += tokens.size();
                CHECK(n_copies <= 1 && n_new <= (tokens.size() + kBlockSize - 1) / kBlockSize);
                if (n_copies == 1) CHECK(copies[0].src != copies[0].dst);
            }
        } else if (op < 65) {
            Live parent = live[rng() % live.size()];
            MlaRequestId child = next++;
            CHECK(mla_manager_fork(manager, parent.id, child) == MLA_STATUS_OK);
            live.push_back({child, parent.tokens});
        } else if (op < 85) {
            size_t i = rng() % live.size();
            CHECK(mla_manager_free(manager, live[i].id) == MLA_STATUS_OK);
            CHECK(mla_manager_free(manager, live[i].id) == MLA_STATUS_UNKNOWN_REQUEST);
            live[i] = live.back();
            live.pop_back();
        } else if (op < 90) {
            const Live &r = live[rng() % live.size()];
            CHECK(mla_manager_block_table(manager, r.id, ids.data(), ids.size(), &n) == MLA_STATUS_OK);
            CHECK(n * kBlockSize >= r.tokens);
            CHECK(mla_manager_slot_mapping(manager, r.id, 0, r.tokens, slots.data(), slots.size(),
                                           &n) == MLA_STATUS_OK);
            CHECK(n == r.tokens && slots[0] % static_cast<int64_t>(kBlockSize) == 0);
            CHECK(mla_manager_num_tokens(manager, r.id, &n) == MLA_STATUS_OK && n == r.tokens);
        } else if (op < 94) {
            std::vector<MlaTokenId> tokens = prompt(rng);
            MlaStatus s = mla_manager_pin(manager, tokens.data(), tokens.size(), nullptr, &n);
            CHECK(one_of(s, {MLA_STATUS_OK, MLA_STATUS_PIN_BUDGET_EXCEEDED}));
            if (s == MLA_STATUS_OK && n > 0) pinned.push_back(tokens);
        } else if (op < 97) {
            if (!pinned.empty()) {
                // The pinned blocks cannot have been evicted: unpinning finds them.
                CHECK(mla_manager_unpin(manager, pinned.back().data(), pinned.back().size(),
                                        nullptr, &n) == MLA_STATUS_OK);
                pinned.pop_back();
            }
        } else {
            std::vector<MlaTokenId> tokens = prompt(rng);
            CHECK(mla_manager_match_prefix(manager, tokens.data(), tokens.size(), nullptr,
                                           ids.data(), ids.size(), &n, &cached) == MLA_STATUS_OK);
            CHECK(cached == n * kBlockSize);
        }
        MlaCacheStats stats;
        CHECK(mla_manager_stats(manager, &stats) == MLA_STATUS_OK);
        CHECK(stats.free_blocks + stats.used_blocks == stats.num_blocks);
        CHECK(stats.pinned_blocks <= kBlocks / 2);
    }

    // Errors are per thread: a failure here leaves other threads' messages alone.
    CHECK(mla_manager_free(manager, next + 1000) == MLA_STATUS_UNKNOWN_REQUEST);
    std::string mine = mla_last_error();
    CHECK(mine.find(std::to_string(next + 1000)) != std::string::npos);

    for (const Live &r : live) CHECK(mla_manager_free(manager, r.id) == MLA_STATUS_OK);
    for (const auto &tokens : pinned) {
        CHECK(mla_manager_unpin(manager, tokens.data(), tokens.size(), nullptr, &n) == MLA_STATUS_OK);
    }
}

}  // namespace

int main() {
    MlaConfig *config = nullptr;
    MlaManager *manager = nullptr;
    CHECK(mla_config_create(kBlocks, &config) == MLA_STATUS_OK);
    CHECK(mla_config_set_block_size(config, kBlockSize) == MLA_STATUS_OK);
    CHECK(mla_config_set_enable_events(config, true) == MLA_STATUS_OK);
    CHECK(mla_manager_create(config, &manager) == MLA_STATUS_OK);
    CHECK(mla_config_destroy(config) == MLA_STATUS_OK);

    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; t++) threads.emplace_back(worker, manager, t);
    for (auto &t : threads) t.join();

    MlaCacheStats stats;
    CHECK(mla_manager_stats(manager, &stats) == MLA_STATUS_OK);
    CHECK(stats.num_blocks == kBlocks);
    CHECK(stats.free_blocks + stats.used_blocks == stats.num_blocks);
    CHECK(stats.free_blocks == kBlocks && stats.used_blocks == 0);
    CHECK(stats.num_requests == 0 && stats.pinned_blocks == 0);
    CHECK(stats.prefix_hit_requests > 0 && stats.evictions > 0 && stats.cow_copies > 0);
    std::printf("test_threads: %llu admissions, %llu with hits, %llu evictions, %llu copies\n",
                static_cast<unsigned long long>(stats.prefix_query_requests),
                static_cast<unsigned long long>(stats.prefix_hit_requests),
                static_cast<unsigned long long>(stats.evictions),
                static_cast<unsigned long long>(stats.cow_copies));
    CHECK(mla_manager_check_invariants(manager) == MLA_STATUS_OK);
    MlaEventList *events = nullptr;
    size_t n = 0;
    CHECK(mla_manager_take_events(manager, &events) == MLA_STATUS_OK);
    CHECK(mla_event_list_len(events, &n) == MLA_STATUS_OK && n > 0);
    CHECK(mla_event_list_destroy(events) == MLA_STATUS_OK);
    CHECK(mla_manager_destroy(manager) == MLA_STATUS_OK);

    std::printf("test_threads: %ld passed, %ld failed\n", passed.load(), failed.load());
    return failed.load() == 0 ? 0 : 1;
}
