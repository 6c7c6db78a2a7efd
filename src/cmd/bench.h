/* cmd/bench.h - `tokenmill bench`: the standard workloads of docs/BENCHMARKS.md (W1, W8, P) plus
 * a shared-prefix one, run through the real runner and engine, one metrics.json per workload (the
 * job schema, with its "bench" section naming the workload) so `tokenmill report` charts them.
 *
 * Prompts are random token ids from a seeded generator, handed to the runner as ids
 * (tm_job.prompt_ids: no tokenizer round trip, so a 512-token prompt is exactly 512 tokens, as in
 * llama.cpp's batched-bench); decoding is greedy with EOS ignored (tm_job.ignore_eos), so every
 * record generates exactly its tokens, as vLLM's benchmarks do. All records of a workload are
 * submitted at once; the engine and its KV memory are made once and shared by the workloads; one
 * short unmeasured warm-up run comes first. Each workload gets a fresh runner, so the prefix cache
 * starts empty for each. Used by cmd/main.c. */
#ifndef TM_CMD_BENCH_H
#define TM_CMD_BENCH_H

/* Run `tokenmill bench ARGS...` (argv[0] is the first argument after "bench"). Prints a table to
 * stdout, errors to stderr. Returns the exit status: 0 ok, 1 failed, 2 bad usage. */
int tm_bench_cmd(int argc, char **argv);

#endif /* TM_CMD_BENCH_H */
