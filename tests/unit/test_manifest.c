/* tests/unit/test_manifest.c - base/seqset against a naive bitmap on random finish orders; manifest
 * save/load round trip and the same-job rules; recovery cut at every byte of an uncommitted last
 * frame (and with garbage after it) gives back exactly the committed, decodable prefix; a data
 * file shorter than committed is refused; the output-folder lock refuses a second holder. */
#include <fcntl.h>
#include <lz4frame.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/seqset.h"
#include "sink/manifest.h"
#include "sink/sink.h"
#include "tm_test.h"

static void test_seqset_random(void) {
    enum { N = 5000 };
    static unsigned char ref[N];
    static uint64_t order[N];
    tm_err err = {0};
    srand(11);
    for (int round = 0; round < 4; round++) {
        memset(ref, 0, sizeof(ref));
        for (uint64_t i = 0; i < N; i++)
            order[i] = i;
        int window = 1 + round * 60; // finish order: input order shuffled within a window
        for (int i = 0; i < N; i++) {
            int j = i + rand() % window;
            if (j >= N)
                j = N - 1;
            uint64_t t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        tm_seqset s = {0};
        for (int i = 0; i < N; i++) {
            TM_CHECK_OK(tm_seqset_add(&s, order[i], &err), &err);
            TM_CHECK_OK(tm_seqset_add(&s, order[i], &err), &err); // twice: no-op
            ref[order[i]] = 1;
            if (i % 97 == 0)
                for (uint64_t k = 0; k < N; k++)
                    TM_CHECK(tm_seqset_has(&s, k) == (ref[k] != 0));
            TM_CHECK(tm_seqset_count(&s) == (uint64_t)i + 1);
        }
        TM_CHECK(s.watermark == N && s.n_above == 0);
        tm_seqset copy = {0};
        TM_CHECK_OK(tm_seqset_copy(&copy, &s, &err), &err);
        TM_CHECK(copy.watermark == N);
        tm_seqset_fini(&copy);
        tm_seqset_fini(&s);
    }
}

static char g_dir[] = "/tmp/tm_manifest_XXXXXX";

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    TM_ASSERT(f);
    fputs(text, f);
    fclose(f);
}

static void make_identity(tm_manifest *m, const char *spec_json) {
    char model[512], input[512];
    snprintf(model, sizeof(model), "%s/model", g_dir);
    snprintf(input, sizeof(input), "%s/in.jsonl", g_dir);
    char *inputs[] = {input, "-"};
    tm_err err = {0};
    TM_CHECK_OK(tm_manifest_identify(m, spec_json, "job.json", model, inputs, 2, &err), &err);
}

