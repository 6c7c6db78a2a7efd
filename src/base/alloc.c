/* base/alloc.c - counted allocation with an injectable failure. */
#include "base/alloc.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static atomic_long g_live;
static atomic_long g_fail_countdown; /* 0: off; k > 0: the k-th next allocation fails */

static int should_fail(void) {
    long k = atomic_load(&g_fail_countdown);
    if (k <= 0)
        return 0;
    k = atomic_fetch_sub(&g_fail_countdown, 1);
    return k == 1;
}

void tm_fault_set(tm_fault what, long n) {
    (void)what;
    atomic_store(&g_fail_countdown, n);
}

long tm_alloc_live(void) { return atomic_load(&g_live); }

void *tm_malloc(size_t n_bytes) {
    if (should_fail())
        return NULL;
    void *p = malloc(n_bytes ? n_bytes : 1);
    if (p)
        atomic_fetch_add(&g_live, 1);
    return p;
}

void *tm_calloc(size_t n, size_t size) {
    if (size && n > SIZE_MAX / size)
        return NULL;
    if (should_fail())
        return NULL;
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (p)
        atomic_fetch_add(&g_live, 1);
    return p;
}

void *tm_realloc(void *p, size_t n_bytes) {
    if (!p)
        return tm_malloc(n_bytes);
    if (should_fail())
        return NULL;
    return realloc(p, n_bytes ? n_bytes : 1);
}

void tm_free(void *p) {
    if (!p)
        return;
    atomic_fetch_sub(&g_live, 1);
    free(p);
}

char *tm_strndup(const char *s, size_t n) {
    char *d = tm_malloc(n + 1);
    if (!d)
        return NULL;
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

char *tm_strdup(const char *s) { return tm_strndup(s, strlen(s)); }
