/*
 * The batched calls of the C API (append, block tables, free), the request
 * queries (computed tokens, capacity, dry-run admission), the fixed-width
 * enums and the LoRA adapter path in the extra keys. Built and run by
 * capi/tests/c_abi.rs and scripts/c-tests.sh (under valgrind and ASan there).
 */
#include <stdint.h>
#include <stdlib.h>

#include "fixture.h"

static MlaManager *manager_of(size_t num_blocks) {
    return fixture_manager(fixture_config(num_blocks, 42));
}

static void admit(MlaManager *manager, MlaRequestId id, size_t num_tokens, MlaTokenId first) {
    MlaTokenId tokens[64];
    MlaBlockId ids[32];
    size_t n = 0, cached = 0;
    fill_tokens(tokens, num_tokens, first);
    OK(mla_manager_admit(manager, id, tokens, num_tokens, NULL, ids, 32, &n, &cached));
}

/* Everything the API shows of requests 1..4, to compare before and after a refused call. */
typedef struct {
    MlaCacheStats stats;
    MlaBlockId tables[4][32];
    size_t lens[4], tokens[4];
} Snapshot;

static Snapshot snapshot(MlaManager *manager) {
    Snapshot s;
    memset(&s, 0, sizeof s);
    OK(mla_manager_stats(manager, &s.stats));
    for (MlaRequestId id = 1; id <= 4; id++) {
        if (mla_manager_block_table(manager, id, s.tables[id - 1], 32, &s.lens[id - 1]) ==
            MLA_STATUS_OK) {
            OK(mla_manager_num_tokens(manager, id, &s.tokens[id - 1]));
        }
    }
    return s;
}

/* Whether the manager shows what `before` recorded. */
static int unchanged(MlaManager *manager, const Snapshot *before) {
    Snapshot now = snapshot(manager);
    return memcmp(&now, before, sizeof now) == 0;
}

