/* ingest/rec_parser.c - the record parser (see rec_parser_int.h): one line -> jansson -> a valid
 * tm_job or an error record; the duplicate-id set. Moved out of source.c unchanged, so that the
 * file reader and the Kafka source both use it without using each other. */
#include "ingest/rec_parser_int.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/log.h"
#include "base/buf.h"
#include "base/hash.h"
#include "ingest/fields_int.h"

// ---- id set ----

static void hash128(const char *s, size_t n, uint64_t h[2]) {
    tm_h128 x = tm_hash128(s, n);
    h[0] = x.lo;
    h[1] = x.hi;
    if (!h[0] && !h[1])
        h[0] = 1; // {0, 0} marks empty slots
}

static void idset_put(uint64_t *slots, size_t cap, const uint64_t h[2]) {
    size_t i = (size_t)h[0] & (cap - 1);
    while (slots[2 * i] || slots[2 * i + 1])
        i = (i + 1) & (cap - 1);
    slots[2 * i] = h[0];
    slots[2 * i + 1] = h[1];
}

// 1 if the id was new (and is now in the set), 0 if it was already there.
static tm_rc idset_add(tm_rec_parser_ids *set, const char *id, size_t n, int *added, tm_err *err) {
    uint64_t h[2];
    hash128(id, n, h);
    if (set->cap) {
        for (size_t i = (size_t)h[0] & (set->cap - 1);; i = (i + 1) & (set->cap - 1)) {
            uint64_t *s = &set->slots[2 * i];
            if (!s[0] && !s[1])
                break;
            if (s[0] == h[0] && s[1] == h[1]) {
                *added = 0;
                return TM_OK;
            }
        }
    }
    if ((set->n + 1) * 4 > set->cap * 3) {
        size_t cap = set->cap ? set->cap * 2 : 1024;
        uint64_t *slots = tm_calloc(cap * 2, sizeof(*slots));
        if (!slots)
            return TM_ERR(err, TM_E_NOMEM, "id set of %zu ids", set->n);
        for (size_t i = 0; i < set->cap; i++)
            if (set->slots[2 * i] || set->slots[2 * i + 1])
                idset_put(slots, cap, &set->slots[2 * i]);
        tm_free(set->slots);
        set->slots = slots;
        set->cap = cap;
    }
    idset_put(set->slots, set->cap, h);
    set->n++;
    *added = 1;
    return TM_OK;
}

// ---- record parser ----

static tm_rc job_fail(tm_job *job, tm_errcode code, tm_err *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static tm_rc job_fail(tm_job *job, tm_errcode code, tm_err *err, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    // An error record carries file, line and id only.
    tm_free(job->prompt);
    job->prompt = NULL;
    for (uint32_t i = 0; i < job->n_messages; i++) {
        tm_free(job->messages[i].role);
        tm_free(job->messages[i].content);
    }
    tm_free(job->messages);
    job->messages = NULL;
    job->n_messages = 0;
    tm_sampling_fini(&job->sp);
    memset(&job->sp, 0, sizeof(job->sp));
    job->err_code = code;
    job->err_msg = tm_strdup(msg);
    if (!job->err_msg)
        return TM_ERR(err, TM_E_NOMEM, "error message");
    return TM_OK;
}

static tm_rc field_fail(tm_job *job, const char *field, const tm_field_fail *ff, tm_err *err) {
    return job_fail(job, ff->code, err, "field '%s': %s", field, ff->msg);
}

// A string member that must not hold NUL (jansson refuses \u0000 already; belt and braces).
static char *dup_json_str(const json_t *v) {
    return tm_strndup(json_string_value(v), json_string_length(v));
}

// 1-based column of the first array/object opened deeper than max_depth, or 0. Strings are
// skipped (escapes included); the rest of the syntax is left to jansson. Linear, no allocation.
static size_t too_deep_at(const char *s, size_t n, uint32_t max_depth) {
    uint32_t depth = 0;
    bool in_str = false;
    for (size_t i = 0; i < n; i++) { // hot loop: every byte of every line
        char ch = s[i];
        if (in_str) {
            if (ch == '\\')
                i++;
            else if (ch == '"')
                in_str = false;
        } else if (ch == '"') {
            in_str = true;
        } else if (ch == '[' || ch == '{') {
            if (++depth > max_depth)
                return i + 1;
        } else if ((ch == ']' || ch == '}') && depth) {
            depth--;
        }
    }
    return 0;
}

// Check a string field's size against limits.max_field_bytes. 1 when the job was failed.
static int too_large(tm_rec_parser *ps, tm_job *job, const char *field, const json_t *v, tm_rc *rc,
                     tm_err *err) {
    size_t n = json_string_length(v);
    if (n <= ps->spec->max_field_bytes)
        return 0;
    *rc = job_fail(job, TM_ERRCODE_FIELD_TOO_LARGE, err,
                   "field '%s' is %zu bytes, more than limits.max_field_bytes (%llu)", field, n,
                   (unsigned long long)ps->spec->max_field_bytes);
    return 1;
}

// A non-empty string field (id, custom_id, prompt, model, role).
static int need_str(tm_rec_parser *ps, tm_job *job, const char *field, const json_t *v,
                    bool nonempty, tm_rc *rc, tm_err *err) {
    tm_field_fail ff;
    if (!json_is_string(v)) {
        tm_ingest_fail_set(&ff, TM_ERRCODE_WRONG_TYPE, "a string", v);
        *rc = field_fail(job, field, &ff, err);
        return 1;
    }
    if (nonempty && json_string_length(v) == 0) {
        tm_ingest_fail_set(&ff, TM_ERRCODE_INVALID_VALUE, "a non-empty string", v);
        *rc = field_fail(job, field, &ff, err);
        return 1;
    }
    return too_large(ps, job, field, v, rc, err);
}

// OpenAI content parts: [{"type": "text", "text": "..."}, ...] joined without separator. Other
// part types (images, audio) are unsupported. *out is an owned string, or NULL after job_fail.
static tm_rc join_parts(tm_rec_parser *ps, tm_job *job, const char *field, const json_t *parts,
                        char **out, tm_err *err) {
    tm_field_fail ff;
    tm_buf b = {0};
    tm_rc rc = TM_OK;
    *out = NULL;
    size_t i;
    const json_t *part;
    json_array_foreach(parts, i, part) {
        char f[160];
        snprintf(f, sizeof(f), "%s[%zu]", field, i);
        const json_t *type = json_object_get(part, "type");
        const json_t *text = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(type)) {
            tm_ingest_fail_set(&ff, TM_ERRCODE_WRONG_TYPE, "a content part {\"type\", ...}", part);
            rc = field_fail(job, f, &ff, err);
            goto done;
        }
        if (strcmp(json_string_value(type), "text") != 0) {
            rc = job_fail(job, TM_ERRCODE_UNSUPPORTED, err,
                          "field '%s.type': content parts of type \"%.40s\" are not supported "
                          "(only \"text\")",
                          f, json_string_value(type));
            goto done;
        }
        snprintf(f, sizeof(f), "%s[%zu].text", field, i);
        if (!text) {
            rc = job_fail(job, TM_ERRCODE_MISSING_FIELD, err, "field '%s' is required", f);
            goto done;
        }
        if (need_str(ps, job, f, text, false, &rc, err))
            goto done;
        if (b.len + json_string_length(text) > ps->spec->max_field_bytes) {
            rc = job_fail(job, TM_ERRCODE_FIELD_TOO_LARGE, err,
                          "field '%s': the text parts add up to more than "
                          "limits.max_field_bytes (%llu)",
                          field, (unsigned long long)ps->spec->max_field_bytes);
            goto done;
        }
        rc = tm_buf_append(&b, json_string_value(text), json_string_length(text), err);
        if (rc)
            goto done;
    }
    *out = tm_strndup(b.data ? b.data : "", b.len);
    if (!*out)
        rc = TM_ERR(err, TM_E_NOMEM, "message content");
done:
    tm_buf_fini(&b);
    return rc;
}

