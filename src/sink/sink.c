/* sink/sink.c - LZ4-framed JSONL completions + plain JSONL error records. The only file of the
 * sink module that calls LZ4F. */
#include "sink/sink.h"

#include <errno.h>
#include <fcntl.h>
#include <lz4frame.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/utf8.h"
#include "base/fault_io.h"
#include "base/fsutil.h"
#include "base/hash.h"

enum { SLICE_BYTES = 64 * 1024 }; /* lines are fed to LZ4F in slices of at most this size */

struct tm_sink {
    tm_sink_opts opts;
    char *dir; /* owned */
    char *path_lz4, *path_err;
    FILE *f_lz4, *f_err;
    LZ4F_cctx *cctx;
    LZ4F_preferences_t prefs;
    unsigned char *dst; /* [dst_cap] LZ4F output */
    size_t dst_cap;
    bool in_frame;
    uint64_t frame_n_rec, frame_n_bytes;
    tm_buf line;
    tm_sink_stats stats;
};

// ---- JSON lines ----

// Milliseconds with 3 decimals; negative or non-finite values (a clock bug) are written as 0.
static tm_rc append_ms(tm_buf *b, double ms, tm_err *err) {
    if (!isfinite(ms) || ms < 0)
        ms = 0;
    return tm_buf_printf(b, err, "%.3f", ms);
}

// finish_reason's value, in both the native and the OpenAI lines.
static const char *finish_name(tm_finish finish) {
    return finish == TM_FINISH_LENGTH ? "length" : "stop";
}

// 128-bit id derived from the record's id text (unique per job, as ids are; stable across runs,
// so a resumed job names a record the same way): 32 hex digits. Users see these ids and earlier
// output folders hold them, so the recipe is frozen (tm_hash_fnv2x64, not XXH3).
static void oai_hex_id(const tm_completion *c, char out[33]) {
    const char *s = c->id_json ? c->id_json : "";
    tm_h128 h = tm_hash_fnv2x64(s, strlen(s), c->seq_no);
    if (!c->id_json) // unreadable id: the seq_no keeps error ids unique
        h.lo ^= c->seq_no * 0xff51afd7ed558ccdULL;
    snprintf(out, 33, "%016llx%016llx", (unsigned long long)h.lo, (unsigned long long)h.hi);
}

// The end of every line: ,"source":{..} when the record has one, then "}\n".
static tm_rc end_line(tm_buf *b, const tm_completion *c, tm_err *err) {
    tm_rc rc = TM_OK;
    if (c->src_meta_json)
        rc = tm_buf_append_str(b, ",\"source\":", err);
    if (!rc && c->src_meta_json)
        rc = tm_buf_append_str(b, c->src_meta_json, err); // JSON object text made by ingest
    if (!rc)
        rc = tm_buf_append_str(b, "}\n", err);
    return rc;
}

// ---- logprobs (issue 5) ----

// A logprob as JSON: shortest text that reads back as the same float; NaN (none) is null.
static tm_rc append_lp(tm_buf *b, float v, tm_err *err) {
    if (isnan(v))
        return tm_buf_append_str(b, "null", err);
    return tm_buf_printf(b, err, "%.9g", (double)v);
}

// Bytes of entry e of l (see tm_logprobs).
static const char *lp_bytes(const tm_logprobs *l, size_t e, size_t *n) {
    *n = l->off[e + 1] - l->off[e];
    return l->text + l->off[e];
}

// The token text of entry e as a JSON string (bytes that are not valid UTF-8, e.g. half a
// character, become U+FFFD; the token id or the OpenAI "bytes" array keeps them exact).
static tm_rc append_lp_tok(tm_buf *b, const tm_logprobs *l, size_t e, tm_err *err) {
    size_t n;
    const char *p = lp_bytes(l, e, &n);
    return tm_buf_append_json_str(b, p, n, err);
}

static tm_rc append_lp_bytes(tm_buf *b, const tm_logprobs *l, size_t e, tm_err *err) {
    size_t n;
    const unsigned char *p = (const unsigned char *)lp_bytes(l, e, &n);
    tm_rc rc = tm_buf_append_str(b, "[", err);
    for (size_t i = 0; i < n && !rc; i++)
        rc = tm_buf_printf(b, err, "%s%u", i ? "," : "", p[i]);
    if (!rc)
        rc = tm_buf_append_str(b, "]", err);
    return rc;
}

// One column of the chosen tokens, as the native and the OpenAI completions forms list them.
typedef enum lp_col { LP_COL_TEXT, LP_COL_ID, LP_COL_LOGPROB } lp_col;

