/* bench/bench_engine.c - the CUDA engine on the workloads of ../shared/BENCHMARKS.md (W1, W8, P)
 * with random bf16 weights made on the GPU (tm_engine_cuda_create_random), plus the device-copy
 * bandwidth ceiling measured in the same process and the roofline decode ceiling derived from it.
 *
 * A run: prefill of B random prompts of L tokens in one step (TTFT = that step, first token
 * included), then N - 1 decode steps of B tokens, greedy. Decode tok/s per sequence = (N - 1) /
 * decode time, aggregate = B times that (the anchors' convention). Each workload runs --reps
 * times after one warm-up run; medians are printed. Usage: bench_engine --help.
 *
 * --quant fp8-block|fp8-block-ue8m0|fp8-channel: the layers' linears as random FP8 weights
 * (tm_engine_cuda_create_random_fmt); the bandwidth floor then counts their e4m3 bytes and scales
 * (plus the bf16 LM head and norms), and the weight bytes are printed.
 *
 * --kv-dtype fp8: the KV cache as e4m3 entries (engine.kv_cache_dtype "fp8"); the floor then
 * counts one byte per K/V element. --kv-pool: also size a KV pool from free memory (n_kv_block
 * 0, gpu_memory_utilization 0.9, the context cap lifted) and print its token capacity.
 *
 * --tp N: tensor parallel over N local GPUs, one process per GPU as tokenmill runs it: this
 * process is rank 0 (device 0) and starts ranks 1..N-1 (this binary again, with the hidden
 * --tp-rank/--tp-port options, device = rank), which join through the TCP rendezvous, get the
 * NCCL id and serve rank 0's step plans (runner/engine/cuda/engine_cuda.h
 * tm_engine_cuda_tp_create).
 *
 * --sample-all (issue 22): before the greedy run, the decode loop once per sampling mode
 * (sample_mode_name: greedy on the device, forward_sample with temperature 0.8 / top-p 0.95,
 * top-k 50, a repetition penalty, logprobs top-5, and temperature / top-p sampled on the host),
 * each warm-up + reps in this one process, ms/step printed against greedy's.
 *
 * --verify K (issue 25): after the runs, the mechanism cost of speculative decoding at the first
 * batch size: a plain decode step (1 token per sequence, greedy on the device, graphs as set)
 * against a verification step (K + 1 tokens per sequence, a logits row and a device argmax for
 * each: tm_batch_seq.n_logits), both at position L + N - 1 of every sequence, median of 50 after
 * 5 warm-ups; then the speed-up that a mean acceptance length a (tokens per verification, 1 ..
 * K + 1) gives: a x plain / verify. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "kernels/fill.h"
#include "runner/engine/engine.h"
#include "runner/engine/cuda/engine_cuda.h"
#include "runner/model/model.h"
#include "runner/tp/rendezvous.h"
#include "runner/tp/tp_nccl.h"

#define BLOCK 16
#define TM_SPEC_BENCH_MAX_K 16 /* --verify K at most */
#define TP_MAX 8

/* Public dense shapes (the widths of each model's config.json on the Hugging Face hub). */
typedef struct shape_def {
    const char *name, *alias;
    tm_arch arch;
    uint32_t layers, hidden, ff, heads, kv, head_dim, vocab, tie;
} shape_def;
static const shape_def shapes[] = {
    {"llama3.2-1b", "llama1b", TM_ARCH_LLAMA, 16, 2048, 8192, 32, 8, 64, 128256, 1},
    {"llama3.2-3b", NULL, TM_ARCH_LLAMA, 28, 3072, 8192, 24, 8, 128, 128256, 1},
    {"llama3.1-8b", "llama8b", TM_ARCH_LLAMA, 32, 4096, 14336, 32, 8, 128, 128256, 0},
    {"llama8b-half", NULL, TM_ARCH_LLAMA, 32, 4096, 7168, 16, 4, 128, 64128, 0}, // one TP2 shard
    {"qwen2.5-1.5b", NULL, TM_ARCH_QWEN2, 28, 1536, 8960, 12, 2, 128, 151936, 1},
    {"qwen2.5-3b", NULL, TM_ARCH_QWEN2, 36, 2048, 11008, 16, 2, 128, 151936, 1},
    {"qwen2.5-7b", NULL, TM_ARCH_QWEN2, 28, 3584, 18944, 28, 4, 128, 152064, 0},
    {"qwen2.5-14b", NULL, TM_ARCH_QWEN2, 48, 5120, 13824, 40, 8, 128, 152064, 0},
    {"mistral-7b-v0.3", "mistral7b", TM_ARCH_MISTRAL, 32, 4096, 14336, 32, 8, 128, 32768, 0},
};

static void usage(void) {
    fprintf(
        stderr,
        "usage: bench_engine [--shape NAME | --shape dims:K=V,... | --model DIR]\n"
        "                    [--batch B[,B...]] [--prompt L] [--gen N]\n"
        "                    [--reps R] [--no-graphs] [--logits] [--no-ceiling] [--tp N]\n"
        "                    [--quant bf16|fp8-block|fp8-block-ue8m0|fp8-channel]\n"
        "                    [--kv-dtype bf16|fp8] [--kv-pool] [--sample-all|--sample-device]\n"
        "                    [--verify K]\n"
        "  defaults: llama8b, B 8, L 512, N 256, R 3; greedy on the device (--logits: fp32\n"
        "  logits to the host and argmax there, the plain engine vtable path)\n"
        "  --shape: one of the public shapes below, or dims:layers=,hidden=,ff=,heads=,kv=,\n"
        "    head_dim=,vocab=[,tie=0|1][,bias=0|1] (a Llama-family shape; bias: Qwen2's qkv bias)\n"
        "  --model DIR: the shape of a Hugging Face folder's config.json (weights not read:\n"
        "    random weights of that shape, as for --shape)\n"
        "  --batch 1,8: one engine, each batch size measured in turn (one result line each)\n"
        "  --sample-all: decode ms/step of every device sampling mode vs greedy (first batch)\n"
        "  --sample-device: the same without the host-sampled mode\n"
        "  --shape dsv4-flash | dsv41-flash [--layers N] [--batch 1,8] [--prompt L] [--gen N]:\n"
        "    DeepSeek-V4 / V4.1 at Flash widths, random weights (V4.1: the released V4.1-Flash\n"
        "    config's layers, --layers N the first N, --layer-ids 0,1,2,... chosen ones, default\n"
        "    one of each kind; --mkmodel-args prints mkmodel's options for the same model; Engram\n"
        "    tables written to a temporary folder, --engram-cache-mb M per table, --engram\n"
        "    warm|cold, --graphs 1|0; TM_DSV41_ENGRAM_SKIP=1 skips the row reads:\n"
        "    bench/dsv41_engram_overlap.sh)\n"
        "  shapes:");
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
        fprintf(stderr, " %s", shapes[i].name);
    fprintf(stderr, "\n");
}

static void llama3_rope(tm_model_cfg *c) {
    c->rope_theta = 500000.0f;
    c->rope_type = TM_ROPE_LLAMA3;
    c->rope_factor = 8.0f;
    c->rope_low_freq_factor = 1.0f;
    c->rope_high_freq_factor = 4.0f;
    c->rope_orig_ctx = 8192;
}

/* The named shape (the public configs' widths; rope as the family sets it), or 0 if unknown. */
static int shape_cfg(const char *name, tm_model_cfg *c) {
    memset(c, 0, sizeof(*c));
    const shape_def *s = NULL;
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
        if (!strcmp(name, shapes[i].name) || (shapes[i].alias && !strcmp(name, shapes[i].alias)))
            s = &shapes[i];
    if (!s)
        return 0;
    c->arch = s->arch;
    c->n_layer = s->layers, c->n_embd = s->hidden, c->n_ff = s->ff, c->n_head = s->heads;
    c->n_kv_head = s->kv, c->head_dim = s->head_dim, c->n_vocab = s->vocab;
    c->tie_embd = s->tie, c->qkv_bias = s->arch == TM_ARCH_QWEN2;
    c->rms_eps = s->arch == TM_ARCH_LLAMA ? 1e-5f : 1e-6f;
    c->n_ctx = 32768;
    c->bos_id = -1;
    if (s->arch == TM_ARCH_LLAMA) {
        llama3_rope(c);
        c->n_ctx = 131072;
    } else {
        c->rope_theta = 1000000.0f; // Qwen2.5 and Mistral v0.3
    }
    return 1;
}

/* "dims:layers=32,hidden=4096,..." -> a Llama-architecture shape with Llama-3 rope; 0 on a
 * malformed or incomplete list. */
