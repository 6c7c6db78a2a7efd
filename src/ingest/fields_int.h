/* ingest/fields_int.h - validators shared by the job spec and the record parser (private to
 * src/ingest): the per-record sampling fields (max_tokens, temperature, top_p, top_k, min_p, seed,
 * stop) and a short rendering of a JSON value for error messages. The same rules apply to a
 * record's own fields and to the job's "defaults", so both say the same thing about a bad value.
 * Pure functions; thread-safe. */
#ifndef TM_INGEST_FIELDS_INT_H
#define TM_INGEST_FIELDS_INT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "base/record.h"

/* Largest temperature accepted (OpenAI's range is 0..2). */
#define TM_INGEST_MAX_TEMPERATURE 2.0

/* What was wrong with one field value. code is TM_ERRCODE_NONE when the value was accepted. */
typedef struct tm_field_fail {
    tm_errcode code; /* TM_ERRCODE_WRONG_TYPE or TM_ERRCODE_INVALID_VALUE */
    char msg[224];   /* "expected a number >= 0, got \"hot\"" (no field name) */
} tm_field_fail;

/* The sampling fields' key table, the one list of their names: X(key, TM_SP_* bit) per field, in
 * schema order. A record's fields, an OpenAI body's, the job's "defaults" and the known-key lists
 * of the unknown-key check (rec_parser.c) all come from it; tm_ingest_sp_field validates each
 * (base/record.h's tm_sampling_resolve merges them over the defaults). */
#define TM_INGEST_SP_FIELDS(X)                                                                     \
    X("max_tokens", TM_SP_MAX_TOKENS)                                                              \
    X("temperature", TM_SP_TEMPERATURE)                                                            \
    X("top_p", TM_SP_TOP_P)                                                                        \
    X("top_k", TM_SP_TOP_K)                                                                        \
    X("min_p", TM_SP_MIN_P)                                                                        \
    X("seed", TM_SP_SEED)                                                                          \
    X("stop", TM_SP_STOP)                                                                          \
    X("presence_penalty", TM_SP_PRESENCE_PENALTY)                                                  \
    X("frequency_penalty", TM_SP_FREQUENCY_PENALTY)                                                \
    X("repetition_penalty", TM_SP_REPETITION_PENALTY)                                              \
    X("logit_bias", TM_SP_LOGIT_BIAS)                                                              \
    X("min_tokens", TM_SP_MIN_TOKENS)                                                              \
    X("stop_token_ids", TM_SP_STOP_TOKEN_IDS)                                                      \
    X("ignore_eos", TM_SP_IGNORE_EOS)
/* The key of a TM_INGEST_SP_FIELDS entry, with its comma (for string lists). */
#define TM_INGEST_SP_KEY(key, bit) key,

/* Names of the sampling fields (TM_INGEST_SP_FIELDS), in schema order, NULL-terminated. */
extern const char *const tm_ingest_sp_keys[];

/* TM_SP_* bit of a sampling field name, or 0 if key is not one. */
uint32_t tm_ingest_sp_bit(const char *key);

/* Validate v as sampling field `key` (tm_ingest_sp_bit(key) != 0) and store it in sp, setting its
 * TM_SP_* bit. A rejected value fills fail (sp unchanged) and still returns TM_OK; the return code
 * is only for TM_E_NOMEM (copying stop strings). A previous stop list is freed on replacement. */
tm_rc tm_ingest_sp_field(const char *key, const json_t *v, tm_sampling *sp, tm_field_fail *fail,
                         tm_err *err);

/* The structured-output fields of a record object (a native record, or an OpenAI line's body):
 * response_format ({"type": "text" | "json_object" | "json_schema", "json_schema": {"name",
 * "schema", "strict"}}) and vLLM's guided_json (a schema object or its text), guided_regex and
 * guided_choice; null means not given. Sets *kind (TM_GUIDED_*; NONE for none or "text") and
 * *text (owned; see base/record.h). A bad value or two constraints fill fail and field (the key,
 * e.g. "response_format.type", without a prefix), leaving *kind NONE and *text NULL, and return
 * TM_OK; the return code is only for TM_E_NOMEM. The constraint itself is compiled (and refused
 * when outside the subset) by the runner. */
tm_rc tm_ingest_guided(const json_t *obj, uint32_t *kind, char **text, tm_field_fail *fail,
                       char *field, size_t n_field, tm_err *err);

/* Render v as compact JSON for a message, cut to at most ~60 bytes on a UTF-8 boundary ("..."
 * appended when cut). out has n >= 8 bytes. */
void tm_ingest_describe(const json_t *v, char *out, size_t n);

/* Fill fail with code and "expected <what>, got <v>". */
void tm_ingest_fail_set(tm_field_fail *fail, tm_errcode code, const char *what, const json_t *v);

#endif /* TM_INGEST_FIELDS_INT_H */
