/* kernels/dsv4.cu - the DeepSeek-V4 kernels (see dsv4.h). Straightforward first versions: a
 * block per token (hyper-connections, compressors, indexer, routing, the head), a warp per
 * (token, head) (norm + RoPE, attention), a thread per element (stores, hc_post, SwiGLU, the
 * expert combine). Reductions are fp32 in a fixed order for a given launch shape, so results do
 * not depend on the batch composition beyond the GEMMs' own behaviour. */
#include <math.h>

#include "kernels/common.cuh"
#include "kernels/dsv4.h"

#define ATT_WARPS 16 /* warps per (token, head) attention block, splitting the keys */
#define ATT_MAX_J 16 /* elements per lane: head_dim <= 512 */
#define NR_MAX_J 16  /* pairs per lane in norm_rope: dim <= 1024 */
#define IDX_WARPS 8

static __device__ __forceinline__ uint32_t seq_slot(const tm_k_dsv4_seqs &sq, uint32_t t,
                                                    uint32_t q) {
    const uint32_t *bt = sq.block_tables + sq.seq_bt[sq.tok_seq[t]];
    return bt[q / sq.block_size] * sq.block_size + q % sq.block_size;
}

static __device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

/* ---- embedding ---- */

static __global__ void embed_kernel(tm_k_dsv4_embed_args a) {
    const uint32_t t = blockIdx.x, D = a.D;
    const uint32_t row = a.sliced ? a.tokens[t] - a.vocab0 : a.tokens[t]; // wraps below the slice
    const int have = !a.sliced || row < a.n_vocab;
    const uint16_t *e = a.embd + (size_t)(have ? row : 0) * D;
    float *st = a.streams + (size_t)t * a.n_hc * D;
    for (uint32_t i = threadIdx.x; i < D; i += blockDim.x) {
        const float v = have ? tm_bf2f(e[i]) : 0.0f;
        for (uint32_t n = 0; n < a.n_hc; n++)
            st[(size_t)n * D + i] = v;
    }
}

extern "C" tm_rc tm_k_dsv4_embed(const tm_k_dsv4_embed_args *a, cudaStream_t s, tm_err *err) {
    if (!a->n_tok)
        return TM_OK;
    embed_kernel<<<a->n_tok, 256, 0, s>>>(*a);
    return tm_cuda_launched(err, s, "dsv4_embed");
}

/* ---- hyper-connections ---- */

/* pre/post/comb of one token from its mixes m (smem), cb the comb (smem, N * N), by the block's
 * first N * N threads (one per element; N <= 8): every sum runs over its row or column in index
 * order, as a serial loop would. Every thread of the block must call it. */
static __device__ void hc_mix(const float *m, const float *base, const float *scale, uint32_t N,
                              uint32_t iters, float hc_eps, float *pre, float *po, float *cb,
                              float *tmp) {
    const uint32_t tid = threadIdx.x, j = tid / N, k = tid % N;
    const bool on = tid < N * N;
    if (tid < N) {
        pre[tid] = sigmoidf_(m[tid] * scale[0] + base[tid]) + hc_eps;
        po[tid] = 2.0f * sigmoidf_(m[N + tid] * scale[1] + base[N + tid]);
    }
    if (on)
        cb[tid] = m[2 * N + tid] * scale[2] + base[2 * N + tid];
    __syncthreads();
    if (on) { // row softmax
        float mx = -INFINITY;
        for (uint32_t q = 0; q < N; q++)
            mx = fmaxf(mx, cb[j * N + q]);
        tmp[tid] = expf(cb[tid] - mx);
    }
    __syncthreads();
    if (on) {
        float sum = 0.0f;
        for (uint32_t q = 0; q < N; q++)
            sum += tmp[j * N + q];
        cb[tid] = tmp[tid] / sum + hc_eps;
    }
    __syncthreads();
    for (uint32_t it = 0; it < iters; it++) {
        if (it > 0) {
            float sum = 0.0f;
            if (on)
                for (uint32_t q = 0; q < N; q++)
                    sum += cb[j * N + q];
            __syncthreads();
            if (on)
                cb[tid] /= sum + hc_eps;
            __syncthreads();
        }
        float sum = 0.0f;
        if (on)
            for (uint32_t q = 0; q < N; q++)
                sum += cb[q * N + k];
        __syncthreads();
        if (on)
            cb[tid] /= sum + hc_eps;
        __syncthreads();
    }
}

/* mixes[r][k] = rs * fn[k] . st, rs = 1 / rms(st over ND), st = streams row rows[r] (or r):
 * block (r, k). With n_split > 1, block (r, k, s) writes the partial dot of its ND / n_split slice
 * to part[(r * n_mix + k) * n_split + s] and (k == 0) the partial sum of squares to
 * ss[r * n_split + s]; hc_pre_kernel finishes them. */
