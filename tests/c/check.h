/* Minimal check macros shared by the C and C++ test programs. */
#ifndef MLA_TEST_CHECK_H
#define MLA_TEST_CHECK_H

#include <stdio.h>
#include <string.h>

#include "mla_cache.h"

static int checks_passed = 0;
static int checks_failed = 0;

#define CHECK(cond)                                                                        \
    do {                                                                                   \
        if (cond) {                                                                        \
            checks_passed++;                                                               \
        } else {                                                                           \
            checks_failed++;                                                               \
            fprintf(stderr, "%s:%d: CHECK(%s) failed (last error: %s)\n", __FILE__,        \
                    __LINE__, #cond, mla_last_error());                                    \
        }                                                                                  \
    } while (0)

/* Checks that `call` returns `expected`, printing both names otherwise. */
#define EXPECT(call, expected)                                                             \
    do {                                                                                   \
        MlaStatus got_ = (call);                                                           \
        if (got_ == (expected)) {                                                          \
            checks_passed++;                                                               \
        } else {                                                                           \
            checks_failed++;                                                               \
            fprintf(stderr, "%s:%d: %s returned %s, expected %s (last error: %s)\n",       \
                    __FILE__, __LINE__, #call, mla_status_name((int)got_),                 \
                    mla_status_name((int)(expected)), mla_last_error());                   \
        }                                                                                  \
    } while (0)

#define OK(call) EXPECT(call, MLA_STATUS_OK)

/* True when the thread's last error message contains `needle`. */
#define LAST_ERROR_HAS(needle) (strstr(mla_last_error(), (needle)) != NULL)

/* Prints the summary line and returns the exit status. */
#define CHECK_SUMMARY(name)                                                                \
    (printf("%s: %d passed, %d failed\n", (name), checks_passed, checks_failed),           \
     checks_failed == 0 ? 0 : 1)

#endif