static void test_round_trip_and_same_job(void) {
    char p[512];
    snprintf(p, sizeof(p), "%s/model", g_dir);
    mkdir(p, 0777);
    snprintf(p, sizeof(p), "%s/model/config.json", g_dir);
    write_text(p, "{\"vocab_size\": 10}");
    snprintf(p, sizeof(p), "%s/model/model.safetensors", g_dir);
    write_text(p, "weights");
    snprintf(p, sizeof(p), "%s/in.jsonl", g_dir);
    write_text(p, "{\"id\":1,\"prompt\":\"a\"}\n");

    tm_err err = {0};
    tm_manifest m = {0};
    make_identity(&m, "{\"a\":1}");
    TM_CHECK(m.n_model_files == 2 && m.n_inputs == 2 && m.inputs[1].size == -1);
    uint64_t done[] = {0, 1, 2, 5, 6, 9, 3};
    for (size_t i = 0; i < sizeof(done) / sizeof(done[0]); i++)
        TM_CHECK_OK(tm_seqset_add(&m.done, done[i], &err), &err);
    m.bytes_completions = 123;
    m.bytes_errors = 45;
    m.counts.n_ok = 6;
    m.counts.n_failed = 1;
    m.counts.n_err_by_code[TM_ERRCODE_INVALID_JSON] = 1;
    m.counts.n_tok_gen = 77;
    m.n_commits = 3;
    m.n_runs = 2;
    TM_CHECK_OK(tm_manifest_save(g_dir, &m, &err), &err);

    tm_manifest back;
    bool found = false;
    TM_CHECK_OK(tm_manifest_load(g_dir, &back, &found, &err), &err);
    TM_CHECK(found);
    TM_CHECK(back.done.watermark == 4 && back.done.n_above == 3 && tm_seqset_has(&back.done, 9));
    TM_CHECK(!tm_seqset_has(&back.done, 7));
    TM_CHECK(back.bytes_completions == 123 && back.bytes_errors == 45);
    TM_CHECK(back.counts.n_ok == 6 && back.counts.n_err_by_code[TM_ERRCODE_INVALID_JSON] == 1);
    TM_CHECK(back.counts.n_tok_gen == 77 && back.n_commits == 3 && back.n_runs == 2);
    char why[256];
    TM_CHECK(tm_manifest_same_job(&back, &m, why, sizeof(why)));

    tm_manifest other = {0};
    make_identity(&other, "{\"a\":2}");
    TM_CHECK(!tm_manifest_same_job(&back, &other, why, sizeof(why)));
    TM_CHECK_MSG(strstr(why, "the job changed: a 1 -> 2") != NULL, "%s", why); // names the field
    // a manifest without the spec (written before it was kept): the hashes
    free(back.spec_json);
    back.spec_json = NULL;
    TM_CHECK(!tm_manifest_same_job(&back, &other, why, sizeof(why)));
    TM_CHECK(strstr(why, "job spec changed (spec hash") != NULL);
    tm_manifest_fini(&other);
    snprintf(p, sizeof(p), "%s/in.jsonl", g_dir);
    write_text(p, "{\"id\":1,\"prompt\":\"ab\"}\n"); // the input grew by a byte
    make_identity(&other, "{\"a\":1}");
    TM_CHECK(!tm_manifest_same_job(&back, &other, why, sizeof(why)));
    TM_CHECK(strstr(why, "in.jsonl changed") != NULL);
    tm_manifest_fini(&other);
    snprintf(p, sizeof(p), "%s/model/config.json", g_dir);
    write_text(p, "{\"vocab_size\": 11}");
    make_identity(&other, "{\"a\":1}");
    TM_CHECK(!tm_manifest_same_job(&back, &other, why, sizeof(why)));
    TM_CHECK(strstr(why, "config.json changed") != NULL);
    tm_manifest_fini(&other);

    // no manifest: found false; a damaged one: a clear parse error
    char sub[600];
    snprintf(sub, sizeof(sub), "%s/empty", g_dir);
    mkdir(sub, 0777);
    tm_manifest none;
    TM_CHECK_OK(tm_manifest_load(sub, &none, &found, &err), &err);
    TM_CHECK(!found);
    char mp[700];
    snprintf(mp, sizeof(mp), "%s/manifest.json", sub);
    write_text(mp, "{\"format\":\"tokenmill.manifest\",\"version\":1}");
    TM_CHECK(tm_manifest_load(sub, &none, &found, &err) == TM_E_PARSE);
    TM_CHECK(strstr(err.msg, "--restart") != NULL);
    tm_manifest_fini(&back);
    tm_manifest_fini(&m);
}

static uint64_t file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

// 1 when every frame of the file decodes completely.
static int lz4_whole(const char *path) {
    FILE *f = fopen(path, "rb");
    TM_ASSERT(f);
    LZ4F_dctx *d = NULL;
    LZ4F_createDecompressionContext(&d, LZ4F_VERSION);
    unsigned char in[4096], out[65536];
    size_t r = 0, n;
    int ok = 1;
    while (ok && (n = fread(in, 1, sizeof(in), f)) > 0) {
        size_t pos = 0;
        while (pos < n) {
            size_t dn = sizeof(out), sn = n - pos;
            r = LZ4F_decompress(d, out, &dn, in + pos, &sn, NULL);
            if (LZ4F_isError(r)) {
                ok = 0;
                break;
            }
            pos += sn;
        }
    }
    LZ4F_freeDecompressionContext(d);
    fclose(f);
    return ok && r == 0;
}

static void copy_file(const char *from, const char *to) {
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "cp '%s' '%s'", from, to);
    TM_ASSERT(system(cmd) == 0);
}

// Commit two frames, write a third without committing it, then cut the file at every byte of
// that third frame (and with garbage after it): recovery always gives back the committed prefix.
// Issue 35: an input replaced between runs by a file of the same size whose mtime was kept is not
// the same job: mv of a prepared file (another inode), cp -p / touch -r over it (ctime, and the
// content sample), and a rewrite of one byte in the middle of a big file (ctime). A manifest
// without the new fields (an older tokenmill's) is still resumed.
static void set_mtime_of(const char *path, const char *from) {
    struct stat st;
    TM_ASSERT(stat(from, &st) == 0);
    struct timespec ts[2] = {st.st_atim, st.st_mtim};
    TM_ASSERT(utimensat(AT_FDCWD, path, ts, 0) == 0);
}