// key (the JSON text before the list), then [..] of column col, one entry per chosen token.
static tm_rc append_lp_column(tm_buf *b, const char *key, const tm_logprobs *l, lp_col col,
                              tm_err *err) {
    const size_t per = 1 + l->n_top;
    tm_rc rc = tm_buf_printf(b, err, "%s[", key);
    for (uint32_t i = 0; i < l->n_tok && !rc; i++) {
        rc = i ? tm_buf_append_str(b, ",", err) : TM_OK;
        if (!rc && col == LP_COL_TEXT)
            rc = append_lp_tok(b, l, i * per, err);
        else if (!rc && col == LP_COL_ID)
            rc = tm_buf_printf(b, err, "%u", l->ids[i]);
        else if (!rc)
            rc = append_lp(b, l->lp[i], err);
    }
    if (!rc)
        rc = tm_buf_append_str(b, "]", err);
    return rc;
}

// Native: {"tokens": [..], "token_ids": [..], "token_logprobs": [..], "top_logprobs":
// [[{"token", "id", "logprob"}, ..], ..]} (null entries for a prompt's first token).
static tm_rc append_lp_native(tm_buf *b, const tm_logprobs *l, tm_err *err) {
    const size_t per = 1 + l->n_top;
    tm_rc rc = append_lp_column(b, "{\"tokens\":", l, LP_COL_TEXT, err);
    if (!rc)
        rc = append_lp_column(b, ",\"token_ids\":", l, LP_COL_ID, err);
    if (!rc)
        rc = append_lp_column(b, ",\"token_logprobs\":", l, LP_COL_LOGPROB, err);
    if (!rc)
        rc = tm_buf_append_str(b, ",\"top_logprobs\":[", err);
    for (uint32_t i = 0; i < l->n_tok && !rc; i++) {
        rc = tm_buf_append_str(b, i ? "," : "", err);
        if (!rc && isnan(l->lp[i])) {
            rc = tm_buf_append_str(b, "null", err);
            continue;
        }
        if (!rc)
            rc = tm_buf_append_str(b, "[", err);
        for (uint32_t j = 0; j < l->n_top && !rc; j++) {
            size_t t = (size_t)i * l->n_top + j;
            rc = tm_buf_append_str(b, j ? ",{\"token\":" : "{\"token\":", err);
            if (!rc)
                rc = append_lp_tok(b, l, i * per + 1 + j, err);
            if (!rc)
                rc = tm_buf_printf(b, err, ",\"id\":%u,\"logprob\":", l->top_ids[t]);
            if (!rc)
                rc = append_lp(b, l->top_lp[t], err);
            if (!rc)
                rc = tm_buf_append_str(b, "}", err);
        }
        if (!rc)
            rc = tm_buf_append_str(b, "]", err);
    }
    if (!rc)
        rc = tm_buf_append_str(b, "]}", err);
    return rc;
}

// ,"<key>": the native logprobs l, when there are any (l not NULL).
static tm_rc append_lp_field(tm_buf *b, const char *key, const tm_logprobs *l, tm_err *err) {
    if (!l)
        return TM_OK;
    tm_rc rc = tm_buf_printf(b, err, ",\"%s\":", key);
    if (!rc)
        rc = append_lp_native(b, l, err);
    return rc;
}

// OpenAI chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token",
// "logprob", "bytes"}]}], "refusal": null}.
static tm_rc append_lp_oai_chat(tm_buf *b, const tm_logprobs *l, tm_err *err) {
    const size_t per = 1 + l->n_top;
    tm_rc rc = tm_buf_append_str(b, "{\"content\":[", err);
    for (uint32_t i = 0; i < l->n_tok && !rc; i++) {
        for (uint32_t j = 0; j <= l->n_top && !rc; j++) { // j = 0: the token, then alternatives
            size_t e = i * per + j;
            rc = tm_buf_append_str(b,
                                   j == 0 ? (i ? ",{\"token\":" : "{\"token\":")
                                          : (j > 1 ? ",{\"token\":" : "{\"token\":"),
                                   err);
            if (!rc)
                rc = append_lp_tok(b, l, e, err);
            if (!rc)
                rc = tm_buf_append_str(b, ",\"logprob\":", err);
            if (!rc)
                rc = append_lp(b, j ? l->top_lp[(size_t)i * l->n_top + j - 1] : l->lp[i], err);
            if (!rc)
                rc = tm_buf_append_str(b, ",\"bytes\":", err);
            if (!rc)
                rc = append_lp_bytes(b, l, e, err);
            if (!rc)
                rc = tm_buf_append_str(b, j == 0 ? ",\"top_logprobs\":[" : "}", err);
        }
        if (!rc)
            rc = tm_buf_append_str(b, "]}", err);
    }
    if (!rc)
        rc = tm_buf_append_str(b, "],\"refusal\":null}", err);
    return rc;
}

