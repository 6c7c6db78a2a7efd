/* tests/unit/test_chat_dsv41.c - DeepSeek-V4.1's chat encoding (runner/text/chat_dsv41.c): the
 * prompts of the release's encode_messages in chat mode for system / user / assistant / tool
 * conversations (BOS, <｜System｜>, <｜User｜>, tool results merged into user turns,
 * <｜Assistant｜></think> headers, EOS after assistant turns; every add_generation_prompt=1 case
 * is what SGLang's encoding_dsv41.py returns for it, run outside the tree), the image-placeholder
 * refusal, and the selection: a tokenizer without a chat template that has V4.1's protocol
 * tokens (mkmodel --arch deepseek_v41's built-in one) renders this way through tm_chat_render. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "runner/text/chat.h"
#include "runner/text/tokenizer.h"
#include "tm_test.h"

#define B                                                                                          \
    "<\xef\xbd\x9c"                                                                                \
    "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define E                                                                                          \
    "<\xef\xbd\x9c"                                                                                \
    "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define S "<\xef\xbd\x9cSystem\xef\xbd\x9c>"
#define U "<\xef\xbd\x9cUser\xef\xbd\x9c>"
#define A                                                                                          \
    "<\xef\xbd\x9c"                                                                                \
    "Assistant\xef\xbd\x9c></think>"

typedef struct conv {
    const char *roles[8], *contents[8];
    int agp;
    const char *want;
} conv;

static const conv cases[] = {
    {{"user"}, {"Hi"}, 1, B U "Hi" A},
    {{"system", "user"}, {"Be brief.", "Hi"}, 1, B S "Be brief." U "Hi" A},
    {{"user", "assistant", "user"}, {"Hi", "Hello", "Again"}, 1, B U "Hi" A "Hello" E U "Again" A},
    {{"user", "tool"}, {"q", "r"}, 1, B U "q\n\n<tool_result>r</tool_result>" A},
    {{"user", "user"}, {"a", "b"}, 1, B U "a\n\nb" A},
    {{"system", "user", "system"}, {"s", "u", "mid"}, 1, B S "s" U "u" S "mid" A},
    {{"system"}, {"s"}, 1, B S "s"},
    {{"user"}, {"Hi"}, 0, B U "Hi"},
    {{"user", "assistant"}, {"u", "a"}, 0, B U "u" A "a" E},
    {{"assistant", "tool", "user"},
     {"x", "r", "q"},
     1,
     B "x" E U "<tool_result>r</tool_result>\n\nq" A},
    {{"user", "assistant", "tool", "tool"},
     {"q", "call", "r1", "r2"},
     1,
     B U "q" A "call" E U "<tool_result>r1</tool_result>\n\n<tool_result>r2</tool_result>" A},
    {{"system", "assistant"},
     {"s", "a"},
     1,
     B S "s"
         "a" E},
    {{"user"}, {""}, 1, B U A},
    {{"system", "system", "user", "assistant", "tool", "system", "assistant"},
     {"s1", "s2", "u", "a", "t", "s3", "b"},
     1,
     B S "s1" S "s2" U "u" A "a" E U "<tool_result>t</tool_result>" S "s3" A "b" E},
    {{"tool", "assistant", "user", "tool", "user"},
     {"t0", "a", "u", "t1", "u2"},
     1,
     B U "<tool_result>t0</tool_result>" A "a" E U "u\n\n<tool_result>t1</tool_result>\n\nu2" A},
};

static int render(const conv *c, tm_buf *out, tm_err *err) {
    tm_message m[8];
    uint32_t n = 0;
    while (n < 8 && c->roles[n]) {
        m[n].role = (char *)c->roles[n];
        m[n].content = (char *)c->contents[n];
        n++;
    }
    return tm_chat_render_dsv41(m, n, c->agp, out, err);
}

static void test_cases(void) {
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        tm_buf out = {0};
        tm_err err = {0};
        TM_CHECK_OK(render(&cases[i], &out, &err), &err);
        TM_CHECK_MSG(out.len == strlen(cases[i].want) && !memcmp(out.data, cases[i].want, out.len),
                     "case %zu: got \"%.*s\"", i, (int)out.len, out.data);
        tm_buf_fini(&out);
    }
}

static void test_refusals(void) {
    tm_buf out = {0};
    tm_err err = {0};
    conv img = {{"user"},
                {"see <\xef\xbd\x9c"
                 "deepseek_image\xef\xbd\x9c> here"},
                1,
                ""};
    TM_CHECK(render(&img, &out, &err) == TM_E_INVAL);
    TM_CHECK(strstr(err.msg, "image placeholder") != NULL);
    conv bad = {{"user", "robot"}, {"a", "b"}, 1, ""};
    TM_CHECK(render(&bad, &out, &err) == TM_E_INVAL);
    TM_CHECK(strstr(err.msg, "robot") != NULL);
    tm_buf_fini(&out);
}

/* Through tm_chat_render with the built-in tokenizer of mkmodel --arch deepseek_v41. */
static void test_selection(void) {
    const char *build = getenv("TM_BUILD") ? getenv("TM_BUILD") : "build";
    char dir[] = "/tmp/tm_chat_dsv41_XXXXXX", cmd[4200];
    TM_CHECK(mkdtemp(dir) != NULL);
    snprintf(cmd, sizeof(cmd), "'%s/mkmodel' --arch deepseek_v41 --out '%s/m' >/dev/null", build,
             dir);
    TM_CHECK_MSG(system(cmd) == 0, "%s", cmd);
    char m[4200];
    snprintf(m, sizeof(m), "%s/m", dir);
    tm_tokenizer *tok = NULL;
    tm_err err = {0};
    TM_CHECK_OK(tm_tok_load(m, &tok, &err), &err);
    if (tok) {
        TM_CHECK(tm_chat_format_of(tok) == TM_CHAT_FORMAT_DSV41);
        tm_message msgs[2] = {{"system", "s"}, {"user", "Hi"}};
        tm_buf out = {0};
        TM_CHECK_OK(tm_chat_render(tok, msgs, 2, 1, &out, &err), &err);
        const char *want = B S "s" U "Hi" A;
        TM_CHECK(out.len == strlen(want) && !memcmp(out.data, want, out.len));
        // The protocol strings are single tokens of that tokenizer.
        tm_ids ids = {0};
        TM_CHECK_OK(tm_tok_encode(tok, out.data, out.len, &ids, &err), &err);
        TM_CHECK_MSG(ids.len == 8, "%zu ids", ids.len); // B S s U H i A </think>
        if (ids.len == 8) {
            TM_CHECK((int32_t)ids.ids[0] == tm_tok_bos_id(tok));
            TM_CHECK((int32_t)ids.ids[1] == tm_tok_find(tok, S));
            TM_CHECK((int32_t)ids.ids[3] == tm_tok_find(tok, U));
            TM_CHECK((int32_t)ids.ids[6] == tm_tok_find(tok, "<\xef\xbd\x9c"
                                                             "Assistant\xef\xbd\x9c>"));
            TM_CHECK((int32_t)ids.ids[7] == tm_tok_find(tok, "</think>"));
        }
        tm_ids_fini(&ids);
        // A job's chat_template override still wins.
        tm_buf_clear(&out);
        TM_CHECK_OK(
            tm_chat_render_with(tok, "{{ messages[0]['content'] }}", msgs, 2, 1, &out, &err), &err);
        TM_CHECK(out.len == 1 && out.data[0] == 's');
        tm_buf_fini(&out);
    }
    tm_tok_destroy(tok);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    TM_CHECK(system(cmd) == 0);
}

int main(void) {
    TM_RUN(test_cases);
    TM_RUN(test_refusals);
    TM_RUN(test_selection);
    return tm_test_report();
}