// messages: an array of {"role", "content"}. prefix names the field in messages ("" or "body.").
// OpenAI lines (parts) may give content as an array of text parts.
static tm_rc parse_messages(tm_rec_parser *ps, tm_job *job, const json_t *msgs, const char *prefix,
                            bool parts, tm_err *err) {
    tm_field_fail ff;
    char field[96];
    snprintf(field, sizeof(field), "%smessages", prefix);
    if (!json_is_array(msgs)) {
        tm_ingest_fail_set(&ff, TM_ERRCODE_WRONG_TYPE,
                           "an array of {\"role\", \"content\"} objects", msgs);
        return field_fail(job, field, &ff, err);
    }
    size_t n = json_array_size(msgs);
    if (n == 0) {
        tm_ingest_fail_set(&ff, TM_ERRCODE_INVALID_VALUE, "a non-empty array", msgs);
        return field_fail(job, field, &ff, err);
    }
    if (n > ps->spec->max_messages)
        return job_fail(job, TM_ERRCODE_FIELD_TOO_LARGE, err,
                        "field '%s' has %zu messages, more than limits.max_messages (%u)", field, n,
                        ps->spec->max_messages);
    job->messages = tm_calloc(n, sizeof(*job->messages));
    if (!job->messages)
        return TM_ERR(err, TM_E_NOMEM, "messages");
    for (size_t i = 0; i < n; i++) {
        const json_t *m = json_array_get(msgs, i);
        snprintf(field, sizeof(field), "%smessages[%zu]", prefix, i);
        if (!json_is_object(m)) {
            tm_ingest_fail_set(&ff, TM_ERRCODE_WRONG_TYPE, "an object", m);
            return field_fail(job, field, &ff, err);
        }
        tm_rc rc = TM_OK;
        const json_t *role = json_object_get(m, "role");
        const json_t *content = json_object_get(m, "content");
        snprintf(field, sizeof(field), "%smessages[%zu].role", prefix, i);
        if (!role)
            return job_fail(job, TM_ERRCODE_MISSING_FIELD, err, "field '%s' is required", field);
        if (need_str(ps, job, field, role, true, &rc, err))
            return rc;
        snprintf(field, sizeof(field), "%smessages[%zu].content", prefix, i);
        if (!content)
            return job_fail(job, TM_ERRCODE_MISSING_FIELD, err, "field '%s' is required", field);
        char *text = NULL;
        if (parts && json_is_array(content)) {
            rc = join_parts(ps, job, field, content, &text, err);
            if (rc || job->err_code)
                return rc;
        } else if (need_str(ps, job, field, content, false, &rc, err)) {
            return rc;
        }
        job->n_messages = (uint32_t)i + 1; // job_fail frees what is counted
        job->messages[i].role = dup_json_str(role);
        job->messages[i].content = text ? text : dup_json_str(content);
        if (!job->messages[i].role || !job->messages[i].content)
            return TM_ERR(err, TM_E_NOMEM, "messages");
    }
    return TM_OK;
}

// The record's identity: its compact JSON text, checked against the ids seen so far.
static tm_rc take_id(tm_rec_parser *ps, tm_job *job, const json_t *id, const char *field,
                     tm_err *err) {
    char *id_text = json_dumps(id, JSON_ENCODE_ANY | JSON_COMPACT);
    job->id_json = id_text ? tm_strdup(id_text) : NULL;
    free(id_text); // jansson's allocation
    if (!job->id_json)
        return TM_ERR(err, TM_E_NOMEM, "record id");
    int added = 1;
    tm_rc rc = ps->no_id_check
                   ? TM_OK
                   : idset_add(&ps->ids, job->id_json, strlen(job->id_json), &added, err);
    if (rc)
        return rc;
    if (!added)
        return job_fail(job, TM_ERRCODE_DUPLICATE_ID, err,
                        "field '%s': %s was already used by an earlier record", field,
                        job->id_json);
    return TM_OK;
}

