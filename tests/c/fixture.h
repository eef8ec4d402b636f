/* The setup the C and C++ test programs share: small configurations with a
 * fixed hash seed, managers over them, runs of consecutive tokens. */
#ifndef MLA_TEST_FIXTURE_H
#define MLA_TEST_FIXTURE_H

#include <stdint.h>

#include "check.h"

/* Tokens per block in the fixtures' configurations. */
#define BS 4

/* A configuration of `num_blocks` blocks of BS tokens whose hashes use `seed`. */
static inline MlaConfig *fixture_config(size_t num_blocks, uint64_t seed) {
    MlaConfig *config = NULL;
    OK(mla_config_create(num_blocks, &config));
    OK(mla_config_set_block_size(config, BS));
    OK(mla_config_set_hash_seed(config, true, seed));
    return config;
}

/* A manager of `config`, which is destroyed (the manager keeps a copy). */
static inline MlaManager *fixture_manager(MlaConfig *config) {
    MlaManager *manager = NULL;
    OK(mla_manager_create(config, &manager));
    OK(mla_config_destroy(config));
    return manager;
}

/* tokens[i] = first + i for i < n. */
static inline void fill_tokens(MlaTokenId *tokens, size_t n, MlaTokenId first) {
    for (size_t i = 0; i < n; i++) {
        tokens[i] = first + (MlaTokenId)i;
    }
}

#endif
