/* runner/text/chat.c - chat prompt rendering: the chat template through the Jinja subset
 * (runner/text/jinja.h), or the plain fallback when there is none. tm_chat_render_with parses the
 * template on each call; a job compiles it once (tm_chat_tpl) and renders every record with it. */
#include "runner/text/chat.h"

#include <string.h>

#include "base/alloc.h"
#include "runner/text/chat_int.h"
#include "runner/text/jinja.h"

tm_rc tm_chat_check_messages(const tm_message *msgs, uint32_t n, tm_err *err) {
    for (uint32_t i = 0; i < n; i++) {
        const char *r = msgs[i].role ? msgs[i].role : "(null)";
        if (strcmp(r, "system") != 0 && strcmp(r, "user") != 0 && strcmp(r, "assistant") != 0 &&
            strcmp(r, "tool") != 0)
            return TM_ERR(err, TM_E_INVAL,
                          "chat: message %u has unknown role \"%.64s\" (want "
                          "system, user, assistant or tool)",
                          i, r);
        if (!msgs[i].content)
            return TM_ERR(err, TM_E_INVAL, "chat: message %u (%s) has no content", i, r);
    }
    return TM_OK;
}

/* DeepSeek-V4.1's tokenizer (no chat template) carries these three protocol tokens. */
static int has_dsv41_tokens(const tm_tokenizer *tok) {
    return tok && tm_tok_find(tok, "<｜System｜>") >= 0 && tm_tok_find(tok, "<｜User｜>") >= 0 &&
           tm_tok_find(tok, "<｜Assistant｜>") >= 0;
}

tm_chat_format tm_chat_format_of(const tm_tokenizer *tok) {
    const char *t = tm_tok_chat_template(tok);
    if (!t || !*t)
        return has_dsv41_tokens(tok) ? TM_CHAT_FORMAT_DSV41 : TM_CHAT_FORMAT_PLAIN;
    if (strstr(t, "<｜User｜>") && strstr(t, "<｜Assistant｜>"))
        return TM_CHAT_FORMAT_DEEPSEEK;
    return TM_CHAT_FORMAT_JINJA;
}

static tm_rc render_plain(const tm_message *msgs, uint32_t n, int add_generation_prompt,
                          tm_buf *out, tm_err *err) {
    for (uint32_t i = 0; i < n; i++) {
        tm_rc rc = tm_buf_printf(out, err, "%s: %s\n", msgs[i].role, msgs[i].content);
        if (rc)
            return rc;
    }
    if (add_generation_prompt)
        return tm_buf_append_str(out, "assistant: ", err);
    return TM_OK;
}

struct tm_chat_tpl {
    const tm_tokenizer *tok; /* borrowed */
    tm_jinja *tpl;           /* NULL: plain or V4.1 format, or a template that did not parse */
    int dsv41;               /* no template and V4.1's protocol tokens: chat_dsv41.c renders */
    tm_rc parse_rc;          /* TM_OK, or the template's parse error (parse_err) */
    tm_err parse_err;
};

tm_rc tm_chat_tpl_create(const tm_tokenizer *tok, const char *chat_template, tm_chat_tpl **out,
                         tm_err *err) {
    tm_chat_tpl *c = tm_calloc(1, sizeof(*c));
    if (!c)
        return TM_ERR(err, TM_E_NOMEM, "chat template");
    c->tok = tok;
    const char *t = chat_template ? chat_template : tm_tok_chat_template(tok);
    if (!t || !*t)
        c->dsv41 = has_dsv41_tokens(tok);
    if (t && *t) {
        c->parse_rc = tm_jinja_parse(t, strlen(t), &c->tpl, &c->parse_err);
        if (c->parse_rc == TM_E_NOMEM) {
            *err = c->parse_err;
            tm_chat_tpl_destroy(c);
            return TM_E_NOMEM;
        }
    }
    *out = c;
    return TM_OK;
}

void tm_chat_tpl_destroy(tm_chat_tpl *c) {
    if (!c)
        return;
    tm_jinja_destroy(c->tpl);
    tm_free(c);
}

tm_rc tm_chat_tpl_render(const tm_chat_tpl *c, const tm_message *msgs, uint32_t n,
                         int add_generation_prompt, tm_buf *out, tm_err *err) {
    tm_rc rc = tm_chat_check_messages(msgs, n, err);
    if (rc)
        return rc;
    if (c->parse_rc) {
        *err = c->parse_err;
        return c->parse_rc;
    }
    if (c->dsv41)
        return tm_chat_render_dsv41(msgs, n, add_generation_prompt, out, err);
    if (!c->tpl)
        return render_plain(msgs, n, add_generation_prompt, out, err);
    tm_jinja_vars vars = {.msgs = msgs,
                          .n_msgs = n,
                          .add_generation_prompt = add_generation_prompt,
                          .bos_token = tm_tok_bos_text(c->tok),
                          .eos_token = tm_tok_eos_text(c->tok)};
    return tm_jinja_render(c->tpl, &vars, out, err);
}

tm_rc tm_chat_render_with(const tm_tokenizer *tok, const char *chat_template,
                          const tm_message *msgs, uint32_t n, int add_generation_prompt,
                          tm_buf *out, tm_err *err) {
    tm_rc rc = tm_chat_check_messages(msgs, n, err);
    if (rc)
        return rc;
    tm_chat_tpl *c = NULL;
    rc = tm_chat_tpl_create(tok, chat_template, &c, err);
    if (rc)
        return rc;
    rc = tm_chat_tpl_render(c, msgs, n, add_generation_prompt, out, err);
    tm_chat_tpl_destroy(c);
    return rc;
}

tm_rc tm_chat_render(const tm_tokenizer *tok, const tm_message *msgs, uint32_t n,
                     int add_generation_prompt, tm_buf *out, tm_err *err) {
    return tm_chat_render_with(tok, NULL, msgs, n, add_generation_prompt, out, err);
}
