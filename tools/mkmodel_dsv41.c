/* tools/mkmodel_dsv41.c - `mkmodel --arch deepseek_v41`: a deterministic random DeepSeek-V4.1
 * checkpoint in the released layout (docs/deepseek_v41.md, "mkmodel"):
 *
 *  - config.json as the release ships it: architectures ["DeepseekV41ForCausalLM"], model_type
 *    "deepseek_v41", dtype and quantization_config at the top level (fp8, [32, 32] ue8m0 blocks,
 *    expert_dtype fp4), the text model in text_config (model_type "deepseek_v41_text", the
 *    release's key names: hidden_size, num_experts_per_tok, kv_source_layer_ids,
 *    engram_pad_token_id, num_nextn_predict_layers, ...); no vision_config (no vision tower);
 *  - inference/config.json: the same model with the reference's ModelArgs names (the release's
 *    inference/config.json, which DeepSeek's inference/generate.py reads);
 *  - the weights under the reference's state_dict names (embed.weight, layers.<i>.attn.wq_a.weight
 *    + .scale, layers.<i>.ffn.experts.<e>.w1.weight, layers.<i>.engram.embed.weight, mtp.<k>.*,
 *    head.weight), in the released formats: FP8 e4m3 Linears with F8_E8M0 [ceil(out/32)]
 *    [ceil(in/32)] block scales (attn.wo_a included: the reference's convert.py dequantizes it to
 *    bf16), MXFP4 routed experts (I8 [out][in/2], element 2j in the low nibble, + F8_E8M0
 *    [out][in/32]), BF16 norms / embedding / head / router / compressor / indexer wk and
 *    weights_proj, F32 attn_sink, gate.bias and hyper-connection tensors, Engram tables FP8 rows
 *    [rows][head_dim] + F8_E8M0 [rows][head_dim/32];
 *  - two shards and model.safetensors.index.json: model-00001-of-00002.safetensors holds every
 *    tensor but the Engram tables, model-00002-of-00002.safetensors the tables (streamed, so
 *    --engram-rows can ask for tables of many GiB without the memory);
 *  - a tokenizer: the one --tokenizer names (copied), or a small built-in byte-level BPE one with
 *    case, accent, ligature and whitespace variants so that the Engram compressed map collapses
 *    many ids; engram_compressed_vocab_size is computed from it with runner/model/engram_hash.h.
 *
 * Same arguments and seed give the same bytes (every tensor draws from a generator seeded by the
 * seed and its name; Engram rows from a counter-based hash of seed, layer and row). */
#include "mkmodel.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/err.h"
#include "base/hash.h"
#include "runner/model/engram_hash.h"
#include "runner/model/safetensors.h"
#include "runner/model/tensor.h"
#include "runner/text/tokenizer.h"
#include "runner/text/tokenizer_int.h"

#define MAXL 64 /* layers (backbone + DSpark stages) */
#define BLK 32  /* FP8 / FP4 / Engram scale block */

typedef struct v41_opts {
    const char *out, *tokenizer;
    uint64_t seed;
    long vocab; /* -1: the tokenizer's size */
    long dim, n_layers, n_heads, head_dim, rope_dim, q_lora, o_groups, o_lora, ff;
    long experts, topk, window;
    long n_cr;
    long cr[MAXL]; /* compress_ratios, n_layers + n_mtp entries */
    long n_kvs, kvs[MAXL], n_ixs, ixs[MAXL];
    long cand_src, cand_topk, cand_block;
    long index_heads, index_dim, index_topk;
    long hc, hc_iters;
    long n_eng, eng[MAXL];
    long eng_ngram, eng_heads, eng_dim, eng_vocab, eng_rows, eng_pad;
    long n_mtp, dspark_block, n_dtgt, dtgt[MAXL], markov_rank, dspark_experts, dspark_topk;
    long dspark_noise;
    long fp8_spread; /* --fp8-block-spread S: FP8 32x32 blocks scaled by 2^(-S..S) (0: off) */
    double rope_theta, compress_rope_theta, rope_factor, route_scale, swiglu_limit, norm_eps;
    long original_seq_len, beta_fast, beta_slow, max_pos;
    const char *score_func;
} v41_opts;

/* ---- generator: xoshiro256** per tensor, seeded from (seed, name) -----------------------------
 */

typedef struct rng {
    uint64_t s[4];
    int have_spare;
    double spare;
} rng;

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(rng *r) {
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

static void rng_seed(rng *r, uint64_t seed, const char *name) {
    uint64_t x = seed ^ tm_hash64(name, strlen(name));
    for (int i = 0; i < 4; i++) {
        x += TM_HASH_GOLDEN64;
        r->s[i] = tm_hash_mix64(x);
    }
    r->have_spare = 0;
}

static double rng_unif(rng *r) { return ((double)(rng_next(r) >> 11) + 0.5) / 9007199254740992.0; }

static double rng_normal(rng *r) {
    if (r->have_spare) {
        r->have_spare = 0;
        return r->spare;
    }
    double u = rng_unif(r), v = rng_unif(r), m = sqrt(-2.0 * log(u));
    r->spare = m * sin(2 * M_PI * v);
    r->have_spare = 1;
    return m * cos(2 * M_PI * v);
}

/* ---- the tensor list --------------------------------------------------------------------------
 */

typedef enum vk {
    VK_NORMAL, /* std * N(0, 1), in dtype (bf16 or f32) */
    VK_NORM,   /* mean * (1 + 0.1 N(0, 1)), bf16 */
    VK_FP8,    /* FP8 Linear [out][in] of N(0, 1) * gain / sqrt(in), with its scale next */
    VK_FP4,    /* MXFP4 expert [out][in/2] codes, with its scale next */
    VK_SCALE,  /* written by the tensor before it */
} vk;

typedef struct vt {
    char name[160];
    vk kind;
    tm_dtype dtype;
    uint32_t n_dim;
    uint64_t shape[2];
    double a; /* std, mean or gain */
    void *data;
} vt;

typedef struct vlist {
    vt *t;
    size_t n, cap;
} vlist;

static vt *vl_add(vlist *l, tm_err *err) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 256;
        vt *t = tm_realloc(l->t, cap * sizeof(*t));
        if (!t) {
            TM_ERR(err, TM_E_NOMEM, "tensor list");
            return NULL;
        }
        l->t = t;
        l->cap = cap;
    }
    vt *x = &l->t[l->n++];
    memset(x, 0, sizeof(*x));
    return x;
}

static tm_rc add_t(vlist *l, const char *name, vk kind, tm_dtype dt, uint64_t d0, uint64_t d1,
                   double a, tm_err *err) {
    vt *x = vl_add(l, err);
    if (!x)
        return err->rc;
    snprintf(x->name, sizeof(x->name), "%s", name);
    x->kind = kind;
    x->dtype = dt;
    x->n_dim = d1 ? 2 : 1;
    x->shape[0] = d0;
    x->shape[1] = d1;
    x->a = a;
    return TM_OK;
}

#define ADD(kind, dt, d0, d1, a, ...)                                                              \
    do {                                                                                           \
        char nm_[160];                                                                             \
        snprintf(nm_, sizeof(nm_), __VA_ARGS__);                                                   \
        rc = add_t(l, nm_, kind, dt, d0, d1, a, err);                                              \
        if (rc)                                                                                    \
            return rc;                                                                             \
    } while (0)

/* An FP8 Linear: weight [out][in] F8_E4M3 and scale [ceil(out/32)][ceil(in/32)] F8_E8M0. */
static tm_rc add_fp8(vlist *l, const char *prefix, uint64_t out, uint64_t in, double gain,
                     tm_err *err) {
    tm_rc rc;
    ADD(VK_FP8, TM_DTYPE_F8_E4M3, out, in, gain, "%s.weight", prefix);
    ADD(VK_SCALE, TM_DTYPE_F8_E8M0, TM_CEIL_DIV(out, BLK), TM_CEIL_DIV(in, BLK), 0, "%s.scale",
        prefix);
    return TM_OK;
}

/* A routed expert's MXFP4 Linear: I8 [out][in/2] and F8_E8M0 [out][in/32]. */
static tm_rc add_fp4(vlist *l, const char *prefix, uint64_t out, uint64_t in, double gain,
                     tm_err *err) {
    tm_rc rc;
    ADD(VK_FP4, TM_DTYPE_I8, out, in / 2, gain, "%s.weight", prefix);
    ADD(VK_SCALE, TM_DTYPE_F8_E8M0, out, in / BLK, 0, "%s.scale", prefix);
    return TM_OK;
}

static int in_list(const long *v, long n, long x) {
    for (long i = 0; i < n; i++)
        if (v[i] == x)
            return 1;
    return 0;
}

