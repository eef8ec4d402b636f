/*
 * Exercises every function of the C API and every status it can return
 * without a GPU. Built and run by capi/tests/c_abi.rs and scripts/c-tests.sh
 * (which can run it under valgrind).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "fixture.h"

static MlaConfig *small_config(size_t num_blocks) { return fixture_config(num_blocks, 42); }

static MlaManager *small_manager(size_t num_blocks, bool events, size_t pin_budget) {
    MlaConfig *config = small_config(num_blocks);
    OK(mla_config_set_enable_events(config, events));
    OK(mla_config_set_pin_budget_blocks(config, true, pin_budget));
    return fixture_manager(config);
}

static void test_version_and_status(void) {
    char expected[64];
    snprintf(expected, sizeof expected, "%d.%d.%d", MLA_CACHE_VERSION_MAJOR,
             MLA_CACHE_VERSION_MINOR, MLA_CACHE_VERSION_PATCH);
    CHECK(strcmp(mla_version(), expected) == 0);
    CHECK(strcmp(mla_status_name(MLA_STATUS_OK), "MLA_STATUS_OK") == 0);
    CHECK(strcmp(mla_status_name(MLA_STATUS_OUT_OF_BLOCKS), "MLA_STATUS_OUT_OF_BLOCKS") == 0);
    CHECK(strcmp(mla_status_name(MLA_STATUS_BUFFER_TOO_SMALL), "MLA_STATUS_BUFFER_TOO_SMALL") == 0);
    CHECK(strcmp(mla_status_name(MLA_STATUS_PANIC), "MLA_STATUS_PANIC") == 0);
    CHECK(strcmp(mla_status_name(MLA_STATUS_OUT_OF_MEMORY), "MLA_STATUS_OUT_OF_MEMORY") == 0);
    for (int s = MLA_STATUS_OK; s <= MLA_STATUS_OUT_OF_MEMORY; s++) {
        CHECK(strncmp(mla_status_name(s), "MLA_STATUS_", 11) == 0);
        CHECK(strcmp(mla_status_name(s), "MLA_STATUS_UNKNOWN") != 0);
    }
    CHECK(strcmp(mla_status_name(MLA_STATUS_OUT_OF_MEMORY + 1), "MLA_STATUS_UNKNOWN") == 0);
    CHECK(strcmp(mla_status_name(-1), "MLA_STATUS_UNKNOWN") == 0);
}

static void test_config(void) {
    MlaConfig *config = NULL;
    MlaConfigSizes sizes;
    MlaConfigInfo info;
    size_t n = 0;

    /* Presets and derived sizes. */
    OK(mla_config_from_preset("deepseek-v3", 1024, MLA_DTYPE_FP8_DS_MLA, &config));
    OK(mla_config_sizes(config, &sizes));
    CHECK(sizes.bytes_per_token_per_layer == 656);
    CHECK(sizes.bytes_per_token == 61 * 656);
    CHECK(sizes.bytes_per_block_per_layer == 656 * 64);
    CHECK(sizes.bytes_per_block == 40016 * 64);
    CHECK(sizes.total_bytes == (size_t)40016 * 64 * 1024);
    CHECK(sizes.elements_per_token == 576);
    CHECK(sizes.num_tokens == 1024 * 64);
    CHECK(sizes.pin_budget == 512);
    OK(mla_config_blocks_for_bytes(config, 40016ull * 64 * 3 + 5, &n));
    CHECK(n == 3);
    OK(mla_config_get(config, &info));
    CHECK(info.num_layers == 61 && info.kv_lora_rank == 512 && info.rope_dim == 64);
    CHECK(info.dtype == MLA_DTYPE_FP8_DS_MLA && info.block_size == 64);
    CHECK(info.eviction == MLA_EVICTION_POLICY_KIND_ARC);
    CHECK(info.block_hash == MLA_BLOCK_HASH_KIND_XXH3);
    CHECK(info.enable_prefix_caching && info.cap_hit_at_last_token);
    CHECK(!info.has_hash_seed && !info.has_pin_budget_blocks && !info.verify_tokens);
    OK(mla_config_destroy(config));

    /* Aliases and case. */
    config = NULL;
    OK(mla_config_from_preset("DeepSeek_R1", 8, MLA_DTYPE_MXFP6, &config));
    OK(mla_config_sizes(config, &sizes));
    CHECK(sizes.bytes_per_token == 61 * 528);
    OK(mla_config_destroy(config));

    /* Bad presets, dtypes, strings and pointers. */
    config = NULL;
    EXPECT(mla_config_from_preset("gpt-4", 8, MLA_DTYPE_BF16, &config), MLA_STATUS_INVALID_CONFIG);
    CHECK(LAST_ERROR_HAS("mla_config_from_preset") && LAST_ERROR_HAS("gpt-4"));
    CHECK(config == NULL);
    EXPECT(mla_config_from_preset("deepseek-\xff\xfe", 8, MLA_DTYPE_BF16, &config),
           MLA_STATUS_INVALID_UTF8);
    CHECK(LAST_ERROR_HAS("UTF-8"));
    EXPECT(mla_config_from_preset(NULL, 8, MLA_DTYPE_BF16, &config), MLA_STATUS_NULL_POINTER);
    EXPECT(mla_config_from_preset("deepseek-v3", 8, MLA_DTYPE_BF16, NULL), MLA_STATUS_NULL_POINTER);
    EXPECT(mla_config_from_preset("deepseek-v3", 8, 7, &config), MLA_STATUS_INVALID_CONFIG);
    EXPECT(mla_config_create(8, NULL), MLA_STATUS_NULL_POINTER);
    CHECK(config == NULL);

    /* Every setter, read back. */
    OK(mla_config_create(16, &config));
    OK(mla_config_set_num_blocks(config, 32));
    OK(mla_config_set_block_size(config, 16));
    OK(mla_config_set_num_layers(config, 3));
    OK(mla_config_set_kv_lora_rank(config, 256));
    OK(mla_config_set_rope_dim(config, 32));
    OK(mla_config_set_dtype(config, MLA_DTYPE_MXFP6));
    OK(mla_config_set_eviction(config, MLA_EVICTION_POLICY_KIND_LRU));
    OK(mla_config_set_enable_prefix_caching(config, false));
    OK(mla_config_set_hash_seed(config, true, 1234));
    OK(mla_config_set_verify_tokens(config, true));
    OK(mla_config_set_pin_budget_blocks(config, true, 5));
    OK(mla_config_set_enable_events(config, true));
    OK(mla_config_set_cap_hit_at_last_token(config, false));
    OK(mla_config_get(config, &info));
    CHECK(info.max_pending_events == 100000);
    OK(mla_config_set_max_pending_events(config, 7));
    OK(mla_config_get(config, &info));
    CHECK(info.max_pending_events == 7);
    CHECK(info.num_blocks == 32 && info.block_size == 16 && info.num_layers == 3);
    CHECK(info.kv_lora_rank == 256 && info.rope_dim == 32 && info.dtype == MLA_DTYPE_MXFP6);
    CHECK(!info.enable_prefix_caching && info.has_hash_seed && info.hash_seed == 1234);
    CHECK(info.verify_tokens && info.has_pin_budget_blocks && info.pin_budget_blocks == 5);
    CHECK(info.enable_events && !info.cap_hit_at_last_token);
    OK(mla_config_validate(config));
    OK(mla_config_sizes(config, &sizes));
    CHECK(sizes.bytes_per_token_per_layer == 256 * 6 / 8 + 256 / 32 + 2 * 32);
    CHECK(sizes.pin_budget == 5);
    OK(mla_config_set_hash_seed(config, false, 0));
    OK(mla_config_set_pin_budget_blocks(config, false, 0));
    OK(mla_config_get(config, &info));
    CHECK(!info.has_hash_seed && !info.has_pin_budget_blocks);
    OK(mla_config_set_eviction(config, MLA_EVICTION_POLICY_KIND_ARC));
    OK(mla_config_get(config, &info));
    CHECK(info.eviction == MLA_EVICTION_POLICY_KIND_ARC);
    OK(mla_config_set_max_pending_events(config, 0));
    EXPECT(mla_config_validate(config), MLA_STATUS_INVALID_CONFIG);
    EXPECT(mla_config_set_max_pending_events(NULL, 1), MLA_STATUS_NULL_POINTER);
    OK(mla_config_set_max_pending_events(config, 7));
    /* An unknown policy value fails and changes nothing. */
    EXPECT(mla_config_set_eviction(config, 2), MLA_STATUS_INVALID_CONFIG);
    OK(mla_config_get(config, &info));
    CHECK(info.eviction == MLA_EVICTION_POLICY_KIND_ARC);
    OK(mla_config_set_eviction(config, MLA_EVICTION_POLICY_KIND_LRU));
    OK(mla_config_set_block_hash(config, MLA_BLOCK_HASH_KIND_SHA256_CBOR));
    OK(mla_config_get(config, &info));
    CHECK(info.block_hash == MLA_BLOCK_HASH_KIND_SHA256_CBOR);
    EXPECT(mla_config_set_block_hash(config, 3), MLA_STATUS_INVALID_CONFIG);
    OK(mla_config_get(config, &info));
    CHECK(info.block_hash == MLA_BLOCK_HASH_KIND_SHA256_CBOR);
    OK(mla_config_set_block_hash(config, MLA_BLOCK_HASH_KIND_XXH3));

    /* Invalid values are refused by the setters that can tell, else on use. */
    EXPECT(mla_config_set_dtype(config, 99), MLA_STATUS_INVALID_CONFIG);
    EXPECT(mla_config_set_eviction(config, 5), MLA_STATUS_INVALID_CONFIG);
    OK(mla_config_get(config, &info));
    CHECK(info.dtype == MLA_DTYPE_MXFP6);
    OK(mla_config_set_kv_lora_rank(config, 500));
    EXPECT(mla_config_validate(config), MLA_STATUS_INVALID_CONFIG);
    CHECK(LAST_ERROR_HAS("multiple of 32"));
    EXPECT(mla_config_sizes(config, &sizes), MLA_STATUS_INVALID_CONFIG);
    EXPECT(mla_config_blocks_for_bytes(config, 1 << 20, &n), MLA_STATUS_INVALID_CONFIG);
    OK(mla_config_set_kv_lora_rank(config, 512));
    OK(mla_config_set_num_blocks(config, 0));
    EXPECT(mla_config_validate(config), MLA_STATUS_INVALID_CONFIG);
    CHECK(LAST_ERROR_HAS("num_blocks"));
    OK(mla_config_set_num_blocks(config, 32));
    OK(mla_config_validate(config));
    EXPECT(mla_config_get(config, NULL), MLA_STATUS_NULL_POINTER);
    EXPECT(mla_config_sizes(config, NULL), MLA_STATUS_NULL_POINTER);
    EXPECT(mla_config_blocks_for_bytes(config, 1, NULL), MLA_STATUS_NULL_POINTER);

    /* Dtype helpers and model geometry. */
    MlaDtype dtype = MLA_DTYPE_BF16;
    OK(mla_dtype_from_name("FP8", &dtype));
    CHECK(dtype == MLA_DTYPE_FP8_DS_MLA);
    OK(mla_dtype_from_name("mxfp6", &dtype));
    CHECK(dtype == MLA_DTYPE_MXFP6);
    EXPECT(mla_dtype_from_name("int4", &dtype), MLA_STATUS_INVALID_CONFIG);
    EXPECT(mla_dtype_from_name("\xc3\x28", &dtype), MLA_STATUS_INVALID_UTF8);
    EXPECT(mla_dtype_from_name(NULL, &dtype), MLA_STATUS_NULL_POINTER);
    EXPECT(mla_dtype_from_name("bf16", NULL), MLA_STATUS_NULL_POINTER);
    CHECK(strcmp(mla_dtype_name(MLA_DTYPE_BF16), "bf16") == 0);
    CHECK(strcmp(mla_dtype_name(MLA_DTYPE_FP8_DS_MLA), "fp8_ds_mla") == 0);
    CHECK(strcmp(mla_dtype_name(MLA_DTYPE_MXFP6), "mxfp6") == 0);
    CHECK(strcmp(mla_dtype_name(MLA_DTYPE_NVFP4_DS_MLA), "nvfp4_ds_mla") == 0);
    OK(mla_dtype_from_name("nvfp4_ds_mla", &dtype));
    CHECK(dtype == MLA_DTYPE_NVFP4_DS_MLA);
    CHECK(mla_dtype_name(9) == NULL);
    OK(mla_dtype_bytes_per_token(MLA_DTYPE_BF16, 512, 64, &n));
    CHECK(n == 1152);
    OK(mla_dtype_bytes_per_token(MLA_DTYPE_FP8_DS_MLA, 512, 64, &n));
    CHECK(n == 656);
    OK(mla_dtype_bytes_per_token(MLA_DTYPE_MXFP6, 512, 64, &n));
    CHECK(n == 528);
    OK(mla_dtype_bytes_per_token(MLA_DTYPE_NVFP4_DS_MLA, 512, 64, &n));
    CHECK(n == 352);
    EXPECT(mla_dtype_bytes_per_token(MLA_DTYPE_FP8_DS_MLA, 500, 64, &n), MLA_STATUS_INVALID_CONFIG);
    EXPECT(mla_dtype_bytes_per_token(4, 512, 64, &n), MLA_STATUS_INVALID_CONFIG);
    EXPECT(mla_dtype_bytes_per_token(MLA_DTYPE_BF16, 512, 64, NULL), MLA_STATUS_NULL_POINTER);
    MlaModelGeometry g;
    OK(mla_model_geometry("kimi-k2", &g));
    CHECK(g.num_layers == 61 && g.num_heads == 64 && g.hidden_size == 7168);
    CHECK(g.kv_lora_rank == 512 && g.q_lora_rank == 1536 && g.qk_rope_head_dim == 64);
    CHECK(g.qk_nope_head_dim == 128 && g.v_head_dim == 128);
    OK(mla_model_geometry("deepseek-v2-lite", &g));
    CHECK(g.q_lora_rank == 0 && g.num_layers == 27);
    EXPECT(mla_model_geometry("llama", &g), MLA_STATUS_INVALID_CONFIG);
    EXPECT(mla_model_geometry(NULL, &g), MLA_STATUS_NULL_POINTER);
    EXPECT(mla_model_geometry("kimi-k2", NULL), MLA_STATUS_NULL_POINTER);

    /* Null, destroyed and foreign handles. */
    int not_a_handle = 0;
    EXPECT(mla_config_set_num_blocks(NULL, 1), MLA_STATUS_NULL_POINTER);
    EXPECT(mla_config_validate((const MlaConfig *)&not_a_handle), MLA_STATUS_INVALID_HANDLE);
    CHECK(LAST_ERROR_HAS("not a live MlaConfig"));
    OK(mla_config_destroy(config));
    EXPECT(mla_config_set_num_blocks(config, 1), MLA_STATUS_INVALID_HANDLE);
    EXPECT(mla_config_get(config, &info), MLA_STATUS_INVALID_HANDLE);
    EXPECT(mla_config_destroy(config), MLA_STATUS_INVALID_HANDLE);
    EXPECT(mla_config_destroy(NULL), MLA_STATUS_NULL_POINTER);
}

