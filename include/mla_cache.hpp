/*
 * mla_cache: a header-only C++17 wrapper of the C API (mla_cache.h).
 *
 * - Every handle (Config, Manager, Store, TieredCache, Publisher, EventList)
 *   is move-only and destroys its C object in its destructor.
 * - Every failing call throws mla::Error, which carries the MlaStatus and the
 *   message of mla_last_error(); as in C, a failing call changes nothing.
 * - Results come back in std::vector (sized by the call: a buffer found too
 *   small is grown and the call repeated), except where the caller owns the
 *   memory: Manager::fill_block_tables writes into the caller's arrays (pinned
 *   host buffers for FlashMLA / FlashInfer block tables and slot mappings).
 *
 * The rules of each call are those of the C function it names.
 */
#ifndef MLA_CACHE_HPP
#define MLA_CACHE_HPP

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "mla_cache.h"

namespace mla {

/// A failed call: its status and message.
class Error : public std::runtime_error {
public:
    /// An error with `status` and the calling thread's last message.
    Error(MlaStatus status, const char *call)
        : std::runtime_error(std::string(call) + ": " + mla_status_name(status) + ": " +
                             mla_last_error()),
          status_(status) {}

    /// The C status.
    MlaStatus status() const noexcept { return status_; }

private:
    MlaStatus status_;
};

/// Throws mla::Error unless `status` is MLA_STATUS_OK.
inline void check(MlaStatus status, const char *call) {
    if (status != MLA_STATUS_OK) {
        throw Error(status, call);
    }
}

namespace detail {

/// A move-only owner of a C handle, destroyed with `Destroy`.
template <class T, MlaStatus (*Destroy)(T *)>
class Handle {
public:
    Handle() noexcept = default;
    explicit Handle(T *ptr) noexcept : ptr_(ptr) {}
    Handle(const Handle &) = delete;
    Handle &operator=(const Handle &) = delete;
    Handle(Handle &&other) noexcept : ptr_(std::exchange(other.ptr_, nullptr)) {}
    Handle &operator=(Handle &&other) noexcept {
        if (this != &other) {
            reset();
            ptr_ = std::exchange(other.ptr_, nullptr);
        }
        return *this;
    }
    ~Handle() { reset(); }

    /// The C handle (still owned).
    T *get() const noexcept { return ptr_; }

private:
    void reset() noexcept {
        if (ptr_ != nullptr) {
            // A live handle's destroy cannot fail; there is nothing to report it to.
            (void)Destroy(ptr_);
            ptr_ = nullptr;
        }
    }

    T *ptr_ = nullptr;
};

/// Runs `call(data, cap, &len)` into `out`, growing `out` to the length a
/// too-small call reports and calling again; `out` ends with the length written.
template <class T, class Call>
void fill(std::vector<T> &out, const char *name, Call call) {
    for (;;) {
        size_t len = 0;
        MlaStatus status = call(out.data(), out.size(), &len);
        if (status == MLA_STATUS_BUFFER_TOO_SMALL && len > out.size()) {
            out.resize(len);
            continue;
        }
        check(status, name);
        out.resize(len);
        return;
    }
}

}  // namespace detail

/// Blocks added to a request's table and the copies to perform first.
struct Growth {
    std::vector<MlaBlockId> new_block_ids;
    std::vector<MlaBlockCopy> copies;
};

/// A request's block table and the prompt tokens already cached.
struct Admission {
    std::vector<MlaBlockId> block_ids;
    size_t num_cached_tokens = 0;
};

/// A tiered admission: an Admission and the tokens each tier served.
struct TieredAdmission {
    std::vector<MlaBlockId> block_ids;
    size_t num_cached_tokens = 0;
    MlaTierHits hits{};
};

/// The outcome of Manager::append_batch.
struct BatchAppend {
    /// Blocks added, request after request; `new_block_counts[i]` of them to request i.
    std::vector<MlaBlockId> new_block_ids;
    std::vector<size_t> new_block_counts;
    /// Copies to perform before writing, with their request's index.
    std::vector<MlaBatchCopy> copies;
    /// The slot of every appended token, request after request.
    std::vector<int64_t> slots;
};

/// The sizes a batch's block tables and slot mapping need.
struct TableSizes {
    size_t max_blocks = 0;
    size_t num_slots = 0;
};

/// Block tables and slot mapping of a batch, in memory this object owns.
struct BlockTables {
    /// Row-major `[num_requests][max_blocks]`, padded.
    std::vector<int32_t> tables;
    size_t max_blocks = 0;
    std::vector<int64_t> slots;
};

/// A configuration (`mla_config_*`).
class Config {
public:
    /// `mla_config_create`.
    explicit Config(size_t num_blocks) {
        MlaConfig *c = nullptr;
        check(mla_config_create(num_blocks, &c), "mla_config_create");
        handle_ = Handle(c);
    }