// OpenAI (legacy) completions: {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}]
// (the k alternatives plus the chosen token, as OpenAI documents), "text_offset" (characters
// before each token in the text: UTF-8 lead bytes counted)}.
static tm_rc append_lp_oai_cmpl(tm_buf *b, const tm_logprobs *l, tm_err *err) {
    const size_t per = 1 + l->n_top;
    tm_rc rc = append_lp_column(b, "{\"tokens\":", l, LP_COL_TEXT, err);
    if (!rc)
        rc = append_lp_column(b, ",\"token_logprobs\":", l, LP_COL_LOGPROB, err);
    if (!rc)
        rc = tm_buf_append_str(b, ",\"top_logprobs\":[", err);
    for (uint32_t i = 0; i < l->n_tok && !rc; i++) {
        rc = tm_buf_append_str(b, i ? ",{" : "{", err);
        int chosen_listed = 0;
        for (uint32_t j = 0; j < l->n_top && !rc; j++) {
            chosen_listed |= l->top_ids[(size_t)i * l->n_top + j] == l->ids[i];
            rc = j ? tm_buf_append_str(b, ",", err) : TM_OK;
            if (!rc)
                rc = append_lp_tok(b, l, i * per + 1 + j, err);
            if (!rc)
                rc = tm_buf_append_str(b, ":", err);
            if (!rc)
                rc = append_lp(b, l->top_lp[(size_t)i * l->n_top + j], err);
        }
        if (!rc && !chosen_listed) {
            rc = tm_buf_append_str(b, l->n_top ? "," : "", err);
            if (!rc)
                rc = append_lp_tok(b, l, i * per, err);
            if (!rc)
                rc = tm_buf_append_str(b, ":", err);
            if (!rc)
                rc = append_lp(b, l->lp[i], err);
        }
        if (!rc)
            rc = tm_buf_append_str(b, "}", err);
    }
    if (!rc)
        rc = tm_buf_append_str(b, "],\"text_offset\":[", err);
    uint64_t at = 0;
    for (uint32_t i = 0; i < l->n_tok && !rc; i++) {
        rc = tm_buf_printf(b, err, "%s%llu", i ? "," : "", (unsigned long long)at);
        size_t n;
        const unsigned char *p = (const unsigned char *)lp_bytes(l, i * per, &n);
        for (size_t k = 0; k < n; k++)
            at += (p[k] & 0xC0) != 0x80;
    }
    if (!rc)
        rc = tm_buf_append_str(b, "]}", err);
    return rc;
}

// One OpenAI choice: {"index", "message": {"role", "content"} | "text", "logprobs",
// "finish_reason"}.
static tm_rc append_oai_choice(tm_buf *b, bool chat, uint32_t index, const char *text,
                               tm_finish finish, const tm_logprobs *lp, tm_err *err) {
    tm_rc rc = tm_buf_printf(b, err, "%s{\"index\":%u,", index ? "," : "", index);
    if (!rc)
        rc = tm_buf_append_str(
            b, chat ? "\"message\":{\"role\":\"assistant\",\"content\":" : "\"text\":", err);
    if (!rc)
        rc = tm_buf_append_json_str(b, text, strlen(text), err);
    if (!rc)
        rc = tm_buf_append_str(b, chat ? "},\"logprobs\":" : ",\"logprobs\":", err);
    if (!rc && !lp)
        rc = tm_buf_append_str(b, "null", err);
    else if (!rc)
        rc = chat ? append_lp_oai_chat(b, lp, err) : append_lp_oai_cmpl(b, lp, err);
    if (!rc)
        rc = tm_buf_printf(b, err, ",\"finish_reason\":\"%s\"}", finish_name(finish));
    return rc;
}