static void test_admission(void) {
    MlaManager *manager = small_manager(16, false, 8);
    MlaTokenId prompt[9];
    MlaBlockId ids[16], ids2[16];
    size_t n = 0, cached = 99;
    MlaAdmitOptions options;
    memset(&options, 0, sizeof options);
    fill_tokens(prompt, 9, 0);

    /* ceil((9 + 4) / 4) = 4 blocks. */
    options.decode_slots = 4;
    OK(mla_manager_admit(manager, 1, prompt, 9, &options, ids, 16, &n, &cached));
    CHECK(n == 4 && cached == 0);
    OK(mla_manager_num_free_blocks(manager, &n));
    CHECK(n == 12);

    /* A small buffer is reported with the needed length; nothing changes. */
    n = 0;
    EXPECT(mla_manager_admit(manager, 2, prompt, 9, &options, ids2, 2, &n, &cached),
           MLA_STATUS_BUFFER_TOO_SMALL);
    CHECK(n == 4);
    CHECK(LAST_ERROR_HAS("block_ids"));
    n = 0;
    EXPECT(mla_manager_admit(manager, 2, prompt, 9, &options, NULL, 0, &n, &cached),
           MLA_STATUS_BUFFER_TOO_SMALL);
    CHECK(n == 4);
    OK(mla_manager_num_free_blocks(manager, &n));
    CHECK(n == 12);
    EXPECT(mla_manager_block_table(manager, 2, ids2, 16, &n), MLA_STATUS_UNKNOWN_REQUEST);

    /* The same prompt hits its first two full blocks (capped at 8 of 9 tokens). */
    OK(mla_manager_admit(manager, 2, prompt, 9, NULL, ids2, 16, &n, &cached));
    CHECK(n == 3 && cached == 8);
    CHECK(ids2[0] == ids[0] && ids2[1] == ids[1] && ids2[2] != ids[2]);

    /* Argument errors. */
    EXPECT(mla_manager_admit(manager, 1, prompt, 9, NULL, ids2, 16, &n, &cached),
           MLA_STATUS_DUPLICATE_REQUEST);
    EXPECT(mla_manager_admit(manager, 3, prompt, 0, NULL, ids2, 16, &n, &cached),
           MLA_STATUS_EMPTY_INPUT);
    EXPECT(mla_manager_admit(manager, 3, NULL, 0, NULL, ids2, 16, &n, &cached),
           MLA_STATUS_EMPTY_INPUT);
    EXPECT(mla_manager_admit(manager, 3, NULL, 5, NULL, ids2, 16, &n, &cached),
           MLA_STATUS_NULL_POINTER);
    EXPECT(mla_manager_admit(manager, 3, prompt, 9, NULL, NULL, 16, &n, &cached),
           MLA_STATUS_NULL_POINTER);
    EXPECT(mla_manager_admit(manager, 3, prompt, 9, NULL, ids2, 16, NULL, &cached),
           MLA_STATUS_NULL_POINTER);
    EXPECT(mla_manager_admit(manager, 3, prompt, 9, NULL, ids2, 16, &n, NULL),
           MLA_STATUS_NULL_POINTER);
    EXPECT(mla_manager_admit(NULL, 3, prompt, 9, NULL, ids2, 16, &n, &cached),
           MLA_STATUS_NULL_POINTER);
    options.decode_slots = 100;
    EXPECT(mla_manager_admit(manager, 3, prompt, 9, &options, ids2, 16, &n, &cached),
           MLA_STATUS_REQUEST_TOO_LARGE);
    CHECK(LAST_ERROR_HAS("cache has 16"));
    options.decode_slots = 9 * BS - 9; /* 9 blocks; 16 - 4 - 1 = 11 free */
    OK(mla_manager_admit(manager, 3, prompt, 9, &options, ids2, 16, &n, &cached));
    CHECK(n == 9);
    EXPECT(mla_manager_admit(manager, 4, prompt, 9, &options, ids2, 16, &n, &cached),
           MLA_STATUS_OUT_OF_BLOCKS);
    CHECK(LAST_ERROR_HAS("out of blocks"));
    OK(mla_manager_free(manager, 3));

    /* Prefix matching. */
    OK(mla_manager_match_prefix(manager, prompt, 9, NULL, ids2, 16, &n, &cached));
    CHECK(n == 2 && cached == 8 && ids2[0] == ids[0]);
    EXPECT(mla_manager_match_prefix(manager, prompt, 9, NULL, ids2, 1, &n, &cached),
           MLA_STATUS_BUFFER_TOO_SMALL);
    CHECK(n == 2);
    OK(mla_manager_match_prefix(manager, prompt, 0, NULL, NULL, 0, &n, &cached));
    CHECK(n == 0 && cached == 0);
    EXPECT(mla_manager_match_prefix(manager, NULL, 3, NULL, ids2, 16, &n, &cached),
           MLA_STATUS_NULL_POINTER);
    EXPECT(mla_manager_match_prefix(manager, prompt, 9, NULL, ids2, 16, &n, NULL),
           MLA_STATUS_NULL_POINTER);

    /* Extra keys: a salt or an adapter isolates; multimodal inputs enter the hash. */
    MlaExtraKeys keys;
    memset(&keys, 0, sizeof keys);
    keys.salt = "tenant-a";
    OK(mla_manager_match_prefix(manager, prompt, 9, &keys, ids2, 16, &n, &cached));
    CHECK(n == 0 && cached == 0);
    memset(&options, 0, sizeof options);
    options.keys = keys;
    OK(mla_manager_admit(manager, 5, prompt, 9, &options, ids2, 16, &n, &cached));
    CHECK(cached == 0);
    OK(mla_manager_match_prefix(manager, prompt, 9, &keys, ids2, 16, &n, &cached));
    CHECK(n == 2 && ids2[0] != ids[0]);
    keys.salt = NULL;
    keys.adapter = "lora-x";
    OK(mla_manager_match_prefix(manager, prompt, 9, &keys, ids2, 16, &n, &cached));
    CHECK(n == 0);
    MlaMultiModalKey image = {"sha256:abc", 2, 3};
    keys.adapter = NULL;
    keys.mm = &image;
    keys.num_mm = 1;
    OK(mla_manager_match_prefix(manager, prompt, 9, &keys, ids2, 16, &n, &cached));
    CHECK(n == 0);
    options.keys = keys;
    OK(mla_manager_admit(manager, 6, prompt, 9, &options, ids2, 16, &n, &cached));
    OK(mla_manager_match_prefix(manager, prompt, 9, &keys, ids2, 16, &n, &cached));
    CHECK(n == 2);
    image.hash = NULL;
    EXPECT(mla_manager_match_prefix(manager, prompt, 9, &keys, ids2, 16, &n, &cached),
           MLA_STATUS_NULL_POINTER);
    keys.mm = NULL;
    EXPECT(mla_manager_match_prefix(manager, prompt, 9, &keys, ids2, 16, &n, &cached),
           MLA_STATUS_NULL_POINTER);
    keys.num_mm = 0;
    keys.salt = "\xff";
    EXPECT(mla_manager_match_prefix(manager, prompt, 9, &keys, ids2, 16, &n, &cached),
           MLA_STATUS_INVALID_UTF8);
    keys.salt = NULL;
    keys.adapter = "\xfe";
    options.keys = keys;
    EXPECT(mla_manager_admit(manager, 7, prompt, 9, &options, ids2, 16, &n, &cached),
           MLA_STATUS_INVALID_UTF8);

    OK(mla_manager_free(manager, 1));
    OK(mla_manager_free(manager, 2));
    OK(mla_manager_free(manager, 5));
    OK(mla_manager_free(manager, 6));
    EXPECT(mla_manager_free(manager, 1), MLA_STATUS_UNKNOWN_REQUEST);
    OK(mla_manager_num_free_blocks(manager, &n));
    CHECK(n == 16);
    OK(mla_manager_check_invariants(manager));
    OK(mla_manager_destroy(manager));
}