static int dims_cfg(const char *spec, tm_model_cfg *c) {
    memset(c, 0, sizeof(*c));
    c->arch = TM_ARCH_LLAMA;
    c->rms_eps = 1e-5f;
    c->n_ctx = 131072;
    c->bos_id = -1;
    llama3_rope(c);
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", spec + strlen("dims:"));
    uint32_t tie = 0, bias = 0;
    struct {
        const char *k;
        uint32_t *v;
    } keys[] = {{"layers", &c->n_layer}, {"hidden", &c->n_embd}, {"ff", &c->n_ff},
                {"heads", &c->n_head},   {"kv", &c->n_kv_head},  {"head_dim", &c->head_dim},
                {"vocab", &c->n_vocab},  {"tie", &tie},          {"bias", &bias}};
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(t, '=');
        if (!eq)
            return 0;
        *eq = 0;
        size_t k = 0;
        while (k < sizeof(keys) / sizeof(keys[0]) && strcmp(keys[k].k, t))
            k++;
        char *end = NULL;
        const unsigned long v = strtoul(eq + 1, &end, 10);
        if (k == sizeof(keys) / sizeof(keys[0]) || !*(eq + 1) || *end || v > (1ul << 24))
            return 0;
        *keys[k].v = (uint32_t)v;
    }
    c->tie_embd = tie != 0;
    if (bias)
        c->arch = TM_ARCH_QWEN2, c->qkv_bias = 1;
    return c->n_layer && c->n_embd && c->n_ff && c->n_head && c->n_kv_head && c->head_dim &&
           c->n_vocab && c->n_head % c->n_kv_head == 0 && c->head_dim % 2 == 0;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static double median(double *v, int n) {
    qsort(v, n, sizeof(double), cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Median GPU time (CUDA events on the legacy stream) of op(ctx), in ms, over reps runs after
 * warm runs. */
static double median_ms(void (*op)(void *), void *ctx, int warm, int reps) {
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    double *t = calloc((size_t)reps, sizeof(double));
    for (int i = -warm; i < reps; i++) {
        cudaEventRecord(e0, 0);
        op(ctx);
        cudaEventRecord(e1, 0);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        if (i >= 0)
            t[i] = ms;
    }
    const double m = median(t, reps);
    free(t);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return m;
}

typedef struct copy_op {
    void *dst;
    const void *src;
    size_t n;
} copy_op;

static void run_copy(void *ctx) {
    const copy_op *c = ctx;
    cudaMemcpyAsync(c->dst, c->src, c->n, cudaMemcpyDeviceToDevice, 0);
}

/* Device-to-device copy of 2 x 2 GiB, GB/s counting bytes read + written; median of 20. */
static double copy_bw(void) {
    const size_t n = (size_t)2 << 30;
    void *a = NULL, *b = NULL;
    double res = 0.0;
    if (cudaMalloc(&a, n) == cudaSuccess && cudaMalloc(&b, n) == cudaSuccess) {
        cudaMemset(a, 1, n);
        copy_op c = {.dst = b, .src = a, .n = n};
        res = 2.0 * n / (median_ms(run_copy, &c, 3, 20) * 1e-3) / 1e9;
    }
    cudaFree(a);
    cudaFree(b);
    return res;
}

typedef struct read_op {
    const void *p;
    size_t n;
    float *out;
} read_op;

static void run_read(void *ctx) {
    const read_op *r = ctx;
    tm_err e = {0};
    (void)tm_k_read_stream(r->p, r->n, r->out, 0, &e);
}

/* Read-only stream of 4 GiB (the anchors' x.sum() over 4 GiB of bf16), GB/s of bytes read;
 * median of 20. Reported beside the copy figure; the floors use the copy (BENCHMARKS.md). */
static double read_bw(void) {
    const size_t n = (size_t)4 << 30;
    void *a = NULL;
    float *out = NULL;
    double res = 0.0;
    if (cudaMalloc(&a, n) == cudaSuccess &&
        cudaMalloc((void **)&out, TM_K_READ_BLOCKS * sizeof(float)) == cudaSuccess) {
        cudaMemset(a, 0, n);
        read_op r = {.p = a, .n = n, .out = out};
        res = n / (median_ms(run_read, &r, 3, 20) * 1e-3) / 1e9;
    }
    cudaFree(a);
    cudaFree(out);
    return res;
}

typedef struct gemm_op {
    cublasHandle_t h;
    const void *a, *b;
    void *c;
    int n;
} gemm_op;

static void run_gemm(void *ctx) {
    const gemm_op *g = ctx;
    const float alpha = 1.0f, beta = 0.0f;
    cublasGemmEx(g->h, CUBLAS_OP_N, CUBLAS_OP_N, g->n, g->n, g->n, &alpha, g->a, CUDA_R_16BF, g->n,
                 g->b, CUDA_R_16BF, g->n, &beta, g->c, CUDA_R_16BF, g->n, CUBLAS_COMPUTE_32F,
                 CUBLAS_GEMM_DEFAULT);
}

/* bf16 GEMM ceiling as the anchors measure it (ceilings.py): 8192^3, bf16 in and out, fp32
 * accumulation, random data, median of 30 after 5 warm-ups; TFLOP/s (0 on failure). */
static double gemm_tflops(void) {
    const int n = 8192;
    const size_t bytes = (size_t)n * n * 2;
    void *a = NULL, *b = NULL, *c = NULL;
    cublasHandle_t h = NULL;
    double res = 0.0;
    tm_err err = {0};
    if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess ||
        cudaMalloc(&c, bytes) != cudaSuccess || cublasCreate(&h) != CUBLAS_STATUS_SUCCESS)
        goto done;
    tm_k_fill_bf16_args fa = {.p = a, .n = (size_t)n * n, .seed = 1, .scale = 1.0f};
    tm_k_fill_bf16_args fb = {.p = b, .n = (size_t)n * n, .seed = 2, .scale = 1.0f};
    if (tm_k_fill_bf16(&fa, 0, &err) || tm_k_fill_bf16(&fb, 0, &err))
        goto done;
    gemm_op g = {.h = h, .a = a, .b = b, .c = c, .n = n};
    res = 2.0 * n * (double)n * n / (median_ms(run_gemm, &g, 5, 30) * 1e-3) / 1e12;
done:
    if (h)
        cublasDestroy(h);
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
    return res;
}

typedef struct run_result {
    double ttft_ms, decode_s;
} run_result;

/* Decode-step sampling modes of --sample (issue 22): 0 greedy on the device (forward_greedy),
 * else forward_sample with: 1 temperature 0.8 / top-p 0.95, 2 top-k 50 (temperature 0.8),
 * 3 temperature 0.8 / top-p 0.95 + repetition_penalty 1.1 over prompt + output, 4 temperature
 * 0.8 / top-p 0.95 + logprobs top-5; 5 = mode 1 sampled on the host (logits copied,
 * tm_sample_token). */
enum { N_SAMPLE_MODES = 6 };
static const char *const sample_mode_name[N_SAMPLE_MODES] = {
    "greedy", "t0.8-p0.95", "topk50", "rep1.1", "logprobs5", "host-t0.8-p0.95"};

static tm_sample_params sample_mode_params(int mode, uint64_t seed) {
    tm_sample_params p = {.temperature = 0.8f, .top_p = 0.95f, .seed = seed};
    if (mode == 2)
        p.top_p = 0.0f, p.top_k = 50;
    if (mode == 3)
        p.repetition_penalty = 1.1f;
    return p;
}

// One step's ids with sampling mode m (> 0; mode 5 needs logits and scratch) at decode step k.
static tm_rc sample_step(tm_engine *eng, const tm_batch *b, int m, uint32_t L, uint32_t k,
                         uint32_t **tok, float *logits, tm_sample_scratch *scr, uint32_t *ids,
                         tm_err *err) {
    static tm_engine_sample_row rows[256];
    static tm_engine_sample_out outs[256];
    const uint32_t V = eng->model->cfg.n_vocab;
    for (uint32_t i = 0; i < b->n_seq; i++) {
        rows[i] = (tm_engine_sample_row){.p = sample_mode_params(m, 7 + i),
                                         .step = k,
                                         .want_lp = m == 4,
                                         .n_top = m == 4 ? 5 : 0};
        rows[i].p.hist = tok[i], rows[i].p.n_hist = L + k, rows[i].p.n_hist_prompt = L;
        if (m != 3)
            rows[i].p.n_hist = 0;
    }
    if (m == 5) {
        tm_rc rc = tm_engine_forward(eng, b, logits, err);
        for (uint32_t i = 0; !rc && i < b->n_seq; i++)
            rc = tm_sample_token(logits + (size_t)i * V, V, &rows[i].p, k, scr, &ids[i], err);
        return rc;
    }
    tm_rc rc = eng->ops->forward_sample(eng, b, V, rows, outs, err);
    for (uint32_t i = 0; !rc && i < b->n_seq; i++)
        ids[i] = outs[i].id < V ? outs[i].id : 0;
    return rc;
}

static int run_once(tm_engine *eng, const tm_model_cfg *c, uint32_t B, uint32_t L, uint32_t N,
                    int use_logits, uint32_t **tok, uint32_t **bt, float *logits, run_result *res,
                    uint64_t seed, int mode, tm_sample_scratch *scr) {
    tm_err err = {0};
    tm_batch_seq seqs[256];
    uint32_t ids[256];
    uint64_t s = seed;
    for (uint32_t i = 0; i < B; i++)
        for (uint32_t k = 0; k < L; k++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            tok[i][k] = (uint32_t)((s >> 33) % c->n_vocab);
        }
    const uint32_t n_block = TM_CEIL_DIV(L + N, BLOCK);
    // prefill
    for (uint32_t i = 0; i < B; i++)
        seqs[i] = (tm_batch_seq){.tokens = tok[i],
                                 .n_tok = L,
                                 .pos = 0,
                                 .block_table = bt[i],
                                 .n_block = n_block,
                                 .want_logits = 1};
    tm_batch b = {.seqs = seqs, .n_seq = B};
    double t0 = tm_now_ms();
    tm_rc rc = use_logits ? tm_engine_forward(eng, &b, logits, &err)
                          : tm_engine_cuda_forward_greedy(eng, &b, ids, &err);
    if (rc) {
        fprintf(stderr, "prefill: %s\n", err.msg);
        return 0;
    }
    if (use_logits)
        for (uint32_t i = 0; i < B; i++) {
            const float *row = logits + (size_t)i * c->n_vocab;
            uint32_t best = 0;
            for (uint32_t v = 1; v < c->n_vocab; v++)
                best = row[v] > row[best] ? v : best;
            ids[i] = best;
        }
    double t1 = tm_now_ms();
    for (uint32_t i = 0; i < B; i++)
        tok[i][L] = ids[i];
    // decode: N - 1 steps
    for (uint32_t k = 1; k < N; k++) {
        for (uint32_t i = 0; i < B; i++)
            seqs[i] = (tm_batch_seq){.tokens = &tok[i][L + k - 1],
                                     .n_tok = 1,
                                     .pos = L + k - 1,
                                     .block_table = bt[i],
                                     .n_block = n_block,
                                     .want_logits = 1};
        if (mode > 0)
            rc = sample_step(eng, &b, mode, L, k, tok, logits, scr, ids, &err);
        else
            rc = use_logits ? tm_engine_forward(eng, &b, logits, &err)
                            : tm_engine_cuda_forward_greedy(eng, &b, ids, &err);
        if (rc) {
            fprintf(stderr, "decode step %u: %s\n", k, err.msg);
            return 0;
        }
        for (uint32_t i = 0; i < B; i++) {
            if (use_logits && mode == 0) {
                const float *row = logits + (size_t)i * c->n_vocab;
                uint32_t best = 0;
                for (uint32_t v = 1; v < c->n_vocab; v++)
                    best = row[v] > row[best] ? v : best;
                ids[i] = best;
            }
            tok[i][L + k] = ids[i];
        }
    }
    double t2 = tm_now_ms();
    res->ttft_ms = t1 - t0;
    res->decode_s = (t2 - t1) / 1e3;
    return 1;
}

// --verify K: ms of one step of B sequences at position P with n tokens each (n_logits n), median
// of 50 after 5 warm-ups; 0 on failure.
static double verify_ms(tm_engine *eng, uint32_t B, uint32_t P, uint32_t n, uint32_t n_block,
                        uint32_t **tok, uint32_t **bt) {
    tm_batch_seq seqs[256];
    static uint32_t ids[256 * (TM_SPEC_BENCH_MAX_K + 1)];
    double t[50];
    tm_err err = {0};
    for (uint32_t i = 0; i < B; i++)
        seqs[i] = (tm_batch_seq){.tokens = &tok[i][P],
                                 .n_tok = n,
                                 .pos = P,
                                 .block_table = bt[i],
                                 .n_block = n_block,
                                 .want_logits = 1,
                                 .n_logits = n};
    tm_batch b = {.seqs = seqs, .n_seq = B};
    for (int k = -5; k < 50; k++) {
        const double t0 = tm_now_ms();
        if (tm_engine_cuda_forward_greedy(eng, &b, ids, &err)) {
            fprintf(stderr, "verify step (%u tokens): %s\n", n, err.msg);
            return 0;
        }
        if (k >= 0)
            t[k] = tm_now_ms() - t0;
    }
    return median(t, 50);
}

/* ---- what the DeepSeek-V4 and V4.1 runs share ---- */

typedef struct dsv_args {
    uint32_t n_layer, L, N, reps; /* --layers, --prompt, --gen, --reps */
    uint32_t batches[8], n_batch; /* --batch B1,B2,... */
} dsv_args;

/* Takes the option a with its value v when it is one of dsv_args'; 0 when it is not. */
static int dsv_arg(dsv_args *o, const char *a, const char *v) {
    if (!strcmp(a, "--layers"))
        o->n_layer = (uint32_t)atoi(v);
    else if (!strcmp(a, "--prompt"))
        o->L = (uint32_t)atoi(v);
    else if (!strcmp(a, "--gen"))
        o->N = (uint32_t)atoi(v);
    else if (!strcmp(a, "--reps"))
        o->reps = (uint32_t)atoi(v);
    else if (!strcmp(a, "--batch")) {
        o->n_batch = 0;
        for (char *p = (char *)v; *p && o->n_batch < 8;) {
            o->batches[o->n_batch++] = (uint32_t)strtoul(p, &p, 10);
            if (*p == ',')
                p++;
        }
    } else
        return 0;
    return 1;
}

/* Optional: called before each rep of dsv_time_batch (rep 0: the warm-up) with its prompts,
 * which it may rewrite (n_tok = B x L tokens). */
typedef struct dsv_hook {
    void (*before_rep)(void *ctx, uint32_t rep, uint32_t *tok, size_t n_tok);
    void *ctx;
} dsv_hook;

/* B prompts of L tokens (tok, B x L) in one step on the block tables bt (B x per_seq), then
 * N - 1 greedy decode steps; rep 0 warms up (and captures the graphs), the best of reps 1..reps
 * goes to *best_pf (prefill, s) and *best_dec (s per decode step). sq and ids: B entries; hook
 * NULL or called before each rep. */
static tm_rc dsv_time_batch(tm_engine *eng, uint32_t *tok, const uint32_t *bt, uint32_t per_seq,
                            uint32_t B, uint32_t L, uint32_t N, uint32_t reps, tm_batch_seq *sq,
                            uint32_t *ids, const dsv_hook *hook, double *best_pf, double *best_dec,
                            tm_err *err) {
    uint32_t *next = tm_malloc((size_t)B * sizeof(*next)); // each sequence's decode input
    tm_rc rc = next ? TM_OK : TM_ERR(err, TM_E_NOMEM, "bench: decode inputs");
    *best_pf = 1e30, *best_dec = 1e30;
    for (uint32_t rep = 0; rep <= reps && !rc; rep++) {
        if (hook)
            hook->before_rep(hook->ctx, rep, tok, (size_t)B * L);
        for (uint32_t s = 0; s < B; s++)
            sq[s] = (tm_batch_seq){.tokens = tok + (size_t)s * L,
                                   .n_tok = L,
                                   .pos = 0,
                                   .block_table = bt + (size_t)s * per_seq,
                                   .n_block = per_seq,
                                   .want_logits = 1};
        tm_batch b = {.seqs = sq, .n_seq = B};
        double ta = tm_now_ms();
        rc = tm_engine_cuda_forward_greedy(eng, &b, ids, err);
        const double pf = (tm_now_ms() - ta) / 1e3;
        for (uint32_t s = 0; s < B; s++)
            next[s] = ids[s];
        ta = tm_now_ms();
        for (uint32_t step = 1; step < N && !rc; step++) {
            for (uint32_t s = 0; s < B; s++) {
                sq[s].tokens = &next[s];
                sq[s].n_tok = 1;
                sq[s].pos = L + step - 1;
            }
            rc = tm_engine_cuda_forward_greedy(eng, &b, ids, err);
            for (uint32_t s = 0; s < B; s++)
                next[s] = ids[s];
        }
        const double dec = (tm_now_ms() - ta) / 1e3 / (N - 1);
        if (rep > 0) {
            *best_pf = pf < *best_pf ? pf : *best_pf;
            *best_dec = dec < *best_dec ? dec : *best_dec;
        }
    }
    tm_free(next);
    return rc;
}

/* ---- DeepSeek-V4-Flash (--shape dsv4-flash [--layers N]; issue 21) ----
 * Flash widths (transformers' DeepseekV4Config defaults), the first --layers layers (default 4:
 * layers 0-1 sliding, then CSA / HCA alternating; 0-2 hash-routed MoE), random weights on the
 * device: --quant fp8-block (default: q_a, q_b, kv_proj, o_b and the shared expert as e4m3 with
 * 128 x 128 block scales, the routed experts MXFP4; o_a, compressor, indexer and router bf16) or
 * bf16. A run per batch size:
 * prefill B prompts of L tokens in one step, then N - 1 greedy decode steps (best of --reps
 * after a warm-up that captures the graphs); per-layer decode ms = step ms / layers (the head is
 * charged to the layers). The bytes floor (docs/deepseek_v4.md) of a step is printed next to it,
 * from the device-copy bandwidth measured in this run. */
#include <jansson.h>

#include "runner/model/model_dsv4.h"

static int dsv4_bench(int argc, char **argv) {
    dsv_args args = {.n_layer = 4, .L = 512, .N = 64, .reps = 1, .batches = {1, 8}, .n_batch = 2};
    const char *quant = "fp8-block";
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (dsv_arg(&args, a, v))
            continue;
        if (!strcmp(a, "--quant"))
            quant = v;
    }
    const uint32_t n_layer = args.n_layer, L = args.L, N = args.N, reps = args.reps,
                   n_batch = args.n_batch;
    const uint32_t *batches = args.batches;
    if (n_layer < 1 || n_layer > 64 || L < 1 || N < 2 || !reps || !n_batch) {
        fprintf(stderr, "bench_engine dsv4: bad --layers/--prompt/--gen/--reps/--batch\n");
        return 2;
    }
    const int mx = !strcmp(quant, "fp8-block");
    char cfg[8192];
    int o = snprintf(cfg, sizeof(cfg),
                     "{\"architectures\":[\"DeepseekV4ForCausalLM\"],\"vocab_size\":129280,"
                     "\"hidden_size\":4096,\"moe_intermediate_size\":2048,"
                     "\"num_hidden_layers\":%u,\"num_attention_heads\":64,"
                     "\"num_key_value_heads\":1,\"head_dim\":512,\"q_lora_rank\":1024,"
                     "\"partial_rotary_factor\":0.125,\"num_experts_per_tok\":6,"
                     "\"n_routed_experts\":256,\"scoring_func\":\"sqrtsoftplus\","
                     "\"routed_scaling_factor\":1.5,\"max_position_embeddings\":65536,"
                     "\"rope_theta\":10000.0,\"compress_rope_theta\":160000.0,"
                     "\"rope_parameters\":{\"rope_type\":\"yarn\",\"factor\":16.0,"
                     "\"original_max_position_embeddings\":4096,\"beta_fast\":32.0,"
                     "\"beta_slow\":1.0},\"hc_mult\":4,\"hc_sinkhorn_iters\":20,"
                     "\"hc_eps\":1e-6,\"swiglu_limit\":10.0,\"sliding_window\":128,"
                     "\"o_groups\":8,\"o_lora_rank\":1024,\"index_n_heads\":64,"
                     "\"index_head_dim\":128,\"index_topk\":512,\"hidden_act\":\"silu\","
                     "\"rms_norm_eps\":1e-6,\"tie_word_embeddings\":false,"
                     "\"bos_token_id\":0,\"eos_token_id\":1,\"num_hash_layers\":3,"
                     "\"compress_ratios\":[",
                     n_layer);
    for (uint32_t i = 0; i < n_layer; i++)
        o += snprintf(cfg + o, sizeof(cfg) - (size_t)o, "%s%d", i ? "," : "",
                      i < 2   ? 0
                      : i % 2 ? 128
                              : 4);
    snprintf(cfg + o, sizeof(cfg) - (size_t)o, "]}");
    json_error_t je;
    json_t *root = json_loads(cfg, 0, &je);
    tm_model m = {0};
    tm_dsv4 *d = NULL;
    tm_err err = {0};
    if (!root || tm_dsv4_config_parse(root, NULL, &m.cfg, &d, &err)) {
        fprintf(stderr, "bench_engine dsv4: config: %s %s\n", je.text, err.msg);
        return 1;
    }
    json_decref(root);
    m.cfg.arch = TM_ARCH_DEEPSEEK_V4;
    m.arch_w = d;
    uint32_t Bmax = 0;
    for (uint32_t i = 0; i < n_batch; i++)
        Bmax = batches[i] > Bmax ? batches[i] : Bmax;
    const uint32_t bs = 128, per_seq = (L + N + bs - 1) / bs;
    tm_engine_opts eo = {.block_size = bs,
                         .n_kv_block = Bmax * per_seq,
                         .max_seqs = Bmax,
                         .max_batched_tokens = Bmax * L};
    const double bw = copy_bw();
    tm_engine *eng = NULL;
    const double t0 = (tm_now_ms() / 1e3);
    if (tm_engine_cuda_create_random_fmt(&m, &eo, 7, mx ? TM_CUDA_W_FP8_BLOCK : TM_CUDA_W_BF16,
                                         &eng, &err)) {
        fprintf(stderr, "bench_engine dsv4: create: %s\n", err.msg);
        return 1;
    }
    if (getenv("TM_DSV4_NO_GRAPHS")) // eager decode steps (with TM_CUDA_PROFILE=1: per-op times)
        tm_engine_cuda_set_graphs(eng, 0);
    printf("dsv4-flash: %u layers, dense %s, experts %s, create %.1f s, copy bandwidth %.0f "
           "GB/s\n",
           n_layer, mx ? "fp8-block (o_a bf16)" : "bf16", mx ? "mxfp4" : "bf16",
           (tm_now_ms() / 1e3) - t0, bw);
    // Bytes a decode step reads per layer (docs/deepseek_v4.md), as this engine stores them.
    const double D = 4096, hd = 512, H = 64, qr = 1024, G = 8, olr = 1024, I = 2048, E = 256, k = 6,
                 di = 128, Hi = 64, V = 129280;
    // q_a, q_b, kv_proj, o_b and the shared expert: e4m3 (+ fp32 block scales) with fp8-block;
    // o_a (grouped), compressor, indexer, router: bf16
    const double wb = mx ? 1.0 + 4.0 / (128 * 128) : 2.0;
    const double attn = wb * (qr * D + H * hd * qr + hd * D + D * G * olr) +
                        2 * G * olr * (H * hd / G);
    const double csa = 2 * (2 * 2 * hd * D + 4 * di * D + Hi * di * qr + Hi * D);
    const double hca = 2 * (2 * hd * D);
    const double hc = 2 * 24 * 4 * D * 4, router = E * D * 2, shared = 3 * I * D * wb;
    const double expert = 3 * I * D * (mx ? 0.5 + 1.0 / 32 : 2.0);
    const double head = V * D * 2;
    uint32_t *tok = calloc((size_t)Bmax * L, 4), *bt = calloc((size_t)Bmax * per_seq, 4);
    tm_batch_seq *sq = calloc(Bmax, sizeof(*sq));
    uint32_t *ids = calloc(Bmax, 4);
    for (size_t i = 0; i < (size_t)Bmax * L; i++)
        tok[i] = (uint32_t)((i * 2654435761u) % 129280);
    for (size_t i = 0; i < (size_t)Bmax * per_seq; i++)
        bt[i] = (uint32_t)i;
    int rc = 0;
    for (uint32_t bi = 0; bi < n_batch && !rc; bi++) {
        const uint32_t B = batches[bi];
        double best_pf, best_dec;
        rc = dsv_time_batch(eng, tok, bt, per_seq, B, L, N, reps, sq, ids, NULL, &best_pf,
                            &best_dec, &err) != TM_OK;
        if (rc) {
            fprintf(stderr, "bench_engine dsv4: forward: %s\n", err.msg);
            break;
        }
        const double hit = E * (1.0 - pow(1.0 - k / E, B)); // distinct experts, uniform routing
        uint32_t n_csa = 0, n_hca = 0;
        for (uint32_t l = 0; l < n_layer; l++)
            n_csa += d->cfg.attn[l] == TM_DSV4_ATTN_CSA,
                n_hca += d->cfg.attn[l] == TM_DSV4_ATTN_HCA;
        const double layer_b = attn + hc + router + shared + hit * expert +
                               (n_csa * csa + n_hca * hca) / n_layer;
        const double floor_ms = (layer_b * n_layer + head) / (bw * 1e9) * 1e3;
        const double step_ms = best_dec * 1e3;
        printf("dsv4-flash B=%u L=%u N=%u: prefill %.1f ms (%.0f tok/s), decode %.3f ms/step "
               "(%.1f tok/s/seq, %.1f aggregate); per layer %.3f ms (head charged to the layers);"
               " bytes floor %.3f ms/step (%.1f MB/layer, %.1f distinct experts) -> %.0f%% of "
               "floor; full depth 43 layers extrapolated %.2f ms/step = %.1f tok/s/seq\n",
               B, L, N, best_pf * 1e3, B * L / best_pf, step_ms, 1e3 / step_ms, B * 1e3 / step_ms,
               step_ms / n_layer, floor_ms, layer_b / 1e6, hit, 100.0 * floor_ms / step_ms,
               step_ms / n_layer * 43, 1e3 / (step_ms / n_layer * 43));
    }
    free(tok), free(bt), free(sq), free(ids);
    tm_engine_destroy(eng);
    tm_dsv4_destroy(d);
    return rc;
}