// OpenAI Batch output line (docs: platform.openai.com/docs/guides/batch):
// {"id": "batch_req_..", "custom_id", "response": {"status_code": 200, "request_id", "body":
//  <chat.completion | text_completion>}, "error": null}
static tm_rc format_ok_openai(tm_buf *b, const tm_completion *c, tm_err *err) {
    char hex[33];
    oai_hex_id(c, hex);
    bool chat = c->format == TM_REC_FORMAT_OPENAI_CHAT;
    const char *text = c->text ? c->text : "";
    const char *model = c->model ? c->model : "";
    tm_rc rc =
        tm_buf_printf(b, err,
                      "{\"id\":\"batch_req_%s\",\"custom_id\":%s,\"response\":{"
                      "\"status_code\":200,\"request_id\":\"req_%s\",\"body\":{\"id\":\"%s%s\","
                      "\"object\":\"%s\",\"created\":%lld,\"model\":",
                      hex, c->id_json, hex, chat ? "chatcmpl-" : "cmpl-", hex,
                      chat ? "chat.completion" : "text_completion", (long long)time(NULL));
    if (!rc)
        rc = tm_buf_append_json_str(b, model, strlen(model), err);
    if (!rc)
        rc = tm_buf_append_str(b, ",\"choices\":[", err);
    for (uint32_t i = 0; i < c->n_choices && !rc; i++) {
        const tm_choice *ch = &c->choices[i];
        rc = append_oai_choice(b, chat, i, ch->text ? ch->text : "", ch->finish, ch->logprobs, err);
    }
    if (!rc && c->n_choices == 0)
        rc = append_oai_choice(b, chat, 0, text, c->finish, c->logprobs, err);
    if (!rc)
        rc = tm_buf_printf(b, err,
                           "],\"usage\":{"
                           "\"prompt_tokens\":%u,\"completion_tokens\":%u,\"total_tokens\":%u,"
                           "\"prompt_tokens_details\":{\"cached_tokens\":%u}},"
                           "\"system_fingerprint\":\"tokenmill-" TM_VERSION "\"}},\"error\":null",
                           c->n_tok_prompt, c->n_tok_gen, c->n_tok_prompt + c->n_tok_gen,
                           c->n_tok_cached);
    if (!rc)
        rc = end_line(b, c, err);
    return rc;
}

// A file path as a JSON string, losslessly (base/utf8.h: bytes outside UTF-8 as \xHH).
static tm_rc append_path(tm_buf *b, const char *path, tm_err *err) {
    char *e = tm_path_escape(path);
    if (!e)
        return TM_ERR(err, TM_E_NOMEM, "file name");
    tm_rc rc = tm_buf_append_json_str(b, e, strlen(e), err);
    tm_free(e);
    return rc;
}

// ,"file":..,"line":.. when known (tokenmill's addition to the OpenAI error line).
static tm_rc append_file_line(tm_buf *b, const tm_completion *c, tm_err *err) {
    tm_rc rc = TM_OK;
    if (c->file) {
        rc = tm_buf_append_str(b, ",\"file\":", err);
        if (!rc)
            rc = append_path(b, c->file, err);
    }
    if (!rc && c->file && c->line)
        rc = tm_buf_printf(b, err, ",\"line\":%llu", (unsigned long long)c->line);
    return rc;
}

// OpenAI error-file line. A request that never reached the model (ingest rejected it) has
// "response": null and "error": {code, message}; one the model could not serve (too long for the
// context, template or engine failure) has the HTTP-style response (status 400 or 500, body
// {"error": {message, type, param, code}}) and "error": null, as the OpenAI Batch API writes.
static tm_rc format_error_openai(tm_buf *b, const tm_completion *c, tm_err *err) {
    char hex[33];
    oai_hex_id(c, hex);
    const char *msg = c->err_msg ? c->err_msg : "";
    const char *code = tm_errcode_name(c->err_code);
    bool served = c->err_code == TM_ERRCODE_CONTEXT_LENGTH_EXCEEDED ||
                  c->err_code == TM_ERRCODE_TEMPLATE_ERROR ||
                  c->err_code == TM_ERRCODE_ENGINE_ERROR;
    tm_rc rc = tm_buf_printf(b, err, "{\"id\":\"batch_req_%s\",\"custom_id\":%s,", hex,
                             c->id_json ? c->id_json : "null");
    if (!rc && served) {
        bool server = c->err_code == TM_ERRCODE_ENGINE_ERROR;
        rc = tm_buf_printf(b, err,
                           "\"response\":{\"status_code\":%d,\"request_id\":\"req_%s\",\"body\":{"
                           "\"error\":{\"message\":",
                           server ? 500 : 400, hex);
        if (!rc)
            rc = tm_buf_append_json_str(b, msg, strlen(msg), err);
        if (!rc)
            rc = tm_buf_printf(b, err,
                               ",\"type\":\"%s\",\"param\":null,\"code\":\"%s\"}}},\"error\":null",
                               server ? "server_error" : "invalid_request_error", code);
    } else if (!rc) {
        rc = tm_buf_printf(b, err,
                           "\"response\":null,\"error\":{\"code\":\"%s\",\"message\":", code);
        if (!rc)
            rc = tm_buf_append_json_str(b, msg, strlen(msg), err);
        if (!rc)
            rc = tm_buf_append_str(b, "}", err);
    }
    if (!rc)
        rc = append_file_line(b, c, err);
    if (!rc)
        rc = end_line(b, c, err);
    return rc;
}

