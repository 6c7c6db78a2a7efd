/* tests/unit/test_jinja.c - the Jinja subset (runner/text/jinja.h) against @huggingface/jinja:
 * every template in tests/fixtures/chat_templates/ (DeepSeek V3, Llama 3, Qwen2, Mistral, and a
 * feature-exercise template) renders every message list of expected.jsonl (made by
 * tools/gen_chat_refs.cjs) byte for byte, with and without add_generation_prompt, and raises where
 * the reference raises; plus parse errors, runtime errors and the work limits. */
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "base/alloc.h"
#include "runner/text/jinja.h"
#include "tm_test.h"

static char g_dir[1024];

static json_t *load_json(const char *name) {
    char path[1200];
    snprintf(path, sizeof(path), "%s/%s", g_dir, name);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    TM_CHECK_MSG(j != NULL, "%s: %s", path, je.text);
    return j;
}

static void test_reference_renderings(void) {
    char path[1200];
    snprintf(path, sizeof(path), "%s/expected.jsonl", g_dir);
    FILE *f = fopen(path, "r");
    TM_CHECK(f != NULL);
    if (!f)
        return;
    char *line = NULL;
    size_t cap = 0;
    int n_case = 0, n_err = 0;
    json_t *tpl_json = NULL;
    tm_jinja *tpl = NULL;
    char cur[64] = "";
    while (getline(&line, &cap, f) > 0) {
        json_t *row = json_loads(line, 0, NULL);
        TM_CHECK(row != NULL);
        if (!row)
            continue;
        const char *name = json_string_value(json_object_get(row, "template"));
        tm_err err = {0};
        if (strcmp(name, cur) != 0) { // next template
            tm_jinja_destroy(tpl);
            tpl = NULL;
            json_decref(tpl_json);
            char file[96];
            snprintf(file, sizeof(file), "%s.json", name);
            tpl_json = load_json(file);
            const char *src = json_string_value(json_object_get(tpl_json, "chat_template"));
            TM_CHECK_OK(tm_jinja_parse(src, strlen(src), &tpl, &err), &err);
            snprintf(cur, sizeof(cur), "%s", name);
        }
        json_t *msgs = json_object_get(row, "messages");
        size_t n = json_array_size(msgs);
        tm_message *m = tm_calloc(n + 1, sizeof(*m));
        for (size_t i = 0; i < n; i++) {
            m[i].role = (char *)json_string_value(json_object_get(json_array_get(msgs, i), "role"));
            m[i].content =
                (char *)json_string_value(json_object_get(json_array_get(msgs, i), "content"));
        }
        tm_jinja_vars vars = {
            .msgs = m,
            .n_msgs = (uint32_t)n,
            .add_generation_prompt = json_is_true(json_object_get(row, "add_generation_prompt")),
            .bos_token = json_string_value(json_object_get(tpl_json, "bos_token")),
            .eos_token = json_string_value(json_object_get(tpl_json, "eos_token"))};
        tm_buf out = {0};
        tm_rc rc = tpl ? tm_jinja_render(tpl, &vars, &out, &err) : TM_E_INVAL;
        const char *want = json_string_value(json_object_get(row, "rendered"));
        const char *want_err = json_string_value(json_object_get(row, "error"));
        if (want) {
            TM_CHECK_MSG(rc == TM_OK && strcmp(out.data ? out.data : "", want) == 0,
                         "%s case %d (rc %d %s):\n--- got ---\n%s\n--- want ---\n%s", name, n_case,
                         rc, err.msg, out.data ? out.data : "", want);
        } else {
            TM_CHECK_MSG(rc == TM_E_INVAL && strstr(err.msg, want_err) != NULL,
                         "%s case %d: want error '%s', got rc %d '%s'", name, n_case, want_err, rc,
                         err.msg);
            n_err++;
        }
        n_case++;
        tm_buf_fini(&out);
        tm_free(m);
        json_decref(row);
    }
    free(line);
    fclose(f);
    tm_jinja_destroy(tpl);
    json_decref(tpl_json);
    TM_CHECK(n_case >= 150 && n_err > 0);
    fprintf(stderr, "  %d reference renderings (%d raise)\n", n_case, n_err);
}

