/* tools/mkmodel.c - write a deterministic random-weight Llama-family model in Hugging Face format
 * (config.json, generation_config.json, model.safetensors or shards + index, optionally a copied
 * tokenizer), for tests and demos. Same arguments and seed give byte-identical files on the same
 * platform (each tensor draws from its own generator seeded by the seed and the tensor's name, so
 * adding layers does not change the existing ones).
 *
 * Weights: embeddings N(0, s) with s = min(0.5, 2/sqrt(hidden)) so that tied logits are neither
 * flat nor one-hot; projections N(0, 1/sqrt(fan_in)); lm_head (untied) N(0, 2/sqrt(hidden));
 * RMSNorm weights 1 + N(0, 0.1); Qwen2 q/k/v biases N(0, 0.1). Every file is written to a temp
 * name, fsynced and renamed. The result is loaded back with tm_model_load as a self-check.
 *
 * --arch deepseek_v4 writes a DeepseekV4ForCausalLM (transformers 5.17) instead: the layer schedule
 * from --dsv4-layers (s = sliding, c = compressed sparse, h = heavily compressed) and --dsv4-mlp
 * (h = hash_moe, m = moe), --ff is moe_intermediate_size; tid2eid is written as f32 whatever
 * --dtype says (the safetensors reader takes float dtypes only; transformers casts it back).
 * Extra weights: sinks, position biases and hyper-connection bases N(0, 0.5), scales 1 + N(0,
 * 0.1), e_score_correction_bias N(0, 0.1), tid2eid distinct experts drawn per token.
 *
 * --quant writes quantized linears (docs/quantization.md), quantizing the weights drawn as above
 * (after rounding to --dtype, as a tool quantizing that checkpoint would): fp8-block[-ue8m0]
 * (quant_method fp8, weight_scale_inv per --quant-block square block, fp32 or e8m0 scales),
 * fp8-channel / fp8-tensor (compressed-tensors, weight_scale per row / one, dynamic per-token
 * activations, or static with --ct-static 1: input_scale 1/32). Llama family: q/k/v/o/gate/up/
 * down; deepseek_v4: q_a/q_b/kv/o_a/o_b and the shared expert (compressor and indexer stay
 * bf16, as in the released checkpoint), routed experts as --expert-dtype says (fp4: MXFP4, packed
 * e2m1 I8 [E][out][in/2] + F8_E8M0 [E][out][in/32]; fp8: like the dense ones; default fp8).
 * --dequant-copy DIR also writes the same model with every quantized weight replaced by its
 * dequantized values as f32 (through tm_tensor_row_f32, the CPU engine's row read) and no
 * quantization_config: the CPU engine gives the same bits on both. */
#include "mkmodel.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/err.h"
#include "runner/model/arch.h"
#include "runner/model/model.h"
#include "runner/model/safetensors.h"

typedef struct mk_opts {
    const char *out;
    const char *arch;        /* llama | qwen2 | mistral | deepseek_v4 */
    const struct mk_arch *a; /* arch's entry of mk_archs */
    uint64_t seed;
    long layers, hidden, heads, kv_heads, head_dim, ff, vocab, ctx, tied, shards, bos, eos;
    long uniform; /* 1: uniform values of the same std (fast; benchmark checkpoints) */
    tm_dtype dtype;
    double rope_theta;
    int rope_llama3;
    const char *tokenizer; /* folder with tokenizer.json (+ tokenizer_config.json) */
    /* deepseek_v4 only */
    const char *dsv4_layers; /* one letter per layer: s, c, h */
    const char *dsv4_mlp;    /* one letter per layer: h (hash_moe), m (moe) */
    const char *dsv4_mtp;    /* NULL, or the MTP layer's attention and MLP letters ("sm") */
    long mtp_copy;           /* -1, or the main layer whose values the MTP block copies */
    long q_lora, o_groups, o_lora, experts, experts_used, window, index_heads, index_dim,
        index_topk, hc, rope_dim, hca_ratio, yarn;
    /* quantization (docs/quantization.md) */
    tm_quant quant;           /* dense linears: NONE, FP8_BLOCK, FP8_CHANNEL, FP8_TENSOR */
    int ue8m0;                /* FP8_BLOCK scales as F8_E8M0 */
    long qblock;              /* FP8_BLOCK block side (128) */
    int expert_set;           /* --expert-dtype given */
    tm_quant expert;          /* deepseek_v4 routed experts: NONE, FP8_BLOCK, MXFP4 */
    long ct_static;           /* compressed-tensors static input scales */
    const char *dequant_copy; /* folder for the dequantized f32 copy, or NULL */
    int write_plain;          /* internal: writing the dequantized copy */
} mk_opts;

static void usage(void) {
    fprintf(stderr,
            "usage: mkmodel --out DIR [--arch llama|qwen2|mistral] [--seed N] [--layers L]\n"
            "               [--hidden H] [--heads NH] [--kv-heads NKV] [--head-dim D] [--ff F]\n"
            "               [--vocab V] [--ctx C] [--tied 0|1] [--dtype f32|bf16|f16]\n"
            "               [--rope-theta T] [--rope-scaling llama3] [--tokenizer DIR]\n"
            "               [--bos ID] [--eos ID] [--shards N] [--uniform 0|1]\n"
            "deepseek_v4: [--dsv4-layers sch..] [--dsv4-mlp hm..] [--q-lora R] [--o-groups G]\n"
            "             [--o-lora R] [--experts E] [--experts-used K] [--window W]\n"
            "             [--index-heads N] [--index-dim D] [--index-topk K] [--hc N]\n"
            "             [--rope-dim D] [--hca-ratio R] [--yarn 0|1] [--expert-dtype fp4|fp8]\n"
            "             [--dsv4-mtp AM (attention s/c/h, MLP h/m)] [--dsv4-mtp-copy L]\n"
            "quantized:   [--quant none|fp8-block|fp8-block-ue8m0|fp8-channel|fp8-tensor]\n"
            "             [--quant-block N] [--ct-static 0|1] [--dequant-copy DIR]\n"
            "Defaults: llama, seed 1, 2 layers, hidden 64, 4 heads, 2 kv heads, ff 128, vocab 256\n"
            "(or the tokenizer's size), ctx 512, untied, bf16, rope theta 10000, 1 shard.\n");
}

/* ---- random numbers: splitmix64 seeds xoshiro256**, Box-Muller for normals ------------------ */

typedef struct mk_rng {
    uint64_t s[4];
    int has_spare;
    double spare;
} mk_rng;

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(mk_rng *r) {
    uint64_t res = rotl(r->s[1] * 5, 7) * 9, t = r->s[1] << 17;
    r->s[2] ^= r->s[0];
    r->s[3] ^= r->s[1];
    r->s[1] ^= r->s[2];
    r->s[0] ^= r->s[3];
    r->s[2] ^= t;
    r->s[3] = rotl(r->s[3], 45);
    return res;
}

static void rng_seed(mk_rng *r, uint64_t seed, const char *name) {
    uint64_t h = 0xcbf29ce484222325ull; // FNV-1a of the tensor name
    for (const char *p = name; *p; p++)
        h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    uint64_t x = seed ^ h;
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
    r->has_spare = 0;
}

static double rng_normal(mk_rng *r) {
    if (r->has_spare) {
        r->has_spare = 0;
        return r->spare;
    }
    double u1 = ((rng_next(r) >> 11) + 1.0) * 0x1.0p-53; // (0, 1]
    double u2 = (rng_next(r) >> 11) * 0x1.0p-53;         // [0, 1)
    double rad = sqrt(-2.0 * log(u1)), th = 6.283185307179586 * u2;
    r->spare = rad * sin(th);
    r->has_spare = 1;
    return rad * cos(th);
}

/* ---- files ----------------------------------------------------------------------------------- */

static tm_rc write_file_atomic(const char *path, const void *data, size_t n, tm_err *err) {
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return TM_ERR(err, TM_E_IO, "%s: open: %s", tmp, strerror(errno));
    const char *p = data;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0) {
            TM_ERR(err, TM_E_IO, "%s: write: %s", tmp, strerror(errno));
            close(fd);
            unlink(tmp);
            return err->rc;
        }
        p += w;
        n -= (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        unlink(tmp);
        return TM_ERR(err, TM_E_IO, "%s: fsync/close: %s", tmp, strerror(errno));
    }
    if (rename(tmp, path) != 0)
        return TM_ERR(err, TM_E_IO, "rename %s: %s", path, strerror(errno));
    return TM_OK;
}

// partial_rotary_factor for rope_dim of head_dim: the double nearest rope_dim / head_dim for which
// int(head_dim * f) == rope_dim, since transformers (rope_utils: dim = int(head_dim *
// partial_rotary_factor)) and model_dsv4.c read it by truncation and the plain quotient does not
// always survive that (30/44 * 44 is 29.999999999999996). *digits: the fewest significant digits
// (at least 10, the other reals' precision) that write f exactly, so the file reads back as f.
static double rotary_factor(long rope_dim, long head_dim, int *digits) {
    double f = (double)rope_dim / (double)head_dim;
    while ((long)((double)head_dim * f) < rope_dim)
        f = nextafter(f, 2.0);
    for (*digits = 10; *digits < 17; (*digits)++) {
        char buf[64];
        snprintf(buf, sizeof(buf), "%.*g", *digits, f);
        if (strtod(buf, NULL) == f)
            break;
    }
    return f;
}

static tm_rc write_json(const char *dir, const char *name, json_t *j, int digits, tm_err *err) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(digits));
    if (!s)
        return TM_ERR(err, TM_E_NOMEM, "%s: json_dumps", name);
    size_t n = strlen(s);
    tm_rc rc = TM_OK;
    char *withnl = tm_malloc(n + 2);
    if (!withnl) {
        rc = TM_ERR(err, TM_E_NOMEM, "%s", name);
    } else {
        memcpy(withnl, s, n);
        withnl[n] = '\n';
        rc = write_file_atomic(path, withnl, n + 1, err);
    }
    tm_free(withnl);
    free(s);
    return rc;
}