// One sampling field (name as written in the line: field) into job->sp.
static tm_rc sp_field(tm_rec_parser *ps, tm_job *job, const char *key, const char *field,
                      const json_t *v, tm_err *err) {
    tm_field_fail ff;
    if (strcmp(key, "stop") == 0 && json_is_array(v) && json_array_size(v) > ps->spec->max_messages)
        return job_fail(job, TM_ERRCODE_FIELD_TOO_LARGE, err,
                        "field '%s' has %zu strings, more than limits.max_messages (%u)", field,
                        json_array_size(v), ps->spec->max_messages);
    size_t n_ent = json_is_object(v) ? json_object_size(v) : json_array_size(v);
    if ((strcmp(key, "stop_token_ids") == 0 || strcmp(key, "logit_bias") == 0) &&
        n_ent > ps->spec->max_messages)
        return job_fail(job, TM_ERRCODE_FIELD_TOO_LARGE, err,
                        "field '%s' has %zu entries, more than limits.max_messages (%u)", field,
                        n_ent, ps->spec->max_messages);
    tm_rc rc = tm_ingest_sp_field(key, v, &job->sp, &ff, err);
    if (rc)
        return rc;
    if (ff.code != TM_ERRCODE_NONE)
        return field_fail(job, field, &ff, err);
    return TM_OK;
}

// cache_salt (optional string): records with different salts never share prefix-cache blocks
// (tenant isolation); kept as a 64-bit hash of the string.
static tm_rc parse_cache_salt(tm_rec_parser *ps, tm_job *job, const json_t *v, tm_err *err) {
    tm_rc rc = TM_OK;
    if (!v || json_is_null(v))
        return TM_OK;
    if (need_str(ps, job, "cache_salt", v, true, &rc, err))
        return rc;
    uint64_t h = tm_hash64(json_string_value(v), json_string_length(v));
    job->cache_salt = h ? h : 1; // 0 means "no salt"
    return TM_OK;
}

// An optional integer field in [lo, hi] (null = absent): 1 and *out set when given, 0 when
// absent, -1 when the job was failed (*rc set).
static int opt_int(tm_job *job, const json_t *obj, const char *key, const char *field, long long lo,
                   long long hi, const char *what, long long *out, tm_rc *rc, tm_err *err) {
    const json_t *v = json_object_get(obj, key);
    tm_field_fail ff;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
        tm_ingest_fail_set(
            &ff, json_is_integer(v) ? TM_ERRCODE_INVALID_VALUE : TM_ERRCODE_WRONG_TYPE, what, v);
        *rc = field_fail(job, field, &ff, err);
        return -1;
    }
    *out = json_integer_value(v);
    return 1;
}

// An optional boolean field (null = absent): 1/0 into *out when given; -1 when the job failed.
static int opt_bool(tm_job *job, const json_t *obj, const char *key, const char *field, int *out,
                    tm_rc *rc, tm_err *err) {
    const json_t *v = json_object_get(obj, key);
    tm_field_fail ff;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_boolean(v)) {
        tm_ingest_fail_set(&ff, TM_ERRCODE_WRONG_TYPE, "true or false", v);
        *rc = field_fail(job, field, &ff, err);
        return -1;
    }
    *out = json_is_true(v);
    return 1;
}

// Native evaluation fields (issue 5): n, logprobs, top_logprobs, prompt_logprobs, and the
// continuations of a scoring record.
static tm_rc parse_eval_native(tm_rec_parser *ps, const json_t *root, tm_job *job, tm_err *err) {
    tm_rc rc = TM_OK;
    tm_field_fail ff;
    long long x = 0;
    int got;
    if ((got = opt_int(job, root, "n", "n", 1, TM_MAX_N, "an integer from 1 to 128", &x, &rc,
                       err)) < 0)
        return rc;
    job->n = got ? (uint32_t)x : 1;
    if (opt_bool(job, root, "logprobs", "logprobs", &job->logprobs, &rc, err) < 0)
        return rc;
    if ((got = opt_int(job, root, "top_logprobs", "top_logprobs", 0, TM_MAX_TOP_LOGPROBS,
                       "an integer from 0 to 20", &x, &rc, err)) < 0)
        return rc;
    if (got) {
        job->top_logprobs = (uint32_t)x;
        job->logprobs |= x > 0; // asking for alternatives asks for the logprobs
    }
    const json_t *v = json_object_get(root, "prompt_logprobs");
    if (v && json_is_integer(v)) {
        if (opt_int(job, root, "prompt_logprobs", "prompt_logprobs", 0, TM_MAX_TOP_LOGPROBS,
                    "true, false or an integer from 0 to 20", &x, &rc, err) < 0)
            return rc;
        job->prompt_logprobs = 1;
        job->prompt_top_logprobs = (uint32_t)x;
    } else if (v && !json_is_null(v)) {
        if (!json_is_boolean(v)) {
            tm_ingest_fail_set(&ff, TM_ERRCODE_WRONG_TYPE, "true, false or an integer from 0 to 20",
                               v);
            return field_fail(job, "prompt_logprobs", &ff, err);
        }
        job->prompt_logprobs = json_is_true(v);
    }
    const json_t *cs = json_object_get(root, "continuations");
    const json_t *c1 = json_object_get(root, "continuation");
    if (json_is_null(cs))
        cs = NULL;
    if (json_is_null(c1))
        c1 = NULL;
    if (!cs && !c1)
        return TM_OK;
    if (cs && c1)
        return job_fail(job, TM_ERRCODE_INVALID_VALUE, err,
                        "fields 'continuation' and 'continuations': give at most one of them");
    const char *field = cs ? "continuations" : "continuation";
    if (cs && (!json_is_array(cs) || json_array_size(cs) == 0)) {
        tm_ingest_fail_set(&ff,
                           json_is_array(cs) ? TM_ERRCODE_INVALID_VALUE : TM_ERRCODE_WRONG_TYPE,
                           "a non-empty array of non-empty strings", cs);
        return field_fail(job, field, &ff, err);
    }
    size_t n = cs ? json_array_size(cs) : 1;
    if (n > ps->spec->max_messages)
        return job_fail(job, TM_ERRCODE_FIELD_TOO_LARGE, err,
                        "field '%s' has %zu strings, more than limits.max_messages (%u)", field, n,
                        ps->spec->max_messages);
    if (job->n > 1)
        return job_fail(job, TM_ERRCODE_INVALID_VALUE, err,
                        "field 'n': a scoring record (with '%s') takes no samples", field);
    if ((job->sp.set & TM_SP_MAX_TOKENS) && job->sp.max_tokens > 0)
        return job_fail(job, TM_ERRCODE_INVALID_VALUE, err,
                        "field 'max_tokens': a scoring record (with '%s') generates nothing; "
                        "leave max_tokens out or give 0",
                        field);
    for (size_t i = 0; i < n; i++) {
        const json_t *s = cs ? json_array_get(cs, i) : c1;
        char name[48];
        snprintf(name, sizeof(name), cs ? "continuations[%zu]" : "continuation", i);
        if (need_str(ps, job, name, s, true, &rc, err))
            return rc;
    }
    job->continuations = tm_calloc(n, sizeof(char *));
    if (!job->continuations)
        return TM_ERR(err, TM_E_NOMEM, "continuations");
    job->n_continuations = (uint32_t)n;
    for (size_t i = 0; i < n; i++) {
        job->continuations[i] = dup_json_str(cs ? json_array_get(cs, i) : c1);
        if (!job->continuations[i])
            return TM_ERR(err, TM_E_NOMEM, "continuations");
    }
    return TM_OK;
}