static __global__ void hc_dot_kernel(const float *streams, const uint32_t *rows, const float *fn,
                                     uint32_t n_mix, uint32_t ND, float eps, float *mixes,
                                     uint32_t n_split, float *part, float *ssp) {
    const uint32_t r = blockIdx.x, k = blockIdx.y, sp = blockIdx.z;
    const float *st = streams + (size_t)(rows ? rows[r] : r) * ND, *f = fn + (size_t)k * ND;
    const uint32_t i0 = (uint32_t)((uint64_t)sp * ND / n_split);
    const uint32_t i1 = (uint32_t)((uint64_t)(sp + 1) * ND / n_split);
    float ss = 0.0f, acc = 0.0f;
    for (uint32_t i = i0 + threadIdx.x; i < i1; i += 256) {
        const float v = st[i];
        ss += v * v;
        acc += f[i] * v;
    }
    ss = tm_block_sum<256>(ss);
    acc = tm_block_sum<256>(acc);
    if (threadIdx.x)
        return;
    if (n_split == 1) {
        mixes[(size_t)r * n_mix + k] = acc * (1.0f / sqrtf(ss / (float)ND + eps));
        return;
    }
    part[((size_t)r * n_mix + k) * n_split + sp] = acc;
    if (k == 0)
        ssp[(size_t)r * n_split + sp] = ss;
}

/* x (smem, D floats) -> out = bf16(w * rms(x)). */
template <int BLOCK>
static __device__ void norm_out(const float *x, uint32_t D, const float *w, float eps,
                                uint16_t *out) {
    float ss = 0.0f;
    for (uint32_t i = threadIdx.x; i < D; i += BLOCK)
        ss += x[i] * x[i];
    const float s = 1.0f / sqrtf(tm_block_sum<BLOCK>(ss) / (float)D + eps);
    for (uint32_t i = threadIdx.x; i < D; i += BLOCK)
        out[i] = tm_f2bf(w[i] * (x[i] * s));
}

static __global__ void hc_pre_kernel(tm_k_dsv4_hc_pre_args a) {
    extern __shared__ float xs[]; // [D]
    __shared__ float m[(2 + TM_DSV4_K_MAX_HC) * TM_DSV4_K_MAX_HC];
    __shared__ float pre[TM_DSV4_K_MAX_HC], po[TM_DSV4_K_MAX_HC];
    __shared__ float cb[TM_DSV4_K_MAX_HC * TM_DSV4_K_MAX_HC],
        tmp[TM_DSV4_K_MAX_HC * TM_DSV4_K_MAX_HC];
    __shared__ float s_rs;
    const uint32_t t = blockIdx.x, N = a.N, D = a.D, ND = N * D, n_mix = (2 + N) * N;
    const uint32_t S = a.n_split;
    const float *st = a.streams + (size_t)t * ND;
    if (S > 1) { // finish hc_dot's partials (in split order)
        if (threadIdx.x == 0) {
            float ss = 0.0f;
            for (uint32_t q = 0; q < S; q++)
                ss += a.ss_part[(size_t)t * S + q];
            s_rs = 1.0f / sqrtf(ss / (float)ND + a.eps);
        }
        __syncthreads();
        for (uint32_t k = threadIdx.x; k < n_mix; k += 256) {
            const float *pp = a.dot_part + ((size_t)t * n_mix + k) * S;
            float acc = 0.0f;
            for (uint32_t q = 0; q < S; q++)
                acc += pp[q];
            m[k] = acc * s_rs;
        }
    } else {
        for (uint32_t k = threadIdx.x; k < n_mix; k += 256)
            m[k] = a.mixes[(size_t)t * n_mix + k];
    }
    __syncthreads();
    hc_mix(m, a.base, a.scale, N, a.iters, a.hc_eps, pre, po, cb, tmp);
    if (threadIdx.x < N)
        a.post[(size_t)t * N + threadIdx.x] = po[threadIdx.x];
    if (threadIdx.x < N * N)
        a.comb[(size_t)t * N * N + threadIdx.x] = cb[threadIdx.x];
    for (uint32_t d = threadIdx.x; d < D; d += 256) {
        float acc = 0.0f;
        for (uint32_t i = 0; i < N; i++)
            acc += pre[i] * st[(size_t)i * D + d];
        xs[d] = acc;
    }
    __syncthreads();
    norm_out<256>(xs, D, a.norm_w, a.eps, a.h + (size_t)t * D);
}

extern "C" tm_rc tm_k_dsv4_hc_pre(const tm_k_dsv4_hc_pre_args *a, cudaStream_t s, tm_err *err) {
    if (!a->n_tok)
        return TM_OK;
    TM_ASSERT(a->N >= 1 && a->N <= TM_DSV4_K_MAX_HC && a->D * sizeof(float) <= 48 * 1024);
    const uint32_t n_mix = (2 + a->N) * a->N, ND = a->N * a->D;
    tm_k_dsv4_hc_pre_args b = *a;
    // decode-sized steps: the dots split over TM_DSV4_K_HC_SPLIT slices of the streams (a few
    // blocks per (token, mix) would leave the GPU idle)
    b.n_split = a->n_tok <= TM_DSV4_K_HC_SPLIT_TOK && a->dot_part && a->ss_part ? TM_DSV4_K_HC_SPLIT
                                                                                : 1;
    hc_dot_kernel<<<dim3(a->n_tok, n_mix, b.n_split), 256, 0, s>>>(
        a->streams, NULL, a->fn, n_mix, ND, a->eps, a->mixes, b.n_split, b.dot_part, b.ss_part);
    hc_pre_kernel<<<a->n_tok, 256, a->D * sizeof(float), s>>>(b);
    return tm_cuda_launched(err, s, "dsv4_hc_pre");
}