tm_rc tm_sink_format_ok(tm_buf *b, const tm_completion *c, tm_err *err) {
    if (!c->id_json)
        return TM_ERR(err, TM_E_INVAL, "ok record (seq %llu) without an id",
                      (unsigned long long)c->seq_no);
    if (c->format == TM_REC_FORMAT_OPENAI_CHAT || c->format == TM_REC_FORMAT_OPENAI_COMPLETION)
        return format_ok_openai(b, c, err);
    if (c->format != TM_REC_FORMAT_NATIVE)
        return TM_ERR(err, TM_E_INVAL, "ok record (seq %llu) of an OpenAI line without a url kind",
                      (unsigned long long)c->seq_no);
    const char *text = c->text ? c->text : "";
    tm_rc rc = tm_buf_append_str(b, "{\"id\":", err);
    if (!rc)
        rc = tm_buf_append_str(b, c->id_json, err); // already JSON text, written verbatim
    if (!rc && c->n_scores) {                       // a scoring record: one score per continuation
        rc = tm_buf_append_str(b, ",\"scores\":[", err);
        for (uint32_t i = 0; i < c->n_scores && !rc; i++) {
            const tm_score *sc = &c->scores[i];
            rc = tm_buf_printf(b, err,
                               "%s{\"index\":%u,\"logprob\":%.17g,\"n_tokens\":%u,"
                               "\"is_greedy\":%s",
                               i ? "," : "", i, sc->logprob, sc->n_tok,
                               sc->is_greedy ? "true" : "false");
            if (!rc)
                rc = append_lp_field(b, "logprobs", sc->logprobs, err);
            if (!rc)
                rc = tm_buf_append_str(b, "}", err);
        }
        if (!rc)
            rc = tm_buf_append_str(b, "]", err);
    } else if (!rc && c->n_choices) { // n > 1 samples
        rc = tm_buf_append_str(b, ",\"choices\":[", err);
        for (uint32_t i = 0; i < c->n_choices && !rc; i++) {
            const tm_choice *ch = &c->choices[i];
            const char *t = ch->text ? ch->text : "";
            rc = tm_buf_printf(b, err, "%s{\"index\":%u,\"text\":", i ? "," : "", i);
            if (!rc)
                rc = tm_buf_append_json_str(b, t, strlen(t), err);
            if (!rc)
                rc = tm_buf_printf(b, err, ",\"finish_reason\":\"%s\",\"completion_tokens\":%u",
                                   finish_name(ch->finish), ch->n_tok_gen);
            if (!rc)
                rc = append_lp_field(b, "logprobs", ch->logprobs, err);
            if (!rc)
                rc = tm_buf_append_str(b, "}", err);
        }
        if (!rc)
            rc = tm_buf_append_str(b, "]", err);
    } else if (!rc) {
        rc = tm_buf_append_str(b, ",\"text\":", err);
        if (!rc)
            rc = tm_buf_append_json_str(b, text, strlen(text), err);
        if (!rc)
            rc = tm_buf_printf(b, err, ",\"finish_reason\":\"%s\"", finish_name(c->finish));
        if (!rc)
            rc = append_lp_field(b, "logprobs", c->logprobs, err);
    }
    if (!rc)
        rc = append_lp_field(b, "prompt_logprobs", c->prompt_logprobs, err);
    if (!rc)
        rc = tm_buf_printf(b, err,
                           ",\"usage\":{\"prompt_tokens\":%u,"
                           "\"completion_tokens\":%u,\"cached_tokens\":%u",
                           c->n_tok_prompt, c->n_tok_gen, c->n_tok_cached);
    if (!rc && c->spec)
        rc = tm_buf_printf(b, err,
                           ",\"speculative\":{\"num_drafts\":%u,\"num_draft_tokens\":%u,"
                           "\"num_accepted_tokens\":%u}",
                           c->n_spec_drafts, c->n_spec_draft_tok, c->n_spec_accepted);
    if (!rc)
        rc = tm_buf_append_str(b, "},\"timing\":{\"ttft_ms\":", err);
    if (!rc)
        rc = append_ms(b, c->ttft_ms, err);
    if (!rc)
        rc = tm_buf_append_str(b, ",\"total_ms\":", err);
    if (!rc)
        rc = append_ms(b, c->total_ms, err);
    if (!rc)
        rc = tm_buf_append_str(b, "}", err);
    if (!rc)
        rc = end_line(b, c, err);
    return rc;
}