static tm_rc read_file(const char *path, char **out, size_t *n_out, tm_err *err) {
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return TM_ERR(err, TM_E_IO, "%s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 1 << 16;
            char *nb = tm_realloc(buf, ncap);
            if (!nb) {
                tm_free(buf);
                fclose(fp);
                return TM_ERR(err, TM_E_NOMEM, "%s", path);
            }
            buf = nb;
            cap = ncap;
        }
        size_t k = fread(buf + n, 1, cap - n, fp);
        n += k;
        if (k == 0)
            break;
    }
    int bad = ferror(fp);
    fclose(fp);
    if (bad) {
        tm_free(buf);
        return TM_ERR(err, TM_E_IO, "%s: read error", path);
    }
    *out = buf;
    *n_out = n;
    return TM_OK;
}

static tm_rc copy_file(const char *src_dir, const char *dst_dir, const char *name, int optional,
                       tm_err *err) {
    char src[4096], dst[4096];
    snprintf(src, sizeof(src), "%s/%s", src_dir, name);
    snprintf(dst, sizeof(dst), "%s/%s", dst_dir, name);
    if (optional && access(src, F_OK) != 0)
        return TM_OK;
    char *buf = NULL;
    size_t n = 0;
    tm_rc rc = read_file(src, &buf, &n, err);
    if (rc == TM_OK)
        rc = write_file_atomic(dst, buf, n, err);
    tm_free(buf);
    return rc;
}

static tm_rc mkdir_p(const char *dir, tm_err *err) {
    char p[4096];
    snprintf(p, sizeof(p), "%s", dir);
    for (char *s = p + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST)
            return TM_ERR(err, TM_E_IO, "mkdir %s: %s", p, strerror(errno));
        *s = '/';
    }
    if (mkdir(p, 0755) != 0 && errno != EEXIST)
        return TM_ERR(err, TM_E_IO, "mkdir %s: %s", p, strerror(errno));
    return TM_OK;
}

/* ---- tokenizer: vocabulary size and bos/eos ids ---------------------------------------------- */

static long token_id(json_t *tok, json_t *tcfg, const char *key) {
    json_t *v = json_object_get(tcfg, key);
    if (json_is_object(v))
        v = json_object_get(v, "content");
    if (!json_is_string(v))
        return -1;
    const char *s = json_string_value(v);
    json_t *added = json_object_get(tok, "added_tokens");
    for (size_t i = 0; i < json_array_size(added); i++) {
        json_t *a = json_array_get(added, i);
        if (json_is_string(json_object_get(a, "content")) &&
            !strcmp(json_string_value(json_object_get(a, "content")), s))
            return (long)json_integer_value(json_object_get(a, "id"));
    }
    json_t *vocab = json_object_get(json_object_get(tok, "model"), "vocab");
    json_t *id = json_is_object(vocab) ? json_object_get(vocab, s) : NULL;
    return json_is_integer(id) ? (long)json_integer_value(id) : -1;
}

static tm_rc read_tokenizer(const char *dir, long *n_vocab, long *bos, long *eos, tm_err *err) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    json_error_t je;
    json_t *tok = json_load_file(path, 0, &je);
    if (!tok)
        return TM_ERR(err, TM_E_PARSE, "%s: %s", path, je.text);
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
    json_t *tcfg = access(path, F_OK) == 0 ? json_load_file(path, 0, &je) : json_object();
    if (!tcfg) {
        json_decref(tok);
        return TM_ERR(err, TM_E_PARSE, "%s: %s", path, je.text);
    }
    long max_id = -1;
    json_t *vocab = json_object_get(json_object_get(tok, "model"), "vocab");
    if (json_is_array(vocab)) {
        max_id = (long)json_array_size(vocab) - 1; // Unigram: [[piece, score], ...]
    } else {
        const char *k;
        json_t *v;
        json_object_foreach(vocab, k, v) {
            if (json_is_integer(v) && json_integer_value(v) > max_id)
                max_id = (long)json_integer_value(v);
        }
    }
    json_t *added = json_object_get(tok, "added_tokens");
    for (size_t i = 0; i < json_array_size(added); i++) {
        json_t *id = json_object_get(json_array_get(added, i), "id");
        if (json_is_integer(id) && json_integer_value(id) > max_id)
            max_id = (long)json_integer_value(id);
    }
    *n_vocab = max_id + 1;
    *bos = token_id(tok, tcfg, "bos_token");
    *eos = token_id(tok, tcfg, "eos_token");
    json_decref(tok);
    json_decref(tcfg);
    return TM_OK;
}

/* ---- config files ---------------------------------------------------------------------------- */

static const char *hf_class(const char *arch) {
    const tm_arch_ops *ops = tm_arch_ops_get((tm_arch)tm_arch_find(arch, 0));
    return ops ? ops->hf_class : "?";
}

static const char *torch_dtype(tm_dtype dt) {
    switch (dt) {
    case TM_DTYPE_F32:
        return "float32";
    case TM_DTYPE_F16:
        return "float16";
    case TM_DTYPE_BF16:
        return "bfloat16";
    default:
        break; // only the three float dtypes are --dtype values
    }
    return "?";
}

/* quantization_config for o's --quant, NULL when none (or when writing the dequantized copy). */
static json_t *make_quant_config(const mk_opts *o) {
    if (o->write_plain || o->quant == TM_QUANT_NONE)
        return NULL;
    json_t *q = json_object();
    if (o->quant == TM_QUANT_FP8_BLOCK) {
        json_object_set_new(q, "quant_method", json_string("fp8"));
        json_object_set_new(q, "fmt", json_string("e4m3"));
        json_object_set_new(q, "activation_scheme", json_string("dynamic"));
        json_t *bs = json_array();
        json_array_append_new(bs, json_integer(o->qblock));
        json_array_append_new(bs, json_integer(o->qblock));
        json_object_set_new(q, "weight_block_size", bs);
        if (o->ue8m0)
            json_object_set_new(q, "scale_fmt", json_string("ue8m0"));
        return q;
    }
    json_object_set_new(q, "quant_method", json_string("compressed-tensors"));
    json_object_set_new(q, "format", json_string("float-quantized"));
    json_object_set_new(q, "quantization_status", json_string("compressed"));
    json_t *w = json_object();
    json_object_set_new(w, "num_bits", json_integer(8));
    json_object_set_new(w, "type", json_string("float"));
    json_object_set_new(w, "symmetric", json_true());
    json_object_set_new(w, "dynamic", json_false());
    json_object_set_new(w, "strategy",
                        json_string(o->quant == TM_QUANT_FP8_CHANNEL ? "channel" : "tensor"));
    json_t *ia = json_object();
    json_object_set_new(ia, "num_bits", json_integer(8));
    json_object_set_new(ia, "type", json_string("float"));
    json_object_set_new(ia, "symmetric", json_true());
    json_object_set_new(ia, "dynamic", json_boolean(!o->ct_static));
    json_object_set_new(ia, "strategy", json_string(o->ct_static ? "tensor" : "token"));
    json_t *g = json_object(), *targets = json_array();
    json_array_append_new(targets, json_string("Linear"));
    json_object_set_new(g, "targets", targets);
    json_object_set_new(g, "weights", w);
    json_object_set_new(g, "input_activations", ia);
    json_t *groups = json_object();
    json_object_set_new(groups, "group_0", g);
    json_object_set_new(q, "config_groups", groups);
    json_t *ign = json_array();
    json_array_append_new(ign, json_string("lm_head"));
    json_object_set_new(q, "ignore", ign);
    return q;
}