static __global__ void hc_post_kernel(tm_k_dsv4_hc_post_args a) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const uint32_t N = a.N, D = a.D;
    if (i >= (size_t)a.n_tok * D)
        return;
    const size_t t = i / D, d = i % D;
    float y = a.y[i];
    for (uint32_t p = 1; p < a.n_part; p++)
        y += a.y[p * a.y_stride + i];
    float *st = a.streams + t * N * D;
    float sv[TM_DSV4_K_MAX_HC];
    for (uint32_t j = 0; j < N; j++)
        sv[j] = st[j * D + d];
    const float *po = a.post + t * N, *cb = a.comb + t * N * N;
    for (uint32_t k = 0; k < N; k++) {
        float acc = 0.0f;
        for (uint32_t j = 0; j < N; j++)
            acc += cb[j * N + k] * sv[j];
        st[k * D + d] = po[k] * y + acc;
    }
}

extern "C" tm_rc tm_k_dsv4_hc_post(const tm_k_dsv4_hc_post_args *a, cudaStream_t s, tm_err *err) {
    if (!a->n_tok)
        return TM_OK;
    TM_ASSERT(a->N >= 1 && a->N <= TM_DSV4_K_MAX_HC && a->n_part >= 1);
    const size_t n = (size_t)a->n_tok * a->D;
    hc_post_kernel<<<(unsigned)TM_CEIL_DIV(n, 256), 256, 0, s>>>(*a);
    return tm_cuda_launched(err, s, "dsv4_hc_post");
}

/* ---- per-head norm + RoPE ---- */

static __global__ void norm_rope_kernel(tm_k_dsv4_norm_rope_args a) {
    const uint32_t gw = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (gw >= a.n_tok * a.n_head)
        return;
    const uint32_t t = gw / a.n_head, h = gw % a.n_head, dim = a.dim;
    const float *x = a.x + (size_t)t * a.ld_x + (size_t)h * dim;
    const uint32_t np = a.n_part ? a.n_part : 1;
    float v0[NR_MAX_J], v1[NR_MAX_J], ss = 0.0f;
#pragma unroll
    for (int j = 0; j < NR_MAX_J; j++) {
        const uint32_t e = 2 * lane + 64 * j;
        v0[j] = v1[j] = 0.0f;
        if (e < dim) {
            v0[j] = x[e];
            v1[j] = x[e + 1];
        }
    }
    for (uint32_t q = 1; q < np; q++) { // split-K partials, in order (a partial's loads together)
        const float *xq = x + q * a.x_stride;
#pragma unroll
        for (int j = 0; j < NR_MAX_J; j++) {
            const uint32_t e = 2 * lane + 64 * j;
            if (e < dim) {
                v0[j] += xq[e];
                v1[j] += xq[e + 1];
            }
        }
    }
#pragma unroll
    for (int j = 0; j < NR_MAX_J; j++)
        ss += v0[j] * v0[j] + v1[j] * v1[j];
    float sc = 1.0f;
    if (a.norm)
        sc = 1.0f / sqrtf(tm_warp_sum(ss) / (float)dim + a.eps);
    const float pos = (float)a.pos[t];
    float *o = a.state ? a.state + (size_t)a.slot[t] * a.ld_state
                       : a.out + (size_t)t * a.ld_out + (size_t)h * dim;
#pragma unroll
    for (int j = 0; j < NR_MAX_J; j++) {
        const uint32_t e = 2 * lane + 64 * j;
        if (e >= dim)
            continue;
        float p = v0[j], q = v1[j];
        if (a.norm == 1) {
            p *= sc;
            q *= sc;
        } else if (a.norm == 2) {
            p = a.w[e] * (p * sc);
            q = a.w[e + 1] * (q * sc);
        }
        if (e >= dim - a.rd) {
            const uint32_t i = (e - (dim - a.rd)) / 2;
            const float ang = pos * a.inv_freq[i];
            const float c = cosf(ang) * a.attn_factor, s = sinf(ang) * a.attn_factor;
            const float pa = p, qb = q;
            p = pa * c - qb * s;
            q = qb * c + pa * s;
        }
        o[e] = p;
        o[e + 1] = q;
    }
}

extern "C" tm_rc tm_k_dsv4_norm_rope(const tm_k_dsv4_norm_rope_args *a, cudaStream_t s,
                                     tm_err *err) {
    if (!a->n_tok)
        return TM_OK;
    TM_ASSERT(a->dim % 2 == 0 && a->dim <= 64 * NR_MAX_J && a->rd <= a->dim && a->rd % 2 == 0);
    TM_ASSERT(!a->state || a->n_head == 1);
    const uint32_t n_warp = a->n_tok * a->n_head;
    norm_rope_kernel<<<TM_CEIL_DIV(n_warp, 8u), 256, 0, s>>>(*a);
    return tm_cuda_launched(err, s, "dsv4_norm_rope");
}

/* ---- state stores ---- */

static __global__ void store_kernel(tm_k_dsv4_store_args a) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)a.n_tok * a.n)
        return;
    const size_t t = i / a.n, c = i % a.n;
    float *dst = blockIdx.y ? a.dst2 : a.dst;
    const uint32_t c0 = blockIdx.y ? a.c0_2 : a.c0;
    dst[(size_t)a.slot[t] * a.ld + c] = a.src[t * a.ld_src + c0 + c];
}

