/* cmd/run_metrics.h - the runner's counters (runner/runner.h) as the engine section of metrics.json
 * (sink/metrics.h): the one place that maps one onto the other, for the two commands that run the
 * runner and write metrics, `tokenmill run` (cmd/job_run.c) and `tokenmill bench` (cmd/bench.c). It
 * lives here, above both modules, because sink never includes runner headers. */
#ifndef TM_CMD_RUN_METRICS_H
#define TM_CMD_RUN_METRICS_H

#include "runner/runner.h"
#include "sink/metrics.h"

_Static_assert(TM_SPEC_MAX_K == TM_METRICS_SPEC_MAX_K, "per-position speculative counters");

/* Add the engine totals of one tm_runner_run to m (tm_metrics_add_engine), and with spec_k > 0
 * (speculative decoding with that many drafts) its speculative counters
 * (tm_metrics_add_spec). Borrows both. */
static inline void tm_run_metrics_add_engine(tm_metrics *m, const tm_runner_stats *stats,
                                             uint32_t spec_k) {
    if (spec_k)
        tm_metrics_add_spec(m, &(tm_metrics_spec){
                                   .method = stats->spec_mtp      ? "mtp"
                                             : stats->spec_dspark ? "dspark"
                                                                  : "ngram",
                                   .k = spec_k,
                                   .n_drafts = stats->n_spec_drafts,
                                   .n_draft_tok = stats->n_spec_draft_tok,
                                   .n_accepted = stats->n_spec_accepted,
                                   .accepted_pos = stats->spec_accepted_pos,
                               });
    tm_metrics_add_engine(m, &(tm_metrics_engine){
                                 .steps = stats->n_step,
                                 .n_tok_prefill = stats->n_tok_prefill,
                                 .prefill_s = stats->prefill_s,
                                 .n_tok_decode = stats->n_tok_decode,
                                 .decode_s = stats->decode_s,
                                 .preemptions = stats->n_preempt,
                                 .sum_step_fill = stats->sum_step_fill,
                                 .sum_running = stats->sum_running,
                             });
    const tm_guide_stats *g = &stats->guided;
    if (g->n_records || g->n_compiled) // structured output (issue 26)
        tm_metrics_add_guided(m, &(tm_metrics_guided){
                                     .records = g->n_records,
                                     .compiled = g->n_compiled,
                                     .masks = g->n_mask,
                                     .masks_cold = g->n_mask_cold,
                                     .mask_s = g->mask_s,
                                     .compile_s = g->compile_s,
                                     .unfinished = g->n_unfinished,
                                 });
}

#endif /* TM_CMD_RUN_METRICS_H */