    /// `mla_config_from_preset`.
    static Config preset(const std::string &model, size_t num_blocks, MlaDtype dtype) {
        MlaConfig *c = nullptr;
        check(mla_config_from_preset(model.c_str(), num_blocks, dtype, &c), "mla_config_from_preset");
        return Config(Adopt{}, c);
    }

    Config &block_size(size_t v) { return set(mla_config_set_block_size(get(), v), "mla_config_set_block_size"); }
    Config &num_layers(size_t v) { return set(mla_config_set_num_layers(get(), v), "mla_config_set_num_layers"); }
    Config &dtype(MlaDtype v) { return set(mla_config_set_dtype(get(), v), "mla_config_set_dtype"); }
    Config &eviction(MlaEvictionPolicyKind v) { return set(mla_config_set_eviction(get(), v), "mla_config_set_eviction"); }
    Config &block_hash(MlaBlockHashKind v) { return set(mla_config_set_block_hash(get(), v), "mla_config_set_block_hash"); }
    Config &hash_seed(uint64_t seed) { return set(mla_config_set_hash_seed(get(), true, seed), "mla_config_set_hash_seed"); }
    Config &enable_events(bool v) { return set(mla_config_set_enable_events(get(), v), "mla_config_set_enable_events"); }
    Config &enable_prefix_caching(bool v) {
        return set(mla_config_set_enable_prefix_caching(get(), v), "mla_config_set_enable_prefix_caching");
    }
    Config &pin_budget_blocks(size_t v) {
        return set(mla_config_set_pin_budget_blocks(get(), true, v), "mla_config_set_pin_budget_blocks");
    }

    /// `mla_config_get`.
    MlaConfigInfo info() const {
        MlaConfigInfo info{};
        check(mla_config_get(get(), &info), "mla_config_get");
        return info;
    }

    /// `mla_config_sizes`.
    MlaConfigSizes sizes() const {
        MlaConfigSizes sizes{};
        check(mla_config_sizes(get(), &sizes), "mla_config_sizes");
        return sizes;
    }

    /// `mla_config_validate`.
    void validate() const { check(mla_config_validate(get()), "mla_config_validate"); }

    MlaConfig *get() const noexcept { return handle_.get(); }

private:
    struct Adopt {};
    Config(Adopt, MlaConfig *c) noexcept : handle_(c) {}
    Config &set(MlaStatus status, const char *name) {
        check(status, name);
        return *this;
    }

    using Handle = detail::Handle<MlaConfig, mla_config_destroy>;
    Handle handle_;
};

/// Events taken from a manager or tiered cache (`MlaEventList`).
class EventList {
public:
    explicit EventList(MlaEventList *list) noexcept : handle_(list) {}

    /// `mla_event_list_len`.
    size_t size() const {
        size_t n = 0;
        check(mla_event_list_len(handle_.get(), &n), "mla_event_list_len");
        return n;
    }