// Structured output (issue 26): response_format, guided_json, guided_regex, guided_choice of obj
// (the record, or an OpenAI body: prefix "body."); vLLM's guided_grammar is refused.
static tm_rc parse_guided(tm_job *job, const json_t *obj, const char *prefix, tm_err *err) {
    tm_field_fail ff;
    char field[64], full[80];
    const json_t *gr = json_object_get(obj, "guided_grammar");
    if (gr && !json_is_null(gr))
        return job_fail(job, TM_ERRCODE_UNSUPPORTED, err,
                        "field '%sguided_grammar': grammars are not supported (JSON Schema, regex "
                        "and choice constraints are)",
                        prefix);
    tm_rc rc = tm_ingest_guided(obj, &job->guided_kind, &job->guided, &ff, field, sizeof(field),
                                err);
    if (rc || ff.code == TM_ERRCODE_NONE)
        return rc;
    snprintf(full, sizeof(full), "%s%s", prefix, field);
    return field_fail(job, full, &ff, err);
}

static tm_rc parse_native(tm_rec_parser *ps, const json_t *root, tm_job *job, tm_err *err) {
    tm_field_fail ff;
    tm_rc rc = TM_OK;
    // id: a string or an integer; its compact JSON text is the identity.
    const json_t *id = json_object_get(root, "id");
    if (!id)
        return job_fail(job, TM_ERRCODE_MISSING_FIELD, err, "field 'id' is required");
    if (!json_is_string(id) && !json_is_integer(id)) {
        tm_ingest_fail_set(&ff, TM_ERRCODE_WRONG_TYPE, "a string or an integer", id);
        return field_fail(job, "id", &ff, err);
    }
    if (json_is_string(id) && json_string_length(id) == 0) {
        tm_ingest_fail_set(&ff, TM_ERRCODE_INVALID_VALUE, "a non-empty string or an integer", id);
        return field_fail(job, "id", &ff, err);
    }
    if (json_is_string(id) && too_large(ps, job, "id", id, &rc, err))
        return rc;
    rc = take_id(ps, job, id, "id", err);
    if (rc || job->err_code)
        return rc;
    // Exactly one of prompt / messages.
    const json_t *prompt = json_object_get(root, "prompt");
    const json_t *msgs = json_object_get(root, "messages");
    if (prompt && msgs)
        return job_fail(job, TM_ERRCODE_INVALID_VALUE, err,
                        "fields 'prompt' and 'messages': give exactly one of them, not both");
    if (!prompt && !msgs)
        return job_fail(job, TM_ERRCODE_MISSING_FIELD, err,
                        "field 'prompt' or 'messages' is required");
    if (prompt) {
        if (need_str(ps, job, "prompt", prompt, true, &rc, err))
            return rc;
        job->prompt = dup_json_str(prompt);
        if (!job->prompt)
            return TM_ERR(err, TM_E_NOMEM, "prompt");
    } else {
        rc = parse_messages(ps, job, msgs, "", false, err);
        if (rc || job->err_code)
            return rc;
    }
    // Optional sampling fields, in schema order. A record may ask for max_tokens 0 (nothing
    // generated: prompt_logprobs or a scoring record).
    for (size_t i = 0; tm_ingest_sp_keys[i]; i++) {
        const json_t *v = json_object_get(root, tm_ingest_sp_keys[i]);
        if (!v)
            continue;
        if (strcmp(tm_ingest_sp_keys[i], "max_tokens") == 0 && json_is_integer(v) &&
            json_integer_value(v) == 0) {
            job->sp.max_tokens = 0;
            job->sp.set |= TM_SP_MAX_TOKENS;
            continue;
        }
        if (strcmp(tm_ingest_sp_keys[i], "max_tokens") == 0 && json_is_integer(v) &&
            (json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)) { // its true range
            tm_ingest_fail_set(&ff, TM_ERRCODE_INVALID_VALUE,
                               "an integer from 0 to 2147483647 (0: nothing generated)", v);
            return field_fail(job, "max_tokens", &ff, err);
        }
        rc = sp_field(ps, job, tm_ingest_sp_keys[i], tm_ingest_sp_keys[i], v, err);
        if (rc || job->err_code)
            return rc;
    }
    rc = parse_eval_native(ps, root, job, err);
    if (rc || job->err_code)
        return rc;
    rc = parse_guided(job, root, "", err);
    if (rc || job->err_code)
        return rc;
    return parse_cache_salt(ps, job, json_object_get(root, "cache_salt"), err);
}

// Body keys tokenmill does not implement: the request is refused unless the value is absent,
// null, or the neutral value given here (a JSON text compared after compact dumping).
static const struct {
    const char *key;
    const char *neutral[3];
} unsupported_body[] = {
    {"tools", {"[]"}},     // (logit_bias, frequency_penalty and presence_penalty are
    {"functions", {"[]"}}, // served since issue 22)
    {"best_of", {"1"}},    {"echo", {"false"}},    {"suffix", {"\"\""}},
    {"audio", {"{}"}},     {"prediction", {"{}"}},
};

static int is_neutral(const json_t *v, const char *const *neutral) {
    if (json_is_null(v))
        return 1;
    if (json_is_number(v) && json_number_value(v) == 0 && neutral[0] &&
        strcmp(neutral[0], "0") == 0)
        return 1;
    char *t = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    int ok = 0;
    for (int i = 0; t && i < 3 && neutral[i] && !ok; i++)
        ok = strcmp(t, neutral[i]) == 0;
    free(t); // jansson's allocation
    return ok;
}

