/* tests/fuzz/fuzz_jinja.c - libFuzzer target for the chat-template Jinja subset
 * (runner/text/jinja.c): the input is a template; the first byte (when present) picks
 * add_generation_prompt and one of four message lists, the rest is the template text. Every parse
 * and render must end in TM_OK or TM_E_INVAL with a message (never a crash, hang, leak or other
 * code), and the output stays under the renderer's limit. Built with clang
 * -fsanitize=fuzzer,address,undefined when TM_FUZZ=ON; without libFuzzer the same file builds with
 * a main() that replays the files given on the command line (the corpus in tests/fuzz/corpus_jinja,
 * which holds the fixture templates, runs in every build). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "runner/text/jinja.h"

static void check(int ok, const char *what, const tm_err *err) {
    if (ok)
        return;
    fprintf(stderr, "fuzz_jinja: invariant broken: %s (rc %d, msg %s)\n", what, err->rc, err->msg);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const tm_message lists[4][4] = {
        {{"user", "Hello"}},
        {{"system", "  Be brief.  "}, {"user", "Hi"}, {"assistant", "Hey"}, {"user", "Bye"}},
        {{"user", "{{ x }} {% if %}"}, {"tool", "{\"a\": 1}"}},
        {{"assistant", ""}, {"assistant", "\n"}},
    };
    static const uint32_t n_msgs[4] = {1, 4, 2, 2};
    unsigned sel = size ? data[0] : 0;
    const char *src = size ? (const char *)data + 1 : "";
    size_t n = size ? size - 1 : 0;
    tm_err err = {0};
    tm_jinja *t = NULL;
    tm_rc rc = tm_jinja_parse(src, n, &t, &err);
    check(rc == TM_OK || rc == TM_E_INVAL, "parse returned an unexpected code", &err);
    check(rc == TM_OK || err.msg[0], "parse error without a message", &err);
    if (rc)
        return 0;
    tm_jinja_vars v = {.msgs = lists[sel & 3],
                       .n_msgs = n_msgs[sel & 3],
                       .add_generation_prompt = (sel >> 2) & 1,
                       .bos_token = "<s>",
                       .eos_token = "</s>"};
    tm_buf out = {0};
    err = (tm_err){0};
    rc = tm_jinja_render(t, &v, &out, &err);
    check(rc == TM_OK || rc == TM_E_INVAL, "render returned an unexpected code", &err);
    check(rc == TM_OK || err.msg[0], "render error without a message", &err);
    check(out.len <= (16u << 20) + 4096, "output over the limit", &err);
    tm_buf_fini(&out);
    tm_jinja_destroy(t);
    return 0;
}

#include "fuzz_replay.h"
