/* base/record.c - record lifetimes and error-code names. */
#include "base/record.h"

#include "base/alloc.h"

const char *tm_errcode_name(tm_errcode code) {
    switch (code) {
    case TM_ERRCODE_NONE:
        return "none";
    case TM_ERRCODE_INVALID_JSON:
        return "invalid_json";
    case TM_ERRCODE_INVALID_UTF8:
        return "invalid_utf8";
    case TM_ERRCODE_MISSING_FIELD:
        return "missing_field";
    case TM_ERRCODE_WRONG_TYPE:
        return "wrong_type";
    case TM_ERRCODE_INVALID_VALUE:
        return "invalid_value";
    case TM_ERRCODE_DUPLICATE_ID:
        return "duplicate_id";
    case TM_ERRCODE_LINE_TOO_LONG:
        return "line_too_long";
    case TM_ERRCODE_CONTEXT_LENGTH_EXCEEDED:
        return "context_length_exceeded";
    case TM_ERRCODE_TEMPLATE_ERROR:
        return "template_error";
    case TM_ERRCODE_ENGINE_ERROR:
        return "engine_error";
    case TM_ERRCODE_NESTING_TOO_DEEP:
        return "nesting_too_deep";
    case TM_ERRCODE_FIELD_TOO_LARGE:
        return "field_too_large";
    case TM_ERRCODE_UNSUPPORTED:
        return "unsupported";
    case TM_ERRCODE_COUNT:
        break;
    }
    return "unknown";
}

void tm_sampling_fini(tm_sampling *sp) {
    for (uint32_t i = 0; i < sp->n_stop; i++)
        tm_free(sp->stop[i]);
    tm_free(sp->stop);
    sp->stop = NULL;
    sp->n_stop = 0;
    tm_free(sp->bias_ids);
    tm_free(sp->bias);
    tm_free(sp->stop_ids);
    sp->bias_ids = sp->stop_ids = NULL;
    sp->bias = NULL;
    sp->n_bias = sp->n_stop_ids = 0;
}

void tm_sampling_resolve(const tm_sampling *defaults, const tm_sampling *rec, tm_sampling *out) {
    const uint32_t set = rec->set;
#define PICK(bit) ((set & (bit)) ? rec : defaults)
    *out = (tm_sampling){.set = set};
    out->max_tokens = PICK(TM_SP_MAX_TOKENS)->max_tokens;
    out->temperature = PICK(TM_SP_TEMPERATURE)->temperature;
    out->top_p = PICK(TM_SP_TOP_P)->top_p;
    out->top_k = PICK(TM_SP_TOP_K)->top_k;
    out->min_p = PICK(TM_SP_MIN_P)->min_p;
    out->seed = PICK(TM_SP_SEED)->seed;
    out->stop = PICK(TM_SP_STOP)->stop;
    out->n_stop = PICK(TM_SP_STOP)->n_stop;
    out->presence_penalty = PICK(TM_SP_PRESENCE_PENALTY)->presence_penalty;
    out->frequency_penalty = PICK(TM_SP_FREQUENCY_PENALTY)->frequency_penalty;
    out->repetition_penalty = PICK(TM_SP_REPETITION_PENALTY)->repetition_penalty;
    out->bias_ids = PICK(TM_SP_LOGIT_BIAS)->bias_ids;
    out->bias = PICK(TM_SP_LOGIT_BIAS)->bias;
    out->n_bias = PICK(TM_SP_LOGIT_BIAS)->n_bias;
    out->min_tokens = PICK(TM_SP_MIN_TOKENS)->min_tokens;
    out->stop_ids = PICK(TM_SP_STOP_TOKEN_IDS)->stop_ids;
    out->n_stop_ids = PICK(TM_SP_STOP_TOKEN_IDS)->n_stop_ids;
    out->ignore_eos = PICK(TM_SP_IGNORE_EOS)->ignore_eos;
#undef PICK
}

void tm_logprobs_destroy(tm_logprobs *lp) {
    if (!lp)
        return;
    tm_free(lp->ids);
    tm_free(lp->lp);
    tm_free(lp->top_ids);
    tm_free(lp->top_lp);
    tm_free(lp->text);
    tm_free(lp->off);
    tm_free(lp);
}

void tm_job_destroy(tm_job *job) {
    if (!job)
        return;
    tm_free(job->file);
    tm_free(job->id_json);
    tm_free(job->prompt);
    for (uint32_t i = 0; i < job->n_messages; i++) {
        tm_free(job->messages[i].role);
        tm_free(job->messages[i].content);
    }
    tm_free(job->messages);
    tm_sampling_fini(&job->sp);
    tm_free(job->err_msg);
    tm_free(job->model);
    tm_free(job->src_meta_json);
    tm_free(job->prompt_ids);
    for (uint32_t i = 0; i < job->n_continuations; i++)
        tm_free(job->continuations[i]);
    tm_free(job->continuations);
    tm_free(job->guided);
    tm_free(job);
}

void tm_completion_destroy(tm_completion *c) {
    if (!c)
        return;
    tm_free(c->file);
    tm_free(c->id_json);
    tm_free(c->text);
    tm_free(c->err_msg);
    tm_free(c->model);
    tm_free(c->src_meta_json);
    tm_free(c->itl_ms);
    tm_logprobs_destroy(c->logprobs);
    tm_logprobs_destroy(c->prompt_logprobs);
    for (uint32_t i = 0; i < c->n_choices; i++) {
        tm_free(c->choices[i].text);
        tm_logprobs_destroy(c->choices[i].logprobs);
    }
    tm_free(c->choices);
    for (uint32_t i = 0; i < c->n_scores; i++)
        tm_logprobs_destroy(c->scores[i].logprobs);
    tm_free(c->scores);
    tm_free(c);
}

void tm_completion_take_job_info(tm_completion *c, tm_job *job) {
    c->format = job->format;
    tm_free(c->model);
    tm_free(c->src_meta_json);
    c->model = job->model;
    c->src_meta_json = job->src_meta_json;
    job->model = NULL;
    job->src_meta_json = NULL;
}