static void test_append_batch(void) {
    MlaManager *manager = manager_of(8);
    admit(manager, 1, 4, 0);  /* full: the next token takes a block */
    admit(manager, 2, 6, 10); /* 1 full + 1 partial, forked below */
    OK(mla_manager_fork(manager, 2, 3));
    MlaBlockId before2[4], table[8];
    size_t n = 0;
    OK(mla_manager_block_table(manager, 2, before2, 4, &n));

    /* One decode step: one token each (num_tokens NULL). */
    MlaRequestId ids[3] = {1, 2, 3};
    MlaTokenId tokens[8] = {100, 200, 300, 301, 302, 303, 304, 305};
    MlaBlockId fresh[8];
    size_t counts[3] = {9, 9, 9}, num_fresh = 0, num_copies = 0, num_slots = 0;
    MlaBatchCopy copies[3];
    int64_t slots[8];
    OK(mla_manager_append_batch(manager, ids, 3, tokens, NULL, fresh, 8, counts, &num_fresh,
                                copies, 3, &num_copies, slots, 8, &num_slots));
    CHECK(num_fresh == 1 && counts[0] == 1 && counts[1] == 0 && counts[2] == 0);
    CHECK(num_slots == 3);
    /* Request 2 copies its shared tail; request 3, its last holder, writes in place. */
    CHECK(num_copies == 1 && copies[0].request_index == 1);
    CHECK(copies[0].copy.src == before2[1] && copies[0].copy.position == 1);
    OK(mla_manager_block_table(manager, 2, table, 8, &n));
    CHECK(n == 2 && table[1] == copies[0].copy.dst);
    OK(mla_manager_block_table(manager, 3, table, 8, &n));
    CHECK(n == 2 && table[1] == before2[1]);
    OK(mla_manager_block_table(manager, 1, table, 8, &n));
    CHECK(n == 2 && table[1] == fresh[0]);
    CHECK(slots[0] == (int64_t)fresh[0] * BS);
    CHECK(slots[1] == (int64_t)copies[0].copy.dst * BS + 2);
    CHECK(slots[2] == (int64_t)before2[1] * BS + 2);

    /* Draft tokens: 2 to request 1, 5 to request 3. */
    MlaRequestId drafts[2] = {1, 3};
    size_t k[2] = {2, 5};
    OK(mla_manager_append_batch(manager, drafts, 2, tokens, k, fresh, 8, counts, &num_fresh,
                                copies, 3, &num_copies, slots, 8, &num_slots));
    CHECK(num_slots == 7 && num_copies == 0 && counts[0] == 0 && counts[1] == 1);
    OK(mla_manager_num_tokens(manager, 3, &n));
    CHECK(n == 12);
    int64_t single[8];
    OK(mla_manager_slot_mapping(manager, 3, 7, 12, single, 8, &n));
    CHECK(n == 5 && memcmp(single, slots + 2, 5 * sizeof(int64_t)) == 0);

    /* Buffers are checked against the most a batch returns; nothing changes. */
    Snapshot s = snapshot(manager);
    num_fresh = num_copies = num_slots = 0;
    EXPECT(mla_manager_append_batch(manager, drafts, 2, tokens, k, fresh, 1, counts, &num_fresh,
                                    copies, 3, &num_copies, slots, 8, &num_slots),
           MLA_STATUS_BUFFER_TOO_SMALL);
    CHECK(num_fresh == 3 && num_copies == 2 && num_slots == 7); /* ceil(2/4) + ceil(5/4) */
    CHECK(LAST_ERROR_HAS("3 new block ids"));
    EXPECT(mla_manager_append_batch(manager, drafts, 2, tokens, k, fresh, 8, counts, &num_fresh,
                                    copies, 3, &num_copies, slots, 6, &num_slots),
           MLA_STATUS_BUFFER_TOO_SMALL);
    CHECK(num_slots == 7);
    CHECK(unchanged(manager, &s));

    /* All or nothing: 2 free blocks, three requests that need one each. */
    MlaRequestId all[3] = {1, 2, 3};
    size_t fill[3] = {2, 2, 1};
    OK(mla_manager_num_free_blocks(manager, &n));
    CHECK(n == 2);
    size_t untouched = 77;
    counts[0] = untouched;
    EXPECT(mla_manager_append_batch(manager, all, 3, tokens, fill, fresh, 8, counts, &num_fresh,
                                    copies, 3, &num_copies, slots, 8, &num_slots),
           MLA_STATUS_OUT_OF_BLOCKS);
    CHECK(LAST_ERROR_HAS("3 needed, 2 available"));
    CHECK(counts[0] == untouched);
    MlaRequestId twice[2] = {1, 1}, unknown[2] = {1, 9};
    size_t zero[2] = {1, 0};
    EXPECT(mla_manager_append_batch(manager, twice, 2, tokens, NULL, fresh, 8, counts,
                                    &num_fresh, copies, 3, &num_copies, slots, 8, &num_slots),
           MLA_STATUS_INVALID_ARGUMENT);
    EXPECT(mla_manager_append_batch(manager, unknown, 2, tokens, NULL, fresh, 8, counts,
                                    &num_fresh, copies, 3, &num_copies, slots, 8, &num_slots),
           MLA_STATUS_UNKNOWN_REQUEST);
    EXPECT(mla_manager_append_batch(manager, drafts, 2, tokens, zero, fresh, 8, counts,
                                    &num_fresh, copies, 3, &num_copies, slots, 8, &num_slots),
           MLA_STATUS_EMPTY_INPUT);
    EXPECT(mla_manager_append_batch(manager, drafts, 2, NULL, NULL, fresh, 8, counts, &num_fresh,
                                    copies, 3, &num_copies, slots, 8, &num_slots),
           MLA_STATUS_NULL_POINTER);
    EXPECT(mla_manager_append_batch(manager, drafts, 2, tokens, NULL, fresh, 8, NULL, &num_fresh,
                                    copies, 3, &num_copies, slots, 8, &num_slots),
           MLA_STATUS_NULL_POINTER);
    size_t huge[2] = {SIZE_MAX, 2};
    EXPECT(mla_manager_append_batch(manager, drafts, 2, tokens, huge, fresh, 8, counts,
                                    &num_fresh, copies, 3, &num_copies, slots, 8, &num_slots),
           MLA_STATUS_INVALID_ARGUMENT);
    CHECK(counts[0] == untouched);
    CHECK(unchanged(manager, &s));
    /* An empty batch is a no-op. */
    OK(mla_manager_append_batch(manager, NULL, 0, NULL, NULL, NULL, 0, NULL, &num_fresh, NULL, 0,
                                &num_copies, NULL, 0, &num_slots));
    CHECK(num_fresh == 0 && num_copies == 0 && num_slots == 0);
    OK(mla_manager_check_invariants(manager));
    OK(mla_manager_destroy(manager));
}

