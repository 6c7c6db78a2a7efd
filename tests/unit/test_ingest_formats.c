/* tests/unit/test_ingest_formats.c - OpenAI Batch API input lines (good ones map onto tm_job
 * fields; every unsupported or malformed one is one error record with the right code and message),
 * the record limits (limits.max_depth, max_field_bytes, max_messages), standard input ("-"), mixed
 * native and OpenAI lines in one file, and the sink's OpenAI-shaped output and error lines. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/buf.h"
#include "ingest/job_spec.h"
#include "ingest/source.h"
#include "sink/sink.h"
#include "tm_test.h"

static char g_tmp[256];

typedef struct expect {
    const char *line; /* input line (without newline) */
    tm_errcode code;
    tm_rec_format fmt;
    const char *id;  /* id_json or NULL */
    const char *msg; /* substring of err_msg, or for ok records of the prompt/first content */
} expect;

#define CHAT_HEAD "{\"custom_id\":\"%s\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\","
#define MSGS "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"

static const expect cases[] = {
    {"{\"custom_id\":\"c1\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":"
     "\"gpt-x\",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\","
     "\"content\":\"Hello\"}],\"max_tokens\":7,\"temperature\":0.5,\"top_p\":0.9,\"seed\":3,"
     "\"stop\":[\"\\n\"],\"n\":1,\"stream\":false,\"logprobs\":false,\"frequency_penalty\":0}}",
     TM_ERRCODE_NONE, TM_REC_FORMAT_OPENAI_CHAT, "\"c1\"", "Be brief."},
    {"{\"custom_id\":\"c2\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"model\":"
     "\"m\",\"prompt\":\"Once\",\"max_completion_tokens\":4,\"user\":\"ignored\"}}",
     TM_ERRCODE_NONE, TM_REC_FORMAT_OPENAI_COMPLETION, "\"c2\"", "Once"},
    {"{\"custom_id\":\"c3\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":"
     "\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
     "{\"type\":\"text\",\"text\":\"b\"}]}],\"max_tokens\":null}}",
     TM_ERRCODE_NONE, TM_REC_FORMAT_OPENAI_CHAT, "\"c3\"", "ab"},
    {"{\"id\":\"native1\",\"prompt\":\"mixed in\"}", TM_ERRCODE_NONE, TM_REC_FORMAT_NATIVE,
     "\"native1\"", "mixed in"},
    {"{\"custom_id\":\"n2\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":"
     "\"m\"," MSGS ",\"n\":200}}",
     TM_ERRCODE_INVALID_VALUE, TM_REC_FORMAT_OPENAI_CHAT, "\"n2\"", "n = 200 is more than"},
    {"{\"custom_id\":\"s1\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":"
     "\"m\"," MSGS ",\"stream\":true}}",
     TM_ERRCODE_UNSUPPORTED, TM_REC_FORMAT_OPENAI_CHAT, "\"s1\"", "streaming is not supported"},
    {"{\"custom_id\":\"e1\",\"method\":\"POST\",\"url\":\"/v1/embeddings\",\"body\":{\"model\":"
     "\"m\",\"input\":\"x\"}}",
     TM_ERRCODE_UNSUPPORTED, TM_REC_FORMAT_OPENAI, "\"e1\"", "\"/v1/embeddings\" is not supported"},
    {"{\"custom_id\":\"u1\",\"method\":\"POST\",\"url\":\"chat\",\"body\":{}}",
     TM_ERRCODE_UNSUPPORTED, TM_REC_FORMAT_OPENAI, "\"u1\"",
     "field 'url': \"chat\" is not supported"},
    {"{\"custom_id\":\"g1\",\"method\":\"GET\",\"url\":\"/v1/completions\",\"body\":{}}",
     TM_ERRCODE_INVALID_VALUE, TM_REC_FORMAT_OPENAI, "\"g1\"", "field 'method': expected \"POST\""},
    {"{\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"model\":\"m\",\"prompt\":\"x\"}}",
     TM_ERRCODE_MISSING_FIELD, TM_REC_FORMAT_OPENAI, NULL, "field 'custom_id' is required"},
    {"{\"custom_id\":7,\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{}}",
     TM_ERRCODE_WRONG_TYPE, TM_REC_FORMAT_OPENAI, NULL, "field 'custom_id': expected a string"},
    {"{\"custom_id\":\"c1\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{}}",
     TM_ERRCODE_DUPLICATE_ID, TM_REC_FORMAT_OPENAI, "\"c1\"", "already used"},
    {"{\"custom_id\":\"nm\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":"
     "\"x\"}}",
     TM_ERRCODE_MISSING_FIELD, TM_REC_FORMAT_OPENAI_COMPLETION, "\"nm\"",
     "field 'body.model' is required"},
    {"{\"custom_id\":\"pa\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"model\":"
     "\"m\",\"prompt\":[\"a\",\"b\"]}}",
     TM_ERRCODE_UNSUPPORTED, TM_REC_FORMAT_OPENAI_COMPLETION, "\"pa\"", "an array"},
    {"{\"custom_id\":\"bm\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"model\":"
     "\"m\"," MSGS "}}",
     TM_ERRCODE_INVALID_VALUE, TM_REC_FORMAT_OPENAI_COMPLETION, "\"bm\"",
     "'body.messages' is for /v1/chat/completions"},
    {"{\"custom_id\":\"t1\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":"
     "\"m\"," MSGS ",\"temperature\":\"hot\"}}",
     TM_ERRCODE_WRONG_TYPE, TM_REC_FORMAT_OPENAI_CHAT, "\"t1\"",
     "field 'body.temperature': expected a number >= 0, got \"hot\""},
    {"{\"custom_id\":\"mm\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":"
     "\"m\"," MSGS ",\"max_tokens\":3,\"max_completion_tokens\":3}}",
     TM_ERRCODE_INVALID_VALUE, TM_REC_FORMAT_OPENAI_CHAT, "\"mm\"", "give at most one of them"},
    {"{\"custom_id\":\"mc\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":"
     "\"m\"," MSGS ",\"max_completion_tokens\":0}}",
     TM_ERRCODE_INVALID_VALUE, TM_REC_FORMAT_OPENAI_CHAT, "\"mc\"",
     "field 'body.max_completion_tokens': expected an integer from 1 to 2147483647, got 0"},
    // Integers: the true range, and numbers beyond 64 bits named by field (issue 35)
    {"{\"id\":\"m31\",\"prompt\":\"x\",\"max_tokens\":2147483648}", TM_ERRCODE_INVALID_VALUE,
     TM_REC_FORMAT_NATIVE, "\"m31\"",
     "field 'max_tokens': expected an integer from 0 to 2147483647 (0: nothing generated), got "
     "2147483648"},
    {"{\"id\":\"m63\",\"prompt\":\"x\",\"max_tokens\":9223372036854775808}",
     TM_ERRCODE_INVALID_VALUE, TM_REC_FORMAT_OPENAI, NULL,
     "field 'max_tokens': expected an integer from 0 to 2147483647 (0: nothing generated), got "
     "9223372036854775808"},
    {"{\"id\":\"s64\",\"prompt\":\"x\",\"seed\":18446744073709551615}", TM_ERRCODE_INVALID_VALUE,
     TM_REC_FORMAT_OPENAI, NULL,
     "field 'seed': the integer 18446744073709551615 is out of range (integers must be from "
     "-9223372036854775808 to 9223372036854775807; seed: from 0 to 9223372036854775807)"},
    {"{\"custom_id\":\"b63\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":"
     "\"m\"," MSGS ",\"max_tokens\":-9223372036854775809}}",
     TM_ERRCODE_INVALID_VALUE, TM_REC_FORMAT_OPENAI, NULL,
     "field 'body.max_tokens': expected an integer from 1 to 2147483647, got -9223372036854775809"},
    {"{\"custom_id\":\"im\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":"
     "\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{}}]}]}}",
     TM_ERRCODE_UNSUPPORTED, TM_REC_FORMAT_OPENAI_CHAT, "\"im\"",
     "\"image_url\" are not supported"},
    {"{\"custom_id\":\"tl\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":"
     "\"m\"," MSGS ",\"tools\":[{\"type\":\"function\"}]}}",
     TM_ERRCODE_UNSUPPORTED, TM_REC_FORMAT_OPENAI_CHAT, "\"tl\"", "field 'body.tools'"},
    {"{\"custom_id\":\"rf\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":"
     "\"m\"," MSGS ",\"response_format\":{\"type\":\"xml\"}}}",
     TM_ERRCODE_INVALID_VALUE, TM_REC_FORMAT_OPENAI_CHAT, "\"rf\"",
     "field 'body.response_format.type'"}, // json_object and json_schema are served (issue 26)
    {"{\"custom_id\":\"nb\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":[]}",
     TM_ERRCODE_WRONG_TYPE, TM_REC_FORMAT_OPENAI_CHAT, "\"nb\"",
     "field 'body': expected an object"},
    // Limits (the spec below: max_depth 8, max_field_bytes 64, max_messages 3).
    {"{\"id\":\"deep\",\"prompt\":\"x\",\"meta\":[[[[[[[[1]]]]]]]]}", TM_ERRCODE_NESTING_TOO_DEEP,
     TM_REC_FORMAT_OPENAI, NULL, "nested deeper than limits.max_depth (8) at column 41"},
    {"{\"id\":\"okdeep\",\"prompt\":\"x\",\"meta\":[[[[[[[\"[[[[\\\"[[\"]]]]]]]}", TM_ERRCODE_NONE,
     TM_REC_FORMAT_NATIVE, "\"okdeep\"", "x"},
    {"{\"id\":\"big\",\"prompt\":\"0123456789012345678901234567890123456789012345678901234567890123"
     "4\"}",
     TM_ERRCODE_FIELD_TOO_LARGE, TM_REC_FORMAT_NATIVE, "\"big\"",
     "field 'prompt' is 65 bytes, more than limits.max_field_bytes (64)"},
    {"{\"id\":\"many\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\","
     "\"content\":\"a\"},{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\",\"content\":\"a\"}]}",
     TM_ERRCODE_FIELD_TOO_LARGE, TM_REC_FORMAT_NATIVE, "\"many\"",
     "has 4 messages, more than limits.max_messages (3)"},
    {"{\"id\":\"stops\",\"prompt\":\"x\",\"stop\":[\"a\",\"b\",\"c\",\"d\"]}",
     TM_ERRCODE_FIELD_TOO_LARGE, TM_REC_FORMAT_NATIVE, "\"stops\"", "field 'stop' has 4 strings"},
};
enum { N_CASES = sizeof(cases) / sizeof(cases[0]) };

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    TM_CHECK(f != NULL);
    if (!f)
        return;
    fputs(text, f);
    fclose(f);
}