static json_t *make_dsv4_config(const mk_opts *o) {
    json_t *c = json_object();
    json_t *archs = json_array();
    json_array_append_new(archs, json_string("DeepseekV4ForCausalLM"));
    json_object_set_new(c, "architectures", archs);
    json_object_set_new(c, "model_type", json_string("deepseek_v4"));
    json_object_set_new(c, "bos_token_id", json_integer(o->bos));
    json_object_set_new(c, "eos_token_id", json_integer(o->eos));
    json_object_set_new(c, "vocab_size", json_integer(o->vocab));
    json_object_set_new(c, "hidden_size", json_integer(o->hidden));
    json_object_set_new(c, "moe_intermediate_size", json_integer(o->ff));
    json_object_set_new(c, "num_hidden_layers", json_integer(o->layers));
    json_object_set_new(c, "num_attention_heads", json_integer(o->heads));
    json_object_set_new(c, "num_key_value_heads", json_integer(1));
    json_object_set_new(c, "head_dim", json_integer(o->head_dim));
    json_object_set_new(c, "q_lora_rank", json_integer(o->q_lora));
    int digits;
    json_object_set_new(c, "partial_rotary_factor",
                        json_real(rotary_factor(o->rope_dim, o->head_dim, &digits)));
    json_object_set_new(c, "num_experts_per_tok", json_integer(o->experts_used));
    json_object_set_new(c, "n_routed_experts", json_integer(o->experts));
    json_object_set_new(c, "n_shared_experts", json_integer(1));
    json_object_set_new(c, "scoring_func", json_string("sqrtsoftplus"));
    json_object_set_new(c, "norm_topk_prob", json_true());
    json_object_set_new(c, "routed_scaling_factor", json_real(1.5));
    json_object_set_new(c, "max_position_embeddings", json_integer(o->ctx));
    json_object_set_new(c, "rope_theta", json_real(o->rope_theta));
    json_object_set_new(c, "compress_rope_theta", json_real(160000.0));
    if (o->yarn) {
        // factor == max_position_embeddings / original_max_position_embeddings, as in the
        // released configs.
        json_t *rp = json_object();
        json_object_set_new(rp, "rope_type", json_string("yarn"));
        json_object_set_new(rp, "factor", json_real(16.0));
        json_object_set_new(rp, "original_max_position_embeddings",
                            json_integer(o->ctx / 16 > 0 ? o->ctx / 16 : 1));
        json_object_set_new(rp, "beta_fast", json_real(32.0));
        json_object_set_new(rp, "beta_slow", json_real(1.0));
        json_object_set_new(c, "rope_parameters", rp);
    }
    json_t *lt = json_array(), *mt = json_array();
    for (long i = 0; i < o->layers; i++) {
        char a = o->dsv4_layers[i], m = o->dsv4_mlp[i];
        json_array_append_new(lt, json_string(a == 's'   ? "sliding_attention"
                                              : a == 'c' ? "compressed_sparse_attention"
                                                         : "heavily_compressed_attention"));
        json_array_append_new(mt, json_string(m == 'h' ? "hash_moe" : "moe"));
    }
    if (o->dsv4_mtp && strcmp(o->dsv4_mtp, "sm")) { // the MTP layer's kinds, entry n_layer
        char a = o->dsv4_mtp[0], m = o->dsv4_mtp[1];
        json_array_append_new(lt, json_string(a == 's'   ? "sliding_attention"
                                              : a == 'c' ? "compressed_sparse_attention"
                                                         : "heavily_compressed_attention"));
        json_array_append_new(mt, json_string(m == 'h' ? "hash_moe" : "moe"));
    }
    json_object_set_new(c, "layer_types", lt);
    json_object_set_new(c, "mlp_layer_types", mt);
    json_t *rates = json_object();
    json_object_set_new(rates, "compressed_sparse_attention", json_integer(4));
    json_object_set_new(rates, "heavily_compressed_attention", json_integer(o->hca_ratio));
    json_object_set_new(c, "compress_rates", rates);
    json_object_set_new(c, "hc_mult", json_integer(o->hc));
    json_object_set_new(c, "hc_sinkhorn_iters", json_integer(20));
    json_object_set_new(c, "hc_eps", json_real(1e-6));
    json_object_set_new(c, "swiglu_limit", json_real(10.0));
    json_object_set_new(c, "sliding_window", json_integer(o->window));
    json_object_set_new(c, "o_groups", json_integer(o->o_groups));
    json_object_set_new(c, "o_lora_rank", json_integer(o->o_lora));
    json_object_set_new(c, "index_n_heads", json_integer(o->index_heads));
    json_object_set_new(c, "index_head_dim", json_integer(o->index_dim));
    json_object_set_new(c, "index_topk", json_integer(o->index_topk));
    json_object_set_new(c, "num_nextn_predict_layers", json_integer(o->dsv4_mtp ? 1 : 0));
    json_object_set_new(c, "hidden_act", json_string("silu"));
    json_object_set_new(c, "rms_norm_eps", json_real(1e-6));
    json_object_set_new(c, "initializer_range", json_real(0.02));
    json_object_set_new(c, "tie_word_embeddings", json_boolean(o->tied));
    json_object_set_new(c, "dtype", json_string(torch_dtype(o->dtype)));
    json_object_set_new(c, "transformers_version", json_string("5.17.0"));
    json_object_set_new(c, "use_cache", json_true());
    json_t *qc = make_quant_config(o);
    if (qc) {
        json_object_set_new(c, "quantization_config", qc);
        if (o->expert_set)
            json_object_set_new(c, "expert_dtype",
                                json_string(o->expert == TM_QUANT_MXFP4 ? "fp4" : "fp8"));
    }
    return c;
}

static json_t *make_llama_config(const mk_opts *o) {
    int qwen2 = !strcmp(o->arch, "qwen2"), llama = !strcmp(o->arch, "llama");
    json_t *c = json_object();
    json_t *archs = json_array();
    json_array_append_new(archs, json_string(hf_class(o->arch)));
    json_object_set_new(c, "architectures", archs);
    json_object_set_new(c, "model_type", json_string(o->arch));
    if (!qwen2)
        json_object_set_new(c, "attention_bias", json_false());
    json_object_set_new(c, "attention_dropout", json_real(0.0));
    json_object_set_new(c, "bos_token_id", json_integer(o->bos));
    json_object_set_new(c, "eos_token_id", json_integer(o->eos));
    json_object_set_new(c, "head_dim", json_integer(o->head_dim));
    json_object_set_new(c, "hidden_act", json_string("silu"));
    json_object_set_new(c, "hidden_size", json_integer(o->hidden));
    json_object_set_new(c, "initializer_range", json_real(0.02));
    json_object_set_new(c, "intermediate_size", json_integer(o->ff));
    json_object_set_new(c, "max_position_embeddings", json_integer(o->ctx));
    if (qwen2)
        json_object_set_new(c, "max_window_layers", json_integer(o->layers));
    if (llama) {
        json_object_set_new(c, "mlp_bias", json_false());
        json_object_set_new(c, "pretraining_tp", json_integer(1));
    }
    json_object_set_new(c, "num_attention_heads", json_integer(o->heads));
    json_object_set_new(c, "num_hidden_layers", json_integer(o->layers));
    json_object_set_new(c, "num_key_value_heads", json_integer(o->kv_heads));
    json_object_set_new(c, "rms_norm_eps", json_real(qwen2 ? 1e-6 : 1e-5));
    if (o->rope_llama3) {
        json_t *rs = json_object();
        json_object_set_new(rs, "factor", json_real(8.0));
        json_object_set_new(rs, "high_freq_factor", json_real(4.0));
        json_object_set_new(rs, "low_freq_factor", json_real(1.0));
        long orig = o->ctx / 8 > 0 ? o->ctx / 8 : 1;
        json_object_set_new(rs, "original_max_position_embeddings", json_integer(orig));
        json_object_set_new(rs, "rope_type", json_string("llama3"));
        json_object_set_new(c, "rope_scaling", rs);
    } else {
        json_object_set_new(c, "rope_scaling", json_null());
    }
    json_object_set_new(c, "rope_theta", json_real(o->rope_theta));
    if (!llama)
        json_object_set_new(c, "sliding_window", json_null());
    json_object_set_new(c, "tie_word_embeddings", json_boolean(o->tied));
    json_object_set_new(c, "torch_dtype", json_string(torch_dtype(o->dtype)));
    json_object_set_new(c, "dtype", json_string(torch_dtype(o->dtype)));
    json_object_set_new(c, "transformers_version", json_string("4.57.0"));
    json_object_set_new(c, "use_cache", json_true());
    if (qwen2)
        json_object_set_new(c, "use_sliding_window", json_false());
    json_object_set_new(c, "vocab_size", json_integer(o->vocab));
    json_t *qc = make_quant_config(o);
    if (qc)
        json_object_set_new(c, "quantization_config", qc);
    return c;
}

static json_t *make_gen_config(const mk_opts *o) {
    json_t *g = json_object();
    json_object_set_new(g, "_from_model_config", json_true());
    json_object_set_new(g, "bos_token_id", json_integer(o->bos));
    json_object_set_new(g, "eos_token_id", json_integer(o->eos));
    json_object_set_new(g, "transformers_version", json_string("4.57.0"));
    return g;
}

/* ---- tensors --------------------------------------------------------------------------------- */

typedef enum mk_init {
    MK_NORMAL,
    MK_NORM_W, /* 1 + N(0, std) */
    MK_HASH,   /* [vocab][k] distinct expert ids < std per row, stored as f32 */
} mk_init;

typedef struct mk_tensor {
    char name[128];
    uint32_t n_dim;
    uint64_t shape[3];
    mk_init init;
    double std;
    tm_dtype dtype;
    void *data; /* owned; tm_malloc (borrowed when `borrowed`: the dequantized copy's list) */
    int borrowed;
    /* a quantized weight: its scheme, the scale tensor's index in the list, the logical last dim
     * (packed FP4 stores half of it) */
    tm_quant quant;
    uint32_t qblock[2];
    long scale_at;       /* -1: none; -2: this tensor is a scale (or input_scale) itself */
    char seed_name[128]; /* non-empty: values drawn as for the tensor of this name (a copy) */
    uint64_t cols;
} mk_tensor;

static uint64_t mk_n_elem(const mk_tensor *t) {
    uint64_t n = 1;
    for (uint32_t d = 0; d < t->n_dim; d++)
        n *= t->shape[d];
    return n;
}

static void add3(mk_tensor *t, size_t *n, const char *name, uint32_t n_dim, uint64_t d0,
                 uint64_t d1, uint64_t d2, mk_init init, double std) {
    mk_tensor *x = &t[(*n)++];
    snprintf(x->name, sizeof(x->name), "%s", name);
    x->n_dim = n_dim;
    x->shape[0] = d0;
    x->shape[1] = d1;
    x->shape[2] = d2;
    x->init = init;
    x->std = std;
    x->dtype = TM_DTYPE_BF16; /* set from --dtype in main unless MK_HASH */
    x->data = NULL;
    x->borrowed = 0;
    x->quant = TM_QUANT_NONE;
    x->scale_at = -1;
    x->seed_name[0] = '\0';
}

static void add(mk_tensor *t, size_t *n, const char *name, uint32_t n_dim, uint64_t d0, uint64_t d1,
                mk_init init, double std) {
    add3(t, n, name, n_dim, d0, d1, 0, init, std);
}

