/* cmd/report.h - `tokenmill report METRICS... -o report.html`: one self-contained HTML page (inline
 * CSS and SVG, no script, no network) from metrics.json files (schemas/metrics.schema.json,
 * versions 1 and 2). Arguments are files or folders; a folder contributes its *.json files and the
 * metrics.json of its direct subfolders, so a folder of nightly files is a history.
 *
 * Runs are ordered by start time. Runs are comparable when they share the series key: workload
 * (the bench workload and scale, or the job file's name), backend and model folder name. Each run
 * is compared with the previous run of its series; a tracked figure (output/prefill/decode tok/s,
 * TTFT p50/p99, TPOT p50, ITL p50, E2EL p50) more than the threshold worse is a regression, shown
 * with its size. The page: a summary, the regressions of each series' latest run, a card per run
 * (only the latest of each series when there are more than 24 runs), SVG line charts of the
 * throughputs and latencies over time (one line per series), and a table of every run.
 *
 * Every number taken from a metrics file is printed inside an element that carries data-src (the
 * run's index in the sources table), data-path (the JSON path in that file), data-value (the
 * file's value, or null) and, when the figure is shown scaled, data-scale: tests check each shown
 * number against its file. Derived changes carry data-kind="delta" with data-src, data-prev and
 * data-path. Used by cmd/main.c. */
#ifndef TM_CMD_REPORT_H
#define TM_CMD_REPORT_H

/* Run `tokenmill report ARGS...` (argv[0] is the first argument after "report"). Returns the exit
 * status: 0 ok, 1 failed (unreadable input, no runs, write error), 2 bad usage, 3 written but
 * --fail-on-regression was given and a series' latest run regressed. */
int tm_report_cmd(int argc, char **argv);

#endif /* TM_CMD_REPORT_H */