extern "C" tm_rc tm_k_dsv4_store(const tm_k_dsv4_store_args *a, cudaStream_t s, tm_err *err) {
    if (!a->n_tok || !a->n)
        return TM_OK;
    const size_t n = (size_t)a->n_tok * a->n;
    store_kernel<<<dim3((unsigned)TM_CEIL_DIV(n, 256), a->dst2 ? 2 : 1), 256, 0, s>>>(*a);
    return tm_cuda_launched(err, s, "dsv4_store");
}

/* ---- compressor ---- */

static __global__ void compress_kernel(tm_k_dsv4_compress_args a) {
    __shared__ float xs[TM_DSV4_K_MAX_DIM];
    __shared__ uint32_t slots[256];
    const uint32_t t = blockIdx.x, r = a.r, dim = a.dim, cw = a.cw;
    const uint32_t p = a.sq.pos[t];
    if ((p + 1) % r)
        return;
    const uint32_t w = (p + 1) / r - 1;
    const int prev = a.overlap && w > 0;
    // slots: [0, r) window w-1 (overlap only), [r, 2r) window w
    for (uint32_t j = threadIdx.x; j < 2 * r; j += blockDim.x) {
        if (j < r)
            slots[j] = prev ? seq_slot(a.sq, t, (w - 1) * r + j) : 0;
        else
            slots[j] = seq_slot(a.sq, t, w * r + (j - r));
    }
    __syncthreads();
    const uint32_t off = a.overlap ? dim : 0;
    for (uint32_t dd = threadIdx.x; dd < dim; dd += blockDim.x) {
        float mx = -INFINITY;
        if (prev)
            for (uint32_t j = 0; j < r; j++)
                mx = fmaxf(mx, a.in_gate[(size_t)slots[j] * a.ld + dd] + a.bias[j * cw + dd]);
        for (uint32_t j = 0; j < r; j++)
            mx = fmaxf(mx, a.in_gate[(size_t)slots[r + j] * a.ld + off + dd] +
                               a.bias[j * cw + off + dd]);
        float sum = 0.0f;
        if (prev)
            for (uint32_t j = 0; j < r; j++)
                sum += expf(a.in_gate[(size_t)slots[j] * a.ld + dd] + a.bias[j * cw + dd] - mx);
        for (uint32_t j = 0; j < r; j++)
            sum += expf(a.in_gate[(size_t)slots[r + j] * a.ld + off + dd] +
                        a.bias[j * cw + off + dd] - mx);
        float acc = 0.0f;
        if (prev)
            for (uint32_t j = 0; j < r; j++) {
                const size_t o = (size_t)slots[j] * a.ld + dd;
                const float g = expf(a.in_gate[o] + a.bias[j * cw + dd] - mx);
                acc += a.in_kv[o] * (g / sum);
            }
        for (uint32_t j = 0; j < r; j++) {
            const size_t o = (size_t)slots[r + j] * a.ld + off + dd;
            const float g = expf(a.in_gate[o] + a.bias[j * cw + off + dd] - mx);
            acc += a.in_kv[o] * (g / sum);
        }
        xs[dd] = acc;
    }
    __syncthreads();
    float ss = 0.0f;
    for (uint32_t dd = threadIdx.x; dd < dim; dd += blockDim.x)
        ss += xs[dd] * xs[dd];
    const float sc = 1.0f / sqrtf(tm_block_sum<256>(ss) / (float)dim + a.eps);
    for (uint32_t dd = threadIdx.x; dd < dim; dd += blockDim.x)
        xs[dd] = a.norm[dd] * (xs[dd] * sc);
    __syncthreads();
    const float pw = (float)(w * r);
    for (uint32_t i = threadIdx.x; i < a.rd / 2; i += blockDim.x) {
        const uint32_t e = dim - a.rd + 2 * i;
        const float ang = pw * a.inv_freq[i];
        const float c = cosf(ang) * a.attn_factor, s = sinf(ang) * a.attn_factor;
        const float x0 = xs[e], x1 = xs[e + 1];
        xs[e] = x0 * c - x1 * s;
        xs[e + 1] = x1 * c + x0 * s;
    }
    __syncthreads();
    const uint32_t cps = (dim + r - 1) / r, base = slots[r]; // window w within one block
    for (uint32_t e = threadIdx.x; e < dim; e += blockDim.x)
        a.comp[(size_t)(base + e / cps) * a.ld + e % cps] = xs[e];
}

extern "C" tm_rc tm_k_dsv4_compress(const tm_k_dsv4_compress_args *a, cudaStream_t s, tm_err *err) {
    if (!a->n_tok)
        return TM_OK;
    TM_ASSERT(a->r >= 1 && a->r <= 128 && a->dim <= TM_DSV4_K_MAX_DIM &&
              a->sq.block_size % a->r == 0);
    TM_ASSERT(a->cw == (a->overlap ? 2 : 1) * a->dim && a->rd <= a->dim);
    compress_kernel<<<a->n_tok, 256, 0, s>>>(*a);
    return tm_cuda_launched(err, s, "dsv4_compress");
}

/* ---- lightning indexer + top-k ---- */