/* DeepseekV4ForCausalLM weights, transformers names. */
static size_t list_dsv4_tensors(const mk_opts *o, mk_tensor *t) {
    size_t n = 0;
    const uint64_t e = (uint64_t)o->hidden, hd = (uint64_t)o->head_dim, H = (uint64_t)o->heads,
                   v = (uint64_t)o->vocab, N = (uint64_t)o->hc, mix = (2 + N) * N,
                   E = (uint64_t)o->experts, I = (uint64_t)o->ff, qr = (uint64_t)o->q_lora,
                   og = (uint64_t)o->o_groups, orank = (uint64_t)o->o_lora,
                   di = (uint64_t)o->index_dim, hi = (uint64_t)o->index_heads;
    const double se = 1.0 / sqrt((double)e);
    add(t, &n, "model.embed_tokens.weight", 2, v, e, MK_NORMAL, fmin(0.5, 2.0 / sqrt((double)e)));
    add(t, &n, "model.norm.weight", 1, e, 0, MK_NORM_W, 0.1);
    add(t, &n, "model.hc_head.hc_fn", 2, N, N * e, MK_NORMAL, 1.0 / sqrt((double)(N * e)));
    add(t, &n, "model.hc_head.hc_base", 1, N, 0, MK_NORMAL, 0.5);
    add(t, &n, "model.hc_head.hc_scale", 1, 1, 0, MK_NORM_W, 0.1);
    if (!o->tied)
        add(t, &n, "lm_head.weight", 2, v, e, MK_NORMAL, 2.0 / sqrt((double)e));
    for (long il = 0; il < o->layers + (o->dsv4_mtp != NULL); il++) {
        char nm[128];
        const int mtp = il == o->layers; // the MTP layer: its block, then its own tensors
        const char at = mtp ? o->dsv4_mtp[0] : o->dsv4_layers[il];
        const int hash = (mtp ? o->dsv4_mtp[1] : o->dsv4_mlp[il]) == 'h';
        const size_t n0 = n;
#define L(suffix) (snprintf(nm, sizeof(nm), "model.layers.%ld.%s", il, suffix), nm)
        const char *hcs[2] = {"attn_hc", "ffn_hc"};
        for (int k = 0; k < 2; k++) {
            char sfx[64];
            snprintf(sfx, sizeof(sfx), "%s.fn", hcs[k]);
            add(t, &n, L(sfx), 2, mix, N * e, MK_NORMAL, 1.0 / sqrt((double)(N * e)));
            snprintf(sfx, sizeof(sfx), "%s.base", hcs[k]);
            add(t, &n, L(sfx), 1, mix, 0, MK_NORMAL, 0.5);
            snprintf(sfx, sizeof(sfx), "%s.scale", hcs[k]);
            add(t, &n, L(sfx), 1, 3, 0, MK_NORM_W, 0.1);
        }
        add(t, &n, L("input_layernorm.weight"), 1, e, 0, MK_NORM_W, 0.1);
        add(t, &n, L("post_attention_layernorm.weight"), 1, e, 0, MK_NORM_W, 0.1);
        add(t, &n, L("self_attn.q_a_proj.weight"), 2, qr, e, MK_NORMAL, se);
        add(t, &n, L("self_attn.q_a_norm.weight"), 1, qr, 0, MK_NORM_W, 0.1);
        add(t, &n, L("self_attn.q_b_proj.weight"), 2, H * hd, qr, MK_NORMAL,
            1.0 / sqrt((double)qr));
        add(t, &n, L("self_attn.kv_proj.weight"), 2, hd, e, MK_NORMAL, se);
        add(t, &n, L("self_attn.kv_norm.weight"), 1, hd, 0, MK_NORM_W, 0.1);
        add(t, &n, L("self_attn.o_a_proj.weight"), 2, og * orank, H * hd / og, MK_NORMAL,
            1.0 / sqrt((double)(H * hd / og)));
        add(t, &n, L("self_attn.o_b_proj.weight"), 2, e, og * orank, MK_NORMAL,
            1.0 / sqrt((double)(og * orank)));
        add(t, &n, L("self_attn.sinks"), 1, H, 0, MK_NORMAL, 0.5);
        if (at != 's') {
            const uint64_t cw = at == 'c' ? 2 * hd : hd,
                           ratio = at == 'c' ? 4 : (uint64_t)o->hca_ratio;
            add(t, &n, L("self_attn.compressor.kv_proj.weight"), 2, cw, e, MK_NORMAL, se);
            add(t, &n, L("self_attn.compressor.gate_proj.weight"), 2, cw, e, MK_NORMAL, se);
            add(t, &n, L("self_attn.compressor.position_bias"), 2, ratio, cw, MK_NORMAL, 0.5);
            add(t, &n, L("self_attn.compressor.kv_norm.weight"), 1, hd, 0, MK_NORM_W, 0.1);
        }
        if (at == 'c') {
            add(t, &n, L("self_attn.compressor.indexer.kv_proj.weight"), 2, 2 * di, e, MK_NORMAL,
                se);
            add(t, &n, L("self_attn.compressor.indexer.gate_proj.weight"), 2, 2 * di, e, MK_NORMAL,
                se);
            add(t, &n, L("self_attn.compressor.indexer.position_bias"), 2, 4, 2 * di, MK_NORMAL,
                0.5);
            add(t, &n, L("self_attn.compressor.indexer.kv_norm.weight"), 1, di, 0, MK_NORM_W, 0.1);
            add(t, &n, L("self_attn.compressor.indexer.q_b_proj.weight"), 2, hi * di, qr, MK_NORMAL,
                1.0 / sqrt((double)qr));
            add(t, &n, L("self_attn.compressor.indexer.scorer.weights_proj.weight"), 2, hi, e,
                MK_NORMAL, se);
        }
        add(t, &n, L("mlp.gate.weight"), 2, E, e, MK_NORMAL, se);
        if (hash)
            add(t, &n, L("mlp.gate.tid2eid"), 2, v, (uint64_t)o->experts_used, MK_HASH, (double)E);
        else
            add(t, &n, L("mlp.gate.e_score_correction_bias"), 1, E, 0, MK_NORMAL, 0.1);
        add3(t, &n, L("mlp.experts.gate_up_proj"), 3, E, 2 * I, e, MK_NORMAL, se);
        add3(t, &n, L("mlp.experts.down_proj"), 3, E, e, I, MK_NORMAL, 1.0 / sqrt((double)I));
        add(t, &n, L("mlp.shared_experts.gate_proj.weight"), 2, I, e, MK_NORMAL, se);
        add(t, &n, L("mlp.shared_experts.up_proj.weight"), 2, I, e, MK_NORMAL, se);
        add(t, &n, L("mlp.shared_experts.down_proj.weight"), 2, e, I, MK_NORMAL,
            1.0 / sqrt((double)I));
        if (mtp) {
            // --dsv4-mtp-copy: the block takes layer L's values, the head the model's own
            for (size_t i = n0; o->mtp_copy >= 0 && i < n; i++)
                snprintf(t[i].seed_name, sizeof(t[i].seed_name), "model.layers.%ld.%s", o->mtp_copy,
                         t[i].name + strlen(L("")));
            static const char *const head_src[4] = {"model.norm.weight", "model.hc_head.hc_fn",
                                                    "model.hc_head.hc_base",
                                                    "model.hc_head.hc_scale"};
            add(t, &n, L("enorm.weight"), 1, e, 0, MK_NORM_W, 0.1);
            add(t, &n, L("hnorm.weight"), 1, e, 0, MK_NORM_W, 0.1);
            add(t, &n, L("e_proj.weight"), 2, e, e, MK_NORMAL, se);
            add(t, &n, L("h_proj.weight"), 2, e, e, MK_NORMAL, se);
            add(t, &n, L("norm.weight"), 1, e, 0, MK_NORM_W, 0.1);
            add(t, &n, L("hc_head_fn"), 2, N, N * e, MK_NORMAL, 1.0 / sqrt((double)(N * e)));
            add(t, &n, L("hc_head_base"), 1, N, 0, MK_NORMAL, 0.5);
            add(t, &n, L("hc_head_scale"), 1, 1, 0, MK_NORM_W, 0.1);
            for (int k = 0; o->mtp_copy >= 0 && k < 4; k++)
                snprintf(t[n - 4 + k].seed_name, sizeof(t[n - 4 + k].seed_name), "%s", head_src[k]);
        }
#undef L
    }
    return n;
}

static size_t list_llama_tensors(const mk_opts *o, mk_tensor *t) {
    size_t n = 0;
    const uint64_t e = (uint64_t)o->hidden, q = (uint64_t)o->heads * (uint64_t)o->head_dim,
                   kv = (uint64_t)o->kv_heads * (uint64_t)o->head_dim, ff = (uint64_t)o->ff,
                   v = (uint64_t)o->vocab;
    double s_embd = fmin(0.5, 2.0 / sqrt((double)e));
    add(t, &n, "model.embed_tokens.weight", 2, v, e, MK_NORMAL, s_embd);
    add(t, &n, "model.norm.weight", 1, e, 0, MK_NORM_W, 0.1);
    if (!o->tied)
        add(t, &n, "lm_head.weight", 2, v, e, MK_NORMAL, 2.0 / sqrt((double)e));
    for (long il = 0; il < o->layers; il++) {
        char nm[96];
#define L(suffix) (snprintf(nm, sizeof(nm), "model.layers.%ld.%s", il, suffix), nm)
        add(t, &n, L("input_layernorm.weight"), 1, e, 0, MK_NORM_W, 0.1);
        add(t, &n, L("self_attn.q_proj.weight"), 2, q, e, MK_NORMAL, 1.0 / sqrt((double)e));
        add(t, &n, L("self_attn.k_proj.weight"), 2, kv, e, MK_NORMAL, 1.0 / sqrt((double)e));
        add(t, &n, L("self_attn.v_proj.weight"), 2, kv, e, MK_NORMAL, 1.0 / sqrt((double)e));
        add(t, &n, L("self_attn.o_proj.weight"), 2, e, q, MK_NORMAL, 1.0 / sqrt((double)q));
        if (!strcmp(o->arch, "qwen2")) {
            add(t, &n, L("self_attn.q_proj.bias"), 1, q, 0, MK_NORMAL, 0.1);
            add(t, &n, L("self_attn.k_proj.bias"), 1, kv, 0, MK_NORMAL, 0.1);
            add(t, &n, L("self_attn.v_proj.bias"), 1, kv, 0, MK_NORMAL, 0.1);
        }
        add(t, &n, L("post_attention_layernorm.weight"), 1, e, 0, MK_NORM_W, 0.1);
        add(t, &n, L("mlp.gate_proj.weight"), 2, ff, e, MK_NORMAL, 1.0 / sqrt((double)e));
        add(t, &n, L("mlp.up_proj.weight"), 2, ff, e, MK_NORMAL, 1.0 / sqrt((double)e));
        add(t, &n, L("mlp.down_proj.weight"), 2, e, ff, MK_NORMAL, 1.0 / sqrt((double)ff));
#undef L
    }
    return n;
}