static void test_chunked_prefill(void) {
    MlaManager *manager = small_manager(8, false, 4);
    MlaTokenId prompt[12];
    MlaBlockId ids[8];
    size_t n = 0, cached = 0;
    MlaAdmitOptions options;
    memset(&options, 0, sizeof options);
    options.chunked_prefill = true;
    fill_tokens(prompt, 12, 100);

    OK(mla_manager_admit(manager, 1, prompt, 12, &options, ids, 8, &n, &cached));
    CHECK(n == 3);
    OK(mla_manager_match_prefix(manager, prompt, 12, NULL, ids, 8, &n, &cached));
    CHECK(n == 0);
    OK(mla_manager_commit(manager, 1, 8));
    OK(mla_manager_match_prefix(manager, prompt, 12, NULL, ids, 8, &n, &cached));
    CHECK(n == 2 && cached == 8);
    EXPECT(mla_manager_commit(manager, 1, 4), MLA_STATUS_INVALID_ARGUMENT);
    CHECK(LAST_ERROR_HAS("backwards"));
    EXPECT(mla_manager_commit(manager, 1, 13), MLA_STATUS_INVALID_ARGUMENT);
    EXPECT(mla_manager_commit(manager, 2, 4), MLA_STATUS_UNKNOWN_REQUEST);
    EXPECT(mla_manager_commit(NULL, 1, 4), MLA_STATUS_NULL_POINTER);
    OK(mla_manager_commit(manager, 1, 12));
    OK(mla_manager_match_prefix(manager, prompt, 12, NULL, ids, 8, &n, &cached));
    CHECK(n == 3);
    OK(mla_manager_check_invariants(manager));
    OK(mla_manager_destroy(manager));
}

static void test_append_fork_tables(void) {
    MlaManager *manager = small_manager(16, false, 8);
    MlaTokenId prompt[6], more[9];
    MlaBlockId ids[16], table[16], fresh[16];
    MlaBlockCopy copies[2];
    int64_t slots[32];
    size_t n = 0, cached = 0, n_new = 0, n_copies = 0;
    MlaAdmitOptions options;
    memset(&options, 0, sizeof options);
    options.decode_slots = 2; /* 8 slots: 2 blocks */
    fill_tokens(prompt, 6, 0);
    fill_tokens(more, 9, 1000);

    OK(mla_manager_admit(manager, 1, prompt, 6, &options, ids, 16, &n, &cached));
    CHECK(n == 2);

    /* Two tokens fill the reserved room: no new block, no copy. */
    OK(mla_manager_append(manager, 1, more, 2, fresh, 16, &n_new, copies, 2, &n_copies));
    CHECK(n_new == 0 && n_copies == 0);
    OK(mla_manager_num_tokens(manager, 1, &n));
    CHECK(n == 8);
    /* Five more: ceil(13 / 4) = 4 blocks, two new. */
    OK(mla_manager_append(manager, 1, more + 2, 5, fresh, 16, &n_new, copies, 2, &n_copies));
    CHECK(n_new == 2 && n_copies == 0);
    OK(mla_manager_block_table(manager, 1, table, 16, &n));
    CHECK(n == 4 && table[0] == ids[0] && table[1] == ids[1]);
    CHECK(table[2] == fresh[0] && table[3] == fresh[1]);

    /* Capacities are checked against the most an append can return. */
    n_new = n_copies = 0;
    EXPECT(mla_manager_append(manager, 1, more, 5, fresh, 1, &n_new, copies, 2, &n_copies),
           MLA_STATUS_BUFFER_TOO_SMALL);
    CHECK(n_new == 2 && n_copies == MLA_MAX_COPIES_PER_APPEND);
    EXPECT(mla_manager_append(manager, 1, more, 1, fresh, 16, &n_new, NULL, 0, &n_copies),
           MLA_STATUS_BUFFER_TOO_SMALL);
    CHECK(n_copies == 1);
    OK(mla_manager_num_tokens(manager, 1, &n));
    CHECK(n == 13);
    EXPECT(mla_manager_append(manager, 9, more, 1, fresh, 16, &n_new, copies, 2, &n_copies),
           MLA_STATUS_UNKNOWN_REQUEST);
    EXPECT(mla_manager_append(manager, 1, more, 0, fresh, 16, &n_new, copies, 2, &n_copies),
           MLA_STATUS_EMPTY_INPUT);
    EXPECT(mla_manager_append(manager, 1, NULL, 2, fresh, 16, &n_new, copies, 2, &n_copies),
           MLA_STATUS_NULL_POINTER);
    EXPECT(mla_manager_append(manager, 1, more, 1, fresh, 16, NULL, copies, 2, &n_copies),
           MLA_STATUS_NULL_POINTER);
    EXPECT(mla_manager_append(manager, 1, more, 1, fresh, 16, &n_new, copies, 2, NULL),
           MLA_STATUS_NULL_POINTER);

    /* Fork: the child shares the parent's blocks; appending to the shared
     * partial tail (13 tokens: block 3 holds one) copies it. */
    OK(mla_manager_fork(manager, 1, 2));
    OK(mla_manager_block_table(manager, 2, fresh, 16, &n));
    CHECK(n == 4 && memcmp(fresh, table, 4 * sizeof(MlaBlockId)) == 0);
    OK(mla_manager_append(manager, 2, more, 1, fresh, 16, &n_new, copies, 2, &n_copies));
    CHECK(n_new == 0 && n_copies == 1);
    CHECK(copies[0].src == table[3] && copies[0].dst != table[3]);
    OK(mla_manager_block_table(manager, 2, fresh, 16, &n));
    CHECK(n == 4 && fresh[3] == copies[0].dst && fresh[2] == table[2]);
    EXPECT(mla_manager_fork(manager, 7, 8), MLA_STATUS_UNKNOWN_REQUEST);
    EXPECT(mla_manager_fork(manager, 1, 2), MLA_STATUS_DUPLICATE_REQUEST);
    EXPECT(mla_manager_fork(NULL, 1, 3), MLA_STATUS_NULL_POINTER);

    /* Block tables and slot mappings. */
    EXPECT(mla_manager_block_table(manager, 1, table, 3, &n), MLA_STATUS_BUFFER_TOO_SMALL);
    CHECK(n == 4);
    EXPECT(mla_manager_block_table(manager, 1, NULL, 0, &n), MLA_STATUS_BUFFER_TOO_SMALL);
    EXPECT(mla_manager_block_table(manager, 1, table, 16, NULL), MLA_STATUS_NULL_POINTER);
    EXPECT(mla_manager_block_table(manager, 1, NULL, 16, &n), MLA_STATUS_NULL_POINTER);
    OK(mla_manager_slot_mapping(manager, 1, 2, 7, slots, 32, &n));
    CHECK(n == 5);
    for (size_t p = 2; p < 7; p++) {
        CHECK(slots[p - 2] == (int64_t)table[p / BS] * BS + (int64_t)(p % BS));
    }
    OK(mla_manager_slot_mapping(manager, 1, 0, 16, slots, 32, &n));
    CHECK(n == 16);
    EXPECT(mla_manager_slot_mapping(manager, 1, 0, 17, slots, 32, &n), MLA_STATUS_INVALID_ARGUMENT);
    EXPECT(mla_manager_slot_mapping(manager, 1, 5, 2, slots, 32, &n), MLA_STATUS_INVALID_ARGUMENT);
    EXPECT(mla_manager_slot_mapping(manager, 1, 0, 8, slots, 4, &n), MLA_STATUS_BUFFER_TOO_SMALL);
    CHECK(n == 8);
    EXPECT(mla_manager_slot_mapping(manager, 9, 0, 1, slots, 4, &n), MLA_STATUS_UNKNOWN_REQUEST);
    EXPECT(mla_manager_num_tokens(manager, 9, &n), MLA_STATUS_UNKNOWN_REQUEST);
    EXPECT(mla_manager_num_tokens(manager, 1, NULL), MLA_STATUS_NULL_POINTER);

    /* Stats: gauges add up; the copy is counted. */
    MlaCacheStats stats;
    OK(mla_manager_stats(manager, &stats));
    CHECK(stats.num_blocks == 16 && stats.free_blocks + stats.used_blocks == 16);
    CHECK(stats.used_blocks == 5 && stats.num_requests == 2 && stats.cow_copies == 1);
    double usage = 0;
    OK(mla_manager_usage(manager, &usage));
    CHECK(fabs(usage - 5.0 / 16.0) < 1e-12);
    EXPECT(mla_manager_stats(manager, NULL), MLA_STATUS_NULL_POINTER);
    EXPECT(mla_manager_usage(manager, NULL), MLA_STATUS_NULL_POINTER);
    EXPECT(mla_manager_num_free_blocks(manager, NULL), MLA_STATUS_NULL_POINTER);

    MlaConfigInfo info;
    OK(mla_manager_get_config(manager, &info));
    CHECK(info.block_size == BS && info.num_blocks == 16 && info.hash_seed == 42);
    EXPECT(mla_manager_get_config(manager, NULL), MLA_STATUS_NULL_POINTER);

    OK(mla_manager_free(manager, 1));
    OK(mla_manager_free(manager, 2));
    OK(mla_manager_stats(manager, &stats));
    CHECK(stats.free_blocks == 16 && stats.used_blocks == 0 && stats.num_requests == 0);
    OK(mla_manager_check_invariants(manager));
    OK(mla_manager_destroy(manager));
}