// An OpenAI Batch API line: {"custom_id", "method": "POST", "url", "body": {...}}.
static tm_rc parse_openai(tm_rec_parser *ps, const json_t *root, tm_job *job, tm_err *err) {
    tm_field_fail ff;
    tm_rc rc = TM_OK;
    job->format = TM_REC_FORMAT_OPENAI;
    const json_t *cid = json_object_get(root, "custom_id");
    if (!cid)
        return job_fail(job, TM_ERRCODE_MISSING_FIELD, err, "field 'custom_id' is required");
    if (need_str(ps, job, "custom_id", cid, true, &rc, err))
        return rc;
    rc = take_id(ps, job, cid, "custom_id", err);
    if (rc || job->err_code)
        return rc;
    const json_t *method = json_object_get(root, "method");
    const json_t *url = json_object_get(root, "url");
    const json_t *body = json_object_get(root, "body");
    if (!method)
        return job_fail(job, TM_ERRCODE_MISSING_FIELD, err, "field 'method' is required");
    if (!json_is_string(method) || strcmp(json_string_value(method), "POST") != 0) {
        tm_ingest_fail_set(
            &ff, json_is_string(method) ? TM_ERRCODE_INVALID_VALUE : TM_ERRCODE_WRONG_TYPE,
            "\"POST\"", method);
        return field_fail(job, "method", &ff, err);
    }
    if (!url)
        return job_fail(job, TM_ERRCODE_MISSING_FIELD, err, "field 'url' is required");
    if (need_str(ps, job, "url", url, true, &rc, err))
        return rc;
    const char *u = json_string_value(url);
    if (strcmp(u, "/v1/chat/completions") == 0) {
        job->format = TM_REC_FORMAT_OPENAI_CHAT;
    } else if (strcmp(u, "/v1/completions") == 0) {
        job->format = TM_REC_FORMAT_OPENAI_COMPLETION;
    } else { // every other url alike (/v1/embeddings, /v1/rerank, /rerank, /bad_url)
        tm_ingest_describe(url, ff.msg, 80);
        return job_fail(job, TM_ERRCODE_UNSUPPORTED, err,
                        "field 'url': %s is not supported; tokenmill serves "
                        "\"/v1/chat/completions\" and \"/v1/completions\"",
                        ff.msg);
    }
    if (!body)
        return job_fail(job, TM_ERRCODE_MISSING_FIELD, err, "field 'body' is required");
    if (!json_is_object(body)) {
        tm_ingest_fail_set(&ff, TM_ERRCODE_WRONG_TYPE, "an object", body);
        return field_fail(job, "body", &ff, err);
    }
    const json_t *model = json_object_get(body, "model");
    if (!model)
        return job_fail(job, TM_ERRCODE_MISSING_FIELD, err, "field 'body.model' is required");
    if (need_str(ps, job, "body.model", model, true, &rc, err))
        return rc;
    job->model = dup_json_str(model);
    if (!job->model)
        return TM_ERR(err, TM_E_NOMEM, "model name");
    // Features tokenmill does not have are refused, not silently ignored.
    const json_t *v = json_object_get(body, "stream");
    if (v && !json_is_null(v) && !json_is_boolean(v)) {
        tm_ingest_fail_set(&ff, TM_ERRCODE_WRONG_TYPE, "true or false", v);
        return field_fail(job, "body.stream", &ff, err);
    }
    if (json_is_true(v))
        return job_fail(job, TM_ERRCODE_UNSUPPORTED, err,
                        "field 'body.stream': streaming is not supported in batch requests");
    v = json_object_get(body, "n");
    if (v && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 1) {
            tm_ingest_fail_set(
                &ff, json_is_integer(v) ? TM_ERRCODE_INVALID_VALUE : TM_ERRCODE_WRONG_TYPE,
                "an integer from 1 to 128", v);
            return field_fail(job, "body.n", &ff, err);
        }
        if (json_integer_value(v) > TM_MAX_N)
            return job_fail(job, TM_ERRCODE_INVALID_VALUE, err,
                            "field 'body.n': n = %lld is more than tokenmill's limit of %d",
                            (long long)json_integer_value(v), TM_MAX_N);
        job->n = (uint32_t)json_integer_value(v);
    }
    // logprobs: chat takes a boolean and top_logprobs (0..20); completions take an integer
    // (alternatives per token, 0..20; OpenAI allows 5, vLLM 20).
    long long k = 0;
    int got;
    if (job->format == TM_REC_FORMAT_OPENAI_CHAT) {
        if (opt_bool(job, body, "logprobs", "body.logprobs", &job->logprobs, &rc, err) < 0)
            return rc;
        if ((got = opt_int(job, body, "top_logprobs", "body.top_logprobs", 0, TM_MAX_TOP_LOGPROBS,
                           "an integer from 0 to 20", &k, &rc, err)) < 0)
            return rc;
        if (got && k > 0 && !job->logprobs)
            return job_fail(job, TM_ERRCODE_INVALID_VALUE, err,
                            "field 'body.top_logprobs' needs 'body.logprobs': true");
        job->top_logprobs = (uint32_t)k;
    } else {
        if ((got = opt_int(job, body, "logprobs", "body.logprobs", 0, TM_MAX_TOP_LOGPROBS,
                           "an integer from 0 to 20", &k, &rc, err)) < 0)
            return rc;
        job->logprobs = got;
        job->top_logprobs = (uint32_t)k;
        v = json_object_get(body, "top_logprobs");
        if (v && !json_is_null(v))
            return job_fail(job, TM_ERRCODE_INVALID_VALUE, err,
                            "field 'body.top_logprobs' is for /v1/chat/completions; "
                            "/v1/completions takes an integer 'body.logprobs'");
    }
    for (size_t i = 0; i < sizeof(unsupported_body) / sizeof(unsupported_body[0]); i++) {
        v = json_object_get(body, unsupported_body[i].key);
        if (v && !is_neutral(v, unsupported_body[i].neutral)) {
            tm_ingest_describe(v, ff.msg, 80);
            return job_fail(job, TM_ERRCODE_UNSUPPORTED, err,
                            "field 'body.%s': %s is not supported by tokenmill",
                            unsupported_body[i].key, ff.msg);
        }
    }
    rc = parse_guided(job, body, "body.", err);
    if (rc || job->err_code)
        return rc;
    // The prompt: messages for chat, prompt for completions.
    const json_t *prompt = json_object_get(body, "prompt");
    const json_t *msgs = json_object_get(body, "messages");
    if (job->format == TM_REC_FORMAT_OPENAI_CHAT) {
        if (prompt)
            return job_fail(job, TM_ERRCODE_INVALID_VALUE, err,
                            "field 'body.prompt' is for /v1/completions; /v1/chat/completions "
                            "takes 'body.messages'");
        if (!msgs)
            return job_fail(job, TM_ERRCODE_MISSING_FIELD, err,
                            "field 'body.messages' is required");
        rc = parse_messages(ps, job, msgs, "body.", true, err);
        if (rc || job->err_code)
            return rc;
    } else {
        if (msgs)
            return job_fail(job, TM_ERRCODE_INVALID_VALUE, err,
                            "field 'body.messages' is for /v1/chat/completions; /v1/completions "
                            "takes 'body.prompt'");
        if (!prompt)
            return job_fail(job, TM_ERRCODE_MISSING_FIELD, err, "field 'body.prompt' is required");
        if (json_is_array(prompt))
            return job_fail(job, TM_ERRCODE_UNSUPPORTED, err,
                            "field 'body.prompt': an array (several prompts or token ids) is not "
                            "supported; send one string per request");
        if (need_str(ps, job, "body.prompt", prompt, true, &rc, err))
            return rc;
        job->prompt = dup_json_str(prompt);
        if (!job->prompt)
            return TM_ERR(err, TM_E_NOMEM, "prompt");
    }
    // Sampling: max_tokens or max_completion_tokens, and the other tokenmill fields (top_k and
    // min_p too, as vLLM accepts them). null means "not given".
    const json_t *mt = json_object_get(body, "max_tokens");
    const json_t *mct = json_object_get(body, "max_completion_tokens");
    if (json_is_null(mt))
        mt = NULL;
    if (json_is_null(mct))
        mct = NULL;
    if (mt && mct)
        return job_fail(job, TM_ERRCODE_INVALID_VALUE, err,
                        "fields 'body.max_tokens' and 'body.max_completion_tokens': give at most "
                        "one of them");
    if (mct) {
        rc = sp_field(ps, job, "max_tokens", "body.max_completion_tokens", mct, err);
        if (rc || job->err_code)
            return rc;
    }
    for (size_t i = 0; tm_ingest_sp_keys[i]; i++) {
        v = json_object_get(body, tm_ingest_sp_keys[i]);
        if (!v || json_is_null(v))
            continue;
        char field[64];
        snprintf(field, sizeof(field), "body.%s", tm_ingest_sp_keys[i]);
        rc = sp_field(ps, job, tm_ingest_sp_keys[i], field, v, err);
        if (rc || job->err_code)
            return rc;
    }
    return TM_OK;
}

