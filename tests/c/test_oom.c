/*
 * Allocation failure is a status, not an abort: under a 4 GiB address-space
 * limit, a manager of 2^31 blocks (and a host store of that size) fails with
 * MLA_STATUS_OUT_OF_MEMORY and the process goes on. Not run under valgrind
 * or sanitizers, whose own mappings the limit would break.
 */
#include <stdint.h>
#include <sys/resource.h>

#include "check.h"

int main(void) {
    struct rlimit limit = {(rlim_t)4 << 30, (rlim_t)4 << 30};
    CHECK(setrlimit(RLIMIT_AS, &limit) == 0);

    MlaConfig *config = NULL;
    OK(mla_config_create((size_t)1 << 31, &config));
    OK(mla_config_validate(config));
    MlaManager *manager = NULL;
    EXPECT(mla_manager_create(config, &manager), MLA_STATUS_OUT_OF_MEMORY);
    CHECK(manager == NULL);
    CHECK(LAST_ERROR_HAS("out of memory"));
    MlaStore *store = NULL;
    EXPECT(mla_store_create_host(config, false, &store), MLA_STATUS_OUT_OF_MEMORY);
    CHECK(store == NULL);

    /* Nothing was left behind: a small manager still works. */
    OK(mla_config_set_num_blocks(config, 64));
    OK(mla_manager_create(config, &manager));
    size_t free_blocks = 0;
    OK(mla_manager_num_free_blocks(manager, &free_blocks));
    CHECK(free_blocks == 64);
    OK(mla_manager_destroy(manager));
    OK(mla_config_destroy(config));
    return CHECK_SUMMARY("test_oom");
}