static void test_pins_reset_events(void) {
    MlaManager *manager = small_manager(8, true, 2);
    MlaTokenId prompt[13];
    MlaBlockId ids[8];
    size_t n = 0, cached = 0;
    MlaCacheStats stats;
    fill_tokens(prompt, 13, 7);

    OK(mla_manager_admit(manager, 1, prompt, 13, NULL, ids, 8, &n, &cached));
    CHECK(n == 4);

    /* Pins: two of the three cached blocks fit the budget of 2. */
    EXPECT(mla_manager_pin(manager, prompt, 12, NULL, &n), MLA_STATUS_PIN_BUDGET_EXCEEDED);
    CHECK(LAST_ERROR_HAS("budget 2"));
    OK(mla_manager_pin(manager, prompt, 8, NULL, &n));
    CHECK(n == 8);
    OK(mla_manager_pin(manager, prompt, 8, NULL, &n)); /* pins nest */
    OK(mla_manager_stats(manager, &stats));
    CHECK(stats.pinned_blocks == 2);
    OK(mla_manager_pin(manager, prompt + 1, 8, NULL, &n)); /* nothing cached: pins nothing */
    CHECK(n == 0);
    EXPECT(mla_manager_pin(manager, NULL, 8, NULL, &n), MLA_STATUS_NULL_POINTER);
    EXPECT(mla_manager_pin(manager, prompt, 8, NULL, NULL), MLA_STATUS_NULL_POINTER);
    EXPECT(mla_manager_unpin(manager, prompt + 1, 8, NULL, &n), MLA_STATUS_NOT_PINNED);

    /* Reset is refused while blocks are held (by the request, then the pins). */
    EXPECT(mla_manager_reset_prefix_cache(manager), MLA_STATUS_BLOCKS_IN_USE);
    OK(mla_manager_free(manager, 1));
    EXPECT(mla_manager_reset_prefix_cache(manager), MLA_STATUS_BLOCKS_IN_USE);
    OK(mla_manager_unpin(manager, prompt, 8, NULL, &n));
    CHECK(n == 8);
    OK(mla_manager_unpin(manager, prompt, 8, NULL, &n));
    EXPECT(mla_manager_unpin(manager, prompt, 8, NULL, &n), MLA_STATUS_NOT_PINNED);
    EXPECT(mla_manager_unpin(manager, prompt, 8, NULL, NULL), MLA_STATUS_NULL_POINTER);

    /* An adapter's blocks, then eviction by a prompt that needs every block. */
    MlaAdmitOptions options;
    memset(&options, 0, sizeof options);
    options.keys.adapter = "lora-x";
    OK(mla_manager_admit(manager, 2, prompt, 5, &options, ids, 8, &n, &cached));
    OK(mla_manager_free(manager, 2));
    MlaTokenId other[32];
    fill_tokens(other, 32, 5000);
    OK(mla_manager_admit(manager, 3, other, 32, NULL, ids, 8, &n, &cached));
    OK(mla_manager_free(manager, 3));
    OK(mla_manager_stats(manager, &stats));
    CHECK(stats.evictions == 4);
    OK(mla_manager_reset_prefix_cache(manager));
    OK(mla_manager_stats(manager, &stats));
    CHECK(stats.cached_blocks == 0 && stats.free_blocks == 8);
    EXPECT(mla_manager_reset_prefix_cache(NULL), MLA_STATUS_NULL_POINTER);

    /* Events, in order: stored (3 blocks), stored (adapter, 1), removed x4,
     * stored (other, 8 blocks), cleared. */
    MlaEventList *list = NULL;
    MlaEvent e;
    OK(mla_manager_take_events(manager, &list));
    OK(mla_event_list_len(list, &n));
    CHECK(n == 8);
    OK(mla_event_list_get(list, 0, &e));
    CHECK(e.kind == MLA_EVENT_KIND_BLOCK_STORED && e.num_block_hashes == 3);
    CHECK(!e.has_parent && e.block_size == BS && e.num_token_ids == 12 && e.adapter == NULL);
    CHECK(strcmp(e.medium, "GPU") == 0);
    CHECK(e.token_ids[0] == 7 && e.token_ids[11] == 18);
    /* External hashes of 7..19 under seed 42, as Rust's and Python's tests assert. */
    CHECK(e.block_hashes[0] == UINT64_C(5565884646872614745));
    CHECK(e.block_hashes[1] == UINT64_C(11616947711106753066));
    CHECK(e.block_hashes[2] == UINT64_C(6371776174528016060));
    uint64_t first = e.block_hashes[0];
    OK(mla_event_list_get(list, 1, &e));
    CHECK(e.kind == MLA_EVENT_KIND_BLOCK_STORED && e.num_block_hashes == 1);
    CHECK(e.adapter != NULL && strcmp(e.adapter, "lora-x") == 0);
    CHECK(e.block_hashes[0] != first);
    for (size_t i = 2; i < 6; i++) {
        OK(mla_event_list_get(list, i, &e));
        CHECK(e.kind == MLA_EVENT_KIND_BLOCK_REMOVED && e.num_block_hashes == 1);
    }
    OK(mla_event_list_get(list, 6, &e));
    CHECK(e.kind == MLA_EVENT_KIND_BLOCK_STORED && e.num_block_hashes == 8);
    OK(mla_event_list_get(list, 7, &e));
    CHECK(e.kind == MLA_EVENT_KIND_ALL_BLOCKS_CLEARED && e.num_block_hashes == 0);
    EXPECT(mla_event_list_get(list, 8, &e), MLA_STATUS_INVALID_ARGUMENT);
    EXPECT(mla_event_list_get(list, 0, NULL), MLA_STATUS_NULL_POINTER);
    EXPECT(mla_event_list_len(list, NULL), MLA_STATUS_NULL_POINTER);
    OK(mla_event_list_destroy(list));
    EXPECT(mla_event_list_len(list, &n), MLA_STATUS_INVALID_HANDLE);
    EXPECT(mla_event_list_destroy(list), MLA_STATUS_INVALID_HANDLE);
    EXPECT(mla_event_list_destroy(NULL), MLA_STATUS_NULL_POINTER);
    /* Taken events are gone. */
    OK(mla_manager_take_events(manager, &list));
    OK(mla_event_list_len(list, &n));
    CHECK(n == 0);
    OK(mla_event_list_destroy(list));
    EXPECT(mla_manager_take_events(manager, NULL), MLA_STATUS_NULL_POINTER);

    OK(mla_manager_check_invariants(manager));
    OK(mla_manager_destroy(manager));
}