/* One Block (backbone layer, or DSpark stage under mtp.<k>) as the reference's Block builds it. */
static tm_rc list_block(const v41_opts *o, vlist *l, const char *p, long layer, int is_mtp,
                        tm_err *err) {
    tm_rc rc;
    const uint64_t d = (uint64_t)o->dim, H = (uint64_t)o->n_heads, hd = (uint64_t)o->head_dim,
                   qr = (uint64_t)o->q_lora, og = (uint64_t)o->o_groups,
                   orank = (uint64_t)o->o_lora, N = (uint64_t)o->hc, mix = (2 + N) * N;
    char q[200];
    long ratio = o->cr[layer];
    ADD(VK_NORMAL, TM_DTYPE_F32, H, 0, 0.5, "%s.attn.attn_sink", p);
    snprintf(q, sizeof(q), "%s.attn.wq_a", p);
    if ((rc = add_fp8(l, q, qr, d, 1.6, err)))
        return rc;
    ADD(VK_NORM, TM_DTYPE_BF16, qr, 0, 0.97, "%s.attn.q_norm.weight", p);
    snprintf(q, sizeof(q), "%s.attn.wq_b", p);
    if ((rc = add_fp8(l, q, H * hd, qr, 0.95, err)))
        return rc;
    snprintf(q, sizeof(q), "%s.attn.wkv", p);
    if ((rc = add_fp8(l, q, hd, d, 1.8, err)))
        return rc;
    ADD(VK_NORM, TM_DTYPE_BF16, hd, 0, 0.4, "%s.attn.kv_norm.weight", p);
    snprintf(q, sizeof(q), "%s.attn.wo_a", p);
    if ((rc = add_fp8(l, q, og * orank, H * hd / og, 1.6, err)))
        return rc;
    snprintf(q, sizeof(q), "%s.attn.wo_b", p);
    if ((rc = add_fp8(l, q, d, og * orank, 1.9, err)))
        return rc;
    int kv_src = !is_mtp && in_list(o->kvs, o->n_kvs, layer);
    int ix_src = !is_mtp && in_list(o->ixs, o->n_ixs, layer);
    if (kv_src) {
        ADD(VK_NORMAL, TM_DTYPE_BF16, hd, d, 1.0 / sqrt((double)d), "%s.attn.compressor.wkv.weight",
            p);
        if (ratio > 1)
            ADD(VK_NORMAL, TM_DTYPE_BF16, hd, d, 1.0 / sqrt((double)d),
                "%s.attn.compressor.wgate.weight", p);
        ADD(VK_NORM, TM_DTYPE_BF16, hd, 0, 0.6, "%s.attn.compressor.norm.weight", p);
    }
    if (ix_src) {
        const uint64_t ih = (uint64_t)o->index_heads, idim = (uint64_t)o->index_dim;
        snprintf(q, sizeof(q), "%s.attn.indexer.wq_b", p);
        if ((rc = add_fp8(l, q, ih * idim, qr, 1.0, err)))
            return rc;
        ADD(VK_NORMAL, TM_DTYPE_BF16, ih, d, 1.0 / sqrt((double)d),
            "%s.attn.indexer.weights_proj.weight", p);
        if (in_list(o->kvs, o->n_kvs, layer)) { // owns_k
            ADD(VK_NORMAL, TM_DTYPE_BF16, idim, hd, 1.0 / sqrt((double)hd),
                "%s.attn.indexer.wk.weight", p);
            ADD(VK_NORM, TM_DTYPE_BF16, idim, 0, 0.5, "%s.attn.indexer.k_norm.weight", p);
        }
    }
    // MoE: router (bf16 weight, f32 bias), routed experts MXFP4, one FP8 shared expert.
    long E = is_mtp && o->dspark_experts ? o->dspark_experts : o->experts;
    const uint64_t I = (uint64_t)o->ff;
    ADD(VK_NORMAL, TM_DTYPE_BF16, (uint64_t)E, d, 2.9 / sqrt((double)d), "%s.ffn.gate.weight", p);
    ADD(VK_NORMAL, TM_DTYPE_F32, (uint64_t)E, 0, 0.1, "%s.ffn.gate.bias", p);
    for (long e = 0; e < E; e++) {
        snprintf(q, sizeof(q), "%s.ffn.experts.%ld.w1", p, e);
        if ((rc = add_fp4(l, q, I, d, 1.5, err)))
            return rc;
        snprintf(q, sizeof(q), "%s.ffn.experts.%ld.w2", p, e);
        if ((rc = add_fp4(l, q, d, I, 1.05, err)))
            return rc;
        snprintf(q, sizeof(q), "%s.ffn.experts.%ld.w3", p, e);
        if ((rc = add_fp4(l, q, I, d, 1.5, err)))
            return rc;
    }
    snprintf(q, sizeof(q), "%s.ffn.shared_experts.w1", p);
    if ((rc = add_fp8(l, q, I, d, 1.5, err)))
        return rc;
    snprintf(q, sizeof(q), "%s.ffn.shared_experts.w2", p);
    if ((rc = add_fp8(l, q, d, I, 1.05, err)))
        return rc;
    snprintf(q, sizeof(q), "%s.ffn.shared_experts.w3", p);
    if ((rc = add_fp8(l, q, I, d, 1.5, err)))
        return rc;
    ADD(VK_NORM, TM_DTYPE_BF16, d, 0, 0.025, "%s.attn_norm.weight", p);
    ADD(VK_NORM, TM_DTYPE_BF16, d, 0, 0.2, "%s.ffn_norm.weight", p);
    const double sf = 1.0 / sqrt((double)(N * d));
    ADD(VK_NORMAL, TM_DTYPE_F32, mix, N * d, sf, "%s.hc_attn_fn", p);
    ADD(VK_NORMAL, TM_DTYPE_F32, mix, N * d, sf, "%s.hc_ffn_fn", p);
    ADD(VK_NORMAL, TM_DTYPE_F32, mix, 0, 0.5, "%s.hc_attn_base", p);
    ADD(VK_NORMAL, TM_DTYPE_F32, mix, 0, 0.5, "%s.hc_ffn_base", p);
    ADD(VK_NORMAL, TM_DTYPE_F32, 3, 0, 0.5, "%s.hc_attn_scale", p);
    ADD(VK_NORMAL, TM_DTYPE_F32, 3, 0, 0.5, "%s.hc_ffn_scale", p);
    return TM_OK;
}

static tm_rc list_tensors(const v41_opts *o, const tm_engram_layout *L, vlist *l, tm_err *err) {
    tm_rc rc;
    const uint64_t d = (uint64_t)o->dim, v = (uint64_t)o->vocab, N = (uint64_t)o->hc;
    ADD(VK_NORMAL, TM_DTYPE_BF16, v, d, 0.12, "embed.weight");
    ADD(VK_NORM, TM_DTYPE_BF16, d, 0, 1.0, "norm.weight");
    ADD(VK_NORMAL, TM_DTYPE_BF16, v, d, 1.0 / sqrt((double)d), "head.weight");
    char p[64], q[200];
    for (long i = 0; i < o->n_layers; i++) {
        snprintf(p, sizeof(p), "layers.%ld", i);
        if ((rc = list_block(o, l, p, i, 0, err)))
            return rc;
        for (uint32_t k = 0; L && k < L->n_layer; k++) {
            if (L->layer_ids[k] != (uint32_t)i)
                continue;
            // the table itself (engram.embed.weight / .scale) goes to the second shard
            snprintf(q, sizeof(q), "%s.engram.wkv", p);
            if ((rc = add_fp8(l, q, d * (N + 1), (uint64_t)L->n_cols * L->head_dim, 1.0, err)))
                return rc;
            ADD(VK_NORMAL, TM_DTYPE_BF16, N, d, 1.0 / sqrt((double)d), "%s.engram.q_weight", p);
            ADD(VK_NORMAL, TM_DTYPE_BF16, N, d, 1.0 / sqrt((double)d), "%s.engram.k_weight", p);
        }
    }
    for (long k = 0; k < o->n_mtp; k++) {
        snprintf(p, sizeof(p), "mtp.%ld", k);
        if ((rc = list_block(o, l, p, o->n_layers + k, 1, err)))
            return rc;
        if (k == 0) {
            snprintf(q, sizeof(q), "%s.main_proj", p);
            if ((rc = add_fp8(l, q, d, d * (uint64_t)o->n_dtgt, 1.0, err)))
                return rc;
            ADD(VK_NORM, TM_DTYPE_BF16, d, 0, 1.0, "%s.main_norm.weight", p);
        }
        if (k == o->n_mtp - 1) {
            const uint64_t r = (uint64_t)o->markov_rank;
            ADD(VK_NORM, TM_DTYPE_BF16, d, 0, 1.0, "%s.norm.weight", p);
            ADD(VK_NORMAL, TM_DTYPE_BF16, v, r, 0.12, "%s.markov_head.embed.weight", p);
            ADD(VK_NORMAL, TM_DTYPE_BF16, v, r, 1.0 / sqrt((double)r), "%s.markov_head.head.weight",
                p);
            ADD(VK_NORMAL, TM_DTYPE_BF16, 1, d + r, 1.0 / sqrt((double)(d + r)),
                "%s.confidence_head.proj.weight", p);
        }
    }
    return TM_OK;
}
#undef ADD

/* ---- filling ----------------------------------------------------------------------------------
 */

static uint64_t vt_elems(const vt *t) { return t->shape[0] * (t->n_dim > 1 ? t->shape[1] : 1); }

/* Quantize w [out][in] (f32) into FP8 codes q and 32x32 block scales s, as a checkpoint tool
 * would: per block amax (at least 1e-4), scale 2^ceil(log2(amax / 448)), codes e4m3(w / scale). */
static void quant_fp8(const float *w, uint64_t out, uint64_t in, uint8_t *q, uint8_t *s) {
    const uint64_t nbr = TM_CEIL_DIV(out, BLK), nbc = TM_CEIL_DIV(in, BLK);
    for (uint64_t br = 0; br < nbr; br++) {
        for (uint64_t bc = 0; bc < nbc; bc++) {
            float amax = 1e-4f;
            for (uint64_t r = br * BLK; r < TM_MIN(out, (br + 1) * BLK); r++)
                for (uint64_t c = bc * BLK; c < TM_MIN(in, (bc + 1) * BLK); c++)
                    amax = fmaxf(amax, fabsf(w[r * in + c]));
            uint8_t sb = tm_e8m0_ceil_scale(amax, 448.0f);
            s[br * nbc + bc] = sb;
            float inv = 1.0f / tm_e8m0_to_f32(sb);
            for (uint64_t r = br * BLK; r < TM_MIN(out, (br + 1) * BLK); r++)
                for (uint64_t c = bc * BLK; c < TM_MIN(in, (bc + 1) * BLK); c++) {
                    float x = fmaxf(-448.0f, fminf(448.0f, w[r * in + c] * inv));
                    q[r * in + c] = tm_f32_to_e4m3(x);
                }
        }
    }
}

