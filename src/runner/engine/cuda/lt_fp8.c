/* runner/engine/cuda/lt_fp8.c - cuBLASLt W8A8 FP8 GEMMs for prefill (see lt_fp8.h).
 *
 * Row-major [T][n_out] = x [T][n_in] @ w[n_out][n_in]^T is, in cuBLASLt's column-major terms,
 * D (n_out x T, ld n_out) = op(A) B with A = w (n_in x n_out, ld n_in, op T) and B = x (n_in x T,
 * ld n_in, op N): the "TN" layout FP8 tensor cores need. A's scale is the weight's, B's the
 * activations'. */
#include "runner/engine/cuda/lt_fp8.h"

#include <string.h>

#include <cublasLt.h>

#include "base/alloc.h"

typedef struct lt_plan {
    uint32_t n_tok, n_in, n_out;
    int mode, beta_one, used;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
    uint64_t stamp;
} lt_plan;

struct tm_lt_fp8 {
    cublasLtHandle_t h;
    cudaStream_t s;
    void *ws;
    size_t ws_bytes;
    lt_plan plans[TM_LT_FP8_PLANS];
    uint64_t clock;
};

static tm_rc lt_check(cublasStatus_t st, const char *what, tm_err *err) {
    if (st == CUBLAS_STATUS_SUCCESS)
        return TM_OK;
    return TM_ERR(err, TM_E_CUDA, "cuda engine: %s: %s", what, cublasGetStatusString(st));
}

tm_rc tm_lt_fp8_create(cudaStream_t s, void *ws, size_t ws_bytes, tm_lt_fp8 **out, tm_err *err) {
    tm_lt_fp8 *lt = tm_calloc(1, sizeof(*lt));
    if (!lt)
        return TM_ERR(err, TM_E_NOMEM, "cuda engine: cuBLASLt state");
    tm_rc rc = lt_check(cublasLtCreate(&lt->h), "cublasLtCreate", err);
    if (rc) {
        tm_free(lt);
        return rc;
    }
    lt->s = s, lt->ws = ws, lt->ws_bytes = ws_bytes;
    *out = lt;
    return TM_OK;
}

static void plan_free(lt_plan *p) {
    if (!p->used)
        return;
    cublasLtMatmulDescDestroy(p->op);
    cublasLtMatrixLayoutDestroy(p->a);
    cublasLtMatrixLayoutDestroy(p->b);
    cublasLtMatrixLayoutDestroy(p->d);
    memset(p, 0, sizeof(*p));
}

void tm_lt_fp8_destroy(tm_lt_fp8 *lt) {
    if (!lt)
        return;
    for (int i = 0; i < TM_LT_FP8_PLANS; i++)
        plan_free(&lt->plans[i]);
    cublasLtDestroy(lt->h);
    tm_free(lt);
}

int tm_lt_fp8_fits(tm_lt_fp8_mode mode, uint32_t n_in, uint32_t n_out) {
    if (mode == TM_LT_FP8_BLOCK)
        return n_in % 128 == 0 && n_out % 128 == 0 && (n_in / 128) % 4 == 0;
    return n_in % 16 == 0 && n_out % 16 == 0;
}

