/* runner/engine/cpu/dsv_common.c - the DeepSeek-V4 / V4.1 shared math (dsv_common.h). */
#include "runner/engine/cpu/dsv_common.h"

#include <math.h>
#include <string.h>

#include "base/alloc.h"
#include "runner/model/tensor.h"

static float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

void tm_dsv_hc_split(const float *m, const float *scale, const float *base, uint32_t N,
                     uint32_t iters, float eps, float *pre, float *post, float *cb) {
    for (uint32_t i = 0; i < N; i++) {
        pre[i] = sigmoidf_(m[i] * scale[0] + base[i]) + eps;
        post[i] = 2.0f * sigmoidf_(m[N + i] * scale[1] + base[N + i]);
    }
    // comb[j][k]: softmax over k, + eps, then Sinkhorn: column, then (row, column) x iters-1.
    for (uint32_t j = 0; j < N; j++) {
        float *row = cb + j * N, mx = -INFINITY, sum = 0.0f;
        for (uint32_t k = 0; k < N; k++) {
            row[k] = m[2 * N + j * N + k] * scale[2] + base[2 * N + j * N + k];
            mx = fmaxf(mx, row[k]);
        }
        for (uint32_t k = 0; k < N; k++) {
            row[k] = expf(row[k] - mx);
            sum += row[k];
        }
        for (uint32_t k = 0; k < N; k++)
            row[k] = row[k] / sum + eps;
    }
    for (uint32_t it = 0; it < iters; it++) {
        if (it > 0) {
            for (uint32_t j = 0; j < N; j++) {
                float sum = 0.0f;
                for (uint32_t k = 0; k < N; k++)
                    sum += cb[j * N + k];
                for (uint32_t k = 0; k < N; k++)
                    cb[j * N + k] /= sum + eps;
            }
        }
        for (uint32_t k = 0; k < N; k++) {
            float sum = 0.0f;
            for (uint32_t j = 0; j < N; j++)
                sum += cb[j * N + k];
            for (uint32_t j = 0; j < N; j++)
                cb[j * N + k] /= sum + eps;
        }
    }
}

void tm_dsv_rope_head(float *x, uint32_t hd, uint32_t rd, const float *cs, const float *sn,
                      float sign) {
    float *r = x + hd - rd;
    for (uint32_t i = 0; i < rd / 2; i++) {
        float c = cs[i], s = sign * sn[i];
        float a = r[2 * i], b = r[2 * i + 1];
        r[2 * i] = a * c - b * s;
        r[2 * i + 1] = b * c + a * s;
    }
}

int tm_dsv_col_slice(const tm_tensor *t, uint64_t c0, uint64_t n, tm_tensor *out) {
    const uint64_t C = t->shape[t->n_dim - 1], rows = tm_tensor_n_elem(t) / C;
    memset(out, 0, sizeof(*out));
    float *buf = tm_malloc((size_t)(rows * n) * sizeof(float));
    float *row = tm_malloc((size_t)C * sizeof(float));
    if (!buf || !row) {
        tm_free(buf);
        tm_free(row);
        return 1;
    }
    for (uint64_t r = 0; r < rows; r++) {
        tm_tensor_row_f32(t, (size_t)r, row);
        memcpy(buf + r * n, row + c0, (size_t)n * sizeof(float));
    }
    tm_free(row);
    out->data = buf;
    out->dtype = TM_DTYPE_F32;
    out->n_dim = t->n_dim;
    memcpy(out->shape, t->shape, sizeof(out->shape));
    out->shape[t->n_dim - 1] = n;
    return 0;
}