static tm_rc fill(const v41_opts *o, vlist *l, tm_err *err) {
    for (size_t i = 0; i < l->n; i++) {
        vt *t = &l->t[i];
        if (t->kind == VK_SCALE)
            continue;
        rng r;
        rng_seed(&r, o->seed, t->name);
        uint64_t n = vt_elems(t);
        t->data = tm_malloc(n * tm_dtype_size(t->dtype) + 1);
        if (!t->data)
            return TM_ERR(err, TM_E_NOMEM, "%s: %llu elements", t->name, (unsigned long long)n);
        if (t->kind == VK_NORMAL || t->kind == VK_NORM) {
            for (uint64_t k = 0; k < n; k++) {
                double x = t->kind == VK_NORM ? t->a * (1 + 0.1 * rng_normal(&r))
                                              : t->a * rng_normal(&r);
                if (t->dtype == TM_DTYPE_F32)
                    ((float *)t->data)[k] = (float)x;
                else
                    ((uint16_t *)t->data)[k] = tm_f32_to_bf16((float)x);
            }
            continue;
        }
        vt *s = &l->t[i + 1];
        TM_ASSERT(i + 1 < l->n && s->kind == VK_SCALE);
        s->data = tm_malloc(vt_elems(s));
        if (!s->data)
            return TM_ERR(err, TM_E_NOMEM, "%s", s->name);
        if (t->kind == VK_FP8) {
            float *w = tm_malloc(n * sizeof(float));
            if (!w)
                return TM_ERR(err, TM_E_NOMEM, "%s: %llu elements", t->name, (unsigned long long)n);
            const double sd = t->a / sqrt((double)t->shape[1]);
            for (uint64_t k = 0; k < n; k++)
                w[k] = (float)(sd * rng_normal(&r));
            // --fp8-block-spread S: each 32x32 block times 2^(h - S), h from a hash of the seed,
            // the name and the block in [0, 2S], so that the block scales differ (a reader that
            // takes one block's scale for another's then computes something else)
            for (uint64_t k = 0; o->fp8_spread && k < n; k++) {
                const uint64_t row = k / t->shape[1], col = k % t->shape[1];
                const uint64_t h = tm_hash_mix64(tm_hash64(t->name, strlen(t->name)) ^
                                                 (o->seed * 0x9e3779b97f4a7c15ull) ^
                                                 ((row / BLK) << 32 ^ (col / BLK)));
                const int e = (int)(h % (uint64_t)(2 * o->fp8_spread + 1)) - (int)o->fp8_spread;
                w[k] = ldexpf(w[k], e);
            }
            quant_fp8(w, t->shape[0], t->shape[1], t->data, s->data);
            tm_free(w);
        } else { // VK_FP4: random e2m1 codes, one power-of-2 scale per 32 inputs
            const uint64_t in = t->shape[1] * 2;
            // uniform codes have an RMS of about 3.2: aim the scale at gain / sqrt(in)
            int e0 = (int)lround(log2(t->a / sqrt((double)in) / 3.2));
            uint8_t *q = t->data;
            for (uint64_t k = 0; k < n; k++)
                q[k] = (uint8_t)(rng_next(&r) >> 56);
            uint8_t *sc = s->data;
            for (uint64_t k = 0; k < vt_elems(s); k++)
                sc[k] = (uint8_t)(127 + e0 + (int)(rng_next(&r) % 3) - 1);
        }
    }
    return TM_OK;
}

/* ---- Engram tables: streamed, counter-based values ------------------------------------------- */

/* The 8 code bytes of row r, word j of engram layer k: e4m3 codes of magnitude 0.5 .. 1.875
 * (exponent 6 or 7) with a random sign; scales 2^(-3 .. -1). Any reader can recompute them. */
static uint64_t eng_word(uint64_t seed, uint32_t layer, uint64_t row, uint64_t j) {
    uint64_t x = tm_hash_mix64(seed * 0x100000001b3ull + layer * TM_HASH_GOLDEN64 + row);
    return tm_hash_mix64(x + j * TM_HASH_GOLDEN64);
}

static uint8_t eng_code(uint8_t h) {
    // sign from bit 7, exponent 6 or 7 from bit 3, mantissa from bits 0..2
    return (uint8_t)((h & 0x80) | (0x30 + ((h >> 3) & 1) * 8) | (h & 7));
}

static tm_rc write_all(int fd, const void *p, size_t n, const char *path, tm_err *err) {
    const char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return TM_ERR(err, TM_E_IO, "%s: write: %s", path, strerror(errno));
        }
        c += w;
        n -= (size_t)w;
    }
    return TM_OK;
}

/* model-00002-of-00002.safetensors: every Engram layer's embed.scale and embed.weight (names
 * sorted, as the safetensors header lists them), rows generated on the fly. */
static tm_rc write_engram_shard(const v41_opts *o, const tm_engram_layout *L, const char *path,
                                json_t *wmap, const char *file, uint64_t *total, tm_err *err) {
    tm_buf hdr = {0};
    tm_rc rc = TM_OK;
    int fd = -1;
    uint8_t *buf = NULL;
    // Header: per layer (layer ids ascending in the names' string order is what sorting gives;
    // we list them in the order of the sorted names).
    uint32_t order[TM_ENGRAM_MAX_LAYERS];
    char names[TM_ENGRAM_MAX_LAYERS][2][96];
    for (uint32_t k = 0; k < L->n_layer; k++) {
        order[k] = k;
        snprintf(names[k][0], sizeof(names[k][0]), "layers.%u.engram.embed.scale", L->layer_ids[k]);
        snprintf(names[k][1], sizeof(names[k][1]), "layers.%u.engram.embed.weight",
                 L->layer_ids[k]);
    }
    for (uint32_t a = 0; a < L->n_layer; a++) // insertion sort by name
        for (uint32_t b = a; b > 0 && strcmp(names[order[b - 1]][0], names[order[b]][0]) > 0; b--) {
            uint32_t tmp = order[b];
            order[b] = order[b - 1];
            order[b - 1] = tmp;
        }
    const uint64_t dim = L->head_dim, sdim = dim / BLK;
    uint64_t off = 0;
    if ((rc = tm_buf_append_str(&hdr, "{\"__metadata__\":{\"format\":\"pt\"}", err)))
        goto done;
    for (uint32_t a = 0; a < L->n_layer; a++) {
        uint32_t k = order[a];
        const uint64_t rows = L->num_embeddings[k];
        rc = tm_buf_printf(&hdr, err,
                           ",\"%s\":{\"dtype\":\"F8_E8M0\",\"shape\":[%llu,%llu],"
                           "\"data_offsets\":[%llu,%llu]}",
                           names[k][0], (unsigned long long)rows, (unsigned long long)sdim,
                           (unsigned long long)off, (unsigned long long)(off + rows * sdim));
        off += rows * sdim;
        if (rc == TM_OK)
            rc = tm_buf_printf(&hdr, err,
                               ",\"%s\":{\"dtype\":\"F8_E4M3\",\"shape\":[%llu,%llu],"
                               "\"data_offsets\":[%llu,%llu]}",
                               names[k][1], (unsigned long long)rows, (unsigned long long)dim,
                               (unsigned long long)off, (unsigned long long)(off + rows * dim));
        off += rows * dim;
        if (rc)
            goto done;
        json_object_set_new(wmap, names[k][0], json_string(file));
        json_object_set_new(wmap, names[k][1], json_string(file));
    }
    if ((rc = tm_buf_append_str(&hdr, "}", err)))
        goto done;
    while ((8 + hdr.len) % 8)
        if ((rc = tm_buf_append_str(&hdr, " ", err)))
            goto done;
    *total += off;
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = TM_ERR(err, TM_E_IO, "%s: open: %s", tmp, strerror(errno));
        goto done;
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)hdr.len >> (8 * i));
    if ((rc = write_all(fd, len8, 8, tmp, err)) ||
        (rc = write_all(fd, hdr.data, hdr.len, tmp, err)))
        goto done;
    const size_t cap = (size_t)8 << 20;
    buf = tm_malloc(cap);
    if (!buf) {
        rc = TM_ERR(err, TM_E_NOMEM, "engram write buffer");
        goto done;
    }
    for (uint32_t a = 0; a < L->n_layer; a++) {
        uint32_t k = order[a];
        const uint64_t rows = L->num_embeddings[k];
        for (int part = 0; part < 2; part++) { // scales, then codes
            const uint64_t row_bytes = part ? dim : sdim;
            const uint64_t per = cap / row_bytes;
            for (uint64_t r0 = 0; r0 < rows; r0 += per) {
                uint64_t nr = TM_MIN(per, rows - r0);
                for (uint64_t r = 0; r < nr; r++) {
                    uint8_t *dst = buf + r * row_bytes;
                    if (!part) {
                        uint64_t h = eng_word(o->seed, k, r0 + r, 1u << 20);
                        for (uint64_t j = 0; j < sdim; j++)
                            dst[j] = (uint8_t)(124 + (h >> (2 * (j % 32))) % 3);
                    } else {
                        for (uint64_t j = 0; j < dim; j += 8) {
                            uint64_t h = eng_word(o->seed, k, r0 + r, j / 8);
                            for (int b = 0; b < 8; b++)
                                dst[j + (uint64_t)b] = eng_code((uint8_t)(h >> (8 * b)));
                        }
                    }
                }
                if ((rc = write_all(fd, buf, nr * row_bytes, tmp, err)))
                    goto done;
            }
        }
    }
    if (fsync(fd) != 0) {
        rc = TM_ERR(err, TM_E_IO, "%s: fsync: %s", tmp, strerror(errno));
        goto done;
    }
    close(fd);
    fd = -1;
    if (rename(tmp, path) != 0)
        rc = TM_ERR(err, TM_E_IO, "%s: rename: %s", path, strerror(errno));