/* ---- DeepSeek-V4.1 (--shape dsv41-flash [--layers N | --layer-ids LIST]; issue 40) ----
 * Layers of the released DeepSeek-V4.1-Flash config (v41_config below: width 5120, 64 heads x 512,
 * q_lora 1280, 384 routed experts top 6 of width 2304, index 32 heads x 128 top 512, candidate
 * selection at layer 20, Engram at layers 1 and 14 with 4-grams, 8 heads x 256: 24 rows of 256 a
 * token and layer): --layers N the first N, --layer-ids the listed ones (each layer whose
 * compressed KV, index picks or index keys come from another needs that one listed too), by
 * default one of each kind (v41_kinds). Random weights on the device in the layout of the
 * engine's mode (TM_DSV41_CUDA_EXACT, read at create: the fast default keeps the dense FP8
 * linears as e4m3 + 32x32 ue8m0 scales beside a bf16 copy and the routed experts packed MXFP4; the
 * exact mode holds everything as bf16: 27 GB a layer, so 2 layers on an 80 GB GPU), Engram tables
 * written by this run into a temporary folder (~3 M rows each, read through the engine's row
 * cache, 1 GB by default) and a synthetic compressed token map. A run per batch size (--batch,
 * default 1,8): prefill B prompts of L tokens in one step, then N - 1 greedy decode steps (best of
 * --reps after a warm-up); per layer decode ms = step ms / layers, against the bytes floor of a
 * step: every weight byte a decode step reads (the distinct routed experts of B tokens under
 * uniform routing), the Engram rows copied to the GPU (fp32) and the LM head, at the device-copy
 * bandwidth measured in this run (v41_layer_bytes). Two floors are printed: the packed one (the
 * deployment's formats: FP8 1 B + a scale byte per 32 x 32 block, MXFP4 0.5 B + a scale byte per
 * 32, bf16 tensors 2 B, fp32 ones 4 B; what the fast mode reads at B <= 8: its non-quantized
 * linears' hi and lo input rows go through one decode GEMM of 2B rows; at B of 9 to 16 it reads
 * those linears (wo_a, compressor, indexer wk / weights_proj, head) twice, a hi pass and a lo
 * pass, which the floor does not count) and the bf16 one (what the exact mode reads); the
 * percentage is against the floor of the mode that ran. A second line projects the 40-layer step
 * at the same fraction of the 40 layers' floor. */
