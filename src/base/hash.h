/* base/hash.h - the one hashing module: XXH3 (xxhash, seed 0, default secret) over bytes, 64- and
 * 128-bit, one-shot or streaming; the splitmix64 finaliser for single 64-bit words; and the
 * frozen two-lane FNV hash behind the sink's OpenAI ids. Only base/hash.c includes xxhash.h.
 *
 * Values are stable: XXH3 is a specified algorithm (tests/unit/test_hash.c checks the xxhash
 * project's reference vectors), and some of its outputs are persisted (manifest.json's spec_hash
 * and file fingerprints decide whether a folder holds "the same job" on resume). Pure functions,
 * no state, thread-safe. Not cryptographic: never use these where an adversary picks inputs to
 * collide and a collision costs more than a slower lookup. */
#ifndef TM_BASE_HASH_H
#define TM_BASE_HASH_H

#include <stddef.h>
#include <stdint.h>

/* splitmix64's increment, 2^64 / golden ratio (odd). */
#define TM_HASH_GOLDEN64 0x9e3779b97f4a7c15ull

/* A 128-bit hash: lo and hi are XXH128_hash_t's low64 and high64. Its canonical text (manifest
 * spec_hash) is hi then lo, as 32 hex digits. */
typedef struct tm_h128 {
    uint64_t lo, hi;
} tm_h128;

/* Streaming XXH3 state (an XXH3_state_t inside; hash.c checks that it fits). Caller-provided
 * storage with 64-byte alignment: a local or static variable, or memory from an aligned
 * allocation (plain tm_malloc is not enough). Holds no resources: there is no fini. */
typedef struct tm_hash_stream {
    _Alignas(64) unsigned char opaque[640];
} tm_hash_stream;

/* XXH3_64bits(p, n). p may be NULL when n == 0. */
uint64_t tm_hash64(const void *p, size_t n);
/* XXH3_128bits(p, n). p may be NULL when n == 0. */
tm_h128 tm_hash128(const void *p, size_t n);

/* Start a stream. Feeding it bytes in any split gives the one-shot value of their concatenation:
 * digest64 equals tm_hash64, digest128 equals tm_hash128. */
void tm_hash_stream_init(tm_hash_stream *st);
/* Append p[0..n) (p may be NULL when n == 0). */
void tm_hash_stream_update(tm_hash_stream *st, const void *p, size_t n);
/* The hash of everything appended so far; the stream is unchanged and may go on. */
uint64_t tm_hash_stream_digest64(const tm_hash_stream *st);
tm_h128 tm_hash_stream_digest128(const tm_hash_stream *st);

/* The splitmix64 finaliser (Stafford's "Mix13"): a bijection on 64-bit words whose every output
 * bit depends on every input bit. The splitmix64 generator's output for state s is
 * tm_hash_mix64(s + TM_HASH_GOLDEN64). The sampler's uniforms (runner/sched/sample.h) are made of
 * it, so its values must never change. */
static inline uint64_t tm_hash_mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Frozen: the two-lane FNV hash of the OpenAI-format ids the sink writes (batch_req_<hex>, see
 * sink/sink.c), kept bit for bit so that ids stay the same across versions and resumed runs. lo
 * is FNV-1a 64 of p[0..n); hi runs the same loop with multiplier TM_HASH_GOLDEN64 from
 * 0x84222325cbf29ce4 ^ seed. Not for new uses: take tm_hash128. */
tm_h128 tm_hash_fnv2x64(const void *p, size_t n, uint64_t seed);

#endif /* TM_BASE_HASH_H */