    /// `mla_event_list_get`: valid as long as this list.
    MlaEvent operator[](size_t i) const {
        MlaEvent e{};
        check(mla_event_list_get(handle_.get(), i, &e), "mla_event_list_get");
        return e;
    }

private:
    detail::Handle<MlaEventList, mla_event_list_destroy> handle_;
};

/// A block manager (`mla_manager_*`). Thread-safe, like the C handle.
class Manager {
public:
    /// `mla_manager_create` (the configuration is copied).
    explicit Manager(const Config &config) {
        MlaManager *m = nullptr;
        check(mla_manager_create(config.get(), &m), "mla_manager_create");
        handle_ = Handle(m);
        block_size_ = config.info().block_size;
    }

    /// `mla_manager_admit`; `options` may be null (defaults).
    Admission admit(MlaRequestId id, const std::vector<MlaTokenId> &tokens,
                    const MlaAdmitOptions *options = nullptr) {
        Admission a;
        detail::fill(a.block_ids, "mla_manager_admit", [&](MlaBlockId *ids, size_t cap, size_t *n) {
            return mla_manager_admit(get(), id, tokens.data(), tokens.size(), options, ids, cap, n,
                                     &a.num_cached_tokens);
        });
        return a;
    }

    /// `mla_manager_would_admit`: a dry run.
    MlaAdmitCheck would_admit(const std::vector<MlaTokenId> &tokens,
                              const MlaAdmitOptions *options = nullptr) const {
        MlaAdmitCheck c{};
        check(mla_manager_would_admit(get(), tokens.data(), tokens.size(), options, &c),
              "mla_manager_would_admit");
        return c;
    }

    /// `mla_manager_append`.
    Growth append(MlaRequestId id, const std::vector<MlaTokenId> &tokens) {
        Growth g;
        g.new_block_ids.resize(tokens.size());  // at most one block per token
        g.copies.resize(MLA_MAX_COPIES_PER_APPEND);
        size_t num_new = 0, num_copies = 0;
        check(mla_manager_append(get(), id, tokens.data(), tokens.size(), g.new_block_ids.data(),
                                 g.new_block_ids.size(), &num_new, g.copies.data(),
                                 g.copies.size(), &num_copies),
              "mla_manager_append");
        g.new_block_ids.resize(num_new);
        g.copies.resize(num_copies);
        return g;
    }

    /// `mla_manager_reserve`.
    Growth reserve(MlaRequestId id, size_t total_slots) {
        Growth g;
        g.new_block_ids.resize((total_slots + block_size_ - 1) / block_size_);
        g.copies.resize(MLA_MAX_COPIES_PER_APPEND);
        size_t num_new = 0, num_copies = 0;
        check(mla_manager_reserve(get(), id, total_slots, g.new_block_ids.data(),
                                  g.new_block_ids.size(), &num_new, g.copies.data(),
                                  g.copies.size(), &num_copies),
              "mla_manager_reserve");
        g.new_block_ids.resize(num_new);
        g.copies.resize(num_copies);
        return g;
    }

    /// `mla_manager_append_batch`: `counts[i]` tokens to `ids[i]`, taken in
    /// order from `tokens` (`counts` empty: one each).
    BatchAppend append_batch(const std::vector<MlaRequestId> &ids,
                             const std::vector<MlaTokenId> &tokens,
                             const std::vector<size_t> &counts = {}) {
        if (!counts.empty() && counts.size() != ids.size()) {
            throw std::invalid_argument("append_batch: one count per request");
        }
        BatchAppend b;
        size_t most_new = 0;
        for (size_t i = 0; i < ids.size(); i++) {
            size_t k = counts.empty() ? 1 : counts[i];
            most_new += (k + block_size_ - 1) / block_size_;
        }
        b.new_block_ids.resize(most_new);
        b.new_block_counts.resize(ids.size());
        b.copies.resize(ids.size() * MLA_MAX_COPIES_PER_APPEND);
        b.slots.resize(tokens.size());
        size_t num_new = 0, num_copies = 0, num_slots = 0;
        check(mla_manager_append_batch(get(), ids.data(), ids.size(), tokens.data(),
                                       counts.empty() ? nullptr : counts.data(),
                                       b.new_block_ids.data(), b.new_block_ids.size(),
                                       b.new_block_counts.data(), &num_new, b.copies.data(),
                                       b.copies.size(), &num_copies, b.slots.data(),
                                       b.slots.size(), &num_slots),
              "mla_manager_append_batch");
        b.new_block_ids.resize(num_new);
        b.copies.resize(num_copies);
        b.slots.resize(num_slots);
        return b;
    }