done:
    if (fd >= 0)
        close(fd);
    tm_free(buf);
    tm_buf_fini(&hdr);
    return rc;
}

/* ---- the built-in tokenizer -------------------------------------------------------------------
 */

/* Words of the built-in vocabulary: case, accent, compatibility (ligature, fullwidth, circled,
 * Angstrom sign), whitespace and combining-mark variants, so that the compressed map merges many
 * ids (the 256 byte tokens add A-Z/a-z, the whitespace bytes, and the partial UTF-8 bytes keyed
 * by their pieces). */
static const char *const builtin_words[] = {
    "the",
    "The",
    "THE",
    " the",
    " The",
    " THE",
    "cafe",
    "café",
    "Café",
    "CAFÉ",
    " café",
    "naive",
    "naïve",
    " naïve",
    "hello",
    "Hello",
    "HELLO",
    " hello",
    " Hello",
    "world",
    " world",
    "World",
    "fi",
    "\xef\xac\x81" /* U+FB01 ligature fi */,
    "\xef\xbc\xa1" /* fullwidth A */,
    "\xe2\x91\xa0" /* circled 1 */,
    "10",
    "\xc4\xb0" /* I with dot */,
    "\xe2\x84\xab" /* Angstrom */,
    "\xc3\x85" /* A with ring */,
    "ss",
    "\xc3\x9f" /* sharp s */,
    "\xce\xa3" /* Sigma */,
    "\xcf\x83" /* sigma */,
    "\xcf\x82" /* final sigma */,
    "  ",
    "   ",
    "\xc2\xa0" /* NBSP */,
    "\n\n",
    "\t\t",
    " \n",
    "e\xcc\x81" /* e + combining acute */,
    "\xcc\x81" /* combining acute */,
    "\xc3\xa9" /* e acute */,
    "stra\xc3\x9f"
    "e",
    "STRASSE",
    "\xc3\xbc"
    "ber",
    "\xc3\x9c"
    "ber",
    "ueber",
    " \xc3\xbc"
    "ber",
    "\xe4\xbd\xa0\xe5\xa5\xbd" /* nihao */,
    "\xe6\x97\xa5\xe6\x9c\xac",
    "\xe3\x80\x80" /* ideographic space */,
    "\xe2\x80\x83" /* em space */,
    ".",
    "..",
    "...",
    "\xe2\x80\xa6" /* ellipsis */,
    " a",
    " A",
    "ab",
    "Ab",
    "AB",
    " ab",
    "abc",
    "token",
    " token",
    "Token",
    "TOKEN",
    " tokens",
    "mill",
    " mill",
    "Mill",
    "\xef\xbd\x94\xef\xbd\x8f" /* fw to */,
};

static const char *const builtin_special_head[] = {
    "<\xef\xbd\x9c"
    "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
    "<\xef\xbd\x9c"
    "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
    "<\xef\xbd\x9c\xe2\x96\x81pad\xe2\x96\x81\xef\xbd\x9c>",
};
static const char *const builtin_special_tail[] = {
    "<\xef\xbd\x9cUser\xef\xbd\x9c>",
    "<\xef\xbd\x9c"
    "Assistant\xef\xbd\x9c>",
    "<\xef\xbd\x9cSystem\xef\xbd\x9c>",
    "<think>",
    "</think>",
    "<\xef\xbd\x9c"
    "deepseek_image\xef\xbd\x9c>",
};
#define BUILTIN_IMAGE_TOKEN                                                                        \
    "<\xef\xbd\x9c"                                                                                \
    "deepseek_image\xef\xbd\x9c>"

static json_t *added_token(long id, const char *content, int special) {
    json_t *a = json_object();
    json_object_set_new(a, "id", json_integer(id));
    json_object_set_new(a, "content", json_string(content));
    json_object_set_new(a, "single_word", json_false());
    json_object_set_new(a, "lstrip", json_false());
    json_object_set_new(a, "rstrip", json_false());
    json_object_set_new(a, "normalized", json_false());
    json_object_set_new(a, "special", json_boolean(special));
    return a;
}

static json_t *split(tm_pat pat) {
    json_t *s = json_object(), *p = json_object();
    json_object_set_new(s, "type", json_string("Split"));
    json_object_set_new(p, "Regex", json_string(tm_pat_source(pat)));
    json_object_set_new(s, "pattern", p);
    json_object_set_new(s, "behavior", json_string("Isolated"));
    json_object_set_new(s, "invert", json_false());
    return s;
}

static json_t *byte_level(int prefix, int trim, int regex) {
    json_t *b = json_object();
    json_object_set_new(b, "type", json_string("ByteLevel"));
    json_object_set_new(b, "add_prefix_space", json_boolean(prefix));
    json_object_set_new(b, "trim_offsets", json_boolean(trim));
    json_object_set_new(b, "use_regex", json_boolean(regex));
    return b;
}

static tm_rc write_json(const char *dir, const char *name, json_t *j, tm_err *err) {
    char path[4200];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    if (json_dump_file(j, path, JSON_INDENT(1) | JSON_REAL_PRECISION(10)) != 0)
        return TM_ERR(err, TM_E_IO, "%s: cannot write", path);
    return TM_OK;
}

/* tokenizer.json + tokenizer_config.json of the built-in vocabulary, padded with placeholder
 * tokens to n_vocab ids. */
static tm_rc write_builtin_tokenizer(const char *dir, long n_vocab, tm_err *err) {
    tm_rc rc = TM_OK;
    json_t *tok = json_object(), *vocab = json_object(), *merges = json_array(),
           *seen = json_object(), *added = json_array();
    long id = 0;
    for (size_t i = 0; i < 3; i++) {
        json_object_set_new(vocab, builtin_special_head[i], json_integer(id));
        json_array_append_new(added, added_token(id++, builtin_special_head[i], 1));
    }
    for (int b = 0; b < 256; b++) {
        char c = (char)b, *p = NULL;
        size_t pl;
        if ((rc = tm_engram_byte_level_piece(&c, 1, &p, &pl, err)))
            goto done;
        json_object_set_new(vocab, p, json_integer(id++));
        tm_free(p);
    }
    for (size_t w = 0; w < sizeof(builtin_words) / sizeof(builtin_words[0]); w++) {
        const char *word = builtin_words[w];
        size_t n = strlen(word);
        char prefix[256] = "";
        for (size_t i = 0; i < n; i++) {
            char *p = NULL;
            size_t pl;
            if ((rc = tm_engram_byte_level_piece(word + i, 1, &p, &pl, err)))
                goto done;
            if (i == 0) {
                snprintf(prefix, sizeof(prefix), "%s", p);
            } else {
                char merged[256], rule[520];
                snprintf(merged, sizeof(merged), "%s%s", prefix, p);
                snprintf(rule, sizeof(rule), "%s %s", prefix, p);
                if (!json_object_get(seen, rule)) {
                    json_object_set_new(seen, rule, json_true());
                    json_array_append_new(merges, json_string(rule));
                }
                if (!json_object_get(vocab, merged))
                    json_object_set_new(vocab, merged, json_integer(id++));
                snprintf(prefix, sizeof(prefix), "%s", merged);
            }
            tm_free(p);
        }
    }
    const size_t n_tail = sizeof(builtin_special_tail) / sizeof(builtin_special_tail[0]);
    if (id + (long)n_tail > n_vocab) {
        rc = TM_ERR(err, TM_E_INVAL, "--vocab %ld is below the built-in tokenizer's %ld tokens",
                    n_vocab, id + (long)n_tail);
        goto done;
    }
    for (size_t i = 0; i < n_tail; i++) {
        const char *c = builtin_special_tail[i];
        int special = strcmp(c, "<think>") != 0 && strcmp(c, "</think>") != 0;
        json_array_append_new(added, added_token(id++, c, special));
    }
    for (long k = 0; id < n_vocab; k++) {
        char c[96];
        snprintf(c, sizeof(c),
                 "<\xef\xbd\x9cplace\xe2\x96\x81holder\xe2\x96\x81no\xe2\x96\x81%ld\xef\xbd\x9c>",
                 k);
        json_array_append_new(added, added_token(id++, c, 1));
    }
    json_object_set_new(tok, "version", json_string("1.0"));
    json_object_set_new(tok, "truncation", json_null());
    json_object_set_new(tok, "padding", json_null());
    json_object_set_new(tok, "added_tokens", added);
    added = NULL;
    json_t *norm = json_object();
    json_object_set_new(norm, "type", json_string("Sequence"));
    json_object_set_new(norm, "normalizers", json_array());
    json_object_set_new(tok, "normalizer", norm);
    json_t *pre = json_object(), *pts = json_array();
    json_object_set_new(pre, "type", json_string("Sequence"));
    json_array_append_new(pts, split(TM_PAT_DS_DIGITS));
    json_array_append_new(pts, split(TM_PAT_DS_CJK));
    json_array_append_new(pts, split(TM_PAT_DS_MAIN));
    json_array_append_new(pts, byte_level(0, 1, 0));
    json_object_set_new(pre, "pretokenizers", pts);
    json_object_set_new(tok, "pre_tokenizer", pre);
    json_object_set_new(tok, "post_processor", byte_level(1, 0, 1));
    json_object_set_new(tok, "decoder", byte_level(1, 1, 1));
    json_t *model = json_object();
    json_object_set_new(model, "type", json_string("BPE"));
    json_object_set_new(model, "dropout", json_null());
    json_object_set_new(model, "unk_token", json_null());
    json_object_set_new(model, "continuing_subword_prefix", json_null());
    json_object_set_new(model, "end_of_word_suffix", json_null());
    json_object_set_new(model, "fuse_unk", json_false());
    json_object_set_new(model, "byte_fallback", json_false());
    json_object_set_new(model, "vocab", vocab);
    vocab = NULL;
    json_object_set_new(model, "merges", merges);
    merges = NULL;
    json_object_set_new(tok, "model", model);
    if ((rc = write_json(dir, "tokenizer.json", tok, err)))
        goto done;
    json_t *cfg = json_object();
    json_object_set_new(cfg, "add_bos_token", json_true());
    json_object_set_new(cfg, "add_eos_token", json_false());
    json_object_set_new(cfg, "bos_token", json_string(builtin_special_head[0]));
    json_object_set_new(cfg, "eos_token", json_string(builtin_special_head[1]));
    json_object_set_new(cfg, "pad_token", json_string(builtin_special_head[1]));
    json_object_set_new(cfg, "clean_up_tokenization_spaces", json_false());
    json_object_set_new(cfg, "model_max_length", json_integer(1048576));
    json_object_set_new(cfg, "tokenizer_class", json_string("LlamaTokenizerFast"));
    rc = write_json(dir, "tokenizer_config.json", cfg, err);
    json_decref(cfg);
done:
    json_decref(tok);
    json_decref(vocab);
    json_decref(merges);
    json_decref(seen);
    json_decref(added);
    return rc;
}

