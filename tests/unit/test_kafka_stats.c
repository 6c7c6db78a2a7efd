/* tests/unit/test_kafka_stats.c - base/kafka_stats.h: the down brokers of librdkafka's statistics
 * JSON (what the Kafka source and sink log when the set changes): states DOWN, TRY_CONNECT and
 * CONNECT count, UP and INIT do not, bootstrap entries (nodeid -1) are left out, the order is the
 * JSON's, and no brokers / no "brokers" / text that does not parse give NULL. */
#include <string.h>

#include "tm_test.h"
#include "base/alloc.h"
#include "base/kafka_stats.h"

static char *down_of(const char *json) { return tm_kafka_stats_brokers_down(json, strlen(json)); }

static void test_states(void) {
    const char *json = "{\"name\":\"rdkafka#producer-1\",\"brokers\":{"
                       "\"127.0.0.1:9092/bootstrap\":{\"nodeid\":-1,\"state\":\"DOWN\"},"
                       "\"127.0.0.1:9093/1\":{\"nodeid\":1,\"state\":\"UP\"},"
                       "\"127.0.0.1:9094/2\":{\"nodeid\":2,\"state\":\"DOWN\"},"
                       "\"127.0.0.1:9095/3\":{\"nodeid\":3,\"state\":\"INIT\"},"
                       "\"127.0.0.1:9096/4\":{\"nodeid\":4,\"state\":\"TRY_CONNECT\"},"
                       "\"127.0.0.1:9097/5\":{\"nodeid\":5,\"state\":\"CONNECT\"},"
                       "\"127.0.0.1:9098/6\":{\"nodeid\":6}}}";
    char *d = down_of(json);
    TM_CHECK(d != NULL);
    TM_CHECK_MSG(d && strcmp(d, "127.0.0.1:9094/2, 127.0.0.1:9096/4, 127.0.0.1:9097/5") == 0,
                 "got %s", d ? d : "(null)");
    tm_free(d);
}

static void test_none(void) {
    char *d = down_of("{\"brokers\":{\"a:1/1\":{\"nodeid\":1,\"state\":\"UP\"}}}");
    TM_CHECK(d == NULL);
    tm_free(d);
    d = down_of("{\"brokers\":{}}");
    TM_CHECK(d == NULL);
    d = down_of("{\"name\":\"x\"}");
    TM_CHECK(d == NULL);
    d = down_of("{\"brokers\":{\"a:1/1\":{\"nodeid\":1,\"state\":\"DOWN\"}"); // cut short
    TM_CHECK(d == NULL);
    // Only n bytes are read: the text librdkafka hands over need not end in a NUL.
    const char *two = "{\"brokers\":{\"a:1/1\":{\"nodeid\":1,\"state\":\"DOWN\"}}}trailing";
    d = tm_kafka_stats_brokers_down(two, strlen(two) - strlen("trailing"));
    TM_CHECK(d && strcmp(d, "a:1/1") == 0);
    tm_free(d);
}

int main(void) {
    TM_RUN(test_states);
    TM_RUN(test_none);
    return tm_test_report();
}