static tm_rc fill_tensor(const mk_opts *o, mk_tensor *t, tm_err *err) {
    uint64_t n = mk_n_elem(t);
    t->dtype = t->init == MK_HASH ? TM_DTYPE_F32 : o->dtype;
    size_t es = tm_dtype_size(t->dtype);
    t->data = tm_malloc((size_t)(n * es));
    if (!t->data)
        return TM_ERR(err, TM_E_NOMEM, "%s: %llu elements", t->name, (unsigned long long)n);
    mk_rng r;
    rng_seed(&r, o->seed, t->seed_name[0] ? t->seed_name : t->name);
    if (t->init == MK_HASH) {
        // Each row: k distinct expert ids (a partial Fisher-Yates shuffle of 0..E-1).
        uint32_t n_e = (uint32_t)t->std, k = (uint32_t)t->shape[1], perm[4096];
        for (uint64_t row = 0; row < t->shape[0]; row++) {
            for (uint32_t j = 0; j < n_e; j++)
                perm[j] = j;
            for (uint32_t j = 0; j < k; j++) {
                uint32_t pick = j + (uint32_t)(rng_next(&r) % (n_e - j));
                uint32_t tmp = perm[j];
                perm[j] = perm[pick];
                perm[pick] = tmp;
                float f = (float)perm[j];
                memcpy((char *)t->data + 4 * (row * k + j), &f, 4);
            }
        }
        return TM_OK;
    }
    for (uint64_t i = 0; i < n; i++) {
        // uniform on [-sqrt(3), sqrt(3)) has std 1, like the normal (Box-Muller is the slow part
        // of writing an 8B checkpoint)
        double z = (o->uniform ? ((rng_next(&r) >> 11) * 0x1.0p-52 - 1.0) * 1.7320508075688772
                               : rng_normal(&r)) *
                   t->std;
        float f = (float)(t->init == MK_NORM_W ? 1.0 + z : z);
        if (t->dtype == TM_DTYPE_F32) {
            memcpy((char *)t->data + 4 * i, &f, 4);
        } else {
            uint16_t h = t->dtype == TM_DTYPE_BF16 ? tm_f32_to_bf16(f) : tm_f32_to_f16(f);
            memcpy((char *)t->data + 2 * i, &h, 2);
        }
    }
    return TM_OK;
}

/* fill_tensor over a list, shared by threads (next: the next tensor to take). */
typedef struct fill_job {
    const mk_opts *o;
    mk_tensor *t;
    size_t n;
    tm_rc *rc; /* [n] */
    atomic_size_t next;
} fill_job;

static void *fill_worker(void *arg) {
    fill_job *j = arg;
    for (size_t i; (i = atomic_fetch_add(&j->next, 1)) < j->n;) {
        tm_err e = {0};
        j->rc[i] = fill_tensor(j->o, &j->t[i], &e);
    }
    return NULL;
}

/* ---- quantization (docs/quantization.md) ---------------------------------------------------- */

static int ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && !strcmp(s + n - k, suf);
}

/* The scheme tensor `name` gets under o's options: NONE for norms, embeddings, lm_head, routers,
 * hyper-connections, and (deepseek_v4) the compressor and indexer. */
static tm_quant llama_quant_scheme(const mk_opts *o, const char *name) {
    if (o->quant == TM_QUANT_NONE || strncmp(name, "model.layers.", 13))
        return TM_QUANT_NONE;
    static const char *const lin[] = {"q_proj.weight",   "k_proj.weight",    "v_proj.weight",
                                      "o_proj.weight",   "gate_proj.weight", "up_proj.weight",
                                      "down_proj.weight"};
    for (size_t i = 0; i < sizeof(lin) / sizeof(lin[0]); i++)
        if (ends_with(name, lin[i]))
            return o->quant;
    return TM_QUANT_NONE;
}

static tm_quant dsv4_quant_scheme(const mk_opts *o, const char *name) {
    if (o->quant == TM_QUANT_NONE || strncmp(name, "model.layers.", 13))
        return TM_QUANT_NONE;
    if (ends_with(name, "mlp.experts.gate_up_proj") || ends_with(name, "mlp.experts.down_proj"))
        return o->expert;
    static const char *const dense[] = {"self_attn.q_a_proj.weight",
                                        "self_attn.q_b_proj.weight",
                                        "self_attn.kv_proj.weight",
                                        "self_attn.o_a_proj.weight",
                                        "self_attn.o_b_proj.weight",
                                        "mlp.shared_experts.gate_proj.weight",
                                        "mlp.shared_experts.up_proj.weight",
                                        "mlp.shared_experts.down_proj.weight",
                                        ".e_proj.weight",
                                        ".h_proj.weight"};
    for (size_t i = 0; i < sizeof(dense) / sizeof(dense[0]); i++)
        if (ends_with(name, dense[i]) && !strstr(name, "compressor"))
            return o->quant;
    return TM_QUANT_NONE;
}

/* One architecture mkmodel writes (mk_archs, at the end of the architectures' functions): its
 * config.json, its tensors, which of them --quant quantizes. A new architecture is those three
 * functions and one line in mk_archs; its architectures[0] comes from the loader's table
 * (runner/model/arch.h). */
typedef struct mk_arch {
    const char *name; /* --arch, model_type */
    int dsv4_opts;    /* 1: takes the DeepSeek-V4 options (--dsv4-*, --q-lora, experts, ...) */
    json_t *(*config)(const mk_opts *o);
    size_t (*tensors)(const mk_opts *o, mk_tensor *t);
    tm_quant (*quant_scheme)(const mk_opts *o, const char *name);
} mk_arch;

static const mk_arch mk_archs[] = {
    {"llama", 0, make_llama_config, list_llama_tensors, llama_quant_scheme},
    {"qwen2", 0, make_llama_config, list_llama_tensors, llama_quant_scheme},
    {"mistral", 0, make_llama_config, list_llama_tensors, llama_quant_scheme},
    {"deepseek_v4", 1, make_dsv4_config, list_dsv4_tensors, dsv4_quant_scheme},
};

static int is_dsv4(const mk_opts *o) { return o->a->dsv4_opts; }

static const mk_arch *find_arch(const char *name) {
    for (size_t i = 0; i < sizeof(mk_archs) / sizeof(mk_archs[0]); i++)
        if (!strcmp(name, mk_archs[i].name))
            return &mk_archs[i];
    return NULL;
}

/* Threads for the independent parts of writing a model (one per online CPU, at most 16). */
static unsigned mk_threads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1u : n > 16 ? 16u : (unsigned)n;
}

typedef struct run_arg {
    void *(*fn)(void *);
    void *job;
} run_arg;

/* fn(job) on n threads (n == 1 or thread creation failing: on this one). */
static void run_threads(unsigned n, void *(*fn)(void *), void *job) {
    pthread_t th[16];
    unsigned k = 0;
    for (; n > 1 && k < n - 1 && k < 16; k++)
        if (pthread_create(&th[k], NULL, fn, job))
            break;
    fn(job);
    for (unsigned i = 0; i < k; i++)
        pthread_join(th[i], NULL);
}

/* quantize_tensor's per-matrix work, shared by its threads (next: the next matrix to take). */
typedef struct quant_job {
    const void *src;
    tm_dtype dtype;
    float *v, *sc;
    uint8_t *q, *sc8;
    uint64_t R, C, B, bo, bi, nbo, nbi;
    float qmax;
    int mx, e8;
    atomic_ullong next;
} quant_job;

static void *quant_worker(void *arg) {
    quant_job *j = arg;
    const uint64_t R = j->R, C = j->C, bo = j->bo, bi = j->bi, nbo = j->nbo, nbi = j->nbi;
    float *v = j->v, *sc = j->sc;
    for (uint64_t b; (b = atomic_fetch_add(&j->next, 1)) < j->B;) {
        tm_dtype_to_f32(j->src, j->dtype, (size_t)(b * R * C), (size_t)(R * C), v + b * R * C);
        for (uint64_t i = b * nbo * nbi; i < (b + 1) * nbo * nbi; i++)
            sc[i] = 0.0f;
        // Element i = (b * R + r) * C + c; nested loops keep 64-bit divisions out of the inner
        // one (an 8B-shape checkpoint quantizes ~7e9 elements).
        for (uint64_t r = 0, i = b * R * C; r < R; r++) { // block absmax
            float *row = &sc[(b * nbo + r / bo) * nbi];
            for (uint64_t c0 = 0; c0 < C; c0 += bi) {
                const uint64_t c1 = c0 + bi < C ? c0 + bi : C;
                float a = row[c0 / bi];
                for (uint64_t c = c0; c < c1; c++, i++)
                    a = fmaxf(a, fabsf(v[i]));
                row[c0 / bi] = a;
            }
        }
        for (uint64_t i = b * nbo * nbi; i < (b + 1) * nbo * nbi; i++) {
            if (j->e8) {
                j->sc8[i] = tm_e8m0_ceil_scale(sc[i], j->qmax);
                sc[i] = tm_e8m0_to_f32(j->sc8[i]);
            } else {
                sc[i] = sc[i] > 0.0f ? sc[i] / j->qmax : 1.0f;
            }
        }
        for (uint64_t r = 0, i = b * R * C; r < R; r++) {
            const float *row = &sc[(b * nbo + r / bo) * nbi];
            for (uint64_t c0 = 0; c0 < C; c0 += bi) {
                const uint64_t c1 = c0 + bi < C ? c0 + bi : C;
                const float s = row[c0 / bi];
                for (uint64_t c = c0; c < c1; c++, i++) {
                    const float x = v[i] / s;
                    if (j->mx)
                        j->q[i / 2] |= (uint8_t)(tm_f32_to_e2m1(x) << (4 * (i % 2)));
                    else
                        j->q[i] = tm_f32_to_e4m3(x);
                }
            }
        }
    }
    return NULL;
}

