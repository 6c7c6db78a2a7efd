/* ingest/fields.c - sampling-field validation and value rendering shared by job_spec.c and
 * source.c. */
#include "ingest/fields_int.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/utf8.h"

const char *const tm_ingest_sp_keys[] = {
    "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", NULL,
};

static const uint32_t sp_bits[] = {
    TM_SP_MAX_TOKENS, TM_SP_TEMPERATURE, TM_SP_TOP_P, TM_SP_TOP_K,
    TM_SP_MIN_P,      TM_SP_SEED,        TM_SP_STOP,
};

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
    tm_sampling_fini(sp);
    sp->stop = stop;
    sp->n_stop = (uint32_t)n;
    sp->set |= TM_SP_STOP;
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
        if (get_int(v, 1, INT32_MAX, "an integer >= 1", &i, fail))
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
        if (get_int(v, -1, INT32_MAX, "an integer >= -1 (-1 or 0 = off)", &i, fail))
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
        if (get_int(v, 0, LLONG_MAX, "an integer >= 0", &i, fail))
            return TM_OK;
        sp->seed = (uint64_t)i;
        break;
    case TM_SP_STOP:
        return get_stop(v, sp, fail, err);
    default:
        TM_ASSERT(!"not a sampling key");
    }
    sp->set |= bit;
    return TM_OK;
}