static __device__ __forceinline__ uint32_t f2key(float f) {
    const uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Exclusive rank of flag among the block's threads (in thread order) and the total; 256
 * threads. */
static __device__ __forceinline__ uint32_t block_rank(int flag, uint32_t *total, uint32_t *wsum) {
    const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const uint32_t b = __ballot_sync(0xffffffffu, flag);
    const uint32_t r = __popc(b & ((1u << lane) - 1u));
    __syncthreads();
    if (lane == 0)
        wsum[warp] = __popc(b);
    __syncthreads();
    uint32_t before = 0, all = 0;
    for (uint32_t i = 0; i < 8; i++) {
        before += i < warp ? wsum[i] : 0;
        all += wsum[i];
    }
    *total = all;
    return before + r;
}

static __global__ void index_kernel(tm_k_dsv4_index_args a) {
    extern __shared__ float sm[];
    __shared__ uint32_t hist[256];
    __shared__ uint32_t wsum[8];
    __shared__ uint32_t s_prefix, s_remaining;
    const uint32_t t = blockIdx.x, r = a.r, di = a.di, Hi = a.n_head;
    const uint32_t p = a.sq.pos[t], n_valid = min((p + 1) / r, a.max_entries);
    const uint32_t kk = min(a.topk, n_valid);
    uint32_t *sel = a.sel + (size_t)t * a.topk;
    if (threadIdx.x == 0)
        a.n_sel[t] = kk;
    if (kk == n_valid) {
        for (uint32_t i = threadIdx.x; i < n_valid; i += blockDim.x)
            sel[i] = i;
        return;
    }
    float *iq = sm;                          // [Hi][di + 1]
    float *kb = sm + (size_t)Hi * (di + 1);  // [IDX_WARPS][di]
    float *iw = kb + (size_t)IDX_WARPS * di; // [Hi]
    for (uint32_t i = threadIdx.x; i < Hi * di; i += blockDim.x)
        iq[(i / di) * (di + 1) + i % di] = a.iq[(size_t)t * Hi * di + i];
    for (uint32_t i = threadIdx.x; i < Hi; i += blockDim.x)
        iw[i] = a.iw[(size_t)t * Hi + i];
    __syncthreads();
    const float sscale = 1.0f / sqrtf((float)di), wscale = 1.0f / sqrtf((float)Hi);
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, cps = (di + r - 1) / r;
    float *sc = a.score + (size_t)t * a.max_entries;
    float *kw = kb + (size_t)warp * di;
    for (uint32_t w = warp; w < n_valid; w += IDX_WARPS) {
        const uint32_t base = seq_slot(a.sq, t, w * r);
        for (uint32_t e = lane; e < di; e += 32)
            kw[e] = a.icomp[(size_t)(base + e / cps) * a.ld + e % cps];
        __syncwarp();
        float s = 0.0f;
        for (uint32_t h = lane; h < Hi; h += 32) {
            const float *qh = iq + (size_t)h * (di + 1);
            float dot = 0.0f;
            for (uint32_t e = 0; e < di; e++)
                dot += qh[e] * kw[e];
            s += (fmaxf(dot, 0.0f) * sscale) * (iw[h] * wscale);
        }
        s = tm_warp_sum(s);
        if (lane == 0)
            sc[w] = s;
        __syncwarp();
    }
    __syncthreads();
    // radix select of the kk-th largest key
    if (threadIdx.x == 0) {
        s_prefix = 0;
        s_remaining = kk;
    }
    uint32_t mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        hist[threadIdx.x] = 0;
        __syncthreads();
        const uint32_t prefix = s_prefix;
        for (uint32_t w = threadIdx.x; w < n_valid; w += blockDim.x) {
            const uint32_t k = f2key(sc[w]);
            if ((k & mask) == prefix)
                atomicAdd(&hist[(k >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            uint32_t rem = s_remaining, above = 0;
            for (int d = 255; d >= 0; d--) {
                if (above + hist[d] >= rem) {
                    s_prefix = prefix | ((uint32_t)d << shift);
                    s_remaining = rem - above;
                    break;
                }
                above += hist[d];
            }
        }
        mask |= 255u << shift;
        __syncthreads();
    }
    const uint32_t thr = s_prefix, need_eq = s_remaining;
    uint32_t eq_seen = 0, n_out = 0;
    for (uint32_t c0 = 0; c0 < n_valid; c0 += blockDim.x) {
        const uint32_t w = c0 + threadIdx.x;
        const uint32_t k = w < n_valid ? f2key(sc[w]) : 0;
        const int eq = w < n_valid && k == thr;
        uint32_t n_eq = 0;
        const uint32_t er = block_rank(eq, &n_eq, wsum);
        const int take = w < n_valid && (k > thr || (eq && eq_seen + er < need_eq));
        uint32_t n_take = 0;
        const uint32_t tr = block_rank(take, &n_take, wsum);
        if (take)
            sel[n_out + tr] = w;
        eq_seen += n_eq;
        n_out += n_take;
    }
}

extern "C" tm_rc tm_k_dsv4_index(const tm_k_dsv4_index_args *a, cudaStream_t s, tm_err *err) {
    if (!a->n_tok)
        return TM_OK;
    const size_t smem = ((size_t)a->n_head * (a->di + 1) + IDX_WARPS * a->di + a->n_head) * 4;
    TM_ASSERT(smem <= 48 * 1024 && a->topk >= 1 && a->r >= 1 && a->sq.block_size % a->r == 0);
    index_kernel<<<a->n_tok, 256, smem, s>>>(*a);
    return tm_cuda_launched(err, s, "dsv4_index");
}

/* ---- attention ---- */

/* Block per (token, head); its ATT_WARPS warps take every ATT_WARPS-th key of the list (window
 * rows, then compressed rows) with their own online softmax, merged at the end with the sink. */
static __global__ void __launch_bounds__(32 * ATT_WARPS) attn_kernel(tm_k_dsv4_attn_args a) {
    __shared__ float wacc[ATT_WARPS][512];
    __shared__ float wm[ATT_WARPS], wl[ATT_WARPS];
    const uint32_t t = blockIdx.x, h = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const uint32_t hd = a.hd, ld = a.ld;
    const float *qh = a.q + ((size_t)t * a.H + h) * hd;
    float qv[ATT_MAX_J], acc[ATT_MAX_J];
    uint32_t eq[ATT_MAX_J], er[ATT_MAX_J];
    const uint32_t cps = a.r ? (hd + a.r - 1) / a.r : 1;
#pragma unroll
    for (int j = 0; j < ATT_MAX_J; j++) {
        const uint32_t e = lane + 32 * j;
        qv[j] = e < hd ? qh[e] : 0.0f;
        acc[j] = 0.0f;
        eq[j] = e / cps;
        er[j] = e % cps;
    }
    const float scale = 1.0f / sqrtf((float)hd);
    const uint32_t p = a.sq.pos[t], W = a.window;
    const uint32_t p0 = p + 1 > W ? p + 1 - W : 0, n_sl = p - p0 + 1;
    uint32_t n_c = 0;
    const uint32_t *sel = NULL;
    if (a.kind == 1) {
        n_c = a.n_sel[t];
        sel = a.sel + (size_t)t * a.topk;
    } else if (a.kind == 2) {
        n_c = (p + 1) / a.r;
    }
    float m = -INFINITY, l = 0.0f;
    for (uint32_t i = warp; i < n_sl + n_c; i += ATT_WARPS) {
        float kv[ATT_MAX_J], dot = 0.0f;
        if (i < n_sl) {
            const float *k = a.kv + (size_t)seq_slot(a.sq, t, p0 + i) * ld;
#pragma unroll
            for (int j = 0; j < ATT_MAX_J; j++) {
                const uint32_t e = lane + 32 * j;
                kv[j] = e < hd ? k[e] : 0.0f;
            }
        } else {
            const uint32_t w = sel ? sel[i - n_sl] : i - n_sl;
            const uint32_t base = seq_slot(a.sq, t, w * a.r);
#pragma unroll
            for (int j = 0; j < ATT_MAX_J; j++) {
                const uint32_t e = lane + 32 * j;
                kv[j] = e < hd ? a.comp[(size_t)(base + eq[j]) * ld + er[j]] : 0.0f;
            }
        }
#pragma unroll
        for (int j = 0; j < ATT_MAX_J; j++)
            dot += qv[j] * kv[j];
        const float sv = tm_warp_sum(dot) * scale;
        const float mn = fmaxf(m, sv), corr = expf(m - mn), pe = expf(sv - mn);
        l = l * corr + pe;
#pragma unroll
        for (int j = 0; j < ATT_MAX_J; j++)
            acc[j] = acc[j] * corr + pe * kv[j];
        m = mn;
    }
#pragma unroll
    for (int j = 0; j < ATT_MAX_J; j++) {
        const uint32_t e = lane + 32 * j;
        if (e < hd)
            wacc[warp][e] = acc[j];
    }
    if (lane == 0) {
        wm[warp] = m;
        wl[warp] = l;
    }
    __syncthreads();
    // merge: the sink joins the denominator (exp(sink - M)), every warp's part is rescaled
    const float sink = a.sinks[h];
    float M = sink;
    for (int w = 0; w < ATT_WARPS; w++)
        M = fmaxf(M, wm[w]);
    float L = expf(sink - M), f[ATT_WARPS];
    for (int w = 0; w < ATT_WARPS; w++) {
        f[w] = wl[w] > 0.0f ? expf(wm[w] - M) : 0.0f;
        L += wl[w] * f[w];
    }
    float *o = wacc[0]; // row 0 is overwritten in place: each element by its own thread
    for (uint32_t e = threadIdx.x; e < hd; e += blockDim.x) {
        float v = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++)
            v += wacc[w][e] * f[w];
        o[e] = v / L;
    }
    __syncthreads();
    const float pf = (float)p;
    for (uint32_t i = threadIdx.x; i < a.rd / 2; i += blockDim.x) {
        const uint32_t e = hd - a.rd + 2 * i;
        const float ang = pf * a.inv_freq[i];
        const float c = cosf(ang) * a.attn_factor, sn = -sinf(ang) * a.attn_factor;
        const float x0 = o[e], x1 = o[e + 1];
        o[e] = x0 * c - x1 * sn;
        o[e + 1] = x1 * c + x0 * sn;
    }
    __syncthreads();
    uint16_t *out = a.out + ((size_t)t * a.H + h) * hd;
    for (uint32_t e = threadIdx.x; e < hd; e += blockDim.x)
        out[e] = tm_f2bf(o[e]);
}

extern "C" tm_rc tm_k_dsv4_attn(const tm_k_dsv4_attn_args *a, cudaStream_t s, tm_err *err) {
    if (!a->n_tok)
        return TM_OK;
    TM_ASSERT(a->hd <= 32 * ATT_MAX_J && a->rd <= a->hd && a->window >= 1);
    TM_ASSERT(a->kind == 0 || (a->r >= 1 && a->sq.block_size % a->r == 0));
    const dim3 grid(a->n_tok, a->H);
    attn_kernel<<<grid, 32 * ATT_WARPS, 0, s>>>(*a);
    return tm_cuda_launched(err, s, "dsv4_attn");
}

/* ---- MoE ---- */

static __global__ void route_kernel(tm_k_dsv4_route_args a) {
    extern __shared__ float sc[]; // [2E]
    const uint32_t t = blockIdx.x, E = a.E, k = a.k;
    const float *lg = a.logits + (size_t)t * E;
    if (a.scoring == 2) {
        float mx = -INFINITY;
        for (uint32_t e = threadIdx.x; e < E; e += 256)
            mx = fmaxf(mx, lg[e]);
        mx = tm_block_max<256>(mx);
        float sum = 0.0f;
        for (uint32_t e = threadIdx.x; e < E; e += 256)
            sum += (sc[e] = expf(lg[e] - mx));
        sum = tm_block_sum<256>(sum);
        for (uint32_t e = threadIdx.x; e < E; e += 256)
            sc[e] /= sum;
    } else {
        for (uint32_t e = threadIdx.x; e < E; e += 256) {
            const float x = lg[e];
            sc[e] = a.scoring == 1 ? sigmoidf_(x) : sqrtf(x > 20.0f ? x : log1pf(expf(x)));
        }
    }
    __shared__ int32_t se[TM_DSV4_K_MAX_TOPK];
    float *v = sc + E; // [E] score + bias, -inf once taken
    __syncthreads();
    if (a.tid2eid) {
        for (uint32_t j = threadIdx.x; j < k; j += 256)
            se[j] = a.tid2eid[(size_t)a.tokens[t] * k + j];
    } else {
        for (uint32_t e = threadIdx.x; e < E; e += 256)
            v[e] = sc[e] + a.bias[e];
        __syncthreads();
        for (uint32_t j = 0; j < k; j++) { // the best untaken expert, lowest id on ties
            float bv;
            uint32_t bi;
            tm_block_argmax<256>(v, E, &bv, &bi);
            if (threadIdx.x == 0) {
                bi = bi < E ? bi : 0;
                se[j] = (int32_t)bi;
                v[bi] = -INFINITY;
            }
            __syncthreads();
        }
    }
    __syncthreads();
    if (threadIdx.x)
        return;
    float sw[TM_DSV4_K_MAX_TOPK], sum = 0.0f;
    for (uint32_t j = 0; j < k; j++)
        sum += (sw[j] = sc[se[j]]);
    for (uint32_t j = 0; j < k; j++) {
        const size_t pi = (size_t)t * k + j;
        a.pair_e[pi] = se[j];
        a.pair_row[pi] = t;
        a.pair_w[pi] = sw[j] / (sum + 1e-20f) * a.scale;
    }
}

extern "C" tm_rc tm_k_dsv4_route(const tm_k_dsv4_route_args *a, cudaStream_t s, tm_err *err) {
    if (!a->n_tok)
        return TM_OK;
    TM_ASSERT(a->k >= 1 && a->k <= TM_DSV4_K_MAX_TOPK && a->k <= a->E && (a->tid2eid || a->bias));
    TM_ASSERT(2 * a->E * sizeof(float) <= 48 * 1024);
    route_kernel<<<a->n_tok, 256, 2 * a->E * sizeof(float), s>>>(*a);
    return tm_cuda_launched(err, s, "dsv4_route");
}

static __global__ void moe_bf16_kernel(tm_k_dsv4_moe_bf16_args a) {
    extern __shared__ float xs[]; // [n_in]
    const uint32_t pr = blockIdx.x, n_in = a.n_in;
    const uint16_t *x = a.x + (size_t)a.pair_row[pr] * n_in;
    for (uint32_t i = threadIdx.x; i < n_in; i += blockDim.x)
        xs[i] = tm_bf2f(x[i]);
    __syncthreads();
    const uint32_t o = blockIdx.y * 8 + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (o >= a.n_out)
        return;
    const uint16_t *w = a.w + ((size_t)a.pair_e[pr] * a.n_out + o) * n_in;
    float acc = 0.0f;
    for (uint32_t i = 8 * lane; i < n_in; i += 256) {
        float wv[8];
        tm_load8_bf16(w + i, wv);
#pragma unroll
        for (int j = 0; j < 8; j++)
            acc += wv[j] * xs[i + j];
    }
    acc = tm_warp_sum(acc);
    if (lane == 0)
        a.out[(size_t)pr * a.n_out + o] = acc;
}

extern "C" tm_rc tm_k_dsv4_moe_bf16(const tm_k_dsv4_moe_bf16_args *a, cudaStream_t s, tm_err *err) {
    if (!a->n_pair)
        return TM_OK;
    TM_ASSERT(a->n_in % 8 == 0 && a->n_in * sizeof(float) <= 48 * 1024 && a->n_pair <= 0x7fffffffu);
    TM_ASSERT(((uintptr_t)a->w % 16) == 0 && ((uintptr_t)a->x % 16) == 0);
    const dim3 grid(a->n_pair, TM_CEIL_DIV(a->n_out, 8u));
    moe_bf16_kernel<<<grid, 256, a->n_in * sizeof(float), s>>>(*a);
    return tm_cuda_launched(err, s, "dsv4_moe_bf16");
}

static __global__ void swiglu_kernel(tm_k_dsv4_swiglu_args a) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)a.n_row * a.n)
        return;
    const size_t r = i / a.n, c = i % a.n, o = r * 2 * a.n + c;
    float g = a.gu[o], u = a.gu[o + a.n];
    for (uint32_t p = 1; p < a.n_part; p++) {
        g += a.gu[p * a.stride + o];
        u += a.gu[p * a.stride + o + a.n];
    }
    const float lim = a.limit;
    g = fminf(g, lim);
    u = fminf(fmaxf(u, -lim), lim);
    a.act[i] = tm_f2bf((g / (1.0f + expf(-g))) * u);
}