static void test_reserve_and_evict(void) {
    MlaManager *manager = small_manager(8, true, 2);
    MlaTokenId prompt[9], other = 500;
    MlaBlockId ids[8], table[8], fresh[8];
    MlaBlockCopy copies[1];
    size_t n = 0, cached = 0, n_new = 0, n_copies = 0;
    MlaCacheStats stats;
    MlaEventList *list = NULL;
    MlaEvent e;
    fill_tokens(prompt, 9, 0);

    /* 9 tokens: two full blocks and one holding a token. */
    OK(mla_manager_admit(manager, 1, prompt, 9, NULL, ids, 8, &n, &cached));
    CHECK(n == 3);
    OK(mla_manager_take_events(manager, &list));
    OK(mla_event_list_destroy(list));

    /* Room for 5 lookahead slots past the 9 tokens: one block, no token. */
    OK(mla_manager_reserve(manager, 1, 14, fresh, 8, &n_new, copies, 1, &n_copies));
    CHECK(n_new == 1 && n_copies == 0);
    OK(mla_manager_block_table(manager, 1, table, 8, &n));
    CHECK(n == 4 && table[3] == fresh[0]);
    OK(mla_manager_num_tokens(manager, 1, &n));
    CHECK(n == 9);
    /* Never shrinks. */
    OK(mla_manager_reserve(manager, 1, 4, fresh, 8, &n_new, copies, 1, &n_copies));
    CHECK(n_new == 0 && n_copies == 0);
    /* Capacities are checked against ceil(total_slots / block_size) ids and one copy. */
    n_new = n_copies = 0;
    EXPECT(mla_manager_reserve(manager, 1, 20, fresh, 4, &n_new, copies, 1, &n_copies),
           MLA_STATUS_BUFFER_TOO_SMALL);
    CHECK(n_new == 5 && n_copies == MLA_MAX_COPIES_PER_APPEND);
    EXPECT(mla_manager_reserve(manager, 1, 20, fresh, 8, &n_new, NULL, 0, &n_copies),
           MLA_STATUS_BUFFER_TOO_SMALL);
    EXPECT(mla_manager_reserve(manager, 1, 33, fresh, 8, &n_new, copies, 1, &n_copies),
           MLA_STATUS_REQUEST_TOO_LARGE);
    OK(mla_manager_admit(manager, 2, &other, 1, NULL, ids + 4, 4, &n, &cached));
    EXPECT(mla_manager_reserve(manager, 1, 32, fresh, 8, &n_new, copies, 1, &n_copies),
           MLA_STATUS_OUT_OF_BLOCKS);
    OK(mla_manager_free(manager, 2));
    EXPECT(mla_manager_reserve(manager, 9, 4, fresh, 8, &n_new, copies, 1, &n_copies),
           MLA_STATUS_UNKNOWN_REQUEST);
    EXPECT(mla_manager_reserve(manager, 1, 14, fresh, 8, NULL, copies, 1, &n_copies),
           MLA_STATUS_NULL_POINTER);
    EXPECT(mla_manager_reserve(manager, 1, 14, NULL, 8, &n_new, copies, 1, &n_copies),
           MLA_STATUS_NULL_POINTER);
    EXPECT(mla_manager_reserve(NULL, 1, 14, fresh, 8, &n_new, copies, 1, &n_copies),
           MLA_STATUS_NULL_POINTER);
    OK(mla_manager_block_table(manager, 1, table, 8, &n));
    CHECK(n == 4);

    /* Dropping blocks from the index: a pinned block is refused, a bad id
     * too, and neither changes anything. */
    OK(mla_manager_pin(manager, prompt, 4, NULL, &n));
    CHECK(n == 4);
    EXPECT(mla_manager_evict_blocks(manager, ids, 2, &n), MLA_STATUS_INVALID_ARGUMENT);
    CHECK(LAST_ERROR_HAS("pinned"));
    OK(mla_manager_unpin(manager, prompt, 4, NULL, &n));
    MlaBlockId bad[2] = {ids[1], 8};
    EXPECT(mla_manager_evict_blocks(manager, bad, 2, &n), MLA_STATUS_INVALID_BLOCK);
    EXPECT(mla_manager_evict_blocks(manager, NULL, 2, &n), MLA_STATUS_NULL_POINTER);
    EXPECT(mla_manager_evict_blocks(manager, ids, 2, NULL), MLA_STATUS_NULL_POINTER);
    EXPECT(mla_manager_evict_blocks(NULL, ids, 2, &n), MLA_STATUS_NULL_POINTER);
    OK(mla_manager_evict_blocks(manager, NULL, 0, &n));
    CHECK(n == 0);
    OK(mla_manager_stats(manager, &stats));
    CHECK(stats.cached_blocks == 2);
    /* The second block, in use: it leaves the index, the request keeps it. */
    OK(mla_manager_evict_blocks(manager, bad, 1, &n));
    CHECK(n == 1);
    OK(mla_manager_stats(manager, &stats));
    CHECK(stats.cached_blocks == 1 && stats.evictable_blocks == 0 && stats.evictions == 0);
    OK(mla_manager_block_table(manager, 1, table, 8, &n));
    CHECK(n == 4 && table[1] == ids[1]);

    /* Freed, only the first block is cached and evictable; evict it ahead of allocating. */
    OK(mla_manager_free(manager, 1));
    OK(mla_manager_stats(manager, &stats));
    CHECK(stats.evictable_blocks == 1 && stats.free_blocks == 8);
    OK(mla_manager_evict(manager, 5, &n));
    CHECK(n == 1);
    OK(mla_manager_evict(manager, 5, &n));
    CHECK(n == 0);
    OK(mla_manager_stats(manager, &stats));
    CHECK(stats.evictable_blocks == 0 && stats.cached_blocks == 0 && stats.evictions == 1);
    EXPECT(mla_manager_evict(manager, 1, NULL), MLA_STATUS_NULL_POINTER);
    EXPECT(mla_manager_evict(NULL, 1, &n), MLA_STATUS_NULL_POINTER);

    /* Both removals were announced. */
    OK(mla_manager_take_events(manager, &list));
    OK(mla_event_list_len(list, &n));
    CHECK(n == 2);
    for (size_t i = 0; i < 2; i++) {
        OK(mla_event_list_get(list, i, &e));
        CHECK(e.kind == MLA_EVENT_KIND_BLOCK_REMOVED && e.num_block_hashes == 1);
    }
    OK(mla_event_list_destroy(list));

    OK(mla_manager_check_invariants(manager));
    OK(mla_manager_destroy(manager));
}

static void test_manager_handles(void) {
    MlaConfig *config = small_config(0);
    MlaManager *manager = NULL;
    MlaBlockId ids[4];
    MlaTokenId token = 1;
    size_t n = 0, cached = 0;

    EXPECT(mla_manager_create(config, &manager), MLA_STATUS_INVALID_CONFIG);
    CHECK(manager == NULL);
    OK(mla_config_set_num_blocks(config, 4));
    EXPECT(mla_manager_create(config, NULL), MLA_STATUS_NULL_POINTER);
    EXPECT(mla_manager_create(NULL, &manager), MLA_STATUS_NULL_POINTER);
    OK(mla_manager_create(config, &manager));
    /* The manager keeps its copy of the configuration. */
    OK(mla_config_destroy(config));
    OK(mla_manager_admit(manager, 1, &token, 1, NULL, ids, 4, &n, &cached));
    /* A manager is not a configuration, nor the reverse. */
    EXPECT(mla_config_validate((const MlaConfig *)(void *)manager), MLA_STATUS_INVALID_HANDLE);
    EXPECT(mla_manager_free((MlaManager *)(void *)config, 1), MLA_STATUS_INVALID_HANDLE);
    EXPECT(mla_manager_check_invariants(NULL), MLA_STATUS_NULL_POINTER);
    OK(mla_manager_destroy(manager));
    /* Destroyed: every entry point reports it. */
    EXPECT(mla_manager_free(manager, 1), MLA_STATUS_INVALID_HANDLE);
    EXPECT(mla_manager_stats(manager, NULL), MLA_STATUS_NULL_POINTER);
    MlaCacheStats stats;
    EXPECT(mla_manager_stats(manager, &stats), MLA_STATUS_INVALID_HANDLE);
    EXPECT(mla_manager_admit(manager, 2, &token, 1, NULL, ids, 4, &n, &cached),
           MLA_STATUS_INVALID_HANDLE);
    EXPECT(mla_manager_destroy(manager), MLA_STATUS_INVALID_HANDLE);
    EXPECT(mla_manager_destroy(NULL), MLA_STATUS_NULL_POINTER);
}

/* bf16 bits of a float that bf16 represents exactly. */
static uint16_t bf16_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (uint16_t)(u >> 16);
}

/* A value exactly representable in bf16. */
static float value(size_t token, size_t i) {
    return (float)((int)((token * 131 + i * 7) % 64) - 32) * 0.125f;
}

