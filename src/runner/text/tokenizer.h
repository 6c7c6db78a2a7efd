/* runner/text/tokenizer.h - Hugging Face tokenizer.json byte-level BPE (the DeepSeek V3/V4, Llama 3
 * and Qwen2 kind): added/special tokens matched in the input text, the pre-tokenizer's Split
 * regexes, byte-level mapping, BPE merges by rank; decoding back to bytes, with a streaming
 * decoder that only ever emits whole UTF-8 characters. Immutable after load: encode/decode may be
 * called from several threads at once (each with its own output and tm_detok). */
#ifndef TM_RUNNER_TEXT_TOKENIZER_H
#define TM_RUNNER_TEXT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "base/err.h"

typedef struct tm_tokenizer tm_tokenizer;

/* A growable array of token ids. */
typedef struct tm_ids {
    uint32_t *ids;
    size_t len, cap;
} tm_ids;
tm_rc tm_ids_push(tm_ids *v, uint32_t id, tm_err *err);
void tm_ids_fini(tm_ids *v);

/* Load model_dir/tokenizer.json and model_dir/tokenizer_config.json (bos/eos/chat_template;
 * optional: without it there is no bos/eos/template). TM_E_IO/TM_E_PARSE with the file name on
 * error; TM_E_PARSE names any tokenizer.json feature that is not supported (an unknown Split
 * regex, a normalizer, ...: see tokenizer.c and docs/tokenizer.md); a bos_token/eos_token that
 * is not a token is TM_E_PARSE; TM_E_NOMEM. On success *out owns the tokenizer. */
tm_rc tm_tok_load(const char *model_dir, tm_tokenizer **out, tm_err *err);
/* The same from memory: json[0..n_json) is the text of tokenizer.json and config[0..n_config)
 * that of tokenizer_config.json (config NULL: there is none). Both are borrowed (only read during
 * the call) and need no terminating NUL; label stands for the folder in messages. Same errors as
 * tm_tok_load but never TM_E_IO. For fuzzing and tests. */
tm_rc tm_tok_load_mem(const char *json, size_t n_json, const char *config, size_t n_config,
                      const char *label, tm_tokenizer **out, tm_err *err);
void tm_tok_destroy(tm_tokenizer *tok); /* NULL is a no-op */

/* Append the ids of text[0..n) to out. No BOS is added. Text that spells an added token is
 * matched as that token. Invalid UTF-8 in text: TM_E_INVAL. */
tm_rc tm_tok_encode(const tm_tokenizer *tok, const char *text, size_t n, tm_ids *out, tm_err *err);
/* The same, bounded: when the result fits (out->len <= max_len afterwards), *over = 0 and out is
 * what tm_tok_encode gives. Otherwise *over = 1 (TM_OK) and out holds its old ids plus some
 * unspecified ones (truncate it): encoding stops as soon as the bound is certainly passed, and a
 * text longer than the bound times the longest token's bytes is not tokenized at all, so time and
 * memory are O(max_len), not O(n), past the UTF-8 check (which runs first, as in tm_tok_encode). */
tm_rc tm_tok_encode_max(const tm_tokenizer *tok, const char *text, size_t n, size_t max_len,
                        tm_ids *out, int *over, tm_err *err);
/* Append the bytes of ids (special tokens included as their text) to out. Ids out of range:
 * TM_E_INVAL. The result may end in an incomplete UTF-8 sequence if the ids do. */
tm_rc tm_tok_decode(const tm_tokenizer *tok, const uint32_t *ids, size_t n, tm_buf *out,
                    tm_err *err);

/* Streaming decode: feed ids one at a time; only whole UTF-8 characters reach out. */
typedef struct tm_detok {
    char pending[8]; /* bytes of an incomplete UTF-8 sequence */
    uint32_t n_pending;
} tm_detok;
/* Append the text that id completes to out. skip_special: special tokens produce no text.
 * Bytes that cannot be part of valid UTF-8 become U+FFFD (one per maximal ill-formed
 * subsequence), so out only ever receives valid UTF-8. st starts zeroed. Id out of range:
 * TM_E_INVAL (st unchanged). */
tm_rc tm_detok_push(const tm_tokenizer *tok, tm_detok *st, uint32_t id, int skip_special,
                    tm_buf *out, tm_err *err);
/* End of stream: any incomplete tail is written as U+FFFD (one per byte sequence). */
tm_rc tm_detok_flush(tm_detok *st, tm_buf *out, tm_err *err);

/* Queries. Ids are -1 when the tokenizer has none. */
uint32_t tm_tok_n_vocab(const tm_tokenizer *tok); /* 1 + the largest id */
int32_t tm_tok_bos_id(const tm_tokenizer *tok);
int32_t tm_tok_eos_id(const tm_tokenizer *tok);
int tm_tok_is_special(const tm_tokenizer *tok, uint32_t id);
/* Id of an exact token string (vocab or added token), -1 if none. */
int32_t tm_tok_find(const tm_tokenizer *tok, const char *piece);
/* Bytes (decoded) of token id; *len set; NULL if out of range. Valid until destroy. */
const char *tm_tok_piece(const tm_tokenizer *tok, uint32_t id, size_t *len);
/* tokenizer_config.json's chat_template, or NULL. Valid until destroy. */
const char *tm_tok_chat_template(const tm_tokenizer *tok);
const char *tm_tok_bos_text(const tm_tokenizer *tok); /* "" if none */
const char *tm_tok_eos_text(const tm_tokenizer *tok); /* "" if none */

#endif /* TM_RUNNER_TEXT_TOKENIZER_H */