static tm_job_spec *spec_over(const char *files_json, const char *limits) {
    char job[1024], path[512];
    snprintf(job, sizeof(job),
             "{\"model\": \"m\", \"output\": {\"dir\": \"o\"}, \"limits\": {%s}, \"input\": "
             "{\"files\": %s}}",
             limits, files_json);
    snprintf(path, sizeof(path), "%s/job.json", g_tmp);
    write_text(path, job);
    tm_job_spec *spec = NULL;
    tm_err err = {0};
    TM_CHECK_OK(tm_job_spec_load(path, &spec, &err), &err);
    return spec;
}

static void check_case(const tm_job *job, const expect *e) {
    unsigned long long ln = (unsigned long long)job->line;
    TM_CHECK_MSG(job->err_code == e->code, "line %llu: code %s, want %s (%s)", ln,
                 tm_errcode_name(job->err_code), tm_errcode_name(e->code),
                 job->err_msg ? job->err_msg : "");
    TM_CHECK_MSG(job->format == e->fmt, "line %llu: format %d, want %d", ln, (int)job->format,
                 (int)e->fmt);
    TM_CHECK_MSG((!e->id && !job->id_json) ||
                     (e->id && job->id_json && !strcmp(e->id, job->id_json)),
                 "line %llu: id %s", ln, job->id_json ? job->id_json : "NULL");
    if (e->code != TM_ERRCODE_NONE) {
        TM_CHECK_MSG(job->err_msg && strstr(job->err_msg, e->msg), "line %llu: message '%s'", ln,
                     job->err_msg ? job->err_msg : "NULL");
        return;
    }
    const char *text = job->prompt ? job->prompt : job->n_messages ? job->messages[0].content : "";
    TM_CHECK_MSG(strcmp(text, e->msg) == 0, "line %llu: text '%s'", ln, text);
}

