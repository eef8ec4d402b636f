/*
 * Bad input the C API must refuse with a status and a message, changing
 * nothing: sizes that would overflow, multimodal ranges outside the prompt,
 * destroyed handles whose slot a new object took. Built and run by
 * capi/tests/c_abi.rs and scripts/c-tests.sh (also under valgrind).
 */
#include <stdint.h>

#include "fixture.h"

static MlaConfig *config_of(size_t num_blocks) { return fixture_config(num_blocks, 7); }

/* Sizes derived from caller input never wrap: every field is bounded. */
static void test_size_overflow(void) {
    size_t bytes = 12345;
    EXPECT(mla_dtype_bytes_per_token(MLA_DTYPE_BF16, SIZE_MAX, SIZE_MAX, &bytes),
           MLA_STATUS_INVALID_ARGUMENT);
    CHECK(LAST_ERROR_HAS("kv_lora_rank"));
    CHECK(bytes == 12345); /* *out untouched on failure */
    EXPECT(mla_dtype_bytes_per_token(MLA_DTYPE_BF16, 512, SIZE_MAX, &bytes),
           MLA_STATUS_INVALID_ARGUMENT);
    CHECK(LAST_ERROR_HAS("rope_dim"));
    OK(mla_dtype_bytes_per_token(MLA_DTYPE_BF16, 512, 64, &bytes));
    CHECK(bytes == 1152);

    MlaConfig *config = config_of(16);
    MlaConfigSizes sizes;
    memset(&sizes, 0xab, sizeof sizes);
    unsigned char before[sizeof sizes];
    memcpy(before, &sizes, sizeof sizes);
    size_t blocks = 99;

    /* Each field alone out of bounds: refused, naming it. */
    struct {
        MlaStatus (*set)(MlaConfig *, size_t);
        size_t bad, good;
        const char *name;
    } fields[] = {
        {mla_config_set_rope_dim, SIZE_MAX, 64, "rope_dim"},
        {mla_config_set_kv_lora_rank, SIZE_MAX, 512, "kv_lora_rank"},
        {mla_config_set_num_layers, (size_t)1 << 51, 1, "num_layers"},
        {mla_config_set_block_size, SIZE_MAX, 4, "block_size"},
        {mla_config_set_num_blocks, SIZE_MAX, 16, "num_blocks"},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        OK(fields[i].set(config, fields[i].bad));
        EXPECT(mla_config_validate(config), MLA_STATUS_INVALID_CONFIG);
        CHECK(LAST_ERROR_HAS(fields[i].name));
        EXPECT(mla_config_sizes(config, &sizes), MLA_STATUS_INVALID_CONFIG);
        CHECK(memcmp(&sizes, before, sizeof sizes) == 0);
        EXPECT(mla_config_blocks_for_bytes(config, UINT64_MAX, &blocks), MLA_STATUS_INVALID_CONFIG);
        CHECK(blocks == 99);
        MlaStore *store = NULL;
        EXPECT(mla_store_create_host(config, false, &store), MLA_STATUS_INVALID_CONFIG);
        CHECK(store == NULL);
        OK(fields[i].set(config, fields[i].good));
    }

    /* Fields each within bounds whose product is not: the cache's bytes. */
    OK(mla_config_set_num_layers(config, 4096));
    OK(mla_config_set_block_size(config, 65536));
    OK(mla_config_set_kv_lora_rank(config, 65536));
    OK(mla_config_set_num_blocks(config, 4000000000u));
    EXPECT(mla_config_validate(config), MLA_STATUS_INVALID_CONFIG);
    CHECK(LAST_ERROR_HAS("total bytes"));
    EXPECT(mla_config_sizes(config, &sizes), MLA_STATUS_INVALID_CONFIG);
    EXPECT(mla_config_blocks_for_bytes(config, 1, &blocks), MLA_STATUS_INVALID_CONFIG);

    /* The largest valid sizes are exact. */
    OK(mla_config_set_num_blocks(config, 1));
    OK(mla_config_sizes(config, &sizes));
    CHECK(sizes.bytes_per_token_per_layer == 2 * 65536 + 2 * 64);
    CHECK(sizes.total_bytes == sizes.bytes_per_token_per_layer * 65536 * 4096);
    OK(mla_config_blocks_for_bytes(config, UINT64_MAX, &blocks));
    CHECK(blocks == (size_t)(UINT64_MAX / sizes.bytes_per_block));
    OK(mla_config_destroy(config));
}

