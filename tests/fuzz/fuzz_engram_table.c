/* tests/fuzz/fuzz_engram_table.c - libFuzzer target for the open-time checks of an Engram table
 * file (runner/model/engram_table.c's tm_engram_file_check over safetensors.c's
 * tm_st_header_parse): the input is a whole file image whose size is the file size. It must end
 * in TM_OK, TM_E_PARSE or TM_E_IO (a file longer or shorter than its header says) with a message,
 * or TM_E_NOMEM (never a crash, hang, leak or other code). Checked against the whole-image reader
 * tm_st_file_open_mem (the same rules plus the size): the table check passes exactly when the
 * image opens and holds "layers.1.engram.embed.weight" F8_E4M3 [rows][dim] (rows >= 1, dim a
 * multiple of 32 and <= TM_ENGRAM_MAX_DIM) and "layers.1.engram.embed.scale" F8_E8M0 or U8
 * [rows][dim / 32]; then the reported rows and dim are those shapes, and both tensors lie inside
 * the image. The header is also checked alone (only the length and header bytes, with the image's
 * size as the file size), which must give the same answer. Built like the other targets
 * (fuzz_replay.h; corpus tests/fuzz/corpus_engram_table). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runner/model/engram_table.h"
#include "runner/model/safetensors.h"

static const char *const W = "layers.1.engram.embed.weight";
static const char *const S = "layers.1.engram.embed.scale";

static void check(int ok, const char *what, const tm_err *err) {
    if (ok)
        return;
    fprintf(stderr, "fuzz_engram_table: invariant broken: %s (rc %d, msg %s)\n", what,
            err ? (int)err->rc : 0, err ? err->msg : "");
    abort();
}

// What the whole-image reader says the answer must be: 1 if the table is acceptable.
static int expect_ok(const tm_st_file *f, uint64_t *rows, uint32_t *dim) {
    const tm_st_tensor *w = tm_st_file_find(f, W), *s = tm_st_file_find(f, S);
    if (!w || !s || w->dtype != TM_DTYPE_F8_E4M3 || w->n_dim != 2)
        return 0;
    if (w->shape[0] == 0 || w->shape[1] == 0 || w->shape[1] % 32 || w->shape[1] > TM_ENGRAM_MAX_DIM)
        return 0;
    if ((s->dtype != TM_DTYPE_F8_E8M0 && s->dtype != TM_DTYPE_U8) || s->n_dim != 2 ||
        s->shape[0] != w->shape[0] || s->shape[1] != w->shape[1] / 32)
        return 0;
    *rows = w->shape[0];
    *dim = (uint32_t)w->shape[1];
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tm_err err = {0};
    long live = tm_alloc_live();
    tm_engram_table_info info;
    memset(&info, 0, sizeof(info));
    tm_rc rc = tm_engram_file_check(data, size, size, "fuzz.safetensors", W, S, &info, &err);
    check(rc == TM_OK || rc == TM_E_PARSE || rc == TM_E_IO || rc == TM_E_NOMEM, "unexpected code",
          &err);
    check(rc == TM_OK || err.msg[0], "failure without a message", &err);
    check(tm_alloc_live() == live, "check leaked", &err);
    if (rc == TM_E_NOMEM)
        return 0;

    tm_err err2 = {0};
    tm_st_file *f = NULL;
    tm_rc rc_img = tm_st_file_open_mem(data, size, "fuzz.safetensors", &f, &err2);
    uint64_t rows = 0;
    uint32_t dim = 0;
    int want = rc_img == TM_OK && expect_ok(f, &rows, &dim);
    if (rc_img == TM_E_NOMEM) {
        tm_st_file_close(f);
        return 0;
    }
    check((rc == TM_OK) == want,
          rc == TM_OK ? "accepted a table the image reader refuses"
                      : "refused a table the image reader accepts",
          &err);
    if (rc == TM_OK) {
        check(info.rows == rows && info.dim == dim, "rows or dim differ from the header", &err);
        const tm_st_tensor *w = tm_st_file_find(f, W), *s = tm_st_file_find(f, S);
        const uint8_t *end = data + size;
        check((const uint8_t *)w->data + rows * dim <= end &&
                  (const uint8_t *)s->data + rows * (dim / 32) <= end,
              "table outside the file", NULL);
        check(info.n_slots == 0 && info.n_rows == 0, "shard fields filled", NULL);
    }
    // The same with only the length and the header given (what open reads with pread).
    if (rc_img == TM_OK) {
        uint64_t n_hdr = 0;
        for (int i = 7; i >= 0; i--)
            n_hdr = n_hdr << 8 | data[i];
        tm_err err3 = {0};
        tm_engram_table_info info3;
        tm_rc rc3 = tm_engram_file_check(data, (size_t)(8 + n_hdr), size, "fuzz.safetensors", W, S,
                                         &info3, &err3);
        check(rc3 == rc || rc3 == TM_E_NOMEM, "the header alone gives another answer", &err3);
        check(rc3 != TM_OK || (info3.rows == rows && info3.dim == dim),
              "the header alone gives other rows or dim", &err3);
        // and one byte short of the image: always refused
        if (size > 8 + n_hdr) {
            rc3 = tm_engram_file_check(data, (size_t)(8 + n_hdr), size - 1, "fuzz.safetensors", W,
                                       S, &info3, &err3);
            check(rc3 != TM_OK, "accepted a file one byte short", &err3);
        }
    }
    tm_st_file_close(f);
    check(tm_alloc_live() == live, "leaked", NULL);
    return 0;
}

#include "fuzz_replay.h"
