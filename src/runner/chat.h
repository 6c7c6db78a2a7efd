/* runner/chat.h - render a conversation (system/user/assistant/tool messages) into the prompt
 * text the model expects, following the tokenizer's chat_template. C has no Jinja engine, so the
 * template is recognised by kind rather than interpreted:
 *   - DeepSeek V3/V4 (the template contains "<｜User｜>" and "<｜Assistant｜>"): rendered exactly as
 *     that template renders system, user, assistant and tool messages: bos_token, then every
 *     system content joined by "\n\n", then per message "<｜User｜>" + content,
 *     "<｜Assistant｜>" + content + "<｜end▁of▁sentence｜>", or the tool-output wrappers; finally
 *     "<｜Assistant｜>" when add_generation_prompt (and the last message is not a tool output).
 *     Assistant tool calls (content none + tool_calls) are not representable in tm_message and
 *     are not rendered.
 *   - anything else, or no template: a documented plain format, one "<role>: <content>\n" line
 *     per message, then "assistant: " when add_generation_prompt.
 * Roles must be "system", "user", "assistant" or "tool" (TM_E_INVAL otherwise, naming the role
 * and message index); content must not be NULL. Pure function of its inputs; thread-safe. */
#ifndef TM_RUNNER_CHAT_H
#define TM_RUNNER_CHAT_H

#include <stdint.h>

#include "base/buf.h"
#include "base/err.h"
#include "base/record.h"
#include "runner/tokenizer.h"

typedef enum tm_chat_format {
    TM_CHAT_FORMAT_PLAIN = 0, /* "<role>: <content>\n" lines, then "assistant: " */
    TM_CHAT_FORMAT_DEEPSEEK,  /* DeepSeek V3/V4 chat template */
} tm_chat_format;

/* Which format tm_chat_render uses for tok (from its chat_template). */
tm_chat_format tm_chat_format_of(const tm_tokenizer *tok);

/* Append the rendered prompt for msgs[0..n) to out. tok and msgs are borrowed. On error out may
 * hold a partial rendering (its previous content is kept). TM_E_INVAL: an unknown role or NULL
 * content; TM_E_NOMEM. */
tm_rc tm_chat_render(const tm_tokenizer *tok, const tm_message *msgs, uint32_t n,
                     int add_generation_prompt, tm_buf *out, tm_err *err);

#endif /* TM_RUNNER_CHAT_H */