/* Quantize t (filled with --dtype values) in place under `scheme`: its data become F8_E4M3
 * codes, or packed e2m1 stored as I8 [.., C/2]; the scale tensor is appended as list[*n].
 * Rules: a scale per block from the block's absmax: fp32 amax / 448, or (ue8m0, MXFP4) the
 * least power of two 2^k with 2^k * qmax >= amax (qmax 448 / 6); an all-zero block gets 1.
 * Each value is v / s in fp32, then rounded to nearest even into the element format. */
static tm_rc quantize_tensor(const mk_opts *o, mk_tensor *list, size_t *n, size_t ti,
                             tm_quant scheme, tm_err *err) {
    mk_tensor *t = &list[ti];
    const uint64_t n_el = mk_n_elem(t), R = t->shape[t->n_dim - 2], C = t->shape[t->n_dim - 1];
    const uint64_t B = n_el / (R * C);
    const int mx = scheme == TM_QUANT_MXFP4, e8 = mx || (scheme == TM_QUANT_FP8_BLOCK && o->ue8m0);
    const int ct = scheme == TM_QUANT_FP8_CHANNEL || scheme == TM_QUANT_FP8_TENSOR;
    uint64_t bo, bi;
    if (scheme == TM_QUANT_FP8_BLOCK)
        bo = bi = (uint64_t)o->qblock;
    else if (scheme == TM_QUANT_FP8_CHANNEL)
        bo = 1, bi = C;
    else if (scheme == TM_QUANT_FP8_TENSOR)
        bo = R, bi = C;
    else
        bo = 1, bi = 32;
    if (mx && C % 32)
        return TM_ERR(err, TM_E_INVAL, "%s: MXFP4 needs the input width %llu to divide by 32",
                      t->name, (unsigned long long)C);
    const uint64_t nbo = TM_CEIL_DIV(R, bo), nbi = TM_CEIL_DIV(C, bi), n_sc = B * nbo * nbi;
    float *v = tm_malloc((size_t)n_el * sizeof(float));
    float *sc = tm_malloc((size_t)n_sc * sizeof(float));
    uint8_t *q = tm_malloc((size_t)(mx ? n_el / 2 : n_el));
    uint8_t *sc8 = tm_malloc((size_t)n_sc);
    if (!v || !sc || !q || !sc8) {
        tm_free(v), tm_free(sc), tm_free(q), tm_free(sc8);
        return TM_ERR(err, TM_E_NOMEM, "%s: quantizing %llu elements", t->name,
                      (unsigned long long)n_el);
    }
    const float qmax = mx ? 6.0f : 448.0f;
    if (mx)
        memset(q, 0, (size_t)(n_el / 2));
    // The B matrices (experts) are independent: threads take runs of them (same bytes).
    quant_job job = {.src = t->data,
                     .dtype = t->dtype,
                     .v = v,
                     .sc = sc,
                     .q = q,
                     .sc8 = sc8,
                     .R = R,
                     .C = C,
                     .B = B,
                     .bo = bo,
                     .bi = bi,
                     .nbo = nbo,
                     .nbi = nbi,
                     .qmax = qmax,
                     .mx = mx,
                     .e8 = e8};
    run_threads(B > 1 ? mk_threads() : 1, quant_worker, &job);
    tm_free(v);
    tm_free(t->data);
    t->data = q;
    t->dtype = mx ? TM_DTYPE_I8 : TM_DTYPE_F8_E4M3;
    t->cols = C;
    if (mx)
        t->shape[t->n_dim - 1] = C / 2;
    t->quant = scheme;
    t->qblock[0] = (uint32_t)bo;
    t->qblock[1] = (uint32_t)bi;
    t->scale_at = (long)*n;
    mk_tensor *st = &list[(*n)++];
    memset(st, 0, sizeof(*st));
    // The scale's name is the weight's plus a suffix; both live in list, so build it apart.
    char sname[sizeof(st->name)];
    int len = snprintf(sname, sizeof(sname), "%.*s%s", (int)(sizeof(sname) - 16), t->name,
                       ct ? "_scale" : "_scale_inv");
    TM_ASSERT(len > 0 && (size_t)len < sizeof(sname) && strlen(t->name) < sizeof(sname) - 16);
    memcpy(st->name, sname, (size_t)len + 1);
    st->scale_at = -2; // marks a scale
    if (scheme == TM_QUANT_FP8_TENSOR) {
        st->n_dim = 0;
    } else if (t->n_dim == 3) {
        st->n_dim = 3;
        st->shape[0] = B, st->shape[1] = nbo, st->shape[2] = nbi;
    } else {
        st->n_dim = 2;
        st->shape[0] = nbo, st->shape[1] = nbi;
    }
    if (e8) {
        st->dtype = TM_DTYPE_F8_E8M0;
        st->data = sc8;
        tm_free(sc);
    } else {
        st->dtype = TM_DTYPE_F32;
        st->data = sc;
        tm_free(sc8);
    }
    if (ct && o->ct_static) { // static activations: a scalar input_scale beside the weight
        mk_tensor *is = &list[(*n)++];
        memset(is, 0, sizeof(*is));
        char iname[sizeof(is->name)];
        TM_ASSERT(strlen(t->name) > 6 && strlen(t->name) < sizeof(iname) - 16);
        snprintf(iname, sizeof(iname), "%.*sinput_scale", (int)(strlen(t->name) - 6), t->name);
        memcpy(is->name, iname, sizeof(iname));
        is->scale_at = -2;
        is->n_dim = 0;
        is->dtype = TM_DTYPE_F32;
        float one32 = 1.0f / 32.0f;
        is->data = tm_malloc(4);
        if (!is->data)
            return TM_ERR(err, TM_E_NOMEM, "%s", is->name);
        memcpy(is->data, &one32, 4);
    }
    return TM_OK;
}

/* The dequantized copy of list[0..n): each quantized weight replaced by f32 values read through
 * tm_tensor_row_f32, its scale (and input_scale) dropped, every other tensor borrowed as is.
 * *out (n_out entries) owns only the f32 buffers. */
static tm_rc dequant_list(const mk_tensor *list, size_t n, mk_tensor **out, size_t *n_out,
                          tm_err *err) {
    mk_tensor *c = tm_calloc(n ? n : 1, sizeof(*c));
    if (!c)
        return TM_ERR(err, TM_E_NOMEM, "dequantized tensor list");
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const mk_tensor *t = &list[i];
        if (t->scale_at == -2) // a scale: the copy has none
            continue;
        mk_tensor *d = &c[k++];
        *d = *t;
        d->borrowed = 1;
        if (t->quant == TM_QUANT_NONE)
            continue;
        const mk_tensor *st = &list[t->scale_at];
        tm_tensor view = {.data = t->data,
                          .dtype = t->quant == TM_QUANT_MXFP4 ? TM_DTYPE_F4_E2M1 : TM_DTYPE_F8_E4M3,
                          .n_dim = t->n_dim,
                          .scale = st->data,
                          .quant = (uint8_t)t->quant,
                          .scale_dtype = (uint8_t)st->dtype,
                          .qblock = {t->qblock[0], t->qblock[1]}};
        for (uint32_t dd = 0; dd < t->n_dim; dd++)
            view.shape[dd] = t->shape[dd];
        view.shape[t->n_dim - 1] = t->cols;
        d->shape[t->n_dim - 1] = t->cols;
        const uint64_t n_el = tm_tensor_n_elem(&view), rows = n_el / t->cols;
        float *f = tm_malloc((size_t)n_el * sizeof(float));
        if (!f) {
            *out = c, *n_out = k;
            return TM_ERR(err, TM_E_NOMEM, "%s: dequantized copy", t->name);
        }
        for (uint64_t r = 0; r < rows; r++)
            tm_tensor_row_f32(&view, (size_t)r, f + r * t->cols);
        d->data = f;
        d->dtype = TM_DTYPE_F32;
        d->borrowed = 0;
        d->quant = TM_QUANT_NONE;
        d->scale_at = -1;
    }
    *out = c;
    *n_out = k;
    return TM_OK;
}

static int cmp_mk_name(const void *a, const void *b) {
    return strcmp(((const mk_tensor *)a)->name, ((const mk_tensor *)b)->name);
}