// ---- unknown keys ----

// Record keys tokenmill reads (the sampling fields from their table, fields_int.h).
// clang-format off
static const char *const native_keys[] = {
    "id",
    "prompt",
    "messages",
    TM_INGEST_SP_FIELDS(TM_INGEST_SP_KEY) // every sampling field
    "n",
    "logprobs",
    "top_logprobs",
    "prompt_logprobs",
    "continuations",
    "continuation",
    "cache_salt",
    "response_format",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    NULL,
};
static const char *const openai_keys[] = {"custom_id", "method", "url", "body", NULL};
// Body keys tokenmill reads, refuses (unsupported_body, stream, guided_grammar), or accepts as
// OpenAI parameters that do not change a batch answer here.
static const char *const body_keys[] = {
    "model",
    "messages",
    "prompt",
    TM_INGEST_SP_FIELDS(TM_INGEST_SP_KEY) // every sampling field
    "max_completion_tokens",
    "n",
    "stream",
    "logprobs",
    "top_logprobs",
    "tools",
    "functions",
    "best_of",
    "echo",
    "suffix",
    "audio",
    "prediction",
    "response_format",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "user",
    "metadata",
    "store",
    "stream_options",
    "service_tier",
    "tool_choice",
    "parallel_tool_calls",
    "function_call",
    "modalities",
    "reasoning_effort",
    "web_search_options",
    NULL,
};
// clang-format on

// Levenshtein distance of a and b, at most 31 bytes each (longer: 99).
static size_t edit_distance(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    if (na > 31 || nb > 31)
        return 99;
    size_t row[32];
    for (size_t j = 0; j <= nb; j++)
        row[j] = j;
    for (size_t i = 1; i <= na; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= nb; j++) {
            size_t up = row[j];
            size_t sub = diag + (a[i - 1] != b[j - 1]);
            row[j] = TM_MIN(TM_MIN(row[j - 1] + 1, up + 1), sub);
            diag = up;
        }
    }
    return row[nb];
}

const char *tm_rec_parser_nearest(const char *key, const char *const *known) {
    const char *best = NULL;
    size_t best_d = 3;
    for (size_t i = 0; known[i]; i++) {
        size_t d = edit_distance(key, known[i]);
        if (d < best_d && d < strlen(key)) {
            best = known[i];
            best_d = d;
        }
    }
    return best;
}

// One unknown key of a record (prefix "" or "body."): counted, warned about at its first record;
// with limits.strict_fields the record fails (unless it failed already).
static tm_rc unknown_key(tm_rec_parser *ps, tm_job *job, const char *prefix, const char *key,
                         const char *const *known, tm_err *err) {
    const char *near = tm_rec_parser_nearest(key, known);
    char full[64], hint[64] = "";
    snprintf(full, sizeof(full), "%s%.50s", prefix, key);
    if (near)
        snprintf(hint, sizeof(hint), " (did you mean '%s%s'?)", prefix, near);
    size_t i = 0;
    while (i < ps->n_unknown && strcmp(ps->unknown[i].key, full) != 0)
        i++;
    if (i < ps->n_unknown) {
        ps->unknown[i].n++;
    } else if (i < TM_REC_PARSER_MAX_UNKNOWN) {
        tm_rec_parser_unknown *u = &ps->unknown[ps->n_unknown++];
        snprintf(u->key, sizeof(u->key), "%s", full);
        snprintf(u->near, sizeof(u->near), "%s", near ? near : "");
        u->n = 1;
        TM_LOG_WARN("ingest",
                    "%s line %llu: unknown key '%s'%s: %s (warned once per key; the count comes "
                    "at the end)",
                    job->file, (unsigned long long)job->line, full, hint,
                    ps->spec->strict_fields ? "an error (limits.strict_fields)" : "ignored");
    } else {
        ps->n_unknown_other++;
    }
    if (!ps->spec->strict_fields || job->err_code != TM_ERRCODE_NONE)
        return TM_OK;
    return job_fail(job, TM_ERRCODE_INVALID_VALUE, err,
                    "unknown key '%s'%s; limits.strict_fields rejects keys that are not in the "
                    "record schema",
                    full, hint);
}

