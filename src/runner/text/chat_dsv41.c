/* runner/text/chat_dsv41.c - DeepSeek-V4.1's chat format. V4.1 ships no Jinja chat template:
 * its prompts come from the release's encoding module (encode_messages), which this file follows
 * in chat mode (thinking_mode "chat", no tools, no tasks, no reasoning effort) for the messages a
 * tm_message can hold (role + text content):
 *
 *   - the prompt starts with <｜begin▁of▁sentence｜>;
 *   - tool messages become <tool_result>content</tool_result> blocks of a user turn, and
 *     consecutive user/tool messages merge into one user turn, their blocks joined by "\n\n";
 *   - a system message is <｜System｜>content, a user turn <｜User｜>blocks, an assistant message
 *     content<｜end▁of▁sentence｜>;
 *   - after a user turn or a system message past the first, when the next message is an
 *     assistant one or there is none: <｜Assistant｜></think> (chat mode's empty thinking).
 *
 * add_generation_prompt 0 leaves out that header after the final message (the encoder has no
 * such switch; it always writes it). Content holding the image placeholder <｜deepseek_image｜>
 * is refused, as the encoder refuses it (images are content blocks there; tokenmill has none). */
#include <string.h>

#include "runner/text/chat.h"
#include "runner/text/chat_int.h"

#define BOS                                                                                        \
    "<\xef\xbd\x9c"                                                                                \
    "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define EOS                                                                                        \
    "<\xef\xbd\x9c"                                                                                \
    "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define SYSTEM "<\xef\xbd\x9cSystem\xef\xbd\x9c>"
#define USER "<\xef\xbd\x9cUser\xef\xbd\x9c>"
#define ASSISTANT                                                                                  \
    "<\xef\xbd\x9c"                                                                                \
    "Assistant\xef\xbd\x9c>"
#define THINK_END "</think>"
#define IMAGE                                                                                      \
    "<\xef\xbd\x9c"                                                                                \
    "deepseek_image\xef\xbd\x9c>"

/* The role of message i after merging: user and tool messages both make user turns. */
static int is_user_like(const tm_message *m) {
    return !strcmp(m->role, "user") || !strcmp(m->role, "tool");
}

tm_rc tm_chat_render_dsv41(const tm_message *msgs, uint32_t n, int add_generation_prompt,
                           tm_buf *out, tm_err *err) {
    tm_rc rc = tm_chat_check_messages(msgs, n, err);
    if (rc)
        return rc;
    for (uint32_t i = 0; i < n; i++)
        if (strstr(msgs[i].content, IMAGE))
            return TM_ERR(err, TM_E_INVAL,
                          "chat: message %u (%s) contains the image placeholder " IMAGE
                          " (DeepSeek-V4.1 takes images as content blocks, which tokenmill "
                          "does not support)",
                          i, msgs[i].role);
    rc = tm_buf_append_str(out, BOS, err);
    // turn = index of the rendered (merged) message; i walks the input messages
    uint32_t turn = 0;
    for (uint32_t i = 0; i < n && rc == TM_OK; turn++) {
        const tm_message *m = &msgs[i];
        int user_turn = is_user_like(m);
        uint32_t next = i + 1;
        if (user_turn) {
            rc = tm_buf_append_str(out, USER, err);
            for (uint32_t j = i; j < n && is_user_like(&msgs[j]) && rc == TM_OK; j++) {
                if (j > i)
                    rc = tm_buf_append_str(out, "\n\n", err);
                if (rc == TM_OK && !strcmp(msgs[j].role, "tool"))
                    rc = tm_buf_printf(out, err, "<tool_result>%s</tool_result>", msgs[j].content);
                else if (rc == TM_OK)
                    rc = tm_buf_append_str(out, msgs[j].content, err);
                next = j + 1;
            }
        } else if (!strcmp(m->role, "system")) {
            rc = tm_buf_append_str(out, SYSTEM, err);
            if (rc == TM_OK)
                rc = tm_buf_append_str(out, m->content, err);
        } else { // assistant (chat mode: no thinking part)
            rc = tm_buf_append_str(out, m->content, err);
            if (rc == TM_OK)
                rc = tm_buf_append_str(out, EOS, err);
        }
        if (rc)
            break;
        // The generation header follows a user turn, or a system message past the first, when
        // an assistant message follows or nothing does.
        int last = next >= n;
        int header_role = user_turn || (!strcmp(m->role, "system") && turn > 0);
        if (header_role && (last ? add_generation_prompt : !strcmp(msgs[next].role, "assistant")))
            rc = tm_buf_append_str(out, ASSISTANT THINK_END, err);
        i = next;
    }
    return rc;
}