static tm_rc write_weights(const mk_opts *o, mk_tensor *t, size_t n, tm_err *err) {
    static const char *const meta[] = {"format", "pt"};
    tm_rc rc = TM_OK;
    tm_st_wtensor *w = tm_calloc(n, sizeof(*w));
    if (!w)
        return TM_ERR(err, TM_E_NOMEM, "tensor list");
    qsort(t, n, sizeof(*t), cmp_mk_name);
    long n_shard = o->shards;
    json_t *index = NULL, *wmap = NULL;
    if (n_shard > 1) {
        index = json_object();
        json_t *md = json_object();
        uint64_t total = 0;
        for (size_t i = 0; i < n; i++)
            total += mk_n_elem(&t[i]) * tm_dtype_size(t[i].dtype);
        json_object_set_new(md, "total_size", json_integer((json_int_t)total));
        json_object_set_new(index, "metadata", md);
        wmap = json_object();
        json_object_set_new(index, "weight_map", wmap); // index owns wmap; borrowed below
    }
    // Contiguous runs of the name-sorted list go to each shard, as transformers does.
    for (long s = 0; s < n_shard && rc == TM_OK; s++) {
        size_t lo = n * (size_t)s / (size_t)n_shard, hi = n * (size_t)(s + 1) / (size_t)n_shard;
        char file[128], path[4200];
        if (n_shard > 1)
            snprintf(file, sizeof(file), "model-%05ld-of-%05ld.safetensors", s + 1, n_shard);
        else
            snprintf(file, sizeof(file), "model.safetensors");
        snprintf(path, sizeof(path), "%s/%s", o->out, file);
        for (size_t i = lo; i < hi; i++) {
            w[i - lo] = (tm_st_wtensor){
                .name = t[i].name, .dtype = t[i].dtype, .n_dim = t[i].n_dim, .data = t[i].data};
            for (uint32_t d = 0; d < t[i].n_dim; d++)
                w[i - lo].shape[d] = t[i].shape[d];
            if (wmap)
                json_object_set_new(wmap, t[i].name, json_string(file));
        }
        rc = tm_st_file_write(path, w, hi - lo, meta, 1, err);
    }
    if (rc == TM_OK && index)
        rc = write_json(o->out, "model.safetensors.index.json", index, 10, err);
    json_decref(index);
    tm_free(w);
    return rc;
}

/* ---- main ------------------------------------------------------------------------------------ */

int mkmodel_parse_long(const char *s, long lo, long hi, long *out) {
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || !end || *end || end == s || v < lo || v > hi)
        return 0;
    *out = v;
    return 1;
}

static int parse_args(int argc, char **argv, mk_opts *o) {
    *o = (mk_opts){.arch = "llama",
                   .a = &mk_archs[0],
                   .seed = 1,
                   .layers = 2,
                   .hidden = 64,
                   .heads = 4,
                   .kv_heads = -1,
                   .head_dim = -1,
                   .ff = 128,
                   .vocab = -1,
                   .ctx = 512,
                   .tied = 0,
                   .shards = 1,
                   .bos = -1,
                   .eos = -1,
                   .dtype = TM_DTYPE_BF16,
                   .rope_theta = 10000.0,
                   .dsv4_layers = "sc",
                   .dsv4_mlp = "hm",
                   .mtp_copy = -1,
                   .q_lora = 32,
                   .o_groups = 2,
                   .o_lora = 16,
                   .experts = 4,
                   .experts_used = 2,
                   .window = 128,
                   .index_heads = 4,
                   .index_dim = 16,
                   .index_topk = 512,
                   .hc = 4,
                   .rope_dim = 8,
                   .hca_ratio = 128,
                   .yarn = 1,
                   .qblock = 128};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help"))
            return 0;
        if (i + 1 >= argc) {
            fprintf(stderr, "mkmodel: %s needs a value\n", a);
            return 0;
        }
        const char *v = argv[++i];
        int ok = 1;
        if (!strcmp(a, "--out"))
            o->out = v;
        else if (!strcmp(a, "--arch")) {
            o->arch = v;
            o->a = find_arch(v);
            ok = o->a != NULL;
        } else if (!strcmp(a, "--seed")) {
            char *end = NULL;
            errno = 0;
            o->seed = strtoull(v, &end, 10);
            ok = !errno && end && !*end && end != v;
        } else if (!strcmp(a, "--layers"))
            ok = mkmodel_parse_long(v, 1, 4096, &o->layers);
        else if (!strcmp(a, "--hidden"))
            ok = mkmodel_parse_long(v, 2, 65536, &o->hidden);
        else if (!strcmp(a, "--heads"))
            ok = mkmodel_parse_long(v, 1, 1024, &o->heads);
        else if (!strcmp(a, "--kv-heads"))
            ok = mkmodel_parse_long(v, 1, 1024, &o->kv_heads);
        else if (!strcmp(a, "--head-dim"))
            ok = mkmodel_parse_long(v, 2, 1024, &o->head_dim);
        else if (!strcmp(a, "--ff"))
            ok = mkmodel_parse_long(v, 1, 1 << 20, &o->ff);
        else if (!strcmp(a, "--vocab"))
            ok = mkmodel_parse_long(v, 1, 1 << 24, &o->vocab);
        else if (!strcmp(a, "--ctx"))
            ok = mkmodel_parse_long(v, 1, 1 << 24, &o->ctx);
        else if (!strcmp(a, "--tied"))
            ok = mkmodel_parse_long(v, 0, 1, &o->tied);
        else if (!strcmp(a, "--shards"))
            ok = mkmodel_parse_long(v, 1, 999, &o->shards);
        else if (!strcmp(a, "--uniform"))
            ok = mkmodel_parse_long(v, 0, 1, &o->uniform);
        else if (!strcmp(a, "--bos"))
            ok = mkmodel_parse_long(v, 0, (1 << 24) - 1, &o->bos);
        else if (!strcmp(a, "--eos"))
            ok = mkmodel_parse_long(v, 0, (1 << 24) - 1, &o->eos);
        else if (!strcmp(a, "--dtype")) {
            if (!strcmp(v, "f32"))
                o->dtype = TM_DTYPE_F32;
            else if (!strcmp(v, "bf16"))
                o->dtype = TM_DTYPE_BF16;
            else if (!strcmp(v, "f16"))
                o->dtype = TM_DTYPE_F16;
            else
                ok = 0;
        } else if (!strcmp(a, "--rope-theta")) {
            char *end = NULL;
            o->rope_theta = strtod(v, &end);
            ok = end && !*end && end != v && o->rope_theta > 0 && isfinite(o->rope_theta);
        } else if (!strcmp(a, "--rope-scaling")) {
            ok = !strcmp(v, "llama3") || !strcmp(v, "none");
            o->rope_llama3 = !strcmp(v, "llama3");
        } else if (!strcmp(a, "--tokenizer"))
            o->tokenizer = v;
        else if (!strcmp(a, "--dsv4-layers"))
            o->dsv4_layers = v, ok = strspn(v, "sch") == strlen(v);
        else if (!strcmp(a, "--dsv4-mtp"))
            o->dsv4_mtp = v, ok = strlen(v) == 2 && strchr("sch", v[0]) && strchr("hm", v[1]);
        else if (!strcmp(a, "--dsv4-mtp-copy"))
            ok = mkmodel_parse_long(v, 0, 4095, &o->mtp_copy);
        else if (!strcmp(a, "--dsv4-mlp"))
            o->dsv4_mlp = v, ok = strspn(v, "hm") == strlen(v);
        else if (!strcmp(a, "--q-lora"))
            ok = mkmodel_parse_long(v, 1, 65536, &o->q_lora);
        else if (!strcmp(a, "--o-groups"))
            ok = mkmodel_parse_long(v, 1, 1024, &o->o_groups);
        else if (!strcmp(a, "--o-lora"))
            ok = mkmodel_parse_long(v, 1, 65536, &o->o_lora);
        else if (!strcmp(a, "--experts"))
            ok = mkmodel_parse_long(v, 1, 4096, &o->experts);
        else if (!strcmp(a, "--experts-used"))
            ok = mkmodel_parse_long(v, 1, 64, &o->experts_used);
        else if (!strcmp(a, "--window"))
            ok = mkmodel_parse_long(v, 1, 1 << 20, &o->window);
        else if (!strcmp(a, "--index-heads"))
            ok = mkmodel_parse_long(v, 1, 1024, &o->index_heads);
        else if (!strcmp(a, "--index-dim"))
            ok = mkmodel_parse_long(v, 2, 4096, &o->index_dim);
        else if (!strcmp(a, "--index-topk"))
            ok = mkmodel_parse_long(v, 1, 1 << 24, &o->index_topk);
        else if (!strcmp(a, "--hc"))
            ok = mkmodel_parse_long(v, 1, 8, &o->hc);
        else if (!strcmp(a, "--rope-dim"))
            ok = mkmodel_parse_long(v, 2, 1024, &o->rope_dim);
        else if (!strcmp(a, "--hca-ratio"))
            ok = mkmodel_parse_long(v, 1, 65536, &o->hca_ratio);
        else if (!strcmp(a, "--yarn"))
            ok = mkmodel_parse_long(v, 0, 1, &o->yarn);
        else if (!strcmp(a, "--quant")) {
            o->ue8m0 = !strcmp(v, "fp8-block-ue8m0");
            if (!strcmp(v, "none"))
                o->quant = TM_QUANT_NONE;
            else if (!strcmp(v, "fp8-block") || o->ue8m0)
                o->quant = TM_QUANT_FP8_BLOCK;
            else if (!strcmp(v, "fp8-channel"))
                o->quant = TM_QUANT_FP8_CHANNEL;
            else if (!strcmp(v, "fp8-tensor"))
                o->quant = TM_QUANT_FP8_TENSOR;
            else
                ok = 0;
        } else if (!strcmp(a, "--quant-block"))
            ok = mkmodel_parse_long(v, 1, 65536, &o->qblock);
        else if (!strcmp(a, "--expert-dtype")) {
            o->expert_set = 1;
            if (!strcmp(v, "fp4"))
                o->expert = TM_QUANT_MXFP4;
            else if (!strcmp(v, "fp8"))
                o->expert = TM_QUANT_FP8_BLOCK;
            else
                ok = 0;
        } else if (!strcmp(a, "--ct-static"))
            ok = mkmodel_parse_long(v, 0, 1, &o->ct_static);
        else if (!strcmp(a, "--dequant-copy"))
            o->dequant_copy = v;
        else {
            fprintf(stderr, "mkmodel: unknown option %s\n", a);
            return 0;
        }
        if (!ok) {
            fprintf(stderr, "mkmodel: bad value for %s: %s\n", a, v);
            return 0;
        }
    }
    if (!o->out) {
        fprintf(stderr, "mkmodel: --out is required\n");
        return 0;
    }
    if (is_dsv4(o)) {
        o->kv_heads = 1;
        if (o->head_dim < 0)
            o->head_dim = o->hidden / o->heads;
        if ((long)strlen(o->dsv4_layers) != o->layers || (long)strlen(o->dsv4_mlp) != o->layers ||
            o->experts_used > o->experts || (o->heads * o->head_dim) % o->o_groups ||
            o->rope_dim % 2 || o->rope_dim > o->head_dim || o->rope_dim > o->index_dim) {
            fprintf(stderr, "mkmodel: deepseek_v4: --dsv4-layers/--dsv4-mlp need one letter per "
                            "layer; experts-used <= experts; heads*head-dim divisible by "
                            "o-groups; rope-dim even and <= head-dim, index-dim\n");
            return 0;
        }
    }
    if (is_dsv4(o) && o->mtp_copy >= 0 &&
        (!o->dsv4_mtp || o->mtp_copy >= o->layers ||
         o->dsv4_layers[o->mtp_copy] != o->dsv4_mtp[0] ||
         o->dsv4_mlp[o->mtp_copy] != o->dsv4_mtp[1])) {
        fprintf(stderr, "mkmodel: --dsv4-mtp-copy L needs --dsv4-mtp with layer L's letters\n");
        return 0;
    }
    if (is_dsv4(o) && !o->expert_set)
        o->expert = o->quant; // experts stored like the dense linears
    if (is_dsv4(o) && o->quant != TM_QUANT_NONE && o->quant != TM_QUANT_FP8_BLOCK) {
        fprintf(stderr, "mkmodel: deepseek_v4 takes --quant fp8-block or fp8-block-ue8m0\n");
        return 0;
    }
    if (o->expert_set && (!is_dsv4(o) || o->quant != TM_QUANT_FP8_BLOCK)) {
        fprintf(stderr, "mkmodel: --expert-dtype needs --arch deepseek_v4 and --quant fp8-block\n");
        return 0;
    }
    if (o->ct_static && o->quant != TM_QUANT_FP8_CHANNEL && o->quant != TM_QUANT_FP8_TENSOR) {
        fprintf(stderr, "mkmodel: --ct-static needs --quant fp8-channel or fp8-tensor\n");
        return 0;
    }
    if (o->dequant_copy && o->quant == TM_QUANT_NONE) {
        fprintf(stderr, "mkmodel: --dequant-copy needs --quant\n");
        return 0;
    }
    if (o->kv_heads < 0)
        o->kv_heads = o->heads < 2 ? o->heads : (o->heads % 2 ? o->heads : o->heads / 2);
    if (o->head_dim < 0) {
        if (o->hidden % o->heads) {
            fprintf(stderr, "mkmodel: --hidden %ld is not divisible by --heads %ld\n", o->hidden,
                    o->heads);
            return 0;
        }
        o->head_dim = o->hidden / o->heads;
    }
    if (o->heads % o->kv_heads || o->head_dim % 2) {
        fprintf(stderr, "mkmodel: --heads must be a multiple of --kv-heads and --head-dim even\n");
        return 0;
    }
    return 1;
}