#include <fcntl.h>

#include "runner/model/engram_hash.h"
#include "runner/model/model_dsv41.h"
#include "runner/model/safetensors.h"

/* --engram cold: every rep (the warm-up included) gets prompts of its own, so that the rows of
 * its n-grams are in no cache of the engine's, and the tables' file leaves the OS page cache
 * (written back, then POSIX_FADV_DONTNEED), so that its rows come from the disk. */
typedef struct dsv41_cold {
    char path[1100]; /* the tables' file */
    uint32_t V;
} dsv41_cold;

static void dsv41_cold_rep(void *ctx, uint32_t rep, uint32_t *tok, size_t n_tok) {
    const dsv41_cold *c = ctx;
    for (size_t i = 0; i < n_tok; i++)
        tok[i] = (uint32_t)(((i + (size_t)rep * 1000003u) * 2654435761u) % c->V);
    const int fd = open(c->path, O_RDONLY);
    if (fd < 0 || fsync(fd) != 0 || posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) != 0)
        fprintf(stderr, "bench_engine dsv41: could not drop %s from the page cache\n", c->path);
    if (fd >= 0)
        close(fd);
}

/* The Engram tables of d's layers (rows from the hash layout) into dir/model.safetensors, codes
 * random e4m3 (never NaN), scales 2^-8..2^-1. Fills d's engram_num_embeddings. 0 on failure. */
static int dsv41_tables(const char *dir, tm_dsv41_cfg *d, const int32_t *tmap) {
    tm_engram_params ep = {.n_layer = d->n_engram,
                           .layer_ids = d->engram_layer_ids,
                           .num_embeddings = d->engram_num_embeddings,
                           .max_ngram = d->engram_max_ngram_size,
                           .n_heads = d->engram_n_heads,
                           .head_dim = d->engram_head_dim,
                           .vocab_size = d->engram_vocab_size,
                           .compressed_vocab = d->engram_compressed_vocab_size,
                           .pad_compressed = tmap[d->engram_pad_id]};
    uint64_t big[TM_DSV41_MAX_ENGRAM];
    for (uint32_t k = 0; k < d->n_engram; k++)
        big[k] = UINT64_MAX / 4;
    ep.num_embeddings = big;
    tm_engram_layout *lay = NULL;
    tm_err err = {0};
    if (tm_engram_layout_create(&ep, &lay, &err)) {
        fprintf(stderr, "bench_engine dsv41: engram layout: %s\n", err.msg);
        return 0;
    }
    const uint32_t dim = d->engram_head_dim;
    tm_st_wtensor t[2 * TM_DSV41_MAX_ENGRAM];
    char names[2 * TM_DSV41_MAX_ENGRAM][64];
    uint8_t *bufs[2 * TM_DSV41_MAX_ENGRAM] = {0};
    int ok = 1;
    uint64_t x = 12345;
    for (uint32_t k = 0; ok && k < d->n_engram; k++) {
        const uint64_t rows = lay->rows_used[k];
        d->engram_num_embeddings[k] = rows;
        for (int j = 0; j < 2; j++) {
            const size_t n = (size_t)rows * (j ? dim / 32 : dim);
            uint8_t *b = malloc(n);
            bufs[2 * k + j] = b;
            if (!b) {
                ok = 0;
                break;
            }
            for (size_t i = 0; i < n; i++) {
                x = x * 6364136223846793005ull + 1442695040888963407ull;
                const uint8_t v = (uint8_t)(x >> 56);
                b[i] = j ? (uint8_t)(119 + v % 7) : ((v & 0x7f) == 0x7f ? 0 : v);
            }
            snprintf(names[2 * k + j], sizeof(names[0]), "layers.%u.engram.embed.%s",
                     d->engram_layer_ids[k], j ? "scale" : "weight");
            t[2 * k + j] = (tm_st_wtensor){.name = names[2 * k + j],
                                           .dtype = j ? TM_DTYPE_F8_E8M0 : TM_DTYPE_F8_E4M3,
                                           .n_dim = 2,
                                           .shape = {rows, j ? dim / 32 : dim},
                                           .data = b};
        }
    }
    char path[1024];
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    if (ok && tm_st_file_write(path, t, 2 * (size_t)d->n_engram, NULL, 0, &err)) {
        fprintf(stderr, "bench_engine dsv41: %s: %s\n", path, err.msg);
        ok = 0;
    }
    for (uint32_t i = 0; i < 2 * d->n_engram; i++)
        free(bufs[i]);
    tm_engram_layout_destroy(lay);
    return ok;
}

/* The released DeepSeek-V4.1-Flash (config.json text_config, revision dba1be0a; docs in
 * ../shared/notes/PEERS.md section 4): 40 layers, compress ratios 0, 0, 2 x 18, 1 x 20, these kv /
 * index sources, the candidate source, the Engram layers. */
#define V41_NL 40
static const uint32_t v41_kv[] = {2, 8, 14, 20}, v41_ix[] = {2, 8, 14, 20, 24, 28, 32, 36},
                      v41_eng[] = {1, 14};
static const int32_t v41_cand = 20;
/* The default layer set: one layer of each kind the released model has (ratio 0; ratio 0 with
 * Engram; a ratio-2 kv + index source; a ratio-2 consumer; the ratio-1 kv + index + candidate
 * source; a ratio-1 consumer; a ratio-1 index-only source). */
static const uint32_t v41_kinds[] = {0, 1, 2, 3, 20, 21, 24};

static uint32_t v41_ratio(uint32_t l) { return l < 2 ? 0 : l < 20 ? 2 : 1; }

static int v41_has(const uint32_t *v, size_t n, uint32_t x) {
    for (size_t i = 0; i < n; i++)
        if (v[i] == x)
            return 1;
    return 0;
}

