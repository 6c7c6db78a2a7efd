/* tests/unit/test_hash.c - base/hash.h known answers: XXH3-64 and XXH3-128 against the xxhash
 * project's reference vectors (one-shot and streamed in several splits), XXH3-64 against LLVM's
 * independent implementation, the splitmix64 finaliser against the published splitmix64
 * outputs, and the values users see or that are persisted: the sampler's uniforms and per-sample
 * seeds, prefix-cache keys, the sink's OpenAI ids and the manifest's fingerprints. The expected
 * values of the last group were taken from the code before it moved onto base/hash.h (commit
 * e6a559a); they must never change. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tm_test.h"
#include "base/alloc.h"
#include "base/buf.h"
#include "base/hash.h"
#include "runner/sched/prefix_cache.h"
#include "runner/sched/sample.h"
#include "sink/manifest.h"
#include "sink/sink.h"

#define PRIME32 2654435761u
#define PRIME64 11400714785074694797ull

// xxhash cli/xsum_sanity_check.c, XSUM_fillTestBuffer: the buffer its vectors hash.
static void fill_sanity(unsigned char *buf, size_t n) {
    uint64_t gen = PRIME32;
    for (size_t i = 0; i < n; i++) {
        buf[i] = (unsigned char)(gen >> 56);
        gen *= PRIME64;
    }
}

// llvm/unittests/Support/xxhashTest.cpp, TEST(xxhashTest, xxh3): an xorshift64 byte buffer.
static void fill_llvm(unsigned char *buf, size_t n) {
    uint64_t x = 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        buf[i] = (unsigned char)x;
    }
}

enum { SANITY_LEN = 2367, LLVM_LEN = 2243 };

// Stream buf[0..n) in three ways: whole, byte by byte, and in pseudo-random pieces (some empty);
// all must equal the one-shot values.
static void check_streams(const unsigned char *buf, size_t n, uint64_t want64, tm_h128 want128) {
    tm_hash_stream st;
    tm_hash_stream_init(&st);
    tm_hash_stream_update(&st, buf, n);
    TM_CHECK_MSG(tm_hash_stream_digest64(&st) == want64, "whole stream, len %zu", n);
    tm_h128 h = tm_hash_stream_digest128(&st);
    TM_CHECK_MSG(h.lo == want128.lo && h.hi == want128.hi, "whole stream 128, len %zu", n);

    tm_hash_stream_init(&st);
    for (size_t i = 0; i < n; i++)
        tm_hash_stream_update(&st, buf + i, 1);
    TM_CHECK_MSG(tm_hash_stream_digest64(&st) == want64, "byte stream, len %zu", n);
    h = tm_hash_stream_digest128(&st);
    TM_CHECK_MSG(h.lo == want128.lo && h.hi == want128.hi, "byte stream 128, len %zu", n);

    uint64_t r = 0x12345678u + n;
    tm_hash_stream_init(&st);
    for (size_t p = 0; p < n;) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        size_t l = (size_t)(r >> 33) % 300;
        if (l > n - p)
            l = n - p;
        tm_hash_stream_update(&st, buf + p, l);
        p += l;
        // A digest in the middle leaves the stream as it was.
        if ((r >> 20) % 4 == 0)
            (void)tm_hash_stream_digest64(&st);
    }
    TM_CHECK_MSG(tm_hash_stream_digest64(&st) == want64, "random stream, len %zu", n);
    h = tm_hash_stream_digest128(&st);
    TM_CHECK_MSG(h.lo == want128.lo && h.hi == want128.hi, "random stream 128, len %zu", n);
}

// Seed-0 vectors of xsum_sanity_check.c (XSUM_XXH3_testdata, XSUM_XXH128_testdata).
static void test_xxh3_reference(void) {
    static const struct {
        uint32_t len;
        uint64_t h;
    } v64[] = {
        {0, 0x2D06800538D394C2ull},    {1, 0xC44BDFF4074EECDBull},    {6, 0x27B56A84CD2D7325ull},
        {12, 0xA713DAF0DFBB77E7ull},   {24, 0xA3FE70BF9D3510EBull},   {48, 0x397DA259ECBA1F11ull},
        {80, 0xBCDEFBBB2C47C90Aull},   {195, 0xCD94217EE362EC3Aull},  {403, 0xCDEB804D65C6DEA4ull},
        {512, 0x617E49599013CB6Bull},  {2048, 0xDD59E2C3A5F038E0ull}, {2240, 0x6E73A90539CF2948ull},
        {2367, 0xCB37AEB9E5D361EDull},
    };
    static const struct {
        uint32_t len;
        tm_h128 h;
    } v128[] = {
        {0, {0x6001C324468D497Full, 0x99AA06D3014798D8ull}},
        {1, {0xC44BDFF4074EECDBull, 0xA6CD5E9392000F6Aull}},
        {6, {0x3E7039BDDA43CFC6ull, 0x082AFE0B8162D12Aull}},
        {12, {0x061A192713F69AD9ull, 0x6E3EFD8FC7802B18ull}},
        {24, {0x1E7044D28B1B901Dull, 0x0CE966E4678D3761ull}},
        {48, {0xF942219AED80F67Bull, 0xA002AC4E5478227Eull}},
        {81, {0x5E8BAFB9F95FB803ull, 0x4952F58181AB0042ull}},
        {222, {0xF1AEBD597CEC6B3Aull, 0x337E09641B948717ull}},
        {403, {0xCDEB804D65C6DEA4ull, 0x1B6DE21E332DD73Dull}},
        {512, {0x617E49599013CB6Bull, 0x18D2D110DCC9BCA1ull}},
        {2048, {0xDD59E2C3A5F038E0ull, 0xF736557FD47073A5ull}},
        {2240, {0x6E73A90539CF2948ull, 0xCCB134FBFA7CE49Dull}},
        {2367, {0xCB37AEB9E5D361EDull, 0xE89C0F6FF369B427ull}},
    };
    unsigned char *buf = tm_malloc(SANITY_LEN);
    TM_ASSERT(buf);
    fill_sanity(buf, SANITY_LEN);
    for (size_t i = 0; i < sizeof(v64) / sizeof(v64[0]); i++) {
        uint64_t h = tm_hash64(buf, v64[i].len);
        TM_CHECK_MSG(h == v64[i].h, "XXH3-64 len %u: got %016llx", v64[i].len,
                     (unsigned long long)h);
        check_streams(buf, v64[i].len, v64[i].h, tm_hash128(buf, v64[i].len));
    }
    for (size_t i = 0; i < sizeof(v128) / sizeof(v128[0]); i++) {
        tm_h128 h = tm_hash128(buf, v128[i].len);
        TM_CHECK_MSG(h.lo == v128[i].h.lo && h.hi == v128[i].h.hi,
                     "XXH3-128 len %u: got %016llx %016llx", v128[i].len, (unsigned long long)h.lo,
                     (unsigned long long)h.hi);
        check_streams(buf, v128[i].len, tm_hash64(buf, v128[i].len), v128[i].h);
    }
    // For 1..3 bytes the 64-bit hash is the 128-bit one's low half (see the vectors).
    TM_CHECK(tm_hash64(buf, 1) == tm_hash128(buf, 1).lo);
    TM_CHECK(tm_hash64(NULL, 0) == 0x2D06800538D394C2ull);
    tm_free(buf);
}

static void test_xxh3_llvm(void) {
    static const struct {
        uint32_t len;
        uint64_t h;
    } v[] = {
        {0, 0x2d06800538d394c2ull},    {1, 0xd0d496e05c553485ull},    {2, 0x84d625edb7055eacull},
        {3, 0x6ea2d59aca5c3778ull},    {4, 0xbf65290914e80242ull},    {5, 0xc01fd099ad4fc8e4ull},
        {6, 0x9e3ea8187399caa5ull},    {7, 0x9da8b60540644f5aull},    {8, 0xabc1413da6cd0209ull},
        {9, 0x8bc89400bfed51f6ull},    {16, 0x7e46916754d7c9b8ull},   {17, 0xed4be912ba5f836dull},
        {32, 0xf59b59b58c304fd1ull},   {33, 0x9013fb74ca603e0cull},   {64, 0xfa5271fcce0db1c3ull},
        {65, 0x79c42431727f1012ull},   {96, 0x591ee0ddf9c9ccd1ull},   {97, 0x8ffc6a3111fe19daull},
        {128, 0x06a146ee9a2da378ull},  {129, 0xbc7138129bf065daull},  {403, 0xcefeb3ffa532ad8cull},
        {512, 0xcdfa6b6268e3650full},  {513, 0x4bb5d42742f9765full},  {2048, 0x330ce110cbb79eaeull},
        {2049, 0x3ba6afa0249fef9aull}, {2240, 0xd61d4d2a94e926a8ull}, {2243, 0x0979f786a24edde7ull},
    };
    unsigned char *buf = tm_malloc(LLVM_LEN);
    TM_ASSERT(buf);
    fill_llvm(buf, LLVM_LEN);
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        uint64_t h = tm_hash64(buf, v[i].len);
        TM_CHECK_MSG(h == v[i].h, "XXH3-64 (LLVM buffer) len %u: got %016llx", v[i].len,
                     (unsigned long long)h);
    }
    tm_free(buf);
}

// splitmix64 (Steele, Lea, Flood 2014; Vigna's splitmix64.c) from state 0: its first outputs.
static void test_mix64(void) {
    static const uint64_t want[4] = {0xe220a8397b1dcdafull, 0x6e789e6aa1b965f4ull,
                                     0x06c45d188009454full, 0xf88bb8a8724c81ecull};
    uint64_t s = 0;
    for (int i = 0; i < 4; i++) {
        s += TM_HASH_GOLDEN64;
        TM_CHECK_MSG(tm_hash_mix64(s) == want[i], "splitmix64 output %d", i);
    }
    TM_CHECK(tm_hash_mix64(0) == 0);
    TM_CHECK(tm_hash_mix64(1) == 0x5692161d100b05e5ull);
}

// tm_sample_uniform(seed, step) is (r >> 11) * 2^-53 for a 64-bit r: the 53-bit integers below
// are the values the sampler gave before base/hash.h existed. Sampled tokens follow from them.
static void test_sampler_uniform(void) {
    static const struct {
        uint64_t seed, step, bits53;
    } v[] = {
        {0, 0, 0x17fb4d82c604e3ull},
        {1, 0, 0x185c1b274414caull},
        {1, 1, 0x1a051cbe7c1087ull},
        {42, 7, 0xd9f0bbc7ae3c8ull},
        {0xdeadbeefull, 123456, 0x1874636a4e6099ull},
        {UINT64_MAX, UINT64_MAX, 0xfabfd0deb4b0aull},
        {1234, 0, 0x15a31b35776bffull},
        {1234, 1, 0x1ea61b02534924ull},
        {1234, 2, 0x12408db7c46ee7ull},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        double u = tm_sample_uniform(v[i].seed, v[i].step);
        TM_CHECK_MSG(u == (double)v[i].bits53 * 0x1p-53, "uniform(%llu, %llu) = %a",
                     (unsigned long long)v[i].seed, (unsigned long long)v[i].step, u);
    }
    static const struct {
        uint64_t seed;
        uint32_t i;
        uint64_t want;
    } s[] = {
        {0, 0, 0},
        {0, 1, 0x98bc9b3a9f64da94ull},
        {0, 3, 0x11bb9e183cd97da3ull},
        {1, 2, 0x9376d402770cf41cull},
        {42, 1, 0xcd291a3e1fc59878ull},
        {42, 3, 0x61ebcd8edfe3eeffull},
        {0xdeadbeefull, 0, 0xdeadbeefull},
        {0xdeadbeefull, 2, 0x807e0964bbf5986aull},
    };
    for (size_t i = 0; i < sizeof(s) / sizeof(s[0]); i++)
        TM_CHECK_MSG(tm_sample_seed_of(s[i].seed, s[i].i) == s[i].want, "seed_of(%llu, %u)",
                     (unsigned long long)s[i].seed, s[i].i);
}

static void test_prefix_keys(void) {
    uint32_t toks[5] = {1, 2, 3, 4, 5};
    tm_bhash k0 = tm_pcache_key(NULL, 0, toks, 5);
    tm_bhash k1 = tm_pcache_key(&k0, 77, toks, 3);
    tm_bhash k2 = tm_pcache_key(NULL, 0, toks, 0);
    TM_CHECK(k0.lo == 0x7e790e5634064758ull && k0.hi == 0xf792ede9ea92449full);
    TM_CHECK(k1.lo == 0xb3fd71d48fbddf98ull && k1.hi == 0xca38b373a632ac6dull);
    TM_CHECK(k2.lo == 0x743df94ee4c78a2aull && k2.hi == 0x10e45c7ce2292320ull);
    // The key is XXH3-128 of {parent.lo, parent.hi, salt} followed by the token ids.
    unsigned char b[24 + 12];
    uint64_t head[3] = {k0.lo, k0.hi, 77};
    memcpy(b, head, 24);
    memcpy(b + 24, toks, 12);
    tm_h128 h = tm_hash128(b, sizeof(b));
    TM_CHECK(h.lo == k1.lo && h.hi == k1.hi);
}

// FNV-1a 64 (the lo lane) on the FNV reference strings, and the sink's OpenAI ids.
static void test_fnv_and_sink_ids(void) {
    TM_CHECK(tm_hash_fnv2x64("", 0, 0).lo == 0xcbf29ce484222325ull);
    TM_CHECK(tm_hash_fnv2x64("a", 1, 0).lo == 0xaf63dc4c8601ec8cull);
    TM_CHECK(tm_hash_fnv2x64("foobar", 6, 0).lo == 0x85944171f73967e8ull);
    TM_CHECK(tm_hash_fnv2x64("", 0, 5).hi == (0x84222325cbf29ce4ull ^ 5));
    static const struct {
        const char *id_json;
        uint64_t seq_no;
        const char *hex;
    } v[] = {
        {"\"req-1\"", 0, "b9e4d3ee2a9098698a410780b5fc1a4e"},
        {"\"a\"", 5, "d4272417d7c77eea2e486ba1884dfc64"},
        {"12345", 9, "e575e8883c0f89f8683a9737f5d62744"},
        {"\"\\u00e9t\\u00e9\"", 1000000, "127a66011aaa2fb9749fbbf6ba418d0c"},
        {NULL, 9, "322db273dc23d01084222325cbf29ced"},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        tm_completion c = {.seq_no = v[i].seq_no,
                           .id_json = (char *)v[i].id_json,
                           .err_code = TM_ERRCODE_INVALID_JSON,
                           .err_msg = "m",
                           .format = TM_REC_FORMAT_OPENAI,
                           .file = "f",
                           .line = 1};
        tm_buf b = {0};
        tm_err err = {0};
        TM_CHECK_OK(tm_sink_format_error(&b, &c, &err), &err);
        char want[64];
        snprintf(want, sizeof(want), "{\"id\":\"batch_req_%s\"", v[i].hex);
        TM_CHECK_MSG(b.data && strncmp(b.data, want, strlen(want)) == 0, "id %s: %.60s",
                     v[i].id_json ? v[i].id_json : "NULL", b.data ? b.data : "");
        tm_buf_fini(&b);
    }
}

static void write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    TM_ASSERT(f);
    TM_ASSERT(fwrite(p, 1, n, f) == n);
    TM_ASSERT(fclose(f) == 0);
}

// manifest.json's spec_hash (XXH3-128, hi then lo) and model file fingerprints (XXH3-64, read in
// 1 MiB chunks) are compared on resume: pin them to the reference vectors.
static void test_manifest_fingerprints(void) {
    char dir[] = "/tmp/tm_test_hash_XXXXXX";
    TM_ASSERT(mkdtemp(dir));
    char cfg[256], tok[256];
    snprintf(cfg, sizeof(cfg), "%s/config.json", dir);
    snprintf(tok, sizeof(tok), "%s/tokenizer.json", dir);
    unsigned char *buf = tm_malloc(SANITY_LEN);
    TM_ASSERT(buf);
    fill_sanity(buf, SANITY_LEN);
    write_file(tok, buf, SANITY_LEN);
    size_t n_big = (5u << 19) + 3; // 2.5 MiB + 3: three reads of the 1 MiB chunk
    unsigned char *big = tm_malloc(n_big);
    TM_ASSERT(big);
    fill_llvm(big, n_big);
    write_file(cfg, big, n_big);
    tm_manifest m = {0};
    tm_err err = {0};
    TM_CHECK_OK(tm_manifest_identify(&m, "", "job.json", dir, NULL, 0, &err), &err);
    TM_CHECK(strcmp(m.spec_hash, "99aa06d3014798d86001c324468d497f") == 0);
    TM_CHECK(m.n_model_files == 2);
    if (m.n_model_files == 2) {
        char want[17];
        snprintf(want, sizeof(want), "%016llx", (unsigned long long)tm_hash64(big, n_big));
        TM_CHECK(strcmp(m.model_files[0].name, "config.json") == 0);
        TM_CHECK(strcmp(m.model_files[0].xxh3, want) == 0);
        TM_CHECK(strcmp(m.model_files[1].name, "tokenizer.json") == 0);
        TM_CHECK(strcmp(m.model_files[1].xxh3, "cb37aeb9e5d361ed") == 0);
    }
    tm_manifest_fini(&m);
    const char *spec = "{\"model\":\"m\"}";
    TM_CHECK_OK(tm_manifest_identify(&m, spec, "job.json", dir, NULL, 0, &err), &err);
    tm_h128 h = tm_hash128(spec, strlen(spec));
    char want[33];
    snprintf(want, sizeof(want), "%016llx%016llx", (unsigned long long)h.hi,
             (unsigned long long)h.lo);
    TM_CHECK(strcmp(m.spec_hash, want) == 0);
    tm_manifest_fini(&m);
    unlink(cfg);
    unlink(tok);
    rmdir(dir);
    tm_free(big);
    tm_free(buf);
}

int main(void) {
    TM_RUN(test_xxh3_reference);
    TM_RUN(test_xxh3_llvm);
    TM_RUN(test_mix64);
    TM_RUN(test_sampler_uniform);
    TM_RUN(test_prefix_keys);
    TM_RUN(test_fnv_and_sink_ids);
    TM_RUN(test_manifest_fingerprints);
    return tm_test_report();
}