static void test_fill_block_tables(void) {
    MlaManager *manager = manager_of(16);
    admit(manager, 1, 9, 0);  /* 3 blocks */
    admit(manager, 2, 2, 50); /* 1 block */
    MlaBlockId t1[4], t2[4];
    size_t n1 = 0, n2 = 0, widest = 0, num_slots = 0;
    OK(mla_manager_block_table(manager, 1, t1, 4, &n1));
    OK(mla_manager_block_table(manager, 2, t2, 4, &n2));

    MlaRequestId ids[2] = {2, 1};
    MlaPositionRange positions[2] = {{0, 2}, {7, 9}};
    int32_t tables[2 * 4];
    int64_t slots[4];
    OK(mla_manager_fill_block_tables(manager, ids, 2, tables, 4, -1, positions, slots, 4, &widest,
                                     &num_slots));
    CHECK(widest == 3 && num_slots == 4);
    CHECK(tables[0] == (int32_t)t2[0] && tables[1] == -1 && tables[2] == -1 && tables[3] == -1);
    CHECK(tables[4] == (int32_t)t1[0] && tables[5] == (int32_t)t1[1]);
    CHECK(tables[6] == (int32_t)t1[2] && tables[7] == -1);
    CHECK(slots[0] == (int64_t)t2[0] * BS && slots[1] == (int64_t)t2[0] * BS + 1);
    CHECK(slots[2] == (int64_t)t1[1] * BS + 3 && slots[3] == (int64_t)t1[2] * BS);

    /* Without positions only the tables are written; slots may be NULL. */
    OK(mla_manager_fill_block_tables(manager, ids + 1, 1, tables, 3, 0, NULL, NULL, 0, &widest,
                                     &num_slots));
    CHECK(widest == 3 && num_slots == 0);

    /* Too small: both sizes are reported, the arrays are untouched. */
    int32_t narrow[2] = {7, 7};
    int64_t one[1] = {7};
    widest = num_slots = 0;
    EXPECT(mla_manager_fill_block_tables(manager, ids, 1, narrow, 1, -1, positions, one, 1,
                                         &widest, &num_slots),
           MLA_STATUS_BUFFER_TOO_SMALL);
    CHECK(widest == 1 && num_slots == 2);
    EXPECT(mla_manager_fill_block_tables(manager, ids, 2, narrow, 1, -1, NULL, NULL, 0, &widest,
                                         &num_slots),
           MLA_STATUS_BUFFER_TOO_SMALL);
    CHECK(widest == 3 && num_slots == 0);
    CHECK(narrow[0] == 7 && narrow[1] == 7 && one[0] == 7);
    MlaPositionRange outside[1] = {{0, 13}};
    EXPECT(mla_manager_fill_block_tables(manager, ids + 1, 1, tables, 4, -1, outside, slots, 4,
                                         &widest, &num_slots),
           MLA_STATUS_INVALID_ARGUMENT);
    MlaRequestId unknown[1] = {9};
    EXPECT(mla_manager_fill_block_tables(manager, unknown, 1, tables, 4, -1, NULL, NULL, 0,
                                         &widest, &num_slots),
           MLA_STATUS_UNKNOWN_REQUEST);
    EXPECT(mla_manager_fill_block_tables(manager, ids, 2, NULL, 4, -1, NULL, NULL, 0, &widest,
                                         &num_slots),
           MLA_STATUS_NULL_POINTER);
    EXPECT(mla_manager_fill_block_tables(manager, ids, 2, tables, SIZE_MAX, -1, NULL, NULL, 0,
                                         &widest, &num_slots),
           MLA_STATUS_INVALID_ARGUMENT);
    EXPECT(mla_manager_fill_block_tables(manager, ids, 2, tables, 4, -1, NULL, NULL, 0, NULL,
                                         &num_slots),
           MLA_STATUS_NULL_POINTER);
    OK(mla_manager_destroy(manager));
}