/* The config of the released model restricted to its layers ids[0..n) (ascending; the full model
 * when n = 40), renumbered 0..n-1, into cfg. The Engram tables keep the released shape (4-grams,
 * 8 heads x 256) with engram_vocab_size 131072 instead of 16 M, so that a run writes ~3 M rows a
 * table (0.8 GB) rather than the released 384 M (98 GB). Returns 0 when cfg is too small. */
static int v41_config(const uint32_t *ids, uint32_t n, char *cfg, size_t cap) {
    char list[5][512] = {{0}};
    int o[5] = {0, 0, 0, 0, 0};
    int32_t cand = -1;
    for (uint32_t i = 0; i < n; i++) {
        const uint32_t l = ids[i];
        o[0] += snprintf(list[0] + o[0], sizeof(list[0]) - (size_t)o[0], "%s%u", i ? "," : "",
                         v41_ratio(l));
        const int in[3] = {v41_has(v41_kv, 4, l), v41_has(v41_ix, 8, l), v41_has(v41_eng, 2, l)};
        for (int k = 0; k < 3; k++)
            if (in[k])
                o[k + 1] += snprintf(list[k + 1] + o[k + 1], sizeof(list[0]) - (size_t)o[k + 1],
                                     "%s%u", o[k + 1] ? "," : "", i);
        if (in[2])
            o[4] += snprintf(list[4] + o[4], sizeof(list[0]) - (size_t)o[4], "%s%s",
                             o[4] ? "," : "", "4000000");
        if ((int32_t)l == v41_cand)
            cand = (int32_t)i;
    }
    const int w = snprintf(
        cfg, cap,
        "{\"vocab_size\":129280,\"dim\":5120,\"moe_inter_dim\":2304,\"n_layers\":%u,"
        "\"n_mtp_layers\":0,\"n_heads\":64,\"n_routed_experts\":384,\"n_shared_experts\":1,"
        "\"n_activated_experts\":6,\"score_func\":\"sqrtsoftplus\",\"route_scale\":1.5,"
        "\"swiglu_limit\":10.0,\"q_lora_rank\":1280,\"head_dim\":512,\"rope_head_dim\":64,"
        "\"norm_eps\":1e-20,\"o_groups\":8,\"o_lora_rank\":1024,\"window_size\":128,"
        "\"compress_ratios\":[%s],\"kv_source_layers\":[%s],\"index_source_layers\":[%s],"
        "\"compress_rope_theta\":160000.0,\"original_seq_len\":65536,\"rope_theta\":10000.0,"
        "\"rope_factor\":16,\"beta_fast\":32,\"beta_slow\":1,\"max_seq_len\":1048576,"
        "\"index_n_heads\":32,\"index_head_dim\":128,\"index_topk\":512,"
        "\"candidate_source_layer\":%d,\"candidate_topk_blocks\":%u,\"candidate_block_size\":%u,"
        "\"hc_mult\":4,\"hc_sinkhorn_iters\":20,\"hc_eps\":1e-6,\"engram_layer_ids\":[%s],"
        "\"engram_num_embeddings\":[%s],\"engram_max_ngram_size\":4,\"engram_vocab_size\":131072,"
        "\"engram_n_heads\":8,\"engram_head_dim\":256,\"engram_pad_id\":2,"
        "\"engram_compressed_vocab_size\":99092}",
        n, list[0], list[1], list[2], cand, cand >= 0 ? 2048u : 0u, cand >= 0 ? 8u : 0u, list[3],
        list[4]);
    return w > 0 && (size_t)w < cap;
}

/* Parses v41_config(ids, n) into a new tm_dsv41 (*out; the caller destroys it) and m's shared
 * fields. When full is given (the 40-layer parse), checks that every source a chosen layer reads
 * (kv_from, idx_from, key_from) is chosen too and that the subset derives the same sources as the
 * released model, renumbered. 0 on success, after printing what is wrong. */
static int v41_parse(const uint32_t *ids, uint32_t n, const tm_dsv41 *full, tm_model *m,
                     tm_dsv41 **out) {
    char cfg[8192];
    if (!v41_config(ids, n, cfg, sizeof(cfg)))
        return fprintf(stderr, "bench_engine dsv41: config too long\n"), 1;
    for (uint32_t i = 0; full && i < n; i++) {
        const int16_t *from[3] = {full->cfg.kv_from, full->cfg.idx_from, full->cfg.key_from};
        for (int k = 0; k < 3; k++)
            if (from[k][ids[i]] >= 0 && !v41_has(ids, n, (uint32_t)from[k][ids[i]])) {
                fprintf(stderr,
                        "bench_engine dsv41: --layer-ids: layer %u reads the %s of layer %d: "
                        "list that layer too\n",
                        ids[i],
                        k == 0   ? "compressed KV"
                        : k == 1 ? "index picks"
                                 : "index keys",
                        from[k][ids[i]]);
                return 1;
            }
    }
    json_error_t je;
    json_t *root = json_loads(cfg, 0, &je);
    tm_err err = {0};
    if (!root || tm_dsv41_config_parse(root, NULL, &m->cfg, out, &err)) {
        fprintf(stderr, "bench_engine dsv41: config: %s %s\n%s\n", je.text, err.msg, cfg);
        json_decref(root);
        return 1;
    }
    json_decref(root);
    for (uint32_t i = 0; full && i < n; i++) { // the subset's derivations, renumbered back
        const tm_dsv41_cfg *s = &(*out)->cfg, *f = &full->cfg;
        const int16_t *fs[3] = {s->kv_from, s->idx_from, s->key_from},
                      *ff[3] = {f->kv_from, f->idx_from, f->key_from};
        for (int k = 0; k < 3; k++)
            if ((fs[k][i] < 0 ? -1 : (int32_t)ids[fs[k][i]]) != ff[k][ids[i]]) {
                fprintf(stderr,
                        "bench_engine dsv41: layer %u: source %d in the subset, %d in "
                        "the released model\n",
                        ids[i], fs[k][i] < 0 ? -1 : (int32_t)ids[fs[k][i]], ff[k][ids[i]]);
                tm_dsv41_destroy(*out);
                *out = NULL;
                return 1;
            }
    }
    return 0;
}

/* The bytes a decode step of B tokens reads in layer l of c (packed: the deployment's formats;
 * else everything bf16 as the exact mode holds it), hit routed experts among them. */
static double v41_layer_bytes(const tm_dsv41_cfg *c, uint32_t l, double hit, uint32_t B,
                              int packed) {
    const double D = c->dim, hd = c->head_dim, H = c->n_heads, qr = c->q_lora_rank, G = c->o_groups,
                 olr = c->o_lora_rank, I = c->moe_inter_dim, E = c->n_routed_experts,
                 di = c->index_head_dim, Hi = c->index_n_heads, N = c->hc_mult,
                 EHD = c->engram_head_dim,
                 NC = (double)(c->engram_max_ngram_size - 1) * c->engram_n_heads;
    // the fast mode reads the FP8 forms up to TM_QUANT_MAX_TOK (16) tokens, bf16 beyond
    const double f8 = packed && B <= 16 ? 1.0 + 1.0 / 1024 : 2.0,
                 mx4 = packed ? 0.5 + 1.0 / 32 : 2.0;
    const double hc = 2 * ((2 + N) * N) * (N * D) * 4, router = E * D * 2;
    const double attn = f8 * (qr * D + H * hd * qr + hd * D + G * olr * (H * hd / G) + D * G * olr);
    const uint32_t r = c->ratio[l];
    double b = attn + hc + router + f8 * 3 * I * D + hit * mx4 * 3 * I * D;
    if (r && c->kv_source[l]) // compressor (bf16; wgate beside wkv when r > 1), index wk
        b += 2 * (r > 1 ? 2 : 1) * hd * D + (c->index_source[l] ? 2 * di * hd : 0);
    if (r && c->index_source[l]) // index wq_b (FP8), weights_proj (bf16)
        b += f8 * Hi * di * qr + 2 * Hi * D;
    if (c->engram_slot[l] >= 0) // wkv, and the rows copied to the GPU as fp32
        b += f8 * ((N + 1) * D) * (NC * EHD) + B * NC * EHD * 4;
    return b;
}

/* Parses a list "a,b,c" of ascending layer ids below 40 into ids; returns the count, 0 if bad. */
static uint32_t v41_ids(const char *v, uint32_t *ids) {
    uint32_t n = 0;
    for (const char *p = v; *p && n < V41_NL;) {
        char *e;
        const unsigned long x = strtoul(p, &e, 10);
        if (e == p || x >= V41_NL || (n && x <= ids[n - 1]))
            return 0;
        ids[n++] = (uint32_t)x;
        p = *e == ',' ? e + 1 : e;
        if (*e && *e != ',')
            return 0;
    }
    return n;
}

