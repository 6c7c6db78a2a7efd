/* ingest/fields.c - sampling-field validation and value rendering shared by job_spec.c and
 * rec_parser.c. */
#include "ingest/fields_int.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/utf8.h"

const char *const tm_ingest_sp_keys[] = {TM_INGEST_SP_FIELDS(TM_INGEST_SP_KEY) NULL};

#define SP_BIT(key, bit) bit,
static const uint32_t sp_bits[] = {TM_INGEST_SP_FIELDS(SP_BIT)};
#undef SP_BIT

uint32_t tm_ingest_sp_bit(const char *key) {
    for (size_t i = 0; tm_ingest_sp_keys[i]; i++)
        if (strcmp(key, tm_ingest_sp_keys[i]) == 0)
            return sp_bits[i];
    return 0;
}

void tm_ingest_describe(const json_t *v, char *out, size_t n) {
    enum { MAX_SHOWN = 60 };
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    if (!s) {
        snprintf(out, n, "a value");
        return;
    }
    size_t len = strlen(s);
    size_t lim = n - 4 < MAX_SHOWN ? n - 4 : MAX_SHOWN;
    if (len <= lim) {
        memcpy(out, s, len + 1);
    } else {
        size_t k = tm_utf8_valid_prefix(s, lim); // json_dumps output is valid UTF-8
        memcpy(out, s, k);
        memcpy(out + k, "...", 4);
    }
    free(s); // allocated by jansson's malloc
}

void tm_ingest_fail_set(tm_field_fail *fail, tm_errcode code, const char *what, const json_t *v) {
    char got[72];
    tm_ingest_describe(v, got, sizeof(got));
    fail->code = code;
    snprintf(fail->msg, sizeof(fail->msg), "expected %s, got %s", what, got);
}

// Integer field in [lo, hi]: a non-integer is wrong_type, out of range is invalid_value.
static int get_int(const json_t *v, json_int_t lo, json_int_t hi, const char *what, json_int_t *out,
                   tm_field_fail *fail) {
    if (!json_is_integer(v)) {
        tm_ingest_fail_set(fail, TM_ERRCODE_WRONG_TYPE, what, v);
        return -1;
    }
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi) {
        tm_ingest_fail_set(fail, TM_ERRCODE_INVALID_VALUE, what, v);
        return -1;
    }
    *out = x;
    return 0;
}

static int get_num(const json_t *v, const char *what, double *out, tm_field_fail *fail) {
    if (!json_is_number(v)) {
        tm_ingest_fail_set(fail, TM_ERRCODE_WRONG_TYPE, what, v);
        return -1;
    }
    *out = json_number_value(v);
    return 0;
}

static tm_rc get_stop(const json_t *v, tm_sampling *sp, tm_field_fail *fail, tm_err *err) {
    static const char what[] = "a non-empty string or an array of non-empty strings";
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    if (!json_is_string(v) && !json_is_array(v)) {
        tm_ingest_fail_set(fail, TM_ERRCODE_WRONG_TYPE, what, v);
        return TM_OK;
    }
    for (size_t i = 0; i < n; i++) {
        const json_t *s = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_string(s)) {
            tm_ingest_fail_set(fail, TM_ERRCODE_WRONG_TYPE, what, v);
            return TM_OK;
        }
        if (json_string_length(s) == 0) {
            tm_ingest_fail_set(fail, TM_ERRCODE_INVALID_VALUE, what, v);
            return TM_OK;
        }
    }
    if (n > UINT32_MAX) {
        tm_ingest_fail_set(fail, TM_ERRCODE_INVALID_VALUE, what, v);
        return TM_OK;
    }
    char **stop = tm_calloc(n, sizeof(*stop));
    if (!stop)
        return TM_ERR(err, TM_E_NOMEM, "stop strings");
    for (size_t i = 0; i < n; i++) {
        const json_t *s = json_is_array(v) ? json_array_get(v, i) : v;
        stop[i] = tm_strndup(json_string_value(s), json_string_length(s));
        if (!stop[i]) {
            for (size_t j = 0; j < i; j++)
                tm_free(stop[j]);
            tm_free(stop);
            return TM_ERR(err, TM_E_NOMEM, "stop strings");
        }
    }
    for (uint32_t j = 0; j < sp->n_stop; j++) // the previous stop list only
        tm_free(sp->stop[j]);
    tm_free(sp->stop);
    sp->stop = stop;
    sp->n_stop = (uint32_t)n;
    sp->set |= TM_SP_STOP;
    return TM_OK;
}