    /// `mla_manager_fill_block_tables` into the caller's arrays: `tables`
    /// holds `num_requests * max_blocks` values, `slots` `slots_cap`;
    /// `positions` null for no slots. Throws mla::Error (status
    /// MLA_STATUS_BUFFER_TOO_SMALL) when they are too small.
    TableSizes fill_block_tables(const MlaRequestId *ids, size_t num_requests, int32_t *tables,
                                 size_t max_blocks, int32_t pad,
                                 const MlaPositionRange *positions, int64_t *slots,
                                 size_t slots_cap) const {
        TableSizes s;
        check(mla_manager_fill_block_tables(get(), ids, num_requests, tables, max_blocks, pad,
                                            positions, slots, slots_cap, &s.max_blocks,
                                            &s.num_slots),
              "mla_manager_fill_block_tables");
        return s;
    }

    /// `mla_manager_fill_block_tables` into vectors sized by the call:
    /// rows as wide as the longest table (at least `min_width`), the slots
    /// of `positions` (empty: none).
    BlockTables block_tables(const std::vector<MlaRequestId> &ids, int32_t pad,
                             const std::vector<MlaPositionRange> &positions = {},
                             size_t min_width = 0) const {
        if (!positions.empty() && positions.size() != ids.size()) {
            throw std::invalid_argument("block_tables: one position range per request");
        }
        BlockTables t;
        t.max_blocks = min_width;
        for (;;) {
            t.tables.resize(ids.size() * t.max_blocks);
            TableSizes need;
            MlaStatus status = mla_manager_fill_block_tables(
                get(), ids.data(), ids.size(), t.tables.data(), t.max_blocks, pad,
                positions.empty() ? nullptr : positions.data(), t.slots.data(), t.slots.size(),
                &need.max_blocks, &need.num_slots);
            if (status == MLA_STATUS_BUFFER_TOO_SMALL) {
                t.max_blocks = std::max(t.max_blocks, need.max_blocks);
                t.slots.resize(std::max(t.slots.size(), need.num_slots));
                continue;
            }
            check(status, "mla_manager_fill_block_tables");
            t.slots.resize(need.num_slots);
            return t;
        }
    }

    /// `mla_manager_free_batch`.
    void free_batch(const std::vector<MlaRequestId> &ids) {
        check(mla_manager_free_batch(get(), ids.data(), ids.size()), "mla_manager_free_batch");
    }

    /// `mla_manager_commit`.
    void commit(MlaRequestId id, size_t num_computed_tokens) {
        check(mla_manager_commit(get(), id, num_computed_tokens), "mla_manager_commit");
    }

    /// `mla_manager_fork`.
    void fork(MlaRequestId parent, MlaRequestId child) {
        check(mla_manager_fork(get(), parent, child), "mla_manager_fork");
    }

    /// `mla_manager_free`.
    void free(MlaRequestId id) { check(mla_manager_free(get(), id), "mla_manager_free"); }

    /// `mla_manager_block_table`.
    std::vector<MlaBlockId> block_table(MlaRequestId id) const {
        std::vector<MlaBlockId> t;
        detail::fill(t, "mla_manager_block_table", [&](MlaBlockId *ids, size_t cap, size_t *n) {
            return mla_manager_block_table(get(), id, ids, cap, n);
        });
        return t;
    }

