/* tools/kafka_mock.c - a Kafka cluster for tests and demos (docs/kafka.md): librdkafka's
 * in-process mock cluster (a real Kafka protocol server on loopback), with topics created up
 * front. Prints "bootstrap.servers=<list>" on one line of stdout, then serves until SIGINT/SIGTERM
 * (or the "exit" command). With --stdin, control commands come on stdin, one per line:
 * "down <broker>", "up <broker>" (broker id 1..N, -1 = all), "leader <topic> <partition>
 * <broker>", "create <topic> <partitions>", "exit". When stdin ends the cluster keeps serving
 * (until a signal), unless --exit-on-eof.
 *
 *   kafka_mock [--brokers N] [--stdin [--exit-on-eof]] TOPIC:PARTITIONS...
 *
 * The mock API is experimental in librdkafka 2.0.2; this file is the only user of it. */
#define _POSIX_C_SOURCE 200809L
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t g_stop;
static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

int main(int argc, char **argv) {
    int n_brokers = 3, use_stdin = 0, exit_on_eof = 0, first_topic = argc;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--brokers") == 0 && i + 1 < argc) {
            n_brokers = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--stdin") == 0) {
            use_stdin = 1;
        } else if (strcmp(argv[i], "--exit-on-eof") == 0) {
            exit_on_eof = 1;
        } else {
            first_topic = i;
            break;
        }
    }
    if (n_brokers < 1 || first_topic >= argc) {
        fprintf(stderr, "usage: kafka_mock [--brokers N] [--stdin [--exit-on-eof]] "
                        "TOPIC:PARTITIONS...\n"
                        "  commands on stdin (--stdin): down B | up B | leader T P B | "
                        "create T N | exit\n");
        return 2;
    }
    char errstr[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "log_level", "3", errstr, sizeof(errstr));
    rd_kafka_t *host = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
    if (!host) {
        fprintf(stderr, "kafka_mock: %s\n", errstr);
        return 1;
    }
    rd_kafka_mock_cluster_t *mc = rd_kafka_mock_cluster_new(host, n_brokers);
    if (!mc) {
        fprintf(stderr, "kafka_mock: cannot create the mock cluster\n");
        rd_kafka_destroy(host);
        return 1;
    }
    int rc = 0;
    for (int i = first_topic; i < argc && !rc; i++) {
        char name[256];
        int parts = 1;
        const char *colon = strrchr(argv[i], ':');
        size_t n = colon ? (size_t)(colon - argv[i]) : strlen(argv[i]);
        if (colon)
            parts = atoi(colon + 1);
        if (n == 0 || n >= sizeof(name) || parts < 1) {
            fprintf(stderr, "kafka_mock: bad topic spec %s (want NAME:PARTITIONS)\n", argv[i]);
            rc = 2;
            break;
        }
        memcpy(name, argv[i], n);
        name[n] = '\0';
        rd_kafka_resp_err_t e = rd_kafka_mock_topic_create(mc, name, parts,
                                                           n_brokers < 3 ? n_brokers : 3);
        if (e) {
            fprintf(stderr, "kafka_mock: topic %s: %s\n", name, rd_kafka_err2str(e));
            rc = 1;
        }
    }
    if (!rc) {
        struct sigaction sa = {0};
        sa.sa_handler = on_signal;
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        printf("bootstrap.servers=%s\n", rd_kafka_mock_cluster_bootstraps(mc));
        fflush(stdout);
        char line[512];
        while (!g_stop) {
            if (!use_stdin) {
                pause();
                continue;
            }
            if (!fgets(line, sizeof(line), stdin)) {
                if (exit_on_eof)
                    break;
                use_stdin = 0; // input closed: serve on until a signal
                fprintf(stderr, "kafka_mock: stdin closed; serving until SIGINT/SIGTERM\n");
                continue;
            }
            char topic[256];
            int a = 0, b = 0;
            rd_kafka_resp_err_t e = RD_KAFKA_RESP_ERR_NO_ERROR;
            if (strncmp(line, "exit", 4) == 0)
                break;
            if (sscanf(line, "create %255s %d", topic, &a) == 2)
                e = a < 1 ? RD_KAFKA_RESP_ERR_INVALID_PARTITIONS
                          : rd_kafka_mock_topic_create(mc, topic, a, n_brokers < 3 ? n_brokers : 3);
            else if (sscanf(line, "down %d", &a) == 1)
                e = rd_kafka_mock_broker_set_down(mc, a);
            else if (sscanf(line, "up %d", &a) == 1)
                e = rd_kafka_mock_broker_set_up(mc, a);
            else if (sscanf(line, "leader %255s %d %d", topic, &a, &b) == 3)
                e = rd_kafka_mock_partition_set_leader(mc, topic, a, b);
            else
                fprintf(stderr, "kafka_mock: unknown command: %s", line);
            fprintf(stderr, "kafka_mock: %s", line);
            if (e)
                fprintf(stderr, "kafka_mock: %s\n", rd_kafka_err2str(e));
        }
    }
    rd_kafka_mock_cluster_destroy(mc);
    rd_kafka_destroy(host);
    return rc;
}