static int dsv41_bench(int argc, char **argv) {
    dsv_args args = {.n_layer = 0, .L = 512, .N = 64, .reps = 1, .batches = {1, 8}, .n_batch = 2};
    uint32_t cache_mb = 1024, ids[V41_NL], n_layer = 0;
    int graphs = 1, cold = 0, mk = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "--mkmodel-args")) // print mkmodel's options for the same model, and stop
            mk = 1;
        else if (!strcmp(a, "--layer-ids")) {
            if (!(n_layer = v41_ids(v, ids))) {
                fprintf(stderr, "bench_engine dsv41: --layer-ids wants ascending ids below 40\n");
                return 2;
            }
            i++;
        } else if (dsv_arg(&args, a, v))
            i++;
        else if (!strcmp(a, "--engram-cache-mb"))
            cache_mb = (uint32_t)atoi(v), i++;
        else if (!strcmp(a, "--graphs")) // 0: every step eager
            graphs = atoi(v) != 0, i++;
        else if (!strcmp(a, "--engram")) // warm (default) or cold: see dsv41_cold
            cold = !strcmp(v, "cold"), i++;
        else if (!strcmp(a, "--shape"))
            i++;
        else {
            fprintf(stderr, "bench_engine dsv41: unknown option %s\n", a);
            return 2;
        }
    }
    if (args.n_layer && n_layer) {
        fprintf(stderr, "bench_engine dsv41: --layers N (the first N) or --layer-ids, not both\n");
        return 2;
    }
    if (args.n_layer) {
        n_layer = args.n_layer > V41_NL ? 0 : args.n_layer;
        for (uint32_t i = 0; i < n_layer; i++)
            ids[i] = i;
    } else if (!n_layer) {
        n_layer = sizeof(v41_kinds) / sizeof(v41_kinds[0]);
        memcpy(ids, v41_kinds, sizeof(v41_kinds));
    }
    const char *skip_env = getenv("TM_DSV41_ENGRAM_SKIP"); // read by the engine (dsv41.c)
    const int skip = skip_env && strcmp(skip_env, "0") != 0;
    const char *rows_tag = skip ? "skip" : cold ? "cold" : "warm";
    const char *rows_how = skip   ? "SKIPPED (TM_DSV41_ENGRAM_SKIP: zeros, no reads)"
                           : cold ? "cold (new prompts each rep, table file out of the page cache)"
                                  : "warm (the same prompts each rep: rows in the row cache)";
    const uint32_t L = args.L, N = args.N, reps = args.reps, n_batch = args.n_batch;
    const uint32_t *batches = args.batches;
    if (!n_layer || L < 1 || N < 2 || !reps || !n_batch) {
        fprintf(stderr, "bench_engine dsv41: bad --layers (1..40)/--prompt/--gen/--reps/--batch\n");
        return 2;
    }
    const uint32_t V = 129280, CV = 99092; // vocabulary; compressed (the V3 tokenizer's)
    uint32_t all[V41_NL];
    for (uint32_t i = 0; i < V41_NL; i++)
        all[i] = i;
    tm_model full_m = {0}, m = {0};
    tm_dsv41 *full = NULL, *d = NULL;
    if (v41_parse(all, V41_NL, NULL, &full_m, &full) || v41_parse(ids, n_layer, full, &m, &d)) {
        tm_dsv41_destroy(full);
        return 2;
    }
    char list[4][512] = {{0}}, chosen[512] = {0};
    int o[4] = {0, 0, 0, 0}, oc = 0;
    for (uint32_t i = 0; i < n_layer; i++) {
        const tm_dsv41_cfg *c = &d->cfg;
        oc += snprintf(chosen + oc, sizeof(chosen) - (size_t)oc, "%s%u (r%u%s%s%s%s)",
                       i ? ", " : "", ids[i], c->ratio[i], c->kv_source[i] ? " kv" : "",
                       c->index_source[i] ? " index" : "",
                       c->candidate_source_layer == (int32_t)i ? " candidates" : "",
                       c->engram_slot[i] >= 0 ? " Engram" : "");
        const int in[4] = {1, c->kv_source[i], c->index_source[i], c->engram_slot[i] >= 0};
        const uint32_t val[4] = {c->ratio[i], i, i, i};
        for (int k = 0; k < 4; k++)
            if (in[k])
                o[k] += snprintf(list[k] + o[k], sizeof(list[k]) - (size_t)o[k], "%s%u",
                                 o[k] ? "," : "", val[k]);
    }
    if (mk) { // the same model for mkmodel --arch deepseek_v41 (bench/dsv41_cuda_job.sh jvb)
        printf("--layers %u --dim 5120 --heads 64 --head-dim 512 --rope-dim 64 --q-lora 1280 "
               "--o-groups 8 --o-lora 1024 --ff 2304 --experts 384 --topk 6 --window 128 "
               "--index-heads 32 --index-dim 128 --index-topk 512 --hc 4 --route-scale 1.5 "
               "--swiglu-limit 10 --norm-eps 1e-20 --original-seq-len 65536 --rope-factor 16 "
               "--compress-rope-theta 160000 --max-position 1048576 --compress-ratios %s "
               "--kv-sources %s --index-sources %s --candidate-source %d "
               "--candidate-topk-blocks %u --candidate-block-size %u --engram-layers %s "
               "--engram-ngram 4 --engram-heads 8 --engram-dim 256 --engram-vocab 131072\n",
               n_layer, list[0], o[1] ? list[1] : "none", o[2] ? list[2] : "none",
               d->cfg.candidate_source_layer, d->cfg.candidate_topk_blocks,
               d->cfg.candidate_block_size, o[3] ? list[3] : "none");
        tm_dsv41_destroy(full);
        tm_dsv41_destroy(d);
        return 0;
    }
    tm_err err = {0};
    m.cfg.arch = TM_ARCH_DEEPSEEK_V41;
    m.arch_w = d;
    int32_t *tmap = malloc((size_t)V * sizeof(int32_t));
    char dir[] = "/tmp/tm_bench_dsv41_XXXXXX";
    if (!tmap || !mkdtemp(dir)) {
        fprintf(stderr, "bench_engine dsv41: out of memory or no temporary folder\n");
        return 1;
    }
    for (uint32_t i = 0; i < V; i++)
        tmap[i] = (int32_t)(i % CV);
    const double tw = tm_now_ms();
    if (!dsv41_tables(dir, &d->cfg, tmap))
        return 1;
    m.dir = dir;
    uint64_t table_bytes = 0;
    for (uint32_t k = 0; k < d->cfg.n_engram; k++)
        table_bytes += d->cfg.engram_num_embeddings[k] * (256 + 8);
    printf("dsv41-flash: Engram tables %.2f GB written in %.1f s (%s)\n", table_bytes / 1e9,
           (tm_now_ms() - tw) / 1e3, dir);
    uint32_t Bmax = 0;
    for (uint32_t i = 0; i < n_batch; i++)
        Bmax = batches[i] > Bmax ? batches[i] : Bmax;
    const uint32_t bs = 128, per_seq = (L + N + bs - 1) / bs;
    tm_engine_opts eo = {.block_size = bs,
                         .n_kv_block = Bmax * per_seq,
                         .max_seqs = Bmax,
                         .max_batched_tokens = Bmax * L,
                         .token_map = tmap,
                         .n_token_map = V,
                         .engram_cache_mb = cache_mb};
    const double bw = copy_bw();
    tm_engine *eng = NULL;
    const char *exact_env = getenv("TM_DSV41_CUDA_EXACT"); // read by the engine at create
    const int exact = exact_env && strcmp(exact_env, "0") != 0;
    const double t0 = tm_now_ms();
    if (tm_engine_cuda_create_random(&m, &eo, 7, &eng, &err)) {
        fprintf(stderr, "bench_engine dsv41: create: %s\n", err.msg);
    }
    if (eng) {
        tm_engine_cuda_set_graphs(eng, graphs);
        printf("dsv41-flash: %u layers of the released V4.1-Flash: %s; random weights (%s), "
               "create %.1f s, copy bandwidth %.0f GB/s, Engram row cache %u MB per table; decode "
               "%s; Engram rows %s\n",
               n_layer, chosen,
               exact ? "exact mode: bf16" : "fast mode: FP8 dense + bf16 copies, MXFP4 experts",
               (tm_now_ms() - t0) / 1e3, bw, cache_mb, graphs ? "CUDA graphs" : "eager", rows_how);
    }
    dsv41_cold cold_ctx = {.V = V};
    snprintf(cold_ctx.path, sizeof(cold_ctx.path), "%s/model.safetensors", dir);
    const dsv_hook cold_hook = {dsv41_cold_rep, &cold_ctx}, *hk = cold ? &cold_hook : NULL;
    // the bytes of a decode step: v41_layer_bytes per layer, and the LM head (bf16)
    const tm_dsv41_cfg *c = &d->cfg;
    const double E = c->n_routed_experts, k = c->n_activated_experts, head = (double)V * c->dim * 2;
    uint32_t *tok = calloc((size_t)Bmax * L, 4), *bt = calloc((size_t)Bmax * per_seq, 4);
    tm_batch_seq *sq = calloc(Bmax, sizeof(*sq));
    uint32_t *nxt = calloc(Bmax, 4);
    for (size_t i = 0; i < (size_t)Bmax * L; i++)
        tok[i] = (uint32_t)((i * 2654435761u) % V);
    for (size_t i = 0; i < (size_t)Bmax * per_seq; i++)
        bt[i] = (uint32_t)i;
    int rc = !eng;
    for (uint32_t bi = 0; bi < n_batch && !rc; bi++) {
        const uint32_t B = batches[bi];
        double best_pf, best_dec;
        rc = dsv_time_batch(eng, tok, bt, per_seq, B, L, N, reps, sq, nxt, hk, &best_pf, &best_dec,
                            &err) != TM_OK;
        if (rc) {
            fprintf(stderr, "bench_engine dsv41: forward: %s\n", err.msg);
            break;
        }
        const double hit = E * (1.0 - pow(1.0 - k / E, B)); // distinct experts, uniform routing
        double layers_b[2] = {0, 0}, full_b = 0;            // [0] packed, [1] bf16; the 40 layers
        for (int f = 0; f < 2; f++)
            for (uint32_t l = 0; l < n_layer; l++)
                layers_b[f] += v41_layer_bytes(c, l, hit, B, f == 0);
        for (uint32_t l = 0; l < V41_NL; l++)
            full_b += v41_layer_bytes(&full->cfg, l, hit, B, !exact);
        const double floor_p = (layers_b[0] + head) / (bw * 1e9) * 1e3;
        const double floor_b = (layers_b[1] + head) / (bw * 1e9) * 1e3;
        const double step_ms = best_dec * 1e3, floor_ms = exact ? floor_b : floor_p;
        printf(
            "dsv41-flash B=%u L=%u N=%u (%s mode) [%s, rows %s]: prefill %.1f ms (%.0f tok/s), decode %.3f "
            "ms/step (%.1f tok/s/seq, %.1f aggregate); per layer %.3f ms (head charged to the "
            "layers); bytes floor packed %.3f ms/step (%.1f MB/layer), bf16 %.3f ms/step (%.1f "
            "MB/layer) (%.1f distinct experts, Engram rows included) -> %.0f%% of the %s "
            "floor\n",
            B, L, N, exact ? "exact" : "fast", graphs ? "graphs" : "eager", rows_tag, best_pf * 1e3,
            B * L / best_pf, step_ms, 1e3 / step_ms, B * 1e3 / step_ms, step_ms / n_layer, floor_p,
            layers_b[0] / n_layer / 1e6, floor_b, layers_b[1] / n_layer / 1e6, hit,
            100.0 * floor_ms / step_ms, exact ? "bf16" : "packed");
        // the 40-layer step if every layer ran at this run's fraction of its floor (a projection
        // from the measured layers, not a measurement; one GPU does not hold the model)
        printf("dsv41-flash B=%u (%s mode): all 40 layers' floor %.3f ms/step; projected at this "
               "run's %.0f%% of the floor: %.2f ms/step (%.1f tok/s/seq)\n",
               B, exact ? "exact" : "fast", (full_b + head) / (bw * 1e9) * 1e3,
               100.0 * floor_ms / step_ms, step_ms * (full_b + head) / (bw * 1e6) / floor_ms,
               1e3 / (step_ms * (full_b + head) / (bw * 1e6) / floor_ms));
    }
    free(tok), free(bt), free(sq), free(nxt);
    tm_engine_destroy(eng);
    tm_dsv41_destroy(d);
    tm_dsv41_destroy(full);
    free(tmap);
    char cmd[1100];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return rc;
}