static void test_store(void) {
    enum { T = 5, NOPE = 512, ROPE = 64, W = NOPE + ROPE, BLOCKS = 8 };
    MlaConfig *config = small_config(BLOCKS);
    MlaStore *store = NULL, *cuda = NULL;
    OK(mla_config_set_num_layers(config, 2));
    OK(mla_store_create_host(config, false, &store));
    MlaStatus s = mla_store_create_cuda(config, 0, &cuda);
#ifdef MLA_TEST_CUDA_FEATURE
    /* Built with the cuda feature: a store, or no driver/device/NVRTC here. */
    CHECK(s == MLA_STATUS_OK || s == MLA_STATUS_STORAGE);
    if (s == MLA_STATUS_OK) {
        OK(mla_store_destroy(cuda));
    }
#else
    CHECK(s == MLA_STATUS_UNSUPPORTED && cuda == NULL);
    CHECK(LAST_ERROR_HAS("cuda feature"));
#endif
    EXPECT(mla_store_create_host(config, false, NULL), MLA_STATUS_NULL_POINTER);
    EXPECT(mla_store_create_host(NULL, false, &cuda), MLA_STATUS_NULL_POINTER);
    MlaConfigInfo info;
    OK(mla_store_get_config(store, &info));
    CHECK(info.num_layers == 2 && info.num_blocks == BLOCKS && info.dtype == MLA_DTYPE_BF16);
    EXPECT(mla_store_get_config(store, NULL), MLA_STATUS_NULL_POINTER);

    /* Latents of 5 tokens; token 3 is skipped (slot -1). */
    static float c_kv[T][NOPE], k_pe[T][ROPE], out[T][W];
    static uint16_t out_bf16[T][W];
    for (size_t t = 0; t < T; t++) {
        for (size_t i = 0; i < NOPE; i++) c_kv[t][i] = value(t, i);
        for (size_t i = 0; i < ROPE; i++) k_pe[t][i] = value(t, NOPE + i);
    }
    MlaBlockId table[2] = {5, 2};
    int64_t slots[T];
    for (size_t t = 0; t < T; t++) slots[t] = (int64_t)table[t / BS] * BS + (int64_t)(t % BS);
    slots[3] = -1;
    MlaMatrix c = {c_kv, MLA_ELEM_TYPE_F32, T, NOPE, 0};
    MlaMatrix k = {k_pe, MLA_ELEM_TYPE_F32, T, ROPE, 0};
    OK(mla_store_write(store, 1, &c, &k, slots, T, NULL));

    MlaMatrix o = {out, MLA_ELEM_TYPE_F32, T, W, 0};
    OK(mla_store_gather(store, 1, table, 2, &o, NULL));
    int same = 1;
    for (size_t t = 0; t < T; t++) {
        for (size_t i = 0; i < W; i++) {
            float want = t == 3 ? 0.0f : (i < NOPE ? c_kv[t][i] : k_pe[t][i - NOPE]);
            same &= out[t][i] == want;
        }
    }
    CHECK(same);
    /* bf16 output, with a row stride wider than a row (first 3 tokens only). */
    static uint16_t wide[3][W + 8];
    MlaMatrix ow = {wide, MLA_ELEM_TYPE_BF16, 3, W, (W + 8) * sizeof(uint16_t)};
    OK(mla_store_gather(store, 1, table, 1, &ow, NULL));
    same = 1;
    for (size_t t = 0; t < 3; t++) {
        for (size_t i = 0; i < W; i++) same &= wide[t][i] == bf16_bits(out[t][i]);
    }
    CHECK(same);
    /* Layer 0 is untouched. */
    MlaMatrix ob = {out_bf16, MLA_ELEM_TYPE_BF16, T, W, 0};
    OK(mla_store_gather(store, 0, table, 2, &ob, NULL));
    CHECK(out_bf16[0][0] == 0 && out_bf16[4][W - 1] == 0);

    /* The raw view of layer 1 holds token 0 at its slot, bf16 little-endian. */
    MlaLayerView view;
    OK(mla_store_layer_view(store, 1, &view));
    CHECK(view.data != NULL && view.device_kind == MLA_DEVICE_KIND_HOST && view.device_ordinal == 0);
    CHECK(view.dtype == MLA_DTYPE_BF16);
    CHECK(view.shape[0] == BLOCKS && view.shape[1] == BS && view.shape[2] == 1152);
    CHECK(view.strides[0] == BS * 1152 && view.strides[1] == 1152 && view.strides[2] == 1);
    CHECK(view.len_bytes == (size_t)BLOCKS * BS * 1152);
    CHECK(view.layout.bytes_per_token == 1152 && view.layout.rope_offset == 1024);
    CHECK(view.layout.num_scales == 0);
    const unsigned char *bytes = (const unsigned char *)view.data + slots[0] * 1152;
    CHECK(bytes[2] == (bf16_bits(c_kv[0][1]) & 0xff) && bytes[3] == (bf16_bits(c_kv[0][1]) >> 8));
    EXPECT(mla_store_layer_view(store, 2, &view), MLA_STATUS_INVALID_ARGUMENT);
    EXPECT(mla_store_layer_view(store, 0, NULL), MLA_STATUS_NULL_POINTER);

    /* Copy-on-write: block 5 to block 7, in every layer. */
    MlaBlockCopy copy = {5, 7, 0};
    OK(mla_store_copy_blocks(store, &copy, 1, NULL));
    MlaBlockId copied[1] = {7};
    MlaMatrix o1 = {out_bf16, MLA_ELEM_TYPE_BF16, BS, W, 0};
    OK(mla_store_gather(store, 1, copied, 1, &o1, NULL));
    same = 1;
    for (size_t t = 0; t < BS; t++) {
        for (size_t i = 0; i < W; i++) same &= out_bf16[t][i] == bf16_bits(out[t][i]);
    }
    CHECK(same);
    MlaBlockCopy twice[2] = {{1, 3, 0}, {2, 3, 0}};
    EXPECT(mla_store_copy_blocks(store, twice, 2, NULL), MLA_STATUS_INVALID_ARGUMENT);
    MlaBlockCopy chain[2] = {{1, 3, 0}, {3, 4, 0}};
    EXPECT(mla_store_copy_blocks(store, chain, 2, NULL), MLA_STATUS_INVALID_ARGUMENT);
    MlaBlockCopy outside = {1, BLOCKS, 0};
    EXPECT(mla_store_copy_blocks(store, &outside, 1, NULL), MLA_STATUS_INVALID_BLOCK);
    EXPECT(mla_store_copy_blocks(store, NULL, 1, NULL), MLA_STATUS_NULL_POINTER);
    OK(mla_store_copy_blocks(store, NULL, 0, NULL));

    /* Argument errors change nothing. */
    EXPECT(mla_store_write(store, 2, &c, &k, slots, T, NULL), MLA_STATUS_INVALID_ARGUMENT);
    CHECK(LAST_ERROR_HAS("layer 2"));
    EXPECT(mla_store_write(store, 0, NULL, &k, slots, T, NULL), MLA_STATUS_NULL_POINTER);
    EXPECT(mla_store_write(store, 0, &c, NULL, slots, T, NULL), MLA_STATUS_NULL_POINTER);
    EXPECT(mla_store_write(store, 0, &c, &k, NULL, T, NULL), MLA_STATUS_NULL_POINTER);
    MlaMatrix bad = c;
    bad.data = NULL;
    EXPECT(mla_store_write(store, 0, &bad, &k, slots, T, NULL), MLA_STATUS_NULL_POINTER);
    bad = c;
    bad.elem = 9;
    EXPECT(mla_store_write(store, 0, &bad, &k, slots, T, NULL), MLA_STATUS_INVALID_ARGUMENT);
    bad = c;
    bad.cols = NOPE - 1;
    EXPECT(mla_store_write(store, 0, &bad, &k, slots, T, NULL), MLA_STATUS_INVALID_ARGUMENT);
    EXPECT(mla_store_write(store, 0, &c, &k, slots, T - 1, NULL), MLA_STATUS_INVALID_ARGUMENT);
    int64_t far[T] = {0, 1, 2, BLOCKS * BS, 4};
    EXPECT(mla_store_write(store, 0, &c, &k, far, T, NULL), MLA_STATUS_INVALID_ARGUMENT);
    CHECK(LAST_ERROR_HAS("out of range"));
    OK(mla_store_gather(store, 0, table, 2, &ob, NULL));
    CHECK(out_bf16[0][1] == 0);
    MlaMatrix half = {out_bf16, MLA_ELEM_TYPE_F16, T, W, 0};
    EXPECT(mla_store_gather(store, 1, table, 2, &half, NULL), MLA_STATUS_INVALID_ARGUMENT);
    EXPECT(mla_store_gather(store, 1, table, 1, &o, NULL), MLA_STATUS_INVALID_ARGUMENT);
    EXPECT(mla_store_gather(store, 1, NULL, 2, &o, NULL), MLA_STATUS_NULL_POINTER);
    EXPECT(mla_store_gather(store, 1, table, 2, NULL, NULL), MLA_STATUS_NULL_POINTER);
    MlaBlockId beyond[2] = {5, BLOCKS + 3};
    EXPECT(mla_store_gather(store, 1, beyond, 2, &o, NULL), MLA_STATUS_INVALID_BLOCK);

    OK(mla_store_destroy(store));
    EXPECT(mla_store_layer_view(store, 0, &view), MLA_STATUS_INVALID_HANDLE);
    EXPECT(mla_store_write(store, 0, &c, &k, slots, T, NULL), MLA_STATUS_INVALID_HANDLE);
    EXPECT(mla_store_destroy(store), MLA_STATUS_INVALID_HANDLE);
    EXPECT(mla_store_destroy(NULL), MLA_STATUS_NULL_POINTER);

    /* fp8_ds_mla on huge pages where available: lossy, within a few percent. */
    OK(mla_config_set_dtype(config, MLA_DTYPE_FP8_DS_MLA));
    OK(mla_store_create_host(config, true, &store));
    OK(mla_store_write(store, 0, &c, &k, slots, T, NULL));
    OK(mla_store_gather(store, 0, table, 2, &o, NULL));
    double err = 0, ref = 0;
    for (size_t i = 0; i < NOPE; i++) {
        err += (out[0][i] - c_kv[0][i]) * (out[0][i] - c_kv[0][i]);
        ref += c_kv[0][i] * c_kv[0][i];
    }
    CHECK(sqrt(err / ref) < 0.05);
    CHECK(out[0][NOPE] == k_pe[0][0]); /* RoPE stays bf16 */
    OK(mla_store_layer_view(store, 0, &view));
    CHECK(view.layout.bytes_per_token == 656 && view.layout.num_scales == 4);
    CHECK(view.layout.scale_bytes == 4 && view.layout.rope_offset == 528);
    OK(mla_store_destroy(store));

    /* Invalid configurations are refused by both constructors. */
    OK(mla_config_set_rope_dim(config, 0));
    OK(mla_config_set_kv_lora_rank(config, 100));
    EXPECT(mla_store_create_host(config, false, &store), MLA_STATUS_INVALID_CONFIG);
    EXPECT(mla_store_create_cuda(config, 0, &store), MLA_STATUS_INVALID_CONFIG);
    OK(mla_config_destroy(config));
}

/* Latents of `n` tokens named `seed`, written to every layer of `store` at
 * the slots of request `id` of `cache`. */