tm_rc tm_sink_format_error(tm_buf *b, const tm_completion *c, tm_err *err) {
    if (c->format != TM_REC_FORMAT_NATIVE)
        return format_error_openai(b, c, err);
    tm_rc rc = tm_buf_append_str(b, "{", err);
    const char *sep = "";
    if (!rc && c->id_json) {
        rc = tm_buf_printf(b, err, "\"id\":%s", c->id_json);
        sep = ",";
    }
    if (!rc && c->file) {
        rc = tm_buf_printf(b, err, "%s\"file\":", sep);
        if (!rc)
            rc = append_path(b, c->file, err);
        sep = ",";
    }
    if (!rc && c->line) {
        rc = tm_buf_printf(b, err, "%s\"line\":%llu", sep, (unsigned long long)c->line);
        sep = ",";
    }
    if (!rc)
        rc = tm_buf_printf(b, err, "%s\"error\":{\"code\":\"%s\",\"message\":", sep,
                           tm_errcode_name(c->err_code));
    const char *msg = c->err_msg ? c->err_msg : "";
    if (!rc)
        rc = tm_buf_append_json_str(b, msg, strlen(msg), err);
    if (!rc)
        rc = tm_buf_append_str(b, "}", err);
    if (!rc)
        rc = end_line(b, c, err);
    return rc;
}

// ---- files ----

// mkdir -p, then make sure an existing path is a folder.
static tm_rc make_dir(const char *dir, tm_err *err) {
    tm_rc rc = tm_fs_mkdir_p(dir, err);
    struct stat st;
    if (!rc && (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)))
        rc = TM_ERR(err, TM_E_IO, "%s: not a folder", dir);
    return rc;
}

static tm_rc write_all(FILE *f, const char *path, const void *p, size_t n, tm_err *err) {
    int e = n ? tm_fault_io(TM_IO_WRITE) : 0;
    if (e)
        return TM_ERR(err, TM_E_IO, "writing %s: %s", path, strerror(e));
    if (n && fwrite(p, 1, n, f) != n)
        return TM_ERR(err, TM_E_IO, "writing %s: %s", path, strerror(errno));
    return TM_OK;
}

static tm_rc write_lz4(tm_sink *sink, size_t n, tm_err *err) {
    sink->stats.bytes_lz4 += n;
    sink->stats.size_lz4 += n;
    return write_all(sink->f_lz4, sink->path_lz4, sink->dst, n, err);
}

static tm_rc frame_end(tm_sink *sink, tm_err *err) {
    if (!sink->in_frame)
        return TM_OK;
    size_t r = LZ4F_compressEnd(sink->cctx, sink->dst, sink->dst_cap, NULL);
    if (LZ4F_isError(r))
        return TM_ERR(err, TM_E_INTERNAL, "LZ4F_compressEnd: %s", LZ4F_getErrorName(r));
    sink->in_frame = false;
    sink->frame_n_rec = sink->frame_n_bytes = 0;
    sink->stats.n_frames++;
    return write_lz4(sink, r, err);
}

static tm_rc write_ok_line(tm_sink *sink, const char *s, size_t n, tm_err *err) {
    tm_rc rc;
    if (sink->opts.plain) { // no frames: the line as it is
        sink->stats.bytes_raw += n;
        sink->stats.bytes_lz4 += n;
        sink->stats.size_lz4 += n;
        return write_all(sink->f_lz4, sink->path_lz4, s, n, err);
    }
    if (!sink->in_frame) {
        size_t r = LZ4F_compressBegin(sink->cctx, sink->dst, sink->dst_cap, &sink->prefs);
        if (LZ4F_isError(r))
            return TM_ERR(err, TM_E_INTERNAL, "LZ4F_compressBegin: %s", LZ4F_getErrorName(r));
        sink->in_frame = true;
        rc = write_lz4(sink, r, err);
        if (rc)
            return rc;
    }
    for (size_t off = 0; off < n; off += SLICE_BYTES) { // slices keep dst small for huge lines
        size_t k = TM_MIN((size_t)SLICE_BYTES, n - off);
        size_t r = LZ4F_compressUpdate(sink->cctx, sink->dst, sink->dst_cap, s + off, k, NULL);
        if (LZ4F_isError(r))
            return TM_ERR(err, TM_E_INTERNAL, "LZ4F_compressUpdate: %s", LZ4F_getErrorName(r));
        rc = write_lz4(sink, r, err);
        if (rc)
            return rc;
    }
    sink->frame_n_rec++;
    sink->frame_n_bytes += n;
    sink->stats.bytes_raw += n;
    if (sink->frame_n_rec == 2) { // crash tests: leave a torn frame on disk (fault_io.h)
        fflush(sink->f_lz4);
        tm_fault_point("mid_frame");
    }
    if ((sink->opts.frame_records && sink->frame_n_rec >= sink->opts.frame_records) ||
        sink->frame_n_bytes >= sink->opts.frame_bytes)
        return frame_end(sink, err);
    return TM_OK;
}

