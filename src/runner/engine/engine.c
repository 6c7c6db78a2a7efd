/* runner/engine/engine.c - what the engine backends share (see engine.h). */
#include "runner/engine/engine.h"
#include "runner/model/tensor.h"

tm_rc tm_batch_check(const tm_batch *b, const tm_engine_opts *o, uint64_t max_pos, uint32_t n_vocab,
                     const char *who, uint32_t *n_tok, uint64_t *n_bt, tm_err *err) {
    if (b->n_seq > o->max_seqs)
        return TM_ERR(err, TM_E_INVAL, "%s: %u sequences > max_seqs %u", who, b->n_seq,
                      o->max_seqs);
    uint64_t T = 0, bt = 0, rows = 0;
    for (uint32_t i = 0; i < b->n_seq; i++) {
        const tm_batch_seq *s = &b->seqs[i];
        if (s->n_tok == 0 || !s->tokens)
            return TM_ERR(err, TM_E_INVAL, "%s: sequence %u has no tokens", who, i);
        const uint64_t end = (uint64_t)s->pos + s->n_tok;
        if (end > max_pos || end > (uint64_t)s->n_block * o->block_size || !s->block_table)
            return TM_ERR(err, TM_E_INVAL,
                          "%s: sequence %u positions [%u, %llu) not covered by its %u blocks of "
                          "%u (pool of %u)",
                          who, i, s->pos, (unsigned long long)end, s->n_block, o->block_size,
                          o->n_kv_block);
        const uint32_t n_used = (uint32_t)TM_CEIL_DIV(end, o->block_size);
        for (uint32_t k = 0; k < n_used; k++)
            if (s->block_table[k] >= o->n_kv_block)
                return TM_ERR(err, TM_E_INVAL, "%s: sequence %u block %u id %u >= %u", who, i, k,
                              s->block_table[k], o->n_kv_block);
        for (uint32_t k = 0; k < s->n_tok; k++)
            if (s->tokens[k] >= n_vocab)
                return TM_ERR(err, TM_E_INVAL, "%s: sequence %u token %u id %u >= %u", who, i, k,
                              s->tokens[k], n_vocab);
        if (s->want_logits && s->n_logits > s->n_tok)
            return TM_ERR(err, TM_E_INVAL, "%s: sequence %u wants %u logits rows of %u tokens", who,
                          i, s->n_logits, s->n_tok);
        T += s->n_tok;
        bt += n_used;
        rows += tm_batch_seq_rows(s);
    }
    if (rows > tm_engine_max_rows(o))
        return TM_ERR(err, TM_E_INVAL, "%s: %llu logits rows > %u", who, (unsigned long long)rows,
                      tm_engine_max_rows(o));
    if (T > o->max_batched_tokens)
        return TM_ERR(err, TM_E_INVAL, "%s: %llu tokens > max_batched_tokens %u", who,
                      (unsigned long long)T, o->max_batched_tokens);
    *n_tok = (uint32_t)T;
    *n_bt = bt;
    return TM_OK;
}

const char *tm_engine_kv_dtype_name(const tm_engine *eng) {
    if (eng->opts.kv_dtype == TM_KV_DTYPE_AUTO && eng->ops->kv_auto)
        return eng->ops->kv_auto;
    return tm_kv_dtype_name(eng->opts.kv_dtype);
}

const char *tm_kv_dtype_name(tm_kv_dtype d) {
    switch (d) {
    case TM_KV_DTYPE_AUTO:
        return "auto";
    case TM_KV_DTYPE_FP8:
        return "fp8";
    case TM_KV_DTYPE_BF16:
        return "bf16";
    case TM_KV_DTYPE_FP8_HEAD:
        return "fp8-head";
    }
    return "?";
}

float tm_kv_fp8_round(float x) {
    // saturate first (the comparisons are false for NaN, which tm_f32_to_e4m3 keeps NaN)
    if (x > 448.0f)
        x = 448.0f;
    else if (x < -448.0f)
        x = -448.0f;
    return tm_e4m3_to_f32(tm_f32_to_e4m3(x));
}
