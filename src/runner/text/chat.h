/* runner/text/chat.h - render a conversation (system/user/assistant/tool messages) into the prompt
 * text the model expects:
 *   - with a chat template (the tokenizer_config.json's chat_template, or a job-level override):
 *     the template is interpreted by the Jinja subset in runner/text/jinja.h, with the variables
 *     transformers' apply_chat_template passes: messages ({role, content} dicts),
 *     add_generation_prompt, bos_token, eos_token. Checked against @huggingface/jinja's renderings
 *     for the DeepSeek V3, Llama 3, Qwen2 (ChatML) and Mistral templates (tests/unit/test_jinja.c).
 *     Assistant tool calls (content none + tool_calls) are not representable in tm_message.
 *   - without one: a documented plain format, one "<role>: <content>\n" line per message, then
 *     "assistant: " when add_generation_prompt.
 * Roles must be "system", "user", "assistant" or "tool" (TM_E_INVAL otherwise, naming the role
 * and message index); content must not be NULL. A template that does not parse, or that raises
 * (raise_exception) or fails while rendering, is TM_E_INVAL with the template's message: the
 * runner turns it into a template_error record. Pure function of its inputs; thread-safe. */
#ifndef TM_RUNNER_TEXT_CHAT_H
#define TM_RUNNER_TEXT_CHAT_H

#include <stdint.h>

#include "base/buf.h"
#include "base/err.h"
#include "base/record.h"
#include "runner/text/tokenizer.h"

typedef enum tm_chat_format {
    TM_CHAT_FORMAT_PLAIN = 0, /* "<role>: <content>\n" lines, then "assistant: " */
    TM_CHAT_FORMAT_DEEPSEEK,  /* a DeepSeek V3/V4 chat template (rendered by the Jinja subset) */
    TM_CHAT_FORMAT_JINJA,     /* any other chat template (rendered by the Jinja subset) */
    TM_CHAT_FORMAT_DSV41,     /* no template, and the tokenizer has DeepSeek-V4.1's <｜System｜>,
                               * <｜User｜> and <｜Assistant｜>: V4.1's encoding (chat_dsv41.c) */
} tm_chat_format;

/* Which kind of template tm_chat_render uses for tok (from its chat_template). */
tm_chat_format tm_chat_format_of(const tm_tokenizer *tok);

/* Append the rendered prompt for msgs[0..n) to out, with tok's chat_template. tok and msgs are
 * borrowed. On error out may hold a partial rendering (its previous content is kept).
 * TM_E_INVAL: an unknown role, NULL content, or a template error; TM_E_NOMEM. */
tm_rc tm_chat_render(const tm_tokenizer *tok, const tm_message *msgs, uint32_t n,
                     int add_generation_prompt, tm_buf *out, tm_err *err);

/* DeepSeek-V4.1's chat encoding (the release ships no chat template; see chat_dsv41.c): what
 * tm_chat_render uses for TM_CHAT_FORMAT_DSV41. Same roles and errors as tm_chat_render, and
 * TM_E_INVAL for content holding the image placeholder <｜deepseek_image｜>. */
tm_rc tm_chat_render_dsv41(const tm_message *msgs, uint32_t n, int add_generation_prompt,
                           tm_buf *out, tm_err *err);

/* The same with an explicit template (a job's chat_template override; NULL = the tokenizer's). */
tm_rc tm_chat_render_with(const tm_tokenizer *tok, const char *chat_template,
                          const tm_message *msgs, uint32_t n, int add_generation_prompt,
                          tm_buf *out, tm_err *err);

/* A chat template compiled once for a job (issue 35: parsing it again for every record cost a
 * hostile template's parse per record). tm_chat_tpl_create takes tok's template, or chat_template
 * when not NULL, and parses it; a template that does not parse is not an error here: it is kept,
 * and every tm_chat_tpl_render returns its parse error (TM_E_INVAL, the record's template_error),
 * as tm_chat_render_with does. On success *out owns the compiled template; tok and chat_template
 * are borrowed and must outlive it. TM_E_NOMEM. */
typedef struct tm_chat_tpl tm_chat_tpl;
tm_rc tm_chat_tpl_create(const tm_tokenizer *tok, const char *chat_template, tm_chat_tpl **out,
                         tm_err *err);
void tm_chat_tpl_destroy(tm_chat_tpl *c); /* NULL is a no-op */

/* tm_chat_render_with with the compiled template: the same output and errors. Thread-safe. */
tm_rc tm_chat_tpl_render(const tm_chat_tpl *c, const tm_message *msgs, uint32_t n,
                         int add_generation_prompt, tm_buf *out, tm_err *err);

#endif /* TM_RUNNER_TEXT_CHAT_H */
