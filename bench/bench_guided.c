/* bench/bench_guided.c - structured output's per-step mask cost (issue 26) on a real vocabulary:
 * builds the vocabulary trie of a tokenizer (tokenizer.json dir), compiles a constraint, then runs
 * `batch` simulated sequences for `steps` decode steps. Each step every unfinished sequence looks
 * up the mask of its DFA state (as the runner does), picks a random allowed token (uniform, fixed
 * seed) and advances; a finished sequence restarts. Pass 1 starts from an empty mask cache
 * (cold), pass 2 replays the same picks on the filled cache. Prints one line per pass: the time of
 * a step's mask lookups for the whole batch (mean, p50, p99, max), the masks computed, plus the
 * trie build, compile and mask-class (tm_guide_create) times.
 *
 *   bench_guided TOKENIZER_DIR KIND SPEC [batch=8] [steps=256]
 *     KIND: json_schema | json_object | regex | choice; SPEC: its text ("" for json_object) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "runner/guided/guided.h"
#include "runner/text/tokenizer.h"

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// A uniformly random allowed id of mask (n_vocab ids), or UINT32_MAX if none.
static uint32_t pick(const uint32_t *m, uint32_t n_vocab, uint64_t *rng) {
    uint32_t n = 0;
    for (uint32_t w = 0; w < (n_vocab + 31) / 32; w++)
        n += (uint32_t)__builtin_popcount(m[w]);
    if (!n)
        return UINT32_MAX;
    uint32_t k = (uint32_t)(rng_next(rng) % n);
    for (uint32_t w = 0;; w++) {
        uint32_t c = (uint32_t)__builtin_popcount(m[w]);
        if (k < c) {
            uint32_t x = m[w];
            while (k--)
                x &= x - 1;
            return w * 32 + (uint32_t)__builtin_ctz(x);
        }
        k -= c;
    }
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: bench_guided TOKENIZER_DIR KIND SPEC [batch] [steps]\n");
        return 2;
    }
    const char *kinds[] = {"", "json_schema", "json_object", "regex", "choice"};
    tm_guide_kind kind = TM_GUIDE_KIND_NONE;
    for (int i = 1; i < 5; i++)
        if (strcmp(argv[2], kinds[i]) == 0)
            kind = (tm_guide_kind)i;
    uint32_t batch = argc > 4 ? (uint32_t)atoi(argv[4]) : 8;
    uint32_t steps = argc > 5 ? (uint32_t)atoi(argv[5]) : 256;
    if (!kind || batch == 0 || steps == 0) {
        fprintf(stderr, "bench_guided: bad KIND, batch or steps\n");
        return 2;
    }
    tm_err err = {0};
    tm_tokenizer *tok = NULL;
    if (tm_tok_load(argv[1], &tok, &err)) {
        fprintf(stderr, "bench_guided: %s\n", err.msg);
        return 1;
    }
    uint32_t n_vocab = tm_tok_n_vocab(tok);
    const char **piece = tm_calloc(n_vocab, sizeof(*piece));
    size_t *len = tm_calloc(n_vocab, sizeof(*len));
    for (uint32_t i = 0; i < n_vocab; i++)
        if (!tm_tok_is_special(tok, i))
            piece[i] = tm_tok_piece(tok, i, &len[i]);
    uint32_t eos = (uint32_t)tm_tok_eos_id(tok);
    double t0 = tm_now_ms();
    tm_guide_vocab *v = NULL;
    if (tm_guide_vocab_create(piece, len, n_vocab, &eos, 1, &v, &err)) {
        fprintf(stderr, "bench_guided: %s\n", err.msg);
        return 1;
    }
    double t_trie = tm_now_ms() - t0;
    tm_free(piece);
    tm_free(len);
    tm_guide_why why;
    uint32_t *picks = tm_malloc((size_t)steps * batch * sizeof(uint32_t));
    double *dt = tm_malloc(steps * sizeof(double));
    uint32_t *state = tm_malloc(batch * sizeof(uint32_t));
    tm_dfa *d = NULL;
    t0 = tm_now_ms();
    if (tm_dfa_compile(kind, argv[3], strlen(argv[3]), &d, &why, &err)) {
        fprintf(stderr, "bench_guided: %s\n", err.msg);
        return 1;
    }
    double t_compile = tm_now_ms() - t0;
    uint32_t n_states = tm_dfa_n_states(d);
    tm_guide *g = NULL;
    t0 = tm_now_ms();
    if (tm_guide_create(d, v, &g, &err)) {
        fprintf(stderr, "bench_guided: %s\n", err.msg);
        return 1;
    }
    double t_guide = tm_now_ms() - t0;
    const tm_dfa *dd = tm_guide_dfa(g);
    if (batch > 256)
        batch = 256;
    const uint32_t *masks[256];
    for (int pass = 0; pass < 2; pass++) { // 0: empty cache; 1: the same picks, cache filled
        uint64_t rng = 42;
        uint32_t n_cold = 0, n_done = 0;
        for (uint32_t b = 0; b < batch; b++)
            state[b] = tm_dfa_start(dd);
        for (uint32_t st = 0; st < steps; st++) {
            // timed: what the runner does per step, the mask lookups of the batch
            double s0 = tm_now_ms();
            for (uint32_t b = 0; b < batch; b++) {
                int cold = 0;
                masks[b] = tm_guide_mask(g, state[b], NULL, &cold, &err);
                n_cold += cold;
            }
            dt[st] = tm_now_ms() - s0;
            for (uint32_t b = 0; b < batch; b++) {
                uint32_t id = pass == 0 ? pick(masks[b], n_vocab, &rng)
                                        : picks[(size_t)st * batch + b];
                picks[(size_t)st * batch + b] = id;
                size_t n = 0;
                const char *p = id == eos || id == UINT32_MAX ? NULL : tm_tok_piece(tok, id, &n);
                uint32_t q = p ? tm_dfa_walk(dd, state[b], p, n) : 0;
                if (q == 0 || tm_dfa_is_final(dd, q)) {
                    n_done++;
                    q = tm_dfa_start(dd); // a new record starts in this slot
                }
                state[b] = q;
            }
        }
        qsort(dt, steps, sizeof(double), cmp_d);
        double sum = 0;
        for (uint32_t i = 0; i < steps; i++)
            sum += dt[i];
        printf("%s: batch %u, %u steps, %u DFA states (%u mask classes), %u masks computed, %u "
               "outputs finished; per-step mask time (ms): mean %.4f p50 %.4f p99 %.4f max %.4f; "
               "compile %.1f ms, mask classes %.1f ms, trie %.1f ms (%u ids)\n",
               pass == 0 ? "cold" : "cached", batch, steps, n_states, tm_guide_n_classes(g), n_cold,
               n_done, sum / steps, dt[steps / 2], dt[(size_t)(steps * 0.99)], dt[steps - 1],
               t_compile, t_guide, t_trie, n_vocab);
    }
    tm_guide_destroy(g);
    tm_free(picks);
    tm_free(dt);
    tm_free(state);
    tm_guide_vocab_destroy(v);
    tm_tok_destroy(tok);
    return 0;
}
