/* base/alloc.h - host allocation with accounting and fault injection. Every host allocation in
 * tokenmill goes through these so tests can fail the n-th one (tm_fault_set) and so the live byte
 * count is known. Thread-safe (atomic counters). Not for device memory. */
#ifndef TM_BASE_ALLOC_H
#define TM_BASE_ALLOC_H

#include <stddef.h>

/* Like malloc/calloc/realloc/free; return NULL on failure (or injected fault). tm_free(NULL) is a
 * no-op. Sizes that overflow (calloc n*size) return NULL. */
void *tm_malloc(size_t n_bytes);
void *tm_calloc(size_t n, size_t size);
void *tm_realloc(void *p, size_t n_bytes);
void tm_free(void *p);
/* Copy of s (or of its first n bytes, NUL-terminated); NULL on failure. */
char *tm_strdup(const char *s);
char *tm_strndup(const char *s, size_t n);

typedef enum tm_fault { TM_FAULT_ALLOC = 0 } tm_fault;
/* Make the n-th (1-based) allocation from now fail; n = 0 switches injection off. Test-only. */
void tm_fault_set(tm_fault what, long n);
/* Allocations made so far that were not freed (count). */
long tm_alloc_live(void);

#endif /* TM_BASE_ALLOC_H */
