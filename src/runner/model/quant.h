/* runner/model/quant.h - quantized checkpoints: the quantization_config of config.json (and
 * DeepSeek-V4's expert_dtype) parsed into tm_quant_cfg, and the binding of one linear weight
 * together with its scale tensor into a quantized tm_tensor view (runner/model/tensor.h),
 * checked as strictly as a plain weight. The formats, names and rules are in
 * docs/quantization.md. Pure functions; any thread. Views borrow the safetensors mappings. */
#ifndef TM_RUNNER_MODEL_QUANT_H
#define TM_RUNNER_MODEL_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "runner/model/tensor.h"

typedef enum tm_qmethod {
    TM_QMETHOD_NONE = 0,
    TM_QMETHOD_FP8,   /* transformers / DeepSeek quant_method "fp8": weight_scale_inv */
    TM_QMETHOD_CT,    /* quant_method "compressed-tensors", float 8-bit weights: weight_scale */
    TM_QMETHOD_DSREF, /* DeepSeek's reference inference names (V4.1): the scale of <m>.weight is
                       * <m>.scale; set by model_dsv41.c, never parsed from a quantization_config */
} tm_qmethod;

typedef enum tm_qact {
    TM_QACT_NONE = 0, /* weight-only */
    TM_QACT_DYNAMIC,  /* activations quantized per token at run time */
    TM_QACT_STATIC,   /* activations quantized with the checkpoint's input_scale */
} tm_qact;

typedef struct tm_quant_cfg {
    uint8_t method;      /* tm_qmethod */
    uint8_t weight;      /* tm_quant of an F8_E4M3 dense weight: FP8_BLOCK, _CHANNEL or _TENSOR */
    uint8_t scale_dtype; /* TM_QMETHOD_FP8: F32, or F8_E8M0 when scale_fmt is "ue8m0" */
    uint8_t act;         /* tm_qact (the CPU reference computes activations in fp32 whatever this
                          * says; static input scales are checked, not applied) */
    uint8_t expert;      /* DeepSeek-V4 expert_dtype: TM_QUANT_MXFP4 ("fp4"), TM_QUANT_FP8_BLOCK
                          * ("fp8"), or TM_QUANT_NONE (absent: the experts are stored like the
                          * dense weights) */
    uint32_t block[2];   /* weight_block_size (FP8_BLOCK), e.g. 128 x 128 */
} tm_quant_cfg;

/* Parse config.json's quantization_config (root: a json_t object; absent or null: *q is all
 * zero, TM_QMETHOD_NONE) and the DeepSeek-V4 expert_dtype (top level or inside
 * quantization_config; only when dsv4). Errors: TM_E_PARSE for malformed fields, TM_E_INVAL for
 * well-formed but unsupported ones (another quant_method, fmt, scale_fmt, num_bits, type,
 * strategy, activation scheme, several config groups), each naming the field. */
tm_rc tm_quant_cfg_parse(void *root, int dsv4, tm_quant_cfg *q, tm_err *err);

/* The role of a weight in the checkpoint, which decides the formats it may take. */
typedef enum tm_qrole {
    TM_QROLE_DENSE = 0, /* a Linear: plain, or F8_E4M3 with q's scale */
    TM_QROLE_EXPERT,    /* DeepSeek-V4 stacked routed experts [E][out][in]: as q->expert says */
} tm_qrole;

/* Bind the weight called name of logical shape want[0..n_dim) from st into *t (zeroed first):
 * a float tensor of exactly that shape with no scale tensor beside it, or a quantized one (an
 * F8_E4M3 tensor of that shape, or for MXFP4 experts an I8/U8 tensor [.., in/2]) with its scale
 * (name + "_scale_inv" for quant_method fp8, name + "_scale" for compressed-tensors) of the
 * dtype and grid shape the scheme fixes (TM_QMETHOD_DSREF: name's ".weight" replaced by ".scale").
 * TM_E_PARSE names the tensor and the rule. */
struct tm_st_set;
tm_rc tm_quant_bind(const struct tm_st_set *st, const tm_quant_cfg *q, const char *name,
                    tm_qrole role, uint32_t n_dim, const uint64_t *want, tm_tensor *t, tm_err *err);

/* Quantize one row v[0..n) to FP8 e4m3 with one scale, the per-channel rule of
 * docs/quantization.md (the same as mkmodel --quant fp8-channel, llm-compressor's static FP8
 * weights and vLLM's dynamic fp8): s = max|v| / 448 in fp32 (NaNs ignored; an all-zero row gets
 * s = 1), then q[i] = e4m3(v[i] / s), the quotient in fp32 and rounded to nearest even
 * (tm_f32_to_e4m3). Returns s; it is not finite (or 0) only if v holds an infinity (or only
 * values below 448 * 2^-149), which the caller must refuse. */
float tm_quant_fp8_row(const float *v, size_t n, uint8_t *q);

#endif /* TM_RUNNER_MODEL_QUANT_H */