/* ---- config.json (released layout) and inference/config.json (ModelArgs names) -------------- */

static json_t *jlist(const long *v, long n) {
    json_t *a = json_array();
    for (long i = 0; i < n; i++)
        json_array_append_new(a, json_integer(v[i]));
    return a;
}

static json_t *jlist_u64(const uint64_t *v, long n) {
    json_t *a = json_array();
    for (long i = 0; i < n; i++)
        json_array_append_new(a, json_integer((json_int_t)v[i]));
    return a;
}

typedef struct v41_derived {
    long vocab, n_compressed, image_id, bos, eos, pad;
    const tm_engram_layout *L; /* NULL without Engram layers */
} v41_derived;

/* ModelArgs field -> value, in the order of the release's inference/config.json. */
static json_t *make_model_args(const v41_opts *o, const v41_derived *dv) {
    json_t *c = json_object();
    const tm_engram_layout *L = dv->L;
    json_object_set_new(c, "vocab_size", json_integer(dv->vocab));
    json_object_set_new(c, "dim", json_integer(o->dim));
    json_object_set_new(c, "moe_inter_dim", json_integer(o->ff));
    json_object_set_new(c, "n_layers", json_integer(o->n_layers));
    json_object_set_new(c, "n_mtp_layers", json_integer(o->n_mtp));
    json_object_set_new(c, "dspark_block_size", json_integer(o->n_mtp ? o->dspark_block : 0));
    json_object_set_new(c, "dspark_noise_token_id", json_integer(o->dspark_noise));
    json_object_set_new(c, "dspark_target_layer_ids", jlist(o->dtgt, o->n_mtp ? o->n_dtgt : 0));
    json_object_set_new(c, "dspark_markov_rank", json_integer(o->markov_rank));
    json_object_set_new(c, "dspark_n_routed_experts", json_integer(o->dspark_experts));
    json_object_set_new(c, "dspark_n_activated_experts", json_integer(o->dspark_topk));
    json_object_set_new(c, "n_heads", json_integer(o->n_heads));
    json_object_set_new(c, "n_routed_experts", json_integer(o->experts));
    json_object_set_new(c, "n_shared_experts", json_integer(1));
    json_object_set_new(c, "n_activated_experts", json_integer(o->topk));
    json_object_set_new(c, "score_func", json_string(o->score_func));
    json_object_set_new(c, "route_scale", json_real(o->route_scale));
    json_object_set_new(c, "swiglu_limit", json_real(o->swiglu_limit));
    json_object_set_new(c, "q_lora_rank", json_integer(o->q_lora));
    json_object_set_new(c, "head_dim", json_integer(o->head_dim));
    json_object_set_new(c, "rope_head_dim", json_integer(o->rope_dim));
    json_object_set_new(c, "norm_eps", json_real(o->norm_eps));
    json_object_set_new(c, "o_groups", json_integer(o->o_groups));
    json_object_set_new(c, "o_lora_rank", json_integer(o->o_lora));
    json_object_set_new(c, "window_size", json_integer(o->window));
    json_object_set_new(c, "kv_source_layers", jlist(o->kvs, o->n_kvs));
    json_object_set_new(c, "index_source_layers", jlist(o->ixs, o->n_ixs));
    json_object_set_new(c, "original_seq_len", json_integer(o->original_seq_len));
    json_object_set_new(c, "rope_theta", json_real(o->rope_theta));
    json_object_set_new(c, "rope_factor", json_real(o->rope_factor));
    json_object_set_new(c, "beta_fast", json_integer(o->beta_fast));
    json_object_set_new(c, "beta_slow", json_integer(o->beta_slow));
    json_object_set_new(c, "index_n_heads", json_integer(o->index_heads));
    json_object_set_new(c, "index_head_dim", json_integer(o->index_dim));
    json_object_set_new(c, "index_topk", json_integer(o->index_topk));
    json_object_set_new(c, "candidate_source_layer", json_integer(o->cand_src));
    json_object_set_new(c, "candidate_topk_blocks", json_integer(o->cand_topk));
    json_object_set_new(c, "candidate_block_size", json_integer(o->cand_block));
    json_object_set_new(c, "hc_mult", json_integer(o->hc));
    json_object_set_new(c, "hc_sinkhorn_iters", json_integer(o->hc_iters));
    json_object_set_new(c, "hc_eps", json_real(1e-6));
    json_object_set_new(c, "engram_layer_ids", jlist(o->eng, o->n_eng));
    json_object_set_new(c, "engram_vocab_size", json_integer(L ? o->eng_vocab : 0));
    json_object_set_new(c, "engram_num_embeddings",
                        L ? jlist_u64(L->num_embeddings, L->n_layer) : json_array());
    json_object_set_new(c, "engram_max_ngram_size", json_integer(L ? o->eng_ngram : 1));
    json_object_set_new(c, "engram_pad_id", json_integer(o->eng_pad));
    json_object_set_new(c, "engram_compressed_vocab_size", json_integer(L ? dv->n_compressed : 0));
    json_object_set_new(c, "dtype", json_string("fp8"));
    json_object_set_new(c, "expert_dtype", json_string("fp4"));
    json_object_set_new(c, "compress_rope_theta", json_real(o->compress_rope_theta));
    json_object_set_new(c, "compress_ratios", jlist(o->cr, o->n_layers + o->n_mtp));
    json_object_set_new(c, "vision_n_layers", json_integer(0));
    json_object_set_new(c, "image_token_id", json_integer(dv->image_id));
    json_object_set_new(c, "engram_n_heads", json_integer(L ? o->eng_heads : 0));
    json_object_set_new(c, "engram_head_dim", json_integer(L ? o->eng_dim : 0));
    json_object_set_new(c, "gate_temp", json_real(1.0));
    json_object_set_new(c, "norm_topk_prob", json_true());
    return c;
}