static void test_openai_and_limits(void) {
    char path[512];
    snprintf(path, sizeof(path), "%s/oai.jsonl", g_tmp);
    FILE *f = fopen(path, "wb");
    TM_CHECK(f != NULL);
    if (!f)
        return;
    for (size_t i = 0; i < N_CASES; i++)
        fprintf(f, "%s\n", cases[i].line);
    fputs("not json\n", f); // an unparsable line of an OpenAI file: OpenAI-shaped error
    fclose(f);
    char files[600];
    snprintf(files, sizeof(files), "[\"%s\"]", path);
    tm_job_spec *spec = spec_over(files,
                                  "\"max_depth\": 8, \"max_field_bytes\": 64, \"max_messages\": 3");
    if (!spec)
        return;
    tm_source *src = NULL;
    tm_err err = {0};
    TM_CHECK_OK(tm_source_open(spec, &src, &err), &err);
    for (size_t i = 0; src; i++) {
        tm_job *job = NULL;
        tm_rc rc = tm_source_next(src, &job, &err);
        if (rc == TM_E_EOF) {
            TM_CHECK(i == N_CASES + 1);
            break;
        }
        TM_CHECK_OK(rc, &err);
        if (rc)
            break;
        TM_CHECK(job->line == i + 1);
        if (i < N_CASES) {
            check_case(job, &cases[i]);
        } else {
            TM_CHECK(job->err_code == TM_ERRCODE_INVALID_JSON);
            TM_CHECK(job->format == TM_REC_FORMAT_OPENAI);
        }
        if (i == 0) { // the sampling fields of the first chat line
            TM_CHECK(job->n_messages == 2 && job->model && strcmp(job->model, "gpt-x") == 0);
            TM_CHECK(job->sp.max_tokens == 7 && job->sp.seed == 3 && job->sp.n_stop == 1);
            TM_CHECK_NEAR(job->sp.temperature, 0.5, 1e-6);
            TM_CHECK_NEAR(job->sp.top_p, 0.9, 1e-6);
        }
        if (i == 1)
            TM_CHECK(job->sp.max_tokens == 4 && (job->sp.set & TM_SP_MAX_TOKENS));
        if (i == 2)
            TM_CHECK(!(job->sp.set & TM_SP_MAX_TOKENS));
        tm_job_destroy(job);
    }
    tm_source_destroy(src);
    tm_job_spec_destroy(spec);
}