extern "C" tm_rc tm_k_dsv4_swiglu(const tm_k_dsv4_swiglu_args *a, cudaStream_t s, tm_err *err) {
    if (!a->n_row)
        return TM_OK;
    const size_t n = (size_t)a->n_row * a->n;
    swiglu_kernel<<<(unsigned)TM_CEIL_DIV(n, 256), 256, 0, s>>>(*a);
    return tm_cuda_launched(err, s, "dsv4_swiglu");
}

static __global__ void combine_kernel(tm_k_dsv4_combine_args a) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const uint32_t D = a.D, k = a.k;
    if (i >= (size_t)a.n_tok * D)
        return;
    const size_t t = i / D, d = i % D;
    uint32_t ord[TM_DSV4_K_MAX_TOPK];
    for (uint32_t j = 0; j < k; j++) { // insertion sort by (expert, j)
        uint32_t q = j;
        const int32_t ej = a.pair_e[t * k + j];
        while (q > 0 && a.pair_e[t * k + ord[q - 1]] > ej) {
            ord[q] = ord[q - 1];
            q--;
        }
        ord[q] = j;
    }
    float acc = 0.0f;
    for (uint32_t q = 0; q < k; q++) {
        const size_t pi = t * k + ord[q];
        float v = a.dn[pi * D + d];
        for (uint32_t pp = 1; pp < a.dn_part; pp++)
            v += a.dn[pp * a.dn_stride + pi * D + d];
        acc += v * a.pair_w[pi];
    }
    float sh = a.sh[i];
    for (uint32_t pp = 1; pp < a.sh_part; pp++)
        sh += a.sh[pp * a.sh_stride + i];
    a.y[i] = acc + sh;
}