/* Multimodal inputs must cover a non-empty range of the prompt (8 tokens, in
 * a cache of 16 blocks of 4 tokens). */
static void test_multimodal_ranges(void) {
    MlaConfig *config = config_of(16);
    MlaManager *manager = NULL;
    OK(mla_manager_create(config, &manager));
    MlaTokenId tokens[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    MlaBlockId ids[4];
    size_t n = 0, cached = 0, free_before = 0, free_after = 0;
    OK(mla_manager_num_free_blocks(manager, &free_before));

    struct {
        size_t offset, length;
        const char *why;
    } bad[] = {
        {6, 3, "outside"},        /* past the prompt's end */
        {8, 1, "outside"},        /* starts at the prompt's end */
        {60, 8, "outside"},       /* past the end of any request */
        {2, 0, "empty"},          /* empty */
        {SIZE_MAX, 1, "outside"}, /* offset + length wraps */
        {1, SIZE_MAX, "outside"},
    };
    MlaMultiModalKey mm = {"image-hash", 0, 0};
    MlaAdmitOptions options;
    memset(&options, 0, sizeof options);
    options.keys.mm = &mm;
    options.keys.num_mm = 1;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        mm.offset = bad[i].offset;
        mm.length = bad[i].length;
        EXPECT(mla_manager_admit(manager, 1, tokens, 8, &options, ids, 4, &n, &cached),
               MLA_STATUS_INVALID_ARGUMENT);
        CHECK(LAST_ERROR_HAS("multimodal input 0"));
        CHECK(LAST_ERROR_HAS(bad[i].why));
        OK(mla_manager_num_free_blocks(manager, &free_after));
        CHECK(free_after == free_before);
        OK(mla_manager_check_invariants(manager));
    }
    /* Inside the prompt, up to its last token: admitted. */
    mm.offset = 0;
    mm.length = 8;
    OK(mla_manager_admit(manager, 1, tokens, 8, &options, ids, 4, &n, &cached));
    CHECK(n == 2);
    mm.offset = 6;
    mm.length = 2;
    OK(mla_manager_admit(manager, 2, tokens, 8, &options, ids, 4, &n, &cached));
    OK(mla_manager_destroy(manager));
    OK(mla_config_destroy(config));
}

/* A destroyed handle is stale even when a new object takes its place. */
static void test_stale_handles(void) {
    MlaConfig *config = config_of(16);
    MlaManager *first = NULL, *second = NULL;
    OK(mla_manager_create(config, &first));
    OK(mla_manager_destroy(first));
    for (int i = 0; i < 4; i++) {
        /* Whatever the allocator does, the new handles differ from the old. */
        OK(mla_manager_create(config, &second));
        CHECK(second != first);
        size_t free_blocks = 0;
        EXPECT(mla_manager_num_free_blocks(first, &free_blocks), MLA_STATUS_INVALID_HANDLE);
        CHECK(LAST_ERROR_HAS("stale handle"));
        EXPECT(mla_manager_destroy(first), MLA_STATUS_INVALID_HANDLE);
        OK(mla_manager_num_free_blocks(second, &free_blocks));
        CHECK(free_blocks == 16);
        OK(mla_manager_destroy(second));
    }
    /* A config destroyed and recreated: the old handle stays stale. */
    MlaConfig *old = config;
    OK(mla_config_destroy(config));
    OK(mla_config_create(8, &config));
    EXPECT(mla_config_validate(old), MLA_STATUS_INVALID_HANDLE);
    CHECK(LAST_ERROR_HAS("stale handle"));
    OK(mla_config_validate(config));
    /* A raw address is never a handle. */
    int not_a_handle = 0;
    EXPECT(mla_config_validate((const MlaConfig *)(void *)&not_a_handle), MLA_STATUS_INVALID_HANDLE);
    OK(mla_config_destroy(config));
}

int main(void) {
    test_size_overflow();
    test_multimodal_ranges();
    test_stale_handles();
    return CHECK_SUMMARY("test_hardening");
}