static void test_free_batch(void) {
    MlaManager *manager = manager_of(16);
    admit(manager, 1, 5, 0);
    admit(manager, 2, 5, 0);
    admit(manager, 3, 5, 100);
    Snapshot s = snapshot(manager);
    MlaRequestId unknown[2] = {1, 4}, twice[3] = {1, 2, 1}, ok[2] = {3, 1};
    EXPECT(mla_manager_free_batch(manager, unknown, 2), MLA_STATUS_UNKNOWN_REQUEST);
    EXPECT(mla_manager_free_batch(manager, twice, 3), MLA_STATUS_INVALID_ARGUMENT);
    EXPECT(mla_manager_free_batch(manager, NULL, 2), MLA_STATUS_NULL_POINTER);
    CHECK(unchanged(manager, &s));
    OK(mla_manager_free_batch(manager, ok, 2));
    OK(mla_manager_free_batch(manager, NULL, 0));
    MlaCacheStats stats;
    OK(mla_manager_stats(manager, &stats));
    CHECK(stats.num_requests == 1);
    size_t n = 0;
    EXPECT(mla_manager_num_tokens(manager, 1, &n), MLA_STATUS_UNKNOWN_REQUEST);
    OK(mla_manager_check_invariants(manager));
    OK(mla_manager_destroy(manager));
}

static void test_queries(void) {
    MlaManager *manager = manager_of(8);
    MlaTokenId tokens[40];
    MlaBlockId ids[8];
    size_t n = 0, cached = 0;
    for (size_t i = 0; i < 40; i++) {
        tokens[i] = (MlaTokenId)i;
    }
    MlaAdmitOptions chunked;
    memset(&chunked, 0, sizeof chunked);
    chunked.chunked_prefill = true;
    chunked.decode_slots = 3;
    OK(mla_manager_admit(manager, 1, tokens, 9, &chunked, ids, 8, &n, &cached)); /* 3 blocks */
    OK(mla_manager_num_computed_tokens(manager, 1, &n));
    CHECK(n == 0);
    OK(mla_manager_capacity(manager, 1, &n));
    CHECK(n == 3);
    OK(mla_manager_commit(manager, 1, 8));
    OK(mla_manager_num_computed_tokens(manager, 1, &n));
    CHECK(n == 8);
    n = 77;
    EXPECT(mla_manager_num_computed_tokens(manager, 5, &n), MLA_STATUS_UNKNOWN_REQUEST);
    EXPECT(mla_manager_capacity(manager, 5, &n), MLA_STATUS_UNKNOWN_REQUEST);
    CHECK(n == 77);
    EXPECT(mla_manager_capacity(manager, 1, NULL), MLA_STATUS_NULL_POINTER);

    /* The dry run: hits and blocks, no state change. */
    Snapshot s = snapshot(manager);
    MlaAdmitCheck check;
    OK(mla_manager_would_admit(manager, tokens, 9, NULL, &check));
    CHECK(check.num_cached_tokens == 8 && check.new_blocks == 1);
    CHECK(check.available_blocks == 5 && check.fits);
    MlaAdmitOptions big;
    memset(&big, 0, sizeof big);
    big.decode_slots = 27;
    OK(mla_manager_would_admit(manager, tokens, 5, &big, &check));
    CHECK(!check.fits && check.new_blocks == 7);
    EXPECT(mla_manager_admit(manager, 2, tokens, 5, &big, ids, 8, &n, &cached),
           MLA_STATUS_OUT_OF_BLOCKS);
    EXPECT(mla_manager_would_admit(manager, tokens, 0, NULL, &check), MLA_STATUS_EMPTY_INPUT);
    EXPECT(mla_manager_would_admit(manager, tokens, 40, NULL, &check),
           MLA_STATUS_REQUEST_TOO_LARGE);
    EXPECT(mla_manager_would_admit(manager, tokens, 9, NULL, NULL), MLA_STATUS_NULL_POINTER);
    CHECK(unchanged(manager, &s));
    OK(mla_manager_destroy(manager));
}

