// mla_cache from C++: admit, append, fork and free requests on a block
// manager, and write/gather their latents on a host store.
//
// Build (after `cargo build --release -p mla-cache-capi`, from the repository root):
//   g++ -std=c++17 -O2 examples/cpp/example.cpp -Iinclude -Ltarget/release
//       -lmla_cache -Wl,-rpath,$PWD/target/release -o example
// or, once installed (scripts/install-capi.sh PREFIX):
//   g++ -std=c++17 example.cpp $(pkg-config --cflags --libs mla_cache) -o example
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "mla_cache.h"

namespace {

// Throws with the library's message unless `status` is MLA_STATUS_OK.
void check(MlaStatus status, const char *what) {
    if (status != MLA_STATUS_OK) {
        throw std::runtime_error(std::string(what) + ": " + mla_status_name(status) + ": " +
                                 mla_last_error());
    }
}

// Owning handles: the destroy functions as deleters.
struct ConfigDeleter {
    void operator()(MlaConfig *c) const { mla_config_destroy(c); }
};
struct ManagerDeleter {
    void operator()(MlaManager *m) const { mla_manager_destroy(m); }
};
struct StoreDeleter {
    void operator()(MlaStore *s) const { mla_store_destroy(s); }
};
using Config = std::unique_ptr<MlaConfig, ConfigDeleter>;
using Manager = std::unique_ptr<MlaManager, ManagerDeleter>;
using Store = std::unique_ptr<MlaStore, StoreDeleter>;

// Admits a request; returns its block table.
std::vector<MlaBlockId> admit(MlaManager *m, MlaRequestId id, const std::vector<MlaTokenId> &prompt,
                              size_t decode_slots, size_t *cached) {
    MlaAdmitOptions options{};
    options.decode_slots = decode_slots;
    std::vector<MlaBlockId> table(8);
    size_t n = 0;
    MlaStatus s = mla_manager_admit(m, id, prompt.data(), prompt.size(), &options, table.data(),
                                    table.size(), &n, cached);
    if (s == MLA_STATUS_BUFFER_TOO_SMALL) {  // n holds the size needed
        table.resize(n);
        s = mla_manager_admit(m, id, prompt.data(), prompt.size(), &options, table.data(),
                              table.size(), &n, cached);
    }
    check(s, "admit");
    table.resize(n);
    return table;
}

std::vector<int64_t> slots(MlaManager *m, MlaRequestId id, size_t start, size_t end) {
    std::vector<int64_t> out(end - start);
    size_t n = 0;
    check(mla_manager_slot_mapping(m, id, start, end, out.data(), out.size(), &n), "slot_mapping");
    return out;
}

}  // namespace

