/* tests/fuzz/fuzz_safetensors.c - libFuzzer target for the safetensors reader
 * (runner/model/safetensors.c): the input is a whole file image, validated with
 * tm_st_file_open_mem. It must end in TM_OK or TM_E_PARSE with a message (never a crash, hang, leak
 * or other code). When it opens, every tensor is checked against the rules the header promises:
 * names sorted and unique, found by tm_st_file_find, a known dtype, n_dim <= TM_ST_MAX_DIM, n_elem
 * the product of shape, n_bytes = n_elem * element size, and data..data+n_bytes inside the image
 * after the header; the tensors tile the data section (sum of n_bytes = data section length); the
 * first and last byte of each tensor are read (ASan checks them). Built with clang
 * -fsanitize=fuzzer,address,undefined when TM_FUZZ=ON; otherwise fuzz_replay.h adds a main() that
 * replays the files given on the command line (corpus tests/fuzz/corpus_safetensors). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runner/model/safetensors.h"

static void check(int ok, const char *what, const tm_err *err) {
    if (ok)
        return;
    fprintf(stderr, "fuzz_safetensors: invariant broken: %s (rc %d, msg %s)\n", what,
            err ? (int)err->rc : 0, err ? err->msg : "");
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tm_err err = {0};
    tm_st_file *f = NULL;
    long live = tm_alloc_live();
    tm_rc rc = tm_st_file_open_mem(data, size, "fuzz.safetensors", &f, &err);
    if (rc != TM_OK) {
        check(rc == TM_E_PARSE || rc == TM_E_NOMEM, "open failed with an unexpected code", &err);
        check(f == NULL && err.msg[0], "failed open without a message or with a file", &err);
        check(tm_alloc_live() == live, "failed open leaked", &err);
        return 0;
    }
    check(size >= 8, "opened a file shorter than its length prefix", NULL);
    uint64_t n_header = 0;
    for (int i = 7; i >= 0; i--)
        n_header = n_header << 8 | data[i];
    check(n_header <= size - 8, "header longer than the file", NULL);
    const uint8_t *start = data + 8 + n_header, *end = data + size;
    uint64_t total = 0;
    volatile uint8_t sink = 0;
    size_t n = tm_st_file_n_tensor(f);
    for (size_t i = 0; i < n; i++) {
        const tm_st_tensor *t = tm_st_file_tensor(f, i);
        check(t && t->name && t->file, "tensor without a name", NULL);
        check(i == 0 || strcmp(tm_st_file_tensor(f, i - 1)->name, t->name) < 0,
              "tensor names not sorted or not unique", NULL);
        check(tm_st_file_find(f, t->name) == t, "find does not give the tensor back", NULL);
        check((unsigned)t->dtype < TM_DTYPE_COUNT && t->dtype != TM_DTYPE_F4_E2M1, "unknown dtype",
              NULL);
        check(t->n_dim <= TM_ST_MAX_DIM, "too many dimensions", NULL);
        uint64_t prod = 1;
        for (uint32_t d = 0; d < t->n_dim; d++)
            prod *= t->shape[d];
        check(prod == t->n_elem, "n_elem is not the product of shape", NULL);
        check(t->n_bytes == t->n_elem * tm_dtype_size(t->dtype), "n_bytes is not n_elem * size",
              NULL);
        const uint8_t *p = t->data;
        check(p >= start && p <= end && t->n_bytes <= (uint64_t)(end - p),
              "tensor data outside the data section", NULL);
        check((uint64_t)(p - start) == t->offset, "data pointer does not match offset", NULL);
        if (t->n_bytes) {
            sink ^= p[0];
            sink ^= p[t->n_bytes - 1];
        }
        total += t->n_bytes;
    }
    (void)sink;
    check(total == (uint64_t)(end - start), "tensors do not tile the data section", NULL);
    check(tm_st_file_find(f, "") == NULL || n > 0, "found a tensor in an empty file", NULL);
    tm_st_file_close(f);
    check(tm_alloc_live() == live, "file leaked", NULL);
    return 0;
}

#include "fuzz_replay.h"