static tm_rc render_src(const char *src, tm_buf *out, tm_err *err) {
    tm_jinja *t = NULL;
    tm_rc rc = tm_jinja_parse(src, strlen(src), &t, err);
    if (rc)
        return rc;
    tm_message m[2] = {{"user", "hi"}, {"assistant", "yo"}};
    tm_jinja_vars v = {.msgs = m, .n_msgs = 2, .bos_token = "<s>", .eos_token = "</s>"};
    rc = tm_jinja_render(t, &v, out, err);
    tm_jinja_destroy(t);
    return rc;
}

static void check_render(const char *src, const char *want) {
    tm_buf out = {0};
    tm_err err = {0};
    tm_rc rc = render_src(src, &out, &err);
    TM_CHECK_MSG(rc == TM_OK && strcmp(out.data ? out.data : "", want) == 0,
                 "%s: rc %d (%s) got '%s' want '%s'", src, rc, err.msg, out.data ? out.data : "",
                 want);
    tm_buf_fini(&out);
}

static void check_error(const char *src, const char *msg_part) {
    tm_buf out = {0};
    tm_err err = {0};
    tm_rc rc = render_src(src, &out, &err);
    TM_CHECK_MSG(rc == TM_E_INVAL && strstr(err.msg, msg_part),
                 "%s: want error containing '%s', got rc %d '%s'", src, msg_part, rc, err.msg);
    tm_buf_fini(&out);
}

static void test_expressions(void) {
    check_render("{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ -7 % 3 }} {{ 'a' ~ 1 ~ true }}", "7 3 2 a1True");
    check_render("{{ messages | length }}{{ messages[-1].content | upper }}", "2YO");
    check_render("{{ messages[1:] | length }}{{ 'abc'[1:] }}{{ 'abc'[:-1] }}", "1bcab");
    check_render("{{ 'x' if false }}|{{ none }}|{{ undefined_name }}|{{ [1, 'a'] }}",
                 "|None||[1, 'a']");
    check_render("{% set d = {'k': 'v', 'n': 2} %}{{ d.k }}{{ d['n'] }}{{ d.get('z', 'dflt') }}"
                 "{% for k, v in d.items() %}[{{ k }}={{ v }}]{% endfor %}",
                 "v2dflt[k=v][n=2]");
    check_render(
        "{{ 'a,b,c'.split(',') | join('+') }} {{ ' t '.strip() }}{{ 'Hi'.startswith('H') }}"
        "{{ 'ab' in 'cabd' }}{{ 3 not in [1, 2] }}",
        "a+b+c tTrueTrueTrue");
    check_render("{% for x in [] %}no{% else %}empty{% endfor %}{% for i in range(3) %}"
                 "{{ loop.index0 }}{{ loop.revindex }}{% endfor %}",
                 "empty031221");
    check_render("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}", "1");
    check_render("{{ {'a': [1, 2]} | tojson }} {{ 'q\"' | tojson }}", "{\"a\": [1, 2]} \"q\\\"\"");
    check_render("  {%- if true -%}  x  {%- endif -%}  \n", "x");
    check_render("a\n  {% if true %}\nb\n  {% endif %}\nc", "a\nb\nc");
    check_render("{# comment #}{{ bos_token ~ eos_token }}", "<s></s>");
    check_render("{{ 'a' 'b' }}{{ \"\\n\" | length }}", "ab1");
}

