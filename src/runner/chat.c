/* runner/chat.c - chat prompt rendering: the DeepSeek V3/V4 template re-implemented in C (see
 * chat.h), and the plain fallback. The DeepSeek code follows the Jinja template statement by
 * statement, including its state flags (ns.is_tool, ns.is_output_first), so quirks carry over:
 * e.g. only the first tool output of the whole conversation opens with
 * "<｜tool▁outputs▁begin｜>". */
#include "runner/chat.h"

#include <string.h>

static tm_rc check_messages(const tm_message *msgs, uint32_t n, tm_err *err) {
    for (uint32_t i = 0; i < n; i++) {
        const char *r = msgs[i].role ? msgs[i].role : "(null)";
        if (strcmp(r, "system") != 0 && strcmp(r, "user") != 0 && strcmp(r, "assistant") != 0 &&
            strcmp(r, "tool") != 0)
            return TM_ERR(err, TM_E_INVAL, "chat: message %u has unknown role \"%.64s\" (want "
                          "system, user, assistant or tool)", i, r);
        if (!msgs[i].content)
            return TM_ERR(err, TM_E_INVAL, "chat: message %u (%s) has no content", i, r);
    }
    return TM_OK;
}

static int role_is(const tm_message *m, const char *role) {
    return strcmp(m->role, role) == 0;
}

tm_chat_format tm_chat_format_of(const tm_tokenizer *tok) {
    const char *t = tm_tok_chat_template(tok);
    if (t && strstr(t, "<｜User｜>") && strstr(t, "<｜Assistant｜>"))
        return TM_CHAT_FORMAT_DEEPSEEK;
    return TM_CHAT_FORMAT_PLAIN;
}

/* Append a, then b and c unless NULL (a NULL ends the list). */
static tm_rc cat(tm_buf *out, tm_err *err, const char *a, const char *b, const char *c) {
    const char *parts[3] = {a, b, c};
    for (int i = 0; i < 3; i++) {
        if (!parts[i])
            break;
        tm_rc rc = tm_buf_append_str(out, parts[i], err);
        if (rc)
            return rc;
    }
    return TM_OK;
}

static tm_rc render_deepseek(const tm_tokenizer *tok, const tm_message *msgs, uint32_t n,
                             int add_generation_prompt, tm_buf *out, tm_err *err) {
    static const char *const EOS = "<｜end▁of▁sentence｜>"; // literal in the template
    tm_rc rc = tm_buf_append_str(out, tm_tok_bos_text(tok), err);
    if (rc)
        return rc;
    // {{ns.system_prompt}}: every system message, in order, joined by "\n\n"
    int first_sp = 1;
    for (uint32_t i = 0; i < n; i++) {
        if (!role_is(&msgs[i], "system"))
            continue;
        rc = cat(out, err, first_sp ? "" : "\n\n", msgs[i].content, NULL);
        if (rc)
            return rc;
        first_sp = 0;
    }
    int is_tool = 0, is_output_first = 1;
    for (uint32_t i = 0; i < n && rc == TM_OK; i++) {
        const tm_message *m = &msgs[i];
        if (role_is(m, "user")) {
            is_tool = 0;
            rc = cat(out, err, "<｜User｜>", m->content, NULL);
        } else if (role_is(m, "assistant")) {
            if (is_tool) {
                rc = cat(out, err, "<｜tool▁outputs▁end｜>", m->content, EOS);
                is_tool = 0;
            } else {
                rc = cat(out, err, "<｜Assistant｜>", m->content, EOS);
            }
        } else if (role_is(m, "tool")) {
            is_tool = 1;
            if (is_output_first) {
                rc = cat(out, err, "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>", m->content,
                         "<｜tool▁output▁end｜>");
                is_output_first = 0;
            } else {
                rc = cat(out, err, "\n<｜tool▁output▁begin｜>", m->content, "<｜tool▁output▁end｜>");
            }
        }
    }
    if (rc)
        return rc;
    if (is_tool)
        return tm_buf_append_str(out, "<｜tool▁outputs▁end｜>", err);
    if (add_generation_prompt)
        return tm_buf_append_str(out, "<｜Assistant｜>", err);
    return TM_OK;
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

tm_rc tm_chat_render(const tm_tokenizer *tok, const tm_message *msgs, uint32_t n,
                     int add_generation_prompt, tm_buf *out, tm_err *err) {
    tm_rc rc = check_messages(msgs, n, err);
    if (rc)
        return rc;
    if (tm_chat_format_of(tok) == TM_CHAT_FORMAT_DEEPSEEK)
        return render_deepseek(tok, msgs, n, add_generation_prompt, out, err);
    return render_plain(msgs, n, add_generation_prompt, out, err);
}
