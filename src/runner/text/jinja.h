/* runner/text/jinja.h - the subset of Jinja that Hugging Face chat templates use, rendered as
 * transformers' apply_chat_template renders them (jinja2 with trim_blocks and lstrip_blocks):
 *   text, {{ expr }}, {% stmt %}, {# comments #}, whitespace control ({%- -%} {{- -}});
 *   statements: if / elif / else / endif, for x in expr (and for k, v in ...) / else / endfor with
 *   the loop variable (index, index0, revindex, revindex0, first, last, length), set name = expr,
 *   set ns.attr = expr; a for body is its own scope (as in jinja2: use namespace() to carry state);
 *   expressions: string / integer / true / false / none literals, list and dict literals, names,
 *   a.b, a['b'], a[i], slices a[i:j], calls, not / and / or, == != < > <= >= in, not in, + - * /
 *   // %, ~, x if c else y, is [not] defined / none / string / number / mapping / iterable /
 *   sequence / boolean / true / false / even / odd;
 *   filters: trim, length, count, upper, lower, capitalize, string, tojson, first, last, default,
 *   join, items, list, reverse, int;
 *   string methods strip, lstrip, rstrip, startswith, endswith, upper, lower, split, replace;
 *   dict methods get, items, keys, values;
 *   globals: namespace(...), raise_exception(msg), range(n).
 * Anything else (macros, call blocks, includes, other filters) is a parse error naming it. The
 * renderer limits work so a hostile template cannot hang, crash or exhaust memory: evaluation
 * steps (loop iterations), output bytes (16 MiB), value memory (64 MiB: every string, list and
 * dict, so also their count), one string built while printing (16 MiB), bytes of string work
 * (compare, search, copy: 1 GiB), nesting of blocks, expressions and values (also a namespace that
 * holds itself), range() size; each is TM_E_INVAL "template: ...", never TM_E_NOMEM, so the runner
 * makes it the record's template_error (jinja.c lists the values). Parsing is linear in the
 * template's size, and blocks nest at most 64 deep (deeper is a parse error saying so), so a
 * template of any size or nesting is parsed or refused in time linear in its bytes. A template is
 * immutable after parse; render is thread-safe. */
#ifndef TM_RUNNER_TEXT_JINJA_H
#define TM_RUNNER_TEXT_JINJA_H

#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "base/err.h"
#include "base/record.h"

typedef struct tm_jinja tm_jinja; /* a parsed template (opaque) */

/* The variables a chat template sees. */
typedef struct tm_jinja_vars {
    const tm_message *msgs; /* messages: [n_msgs] {role, content} dicts; borrowed */
    uint32_t n_msgs;
    int add_generation_prompt;
    const char *bos_token; /* "" when the tokenizer has none; borrowed */
    const char *eos_token;
} tm_jinja_vars;

/* Parse src[0..n). On success *out owns the template (free with tm_jinja_destroy). TM_E_INVAL
 * with "template: <what> at line L" for syntax the subset does not have; TM_E_NOMEM. */
tm_rc tm_jinja_parse(const char *src, size_t n, tm_jinja **out, tm_err *err);
void tm_jinja_destroy(tm_jinja *t); /* NULL is a no-op */

/* The work tm_jinja_parse did on t: the bytes of source its scanner, line counter and lexer
 * visited. Parsing is linear in the template's size (issue 35): this stays within a small multiple
 * of n whatever the template, which tests/unit/test_jinja.c holds it to. */
uint64_t tm_jinja_parse_steps(const tm_jinja *t);

/* Render t with vars, appending to out (on error out may hold a partial rendering). TM_E_INVAL:
 * raise_exception("msg") ("template raised: msg"), a type error, or a limit hit; TM_E_NOMEM. */
tm_rc tm_jinja_render(const tm_jinja *t, const tm_jinja_vars *vars, tm_buf *out, tm_err *err);

#endif /* TM_RUNNER_TEXT_JINJA_H */
