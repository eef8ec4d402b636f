/* Publishes a block manager's KV events from C (mla_publisher_*), driven
 * line by line on stdin by a subscriber test:
 *   prints "endpoint <ENDPOINT>" once the publisher is up, then answers
 *   "probe"  -> resets the prefix cache and publishes its AllBlocksCleared;
 *   "run N"  -> admits and frees N requests, publishing after each, then
 *               prints "published <events> <batches> <dropped>";
 *   "quit"   -> destroys everything and exits 0.
 * Any failed call prints its error and exits 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mla_cache.h"

#define MUST(call)                                                                         \
    do {                                                                                   \
        MlaStatus s_ = (call);                                                             \
        if (s_ != MLA_STATUS_OK) {                                                         \
            fprintf(stderr, "%s: %s (%s)\n", #call, mla_status_name((int)s_),              \
                    mla_last_error());                                                     \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

int main(int argc, char **argv) {
    MlaConfig *config = NULL;
    MlaManager *manager = NULL;
    MlaPublisher *publisher = NULL;
    MlaPublisherOptions options;
    const char *endpoint = NULL;
    char line[128];
    size_t accepted = 0;

    MUST(mla_config_create(48, &config));
    MUST(mla_config_set_block_size(config, 16));
    MUST(mla_config_set_enable_events(config, true));
    MUST(mla_manager_create(config, &manager));
    MUST(mla_config_destroy(config));

    memset(&options, 0, sizeof options); /* zero: vLLM's defaults */
    options.endpoint = argc > 1 ? argv[1] : "tcp://*:0";
    options.topic = "kv";
    options.max_batch_events = 8;
    options.max_batch_delay_us = 1000;
    MUST(mla_publisher_create(&options, &publisher));
    MUST(mla_publisher_endpoint(publisher, &endpoint));
    printf("endpoint %s\n", endpoint);
    fflush(stdout);

    while (fgets(line, sizeof line, stdin) != NULL) {
        unsigned long n = 0;
        bool sent = false;
        if (strncmp(line, "probe", 5) == 0) {
            MUST(mla_manager_reset_prefix_cache(manager));
            MUST(mla_publisher_publish(publisher, manager, &accepted));
            MUST(mla_publisher_flush(publisher, 5000, &sent));
        } else if (sscanf(line, "run %lu", &n) == 1) {
            MlaPublisherStats stats;
            for (unsigned long id = 0; id < n; id++) {
                MlaTokenId tokens[100];
                MlaBlockId blocks[8];
                size_t num_blocks = 0, cached = 0;
                for (size_t t = 0; t < 100; t++) {
                    /* Four shared 64-token prefixes, private tails. */
                    tokens[t] = (MlaTokenId)(t < 64 ? (id % 4) * 1000 + t : id * 100 + t);
                }
                MUST(mla_manager_admit(manager, id, tokens, 100, NULL, blocks, 8, &num_blocks,
                                       &cached));
                MUST(mla_manager_free(manager, id));
                MUST(mla_publisher_publish(publisher, manager, NULL));
            }
            MUST(mla_publisher_flush(publisher, 5000, &sent));
            MUST(mla_publisher_stats(publisher, &stats));
            printf("published %llu %llu %llu\n", (unsigned long long)stats.events_published,
                   (unsigned long long)stats.batches_published,
                   (unsigned long long)stats.events_dropped);
            fflush(stdout);
        } else if (strncmp(line, "quit", 4) == 0) {
            break;
        }
    }
    MUST(mla_publisher_destroy(publisher));
    MUST(mla_manager_destroy(manager));
    return 0;
}
