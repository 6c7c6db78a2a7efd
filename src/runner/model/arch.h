/* runner/model/arch.h - the per-architecture table of the model loader. tm_model_load
 * (runner/model/model.c) knows config.json, generation_config.json, the safetensors set and the
 * checks every architecture shares; everything that depends on the architecture is one
 * tm_arch_ops and the file behind it: the Llama family (Llama, Qwen2, Mistral) in
 * runner/model/model_llama.c, DeepSeek-V4 in runner/model/model_dsv4.c. The registry is
 * TM_ARCH_LIST (runner/model/model_types.h): an architecture is one line there plus its ops.
 *
 * Contract with the loader (in call order): config.json's architectures[0] (else model_type) picks
 * the ops by hf_class (name); the loader zeroes the cfg and sets cfg.arch; config_parse fills the
 * rest and makes arch_w; tm_quant_cfg_parse reads quantization_config (quant_experts); the loader
 * allocates cfg.n_layer tm_layer_w and opens the safetensors; bind binds every weight; destroy
 * frees arch_w at tm_model_destroy (also after a failed load; NULL is a no-op). The tables are
 * constant; any thread. Sharding for tensor parallel is the engines' part (their own per-arch
 * tables, runner/tp/shard.h), not the loader's. */
#ifndef TM_RUNNER_MODEL_ARCH_H
#define TM_RUNNER_MODEL_ARCH_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "runner/model/model_types.h"

struct tm_st_set;

typedef struct tm_arch_ops {
    const char *name;     /* model_type and tm_model_arch_name: "llama" */
    const char *hf_class; /* config.json architectures[0]: "LlamaForCausalLM" */
    const char *title;    /* for messages: "Llama", "DeepSeek-V4" */
    /* 1: tm_model_cfg and tm_layer_w describe all of its weights (the Llama family):
     * tm_model_cfg_load, tm_model_check_weights and tm_model_quantize_fp8 take it. 0: its
     * weights are in arch_w. */
    int llama_shape;
    /* With llama_shape 0: why tm_model_quantize_fp8 refuses it (the message's parenthesis). */
    const char *no_fp8_at_load;
    int quant_experts; /* tm_quant_cfg_parse's dsv4 argument: it has routed experts */
    /* Fill c (zeroed, c->arch set) from config.json (root, a json_t object) and
     * generation_config.json (gen, NULL when absent), and make *arch_w (NULL if the architecture
     * has no own part). Messages name the file and the field. TM_E_PARSE, TM_E_INVAL (valid but
     * unsupported), TM_E_NOMEM. */
    tm_rc (*config_parse)(void *root, void *gen, tm_model_cfg *c, void **arch_w, tm_err *err);
    /* Bind every weight of m from st (m->cfg parsed, m->arch_w made, m->layers allocated),
     * checking each shape against the config. TM_E_PARSE names the tensor. */
    tm_rc (*bind)(tm_model *m, const struct tm_st_set *st, tm_err *err);
    /* 1 if any weight of m is quantized. */
    int (*is_quantized)(const tm_model *m);
    /* Optional (NULL: never). 1 if m's checkpoint has a drafter for speculative decoding (an MTP
     * layer). */
    int (*has_drafter)(const tm_model *m);
    void (*destroy)(void *arch_w); /* frees what config_parse made; NULL is a no-op */
} tm_arch_ops;

/* The ops of every architecture (TM_ARCH_LIST); each file defines its own. */
#define TM_ARCH_DECL(e, name, ops) extern const tm_arch_ops ops;
TM_ARCH_LIST(TM_ARCH_DECL)
#undef TM_ARCH_DECL

/* The ops of arch, or NULL outside the enum. */
const tm_arch_ops *tm_arch_ops_get(tm_arch arch);
/* The architecture whose hf_class (by_class 1) or name (0) is s; -1 if none. */
int tm_arch_find(const char *s, int by_class);
/* "LlamaForCausalLM, Qwen2ForCausalLM, ..." (by_class 1) or "llama, qwen2, ..." into buf. */
void tm_arch_list_names(char *buf, size_t cap, int by_class);

/* ---- pieces the hooks share: config.json fields ----
 * obj is a json_t object (NULL reads as empty); file and key name the field in messages
 * ("<file>: missing <key>", "<file>: <key> is not an integer", ...), all TM_E_PARSE. */

/* Integer in [lo, hi]. Missing or null: *out = def, or an error if required. */
tm_rc tm_arch_cfg_u32(const void *obj, const char *file, const char *key, int required,
                      uint32_t def, uint32_t lo, uint32_t hi, uint32_t *out, tm_err *err);
/* Finite number (integer or real). Missing or null: *out = def, or an error if required. */
tm_rc tm_arch_cfg_num(const void *obj, const char *file, const char *key, int required, double def,
                      double *out, tm_err *err);
/* Boolean. Missing or null: *out = def. */
tm_rc tm_arch_cfg_bool(const void *obj, const char *file, const char *key, int def, int *out,
                       tm_err *err);
/* c->bos_id and c->eos_ids/n_eos (c->n_vocab set, n_eos 0) from bos_token_id and eos_token_id
 * (each an integer or a list of them below n_vocab) of root ("config.json") and gen
 * ("generation_config.json", may be NULL): bos_id is -1 unless given, the first one found wins;
 * the eos ids are the union, first seen first (at most TM_MODEL_MAX_EOS: "too many eos ids"). */
tm_rc tm_arch_cfg_token_ids(const void *root, const void *gen, tm_model_cfg *c, tm_err *err);

#endif /* TM_RUNNER_MODEL_ARCH_H */