static int is_known(const char *key, const char *const *known) {
    for (size_t i = 0; known[i]; i++)
        if (strcmp(key, known[i]) == 0)
            return 1;
    return 0;
}

// Every unknown key of a record object (and of an OpenAI line's body).
static tm_rc check_keys(tm_rec_parser *ps, const json_t *root, bool oai, tm_job *job, tm_err *err) {
    const char *key;
    json_t *v;
    tm_rc rc = TM_OK;
    const char *const *known = oai ? openai_keys : native_keys;
    json_object_foreach((json_t *)root, key, v) {
        if (!rc && !is_known(key, known))
            rc = unknown_key(ps, job, "", key, known, err);
    }
    const json_t *body = oai ? json_object_get(root, "body") : NULL;
    if (json_is_object(body))
        json_object_foreach((json_t *)body, key, v) {
            if (!rc && !is_known(key, body_keys))
                rc = unknown_key(ps, job, "body.", key, body_keys, err);
        }
    return rc;
}

static bool is_openai_line(const json_t *root) {
    return json_object_get(root, "custom_id") || json_object_get(root, "body") ||
           json_object_get(root, "url");
}

// Fill job from one line. Only allocation failures are returned; everything else is recorded in
// job->err_code. Lines that are not JSON objects take the format of the file's first object
// line (so an OpenAI file gets OpenAI-shaped error lines).
// Defined below: a line with an integer beyond 64 bits.
static tm_rc huge_integer(tm_rec_parser *ps, tm_job *job, const char *line, size_t len,
                          const json_error_t *jerr, tm_err *err);

static tm_rc parse_record(tm_rec_parser *ps, const char *line, size_t len, tm_job *job,
                          tm_err *err) {
    tm_field_fail ff;
    job->format = ps->file_fmt;
    if (len >= 3 && memcmp(line, "\xef\xbb\xbf", 3) == 0)
        return job_fail(job, TM_ERRCODE_INVALID_JSON, err,
                        "line starts with a UTF-8 byte order mark (allowed only at the start of a "
                        "file)");
    size_t col = too_deep_at(line, len, ps->spec->max_depth);
    if (col)
        return job_fail(job, TM_ERRCODE_NESTING_TOO_DEEP, err,
                        "arrays/objects nested deeper than limits.max_depth (%u) at column %zu",
                        ps->spec->max_depth, col);
    json_error_t jerr;
    json_t *root = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        if (json_error_code(&jerr) == json_error_invalid_utf8)
            return job_fail(job, TM_ERRCODE_INVALID_UTF8, err, "invalid UTF-8 at column %d: %s",
                            jerr.column, jerr.text);
        if (json_error_code(&jerr) == json_error_null_character) // jansson's text names a flag
            return job_fail(job, TM_ERRCODE_INVALID_JSON, err,
                            "invalid JSON at column %d: \\u0000 (NUL) is not allowed in strings",
                            jerr.column);
        if (json_error_code(&jerr) == json_error_numeric_overflow)
            return huge_integer(ps, job, line, len, &jerr, err);
        return job_fail(job, TM_ERRCODE_INVALID_JSON, err, "invalid JSON at column %d: %s",
                        jerr.column, jerr.text);
    }
    tm_rc rc = TM_OK;
    if (!json_is_object(root)) {
        tm_ingest_fail_set(&ff, TM_ERRCODE_WRONG_TYPE, "a JSON object", root);
        rc = job_fail(job, TM_ERRCODE_WRONG_TYPE, err, "record: %s", ff.msg);
    } else {
        bool oai = is_openai_line(root);
        if (!ps->file_fmt_known) {
            ps->file_fmt = oai ? TM_REC_FORMAT_OPENAI : TM_REC_FORMAT_NATIVE;
            ps->file_fmt_known = true;
        }
        job->format = oai ? TM_REC_FORMAT_OPENAI : TM_REC_FORMAT_NATIVE;
        rc = oai ? parse_openai(ps, root, job, err) : parse_native(ps, root, job, err);
        if (!rc && job->err_code == TM_ERRCODE_NONE) // a rejected line gets no key warnings
            rc = check_keys(ps, root, oai, job, err);
    }
    json_decref(root);
    return rc;
}

// The path ("body.max_tokens", "messages[2].x") of the first number in v of magnitude >= 2^63
// into path; 1 when found. v was parsed with JSON_DECODE_INT_AS_REAL, so such a number is an
// integer literal jansson could not hold (or a real that large: named the same way).
static int find_huge(const json_t *v, char *path, size_t cap, size_t at, int depth) {
    if (json_is_real(v))
        return fabs(json_real_value(v)) >= 9223372036854775808.0;
    if (depth > 64)
        return 0;
    if (json_is_object(v)) {
        const char *k;
        const json_t *x;
        json_object_foreach((json_t *)v, k, x) {
            int n = snprintf(path + at, cap - at, "%s%s", at ? "." : "", k);
            if (n < 0 || (size_t)n >= cap - at)
                n = 0;
            if (find_huge(x, path, cap, at + (size_t)n, depth + 1))
                return 1;
            path[at] = '\0';
        }
    } else if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++) {
            int n = snprintf(path + at, cap - at, "[%zu]", i);
            if (n < 0 || (size_t)n >= cap - at)
                n = 0;
            if (find_huge(json_array_get(v, i), path, cap, at + (size_t)n, depth + 1))
                return 1;
            path[at] = '\0';
        }
    }
    return 0;
}