static void test_input_replaced(void) {
    char in[512], prep[512], ref[512], why[256];
    snprintf(in, sizeof(in), "%s/in.jsonl", g_dir);
    snprintf(prep, sizeof(prep), "%s/prepared.jsonl", g_dir);
    snprintf(ref, sizeof(ref), "%s/ref", g_dir);
    write_text(in, "{\"id\":1,\"prompt\":\"a\"}\n");
    write_text(ref, "x");
    set_mtime_of(in, ref);
    tm_manifest first = {0}, again = {0};
    make_identity(&first, "{\"a\":1}");
    TM_CHECK(first.inputs[0].inode != 0 && first.inputs[0].sample[0]);
    make_identity(&again, "{\"a\":1}");
    TM_CHECK(tm_manifest_same_job(&first, &again, why, sizeof(why)));
    tm_manifest_fini(&again);

    // mv of a prepared file: same size, same mtime, another inode
    write_text(prep, "{\"id\":2,\"prompt\":\"b\"}\n");
    set_mtime_of(prep, ref);
    TM_ASSERT(rename(prep, in) == 0);
    make_identity(&again, "{\"a\":1}");
    TM_CHECK(again.inputs[0].size == first.inputs[0].size &&
             again.inputs[0].mtime_ns == first.inputs[0].mtime_ns);
    TM_CHECK(!tm_manifest_same_job(&first, &again, why, sizeof(why)));
    TM_CHECK_MSG(strstr(why, "in.jsonl was replaced") != NULL, "%s", why);
    tm_manifest_fini(&again);
    tm_manifest_fini(&first);

    // cp -p over it (the same inode, written then its mtime set back)
    make_identity(&first, "{\"a\":1}");
    write_text(in, "{\"id\":3,\"prompt\":\"c\"}\n");
    set_mtime_of(in, ref);
    make_identity(&again, "{\"a\":1}");
    TM_CHECK(again.inputs[0].inode == first.inputs[0].inode);
    TM_CHECK(!tm_manifest_same_job(&first, &again, why, sizeof(why)));
    TM_CHECK_MSG(strstr(why, "in.jsonl changed: same size and mtime, other content") != NULL, "%s",
                 why);
    tm_manifest_fini(&again);

    // one byte changed where the sample does not look (a 20 MiB file), mtime kept: ctime tells
    tm_manifest_fini(&first);
    FILE *f = fopen(in, "w");
    TM_ASSERT(f);
    for (int i = 0; i < 20 * 1024; i++)
        fprintf(f, "{\"id\":%07d,\"prompt\":\"%0990d\"}\n", i, 0);
    fclose(f);
    set_mtime_of(in, ref);
    make_identity(&first, "{\"a\":1}");
    f = fopen(in, "r+");
    TM_ASSERT(f && fseek(f, 1024 * 1024 + 65536 + 1000, SEEK_SET) == 0 && fputc('7', f) != EOF);
    fclose(f);
    set_mtime_of(in, ref);
    make_identity(&again, "{\"a\":1}");
    TM_CHECK(strcmp(again.inputs[0].sample, first.inputs[0].sample) == 0); // not sampled there
    TM_CHECK(!tm_manifest_same_job(&first, &again, why, sizeof(why)));
    TM_CHECK_MSG(strstr(why, "(ctime)") != NULL, "%s", why);
    // an older manifest (no inode, ctime or sample): compared by size and mtime as before
    first.inputs[0].inode = 0, first.inputs[0].ctime_ns = 0, first.inputs[0].sample[0] = '\0';
    TM_CHECK(tm_manifest_same_job(&first, &again, why, sizeof(why)));
    tm_manifest_fini(&again);
    tm_manifest_fini(&first);
    write_text(in, "{\"id\":1,\"prompt\":\"a\"}\n");
}

