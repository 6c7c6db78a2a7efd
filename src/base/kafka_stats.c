/* base/kafka_stats.c - the set of down brokers in librdkafka's statistics JSON (jansson). */
#include "base/kafka_stats.h"

#include <jansson.h>
#include <string.h>

#include "base/alloc.h"
#include "base/buf.h"
#include "base/err.h"

char *tm_kafka_stats_brokers_down(const char *text, size_t n) {
    json_t *root = json_loadb(text, n, 0, NULL);
    json_t *brokers = json_object_get(root, "brokers");
    tm_buf down = {0};
    tm_err err = {0};
    const char *name;
    json_t *b;
    json_object_foreach(brokers, name, b) {
        const char *st = json_string_value(json_object_get(b, "state"));
        if (json_integer_value(json_object_get(b, "nodeid")) < 0 || !st)
            continue;
        if (strcmp(st, "DOWN") != 0 && strcmp(st, "TRY_CONNECT") != 0 && strcmp(st, "CONNECT") != 0)
            continue;
        if (tm_buf_printf(&down, &err, "%s%s", down.len ? ", " : "", name) != TM_OK)
            break;
    }
    json_decref(root);
    char *out = down.len ? tm_strdup(down.data) : NULL;
    tm_buf_fini(&down);
    return out;
}
