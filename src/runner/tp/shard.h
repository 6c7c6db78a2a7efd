/* runner/tp/shard.h - the tensor-parallel shard of a Llama-family model for one rank, as
 * every TP engine (CPU and CUDA) splits it: query heads split evenly; KV heads split evenly, or,
 * with fewer KV heads than ranks, each rank keeps the one KV head its query heads read
 * (replicated); MLP gate/up rows and down columns split evenly; embedding and LM head split by
 * vocabulary rows (vocab-parallel: rows [vocab0, vocab0 + n_vocab) of the shard's cfg, v_per rows
 * per rank, the last rank fewer). Norms are replicated. The split itself (tm_shard_split_init) is
 * the one definition of those counts; tm_shard_create slices the weights by it: row slices are
 * views into the full model's mappings, o_proj and down_proj column slices are owned copies. The
 * partial outputs of o_proj, down_proj and the embedding are summed across ranks (all-reduce) by
 * the engine. Pure functions of their inputs; any thread. */
#ifndef TM_RUNNER_TP_SHARD_H
#define TM_RUNNER_TP_SHARD_H

#include <stdint.h>

#include "base/err.h"
#include "runner/model/model.h"

/* One rank's part of the split. */
typedef struct tm_shard_split {
    tm_model_cfg cfg; /* the full cfg with the shard's n_head, n_kv_head, n_ff and n_vocab (this
                         rank's vocabulary rows; 0 when the vocabulary is smaller than the ranks
                         need); every other field as the full model's */
    uint32_t kv0;     /* first KV head of the full model this rank keeps */
    uint32_t vocab0;  /* first vocabulary row of this rank, at most the full n_vocab */
    uint32_t v_per;   /* vocabulary rows per rank: ceil(n_vocab / tp) */
} tm_shard_split;

/* Fill *out with rank's part of the split of c tp ways. who starts the messages ("tp shard").
 * TM_E_INVAL when tp is 0 or rank >= tp ("<who>: rank R of TP") or the model does not split tp
 * ways (n_head % tp, n_ff % tp, n_kv_head neither dividing nor divided by tp). */
tm_rc tm_shard_split_init(tm_shard_split *out, const tm_model_cfg *c, uint32_t rank, uint32_t tp,
                          const char *who, tm_err *err);

/* One rank's part of the DeepSeek-V4 split (docs/deepseek_v4.md "Tensor parallel"), as the CPU
 * engine (runner/engine/cpu/dsv4.c) applies it and the CUDA engine is to: query heads
 * [h0, h0 + n_head) with their sinks; output groups [g0, g0 + n_group) (o_a rows
 * [g0 * o_lora, ...), o_b columns the same range); channels [f0, f0 + n_ff) of every expert's
 * width (routed gate/up rows and down columns, the shared expert's likewise); vocabulary rows as
 * tm_shard_split. The single KV head, compressor, indexer, router and hyper-connections are
 * replicated. */
typedef struct tm_shard_dsv4 {
    uint32_t h0, n_head;
    uint32_t g0, n_group;
    uint32_t f0, n_ff;
    uint32_t vocab0, n_vocab; /* n_vocab 0 when the vocabulary is smaller than the ranks need */
} tm_shard_dsv4;

/* Fill *out with rank's DeepSeek-V4 split of c (n_head, n_ff = moe_intermediate_size, n_vocab)
 * with o_groups output groups, tp ways. TM_E_INVAL ("tp shard: deepseek_v4: ...") when tp is 0,
 * rank >= tp, or n_head, o_groups or n_ff does not divide by tp. */
tm_rc tm_shard_dsv4_split(tm_shard_dsv4 *out, const tm_model_cfg *c, uint32_t o_groups,
                          uint32_t rank, uint32_t tp, tm_err *err);

/* One rank's part of the DeepSeek-V4.1 split, as its reference shards it (ColumnParallelLinear /
 * RowParallelLinear, ParallelEmbedding, ParallelHead, MoE by whole experts): query heads
 * [h0, h0 + n_head) (wq_b rows, sinks); output groups [g0, g0 + n_group) (wo_a rows, wo_b
 * columns, all-reduced); the indexer's heads [ih0, ih0 + n_ihead) (its wq_b and weights_proj rows;
 * the per-position scores all-reduced before the top-k); routed experts [e0, e0 + n_expert) (the
 * MoE output all-reduced, then the replicated shared expert added); vocabulary rows [vocab0,
 * vocab0 + n_vocab), n_vocab = vocab / tp (embedding all-reduced, logits gathered). Everything
 * else (wq_a, wkv, the compressor, wk, the router, the shared expert, norms, hyper-connections,
 * Engram's wkv) is replicated; the Engram tables are split by rows, ceil(rows / tp) a rank
 * (runner/model/engram_table.h), the looked-up rows all-reduced. */
typedef struct tm_shard_dsv41 {
    uint32_t h0, n_head;
    uint32_t g0, n_group;
    uint32_t ih0, n_ihead;
    uint32_t e0, n_expert;
    uint32_t vocab0, n_vocab;
} tm_shard_dsv41;

/* Fill *out with rank's DeepSeek-V4.1 split tp ways of a model with the given counts. TM_E_INVAL
 * ("tp shard: deepseek_v41: ...", naming every count) when tp is 0, rank >= tp, or n_head,
 * o_groups, index_n_heads, n_experts or vocab does not divide by tp (the reference asserts each).
 */
tm_rc tm_shard_dsv41_split(tm_shard_dsv41 *out, uint32_t n_head, uint32_t o_groups,
                           uint32_t index_n_heads, uint32_t n_experts, uint32_t vocab,
                           uint32_t rank, uint32_t tp, tm_err *err);

/* Build rank's shard of full (borrowed; must outlive the shard), split by tm_shard_split_init
 * (messages start with "tp shard"). Its cfg is the split's with tie_embd 0 (the shard always
 * carries its own lm_head view); *vocab0 is its first vocabulary row. TM_E_INVAL as the split,
 * TM_E_NOMEM. On success *out owns the shard; free it with tm_shard_destroy. */
tm_rc tm_shard_create(const tm_model *full, uint32_t rank, uint32_t tp, tm_model **out,
                      uint32_t *vocab0, tm_err *err);
void tm_shard_destroy(tm_model *shard); /* NULL is a no-op */

#endif /* TM_RUNNER_TP_SHARD_H */