int main(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i++) // DeepSeek-V4 (issue 21): its own loop above
        if (!strcmp(argv[i], "--shape") && !strcmp(argv[i + 1], "dsv4-flash"))
            return dsv4_bench(argc, argv);
        else if (!strcmp(argv[i], "--shape") && !strcmp(argv[i + 1], "dsv41-flash"))
            return dsv41_bench(argc, argv);
    const char *shape = "llama8b", *model_dir = NULL, *batch_list = "8";
    uint32_t B = 8, L = 512, N = 256, reps = 3;
    uint32_t batches[16], n_batch = 0;
    int graphs = 1, use_logits = 0, ceiling = 1, sample_all = 0;
    uint32_t tp = 1, tp_port = 0;
    const char *quant = "bf16";
    const char *kv_name = "bf16";
    int kv_pool = 0;
    uint32_t verify_k = 0;
    tm_cuda_wfmt wfmt = TM_CUDA_W_BF16;
    int tp_rank = -1; // >= 0: a started rank > 0 (hidden options)
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--shape") && v)
            shape = v, i++;
        else if (!strcmp(a, "--batch") && v)
            batch_list = v, i++;
        else if (!strcmp(a, "--model") && v)
            model_dir = v, i++;
        else if (!strcmp(a, "--prompt") && v)
            L = (uint32_t)atoi(v), i++;
        else if (!strcmp(a, "--gen") && v)
            N = (uint32_t)atoi(v), i++;
        else if (!strcmp(a, "--reps") && v)
            reps = (uint32_t)atoi(v), i++;
        else if (!strcmp(a, "--no-graphs"))
            graphs = 0;
        else if (!strcmp(a, "--logits"))
            use_logits = 1;
        else if (!strcmp(a, "--sample-all"))
            sample_all = 1;
        else if (!strcmp(a, "--sample-device")) // --sample-all without the host mode
            sample_all = 2;
        else if (!strcmp(a, "--no-ceiling"))
            ceiling = 0;
        else if (!strcmp(a, "--quant") && v)
            quant = v, i++;
        else if (!strcmp(a, "--kv-dtype") && v)
            kv_name = v, i++;
        else if (!strcmp(a, "--verify") && v)
            verify_k = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(a, "--kv-pool"))
            kv_pool = 1;
        else if (!strcmp(a, "--tp") && v)
            tp = (uint32_t)atoi(v), i++;
        else if (!strcmp(a, "--tp-rank") && v)
            tp_rank = atoi(v), i++;
        else if (!strcmp(a, "--tp-port") && v)
            tp_port = (uint32_t)atoi(v), i++;
        else {
            usage();
            return 2;
        }
    }
    if (!strcmp(quant, "fp8-block"))
        wfmt = TM_CUDA_W_FP8_BLOCK;
    else if (!strcmp(quant, "fp8-block-ue8m0"))
        wfmt = TM_CUDA_W_FP8_BLOCK_E8M0;
    else if (!strcmp(quant, "fp8-channel"))
        wfmt = TM_CUDA_W_FP8_CHANNEL;
    else if (strcmp(quant, "bf16"))
        quant = NULL;
    B = 0;
    for (const char *p = batch_list; *p && n_batch < 16;) {
        char *end = NULL;
        const unsigned long b = strtoul(p, &end, 10);
        if (end == p || b == 0 || b > 256 || (*end && *end != ',')) {
            usage();
            return 2;
        }
        batches[n_batch++] = (uint32_t)b;
        B = b > B ? (uint32_t)b : B;
        p = *end ? end + 1 : end;
    }
    if (n_batch == 0 || L == 0 || N == 0 || reps == 0 || reps > 50 || tp == 0 || tp > TP_MAX ||
        !quant || (wfmt != TM_CUDA_W_BF16 && tp > 1) || verify_k > TM_SPEC_BENCH_MAX_K ||
        (strcmp(kv_name, "bf16") && strcmp(kv_name, "fp8"))) {
        usage();
        return 2;
    }
    tm_model m;
    memset(&m, 0, sizeof(m));
    tm_err err = {0};
    if (model_dir) {
        if (tm_model_cfg_load(model_dir, &m.cfg, &err)) {
            fprintf(stderr, "--model %s: %s\n", model_dir, err.msg);
            return 2;
        }
        shape = model_dir;
    } else if (!strncmp(shape, "dims:", 5) ? !dims_cfg(shape, &m.cfg) : !shape_cfg(shape, &m.cfg)) {
        fprintf(stderr, "--shape %s: unknown shape or malformed dims list\n", shape);
        usage();
        return 2;
    }
    const tm_model_cfg *c = &m.cfg;
    const uint32_t n_block_seq = TM_CEIL_DIV(L + N + verify_k + 1, BLOCK);
    tm_engine_opts eo = {.block_size = BLOCK,
                         .n_kv_block = B * n_block_seq,
                         .max_seqs = B,
                         .max_batched_tokens = B * L,
                         .tp_size = tp,
                         .max_rows = B * (verify_k + 1),
                         .kv_dtype = strcmp(kv_name, "fp8") ? TM_KV_DTYPE_AUTO : TM_KV_DTYPE_FP8};
    const double kv_elem_bytes = eo.kv_dtype == TM_KV_DTYPE_FP8 ? 1.0 : 2.0;
    if (kv_pool && tp == 1) { // the pool that the same memory gives, then the measured runs
        tm_model pm = m;
        pm.cfg.n_ctx = 1u << 20; // lift kv_cap_blocks (max_seqs full contexts) above memory
        tm_engine_opts po = eo;
        po.n_kv_block = 0;
        po.gpu_mem_util = 0.9f;
        tm_engine *pe = NULL;
        tm_rc prc = wfmt == TM_CUDA_W_BF16
                        ? tm_engine_cuda_create_random(&pm, &po, 1234, &pe, &err)
                        : tm_engine_cuda_create_random_fmt(&pm, &po, 1234, wfmt, &pe, &err);
        if (prc) {
            fprintf(stderr, "create (kv pool): %s\n", err.msg);
            return 1;
        }
        const uint64_t pool_tok = (uint64_t)pe->opts.n_kv_block * BLOCK;
        const double pool_gb = 2.0 * c->n_layer * c->n_kv_head * c->head_dim * kv_elem_bytes *
                               (double)pool_tok / 1e9;
        printf("kv pool: %s KV, gpu_memory_utilization 0.9: %u blocks of %u = %llu tokens, "
               "%.2f GB\n",
               kv_name, pe->opts.n_kv_block, BLOCK, (unsigned long long)pool_tok, pool_gb);
        printf("{\"shape\":\"%s\",\"quant\":\"%s\",\"kv\":\"%s\",\"kv_pool_tokens\":%llu,"
               "\"kv_pool_gb\":%.3f}\n",
               shape, quant, kv_name, (unsigned long long)pool_tok, pool_gb);
        tm_engine_destroy(pe);
    }
    tm_engine *eng = NULL;
    tm_rdzv *rdzv = NULL;
    uint8_t nccl_id[TM_NCCL_ID_BYTES];
    pid_t kids[TP_MAX] = {0};
    tm_engine_cuda_tp tcfg = {
        .rdzv = NULL, .nccl_id = nccl_id, .timeout_ms = 120000, .random = 1, .seed = 1234};
    if (tp > 1 && tp_rank > 0) { // a started rank: join, serve, exit
        size_t len = 0;
        tm_rdzv_cfg rc = {.addr = "127.0.0.1",
                          .port = (uint16_t)tp_port,
                          .rank = (uint32_t)tp_rank,
                          .world = tp,
                          .timeout_ms = 60000};
        eo.tp_rank = (uint32_t)tp_rank;
        tcfg.device = tp_rank;
        tm_rc r = tm_rdzv_join(&rc, &rdzv, nccl_id, sizeof(nccl_id), &len, &err);
        tcfg.rdzv = rdzv;
        if (!r)
            r = tm_engine_cuda_tp_create(&m, &eo, &tcfg, &eng, &err);
        if (!r)
            r = tm_engine_cuda_tp_serve(eng, &err);
        if (r)
            fprintf(stderr, "rank %d: %s\n", tp_rank, err.msg);
        tm_engine_destroy(eng);
        tm_rdzv_close(rdzv);
        return r ? 1 : 0;
    }
    // The ceilings before any engine exists: measured after the runs, the same copy read ~11%
    // lower (3,787 vs 4,240 GB/s on one H200, bench/RESULTS.md 2026-12-01); that figure is
    // printed too ("after the runs").
    const double bw = ceiling ? copy_bw() : 0.0;
    const double rbw = ceiling ? read_bw() : 0.0;
    const double tflops = ceiling ? gemm_tflops() : 0.0;
    double t0 = tm_now_ms();
    tm_rc crc = TM_OK;
    if (tp > 1) {
        tm_rdzv_cfg rc = {
            .addr = "127.0.0.1", .port = 0, .rank = 0, .world = tp, .timeout_ms = 60000};
        crc = tm_nccl_get_id(nccl_id, &err);
        if (!crc)
            crc = tm_rdzv_listen(&rc, &rdzv, &err);
        for (uint32_t r = 1; !crc && r < tp; r++) {
            char rs[16], ps[16];
            snprintf(rs, sizeof(rs), "%u", r);
            snprintf(ps, sizeof(ps), "%u", tm_rdzv_port(rdzv));
            char *cargv[64];
            int n = 0;
            for (int k = 0; k < argc && n < 58; k++)
                cargv[n++] = argv[k];
            cargv[n++] = "--tp-rank", cargv[n++] = rs, cargv[n++] = "--tp-port", cargv[n++] = ps;
            cargv[n] = NULL;
            fflush(NULL);
            kids[r] = fork();
            if (kids[r] == 0) {
                execv("/proc/self/exe", cargv);
                _exit(127);
            }
        }
        if (!crc)
            crc = tm_rdzv_accept(rdzv, nccl_id, sizeof(nccl_id), &err);
        tcfg.rdzv = rdzv;
        tcfg.device = 0;
        if (!crc)
            crc = tm_engine_cuda_tp_create(&m, &eo, &tcfg, &eng, &err);
        const int v = tm_nccl_version();
        fprintf(stderr, "tp %u: NCCL runtime %d.%d.%d (headers %d)\n", tp, v / 10000, v / 100 % 100,
                v % 100, tm_nccl_header_version());
    } else {
        crc = wfmt == TM_CUDA_W_BF16
                  ? tm_engine_cuda_create_random(&m, &eo, 1234, &eng, &err)
                  : tm_engine_cuda_create_random_fmt(&m, &eo, 1234, wfmt, &eng, &err);
    }
    if (crc) {
        fprintf(stderr, "create: %s\n", err.msg);
        tm_rdzv_close(rdzv);
        return 1;
    }
    fprintf(stderr, "engine created in %.0f ms\n", tm_now_ms() - t0);
    tm_engine_cuda_set_graphs(eng, graphs);

    uint32_t **tok = calloc(B, sizeof(*tok)), **bt = calloc(B, sizeof(*bt));
    float *logits = use_logits || sample_all ? malloc((size_t)B * c->n_vocab * sizeof(float))
                                             : NULL;
    for (uint32_t i = 0; i < B; i++) {
        tok[i] = calloc(L + N + verify_k + 2, sizeof(uint32_t));
        bt[i] = calloc(n_block_seq, sizeof(uint32_t));
        for (uint32_t k = 0; k < n_block_seq; k++)
            bt[i][k] = i * n_block_seq + k;
    }
    double *ttft = calloc(reps, sizeof(double)), *dec = calloc(reps, sizeof(double));
    double res_ttft[16], res_dec[16];
    run_result r;
    if (sample_all) { // every sampling mode in this one process, each: warm-up + reps
        tm_sample_scratch scr;
        if (tm_sample_scratch_init(&scr, c->n_vocab, &err))
            return 1;
        double ms[N_SAMPLE_MODES];
        for (int md = 0; md < (sample_all == 2 ? N_SAMPLE_MODES - 1 : N_SAMPLE_MODES); md++) {
            for (uint32_t i = 0; i <= reps; i++) {
                if (!run_once(eng, c, B, L, N, 0, tok, bt, logits, &r, 100 + i, md, &scr))
                    return 1;
                dec[i > 0 ? i - 1 : 0] = r.decode_s;
            }
            ms[md] = median(dec, reps) * 1e3 / (N - 1);
            printf("sample %-16s decode %.3f ms/step (%+.1f%% vs greedy)\n", sample_mode_name[md],
                   ms[md], 100.0 * (ms[md] / ms[0] - 1.0));
            fflush(stdout);
        }
        tm_sample_scratch_fini(&scr);
    }
    for (uint32_t bi = 0; bi < n_batch; bi++) {
        const uint32_t b = batches[bi];
        if (!run_once(eng, c, b, L, N, use_logits, tok, bt, logits, &r, 99, 0, NULL)) // warm-up
            return 1;
        for (uint32_t i = 0; i < reps; i++) {
            if (!run_once(eng, c, b, L, N, use_logits, tok, bt, logits, &r, 100 + i, 0, NULL))
                return 1;
            ttft[i] = r.ttft_ms;
            dec[i] = r.decode_s;
            fprintf(stderr, "B %u rep %u: prefill %.2f ms, decode %.3f s\n", b, i, r.ttft_ms,
                    r.decode_s);
        }
        res_ttft[bi] = median(ttft, reps);
        res_dec[bi] = median(dec, reps);
    }
    double v_plain = 0, v_spec = 0;
    if (verify_k) { // after the runs: the KV of positions [0, L + N) is written
        v_plain = verify_ms(eng, batches[0], L + N - 1, 1, n_block_seq, tok, bt);
        v_spec = verify_ms(eng, batches[0], L + N - 1, verify_k + 1, n_block_seq, tok, bt);
    }
    tm_engine_destroy(eng); // with tp: tells the other ranks to stop
    tm_rdzv_close(rdzv);
    for (uint32_t k = 1; k < tp; k++) {
        int st = 0;
        if (kids[k] > 0 &&
            (waitpid(kids[k], &st, 0) != kids[k] || !WIFEXITED(st) || WEXITSTATUS(st) != 0))
            fprintf(stderr, "rank %u exited with status %d\n", k, st);
    }

    // Roofline decode ceiling from the measured copy bandwidth (BENCHMARKS.md's formula).
    const double d = c->n_embd, qd = (double)c->n_head * c->head_dim;
    const double kvd = (double)c->n_kv_head * c->head_dim;
    const double layer = d * qd + 2 * d * kvd + qd * d + 3 * d * c->n_ff + 2 * d;
    const double bias = c->qkv_bias ? 4.0 * (qd + 2 * kvd) : 0.0; // fp32 on the device
    double w_bytes = 2.0 * (c->n_layer * layer + d + (double)c->n_vocab * d) + c->n_layer * bias;
    if (wfmt != TM_CUDA_W_BF16) {
        // e4m3 bytes of the linears, their scales (fused groups as the engine lays them out:
        // per row, or per 128 x 128 block of each fused matrix), the bf16 LM head, fp32 norms
        const double ff = c->n_ff;
        const double shp[4][2] = {{qd + 2 * kvd, d}, {d, qd}, {2 * ff, d}, {d, ff}};
        double lin = 0, sc = 0;
        for (int i = 0; i < 4; i++) {
            lin += shp[i][0] * shp[i][1];
            sc += wfmt == TM_CUDA_W_FP8_CHANNEL ? 4.0 * shp[i][0]
                                                : (wfmt == TM_CUDA_W_FP8_BLOCK ? 4.0 : 1.0) *
                                                      ceil(shp[i][0] / 128) * ceil(shp[i][1] / 128);
        }
        w_bytes = c->n_layer * (lin + sc + 2 * 4.0 * d + bias) + 4.0 * d + 2.0 * c->n_vocab * d;
    }
    const double bw_after = ceiling ? copy_bw() : 0.0;
    if (ceiling)
        printf("ceilings before the engine: copy %.0f GB/s, read-only %.0f GB/s, bf16 GEMM %.1f "
               "TFLOP/s; copy after the runs %.0f GB/s\n",
               bw, rbw, tflops, bw_after);
    int dev = 0;
    struct cudaDeviceProp prop;
    cudaGetDevice(&dev);
    cudaGetDeviceProperties(&prop, dev);
    const char *arch = c->arch == TM_ARCH_QWEN2     ? "qwen2"
                       : c->arch == TM_ARCH_MISTRAL ? "mistral"
                                                    : "llama";
    printf("shape %s (%s): %u layers, hidden %u, ff %u, heads %u/%u x %u, vocab %u%s%s\n", shape,
           arch, c->n_layer, c->n_embd, c->n_ff, c->n_head, c->n_kv_head, c->head_dim, c->n_vocab,
           c->tie_embd ? ", tied head" : "", c->qkv_bias ? ", qkv bias" : "");
    for (uint32_t bi = 0; bi < n_batch; bi++) {
        const uint32_t b = batches[bi];
        const double ttft_ms = res_ttft[bi], dec_s = res_dec[bi];
        const double per_seq = N > 1 ? (N - 1) / dec_s : 0.0;
        const double kv_bytes = 2.0 * c->n_layer * kv_elem_bytes * kvd * (L + N / 2.0) * b;
        // with tp, each GPU streams about 1/tp of the weights and KV (norms replicated: ignored)
        const double floor_ms = bw > 0 ? (w_bytes + kv_bytes) / tp / (bw * 1e9) * 1e3 : 0.0;
        const double ceil_seq = floor_ms > 0 ? 1e3 / floor_ms : 0.0;
        const double step_ms = N > 1 ? dec_s * 1e3 / (N - 1) : 0.0;
        printf("device: %s (%d SMs) x %u (tp); shape %s; B %u, L %u, N %u; %s, %s; reps %u "
               "(median)\n",
               prop.name, prop.multiProcessorCount, tp, shape, b, L, N, graphs ? "graphs" : "eager",
               use_logits ? "logits to host" : "greedy on device", reps);
        printf("weights: %s linears, %.3f GB streamed per decode step (floor); KV %s\n", quant,
               w_bytes / 1e9, kv_name);
        printf("prefill (TTFT) %.2f ms = %.0f tok/s\n", ttft_ms, b * L / (ttft_ms * 1e-3));
        printf("decode %.2f ms/step, %.1f tok/s/seq, %.1f tok/s aggregate\n", step_ms, per_seq,
               per_seq * b);
        if (bw > 0 && N > 1)
            printf(
                "ceiling: copy %.0f GB/s (read-only stream %.0f GB/s), weights %.2f GB + KV %.3f GB per step -> floor %.3f "
                "ms, %.1f tok/s/seq, %.0f aggregate; decode at %.1f%% of ceiling (%.3f ms a "
                "step above the floor)\n",
                bw, rbw, w_bytes / 1e9, kv_bytes / 1e9, floor_ms, ceil_seq, ceil_seq * b,
                100.0 * per_seq / ceil_seq, step_ms - floor_ms);
        // Prefill floor (the anchors' report.py): layer matmuls for b*L tokens, the LM head for
        // the last token of each prompt, causal attention; max(FLOPs / GEMM rate, bytes / bw).
        const double pf_flops = 2.0 * b * L * c->n_layer * (layer - 2 * d) +
                                2.0 * b * d * c->n_vocab +
                                (double)c->n_layer * b * 2.0 * L * L * c->n_head * c->head_dim;
        const double pf_bytes = w_bytes + 2.0 * c->n_layer * 2 * kvd * (double)b * L;
        double pf_floor_ms = tflops > 0 ? pf_flops / (tflops * 1e12) / tp * 1e3 : 0.0;
        if (bw > 0)
            pf_floor_ms = fmax(pf_floor_ms, pf_bytes / tp / (bw * 1e9) * 1e3);
        if (tflops > 0)
            printf("prefill ceiling: bf16 GEMM %.1f TFLOP/s, %.2f TFLOP -> floor %.2f ms; prefill "
                   "at %.1f%% of the floor\n",
                   tflops, pf_flops / 1e12, pf_floor_ms, 100.0 * pf_floor_ms / ttft_ms);
        printf("{\"tp\":%u,\"shape\":\"%s\",\"arch\":\"%s\",\"quant\":\"%s\",\"kv\":\"%s\","
               "\"w_gb\":%.3f,"
               "\"B\":%u,\"L\":%u,\"N\":%u,\"graphs\":%d,\"logits\":%d,"
               "\"ttft_ms\":%.3f,\"step_ms\":%.4f,\"floor_ms\":%.4f,\"decode_tok_s_seq\":%.2f,"
               "\"decode_tok_s\":%.1f,\"copy_gbs\":%.0f,\"read_gbs\":%.0f,\"ceiling_tok_s\":%.1f,"
               "\"pct_ceiling\":%.1f}\n",
               tp, shape, arch, quant, kv_name, w_bytes / 1e9, b, L, N, graphs, use_logits, ttft_ms,
               step_ms, floor_ms, per_seq, per_seq * b, bw, rbw, ceil_seq * b,
               ceil_seq > 0 ? 100.0 * per_seq / ceil_seq : 0.0);
    }
    if (verify_k && v_plain > 0 && v_spec > 0) {
        printf("verify: B %u at position %u: plain decode step %.3f ms, verification of %u drafts "
               "(%u tokens, %u rows) %.3f ms = %.3fx\n",
               batches[0], L + N - 1, v_plain, verify_k, batches[0] * (verify_k + 1),
               batches[0] * (verify_k + 1), v_spec, v_spec / v_plain);
        printf("speed-up at mean acceptance length a (tokens per verification):");
        for (uint32_t a = 1; a <= verify_k + 1; a++)
            printf(" a=%u: %.2fx", a, a * v_plain / v_spec);
        printf("\n{\"verify_k\":%u,\"B\":%u,\"plain_ms\":%.4f,\"verify_ms\":%.4f,"
               "\"ratio\":%.4f}\n",
               verify_k, batches[0], v_plain, v_spec, v_spec / v_plain);
    }
    for (uint32_t i = 0; i < B; i++)
        free(tok[i]), free(bt[i]);
    free(tok), free(bt), free(logits), free(ttft), free(dec);
    return (verify_k && !(v_plain > 0 && v_spec > 0)) ? 1 : 0;
}