// A line with an integer literal beyond jansson's 64-bit range (issue 35: seed 2^64-1, max_tokens
// 2^63 were invalid_json without a field): invalid_value naming the field and, for a sampling
// field, its range. The line is valid JSON otherwise (parsed again with integers as reals); when
// it is not, or no field is found, the JSON error as before.
static tm_rc huge_integer(tm_rec_parser *ps, tm_job *job, const char *line, size_t len,
                          const json_error_t *jerr, tm_err *err) {
    (void)ps;
    json_error_t je2;
    json_t *root = json_loadb(line, len, JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL, &je2);
    char path[256] = "";
    int found = root && find_huge(root, path, sizeof(path), 0, 0);
    json_decref(root);
    if (!found)
        return job_fail(job, TM_ERRCODE_INVALID_JSON, err, "invalid JSON at column %d: %s",
                        jerr->column, jerr->text);
    // the literal as written: the digits before the error's position
    size_t end = jerr->position <= (int)len ? (size_t)jerr->position : len, b = end;
    while (b > 0 && ((line[b - 1] >= '0' && line[b - 1] <= '9') || line[b - 1] == '-'))
        b--;
    int n_lit = (int)TM_MIN(end - b, (size_t)40);
    const char *key = strrchr(path, '.');
    key = key ? key + 1 : path;
    if (strcmp(path, "max_tokens") == 0) // a native record's: 0 is allowed there
        return job_fail(job, TM_ERRCODE_INVALID_VALUE, err,
                        "field 'max_tokens': expected an integer from 0 to 2147483647 (0: nothing "
                        "generated), got %.*s",
                        (int)TM_MIN(end - b, (size_t)40), line + b);
    tm_field_fail ff = {0};
    json_t *probe = json_integer(LLONG_MAX); // the field's own range message, if it has one
    tm_sampling sp = {0};
    if (tm_ingest_sp_bit(key) && probe && tm_ingest_sp_field(key, probe, &sp, &ff, err) == TM_OK &&
        ff.code == TM_ERRCODE_INVALID_VALUE) {
        char *got = strstr(ff.msg, ", got ");
        if (got)
            *got = '\0';
        tm_sampling_fini(&sp);
        json_decref(probe);
        return job_fail(job, TM_ERRCODE_INVALID_VALUE, err, "field '%s': %s, got %.*s", path,
                        ff.msg, n_lit, line + b);
    }
    tm_sampling_fini(&sp);
    json_decref(probe);
    return job_fail(job, TM_ERRCODE_INVALID_VALUE, err,
                    "field '%s': the integer %.*s is out of range (integers must be from "
                    "-9223372036854775808 to 9223372036854775807%s)",
                    path, n_lit, line + b,
                    strcmp(key, "seed") == 0 ? "; seed: from 0 to 9223372036854775807" : "");
}

// A new record with its position filled in.
static tm_rc new_job(tm_rec_parser *ps, const char *file, uint64_t line_no, tm_job **out,
                     tm_err *err) {
    tm_job *job = tm_calloc(1, sizeof(*job));
    if (!job)
        return TM_ERR(err, TM_E_NOMEM, "record");
    job->seq_no = ps->seq_no;
    job->line = line_no;
    job->format = ps->file_fmt;
    job->file = tm_strdup(file);
    if (!job->file) {
        tm_free(job);
        return TM_ERR(err, TM_E_NOMEM, "record");
    }
    *out = job;
    return TM_OK;
}

// ---- API ----

void tm_rec_parser_init(tm_rec_parser *ps, const tm_job_spec *spec) {
    memset(ps, 0, sizeof(*ps));
    ps->spec = spec;
    ps->file_fmt = TM_REC_FORMAT_NATIVE;
}

void tm_rec_parser_fini(tm_rec_parser *ps) {
    if (ps->n_unknown) { // one line with every key's count
        char line[1024];
        size_t len = 0;
        for (size_t i = 0; i < ps->n_unknown && len < sizeof(line); i++)
            len += (size_t)snprintf(line + len, sizeof(line) - len, "%s'%s' in %llu record%s",
                                    i ? ", " : "", ps->unknown[i].key,
                                    (unsigned long long)ps->unknown[i].n,
                                    ps->unknown[i].n == 1 ? "" : "s");
        TM_LOG_WARN("ingest", "unknown keys in this job's records: %s%s%s", line,
                    ps->n_unknown_other ? " and more (other keys)" : "",
                    ps->spec->strict_fields ? " (rejected: limits.strict_fields)" : " (ignored)");
    }
    ps->n_unknown = 0;
    tm_free(ps->ids.slots);
    ps->ids = (tm_rec_parser_ids){0};
}

tm_rc tm_rec_parser_line(tm_rec_parser *ps, const char *file, uint64_t line_no, const char *s,
                         size_t n, tm_job **out, tm_err *err) {
    tm_job *job = NULL;
    tm_rc rc = new_job(ps, file, line_no, &job, err);
    if (!rc)
        rc = parse_record(ps, s, n, job, err);
    if (rc) {
        tm_job_destroy(job);
        return rc;
    }
    ps->seq_no++;
    *out = job;
    return TM_OK;
}

tm_rc tm_rec_parser_too_long(tm_rec_parser *ps, const char *file, uint64_t line_no,
                             uint64_t n_bytes, tm_job **out, tm_err *err) {
    tm_job *job = NULL;
    tm_rc rc = new_job(ps, file, line_no, &job, err);
    if (!rc)
        rc = job_fail(job, TM_ERRCODE_LINE_TOO_LONG, err,
                      "line is %llu bytes, longer than limits.max_line_bytes (%llu)",
                      (unsigned long long)n_bytes, (unsigned long long)ps->spec->max_line_bytes);
    if (rc) {
        tm_job_destroy(job);
        return rc;
    }
    ps->seq_no++;
    *out = job;
    return TM_OK;
}

uint64_t tm_rec_parser_max_line_bytes(const tm_rec_parser *ps) { return ps->spec->max_line_bytes; }

void tm_rec_parser_set_check_ids(tm_rec_parser *ps, bool on) { ps->no_id_check = !on; }

void tm_rec_parser_reset_format(tm_rec_parser *ps) {
    ps->file_fmt = TM_REC_FORMAT_NATIVE;
    ps->file_fmt_known = false;
}

void tm_rec_parser_take_back(tm_rec_parser *ps, uint64_t seq_no) {
    TM_ASSERT(seq_no + 1 == ps->seq_no);
    ps->seq_no--;
}

uint64_t tm_rec_parser_n_records(const tm_rec_parser *ps) { return ps->seq_no; }
