/* runner/model/dsv41_dspark.h - the DeepSeek-V4.1 DSpark drafter's weights and config (the
 * reference's DSparkBlock stages, stored under mtp.<k>.*): n_mtp_layers Blocks (hyper-connections,
 * a sliding-window attention with compress ratio 0, an MoE with dspark_n_routed_experts /
 * dspark_n_activated_experts when set), stage 0's main_proj [dim][dim * n_target] + main_norm,
 * the last stage's norm, Markov head (embed [vocab][rank], head [vocab][rank]) and confidence
 * head (proj [1][dim + rank]); the token embedding and the LM head are the backbone's (the
 * reference ties them). docs/speculative.md "DSpark" has the math. Immutable after load. */
#ifndef TM_RUNNER_MODEL_DSV41_DSPARK_H
#define TM_RUNNER_MODEL_DSV41_DSPARK_H

#include <stdint.h>

#include "base/err.h"
#include "runner/model/model_dsv41.h"

typedef struct tm_dsv41_dspark {
    uint32_t n_stage, block_size, n_target, rank, n_experts, n_active, noise_id;
    tm_dsv41_layer *stages; /* owned, [n_stage]: only the fields a ratio-0, non-Engram layer has */
    tm_tensor main_proj, main_norm;      /* [dim][dim * n_target] (FP8 when dtype fp8), [dim] */
    tm_tensor norm;                      /* [dim] */
    tm_tensor markov_embed, markov_head; /* [vocab][rank] each */
    tm_tensor conf_proj;                 /* [1][dim + rank] */
} tm_dsv41_dspark;

/* Read the DSpark fields of config.json (reference names: root is the ModelArgs object) into d
 * after the rest of it: dspark_target_layer_ids, and with dspark_block_size > 0 the checks that
 * the stages exist (n_mtp_layers >= 1), have compress_ratios entries of 0, name backbone target
 * layers and a rank >= 1, each refusal naming the field (TM_E_PARSE / TM_E_INVAL). */
tm_rc tm_dsv41_dspark_cfg(void *root, tm_dsv41_cfg *d, tm_err *err);
/* Bind the stages mtp.0 .. mtp.<n_mtp_layers - 1> from st (d->dspark_block_size > 0); *out owned
 * by the caller (tm_dsv41_dspark_destroy). TM_E_PARSE names a missing or misshaped tensor. */
struct tm_st_set;
tm_rc tm_dsv41_dspark_bind(const struct tm_st_set *st, const tm_dsv41_cfg *d, tm_dsv41_dspark **out,
                           tm_err *err);
void tm_dsv41_dspark_destroy(tm_dsv41_dspark *p); /* NULL is a no-op */

#endif /* TM_RUNNER_MODEL_DSV41_DSPARK_H */