/* A new plan for the shape in *p (p->used set on success). */
static tm_rc plan_make(tm_lt_fp8 *lt, lt_plan *p, int mode, uint32_t n_tok, uint32_t n_in,
                       uint32_t n_out, int beta_one, tm_err *err) {
    memset(p, 0, sizeof(*p));
    tm_rc rc = lt_check(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                        "cublasLtMatmulDescCreate", err);
    if (rc)
        return rc;
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    const int32_t sm = mode == TM_LT_FP8_BLOCK ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                                               : CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    const int32_t smb = mode == TM_LT_FP8_BLOCK ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
                                                : CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    cublasStatus_t st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta,
                                                       sizeof(ta));
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &sm,
                                            sizeof(sm));
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &smb,
                                            sizeof(smb));
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatrixLayoutCreate(&p->a, CUDA_R_8F_E4M3, n_in, n_out, n_in);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatrixLayoutCreate(&p->b, CUDA_R_8F_E4M3, n_in, n_tok, n_in);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatrixLayoutCreate(&p->d, CUDA_R_32F, n_out, n_tok, n_out);
    cublasLtMatmulPreference_t pref = NULL;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceCreate(&pref);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &lt->ws_bytes, sizeof(lt->ws_bytes));
    cublasLtMatmulHeuristicResult_t res;
    int n_res = 0;
    if (st == CUBLAS_STATUS_SUCCESS) {
        // the scale pointers are part of what the heuristic checks: any non-NULL values
        static const float dummy = 1.0f;
        const void *sp = &dummy;
        cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sp,
                                       sizeof(sp));
        cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sp,
                                       sizeof(sp));
        st = cublasLtMatmulAlgoGetHeuristic(lt->h, p->op, p->a, p->b, p->d, p->d, pref, 1, &res,
                                            &n_res);
    }
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    p->used = 1; // so that plan_free releases what was made
    if (st == CUBLAS_STATUS_SUCCESS && n_res == 0)
        st = CUBLAS_STATUS_NOT_SUPPORTED;
    if (st != CUBLAS_STATUS_SUCCESS) {
        plan_free(p);
        return TM_ERR(err, TM_E_CUDA, "cuda engine: cuBLASLt FP8 %s GEMM %u x %u x %u: %s",
                      mode == TM_LT_FP8_BLOCK ? "block-scaled" : "row-scaled", n_tok, n_in, n_out,
                      cublasGetStatusString(st));
    }
    p->algo = res.algo;
    p->n_tok = n_tok, p->n_in = n_in, p->n_out = n_out, p->mode = mode, p->beta_one = beta_one;
    return TM_OK;
}

static tm_rc plan_get(tm_lt_fp8 *lt, int mode, uint32_t n_tok, uint32_t n_in, uint32_t n_out,
                      int beta_one, lt_plan **out, tm_err *err) {
    lt_plan *victim = &lt->plans[0];
    for (int i = 0; i < TM_LT_FP8_PLANS; i++) {
        lt_plan *p = &lt->plans[i];
        if (p->used && p->mode == mode && p->n_tok == n_tok && p->n_in == n_in &&
            p->n_out == n_out && p->beta_one == beta_one) {
            p->stamp = ++lt->clock;
            *out = p;
            return TM_OK;
        }
        if (!p->used ? victim->used : (victim->used && p->stamp < victim->stamp))
            victim = p;
    }
    plan_free(victim);
    tm_rc rc = plan_make(lt, victim, mode, n_tok, n_in, n_out, beta_one, err);
    if (rc)
        return rc;
    victim->stamp = ++lt->clock;
    *out = victim;
    return TM_OK;
}

tm_rc tm_lt_fp8_gemm(tm_lt_fp8 *lt, tm_lt_fp8_mode mode, const uint8_t *w, const float *w_scale,
                     const uint8_t *xq, const float *x_scale, uint32_t n_tok, uint32_t n_in,
                     uint32_t n_out, float *dst, float beta, tm_err *err) {
    if (n_tok == 0)
        return TM_OK;
    n_tok = TM_LT_FP8_TOK(n_tok);
    lt_plan *p = NULL;
    tm_rc rc = plan_get(lt, mode, n_tok, n_in, n_out, beta != 0.0f, &p, err);
    if (rc)
        return rc;
    cublasStatus_t st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                       &w_scale, sizeof(w_scale));
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scale,
                                            sizeof(x_scale));
    const float alpha = 1.0f;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmul(lt->h, p->op, &alpha, w, p->a, xq, p->b, &beta, dst, p->d, dst, p->d,
                            &p->algo, lt->ws, lt->ws_bytes, lt->s);
    return lt_check(st, "cublasLtMatmul (FP8)", err);
}

int tm_lt_fp8_probe(tm_lt_fp8 *lt, tm_lt_fp8_mode mode, uint32_t n_tok, uint32_t n_in,
                    uint32_t n_out, tm_err *err) {
    lt_plan *p = NULL;
    n_tok = TM_LT_FP8_TOK(n_tok);
    return plan_get(lt, mode, n_tok, n_in, n_out, 0, &p, err) == TM_OK &&
           plan_get(lt, mode, n_tok, n_in, n_out, 1, &p, err) == TM_OK;
}