    /// `mla_manager_slot_mapping` of positions `start .. end`.
    std::vector<int64_t> slot_mapping(MlaRequestId id, size_t start, size_t end) const {
        std::vector<int64_t> s(end > start ? end - start : 0);
        size_t n = 0;
        check(mla_manager_slot_mapping(get(), id, start, end, s.data(), s.size(), &n),
              "mla_manager_slot_mapping");
        s.resize(n);
        return s;
    }

    /// `mla_manager_num_tokens`.
    size_t num_tokens(MlaRequestId id) const {
        return query(mla_manager_num_tokens, id, "mla_manager_num_tokens");
    }

    /// `mla_manager_num_computed_tokens`.
    size_t num_computed_tokens(MlaRequestId id) const {
        return query(mla_manager_num_computed_tokens, id, "mla_manager_num_computed_tokens");
    }

    /// `mla_manager_capacity`.
    size_t capacity(MlaRequestId id) const {
        return query(mla_manager_capacity, id, "mla_manager_capacity");
    }

    /// `mla_manager_pin`; returns the tokens pinned.
    size_t pin(const std::vector<MlaTokenId> &tokens, const MlaExtraKeys *keys = nullptr) {
        size_t n = 0;
        check(mla_manager_pin(get(), tokens.data(), tokens.size(), keys, &n), "mla_manager_pin");
        return n;
    }

    /// `mla_manager_unpin`; returns the tokens unpinned.
    size_t unpin(const std::vector<MlaTokenId> &tokens, const MlaExtraKeys *keys = nullptr) {
        size_t n = 0;
        check(mla_manager_unpin(get(), tokens.data(), tokens.size(), keys, &n), "mla_manager_unpin");
        return n;
    }

    /// `mla_manager_stats`.
    MlaCacheStats stats() const {
        MlaCacheStats s{};
        check(mla_manager_stats(get(), &s), "mla_manager_stats");
        return s;
    }

    /// `mla_manager_num_free_blocks`.
    size_t num_free_blocks() const {
        size_t n = 0;
        check(mla_manager_num_free_blocks(get(), &n), "mla_manager_num_free_blocks");
        return n;
    }

    /// `mla_manager_evict`; returns how many were evicted.
    size_t evict(size_t num_blocks) {
        size_t n = 0;
        check(mla_manager_evict(get(), num_blocks, &n), "mla_manager_evict");
        return n;
    }

    /// `mla_manager_take_events`.
    EventList take_events() {
        MlaEventList *list = nullptr;
        check(mla_manager_take_events(get(), &list), "mla_manager_take_events");
        return EventList(list);
    }

    /// `mla_manager_check_invariants`.
    void check_invariants() const {
        check(mla_manager_check_invariants(get()), "mla_manager_check_invariants");
    }

    MlaManager *get() const noexcept { return handle_.get(); }

private:
    size_t query(MlaStatus (*call)(const MlaManager *, MlaRequestId, size_t *), MlaRequestId id,
                 const char *name) const {
        size_t n = 0;
        check(call(get(), id, &n), name);
        return n;
    }

    using Handle = detail::Handle<MlaManager, mla_manager_destroy>;
    Handle handle_;
    size_t block_size_ = 1;
};

/// A latent store (`mla_store_*`).
class Store {
public:
    /// `mla_store_create_host`.
    static Store host(const Config &config, bool huge_pages = false) {
        MlaStore *s = nullptr;
        check(mla_store_create_host(config.get(), huge_pages, &s), "mla_store_create_host");
        return Store(s);
    }

    /// `mla_store_create_cuda`.
    static Store cuda(const Config &config, size_t device_ordinal) {
        MlaStore *s = nullptr;
        check(mla_store_create_cuda(config.get(), device_ordinal, &s), "mla_store_create_cuda");
        return Store(s);
    }

