/* runner/engram_map.c - the compressed token map of a tokenizer (engram_map.h). */
#include "runner/engram_map.h"

#include "base/alloc.h"
#include "runner/model/engram_hash.h"

tm_rc tm_engram_map_from_tok(const tm_tokenizer *tok, int32_t **map, uint32_t *n_tok,
                             uint32_t *n_compressed, tm_err *err) {
    *map = NULL;
    const uint32_t n = tm_tok_n_vocab(tok);
    tm_engram_tok *t = tm_calloc(n ? n : 1, sizeof(*t));
    int32_t *m = tm_calloc(n ? n : 1, sizeof(*m));
    tm_rc rc = TM_OK;
    if (!t || !m) {
        rc = TM_ERR(err, TM_E_NOMEM, "engram token map of %u tokens", n);
        goto done;
    }
    for (uint32_t i = 0; i < n; i++) {
        size_t len = 0;
        const char *p = tm_tok_piece(tok, i, &len);
        // piece NULL: a byte-level BPE token, whose vocabulary string the hash module derives
        t[i] = (tm_engram_tok){.text = p ? p : "", .text_len = p ? len : 0};
    }
    rc = tm_engram_token_map_build(t, n, m, n_compressed, err);
    if (rc == TM_OK) {
        *map = m;
        *n_tok = n;
        m = NULL;
    }
done:
    tm_free(t);
    tm_free(m);
    return rc;
}