int main(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i++) // DeepSeek-V4.1 has its own writer
        if (!strcmp(argv[i], "--arch") && !strcmp(argv[i + 1], "deepseek_v41"))
            return mkmodel_dsv41_main(argc, argv);
    mk_opts o;
    if (!parse_args(argc, argv, &o)) {
        usage();
        return 2;
    }
    tm_err err = {0};
    tm_rc rc = TM_OK;
    mk_tensor *t = NULL, *dq = NULL;
    size_t n = 0, n_dq = 0;
    json_t *cfg = NULL, *gen = NULL;
    if (o.tokenizer) {
        long tv = 0, tb = -1, te = -1;
        rc = read_tokenizer(o.tokenizer, &tv, &tb, &te, &err);
        if (rc)
            goto out;
        if (o.vocab < 0)
            o.vocab = tv;
        if (o.vocab < tv) {
            rc = TM_ERR(&err, TM_E_INVAL, "--vocab %ld is smaller than the tokenizer's %ld",
                        o.vocab, tv);
            goto out;
        }
        if (o.bos < 0)
            o.bos = tb;
        if (o.eos < 0)
            o.eos = te;
    }
    if (o.vocab < 0)
        o.vocab = 256;
    if (o.bos < 0)
        o.bos = o.vocab > 1 ? 1 : 0;
    if (o.eos < 0)
        o.eos = o.vocab > 2 ? 2 : 0;
    if (o.bos >= o.vocab || o.eos >= o.vocab) {
        rc = TM_ERR(&err, TM_E_INVAL, "bos %ld / eos %ld outside the vocabulary (%ld)", o.bos,
                    o.eos, o.vocab);
        goto out;
    }
    rc = mkdir_p(o.out, &err);
    if (rc)
        goto out;
    t = tm_calloc(16 + (size_t)(o.layers + 1) * 48 * 3, sizeof(*t)); // + scales, input scales, MTP
    if (!t) {
        rc = TM_ERR(&err, TM_E_NOMEM, "tensor list");
        goto out;
    }
    n = o.a->tensors(&o, t);
    if ((long)n < o.shards) {
        rc = TM_ERR(&err, TM_E_INVAL, "--shards %ld exceeds the %zu tensors", o.shards, n);
        goto out;
    }
    fill_job fj = {.o = &o, .t = t, .n = n, .rc = tm_calloc(n, sizeof(tm_rc))};
    if (!fj.rc) {
        rc = TM_ERR(&err, TM_E_NOMEM, "tensor list");
        goto out;
    }
    run_threads(mk_threads(), fill_worker, &fj); // each tensor draws from its own generator
    for (size_t i = 0; i < n && rc == TM_OK; i++)
        if (fj.rc[i] != TM_OK)
            rc = TM_ERR(&err, TM_E_NOMEM, "%s: %llu elements", t[i].name,
                        (unsigned long long)mk_n_elem(&t[i]));
    tm_free(fj.rc);
    const size_t n_weight = n;
    for (size_t i = 0; i < n_weight && rc == TM_OK; i++) {
        tm_quant qs = o.a->quant_scheme(&o, t[i].name);
        if (qs != TM_QUANT_NONE)
            rc = quantize_tensor(&o, t, &n, i, qs, &err);
    }
    if (rc == TM_OK && o.dequant_copy)
        rc = dequant_list(t, n, &dq, &n_dq, &err);
    if (rc)
        goto out;
    rc = write_weights(&o, t, n, &err);
    if (rc)
        goto out;
    for (int copy = 0; copy < (o.dequant_copy ? 2 : 1) && rc == TM_OK; copy++) {
        mk_opts oc = o;
        if (copy) {
            oc.out = o.dequant_copy;
            oc.write_plain = 1;
            rc = mkdir_p(oc.out, &err);
            if (rc == TM_OK)
                rc = write_weights(&oc, dq, n_dq, &err);
            if (rc)
                break;
        }
        json_decref(cfg);
        json_decref(gen);
        cfg = oc.a->config(&oc);
        gen = make_gen_config(&oc);
        int digits = 10; // deepseek_v4's partial_rotary_factor may need more to be exact
        if (is_dsv4(&oc))
            rotary_factor(oc.rope_dim, oc.head_dim, &digits);
        rc = write_json(oc.out, "config.json", cfg, digits, &err);
        if (rc == TM_OK)
            rc = write_json(oc.out, "generation_config.json", gen, 10, &err);
        if (rc == TM_OK && o.tokenizer) {
            rc = copy_file(o.tokenizer, oc.out, "tokenizer.json", 0, &err);
            if (rc == TM_OK)
                rc = copy_file(o.tokenizer, oc.out, "tokenizer_config.json", 1, &err);
        }
    }
    if (rc)
        goto out;
    // Self-check: the reader must accept what we wrote.
    tm_model *m = NULL;
    rc = tm_model_load(o.out, &m, &err);
    if (rc == TM_OK) {
        uint64_t n_param = 0;
        for (size_t i = 0; i < n; i++)
            if (t[i].scale_at != -2)
                n_param += t[i].quant != TM_QUANT_NONE
                               ? mk_n_elem(&t[i]) / t[i].shape[t[i].n_dim - 1] * t[i].cols
                               : mk_n_elem(&t[i]);
        printf("mkmodel: wrote %s: %s, %u layers, hidden %u, %u/%u heads x %u, ff %u, vocab %u, "
               "%s, %s, %llu parameters",
               o.out, tm_model_arch_name(m), m->cfg.n_layer, m->cfg.n_embd, m->cfg.n_head,
               m->cfg.n_kv_head, m->cfg.head_dim, m->cfg.n_ff, m->cfg.n_vocab,
               tm_dtype_name(o.dtype), o.tied ? "tied" : "untied", (unsigned long long)n_param);
        if (o.quant != TM_QUANT_NONE)
            printf(", %s%s linears%s%s", tm_quant_name(o.quant), o.ue8m0 ? " (ue8m0)" : "",
                   is_dsv4(&o) ? ", experts " : "", is_dsv4(&o) ? tm_quant_name(o.expert) : "");
        printf("\n");
    }
    tm_model_destroy(m);
    if (rc == TM_OK && o.dequant_copy) {
        rc = tm_model_load(o.dequant_copy, &m, &err);
        tm_model_destroy(m);
        if (rc == TM_OK)
            printf("mkmodel: wrote %s: the dequantized f32 copy\n", o.dequant_copy);
    }
out:
    json_decref(cfg);
    json_decref(gen);
    for (size_t i = 0; i < n; i++)
        tm_free(t[i].data);
    tm_free(t);
    for (size_t i = 0; i < n_dq; i++)
        if (!dq[i].borrowed)
            tm_free(dq[i].data);
    tm_free(dq);
    if (rc) {
        fprintf(stderr, "mkmodel: %s\n", err.msg);
        return 1;
    }
    return 0;
}