static void write_request(MlaTieredCache *cache, MlaStore *store, MlaRequestId id, size_t n,
                          size_t seed) {
    enum { NOPE = 512, ROPE = 64, MAX = 64 };
    static float c_kv[MAX][NOPE], k_pe[MAX][ROPE];
    int64_t slots[MAX];
    size_t len = 0;
    CHECK(n <= MAX);
    for (size_t t = 0; t < n; t++) {
        for (size_t i = 0; i < NOPE; i++) c_kv[t][i] = value(t + seed, i);
        for (size_t i = 0; i < ROPE; i++) k_pe[t][i] = value(t + seed, NOPE + i);
    }
    OK(mla_tiered_slot_mapping(cache, id, 0, n, slots, MAX, &len));
    CHECK(len == n);
    MlaMatrix c = {c_kv, MLA_ELEM_TYPE_F32, n, NOPE, 0};
    MlaMatrix k = {k_pe, MLA_ELEM_TYPE_F32, n, ROPE, 0};
    for (size_t layer = 0; layer < 2; layer++) {
        OK(mla_store_write(store, layer, &c, &k, slots, n, NULL));
    }
}

/* Admits `n` tokens from `first` chunked, writes what was not loaded and
 * commits; returns the tokens served by the tiers in `hits`. */
static void run_request(MlaTieredCache *cache, MlaStore *store, MlaRequestId id,
                        MlaTokenId first, size_t n, MlaTierHits *hits) {
    MlaTokenId tokens[64];
    MlaBlockId blocks[16];
    size_t num_blocks = 0, cached = 0;
    MlaAdmitOptions opts = {0};
    opts.chunked_prefill = true;
    fill_tokens(tokens, n, first);
    OK(mla_tiered_admit(cache, id, tokens, n, &opts, blocks, 16, &num_blocks, &cached, hits));
    CHECK(num_blocks == (n + BS - 1) / BS && cached == hits->device_tokens + hits->host_tokens +
                                                            hits->remote_tokens);
    write_request(cache, store, id, n, first);
    OK(mla_tiered_commit(cache, id, n));
}

/* The first 12 tokens of request `id`, gathered from layer 1. */
static void gather_request(MlaTieredCache *cache, MlaStore *store, MlaRequestId id,
                           float out[12][576]) {
    MlaBlockId table[16];
    size_t len = 0;
    OK(mla_tiered_block_table(cache, id, table, 16, &len));
    MlaMatrix o = {out, MLA_ELEM_TYPE_F32, 12, 576, 0};
    OK(mla_store_gather(store, 1, table, len, &o, NULL));
}

static MlaTieredCache *tiered(MlaConfig *config, MlaStore *store, const MlaTierOptions *o) {
    MlaTieredCache *cache = NULL;
    OK(mla_tiered_create(config, store, o, &cache));
    return cache;
}

/* Every tier's events, each with its medium; a full queue drops and counts. */
static void test_tiered_events(void) {
    enum { PROMPT = 3 * BS + 1 };
    MlaConfig *config = small_config(8);
    MlaStore *store = NULL;
    OK(mla_config_set_num_layers(config, 2));
    OK(mla_config_set_enable_events(config, true));
    OK(mla_store_create_host(config, false, &store));
    MlaTierOptions o = {0};
    o.host_mem_bytes = 1 << 20;
    MlaTieredCache *cache = tiered(config, store, &o);
    MlaTierHits hits;
    run_request(cache, store, 1, 1000, PROMPT, &hits);
    MlaEventList *list = NULL;
    MlaEvent gpu, cpu;
    size_t n = 0;
    OK(mla_tiered_take_events(cache, &list));
    OK(mla_event_list_len(list, &n));
    CHECK(n == 2);
    OK(mla_event_list_get(list, 0, &gpu));
    OK(mla_event_list_get(list, 1, &cpu));
    CHECK(strcmp(gpu.medium, "GPU") == 0 && strcmp(cpu.medium, "CPU") == 0);
    CHECK(gpu.kind == MLA_EVENT_KIND_BLOCK_STORED && cpu.kind == MLA_EVENT_KIND_BLOCK_STORED);
    CHECK(gpu.num_block_hashes == 3 && cpu.num_block_hashes == 3);
    CHECK(memcmp(gpu.block_hashes, cpu.block_hashes, 3 * sizeof(uint64_t)) == 0);
    CHECK(cpu.num_token_ids == 0 && !cpu.has_parent);
    OK(mla_event_list_destroy(list));
    EXPECT(mla_tiered_take_events(cache, NULL), MLA_STATUS_NULL_POINTER);
    EXPECT(mla_tiered_take_events(NULL, &list), MLA_STATUS_NULL_POINTER);
    /* Published from the tiered cache: both events, each with its medium. */
    MlaPublisherOptions po;
    memset(&po, 0, sizeof po);
    po.endpoint = "tcp://*:0";
    MlaPublisher *publisher = NULL;
    OK(mla_publisher_create(&po, &publisher));
    run_request(cache, store, 2, 3000, PROMPT, &hits);
    size_t accepted = 0;
    OK(mla_publisher_publish_tiered(publisher, cache, &accepted));
    CHECK(accepted == 2);
    OK(mla_publisher_publish_tiered(publisher, cache, &accepted));
    CHECK(accepted == 0);
    EXPECT(mla_publisher_publish_tiered(publisher, NULL, &accepted), MLA_STATUS_NULL_POINTER);
    MlaPublisherStats ps;
    OK(mla_publisher_stats(publisher, &ps));
    CHECK(ps.events_accepted == 2);
    OK(mla_publisher_destroy(publisher));
    OK(mla_tiered_free(cache, 2));
    OK(mla_tiered_free(cache, 1));
    OK(mla_tiered_destroy(cache));

    OK(mla_config_set_max_pending_events(config, 1));
    cache = tiered(config, store, &o);
    run_request(cache, store, 1, 1000, PROMPT, &hits);
    OK(mla_tiered_take_events(cache, &list));
    OK(mla_event_list_len(list, &n));
    CHECK(n == 1);
    OK(mla_event_list_destroy(list));
    MlaTierStats stats;
    OK(mla_tiered_stats(cache, &stats));
    CHECK(stats.events_dropped == 1);
    OK(mla_tiered_free(cache, 1));
    OK(mla_tiered_destroy(cache));
    OK(mla_store_destroy(store));
    OK(mla_config_destroy(config));
}

static void test_tiered_host(void) {
    enum { PROMPT = 3 * BS + 1 };
    static float before[12][576], after[12][576];
    MlaConfig *config = small_config(8);
    MlaStore *store = NULL;
    OK(mla_config_set_num_layers(config, 2));
    OK(mla_store_create_host(config, false, &store));
    MlaTierOptions o = {0};
    o.host_mem_bytes = 1 << 20;
    o.write_policy = "write-through";
    MlaTieredCache *cache = tiered(config, store, &o);
    MlaTierHits hits;

    run_request(cache, store, 1, 1000, PROMPT, &hits);
    CHECK(hits.device_tokens == 0 && hits.host_tokens == 0 && hits.remote_tokens == 0);
    gather_request(cache, store, 1, before);
    MlaTierStats stats;
    OK(mla_tiered_stats(cache, &stats));
    CHECK(stats.has_host && !stats.has_remote && stats.host.blocks == 3);
    CHECK(stats.written_through == 3 && stats.host.capacity_blocks > 8);
    OK(mla_tiered_free(cache, 1));
    /* An unrelated request of 8 blocks evicts and overwrites every block. */
    run_request(cache, store, 2, 5000, 8 * BS, &hits);
    OK(mla_tiered_free(cache, 2));

    MlaTokenId prompt[PROMPT];
    fill_tokens(prompt, PROMPT, 1000);
    OK(mla_tiered_lookup(cache, prompt, PROMPT, NULL, &hits));
    CHECK(hits.device_tokens == 0 && hits.host_tokens == 3 * BS && hits.remote_tokens == 0);
    MlaBlockId blocks[8];
    size_t n = 0, cached = 0;
    OK(mla_tiered_admit(cache, 3, prompt, PROMPT, NULL, blocks, 8, &n, &cached, &hits));
    CHECK(cached == 3 * BS && hits.host_tokens == 3 * BS && n == 4);
    gather_request(cache, store, 3, after);
    CHECK(memcmp(before, after, sizeof before) == 0);
    OK(mla_tiered_fork(cache, 3, 4));
    MlaBlockId fresh[1];
    MlaBlockCopy copies[1];
    size_t num_fresh = 0, num_copies = 0;
    MlaTokenId next = 7;
    OK(mla_tiered_append(cache, 4, &next, 1, fresh, 1, &num_fresh, copies, 1, &num_copies));
    CHECK(num_copies == 1 && copies[0].src == blocks[3]);
    EXPECT(mla_tiered_append(cache, 4, &next, 1, fresh, 0, &num_fresh, copies, 1, &num_copies),
           MLA_STATUS_BUFFER_TOO_SMALL);
    OK(mla_tiered_stats(cache, &stats));
    CHECK(stats.host_hit_tokens == 3 * BS && stats.query_tokens == 2 * PROMPT + 8 * BS);
    CHECK(stats.host.loads >= 3 && stats.copy_errors == 0);
    bool done = false;
    OK(mla_tiered_flush_remote(cache, 10, &done));
    CHECK(done);
    EXPECT(mla_tiered_free(cache, 99), MLA_STATUS_UNKNOWN_REQUEST);
    EXPECT(mla_tiered_admit(cache, 3, prompt, PROMPT, NULL, blocks, 8, &n, &cached, NULL),
           MLA_STATUS_NULL_POINTER);
    OK(mla_tiered_destroy(cache));
    EXPECT(mla_tiered_destroy(cache), MLA_STATUS_INVALID_HANDLE);
    EXPECT(mla_tiered_stats(NULL, &stats), MLA_STATUS_NULL_POINTER);

    /* Bad settings. */
    MlaTieredCache *none = NULL;
    o.write_policy = "write-around";
    EXPECT(mla_tiered_create(config, store, &o, &none), MLA_STATUS_INVALID_ARGUMENT);
    o.write_policy = NULL;
    o.host_mem_bytes = 100; /* less than one block */
    EXPECT(mla_tiered_create(config, store, &o, &none), MLA_STATUS_INVALID_CONFIG);
    o.host_mem_bytes = 0;
    o.remote = "redis://127.0.0.1:1/";
#ifdef MLA_TEST_REMOTE_FEATURE
    /* Connects lazily: a dead server is a miss, not an error. */
    cache = tiered(config, store, &o);
    OK(mla_tiered_lookup(cache, prompt, PROMPT, NULL, &hits));
    CHECK(hits.remote_tokens == 0);
    OK(mla_tiered_destroy(cache));
#else
    EXPECT(mla_tiered_create(config, store, &o, &none), MLA_STATUS_INVALID_CONFIG);
    CHECK(LAST_ERROR_HAS("remote-redis"));
#endif
    o.remote = NULL;
    OK(mla_config_set_num_blocks(config, 9));
    EXPECT(mla_tiered_create(config, store, &o, &none), MLA_STATUS_INVALID_CONFIG);
    CHECK(none == NULL);
    OK(mla_store_destroy(store));
    OK(mla_config_destroy(config));
}