/* The release's config.json: the wrapper with the text model in text_config. */
static json_t *make_hf_config(const v41_opts *o, const v41_derived *dv) {
    json_t *ma = make_model_args(o, dv);
    json_t *t = json_object();
    // ModelArgs name -> text_config name (the release's spelling), in the release's order.
    static const char *const map[][2] = {
        {"vocab_size", "vocab_size"},
        {"dim", "hidden_size"},
        {"moe_inter_dim", "moe_intermediate_size"},
        {"n_layers", "num_hidden_layers"},
        {"n_heads", "num_attention_heads"},
        {NULL, "num_key_value_heads"},
        {"head_dim", "head_dim"},
        {"rope_head_dim", "qk_rope_head_dim"},
        {"q_lora_rank", "q_lora_rank"},
        {"o_lora_rank", "o_lora_rank"},
        {"o_groups", "o_groups"},
        {NULL, "hidden_act"},
        {"swiglu_limit", "swiglu_limit"},
        {"norm_eps", "rms_norm_eps"},
        {NULL, "attention_bias"},
        {NULL, "attention_dropout"},
        {NULL, "initializer_range"},
        {NULL, "use_cache"},
        {NULL, "tie_word_embeddings"},
        {NULL, "max_position_embeddings"},
        {"rope_theta", "rope_theta"},
        {NULL, "rope_scaling"},
        {"n_routed_experts", "n_routed_experts"},
        {"n_shared_experts", "n_shared_experts"},
        {"n_activated_experts", "num_experts_per_tok"},
        {"score_func", "scoring_func"},
        {NULL, "topk_method"},
        {"norm_topk_prob", "norm_topk_prob"},
        {"route_scale", "routed_scaling_factor"},
        {"window_size", "sliding_window"},
        {"compress_ratios", "compress_ratios"},
        {"compress_rope_theta", "compress_rope_theta"},
        {"kv_source_layers", "kv_source_layer_ids"},
        {"index_source_layers", "index_source_layer_ids"},
        {"index_n_heads", "index_n_heads"},
        {"index_head_dim", "index_head_dim"},
        {"index_topk", "index_topk"},
        {"candidate_source_layer", "candidate_source_layer_id"},
        {"candidate_topk_blocks", "candidate_topk_blocks"},
        {"candidate_block_size", "candidate_block_size"},
        {"hc_mult", "hc_mult"},
        {"hc_sinkhorn_iters", "hc_sinkhorn_iters"},
        {"hc_eps", "hc_eps"},
        {"engram_layer_ids", "engram_layer_ids"},
        {"engram_num_embeddings", "engram_num_embeddings"},
        {"engram_max_ngram_size", "engram_max_ngram_size"},
        {"engram_vocab_size", "engram_vocab_size"},
        {"engram_n_heads", "engram_n_heads"},
        {"engram_head_dim", "engram_head_dim"},
        {"engram_pad_id", "engram_pad_token_id"},
        {"engram_compressed_vocab_size", "engram_compressed_vocab_size"},
        {"n_mtp_layers", "num_nextn_predict_layers"},
        {"dspark_block_size", "dspark_block_size"},
        {"dspark_noise_token_id", "dspark_noise_token_id"},
        {"dspark_target_layer_ids", "dspark_target_layer_ids"},
        {"dspark_markov_rank", "dspark_markov_rank"},
        {"dspark_n_routed_experts", "dspark_n_routed_experts"},
        {"dspark_n_activated_experts", "dspark_num_experts_per_tok"},
    };
    json_object_set_new(t, "model_type", json_string("deepseek_v41_text"));
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++) {
        const char *k = map[i][1];
        if (map[i][0]) {
            json_object_set(t, k, json_object_get(ma, map[i][0]));
        } else if (!strcmp(k, "num_key_value_heads")) {
            json_object_set_new(t, k, json_integer(1));
        } else if (!strcmp(k, "hidden_act")) {
            json_object_set_new(t, k, json_string("silu"));
        } else if (!strcmp(k, "attention_bias") || !strcmp(k, "tie_word_embeddings")) {
            json_object_set_new(t, k, json_false());
        } else if (!strcmp(k, "attention_dropout")) {
            json_object_set_new(t, k, json_real(0.0));
        } else if (!strcmp(k, "initializer_range")) {
            json_object_set_new(t, k, json_real(0.02));
        } else if (!strcmp(k, "use_cache")) {
            json_object_set_new(t, k, json_true());
        } else if (!strcmp(k, "max_position_embeddings")) {
            json_object_set_new(t, k, json_integer(o->max_pos));
        } else if (!strcmp(k, "topk_method")) {
            json_object_set_new(t, k, json_string("noaux_tc"));
        } else if (!strcmp(k, "rope_scaling")) {
            json_t *rs = json_object();
            json_object_set_new(rs, "rope_type", json_string("yarn"));
            json_object_set(rs, "factor", json_object_get(ma, "rope_factor"));
            json_object_set(rs, "beta_fast", json_object_get(ma, "beta_fast"));
            json_object_set(rs, "beta_slow", json_object_get(ma, "beta_slow"));
            json_object_set(rs, "original_max_position_embeddings",
                            json_object_get(ma, "original_seq_len"));
            json_object_set_new(t, k, rs);
        }
    }
    json_t *c = json_object(), *archs = json_array(), *q = json_object(), *blk = json_array();
    json_array_append_new(archs, json_string("DeepseekV41ForCausalLM"));
    json_object_set_new(c, "architectures", archs);
    json_object_set_new(c, "model_type", json_string("deepseek_v41"));
    json_object_set_new(c, "bos_token_id", json_integer(dv->bos));
    json_object_set_new(c, "eos_token_id", json_integer(dv->eos));
    json_object_set_new(c, "pad_token_id", json_integer(dv->pad));
    json_object_set_new(c, "image_token_id", json_integer(dv->image_id));
    json_object_set_new(c, "tie_word_embeddings", json_false());
    json_object_set_new(c, "dtype", json_string("bfloat16"));
    json_object_set_new(q, "quant_method", json_string("fp8"));
    json_object_set_new(q, "activation_scheme", json_string("dynamic"));
    json_array_append_new(blk, json_integer(BLK));
    json_array_append_new(blk, json_integer(BLK));
    json_object_set_new(q, "weight_block_size", blk);
    json_object_set_new(q, "scale_fmt", json_string("ue8m0"));
    json_object_set_new(q, "expert_dtype", json_string("fp4"));
    json_object_set_new(c, "quantization_config", q);
    json_object_set_new(c, "text_config", t);
    json_decref(ma);
    return c;
}

/* ---- arguments --------------------------------------------------------------------------------
 */

static void usage(void) {
    fprintf(
        stderr,
        "usage: mkmodel --arch deepseek_v41 --out DIR [--seed N] [--tokenizer DIR] [--vocab V]\n"
        "  [--layers L] [--dim D] [--heads H] [--head-dim HD] [--rope-dim R] [--q-lora Q]\n"
        "  [--o-groups G] [--o-lora O] [--ff F] [--experts E] [--topk K] [--window W]\n"
        "  [--compress-ratios r,r,..] [--kv-sources l,..] [--index-sources l,..]\n"
        "  [--candidate-source L --candidate-topk-blocks B --candidate-block-size S]\n"
        "  [--index-heads N] [--index-dim D] [--index-topk K] [--hc N] [--hc-iters N]\n"
        "  [--engram-layers l,..|none] [--engram-ngram N] [--engram-heads N] [--engram-dim D]\n"
        "  [--engram-vocab N | --engram-rows N] [--engram-pad ID]\n"
        "  [--dspark N --dspark-block B --dspark-targets l,.. --markov-rank R\n"
        "   --dspark-experts E --dspark-topk K]\n"
        "  [--original-seq-len N] [--rope-factor F] [--rope-theta T] [--compress-rope-theta T]\n"
        "  [--route-scale S] [--swiglu-limit S] [--norm-eps E] [--score-func F]\n"
        "  [--fp8-block-spread S]\n"
        "defaults: the built-in tokenizer (512 ids), 4 layers, dim 64, 4 heads x 64 (rope 16),\n"
        "q_lora 64, 4 o-groups x 32, ff 64, 4 experts top-2, window 8, compress ratios\n"
        "0,2,2,1, kv and index sources 1,3, no candidate selection, 4 index heads x 32 top-4,\n"
        "hc 4 x 20 iterations, Engram on layers 0,2 (3-grams, 2 heads x 32, vocab 101), no DSpark.\n");
}

static int parse_dbl(const char *s, double *out) {
    char *end = NULL;
    double v = strtod(s, &end);
    if (!end || *end || end == s || !isfinite(v))
        return 0;
    *out = v;
    return 1;
}

static int parse_ids(const char *s, long *v, long *n) {
    *n = 0;
    if (!strcmp(s, "none") || !*s)
        return 1;
    char buf[1024];
    snprintf(buf, sizeof(buf), "%s", s);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (*n >= MAXL || !mkmodel_parse_long(t, -1, 1L << 20, &v[*n]))
            return 0;
        (*n)++;
    }
    return 1;
}

static int parse_args(int argc, char **argv, v41_opts *o) {
    *o = (v41_opts){.vocab = -1,
                    .dim = 64,
                    .n_layers = 4,
                    .n_heads = 4,
                    .head_dim = 64,
                    .rope_dim = 16,
                    .q_lora = 64,
                    .o_groups = 4,
                    .o_lora = 32,
                    .ff = 64,
                    .experts = 4,
                    .topk = 2,
                    .window = 8,
                    .n_cr = -1,
                    .n_kvs = 2,
                    .kvs = {1, 3},
                    .n_ixs = 2,
                    .ixs = {1, 3},
                    .cand_src = -1,
                    .cand_topk = 0,
                    .cand_block = 0,
                    .index_heads = 4,
                    .index_dim = 32,
                    .index_topk = 4,
                    .hc = 4,
                    .hc_iters = 20,
                    .n_eng = 2,
                    .eng = {0, 2},
                    .eng_ngram = 3,
                    .eng_heads = 2,
                    .eng_dim = 32,
                    .eng_vocab = 101,
                    .eng_rows = 0,
                    .eng_pad = 2,
                    .n_mtp = 0,
                    .dspark_block = 2,
                    .n_dtgt = -1,
                    .markov_rank = 32,
                    .dspark_experts = -1,
                    .dspark_topk = -1,
                    .dspark_noise = -1,
                    .rope_theta = 10000,
                    .compress_rope_theta = 160000,
                    .rope_factor = 4,
                    .route_scale = 1.5,
                    .swiglu_limit = 10,
                    .norm_eps = 1e-20,
                    .original_seq_len = 16,
                    .beta_fast = 32,
                    .beta_slow = 1,
                    .max_pos = 4096,
                    .score_func = "sqrtsoftplus"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            return 0;
        i++;
        int ok = 1;
#define NUM(flag, field, lo, hi)                                                                   \
    else if (!strcmp(a, flag)) ok = mkmodel_parse_long(v, lo, hi, &o->field)
#define DBL(flag, field) else if (!strcmp(a, flag)) ok = parse_dbl(v, &o->field)
#define IDS(flag, arr, n) else if (!strcmp(a, flag)) ok = parse_ids(v, o->arr, &o->n)
        if (!strcmp(a, "--arch"))
            ok = !strcmp(v, "deepseek_v41");
        else if (!strcmp(a, "--out"))
            o->out = v;
        else if (!strcmp(a, "--tokenizer"))
            o->tokenizer = v;
        else if (!strcmp(a, "--score-func"))
            o->score_func = v;
        else if (!strcmp(a, "--seed")) {
            long s;
            ok = mkmodel_parse_long(v, 0, INT64_MAX / 2, &s);
            o->seed = (uint64_t)s;
        }
        NUM("--vocab", vocab, 8, 1L << 24);
        NUM("--layers", n_layers, 1, MAXL - 8);
        NUM("--dim", dim, 32, 1 << 16);
        NUM("--heads", n_heads, 1, 1024);
        NUM("--head-dim", head_dim, 32, 4096);
        NUM("--rope-dim", rope_dim, 2, 4096);
        NUM("--q-lora", q_lora, 32, 1 << 16);
        NUM("--o-groups", o_groups, 1, 1024);
        NUM("--o-lora", o_lora, 1, 1 << 16);
        NUM("--ff", ff, 32, 1 << 16);
        NUM("--experts", experts, 1, 4096);
        NUM("--topk", topk, 1, 4096);
        NUM("--window", window, 1, 1 << 20);
        NUM("--fp8-block-spread", fp8_spread, 0, 8);
        IDS("--compress-ratios", cr, n_cr);
        IDS("--kv-sources", kvs, n_kvs);
        IDS("--index-sources", ixs, n_ixs);
        NUM("--candidate-source", cand_src, -1, MAXL);
        NUM("--candidate-topk-blocks", cand_topk, 0, 1 << 20);
        NUM("--candidate-block-size", cand_block, 0, 1 << 20);
        NUM("--index-heads", index_heads, 1, 1024);
        NUM("--index-dim", index_dim, 32, 4096);
        NUM("--index-topk", index_topk, 1, 1 << 20);
        NUM("--hc", hc, 1, 64);
        NUM("--hc-iters", hc_iters, 1, 1000);
        IDS("--engram-layers", eng, n_eng);
        NUM("--engram-ngram", eng_ngram, 2, TM_ENGRAM_MAX_NGRAM);
        NUM("--engram-heads", eng_heads, 1, 256);
        NUM("--engram-dim", eng_dim, 32, 8192);
        NUM("--engram-vocab", eng_vocab, 2, 1L << 40);
        NUM("--engram-rows", eng_rows, 1, 1L << 40);
        NUM("--engram-pad", eng_pad, 0, 1L << 24);
        NUM("--dspark", n_mtp, 0, 8);
        NUM("--dspark-block", dspark_block, 1, 64);
        IDS("--dspark-targets", dtgt, n_dtgt);
        NUM("--markov-rank", markov_rank, 32, 1 << 16);
        NUM("--dspark-experts", dspark_experts, 0, 4096);
        NUM("--dspark-topk", dspark_topk, 0, 4096);
        NUM("--dspark-noise", dspark_noise, 0, 1L << 24);
        NUM("--original-seq-len", original_seq_len, 0, 1L << 30);
        NUM("--max-position", max_pos, 1, 1L << 30);
        NUM("--beta-fast", beta_fast, 0, 1 << 20);
        NUM("--beta-slow", beta_slow, 0, 1 << 20);
        DBL("--rope-factor", rope_factor);
        DBL("--rope-theta", rope_theta);
        DBL("--compress-rope-theta", compress_rope_theta);
        DBL("--route-scale", route_scale);
        DBL("--swiglu-limit", swiglu_limit);
        DBL("--norm-eps", norm_eps);
        else ok = 0;
#undef NUM
#undef DBL
#undef IDS
        if (!ok) {
            fprintf(stderr, "mkmodel: bad or unknown option %s %s\n", a, v);
            return 0;
        }
    }
    if (!o->out) {
        fprintf(stderr, "mkmodel: --out is required\n");
        return 0;
    }
    return 1;
}