static void test_recover_every_byte(void) {
    char dir[600], lz4[700], errs[700], keep[700];
    snprintf(dir, sizeof(dir), "%s/torn", g_dir);
    snprintf(lz4, sizeof(lz4), "%s/" TM_SINK_COMPLETIONS_FILE, dir);
    snprintf(errs, sizeof(errs), "%s/" TM_SINK_ERRORS_FILE, dir);
    snprintf(keep, sizeof(keep), "%s/keep.lz4", g_dir);
    tm_err err = {0};
    tm_sink *sink = NULL;
    TM_CHECK_OK(tm_sink_open(dir, &(tm_sink_opts){.no_fsync = true}, &sink, &err), &err);
    char id[32], text[64];
    tm_manifest m = {0};
    for (int i = 0; i < 30; i++) {
        snprintf(id, sizeof(id), "%d", i);
        snprintf(text, sizeof(text), "completion %d", i);
        tm_completion c = {.seq_no = (uint64_t)i, .id_json = id, .text = text};
        tm_completion e = {.seq_no = (uint64_t)i,
                           .file = "in",
                           .line = (uint64_t)i + 1,
                           .err_code = TM_ERRCODE_INVALID_JSON,
                           .err_msg = "bad"};
        TM_CHECK_OK(tm_sink_write(sink, i % 7 == 3 ? &e : &c, &err), &err);
        if (i == 9 || i == 19) { // commits 1 and 2
            TM_CHECK_OK(tm_sink_flush(sink, &err), &err);
            tm_sink_stats st;
            tm_sink_get_stats(sink, &st);
            m.bytes_completions = st.size_lz4;
            m.bytes_errors = st.size_err;
        }
    }
    TM_CHECK_OK(tm_sink_close(sink, &err), &err); // the third frame reaches the file, uncommitted
    uint64_t size = file_size(lz4), err_size = file_size(errs);
    TM_CHECK(size > m.bytes_completions + 10 && err_size > m.bytes_errors);
    copy_file(lz4, keep);
    unsigned n_cut = 0;
    for (uint64_t cut = m.bytes_completions; cut <= size; cut++) {
        for (int garbage = 0; garbage < 2; garbage++) {
            copy_file(keep, lz4);
            TM_ASSERT(truncate(lz4, (off_t)cut) == 0);
            if (garbage) {
                FILE *f = fopen(lz4, "ab");
                for (int k = 0; k < 1 + (int)(cut % 37); k++)
                    fputc((int)((cut * 131 + (uint64_t)k * 17) & 0xff), f);
                fclose(f);
            }
            uint64_t cut_bytes = 0;
            TM_CHECK_OK(tm_manifest_recover(dir, &m, &cut_bytes, &err), &err);
            TM_CHECK(file_size(lz4) == m.bytes_completions);
            TM_CHECK(file_size(errs) == m.bytes_errors);
            TM_CHECK(lz4_whole(lz4));
            n_cut++;
        }
    }
    TM_CHECK(n_cut >= 20);
    // shorter than committed: refused, naming the file
    TM_ASSERT(truncate(lz4, (off_t)m.bytes_completions - 1) == 0);
    uint64_t cut_bytes = 0;
    TM_CHECK(tm_manifest_recover(dir, &m, &cut_bytes, &err) == TM_E_IO);
    TM_CHECK(strstr(err.msg, TM_SINK_COMPLETIONS_FILE) && strstr(err.msg, "manifest commits"));
    tm_manifest_fini(&m);
}

static void test_lock(void) {
    char dir[600], lock[700];
    snprintf(dir, sizeof(dir), "%s/locked/sub", g_dir);
    snprintf(lock, sizeof(lock), "%s/" TM_MANIFEST_LOCK_FILE, dir);
    tm_err err = {0};
    tm_manifest_lk lk1 = TM_MANIFEST_LK_INIT, lk2 = TM_MANIFEST_LK_INIT;
    TM_CHECK_OK(tm_manifest_lock(dir, &lk1, &err), &err); // creates the folders too
    TM_CHECK(lk1.created);
    TM_CHECK(tm_manifest_lock(dir, &lk2, &err) == TM_E_AGAIN);
    TM_CHECK(strstr(err.msg, "another tokenmill process") != NULL && lk2.file_fd < 0);
    TM_CHECK(unlink(lock) == 0); // deleting the lock file does not open the folder (issue 24)
    TM_CHECK(tm_manifest_lock(dir, &lk2, &err) == TM_E_AGAIN);
    TM_CHECK(lk2.dir_fd < 0 && lk2.file_fd < 0);
    tm_manifest_unlock(&lk1);
    TM_CHECK_OK(tm_manifest_lock(dir, &lk2, &err), &err);
    tm_manifest_unlock(&lk2);
    TM_CHECK_OK(tm_manifest_lock(dir, &lk2, &err), &err);
    TM_CHECK(!lk2.created); // the file was there: the folder is tokenmill's
    // A clean exit without a manifest keeps the lock file (it alone marks the folder as
    // tokenmill's); with one, the lock file goes.
    tm_manifest_unlock_tidy(dir, &lk2);
    TM_CHECK(access(lock, F_OK) == 0 && lk2.file_fd < 0 && lk2.dir_fd < 0);
    char man[700];
    snprintf(man, sizeof(man), "%s/" TM_MANIFEST_FILE, dir);
    FILE *f = fopen(man, "w");
    TM_ASSERT(f);
    fclose(f);
    TM_CHECK_OK(tm_manifest_lock(dir, &lk2, &err), &err);
    tm_manifest_unlock_tidy(dir, &lk2);
    TM_CHECK(access(lock, F_OK) != 0 && errno == ENOENT);
    TM_CHECK_OK(tm_manifest_lock(dir, &lk2, &err), &err); // and the folder opens again
    TM_CHECK(tm_manifest_lock(dir, &lk1, &err) == TM_E_AGAIN);
    tm_manifest_unlock(&lk2);
}

int main(void) {
    TM_ASSERT(mkdtemp(g_dir));
    TM_RUN(test_seqset_random);
    TM_RUN(test_round_trip_and_same_job);
    TM_RUN(test_input_replaced);
    TM_RUN(test_recover_every_byte);
    TM_RUN(test_lock);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g_dir);
    return tm_test_report();
}
