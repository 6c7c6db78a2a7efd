/* runner/tp/shard_quant.c - slices of FP8 block-scaled and MXFP4 weights in their stored form
 * (runner/tp/shard_quant.h). */
#include "runner/tp/shard_quant.h"

#include <string.h>

tm_rc tm_shard_fp8_block_put(tm_shard_put_fn put, uint8_t *w, void *scale, int e8, size_t qrow,
                             const tm_tensor *t, size_t r0, size_t nr, size_t c0, size_t nc,
                             uint8_t *hb, float *fb, size_t stage_bytes, tm_err *err) {
    const size_t C = t->shape[1], gc = TM_CEIL_DIV(C, (size_t)128);
    TM_ASSERT(t->n_dim == 2 && t->quant == TM_QUANT_FP8_BLOCK && t->dtype == TM_DTYPE_F8_E4M3);
    TM_ASSERT(t->qblock[0] == 128 && t->qblock[1] == 128 &&
              (t->scale_dtype == TM_DTYPE_F8_E8M0) == !!e8);
    TM_ASSERT(r0 % 128 == 0 && c0 % 128 == 0 && qrow % 128 == 0);
    TM_ASSERT(nc > 0 && r0 + nr <= t->shape[0] && c0 + nc <= C && nc <= stage_bytes);
    const size_t sr0 = r0 / 128, nsr = TM_CEIL_DIV(nr, (size_t)128), sc0 = c0 / 128,
                 nsc = TM_CEIL_DIV(nc, (size_t)128);
    TM_ASSERT(nsr * nsc <= stage_bytes);
    const uint8_t *src = t->data;
    const size_t per = stage_bytes / nc;
    tm_rc rc = TM_OK;
    for (size_t i = 0; !rc && i < nr; i += per) { // codes, in batches of rows
        const size_t k = TM_MIN(per, nr - i);
        for (size_t j = 0; j < k; j++)
            memcpy(hb + j * nc, src + (r0 + i + j) * C + c0, nc);
        rc = put(w + (qrow + i) * nc, hb, k * nc, err);
    }
    for (size_t i = 0; !rc && i < nsr; i++) { // the scale blocks covering the slice
        if (e8)
            memcpy(hb + i * nsc, (const uint8_t *)t->scale + (sr0 + i) * gc + sc0, nsc);
        else
            tm_dtype_to_f32(t->scale, (tm_dtype)t->scale_dtype, (sr0 + i) * gc + sc0, nsc,
                            fb + i * nsc);
    }
    const size_t s0 = qrow / 128 * nsc;
    if (!rc && e8)
        rc = put((uint8_t *)scale + s0, hb, nsr * nsc, err);
    else if (!rc)
        rc = put((float *)scale + s0, fb, nsr * nsc * sizeof(float), err);
    return rc;
}

tm_rc tm_shard_mxfp4_experts_put(tm_shard_put_fn put, uint8_t *gu_w, uint8_t *gu_s, uint8_t *dn_w,
                                 uint8_t *dn_s, const tm_tensor *gate_up, const tm_tensor *down,
                                 size_t f0, size_t n, uint8_t *hb, size_t stage_bytes,
                                 tm_err *err) {
    TM_ASSERT(gate_up->n_dim == 3 && down->n_dim == 3 && gate_up->quant == TM_QUANT_MXFP4 &&
              down->quant == TM_QUANT_MXFP4);
    const size_t E = gate_up->shape[0], I = gate_up->shape[1] / 2, D = gate_up->shape[2];
    TM_ASSERT(down->shape[0] == E && down->shape[1] == D && down->shape[2] == I);
    TM_ASSERT(f0 % 32 == 0 && n % 32 == 0 && n > 0 && D % 32 == 0 && f0 + n <= I);
    TM_ASSERT(n / 2 <= stage_bytes);
    const uint8_t *gw = gate_up->data, *gs = gate_up->scale;
    const uint8_t *dw = down->data, *ds = down->scale;
    tm_rc rc = TM_OK;
    for (size_t e = 0; !rc && e < E; e++)
        for (size_t h = 0; !rc && h < 2; h++) { // gate rows, then up rows: contiguous, whole
            const size_t from = e * 2 * I + h * I + f0, to = (e * 2 + h) * n;
            rc = put(gu_w + to * D / 2, gw + from * D / 2, n * D / 2, err);
            if (!rc)
                rc = put(gu_s + to * D / 32, gs + from * D / 32, n * D / 32, err);
        }
    const size_t rows = E * D, wb = n / 2, sb = n / 32;
    const size_t per = stage_bytes / wb, sper = stage_bytes / sb;
    for (size_t r = 0; !rc && r < rows; r += per) { // down: the codes of columns [f0, f0 + n)
        const size_t k = TM_MIN(per, rows - r);
        for (size_t j = 0; j < k; j++)
            memcpy(hb + j * wb, dw + (r + j) * (I / 2) + f0 / 2, wb);
        rc = put(dn_w + r * wb, hb, k * wb, err);
    }
    for (size_t r = 0; !rc && r < rows; r += sper) { // and their scales
        const size_t k = TM_MIN(sper, rows - r);
        for (size_t j = 0; j < k; j++)
            memcpy(hb + j * sb, ds + (r + j) * (I / 32) + f0 / 32, sb);
        rc = put(dn_s + r * sb, hb, k * sb, err);
    }
    return rc;
}