static void test_errors(void) {
    check_error("{{ raise_exception('no system role') }}", "template raised: no system role");
    check_error("{% if x %}unclosed", "missing {% elif else endif %}");
    check_error("{% endfor %}", "unexpected 'endfor'");
    check_error("{{ x | nosuchfilter }}", "unknown filter 'nosuchfilter'");
    check_error("{% macro m() %}{% endmacro %}", "'macro' statements are not supported");
    check_error("{{ 1 + }}", "unexpected");
    check_error("{{ 'a' - 1 }}", "'-' with string and integer");
    check_error("{{ 1 / 0 }}", "division by zero");
    check_error("{{ 1.5 }}", "floats are not supported");
    check_error("{{ x.y }}", "undefined value");
    check_error("{% set ns = 1 %}{% set ns.a = 2 %}", "not a namespace");
    check_error("{{ 'unterminated }}", "unterminated string");
    check_error("{{ x ", "unclosed tag");
    // work limits: nested loops, output size, nesting depth
    check_error("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                "more than");
    check_error(
        "{% for i in range(100000) %}{% for j in range(1000) %}xxxxxxxxxxxxxxxxxxxxxxxxxxx"
        "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
        "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
        "{% endfor %}{% endfor %}",
        "template: "); // the output or the value-memory limit, whichever comes first
    char deep[2048] = "{{ ";
    for (int i = 0; i < 300; i++)
        strcat(deep, "(");
    strcat(deep, "1");
    for (int i = 0; i < 300; i++)
        strcat(deep, ")");
    strcat(deep, " }}");
    check_error(deep, "nested deeper");
}

// Hostile templates (issue 24): each ends in a TM_E_INVAL "template: ..." error (a per-record
// template_error), never TM_E_NOMEM (which ends the job), a crash or a hang; and rendering them
// all stays within a few hundred MB.
static void test_hostile(void) {
    // s: a 1 MiB string built by doubling; big, big2: 1 MiB strings that differ at the end
#define MIB_S                                                                                      \
    "{% set ns = namespace(s='x') %}{% for i in range(20) %}{% set ns.s = ns.s ~ ns.s %}"          \
    "{% endfor %}"
    static const struct {
        const char *src, *msg;
    } cases[] = {
        // doubling a string 40 times (the job-level template of the issue)
        {"{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
         "{% endfor %}{{ ns.s }}",
         "template: more than 64 MiB of values"},
        {"{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}"
         "{% endfor %}{{ ns.s | length }}",
         "template: more than 64 MiB of values"},
        {"{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}"
         "{% endfor %}{{ ns.l | length }}",
         "template: more than 64 MiB of values"},
        // printing, tojson and string of 20 references to a 1 MiB string
        {MIB_S "{% set n2 = namespace(l=[]) %}{% for i in range(20) %}"
               "{% set n2.l = n2.l + [ns.s] %}{% endfor %}{{ n2.l }}",
         "template: a string over 16 MiB"},
        {MIB_S "{% set n2 = namespace(l=[]) %}{% for i in range(20) %}"
               "{% set n2.l = n2.l + [ns.s] %}{% endfor %}{{ n2.l | tojson }}",
         "template: a string over 16 MiB"},
        {MIB_S "{% set n2 = namespace(l=[]) %}{% for i in range(20) %}"
               "{% set n2.l = n2.l + [ns.s] %}{% endfor %}{{ n2.l | string | length }}",
         "template: a string over 16 MiB"},
        {MIB_S "{{ ns.s.replace('x', 'yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy') }}",
         "template: a string over 16 MiB"},
        // values nested 1000 deep, and a namespace that holds itself: printed or compared
        {"{% set ns = namespace(l=[]) %}{% for i in range(1000) %}{% set ns.l = [ns.l] %}"
         "{% endfor %}{{ ns.l }}",
         "nested too deep"},
        {"{% set ns = namespace(l=[]) %}{% for i in range(1000) %}{% set ns.l = [ns.l] %}"
         "{% endfor %}{{ ns.l | tojson }}",
         "nested too deep"},
        {"{% set ns = namespace(l=[]) %}{% for i in range(1000) %}{% set ns.l = [ns.l] %}"
         "{% endfor %}{{ ns.l == ns.l }}",
         "nested too deep"},
        {"{% set ns = namespace(a=1) %}{% set ns.me = ns %}{{ ns }}", "nested too deep"},
        {"{% set ns = namespace(a=1) %}{% set ns.me = [ns, ns] %}{{ ns | tojson }}", "template: "},
        // CPU: comparing and searching 1 MiB strings 100000 times (minutes before)
        {MIB_S "{% set a = ns.s ~ 'a' %}{% set b = ns.s ~ 'b' %}{% for i in range(100000) %}"
               "{% if a == b %}{% endif %}{% endfor %}",
         "template: more than 1024 MiB of string work"},
        {MIB_S "{% set a = ns.s ~ 'a' %}{% for i in range(100000) %}"
               "{% if 'xa' in a and a.split('q') %}{% endif %}{% endfor %}",
         "template: more than 1024 MiB of string work"},
        // huge ranges (one whose size overflows), nested loops, division by zero
        {"{% for i in range(1000000000) %}{% endfor %}", "range() over 100000 items"},
        {"{% set lo = 0 - 9 * 1000000000000000000 %}{{ range(lo, 9 * 1000000000000000000) }}",
         "range() over 100000 items"},
        {"{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}"
         "{% endfor %}",
         "template: "},
        {"{{ (messages | length) // 0 }}", "division by zero"},
        {"{% for m in messages %}{{ 7 % (loop.index - 1) }}{% endfor %}", "division by zero"},
    };
#undef MIB_S
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        check_error(cases[i].src, cases[i].msg);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    TM_CHECK_MSG(ru.ru_maxrss < 512 * 1024, "max RSS %ld KiB after the hostile templates",
                 ru.ru_maxrss);
}

// Issue 35: parsing is linear in the template's size. A flat template of 1 MiB of blocks, and
// 100,000 nested blocks (refused at the nesting limit), cost the parser a small multiple of their
// bytes in steps (tm_jinja_parse_steps); before, the tag scanner counted lines from the start for
// every tag: about 40 GB of scanning for the first, 240 GB for the second.
static void test_linear_parse(void) {
    static const char blk[] = "{% if messages %}{{ messages[0].content }}{% endif %}\n";
    size_t n_blk = (1u << 20) / (sizeof(blk) - 1) + 1, n = n_blk * (sizeof(blk) - 1);
    char *src = tm_malloc(n + 1);
    TM_CHECK(src != NULL);
    for (size_t i = 0; i < n_blk; i++)
        memcpy(src + i * (sizeof(blk) - 1), blk, sizeof(blk) - 1);
    src[n] = '\0';
    tm_jinja *t = NULL;
    tm_err err = {0};
    TM_CHECK_OK(tm_jinja_parse(src, n, &t, &err), &err);
    uint64_t steps = tm_jinja_parse_steps(t);
    TM_CHECK_MSG(steps >= n && steps <= 4 * (uint64_t)n, "%llu parse steps for %zu bytes",
                 (unsigned long long)steps, n);
    tm_message m[1] = {{"user", "hi"}};
    tm_jinja_vars v = {.msgs = m, .n_msgs = 1, .bos_token = "", .eos_token = ""};
    tm_buf out = {0};
    TM_CHECK_OK(tm_jinja_render(t, &v, &out, &err), &err);
    TM_CHECK_MSG(out.len == 2 * n_blk, "rendered %zu bytes, want %zu", out.len, 2 * n_blk);
    tm_buf_fini(&out);
    tm_jinja_destroy(t);
    tm_free(src);

    // 100,000 nested blocks: refused by the nesting limit, naming it and the line
    static const char open_[] = "{% if true %}\n", close_[] = "{% endif %}\n";
    size_t depth = 100000, no = sizeof(open_) - 1, nc = sizeof(close_) - 1;
    n = depth * (no + nc);
    src = tm_malloc(n + 1);
    TM_CHECK(src != NULL);
    for (size_t i = 0; i < depth; i++) {
        memcpy(src + i * no, open_, no);
        memcpy(src + depth * no + i * nc, close_, nc);
    }
    src[n] = '\0';
    tm_rc rc = tm_jinja_parse(src, n, &t, &err);
    TM_CHECK_MSG(rc == TM_E_INVAL && strstr(err.msg, "blocks nested deeper than 64 at line 65"),
                 "rc %d: %s", rc, err.msg);
    tm_free(src);
}

int main(void) {
    const char *src = getenv("TM_SRC");
    snprintf(g_dir, sizeof(g_dir), "%s/tests/fixtures/chat_templates", src ? src : ".");
    TM_RUN(test_reference_renderings);
    TM_RUN(test_expressions);
    TM_RUN(test_errors);
    TM_RUN(test_hostile);
    TM_RUN(test_linear_parse);
    return tm_test_report();
}