// Open a data file: appended to (resume) or emptied; never through a link, never a FIFO
// (tm_fs_open_out).
static tm_rc open_data(tm_sink *sink, const char *path, FILE **f, tm_err *err) {
    int flags = O_WRONLY | O_CREAT | (sink->opts.append ? O_APPEND : O_TRUNC);
    int fd = -1;
    tm_rc rc = tm_fs_open_out(path, flags, 0666, NULL, &fd, err);
    if (rc)
        return rc;
    *f = fdopen(fd, sink->opts.append ? "ab" : "wb");
    if (!*f) {
        rc = TM_ERR(err, TM_E_IO, "opening %s: %s", path, strerror(errno));
        close(fd);
    }
    return rc;
}

// ---- public API ----

tm_rc tm_sink_open(const char *out_dir, const tm_sink_opts *opts, tm_sink **out, tm_err *err) {
    tm_sink *sink = tm_calloc(1, sizeof(*sink));
    if (!sink)
        return TM_ERR(err, TM_E_NOMEM, "sink");
    if (opts)
        sink->opts = *opts;
    if (!sink->opts.frame_bytes)
        sink->opts.frame_bytes = TM_SINK_DEFAULT_FRAME_BYTES;
    sink->prefs.frameInfo.blockSizeID = LZ4F_max256KB;
    sink->prefs.frameInfo.blockMode = LZ4F_blockLinked;
    sink->prefs.frameInfo.contentChecksumFlag = LZ4F_contentChecksumEnabled;
    sink->prefs.frameInfo.frameType = LZ4F_frame;
    sink->prefs.frameInfo.blockChecksumFlag = LZ4F_noBlockChecksum;
    sink->prefs.compressionLevel = 0;
    sink->dst_cap = TM_MAX(LZ4F_compressBound(SLICE_BYTES, &sink->prefs),
                           LZ4F_compressBound(0, &sink->prefs));
    sink->dst_cap = TM_MAX(sink->dst_cap, (size_t)LZ4F_HEADER_SIZE_MAX);
    sink->dst = tm_malloc(sink->dst_cap);
    sink->dir = tm_strdup(out_dir);
    if (!sink->dst || !sink->dir) {
        TM_ERR(err, TM_E_NOMEM, "sink buffers");
        goto fail;
    }
    size_t r = LZ4F_createCompressionContext(&sink->cctx, LZ4F_VERSION);
    if (LZ4F_isError(r)) {
        sink->cctx = NULL;
        TM_ERR(err, TM_E_NOMEM, "LZ4 compression context: %s", LZ4F_getErrorName(r));
        goto fail;
    }
    if (make_dir(out_dir, err))
        goto fail;
    sink->path_lz4 = tm_fs_path_join(out_dir, sink->opts.plain ? TM_SINK_COMPLETIONS_PLAIN_FILE
                                                               : TM_SINK_COMPLETIONS_FILE);
    sink->path_err = tm_fs_path_join(out_dir, TM_SINK_ERRORS_FILE);
    if (!sink->path_lz4 || !sink->path_err) {
        TM_ERR(err, TM_E_NOMEM, "sink paths");
        goto fail;
    }
    if (open_data(sink, sink->path_lz4, &sink->f_lz4, err) ||
        open_data(sink, sink->path_err, &sink->f_err, err))
        goto fail;
    struct stat st_lz4, st_err; // appending: the files' lengths so far (stats.size_*)
    if (fstat(fileno(sink->f_lz4), &st_lz4) != 0 || fstat(fileno(sink->f_err), &st_err) != 0) {
        TM_ERR(err, TM_E_IO, "stat %s: %s", sink->path_lz4, strerror(errno));
        goto fail;
    }
    sink->stats.size_lz4 = (uint64_t)st_lz4.st_size;
    sink->stats.size_err = (uint64_t)st_err.st_size;
    // the new directory entries; not one of the commit protocol's hooked fsyncs (fsutil.h)
    if (!sink->opts.no_fsync && tm_fs_sync_dir(out_dir, TM_FS_HOOKS_OFF, err))
        goto fail;
    *out = sink;
    return TM_OK;
fail:
    sink->in_frame = false;
    tm_sink_close(sink, &(tm_err){0});
    return err->rc;
}