/* Shape rules of the reference (quantized dims multiples of 32, layer roles consistent). */
static tm_rc check_opts(v41_opts *o, tm_err *err) {
    const long nl = o->n_layers, nt = o->n_layers + o->n_mtp;
    if (o->n_cr < 0) { // default: 0,2,2,1 then 1s, and 0 for the DSpark stages
        static const long def[] = {0, 2, 2, 1};
        for (long i = 0; i < nt; i++)
            o->cr[i] = i >= nl ? 0 : i < 4 ? def[i] : 1;
        o->n_cr = nt;
    }
    if (o->n_cr != nt)
        return TM_ERR(err, TM_E_INVAL,
                      "--compress-ratios has %ld entries, want %ld (layers + "
                      "DSpark stages)",
                      o->n_cr, nt);
    for (long i = nl; i < nt; i++)
        if (o->cr[i] != 0)
            return TM_ERR(err, TM_E_INVAL, "compress ratio of DSpark stage %ld must be 0", i - nl);
    struct {
        const char *what;
        long v;
    } m32[] = {{"--dim", o->dim},
               {"--q-lora", o->q_lora},
               {"--head-dim", o->head_dim},
               {"--ff", o->ff},
               {"--index-dim", o->index_dim},
               {"--engram-dim", o->eng_dim},
               {"--o-groups x --o-lora", o->o_groups * o->o_lora},
               {"--markov-rank", o->markov_rank}};
    for (size_t i = 0; i < sizeof(m32) / sizeof(m32[0]); i++)
        if (m32[i].v % BLK)
            return TM_ERR(err, TM_E_INVAL, "%s (%ld) must be a multiple of %d", m32[i].what,
                          m32[i].v, BLK);
    if (o->rope_dim % 2 || o->rope_dim > o->head_dim || o->rope_dim > o->index_dim)
        return TM_ERR(err, TM_E_INVAL,
                      "--rope-dim %ld must be even and at most head-dim and "
                      "index-dim",
                      o->rope_dim);
    if (o->n_heads % o->o_groups)
        return TM_ERR(err, TM_E_INVAL, "--heads %ld is not a multiple of --o-groups %ld",
                      o->n_heads, o->o_groups);
    if (o->topk > o->experts)
        return TM_ERR(err, TM_E_INVAL, "--topk %ld exceeds --experts %ld", o->topk, o->experts);
    for (long i = 0; i < o->n_kvs; i++)
        if (o->kvs[i] < 0 || o->kvs[i] >= nl || o->cr[o->kvs[i]] == 0 ||
            !in_list(o->ixs, o->n_ixs, o->kvs[i]))
            return TM_ERR(err, TM_E_INVAL,
                          "kv source layer %ld must be a layer with a compress "
                          "ratio > 0 that is also an index source",
                          o->kvs[i]);
    for (long i = 0; i < o->n_ixs; i++)
        if (o->ixs[i] < 0 || o->ixs[i] >= nl || o->cr[o->ixs[i]] == 0)
            return TM_ERR(err, TM_E_INVAL, "index source layer %ld must have a compress ratio > 0",
                          o->ixs[i]);
    if (o->cand_src >= 0 &&
        (!in_list(o->ixs, o->n_ixs, o->cand_src) || o->cand_topk < 1 || o->cand_block < 1))
        return TM_ERR(err, TM_E_INVAL,
                      "--candidate-source %ld must be an index source, with "
                      "--candidate-topk-blocks and --candidate-block-size >= 1",
                      o->cand_src);
    for (long i = 0; i < o->n_eng; i++)
        if (o->eng[i] < 0 || o->eng[i] >= nl)
            return TM_ERR(err, TM_E_INVAL, "engram layer %ld is not a backbone layer", o->eng[i]);
    if (o->n_mtp) {
        if (o->n_dtgt < 0) {
            o->n_dtgt = TM_MIN(2, nl);
            for (long i = 0; i < o->n_dtgt; i++)
                o->dtgt[i] = nl - o->n_dtgt + i;
        }
        if (o->n_dtgt < 1)
            return TM_ERR(err, TM_E_INVAL, "--dspark-targets must name at least one layer");
        for (long i = 0; i < o->n_dtgt; i++)
            if (o->dtgt[i] < 0 || o->dtgt[i] >= nl)
                return TM_ERR(err, TM_E_INVAL, "DSpark target layer %ld is not a backbone layer",
                              o->dtgt[i]);
    } else {
        o->n_dtgt = 0;
    }
    if (o->dspark_experts < 0)
        o->dspark_experts = o->n_mtp ? o->experts : 0;
    if (o->dspark_topk < 0)
        o->dspark_topk = o->n_mtp ? o->topk : 0;
    if (o->dspark_experts && o->dspark_topk > o->dspark_experts)
        return TM_ERR(err, TM_E_INVAL, "--dspark-topk exceeds --dspark-experts");
    return TM_OK;
}

/* ---- main -------------------------------------------------------------------------------------
 */

static tm_rc mkdir_one(const char *dir, tm_err *err) {
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return TM_ERR(err, TM_E_IO, "%s: mkdir: %s", dir, strerror(errno));
    return TM_OK;
}

static tm_rc copy_file(const char *src_dir, const char *dst_dir, const char *name, int optional,
                       tm_err *err) {
    char src[4200], dst[4200];
    snprintf(src, sizeof(src), "%s/%s", src_dir, name);
    snprintf(dst, sizeof(dst), "%s/%s", dst_dir, name);
    FILE *in = fopen(src, "rb");
    if (!in) {
        if (optional && errno == ENOENT)
            return TM_OK;
        return TM_ERR(err, TM_E_IO, "%s: %s", src, strerror(errno));
    }
    FILE *out = fopen(dst, "wb");
    if (!out) {
        fclose(in);
        return TM_ERR(err, TM_E_IO, "%s: %s", dst, strerror(errno));
    }
    char buf[65536];
    size_t n;
    tm_rc rc = TM_OK;
    while ((n = fread(buf, 1, sizeof(buf), in)) > 0)
        if (fwrite(buf, 1, n, out) != n) {
            rc = TM_ERR(err, TM_E_IO, "%s: write failed", dst);
            break;
        }
    fclose(in);
    if (fclose(out) != 0 && rc == TM_OK)
        rc = TM_ERR(err, TM_E_IO, "%s: close failed", dst);
    return rc;
}

/* The compressed map of the tokenizer in dir: *n_compressed and the compressed pad id. */
static tm_rc compressed_vocab(const tm_tokenizer *tok, long pad, long *n_tok_out,
                              long *n_compressed, int64_t *pad_c, tm_err *err) {
    uint32_t n_tok = tm_tok_n_vocab(tok);
    tm_engram_tok *t = tm_calloc(n_tok, sizeof(*t));
    int32_t *map = tm_calloc(n_tok, sizeof(*map));
    tm_rc rc = TM_OK;
    if (!t || !map) {
        rc = TM_ERR(err, TM_E_NOMEM, "token map");
        goto done;
    }
    for (uint32_t i = 0; i < n_tok; i++) {
        size_t len = 0;
        const char *p = tm_tok_piece(tok, i, &len);
        t[i] = (tm_engram_tok){.text = p ? p : "", .text_len = p ? len : 0};
    }
    uint32_t n_c = 0;
    rc = tm_engram_token_map_build(t, n_tok, map, &n_c, err);
    if (rc)
        goto done;
    if (pad < 0 || pad >= (long)n_tok) {
        rc = TM_ERR(err, TM_E_INVAL, "--engram-pad %ld is not a token id (tokenizer: %u)", pad,
                    n_tok);
        goto done;
    }
    *n_tok_out = n_tok;
    *n_compressed = n_c;
    *pad_c = map[pad];
done:
    tm_free(t);
    tm_free(map);
    return rc;
}