// ---- logits processing fields (issue 22; docs/sampling.md) ----

#define MAX_TOKEN_ID 0x7fffffff /* ids are checked against the model's vocabulary later */

// A number in [lo, hi] (lo_open: > lo) into *out; 0, or -1 with fail filled.
static int get_range(const json_t *v, double lo, double hi, int lo_open, const char *what,
                     float *out, tm_field_fail *fail) {
    double d;
    if (get_num(v, what, &d, fail))
        return -1;
    if (!(lo_open ? d > lo : d >= lo) || !(d <= hi)) {
        tm_ingest_fail_set(fail, TM_ERRCODE_INVALID_VALUE, what, v);
        return -1;
    }
    *out = (float)d;
    return 0;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

// logit_bias: an object {"<token id>": bias in [-100, 100]}, kept sorted by id.
static tm_rc get_logit_bias(const json_t *v, tm_sampling *sp, tm_field_fail *fail, tm_err *err) {
    static const char what[] = "an object of token id strings to numbers in [-100, 100]";
    if (!json_is_object(v)) {
        tm_ingest_fail_set(fail, TM_ERRCODE_WRONG_TYPE, what, v);
        return TM_OK;
    }
    size_t n = json_object_size(v), k = 0;
    uint32_t *ids = tm_calloc(n ? n : 1, sizeof(*ids));
    float *bias = tm_calloc(n ? n : 1, sizeof(*bias));
    float *vals = tm_calloc(n ? n : 1, sizeof(*vals));
    uint64_t *pairs = tm_calloc(n ? n : 1, sizeof(*pairs));
    if (!ids || !bias || !vals || !pairs) {
        tm_free(ids), tm_free(bias), tm_free(vals), tm_free(pairs);
        return TM_ERR(err, TM_E_NOMEM, "logit_bias of %zu entries", n);
    }
    const char *key;
    json_t *b;
    json_object_foreach((json_t *)v, key, b) {
        char *end = NULL;
        long long id = strtoll(key, &end, 10);
        if (key[0] < '0' || key[0] > '9' || *end || id > MAX_TOKEN_ID) {
            tm_ingest_fail_set(fail, TM_ERRCODE_INVALID_VALUE, what, v);
            break;
        }
        if (get_range(b, -100, 100, 0, what, &vals[k], fail))
            break;
        pairs[k] = (uint64_t)id << 32 | k; // sort by id, then find the value by slot
        k++;
    }
    if (fail->code != TM_ERRCODE_NONE) {
        tm_free(ids), tm_free(bias), tm_free(vals), tm_free(pairs);
        return TM_OK;
    }
    qsort(pairs, k, sizeof(*pairs), cmp_u64);
    for (size_t j = 0; j < k; j++) {
        ids[j] = (uint32_t)(pairs[j] >> 32);
        bias[j] = vals[(uint32_t)pairs[j]];
        if (j && ids[j] == ids[j - 1]) { // "1" and "01"
            tm_ingest_fail_set(fail, TM_ERRCODE_INVALID_VALUE, "distinct token ids", v);
            tm_free(ids), tm_free(bias), tm_free(pairs), tm_free(vals);
            return TM_OK;
        }
    }
    tm_free(pairs), tm_free(vals);
    tm_free(sp->bias_ids), tm_free(sp->bias);
    sp->bias_ids = ids, sp->bias = bias, sp->n_bias = (uint32_t)k;
    sp->set |= TM_SP_LOGIT_BIAS;
    return TM_OK;
}

// stop_token_ids: an array of token ids (integers >= 0).
static tm_rc get_stop_ids(const json_t *v, tm_sampling *sp, tm_field_fail *fail, tm_err *err) {
    static const char what[] = "an array of token ids (integers >= 0)";
    if (!json_is_array(v)) {
        tm_ingest_fail_set(fail, TM_ERRCODE_WRONG_TYPE, what, v);
        return TM_OK;
    }
    size_t n = json_array_size(v);
    for (size_t i = 0; i < n; i++) {
        json_int_t x;
        if (get_int(json_array_get(v, i), 0, MAX_TOKEN_ID, what, &x, fail))
            return TM_OK;
    }
    uint32_t *ids = tm_calloc(n ? n : 1, sizeof(*ids));
    if (!ids)
        return TM_ERR(err, TM_E_NOMEM, "stop_token_ids of %zu ids", n);
    for (size_t i = 0; i < n; i++)
        ids[i] = (uint32_t)json_integer_value(json_array_get(v, i));
    tm_free(sp->stop_ids);
    sp->stop_ids = ids, sp->n_stop_ids = (uint32_t)n;
    sp->set |= TM_SP_STOP_TOKEN_IDS;
    return TM_OK;
}

static tm_rc proc_field(uint32_t bit, const json_t *v, tm_sampling *sp, tm_field_fail *fail,
                        tm_err *err) {
    json_int_t i = 0;
    switch (bit) {
    case TM_SP_PRESENCE_PENALTY:
        if (get_range(v, -2, 2, 0, "a number from -2 to 2", &sp->presence_penalty, fail))
            return TM_OK;
        break;
    case TM_SP_FREQUENCY_PENALTY:
        if (get_range(v, -2, 2, 0, "a number from -2 to 2", &sp->frequency_penalty, fail))
            return TM_OK;
        break;
    case TM_SP_REPETITION_PENALTY:
        if (get_range(v, 0, 100, 1, "a number > 0 and <= 100 (1 = off)", &sp->repetition_penalty,
                      fail))
            return TM_OK;
        break;
    case TM_SP_LOGIT_BIAS:
        return get_logit_bias(v, sp, fail, err);
    case TM_SP_MIN_TOKENS:
        if (get_int(v, 0, INT32_MAX, "an integer from 0 to 2147483647", &i, fail))
            return TM_OK;
        sp->min_tokens = (int32_t)i;
        break;
    case TM_SP_STOP_TOKEN_IDS:
        return get_stop_ids(v, sp, fail, err);
    case TM_SP_IGNORE_EOS:
        if (!json_is_boolean(v)) {
            tm_ingest_fail_set(fail, TM_ERRCODE_WRONG_TYPE, "true or false", v);
            return TM_OK;
        }
        sp->ignore_eos = json_is_true(v);
        break;
    default:
        TM_ASSERT(!"not a sampling key");
    }
    sp->set |= bit;
    return TM_OK;
}

tm_rc tm_ingest_sp_field(const char *key, const json_t *v, tm_sampling *sp, tm_field_fail *fail,
                         tm_err *err) {
    fail->code = TM_ERRCODE_NONE;
    fail->msg[0] = '\0';
    uint32_t bit = tm_ingest_sp_bit(key);
    json_int_t i = 0;
    double d = 0;
    switch (bit) {
    case TM_SP_MAX_TOKENS:
        if (get_int(v, 1, INT32_MAX, "an integer from 1 to 2147483647", &i, fail))
            return TM_OK;
        sp->max_tokens = (int32_t)i;
        break;
    case TM_SP_TEMPERATURE:
        // OpenAI's range (vLLM takes any value >= 0): past 2 the distribution is all but
        // uniform, and a huge value (1e308) would overflow the float copy to inf.
        if (get_num(v, "a number >= 0", &d, fail)) // (the wrong-type text predates the cap)
            return TM_OK;
        if (!(d >= 0 && d <= TM_INGEST_MAX_TEMPERATURE)) {
            tm_ingest_fail_set(fail, TM_ERRCODE_INVALID_VALUE, "a number >= 0 and <= 2", v);
            return TM_OK;
        }
        sp->temperature = (float)d;
        break;
    case TM_SP_TOP_P:
        if (get_num(v, "a number > 0 and <= 1", &d, fail))
            return TM_OK;
        if (!(d > 0 && d <= 1)) {
            tm_ingest_fail_set(fail, TM_ERRCODE_INVALID_VALUE, "a number > 0 and <= 1", v);
            return TM_OK;
        }
        sp->top_p = (float)d;
        break;
    case TM_SP_TOP_K:
        if (get_int(v, -1, INT32_MAX, "an integer from -1 to 2147483647 (-1 or 0 = off)", &i, fail))
            return TM_OK;
        sp->top_k = (int32_t)i;
        break;
    case TM_SP_MIN_P:
        if (get_num(v, "a number >= 0 and <= 1", &d, fail))
            return TM_OK;
        if (!(d >= 0 && d <= 1)) {
            tm_ingest_fail_set(fail, TM_ERRCODE_INVALID_VALUE, "a number >= 0 and <= 1", v);
            return TM_OK;
        }
        sp->min_p = (float)d;
        break;
    case TM_SP_SEED:
        if (get_int(v, 0, LLONG_MAX, "an integer from 0 to 9223372036854775807", &i, fail))
            return TM_OK;
        sp->seed = (uint64_t)i;
        break;
    case TM_SP_STOP:
        return get_stop(v, sp, fail, err);
    default:
        return proc_field(bit, v, sp, fail, err);
    }
    sp->set |= bit;
    return TM_OK;
}

// ---- structured output (issue 26; docs/structured_output.md) ----

// One constraint field: *kind and *text (owned: jansson's json_dumps copy re-allocated with
// tm_strdup, or the string itself). 0, -1 with fail filled, or -2 on allocation failure.
static int guided_one(const char *key, const json_t *v, uint32_t *kind, char **text,
                      tm_field_fail *fail, char *field, size_t n_field) {
    const json_t *src = v; // what becomes the text
    int dump = 1;
    snprintf(field, n_field, "%s", key);
    if (strcmp(key, "response_format") == 0) {
        const json_t *t = json_is_object(v) ? json_object_get(v, "type") : NULL;
        if (!json_is_object(v)) {
            tm_ingest_fail_set(fail, TM_ERRCODE_WRONG_TYPE, "an object with a \"type\"", v);
            return -1;
        }
        if (!json_is_string(t)) {
            snprintf(field, n_field, "%s.type", key);
            tm_ingest_fail_set(fail, t ? TM_ERRCODE_WRONG_TYPE : TM_ERRCODE_INVALID_VALUE,
                               "\"text\", \"json_object\" or \"json_schema\"", t ? t : v);
            return -1;
        }
        const char *ts = json_string_value(t);
        if (strcmp(ts, "text") == 0) {
            *kind = TM_GUIDED_NONE;
            return 0;
        }
        if (strcmp(ts, "json_object") == 0) {
            *kind = TM_GUIDED_JSON_OBJECT;
            *text = NULL;
            return 0;
        }
        if (strcmp(ts, "json_schema") != 0) {
            snprintf(field, n_field, "%s.type", key);
            tm_ingest_fail_set(fail, TM_ERRCODE_INVALID_VALUE,
                               "\"text\", \"json_object\" or \"json_schema\"", t);
            return -1;
        }
        const json_t *js = json_object_get(v, "json_schema");
        snprintf(field, n_field, "%s.json_schema", key);
        if (!json_is_object(js)) {
            tm_ingest_fail_set(fail, js ? TM_ERRCODE_WRONG_TYPE : TM_ERRCODE_INVALID_VALUE,
                               "an object with a \"schema\"", js ? js : v);
            return -1;
        }
        const json_t *name = json_object_get(js, "name"), *strict = json_object_get(js, "strict");
        if (name && !json_is_string(name)) {
            snprintf(field, n_field, "%s.json_schema.name", key);
            tm_ingest_fail_set(fail, TM_ERRCODE_WRONG_TYPE, "a string", name);
            return -1;
        }
        if (strict && !json_is_boolean(strict) && !json_is_null(strict)) {
            snprintf(field, n_field, "%s.json_schema.strict", key);
            tm_ingest_fail_set(fail, TM_ERRCODE_WRONG_TYPE, "true or false", strict);
            return -1;
        }
        src = json_object_get(js, "schema");
        snprintf(field, n_field, "%s.json_schema.schema", key);
        if (!json_is_object(src) && !json_is_boolean(src)) {
            tm_ingest_fail_set(fail, src ? TM_ERRCODE_WRONG_TYPE : TM_ERRCODE_INVALID_VALUE,
                               "a JSON Schema object", src ? src : js);
            return -1;
        }
        *kind = TM_GUIDED_JSON_SCHEMA;
    } else if (strcmp(key, "guided_json") == 0) {
        if (!json_is_object(v) && !json_is_string(v) && !json_is_boolean(v)) {
            tm_ingest_fail_set(fail, TM_ERRCODE_WRONG_TYPE,
                               "a JSON Schema (an object, or its JSON text)", v);
            return -1;
        }
        dump = !json_is_string(v);
        *kind = TM_GUIDED_JSON_SCHEMA;
    } else if (strcmp(key, "guided_regex") == 0) {
        if (!json_is_string(v)) {
            tm_ingest_fail_set(fail, TM_ERRCODE_WRONG_TYPE, "a string (a regular expression)", v);
            return -1;
        }
        dump = 0;
        *kind = TM_GUIDED_REGEX;
    } else { // guided_choice
        const char *what = "a non-empty array of strings";
        if (!json_is_array(v)) {
            tm_ingest_fail_set(fail, TM_ERRCODE_WRONG_TYPE, what, v);
            return -1;
        }
        for (size_t i = 0; i < json_array_size(v); i++)
            if (!json_is_string(json_array_get(v, i))) {
                tm_ingest_fail_set(fail, TM_ERRCODE_WRONG_TYPE, what, v);
                return -1;
            }
        if (json_array_size(v) == 0) {
            tm_ingest_fail_set(fail, TM_ERRCODE_INVALID_VALUE, what, v);
            return -1;
        }
        *kind = TM_GUIDED_CHOICE;
    }
    if (!dump) {
        *text = tm_strndup(json_string_value(src), json_string_length(src));
    } else {
        char *t = json_dumps(src, JSON_ENCODE_ANY | JSON_COMPACT);
        *text = t ? tm_strdup(t) : NULL;
        free(t); // jansson's allocation
    }
    return *text ? 0 : -2;
}

tm_rc tm_ingest_guided(const json_t *obj, uint32_t *kind, char **text, tm_field_fail *fail,
                       char *field, size_t n_field, tm_err *err) {
    static const char *const keys[] = {"response_format", "guided_json", "guided_regex",
                                       "guided_choice", NULL};
    fail->code = TM_ERRCODE_NONE;
    fail->msg[0] = '\0';
    *kind = TM_GUIDED_NONE;
    *text = NULL;
    const char *first = NULL;
    for (size_t i = 0; keys[i]; i++) {
        const json_t *v = json_object_get(obj, keys[i]);
        if (!v || json_is_null(v))
            continue;
        uint32_t k = TM_GUIDED_NONE;
        char *t = NULL;
        int r = guided_one(keys[i], v, &k, &t, fail, field, n_field);
        if (r == -2)
            return TM_ERR(err, TM_E_NOMEM, "structured output constraint");
        if (r < 0 || k == TM_GUIDED_NONE) {
            tm_free(t);
            if (r < 0) {
                tm_free(*text), *text = NULL, *kind = TM_GUIDED_NONE;
                return TM_OK;
            }
            continue;
        }
        if (first) {
            tm_free(t);
            tm_free(*text), *text = NULL, *kind = TM_GUIDED_NONE;
            snprintf(field, n_field, "%s", keys[i]);
            fail->code = TM_ERRCODE_INVALID_VALUE;
            snprintf(fail->msg, sizeof(fail->msg),
                     "give at most one constraint; '%s' was given already (response_format, "
                     "guided_json, guided_regex, guided_choice)",
                     first);
            return TM_OK;
        }
        first = keys[i];
        *kind = k, *text = t;
    }
    return TM_OK;
}