static void test_stdin(void) {
    char path[512];
    snprintf(path, sizeof(path), "%s/stdin.jsonl", g_tmp);
    write_text(path, "{\"id\":1,\"prompt\":\"a\"}\n\n{\"id\":1,\"prompt\":\"b\"}\r\n{\"id\":2,"
                     "\"prompt\":\"c\"}");
    TM_CHECK(freopen(path, "rb", stdin) != NULL);
    char other[512], files[1200];
    snprintf(other, sizeof(other), "%s/other.jsonl", g_tmp);
    write_text(other, "{\"id\":3,\"prompt\":\"d\"}\n");
    snprintf(files, sizeof(files), "[\"%s\", \"-\"]", other);
    tm_job_spec *spec = spec_over(files, "");
    if (!spec)
        return;
    TM_CHECK(spec->n_inputs == 2 && strcmp(spec->inputs[1], "-") == 0);
    tm_source *src = NULL;
    tm_err err = {0};
    TM_CHECK_OK(tm_source_open(spec, &src, &err), &err);
    const char *want[] = {"3 1", "1 1", "1 3", "2 4"}; // id and line
    size_t n = 0;
    for (;;) {
        tm_job *job = NULL;
        tm_rc rc = tm_source_next(src, &job, &err);
        if (rc)
            break;
        char got[64];
        snprintf(got, sizeof(got), "%s %llu", job->id_json ? job->id_json : "-",
                 (unsigned long long)job->line);
        TM_CHECK_MSG(n < 4 && strcmp(got, want[n]) == 0, "record %zu: %s", n, got);
        TM_CHECK(strcmp(job->file, n == 0 ? other : "-") == 0);
        TM_CHECK(job->err_code == (n == 2 ? TM_ERRCODE_DUPLICATE_ID : TM_ERRCODE_NONE));
        n++;
        tm_job_destroy(job);
    }
    TM_CHECK(n == 4);
    tm_source_destroy(src);
    tm_job_spec_destroy(spec);
}

// Parse one line the sink wrote; NULL (and a failed check) if it is not one JSON object line.
static json_t *parse_line(const tm_buf *b) {
    TM_CHECK(b->len > 0 && b->data[b->len - 1] == '\n');
    json_error_t jerr;
    json_t *j = json_loadb(b->data, b->len, JSON_REJECT_DUPLICATES, &jerr);
    TM_CHECK_MSG(j != NULL, "sink line is not JSON: %s: %s", jerr.text, b->data);
    return j;
}