static int cmp_vt(const void *a, const void *b) {
    return strcmp(((const vt *)a)->name, ((const vt *)b)->name);
}

int mkmodel_dsv41_main(int argc, char **argv) {
    v41_opts o;
    if (!parse_args(argc, argv, &o)) {
        usage();
        return 2;
    }
    tm_err err = {0};
    tm_rc rc;
    tm_tokenizer *tok = NULL;
    tm_engram_layout *L = NULL;
    vlist l = {0};
    tm_st_wtensor *w = NULL;
    json_t *index = NULL, *cfg = NULL;
    tm_st_set *set = NULL;
    char path[4200];
    if ((rc = check_opts(&o, &err)) || (rc = mkdir_one(o.out, &err)))
        goto out;
    snprintf(path, sizeof(path), "%s/inference", o.out);
    if ((rc = mkdir_one(path, &err)))
        goto out;
    // The tokenizer first: the compressed vocabulary size goes into the config.
    if (o.tokenizer) {
        rc = copy_file(o.tokenizer, o.out, "tokenizer.json", 0, &err);
        if (rc == TM_OK)
            rc = copy_file(o.tokenizer, o.out, "tokenizer_config.json", 1, &err);
    } else {
        rc = write_builtin_tokenizer(o.out, o.vocab > 0 ? o.vocab : 512, &err);
    }
    if (rc || (rc = tm_tok_load(o.out, &tok, &err)))
        goto out;
    v41_derived dv = {.bos = tm_tok_bos_id(tok), .eos = tm_tok_eos_id(tok), .pad = 2};
    long n_tok = 0;
    int64_t pad_c = 0;
    if ((rc = compressed_vocab(tok, o.eng_pad, &n_tok, &dv.n_compressed, &pad_c, &err)))
        goto out;
    dv.vocab = o.vocab > 0 ? o.vocab : o.tokenizer ? TM_MAX(n_tok, 129280) : n_tok;
    if (dv.vocab < n_tok) {
        rc = TM_ERR(&err, TM_E_INVAL, "--vocab %ld is below the tokenizer's %ld ids", dv.vocab,
                    n_tok);
        goto out;
    }
    o.vocab = dv.vocab;
    int32_t img = tm_tok_find(tok, BUILTIN_IMAGE_TOKEN);
    dv.image_id = img >= 0 ? img : dv.vocab - 16;
    if (o.dspark_noise < 0)
        o.dspark_noise = dv.vocab - 1;
    if (dv.bos < 0)
        dv.bos = 0;
    if (dv.eos < 0)
        dv.eos = 1;
    if (o.n_eng) {
        const long n_cols = (o.eng_ngram - 1) * o.eng_heads;
        if (o.eng_rows) // tables of about eng_rows rows: each column's prime is near vocab
            o.eng_vocab = TM_MAX(2, o.eng_rows / n_cols);
        uint32_t ids[MAXL];
        uint64_t big[MAXL];
        for (long k = 0; k < o.n_eng; k++) {
            ids[k] = (uint32_t)o.eng[k];
            big[k] = UINT64_MAX;
        }
        tm_engram_params p = {.n_layer = (uint32_t)o.n_eng,
                              .layer_ids = ids,
                              .num_embeddings = big,
                              .max_ngram = (uint32_t)o.eng_ngram,
                              .n_heads = (uint32_t)o.eng_heads,
                              .head_dim = (uint32_t)o.eng_dim,
                              .vocab_size = (uint64_t)o.eng_vocab,
                              .compressed_vocab = (uint64_t)dv.n_compressed,
                              .pad_compressed = pad_c};
        if ((rc = tm_engram_layout_create(&p, &L, &err)))
            goto out;
        // the table rows are the summed bucket ranges, as in the released config
        for (uint32_t k = 0; k < L->n_layer; k++)
            L->num_embeddings[k] = L->rows_used[k];
        dv.L = L;
    }
    if ((rc = list_tensors(&o, L, &l, &err)) || (rc = fill(&o, &l, &err)))
        goto out;
    qsort(l.t, l.n, sizeof(*l.t), cmp_vt);
    w = tm_calloc(l.n, sizeof(*w));
    if (!w) {
        rc = TM_ERR(&err, TM_E_NOMEM, "tensor list");
        goto out;
    }
    const int n_shard = L ? 2 : 1;
    char f1[64], f2[64];
    snprintf(f1, sizeof(f1), "model-00001-of-%05d.safetensors", n_shard);
    snprintf(f2, sizeof(f2), "model-00002-of-%05d.safetensors", n_shard);
    index = json_object();
    json_t *wmap = json_object(), *md = json_object();
    uint64_t total = 0;
    for (size_t i = 0; i < l.n; i++) {
        w[i] = (tm_st_wtensor){
            .name = l.t[i].name, .dtype = l.t[i].dtype, .n_dim = l.t[i].n_dim, .data = l.t[i].data};
        w[i].shape[0] = l.t[i].shape[0];
        w[i].shape[1] = l.t[i].shape[1];
        total += vt_elems(&l.t[i]) * tm_dtype_size(l.t[i].dtype);
        json_object_set_new(wmap, l.t[i].name, json_string(f1));
    }
    static const char *const meta[] = {"format", "pt"};
    snprintf(path, sizeof(path), "%s/%s", o.out, f1);
    if ((rc = tm_st_file_write(path, w, l.n, meta, 1, &err)))
        goto out;
    if (L) {
        snprintf(path, sizeof(path), "%s/%s", o.out, f2);
        if ((rc = write_engram_shard(&o, L, path, wmap, f2, &total, &err)))
            goto out;
    }
    json_object_set_new(md, "total_size", json_integer((json_int_t)total));
    json_object_set_new(index, "metadata", md);
    json_object_set_new(index, "weight_map", wmap);
    if ((rc = write_json(o.out, "model.safetensors.index.json", index, &err)))
        goto out;
    cfg = make_hf_config(&o, &dv);
    if ((rc = write_json(o.out, "config.json", cfg, &err)))
        goto out;
    json_decref(cfg);
    cfg = make_model_args(&o, &dv);
    if ((rc = write_json(o.out, "inference/config.json", cfg, &err)))
        goto out;
    json_decref(cfg);
    cfg = json_object();
    json_object_set_new(cfg, "bos_token_id", json_integer(dv.bos));
    json_object_set_new(cfg, "eos_token_id", json_integer(dv.eos));
    json_object_set_new(cfg, "do_sample", json_false());
    if ((rc = write_json(o.out, "generation_config.json", cfg, &err)))
        goto out;
    // Self-check: every tensor is found through the index with the dtype and shape written.
    if ((rc = tm_st_set_open(o.out, &set, &err)))
        goto out;
    uint64_t n_param = 0;
    for (size_t i = 0; i < l.n; i++) {
        const tm_st_tensor *s = tm_st_set_find(set, l.t[i].name);
        if (!s || s->dtype != l.t[i].dtype || s->n_dim != l.t[i].n_dim ||
            s->shape[0] != l.t[i].shape[0] ||
            (l.t[i].n_dim > 1 && s->shape[1] != l.t[i].shape[1])) {
            rc = TM_ERR(&err, TM_E_INTERNAL, "self-check: %s reads back wrong", l.t[i].name);
            goto out;
        }
        n_param += vt_elems(&l.t[i]) * (l.t[i].kind == VK_FP4 ? 2 : 1);
    }
    for (uint32_t k = 0; L && k < L->n_layer; k++) {
        char nm[96];
        snprintf(nm, sizeof(nm), "layers.%u.engram.embed.weight", L->layer_ids[k]);
        const tm_st_tensor *s = tm_st_set_find(set, nm);
        if (!s || s->shape[0] != L->num_embeddings[k] || s->shape[1] != L->head_dim) {
            rc = TM_ERR(&err, TM_E_INTERNAL, "self-check: %s reads back wrong", nm);
            goto out;
        }
        n_param += L->num_embeddings[k] * L->head_dim;
    }
    printf("mkmodel: wrote %s: deepseek_v41, %ld layers + %ld DSpark stages, dim %ld, %ld heads x "
           "%ld, %ld experts top-%ld (MXFP4), FP8 [32,32] linears, vocab %ld (tokenizer %ld ids, "
           "compressed %ld)",
           o.out, o.n_layers, o.n_mtp, o.dim, o.n_heads, o.head_dim, o.experts, o.topk, dv.vocab,
           n_tok, dv.n_compressed);
    for (uint32_t k = 0; L && k < L->n_layer; k++)
        printf("%s%u:%llu", k ? "," : ", engram rows layer ", L->layer_ids[k],
               (unsigned long long)L->num_embeddings[k]);
    printf(", %llu parameters\n", (unsigned long long)n_param);
out:
    tm_st_set_close(set);
    json_decref(cfg);
    json_decref(index);
    tm_free(w);
    for (size_t i = 0; i < l.n; i++)
        tm_free(l.t[i].data);
    tm_free(l.t);
    tm_engram_layout_destroy(L);
    tm_tok_destroy(tok);
    if (rc) {
        fprintf(stderr, "mkmodel: %s\n", err.msg);
        return 1;
    }
    return 0;
}