tm_rc tm_sink_write(tm_sink *sink, const tm_completion *c, tm_err *err) {
    tm_buf_clear(&sink->line);
    if (c->err_code != TM_ERRCODE_NONE) {
        tm_rc rc = tm_sink_format_error(&sink->line, c, err);
        if (!rc)
            rc = write_all(sink->f_err, sink->path_err, sink->line.data, sink->line.len, err);
        if (!rc) {
            sink->stats.n_err++;
            sink->stats.size_err += sink->line.len;
        }
        return rc;
    }
    tm_rc rc = tm_sink_format_ok(&sink->line, c, err);
    if (!rc)
        rc = write_ok_line(sink, sink->line.data, sink->line.len, err);
    if (!rc)
        sink->stats.n_ok++;
    return rc;
}

static tm_rc flush_file(tm_sink *sink, FILE *f, const char *path, tm_err *err) {
    if (fflush(f) != 0)
        return TM_ERR(err, TM_E_IO, "writing %s: %s", path, strerror(errno));
    if (sink->opts.no_fsync)
        return TM_OK;
    int e = tm_fault_io(TM_IO_FSYNC);
    if (e || fsync(fileno(f)) != 0)
        return TM_ERR(err, TM_E_IO, "fsync %s: %s", path, strerror(e ? e : errno));
    return TM_OK;
}

static tm_rc write_out(FILE *f, const char *path, tm_err *err) {
    int e = tm_fault_io(TM_IO_WRITE);
    if (e || fflush(f) != 0)
        return TM_ERR(err, TM_E_IO, "writing %s: %s", path, strerror(e ? e : errno));
    return TM_OK;
}

tm_rc tm_sink_flush(tm_sink *sink, tm_err *err) {
    tm_rc rc = frame_end(sink, err);
    // write both files out first, then fsync both: the crash tests stop in between
    if (!rc)
        rc = write_out(sink->f_lz4, sink->path_lz4, err);
    if (!rc)
        rc = write_out(sink->f_err, sink->path_err, err);
    if (!rc)
        tm_fault_point("after_write_before_fsync");
    if (!rc)
        rc = flush_file(sink, sink->f_lz4, sink->path_lz4, err);
    if (!rc)
        rc = flush_file(sink, sink->f_err, sink->path_err, err);
    return rc;
}

tm_rc tm_sink_close(tm_sink *sink, tm_err *err) {
    if (!sink)
        return TM_OK;
    tm_rc rc = TM_OK;
    if (sink->f_lz4 && sink->f_err)
        rc = tm_sink_flush(sink, err);
    if (sink->f_lz4 && fclose(sink->f_lz4) != 0 && !rc)
        rc = TM_ERR(err, TM_E_IO, "closing %s: %s", sink->path_lz4, strerror(errno));
    if (sink->f_err && fclose(sink->f_err) != 0 && !rc)
        rc = TM_ERR(err, TM_E_IO, "closing %s: %s", sink->path_err, strerror(errno));
    if (sink->cctx)
        LZ4F_freeCompressionContext(sink->cctx);
    tm_free(sink->dst);
    tm_free(sink->dir);
    tm_free(sink->path_lz4);
    tm_free(sink->path_err);
    tm_buf_fini(&sink->line);
    tm_free(sink);
    return rc;
}

void tm_sink_get_stats(const tm_sink *sink, tm_sink_stats *out) { *out = sink->stats; }

// ---- the file sink as an output (sink/out.h) ----

static tm_rc files_write(void *self, const tm_completion *c, tm_err *err) {
    return tm_sink_write(self, c, err);
}

static tm_rc files_commit(void *self, tm_sink_commit *ci, tm_err *err) {
    tm_rc rc = tm_sink_flush(self, err);
    if (rc)
        return rc;
    tm_sink_stats st;
    tm_sink_get_stats(self, &st);
    ci->files_set = true;
    ci->bytes_completions = st.size_lz4;
    ci->bytes_errors = st.size_err;
    return TM_OK;
}

static tm_rc files_close(void *self, tm_err *err) { return tm_sink_close(self, err); }

static const tm_sink_out_ops files_ops = {
    .name = "files", .write = files_write, .commit = files_commit, .close = files_close};

tm_sink_out tm_sink_as_out(tm_sink *sink) { return (tm_sink_out){.ops = &files_ops, .self = sink}; }