    /// `mla_store_write` of one layer's latents to `slots`.
    void write(size_t layer, const MlaMatrix &c_kv, const MlaMatrix &k_pe,
               const std::vector<int64_t> &slots, void *stream = nullptr) const {
        check(mla_store_write(get(), layer, &c_kv, &k_pe, slots.data(), slots.size(), stream),
              "mla_store_write");
    }

    /// `mla_store_gather` of one layer's blocks into `out`.
    void gather(size_t layer, const std::vector<MlaBlockId> &block_table, const MlaMatrix &out,
                void *stream = nullptr) const {
        check(mla_store_gather(get(), layer, block_table.data(), block_table.size(), &out, stream),
              "mla_store_gather");
    }

    /// `mla_store_copy_blocks`.
    void copy_blocks(const std::vector<MlaBlockCopy> &copies, void *stream = nullptr) const {
        check(mla_store_copy_blocks(get(), copies.data(), copies.size(), stream),
              "mla_store_copy_blocks");
    }

    /// `mla_store_layer_view`.
    MlaLayerView layer_view(size_t layer) const {
        MlaLayerView v{};
        check(mla_store_layer_view(get(), layer, &v), "mla_store_layer_view");
        return v;
    }

    /// `mla_store_get_config`.
    MlaConfigInfo info() const {
        MlaConfigInfo info{};
        check(mla_store_get_config(get(), &info), "mla_store_get_config");
        return info;
    }

    MlaStore *get() const noexcept { return handle_.get(); }

private:
    explicit Store(MlaStore *s) noexcept : handle_(s) {}
    detail::Handle<MlaStore, mla_store_destroy> handle_;
};

/// A tiered cache over a manager and a store (`mla_tiered_*`).
class TieredCache {
public:
    /// `mla_tiered_create`; the cache shares `store`'s memory (either
    /// object may be destroyed first). `options` null: no lower tier.
    TieredCache(const Config &config, const Store &store, const MlaTierOptions *options = nullptr) {
        MlaTieredCache *c = nullptr;
        check(mla_tiered_create(config.get(), store.get(), options, &c), "mla_tiered_create");
        handle_ = Handle(c);
    }

    /// `mla_tiered_admit`.
    TieredAdmission admit(MlaRequestId id, const std::vector<MlaTokenId> &tokens,
                          const MlaAdmitOptions *options = nullptr) {
        TieredAdmission a;
        detail::fill(a.block_ids, "mla_tiered_admit", [&](MlaBlockId *ids, size_t cap, size_t *n) {
            return mla_tiered_admit(get(), id, tokens.data(), tokens.size(), options, ids, cap, n,
                                    &a.num_cached_tokens, &a.hits);
        });
        return a;
    }

    /// `mla_tiered_lookup`.
    MlaTierHits lookup(const std::vector<MlaTokenId> &tokens, const MlaExtraKeys *keys = nullptr) const {
        MlaTierHits h{};
        check(mla_tiered_lookup(get(), tokens.data(), tokens.size(), keys, &h), "mla_tiered_lookup");
        return h;
    }

    /// `mla_tiered_append`.
    Growth append(MlaRequestId id, const std::vector<MlaTokenId> &tokens) {
        Growth g;
        g.new_block_ids.resize(tokens.size());
        g.copies.resize(MLA_MAX_COPIES_PER_APPEND);
        size_t num_new = 0, num_copies = 0;
        check(mla_tiered_append(get(), id, tokens.data(), tokens.size(), g.new_block_ids.data(),
                                g.new_block_ids.size(), &num_new, g.copies.data(), g.copies.size(),
                                &num_copies),
              "mla_tiered_append");
        g.new_block_ids.resize(num_new);
        g.copies.resize(num_copies);
        return g;
    }

    /// `mla_tiered_commit`.
    void commit(MlaRequestId id, size_t num_computed_tokens) {
        check(mla_tiered_commit(get(), id, num_computed_tokens), "mla_tiered_commit");
    }

