/* tests/fuzz/fuzz_manifest.c - libFuzzer target for the manifest reader and resume recovery
 * (sink/manifest.c). The input up to its first NUL is written as manifest.json in a private
 * folder (on /dev/shm when there is one, so fsync costs nothing); the bytes after the NUL are the
 * data files completions.jsonl.lz4 and errors.jsonl (the first half each; arbitrary bytes, a torn
 * LZ4 frame as far as recovery cares).
 * Invariants: tm_manifest_load ends in TM_OK (found) or TM_E_PARSE with a message naming the file
 * (never a crash, hang, leak, other code); a failed load leaves the manifest zeroed. A loaded
 * manifest has a 32-character spec hash and a done set whose members above the watermark are
 * ascending; it is the same job as itself; saved with tm_manifest_save and loaded again it gives
 * the same fields back (round trip). tm_manifest_recover then cuts each data file to its committed
 * length: TM_E_IO when a file is shorter than that (damage it cannot repair), otherwise TM_OK with
 * both files exactly at their committed lengths and cut_bytes the bytes removed.
 *
 * tokenmill has no LZ4 frame scanner on the recovery path: the manifest's committed byte counts
 * always end on a closed frame (the sink closes the frame before it commits), so recovery is a
 * plain truncation; the LZ4 decoder that does see arbitrary bytes is the .jsonl.lz4 input reader,
 * fuzzed by fuzz_lz4_input.c. Built with clang -fsanitize=fuzzer,address,undefined when
 * TM_FUZZ=ON; otherwise fuzz_replay.h adds a main() that replays the files given on the command
 * line (corpus tests/fuzz/corpus_manifest). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "sink/manifest.h"
#include "sink/sink.h"

static void check(int ok, const char *what, const tm_err *err) {
    if (ok)
        return;
    fprintf(stderr, "fuzz_manifest: invariant broken: %s (rc %d, msg %s)\n", what,
            err ? (int)err->rc : 0, err ? err->msg : "");
    abort();
}

static char g_dir[64], g_dir2[80];

static void rm_dir(const char *dir) {
    static const char *const names[] = {TM_MANIFEST_FILE, TM_MANIFEST_FILE ".tmp",
                                        TM_SINK_COMPLETIONS_FILE, TM_SINK_ERRORS_FILE};
    char p[256];
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        snprintf(p, sizeof(p), "%s/%s", dir, names[i]);
        unlink(p);
    }
    rmdir(dir);
}

static void cleanup(void) {
    rm_dir(g_dir2);
    rm_dir(g_dir);
}

static void setup(void) {
    if (g_dir[0])
        return;
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(g_dir, sizeof(g_dir), "%s/tm_fuzz_manifest_XXXXXX", base);
    TM_ASSERT(mkdtemp(g_dir) != NULL);
    snprintf(g_dir2, sizeof(g_dir2), "%s/rt", g_dir);
    TM_ASSERT(mkdir(g_dir2, 0700) == 0);
    atexit(cleanup);
}

static void write_file(const char *dir, const char *name, const void *p, size_t n) {
    char path[256];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    TM_ASSERT(f);
    TM_ASSERT(fwrite(p, 1, n, f) == n);
    fclose(f);
}

static int64_t file_size(const char *dir, const char *name) {
    char path[256];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    struct stat st;
    return stat(path, &st) == 0 ? (int64_t)st.st_size : -1;
}

static int same_files(const tm_manifest_file *a, const tm_manifest_file *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(a[i].name, b[i].name) != 0 || a[i].size != b[i].size ||
            a[i].mtime_ns != b[i].mtime_ns || strcmp(a[i].xxh3, b[i].xxh3) != 0)
            return 0;
    return 1;
}

static void check_round_trip(const tm_manifest *m) {
    tm_err err = {0};
    check(tm_manifest_save(g_dir2, m, &err) == TM_OK, "save of a loaded manifest failed", &err);
    tm_manifest b;
    bool found = false;
    check(tm_manifest_load(g_dir2, &b, &found, &err) == TM_OK && found,
          "a saved manifest does not load", &err);
    check(strcmp(m->spec_hash, b.spec_hash) == 0 && strcmp(m->job_path, b.job_path) == 0,
          "round trip: job", NULL);
    check(m->n_model_files == b.n_model_files &&
              same_files(m->model_files, b.model_files, b.n_model_files),
          "round trip: model files", NULL);
    check(m->n_inputs == b.n_inputs && same_files(m->inputs, b.inputs, b.n_inputs),
          "round trip: inputs", NULL);
    check(m->bytes_completions == b.bytes_completions && m->bytes_errors == b.bytes_errors,
          "round trip: output bytes", NULL);
    check(m->done.watermark == b.done.watermark && m->done.n_above == b.done.n_above &&
              (b.done.n_above == 0 ||
               memcmp(m->done.above, b.done.above, b.done.n_above * sizeof(uint64_t)) == 0),
          "round trip: done set", NULL);
    check(m->total_known == b.total_known && m->n_records == b.n_records &&
              m->finished == b.finished,
          "round trip: records", NULL);
    check(memcmp(&m->counts, &b.counts, sizeof(b.counts)) == 0, "round trip: counts", NULL);
    check(m->n_commits == b.n_commits && m->n_runs == b.n_runs, "round trip: commits", NULL);
    check((!m->kafka_topic && !b.kafka_topic) ||
              (m->kafka_topic && b.kafka_topic && strcmp(m->kafka_topic, b.kafka_topic) == 0),
          "round trip: kafka topic", NULL);
    tm_manifest_fini(&b);
}

static void check_recover(const tm_manifest *m, const uint8_t *p, size_t n) {
    size_t n_c = n / 2, n_e = n - n_c;
    write_file(g_dir, TM_SINK_COMPLETIONS_FILE, p, n_c);
    write_file(g_dir, TM_SINK_ERRORS_FILE, p + n_c, n_e);
    tm_err err = {0};
    uint64_t cut = 0;
    tm_rc rc = tm_manifest_recover(g_dir, m, &cut, &err);
    if (m->bytes_completions > n_c || m->bytes_errors > n_e) {
        check(rc == TM_E_IO && err.msg[0], "recover accepted a data file shorter than committed",
              &err);
        return;
    }
    check(rc == TM_OK, "recover failed", &err);
    check(file_size(g_dir, TM_SINK_COMPLETIONS_FILE) == (int64_t)m->bytes_completions &&
              file_size(g_dir, TM_SINK_ERRORS_FILE) == (int64_t)m->bytes_errors,
          "recover did not cut to the committed lengths", NULL);
    check(cut == (n_c - m->bytes_completions) + (n_e - m->bytes_errors), "cut_bytes is wrong",
          NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    setup();
    const uint8_t *nul = memchr(data, '\0', size);
    size_t n_json = nul ? (size_t)(nul - data) : size;
    write_file(g_dir, TM_MANIFEST_FILE, data, n_json);
    tm_manifest m;
    bool found = true;
    tm_err err = {0};
    long live = tm_alloc_live();
    tm_rc rc = tm_manifest_load(g_dir, &m, &found, &err);
    if (rc != TM_OK) {
        check(rc == TM_E_PARSE || rc == TM_E_NOMEM, "load failed with an unexpected code", &err);
        check(!found && err.msg[0] && strstr(err.msg, TM_MANIFEST_FILE),
              "failed load without a message naming the file", &err);
        tm_manifest empty;
        memset(&empty, 0, sizeof(empty));
        check(memcmp(&m, &empty, sizeof(m)) == 0, "failed load left fields set", &err);
        check(tm_alloc_live() == live, "failed load leaked", &err);
        return 0;
    }
    check(found, "manifest.json exists but found is false", NULL);
    if (m.done.n_above > (1u << 20)) {
        // a legal but huge done set (up to 2^26 members, 512 MB): loading it is the test; the
        // O(n) checks below would take the run past -timeout under ASan
        tm_manifest_fini(&m);
        return 0;
    }
    check(strlen(m.spec_hash) == 32 && m.job_path, "spec hash or job path", NULL);
    for (size_t i = 0; i < m.done.n_above; i++)
        check(m.done.above[i] > m.done.watermark &&
                  (i == 0 || m.done.above[i] > m.done.above[i - 1]),
              "done set not ascending above its watermark", NULL);
    char why[256];
    check(tm_manifest_same_job(&m, &m, why, sizeof(why)),
          "a manifest is not the same job as itself", NULL);
    check_round_trip(&m);
    check_recover(&m, nul ? nul + 1 : data + size, nul ? size - n_json - 1 : 0);
    tm_manifest_fini(&m);
    check(tm_alloc_live() == live, "manifest leaked", NULL);
    return 0;
}

#include "fuzz_replay.h"
