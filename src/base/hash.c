/* base/hash.c - XXH3 behind tm_hash* (see hash.h); the only file that includes xxhash.h. */
#include "base/hash.h"

#include <stdalign.h>

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t's size, for tm_hash_stream */
#include <xxhash.h>

#include "base/err.h"

_Static_assert(sizeof(XXH3_state_t) <= sizeof(((tm_hash_stream *)0)->opaque),
               "tm_hash_stream is too small for this xxhash's XXH3_state_t");
_Static_assert(alignof(XXH3_state_t) <= alignof(tm_hash_stream),
               "tm_hash_stream is less aligned than XXH3_state_t");

static XXH3_state_t *state_of(tm_hash_stream *st) { return (XXH3_state_t *)(void *)st->opaque; }

static const XXH3_state_t *cstate_of(const tm_hash_stream *st) {
    return (const XXH3_state_t *)(const void *)st->opaque;
}

uint64_t tm_hash64(const void *p, size_t n) { return XXH3_64bits(p, n); }

tm_h128 tm_hash128(const void *p, size_t n) {
    XXH128_hash_t h = XXH3_128bits(p, n);
    return (tm_h128){h.low64, h.high64};
}

// One state serves both widths: XXH3_128bits_reset and _update are XXH3_64bits_reset and
// _update (xxhash >= 0.8.0); only the digests differ. test_hash checks both against one-shot.
void tm_hash_stream_init(tm_hash_stream *st) {
    XXH_errorcode rc = XXH3_64bits_reset(state_of(st));
    TM_ASSERT(rc == XXH_OK);
}

void tm_hash_stream_update(tm_hash_stream *st, const void *p, size_t n) {
    if (n == 0)
        return;
    XXH_errorcode rc = XXH3_64bits_update(state_of(st), p, n);
    TM_ASSERT(rc == XXH_OK);
}

uint64_t tm_hash_stream_digest64(const tm_hash_stream *st) {
    return XXH3_64bits_digest(cstate_of(st));
}

tm_h128 tm_hash_stream_digest128(const tm_hash_stream *st) {
    XXH128_hash_t h = XXH3_128bits_digest(cstate_of(st));
    return (tm_h128){h.low64, h.high64};
}

tm_h128 tm_hash_fnv2x64(const void *p, size_t n, uint64_t seed) {
    const unsigned char *s = p;
    uint64_t a = 0xcbf29ce484222325ull, b = 0x84222325cbf29ce4ull ^ seed;
    for (size_t i = 0; i < n; i++) {
        a = (a ^ s[i]) * 0x100000001b3ull;
        b = (b ^ s[i]) * TM_HASH_GOLDEN64;
    }
    return (tm_h128){a, b};
}