    /// `mla_tiered_fork`.
    void fork(MlaRequestId parent, MlaRequestId child) {
        check(mla_tiered_fork(get(), parent, child), "mla_tiered_fork");
    }

    /// `mla_tiered_free`.
    void free(MlaRequestId id) { check(mla_tiered_free(get(), id), "mla_tiered_free"); }

    /// `mla_tiered_block_table`.
    std::vector<MlaBlockId> block_table(MlaRequestId id) const {
        std::vector<MlaBlockId> t;
        detail::fill(t, "mla_tiered_block_table", [&](MlaBlockId *ids, size_t cap, size_t *n) {
            return mla_tiered_block_table(get(), id, ids, cap, n);
        });
        return t;
    }

    /// `mla_tiered_slot_mapping` of positions `start .. end`.
    std::vector<int64_t> slot_mapping(MlaRequestId id, size_t start, size_t end) const {
        std::vector<int64_t> s(end > start ? end - start : 0);
        size_t n = 0;
        check(mla_tiered_slot_mapping(get(), id, start, end, s.data(), s.size(), &n),
              "mla_tiered_slot_mapping");
        s.resize(n);
        return s;
    }

    /// `mla_tiered_stats`.
    MlaTierStats stats() const {
        MlaTierStats s{};
        check(mla_tiered_stats(get(), &s), "mla_tiered_stats");
        return s;
    }

    /// `mla_tiered_flush_remote`; whether everything was written in time.
    bool flush_remote(uint64_t timeout_ms) const {
        bool done = false;
        check(mla_tiered_flush_remote(get(), timeout_ms, &done), "mla_tiered_flush_remote");
        return done;
    }

    /// `mla_tiered_take_events`.
    EventList take_events() {
        MlaEventList *list = nullptr;
        check(mla_tiered_take_events(get(), &list), "mla_tiered_take_events");
        return EventList(list);
    }

    MlaTieredCache *get() const noexcept { return handle_.get(); }

private:
    using Handle = detail::Handle<MlaTieredCache, mla_tiered_destroy>;
    Handle handle_;
};

/// A KV event publisher on vLLM's wire (`mla_publisher_*`).
class Publisher {
public:
    /// `mla_publisher_create`.
    explicit Publisher(const MlaPublisherOptions &options) {
        MlaPublisher *p = nullptr;
        check(mla_publisher_create(&options, &p), "mla_publisher_create");
        handle_ = Handle(p);
    }

    /// `mla_publisher_publish` of a manager's events; returns those accepted.
    size_t publish(Manager &manager) const {
        size_t n = 0;
        check(mla_publisher_publish(get(), manager.get(), &n), "mla_publisher_publish");
        return n;
    }

    /// `mla_publisher_publish_tiered`; returns the events accepted.
    size_t publish(TieredCache &cache) const {
        size_t n = 0;
        check(mla_publisher_publish_tiered(get(), cache.get(), &n), "mla_publisher_publish_tiered");
        return n;
    }

    /// `mla_publisher_flush`; whether everything was sent in time.
    bool flush(uint64_t timeout_ms) const {
        bool sent = false;
        check(mla_publisher_flush(get(), timeout_ms, &sent), "mla_publisher_flush");
        return sent;
    }

    /// `mla_publisher_stats`.
    MlaPublisherStats stats() const {
        MlaPublisherStats s{};
        check(mla_publisher_stats(get(), &s), "mla_publisher_stats");
        return s;
    }

    /// `mla_publisher_endpoint`: the PUB socket's bound endpoint.
    std::string endpoint() const {
        const char *e = nullptr;
        check(mla_publisher_endpoint(get(), &e), "mla_publisher_endpoint");
        return e;
    }

    MlaPublisher *get() const noexcept { return handle_.get(); }

private:
    using Handle = detail::Handle<MlaPublisher, mla_publisher_destroy>;
    Handle handle_;
};

}  // namespace mla

#endif