static void test_fixed_width_enums(void) {
    /* One integer type per enum: what mla_dtype_from_name writes is what the
     * setters take; a status is an int32_t. */
    CHECK(sizeof(MlaStatus) == sizeof(int32_t) && sizeof(MlaDtype) == sizeof(uint32_t));
    CHECK(sizeof(MlaElemType) == sizeof(uint32_t));
    CHECK(sizeof(MlaEvictionPolicyKind) == sizeof(uint32_t));
    CHECK(sizeof(MlaBlockHashKind) == sizeof(uint32_t));
    uint32_t dtype = 99;
    OK(mla_dtype_from_name("fp8", &dtype));
    CHECK(dtype == MLA_DTYPE_FP8_DS_MLA);
    MlaConfig *config = NULL;
    OK(mla_config_create(4, &config));
    OK(mla_config_set_dtype(config, dtype));
    EXPECT(mla_config_set_dtype(config, 4), MLA_STATUS_INVALID_CONFIG);
    int32_t status = mla_config_set_dtype(config, 7);
    CHECK(strcmp(mla_status_name(status), "MLA_STATUS_INVALID_CONFIG") == 0);
    OK(mla_config_destroy(config));
}

static void test_adapter_path(void) {
    /* vLLM 0.33's sha256_cbor hashes (PYTHONHASHSEED=42) of 12 tokens under
     * LoRA "a" at "/adapters/a", salt "tenant", images at 2..5 and 5..7,
     * as tests/engine_hash.rs has them. */
    static const uint64_t expected[3] = {0x8f41349fea406cd1ull, 0x49f43d32ade0a1b7ull,
                                         0x9eb0101111c89cfdull};
    static const MlaTokenId tokens[12] = {1, 2, 3, 4, 5, 6, 7, 8, 100000, 70000, 300, 24};
    MlaConfig *config = NULL;
    MlaManager *manager = NULL;
    OK(mla_config_create(32, &config));
    OK(mla_config_set_block_size(config, 4));
    OK(mla_config_set_block_hash(config, MLA_BLOCK_HASH_KIND_SHA256_CBOR));
    OK(mla_config_set_hash_seed(config, true, 42));
    OK(mla_config_set_enable_events(config, true));
    OK(mla_manager_create(config, &manager));
    OK(mla_config_destroy(config));

    MlaMultiModalKey mm[2] = {{"img1", 2, 3}, {"img2", 5, 2}};
    MlaAdmitOptions options;
    memset(&options, 0, sizeof options);
    options.keys.adapter = "a";
    options.keys.adapter_path = "/adapters/a";
    options.keys.salt = "tenant";
    options.keys.mm = mm;
    options.keys.num_mm = 2;
    MlaBlockId ids[4];
    size_t n = 0, cached = 0;
    OK(mla_manager_admit(manager, 1, tokens, 12, &options, ids, 4, &n, &cached));
    MlaEventList *list = NULL;
    MlaEvent e;
    OK(mla_manager_take_events(manager, &list));
    OK(mla_event_list_len(list, &n));
    CHECK(n == 1);
    OK(mla_event_list_get(list, 0, &e));
    CHECK(e.kind == MLA_EVENT_KIND_BLOCK_STORED && e.num_block_hashes == 3);
    for (size_t i = 0; i < 3 && i < e.num_block_hashes; i++) {
        CHECK(e.block_hashes[i] == expected[i]);
    }
    OK(mla_event_list_destroy(list));

    /* Without the path the hashes differ (vLLM keys LoRA blocks by both). */
    options.keys.adapter_path = NULL;
    OK(mla_manager_admit(manager, 2, tokens, 12, &options, ids, 4, &n, &cached));
    CHECK(cached == 0);
    OK(mla_manager_take_events(manager, &list));
    OK(mla_event_list_get(list, 0, &e));
    CHECK(e.block_hashes[0] != expected[0]);
    OK(mla_event_list_destroy(list));
    OK(mla_manager_destroy(manager));
}

int main(void) {
    test_append_batch();
    test_fill_block_tables();
    test_free_batch();
    test_queries();
    test_fixed_width_enums();
    test_adapter_path();
    return CHECK_SUMMARY("test_batch");
}
