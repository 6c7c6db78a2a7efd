/* runner/sched/sample.h - turning one row of logits into a token: logits processing (logit_bias,
 * repetition / frequency / presence penalties, a mask of ids), then greedy, or temperature + top-k
 * + top-p + min-p sampling with a counter-based RNG keyed by (seed, step), so the same record and
 * seed give the same tokens whatever else shares the batch. The exact definition, which the CUDA
 * sampler (kernels/sample.h) reproduces, is docs/sampling.md. Pure functions over caller-provided
 * scratch; thread-safe. */
#ifndef TM_RUNNER_SCHED_SAMPLE_H
#define TM_RUNNER_SCHED_SAMPLE_H

#include <stdint.h>

#include "base/err.h"

typedef struct tm_sample_params {
    float temperature; /* <= 0: greedy (argmax, lowest id wins ties) */
    int32_t top_k;     /* <= 0: off */
    float top_p;       /* <= 0 or >= 1: off (a zeroed struct samples plainly) */
    float min_p;       /* <= 0: off */
    uint64_t seed;     /* per record */
    /* Logits processing, applied before everything above (docs/sampling.md); zeroed: none. */
    float repetition_penalty; /* 0 or 1: off; > 0: x > 0 ? x / r : x * r for ids in hist */
    float frequency_penalty;  /* 0: off; x -= f * (count of the id in hist[n_hist_prompt..]) */
    float presence_penalty;   /* 0: off; x -= p when the id is in hist[n_hist_prompt..] */
    const uint32_t *bias_ids; /* borrowed; [n_bias] distinct ids: x += bias[j] */
    const float *bias;        /* borrowed; [n_bias] */
    uint32_t n_bias;
    const uint32_t *mask_ids; /* borrowed; [n_mask] ids that cannot be picked (min_tokens) */
    uint32_t n_mask;
    const uint32_t
        *allow; /* borrowed; NULL: every id; else a bitmask of ceil(n_vocab / 32) words: id i may be
                   picked only when bit (i & 31) of allow[i >> 5] is set (structured output) */
    const uint32_t *hist; /* borrowed; [n_hist] the sequence so far: prompt, then generated */
    uint32_t n_hist, n_hist_prompt;
} tm_sample_params;

/* Scratch for n_vocab candidates; one per thread. */
typedef struct tm_sample_scratch {
    float *prob;   /* [n_vocab] */
    uint32_t *idx; /* [n_vocab] */
    float *l;      /* [n_vocab] processed logits */
    float *w;      /* [n_vocab] weights exp((l - max) / T) by id */
    uint32_t *cnt; /* [n_vocab] history counts; all 0 between calls */
    uint32_t n_vocab;
} tm_sample_scratch;

tm_rc tm_sample_scratch_init(tm_sample_scratch *s, uint32_t n_vocab, tm_err *err);
void tm_sample_scratch_fini(tm_sample_scratch *s);

/* Pick the token for generation step `step` (0 for the first generated token) of a record, as
 * docs/sampling.md defines it: process the logits (p's penalties, bias, mask), then the argmax
 * (greedy) or the draw of one uniform u (tm_sample_uniform) over the kept set in id order.
 * logits is read only. NaN/inf logits, every id masked, an id of p beyond n_vocab: TM_E_INVAL. */
tm_rc tm_sample_token(const float *logits, uint32_t n_vocab, const tm_sample_params *p,
                      uint64_t step, tm_sample_scratch *s, uint32_t *out, tm_err *err);

/* 1 when tm_sample_token over n_vocab ids with p picks the argmax whatever the draw: temperature
 * <= 0 (or NaN), top_k 1, or a single id. A backend may then pick the argmax itself (the lowest id
 * among equal maxima; non-finite logits fail the row), giving the same token. */
int tm_sample_is_greedy(const tm_sample_params *p, uint32_t n_vocab);

/* 1 when p changes the logits before sampling (a penalty, a bias or a mask): the argmax of the
 * raw row is then not the greedy pick. */
int tm_sample_has_proc(const tm_sample_params *p);

/* The logits processing alone: out[i] = processed logits[i] for i < n_vocab (masked ids get
 * -inf). Uses s->cnt (left all 0). Returns TM_E_INVAL for an id of p beyond n_vocab. Exposed for
 * tests and for the device sampler's comparison. */
tm_rc tm_sample_process(const float *logits, uint32_t n_vocab, const tm_sample_params *p,
                        tm_sample_scratch *s, float *out, tm_err *err);

/* Log-softmax facts of one raw logits row over ids [0, n_vocab) (no temperature or filtering:
 * the model's own distribution, as vLLM returns by default). Computed in double from the fp32
 * row: lse = max + log(sum(exp(x - max))), logprob(i) = x[i] - lse. Fills *lp_id with the
 * logprob of token id (id < n_vocab), top_ids/top_lp[0, k) with the k most likely tokens (logit
 * descending, lowest id first on ties; k <= n_vocab; arrays may be NULL when k == 0) and *argmax
 * with the greedy token (the same tie rule as tm_sample_token). NaN/inf logits, or id >= n_vocab:
 * TM_E_INVAL. */
tm_rc tm_sample_logprobs(const float *logits, uint32_t n_vocab, uint32_t id, uint32_t k,
                         float *lp_id, uint32_t *top_ids, float *top_lp, uint32_t *argmax,
                         tm_err *err);

/* Seed of sample i of an n > 1 record: sample 0 keeps the record's seed (so n = 1 and the first
 * of n samples agree); the others get a hash of (seed, i), distinct from it. */
uint64_t tm_sample_seed_of(uint64_t seed, uint32_t i);

/* The uniform in [0, 1) that tm_sample_token draws for (seed, step): a hash of both (splitmix64
 * finaliser), not a stream, so it does not depend on what else was sampled. Other backends that
 * sample on the device use the same function to give the same tokens. */
double tm_sample_uniform(uint64_t seed, uint64_t step);

#endif /* TM_RUNNER_SCHED_SAMPLE_H */
