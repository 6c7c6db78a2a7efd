/* tests/kafka/test_kafka_out.c - the Kafka sink's client paths on librdkafka's in-process mock
 * cluster (test.mock.num.brokers; label kafka): idempotent produce + commit counts every delivery;
 * transactional produce + send_offsets_to_transaction + commit, twice; a bad setting is a clear
 * TM_E_KAFKA. The mock acks TxnOffsetCommit without storing the offsets and does not fence or
 * filter aborted records (TOOLCHAIN.md 2.3), so exactly-once itself is not checked here. Skips
 * (77) in a build without librdkafka. */
#include <stdio.h>
#include <string.h>

#include "sink/kafka_out.h"
#include "tm_test.h"

static char *mock_cfg[] = {"test.mock.num.brokers", "1", "linger.ms", "5"};

static void produce_some(tm_kafka_out *ko, int n, int base) {
    tm_err err = {0};
    char key[32], val[64];
    for (int i = 0; i < n; i++) {
        snprintf(key, sizeof(key), "\"r%d\"", base + i);
        snprintf(val, sizeof(val), "{\"id\":\"r%d\",\"text\":\"t\"}", base + i);
        TM_CHECK_OK(tm_kafka_out_send(ko, key, strlen(key), val, strlen(val), &err), &err);
    }
}

static void test_idempotent(void) {
    tm_err err = {0};
    tm_kafka_out *ko = NULL;
    tm_kafka_out_cfg cfg = {.brokers = "localhost:1",
                            .topic = "t1",
                            .config = mock_cfg,
                            .n_config = 2,
                            .timeout_s = 20};
    TM_CHECK_OK(tm_kafka_out_open(&cfg, &ko, &err), &err);
    produce_some(ko, 50, 0);
    TM_CHECK_OK(tm_kafka_out_commit(ko, NULL, 0, NULL, &err), &err);
    TM_CHECK(tm_kafka_out_n_acked(ko) == 50);
    produce_some(ko, 20, 50);
    TM_CHECK_OK(tm_kafka_out_commit(ko, NULL, 0, NULL, &err), &err);
    TM_CHECK(tm_kafka_out_n_acked(ko) == 70);
    tm_kafka_out_close(ko);
}

static void test_transactional(void) {
    tm_err err = {0};
    tm_kafka_out *ko = NULL;
    tm_kafka_out_cfg cfg = {.brokers = "localhost:1",
                            .topic = "t2",
                            .config = mock_cfg,
                            .n_config = 2,
                            .transactional_id = "tm-test-txn",
                            .timeout_s = 20};
    TM_CHECK_OK(tm_kafka_out_open(&cfg, &ko, &err), &err);
    tm_kafka_offset offs[] = {{.topic = "jobs", .partition = 0, .offset = 42},
                              {.topic = "jobs", .partition = 1, .offset = 7}};
    produce_some(ko, 30, 0);
    TM_CHECK_OK(tm_kafka_out_commit(ko, offs, 2, "tm-group", &err), &err);
    produce_some(ko, 10, 30);
    offs[0].offset = 52;
    TM_CHECK_OK(tm_kafka_out_commit(ko, offs, 2, "tm-group", &err), &err);
    TM_CHECK(tm_kafka_out_n_acked(ko) == 40);
    produce_some(ko, 5, 40); // left in an open transaction: close aborts it
    tm_kafka_out_close(ko);
}

static void test_bad_setting(void) {
    tm_err err = {0};
    tm_kafka_out *ko = NULL;
    char *bad[] = {"no.such.setting", "1"};
    tm_kafka_out_cfg cfg = {.brokers = "localhost:1", .topic = "t", .config = bad, .n_config = 1};
    TM_CHECK(tm_kafka_out_open(&cfg, &ko, &err) == TM_E_KAFKA);
    TM_CHECK(strstr(err.msg, "no.such.setting") != NULL);
}

int main(void) {
    tm_err err = {0};
    tm_kafka_out *ko = NULL;
    tm_kafka_out_cfg probe = {
        .brokers = "localhost:1", .topic = "p", .config = mock_cfg, .n_config = 1};
    if (tm_kafka_out_open(&probe, &ko, &err) != TM_OK && strstr(err.msg, "without librdkafka"))
        tm_test_skip(err.msg);
    tm_kafka_out_close(ko);
    TM_RUN(test_idempotent);
    TM_RUN(test_transactional);
    TM_RUN(test_bad_setting);
    return tm_test_report();
}
