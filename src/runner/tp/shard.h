/* runner/tp/shard.h - the tensor-parallel shard of a Llama-family model for one rank, as
 * every TP engine splits it: query heads split evenly; KV heads split evenly, or, with fewer KV
 * heads than ranks, each rank keeps the one KV head its query heads read (replicated); MLP
 * gate/up rows and down columns split evenly; embedding and LM head split by vocabulary rows
 * (vocab-parallel: ranks [vocab0, vocab0 + n_vocab) of the shard's cfg). Norms are replicated.
 * Row slices are views into the full model's mappings; o_proj and down_proj column slices are
 * owned copies. The partial outputs of o_proj, down_proj and the embedding are summed across
 * ranks (all-reduce) by the engine. */
#ifndef TM_RUNNER_TP_SHARD_H
#define TM_RUNNER_TP_SHARD_H

#include <stdint.h>

#include "base/err.h"
#include "runner/model/model.h"

/* Build rank's shard of full (borrowed; must outlive the shard). Its cfg has the shard's head,
 * KV head, n_ff and n_vocab counts; *vocab0 is its first vocabulary row. TM_E_INVAL when the
 * model does not split tp ways (n_head % tp, n_ff % tp, n_kv_head vs tp). On success *out owns
 * the shard; free it with tm_cpu_shard_destroy. */
tm_rc tm_cpu_shard_create(const tm_model *full, uint32_t rank, uint32_t tp, tm_model **out,
                          uint32_t *vocab0, tm_err *err);
void tm_cpu_shard_destroy(tm_model *shard); /* NULL is a no-op */

#endif /* TM_RUNNER_TP_SHARD_H */