extern "C" tm_rc tm_k_dsv4_combine(const tm_k_dsv4_combine_args *a, cudaStream_t s, tm_err *err) {
    if (!a->n_tok)
        return TM_OK;
    TM_ASSERT(a->k >= 1 && a->k <= TM_DSV4_K_MAX_TOPK && a->dn_part >= 1 && a->sh_part >= 1);
    const size_t n = (size_t)a->n_tok * a->D;
    combine_kernel<<<(unsigned)TM_CEIL_DIV(n, 256), 256, 0, s>>>(*a);
    return tm_cuda_launched(err, s, "dsv4_combine");
}

/* ---- the head ---- */

static __global__ void head_kernel(tm_k_dsv4_head_args a) {
    extern __shared__ float xs[]; // [D]
    __shared__ float m[TM_DSV4_K_MAX_HC], pre[TM_DSV4_K_MAX_HC];
    const uint32_t r = blockIdx.x, N = a.N, D = a.D, ND = N * D;
    const float *st = a.streams + (size_t)a.rows[r] * ND;
    if (threadIdx.x < N)
        m[threadIdx.x] = a.mixes[(size_t)r * N + threadIdx.x];
    __syncthreads();
    if (threadIdx.x < N)
        pre[threadIdx.x] = sigmoidf_(m[threadIdx.x] * a.scale[0] + a.base[threadIdx.x]) + a.hc_eps;
    __syncthreads();
    for (uint32_t d = threadIdx.x; d < D; d += 256) {
        float acc = 0.0f;
        for (uint32_t i = 0; i < N; i++)
            acc += pre[i] * st[(size_t)i * D + d];
        xs[d] = acc;
    }
    __syncthreads();
    norm_out<256>(xs, D, a.norm_w, a.eps, a.out + (size_t)r * D);
}