int main() {
    try {
        std::printf("mla_cache %s (header %d.%d.%d)\n", mla_version(), MLA_CACHE_VERSION_MAJOR,
                    MLA_CACHE_VERSION_MINOR, MLA_CACHE_VERSION_PATCH);

        // DeepSeek-V3 geometry, reduced to 2 layers to keep the example small.
        MlaConfig *raw_config = nullptr;
        check(mla_config_from_preset("deepseek-v3", 64, MLA_DTYPE_BF16, &raw_config), "preset");
        Config config(raw_config);
        check(mla_config_set_num_layers(config.get(), 2), "set_num_layers");
        MlaConfigSizes sizes;
        check(mla_config_sizes(config.get(), &sizes), "sizes");
        std::printf("%zu bytes per token per layer, %zu bytes in all\n",
                    sizes.bytes_per_token_per_layer, sizes.total_bytes);

        MlaManager *raw_manager = nullptr;
        MlaStore *raw_store = nullptr;
        check(mla_manager_create(config.get(), &raw_manager), "manager");
        Manager manager(raw_manager);
        check(mla_store_create_host(config.get(), false, &raw_store), "store");
        Store store(raw_store);

        // Two requests with the same 200-token prompt: the second reuses the
        // first's three full blocks.
        std::vector<MlaTokenId> prompt(200);
        for (size_t i = 0; i < prompt.size(); i++) prompt[i] = static_cast<MlaTokenId>(i * 7 % 1000);
        size_t cached = 0;
        std::vector<MlaBlockId> table = admit(manager.get(), 1, prompt, 56, &cached);
        std::printf("request 1: %zu blocks, %zu cached tokens\n", table.size(), cached);

        // Prefill: write the prompt's latents (here made up) into layer 0.
        const size_t nope = 512, rope = 64, width = nope + rope;
        std::vector<float> c_kv(prompt.size() * nope), k_pe(prompt.size() * rope);
        for (size_t i = 0; i < c_kv.size(); i++) c_kv[i] = static_cast<float>(i % 97) / 32.0f;
        for (size_t i = 0; i < k_pe.size(); i++) k_pe[i] = -static_cast<float>(i % 89) / 32.0f;
        std::vector<int64_t> prompt_slots = slots(manager.get(), 1, 0, prompt.size());
        MlaMatrix c{c_kv.data(), MLA_ELEM_TYPE_F32, prompt.size(), nope, 0};
        MlaMatrix k{k_pe.data(), MLA_ELEM_TYPE_F32, prompt.size(), rope, 0};
        check(mla_store_write(store.get(), 0, &c, &k, prompt_slots.data(), prompt_slots.size(), nullptr),
              "write");

        std::vector<MlaBlockId> table2 = admit(manager.get(), 2, prompt, 0, &cached);
        std::printf("request 2: %zu blocks, %zu cached tokens\n", table2.size(), cached);

        // Parallel sampling: fork request 1, then decode one token on each.
        check(mla_manager_fork(manager.get(), 1, 3), "fork");
        for (MlaRequestId id : {MlaRequestId{1}, MlaRequestId{3}}) {
            MlaTokenId token = static_cast<MlaTokenId>(4242 + id);
            MlaBlockId fresh[1];
            MlaBlockCopy copies[MLA_MAX_COPIES_PER_APPEND];
            size_t n_new = 0, n_copies = 0;
            check(mla_manager_append(manager.get(), id, &token, 1, fresh, 1, &n_new, copies,
                                     MLA_MAX_COPIES_PER_APPEND, &n_copies),
                  "append");
            // Copy-on-write of the shared partial tail, before writing into it.
            check(mla_store_copy_blocks(store.get(), copies, n_copies, nullptr), "copy_blocks");
            std::printf("request %llu: appended, %zu new blocks, %zu copies\n",
                        static_cast<unsigned long long>(id), n_new, n_copies);
        }

        // Gather request 3's first 200 tokens back (the tail came through the copy).
        std::vector<MlaBlockId> table3(8);
        size_t n = 0;
        check(mla_manager_block_table(manager.get(), 3, table3.data(), table3.size(), &n), "block_table");
        std::vector<float> out(prompt.size() * width);
        MlaMatrix o{out.data(), MLA_ELEM_TYPE_F32, prompt.size(), width, 0};
        check(mla_store_gather(store.get(), 0, table3.data(), n, &o, nullptr), "gather");
        size_t exact = 0;
        for (size_t t = 0; t < prompt.size(); t++) {
            exact += out[t * width + 3] == c_kv[t * nope + 3] && out[t * width + nope] == k_pe[t * rope];
        }
        std::printf("gathered %zu tokens, %zu bit-exact\n", prompt.size(), exact);

        MlaCacheStats stats;
        check(mla_manager_stats(manager.get(), &stats), "stats");
        std::printf("blocks: %llu used, %llu free, %llu cached; %llu copy-on-write\n",
                    static_cast<unsigned long long>(stats.used_blocks),
                    static_cast<unsigned long long>(stats.free_blocks),
                    static_cast<unsigned long long>(stats.cached_blocks),
                    static_cast<unsigned long long>(stats.cow_copies));

        for (MlaRequestId id : {1, 2, 3}) check(mla_manager_free(manager.get(), id), "free");
        check(mla_manager_stats(manager.get(), &stats), "stats");
        std::printf("after free: %llu of %llu blocks free\n",
                    static_cast<unsigned long long>(stats.free_blocks),
                    static_cast<unsigned long long>(stats.num_blocks));

        // Errors come back as statuses with a message.
        MlaStatus s = mla_manager_free(manager.get(), 1);
        std::printf("freeing request 1 again: %s (%s)\n", mla_status_name(s), mla_last_error());
        return exact == prompt.size() && stats.free_blocks == stats.num_blocks ? 0 : 1;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
