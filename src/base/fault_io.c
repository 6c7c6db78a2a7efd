/* base/fault_io.c - the environment-selected hooks of fault_io.h. Global state (allowed in base
 * for fault hooks): the parsed settings, written once under pthread_once, and atomic counters. */
#include "base/fault_io.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char point_name[64];
static long point_n; /* 0: no point selected */
static atomic_long point_calls;
static int io_op = -1; /* tm_io_op, TM_IO_OP_COUNT for "any", -1: off */
static long io_n;
static int io_sticky; /* '+': every call from the n-th on fails */
static int io_errno = ENOSPC;
static atomic_long io_calls;

static void parse_env(void) {
    const char *p = getenv("TM_FAULT_POINT");
    if (p && *p) {
        const char *colon = strchr(p, ':');
        size_t n = colon ? (size_t)(colon - p) : strlen(p);
        if (n < sizeof(point_name)) {
            memcpy(point_name, p, n);
            point_name[n] = '\0';
            point_n = colon ? atol(colon + 1) : 1;
        }
    }
    const char *s = getenv("TM_FAULT_IO");
    if (s && *s) {
        static const char *const names[] = {"write", "fsync", "rename", "truncate", "any"};
        for (int i = 0; i <= TM_IO_OP_COUNT; i++) {
            size_t k = strlen(names[i]);
            if (strncmp(s, names[i], k) == 0 && s[k] == ':') {
                io_op = i;
                char *end;
                io_n = strtol(s + k + 1, &end, 10);
                io_sticky = *end == '+';
                if (io_sticky)
                    end++;
                if (*end == ':')
                    io_errno = strcmp(end + 1, "EIO") == 0 ? EIO : ENOSPC;
            }
        }
    }
}

void tm_fault_point(const char *name) {
    pthread_once(&once, parse_env);
    if (point_n <= 0 || strcmp(name, point_name) != 0)
        return;
    if (atomic_fetch_add(&point_calls, 1) + 1 == point_n) {
        static const char msg[] = "tokenmill: TM_FAULT_POINT reached; exiting\n";
        ssize_t w = write(2, msg, sizeof(msg) - 1);
        (void)w;
        _exit(TM_FAULT_EXIT_CODE);
    }
}

int tm_fault_io(tm_io_op op) {
    pthread_once(&once, parse_env);
    if (io_op < 0 || (io_op != TM_IO_OP_COUNT && io_op != (int)op))
        return 0;
    long k = atomic_fetch_add(&io_calls, 1) + 1;
    return (k == io_n || (io_sticky && k > io_n)) ? io_errno : 0;
}