extern "C" tm_rc tm_k_dsv4_head(const tm_k_dsv4_head_args *a, cudaStream_t s, tm_err *err) {
    if (!a->n_row)
        return TM_OK;
    TM_ASSERT(a->N >= 1 && a->N <= TM_DSV4_K_MAX_HC && a->D * sizeof(float) <= 48 * 1024);
    hc_dot_kernel<<<dim3(a->n_row, a->N), 256, 0, s>>>(
        a->streams, a->rows, a->fn, a->N, a->N * a->D, a->eps, a->mixes, 1, NULL, NULL);
    head_kernel<<<a->n_row, 256, a->D * sizeof(float), s>>>(*a);
    return tm_cuda_launched(err, s, "dsv4_head");
}

static __global__ void sum_kernel(tm_k_dsv4_sum_args a) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= a.n)
        return;
    float v = a.part[i];
    for (uint32_t p = 1; p < a.n_part; p++)
        v += a.part[p * a.stride + i];
    a.y[i] = v;
}

extern "C" tm_rc tm_k_dsv4_sum(const tm_k_dsv4_sum_args *a, cudaStream_t s, tm_err *err) {
    if (!a->n)
        return TM_OK;
    sum_kernel<<<(unsigned)TM_CEIL_DIV(a->n, (size_t)256), 256, 0, s>>>(*a);
    return tm_cuda_launched(err, s, "dsv4_sum");
}