/* Two nodes share blocks through the Valkey/Redis server named by
 * MLA_CACHE_REDIS_URL (scripts/redis.sh start). */
static void test_tiered_remote(void) {
    const char *url = getenv("MLA_CACHE_REDIS_URL");
    const char *required = getenv("MLA_CACHE_REQUIRE_REDIS");
#ifndef MLA_TEST_REMOTE_FEATURE
    url = NULL;
#endif
    if (url == NULL || *url == '\0') {
        CHECK(required == NULL || strcmp(required, "1") != 0);
        printf("test_tiered_remote: no remote tier (feature or MLA_CACHE_REDIS_URL): not run\n");
        return;
    }
    static float before[12][576], after[12][576];
    char namespace_[64];
    snprintf(namespace_, sizeof namespace_, "c-test-%ld-%ld-%lx", (long)time(NULL), (long)clock(),
             (unsigned long)(uintptr_t)namespace_);
    MlaConfig *config = small_config(8);
    OK(mla_config_set_num_layers(config, 2));
    MlaStore *store_a = NULL, *store_b = NULL;
    OK(mla_store_create_host(config, false, &store_a));
    OK(mla_store_create_host(config, false, &store_b));
    MlaTierOptions o = {0};
    o.remote = url;
    o.remote_namespace = namespace_;
    o.lookup_budget_us = 2000000;
    MlaTieredCache *a = tiered(config, store_a, &o);
    o.host_mem_bytes = 1 << 20;
    MlaTieredCache *b = tiered(config, store_b, &o);
    MlaTierHits hits;
    run_request(a, store_a, 1, 3000, 3 * BS + 1, &hits);
    gather_request(a, store_a, 1, before);
    bool done = false;
    OK(mla_tiered_flush_remote(a, 5000, &done));
    CHECK(done);
    MlaTokenId prompt[3 * BS + 1];
    fill_tokens(prompt, 3 * BS + 1, 3000);
    MlaBlockId blocks[8];
    size_t n = 0, cached = 0;
    OK(mla_tiered_admit(b, 1, prompt, 3 * BS + 1, NULL, blocks, 8, &n, &cached, &hits));
    CHECK(hits.remote_tokens == 3 * BS && cached == 3 * BS);
    gather_request(b, store_b, 1, after);
    CHECK(memcmp(before, after, sizeof before) == 0);
    MlaTierStats stats;
    OK(mla_tiered_stats(b, &stats));
    CHECK(stats.has_remote && stats.remote.hit_blocks == 3 && stats.host.blocks == 3);
    OK(mla_tiered_destroy(a));
    OK(mla_tiered_destroy(b));
    OK(mla_store_destroy(store_a));
    OK(mla_store_destroy(store_b));
    OK(mla_config_destroy(config));
}

/* DeepSeek-V3.2: the indexer keys beside the latent, under the same block ids. */
static void test_indexer_store(void) {
    MlaConfig *config = NULL;
    OK(mla_config_from_preset("deepseek-v3.2", 16, MLA_DTYPE_FP8_DS_MLA, &config));
    MlaConfigSizes sizes;
    OK(mla_config_sizes(config, &sizes));
    CHECK(sizes.bytes_per_token == 48068);
    CHECK(sizes.bytes_per_token_per_layer == 656 + 132);
    CHECK(sizes.indexer_bytes_per_token_per_layer == 132);
    MlaConfigInfo info;
    OK(mla_config_get(config, &info));
    CHECK(info.indexer_head_dim == 128 && info.num_layers == 61);
    MlaModelGeometry g;
    OK(mla_model_geometry("deepseek-v3.2", &g));
    CHECK(g.indexer_head_dim == 128);
    OK(mla_model_geometry("deepseek-v3", &g));
    CHECK(g.indexer_head_dim == 0);
    OK(mla_config_set_indexer_head_dim(config, 130));
    EXPECT(mla_config_validate(config), MLA_STATUS_INVALID_CONFIG);
    CHECK(LAST_ERROR_HAS("indexer"));
    OK(mla_config_set_indexer_head_dim(config, 0));
    OK(mla_config_sizes(config, &sizes));
    CHECK(sizes.bytes_per_token == 61 * 656 && sizes.indexer_bytes_per_token_per_layer == 0);
    OK(mla_config_destroy(config));

    enum { H = 128, T = 5, BLOCKS = 8 };
    config = small_config(BLOCKS);
    OK(mla_config_set_num_layers(config, 2));
    OK(mla_config_set_dtype(config, MLA_DTYPE_FP8_DS_MLA));
    MlaStore *plain = NULL;
    OK(mla_store_create_host(config, false, &plain));
    OK(mla_config_set_indexer_head_dim(config, H));
    MlaStore *store = NULL;
    OK(mla_store_create_host(config, false, &store));
    OK(mla_config_destroy(config));

    /* Keys exactly representable with the scale 2^-7 (amax 2). */
    static float keys[T][H], out[T][H];
    for (size_t t = 0; t < T; t++) {
        for (size_t i = 0; i < H; i++) keys[t][i] = (float)((int)((i + t) % 8) - 4) * 0.5f;
    }
    MlaBlockId table[2] = {6, 1};
    int64_t slots[T];
    for (size_t t = 0; t < T; t++) slots[t] = (int64_t)table[t / BS] * BS + (int64_t)(t % BS);
    MlaMatrix k = {keys, MLA_ELEM_TYPE_F32, T, H, 0};
    OK(mla_store_write_indexer(store, 1, &k, slots, T, NULL));
    MlaMatrix o = {out, MLA_ELEM_TYPE_F32, T, H, 0};
    OK(mla_store_gather_indexer(store, 1, table, 2, &o, NULL));
    CHECK(memcmp(out, keys, sizeof keys) == 0);

    static uint8_t codes[T][H];
    float scales[T];
    OK(mla_store_gather_indexer_quantized(store, 1, table, 2, &codes[0][0], scales, T, NULL));
    CHECK(scales[0] == 1.0f / 128.0f && scales[4] == 1.0f / 128.0f);
    /* -2.0 / 2^-7 = -256 = e4m3 0x80 | (15 << 3) | 0; 0.0 codes as 0. */
    CHECK(codes[0][0] == 0xF8 && codes[0][4] == 0x00);

    MlaIndexerView view;
    OK(mla_store_indexer_view(store, 1, &view));
    CHECK(view.device_kind == MLA_DEVICE_KIND_HOST && view.head_dim == H);
    CHECK(view.shape[0] == BLOCKS && view.shape[1] == BS && view.shape[2] == H + 4);
    CHECK(view.strides[0] == BS * (H + 4) && view.len_bytes == (size_t)BLOCKS * BS * (H + 4));
    /* Block 6: every token's codes first, then every scale. */
    const uint8_t *block = (const uint8_t *)view.data + 6 * view.strides[0];
    CHECK(memcmp(block, codes, BS * H) == 0);
    float scale;
    memcpy(&scale, block + BS * H + 4 * 3, 4);
    CHECK(scale == 1.0f / 128.0f);

    /* Copy-on-write moves the keys too. */
    MlaBlockCopy copy = {6, 3, 0};
    OK(mla_store_copy_blocks(store, &copy, 1, NULL));
    MlaBlockId copied[1] = {3};
    MlaMatrix o4 = {out, MLA_ELEM_TYPE_F32, BS, H, 0};
    memset(out, 0, sizeof out);
    OK(mla_store_gather_indexer(store, 1, copied, 1, &o4, NULL));
    CHECK(memcmp(out, keys, BS * H * sizeof(float)) == 0);

    /* Errors. */
    EXPECT(mla_store_write_indexer(store, 2, &k, slots, T, NULL), MLA_STATUS_INVALID_ARGUMENT);
    EXPECT(mla_store_write_indexer(store, 0, NULL, slots, T, NULL), MLA_STATUS_NULL_POINTER);
    EXPECT(mla_store_write_indexer(store, 0, &k, NULL, T, NULL), MLA_STATUS_NULL_POINTER);
    EXPECT(mla_store_gather_indexer_quantized(store, 1, table, 1, &codes[0][0], scales, T, NULL),
           MLA_STATUS_INVALID_ARGUMENT);
    EXPECT(mla_store_write_indexer(plain, 0, &k, slots, T, NULL), MLA_STATUS_INVALID_ARGUMENT);
    CHECK(LAST_ERROR_HAS("no indexer"));
    EXPECT(mla_store_indexer_view(plain, 0, &view), MLA_STATUS_INVALID_ARGUMENT);
    EXPECT(mla_store_indexer_view(store, 0, NULL), MLA_STATUS_NULL_POINTER);
    OK(mla_store_destroy(store));
    OK(mla_store_destroy(plain));
}

int main(void) {
    test_version_and_status();
    test_config();
    test_admission();
    test_chunked_prefill();
    test_append_fork_tables();
    test_pins_reset_events();
    test_reserve_and_evict();
    test_manager_handles();
    test_store();
    test_indexer_store();
    test_tiered_host();
    test_tiered_events();
    test_tiered_remote();
    return CHECK_SUMMARY("test_abi");
}