static void test_sink_openai(void) {
    tm_err err = {0};
    tm_buf b = {0};
    tm_completion ok = {.seq_no = 4,
                        .id_json = "\"req-1\"",
                        .text = "Hi \"you\"",
                        .finish = TM_FINISH_LENGTH,
                        .n_tok_prompt = 10,
                        .n_tok_gen = 2,
                        .n_tok_cached = 8,
                        .format = TM_REC_FORMAT_OPENAI_CHAT,
                        .model = "gpt-x",
                        .src_meta_json = "{\"topic\":\"t\",\"partition\":1,\"offset\":5}"};
    TM_CHECK_OK(tm_sink_format_ok(&b, &ok, &err), &err);
    json_t *j = parse_line(&b);
    if (j) {
        TM_CHECK(strncmp(json_string_value(json_object_get(j, "id")), "batch_req_", 10) == 0);
        TM_CHECK(!strcmp(json_string_value(json_object_get(j, "custom_id")), "req-1"));
        TM_CHECK(json_is_null(json_object_get(j, "error")));
        json_t *resp = json_object_get(j, "response");
        TM_CHECK(json_integer_value(json_object_get(resp, "status_code")) == 200);
        json_t *body = json_object_get(resp, "body");
        TM_CHECK(!strcmp(json_string_value(json_object_get(body, "object")), "chat.completion"));
        TM_CHECK(!strcmp(json_string_value(json_object_get(body, "model")), "gpt-x"));
        json_t *ch = json_array_get(json_object_get(body, "choices"), 0);
        TM_CHECK(
            !strcmp(json_string_value(json_object_get(json_object_get(ch, "message"), "content")),
                    "Hi \"you\""));
        TM_CHECK(!strcmp(json_string_value(json_object_get(ch, "finish_reason")), "length"));
        TM_CHECK(json_integer_value(
                     json_object_get(json_object_get(body, "usage"), "total_tokens")) == 12);
        TM_CHECK(json_integer_value(json_object_get(json_object_get(j, "source"), "offset")) == 5);
        json_decref(j);
    }
    tm_buf_clear(&b);
    ok.format = TM_REC_FORMAT_OPENAI_COMPLETION;
    ok.src_meta_json = NULL;
    TM_CHECK_OK(tm_sink_format_ok(&b, &ok, &err), &err);
    j = parse_line(&b);
    if (j) {
        json_t *body = json_object_get(json_object_get(j, "response"), "body");
        TM_CHECK(!strcmp(json_string_value(json_object_get(body, "object")), "text_completion"));
        json_t *ch = json_array_get(json_object_get(body, "choices"), 0);
        TM_CHECK(!strcmp(json_string_value(json_object_get(ch, "text")), "Hi \"you\""));
        TM_CHECK(!json_object_get(j, "source"));
        json_decref(j);
    }
    // Rejected by ingest: response null, error {code, message}, plus file and line.
    tm_buf_clear(&b);
    tm_completion bad = {.seq_no = 5,
                         .file = "in.jsonl",
                         .line = 9,
                         .format = TM_REC_FORMAT_OPENAI,
                         .err_code = TM_ERRCODE_INVALID_JSON,
                         .err_msg = "bad"};
    TM_CHECK_OK(tm_sink_format_error(&b, &bad, &err), &err);
    j = parse_line(&b);
    if (j) {
        TM_CHECK(json_is_null(json_object_get(j, "custom_id")));
        TM_CHECK(json_is_null(json_object_get(j, "response")));
        TM_CHECK(!strcmp(json_string_value(json_object_get(json_object_get(j, "error"), "code")),
                         "invalid_json"));
        TM_CHECK(json_integer_value(json_object_get(j, "line")) == 9);
        json_decref(j);
    }
    // Reached the model but could not be served: an HTTP-style 400 response, error null.
    tm_buf_clear(&b);
    bad.id_json = "\"x\"";
    bad.format = TM_REC_FORMAT_OPENAI_CHAT;
    bad.err_code = TM_ERRCODE_CONTEXT_LENGTH_EXCEEDED;
    TM_CHECK_OK(tm_sink_format_error(&b, &bad, &err), &err);
    j = parse_line(&b);
    if (j) {
        json_t *resp = json_object_get(j, "response");
        TM_CHECK(json_integer_value(json_object_get(resp, "status_code")) == 400);
        json_t *e = json_object_get(json_object_get(resp, "body"), "error");
        TM_CHECK(!strcmp(json_string_value(json_object_get(e, "code")), "context_length_exceeded"));
        TM_CHECK(json_is_null(json_object_get(j, "error")));
        json_decref(j);
    }
    tm_buf_fini(&b);
}

int main(void) {
    const char *t = getenv("TMPDIR");
    snprintf(g_tmp, sizeof(g_tmp), "%s/tm_ingest_formats_XXXXXX", t ? t : "/tmp");
    if (!mkdtemp(g_tmp)) {
        perror("mkdtemp");
        return 1;
    }
    TM_RUN(test_openai_and_limits);
    TM_RUN(test_stdin);
    TM_RUN(test_sink_openai);
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_tmp);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g_tmp);
    return tm_test_report();
}
