/* cmd/merge.h - `tokenmill merge OUT [-o FILE.jsonl] [--partial]`: join the shards of a sharded
 * job (OUT/shard-K-of-N, written by `tokenmill run --shard K/N`, ingest/shard.h) into one results
 * file and one metrics.json, with a proof that every input line was answered exactly once.
 *
 * Checks, in order: OUT holds shard folders of one count N; every shard 0..N-1 exists and its
 * manifest says finished (else it refuses and lists the missing and unfinished ones; --partial
 * merges what the shards committed and lists what is missing); every shard belongs to the same
 * job (its canonical spec equal apart from input.shard.index, the same model and input files,
 * sizes and times; a shard of another job is refused by name, also with --partial). Then it
 * re-reads the inputs (up to the sizes the shards' manifests recorded) with the job's parser,
 * assigns each record to its shard with the job's partition, and matches every committed answer
 * line of every shard to its input line (error lines by file and line, completions by id among
 * the lines of that id owned by that shard): every input line must have exactly one answer. An
 * input line answered twice is reported and the owner shard's answer kept; an id answered ok on
 * two input lines is reported and the later line's answer becomes a duplicate_id error, as one
 * job resolves it.
 *
 * Writes (each whole or not at all: a temporary file renamed): the results file (default
 * OUT/results.jsonl): every answer line in input order, as the shards wrote it (OpenAI lines for
 * OpenAI inputs); OUT/metrics.json (schemas/metrics.schema.json with "shards"): records counted
 * from the merged answers, tokens and engine counters summed, TTFT / E2EL / TPOT percentiles
 * recomputed from the answers' per-record timing (native lines carry it; OpenAI lines do not),
 * ITL's mean and max combined (its percentiles are per shard only), throughput over the span from
 * the first shard's start to the last shard's end; with --partial, OUT/missing.jsonl (one line per
 * unanswered input line). Memory: one entry per input line plus every answer line. */
#ifndef TM_CMD_MERGE_H
#define TM_CMD_MERGE_H

/* Run `tokenmill merge ARGS...` (argv[0] is the first argument after "merge"). Returns the exit
 * status: 0 merged (every line answered exactly once, or --partial), 1 refused or failed (missing
 * or unfinished shards, a shard of another job, a line not answered), 2 bad usage. */
int tm_merge_cmd(int argc, char **argv);

#endif /* TM_CMD_MERGE_H */
