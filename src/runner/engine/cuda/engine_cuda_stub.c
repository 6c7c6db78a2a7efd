/* runner/engine/cuda/engine_cuda_stub.c - runner/engine/cuda/engine_cuda.h for builds without CUDA
 * (-DTM_CUDA=OFF): every entry point fails with TM_E_INVAL, so callers need no #ifdef. */
#include "runner/engine/cuda/engine_cuda.h"

tm_rc tm_engine_cuda_create(const tm_model *m, const tm_engine_opts *opts, tm_engine **out,
                            tm_err *err) {
    (void)m, (void)opts, (void)out;
    return TM_ERR(err, TM_E_INVAL, "cuda engine: built without CUDA (configure with -DTM_CUDA=ON)");
}

tm_rc tm_engine_cuda_create_random(const tm_model *m, const tm_engine_opts *opts, uint64_t seed,
                                   tm_engine **out, tm_err *err) {
    (void)seed;
    return tm_engine_cuda_create(m, opts, out, err);
}

tm_rc tm_engine_cuda_create_random_fmt(const tm_model *m, const tm_engine_opts *opts, uint64_t seed,
                                       tm_cuda_wfmt fmt, tm_engine **out, tm_err *err) {
    (void)seed, (void)fmt;
    return tm_engine_cuda_create(m, opts, out, err);
}

tm_rc tm_engine_cuda_forward_greedy(tm_engine *eng, const tm_batch *b, uint32_t *ids, tm_err *err) {
    (void)eng, (void)b, (void)ids;
    return TM_ERR(err, TM_E_INVAL, "cuda engine: built without CUDA (configure with -DTM_CUDA=ON)");
}

void tm_engine_cuda_set_graphs(tm_engine *eng, int on) { (void)eng, (void)on; }

tm_rc tm_engine_cuda_tp_create(const tm_model *m, const tm_engine_opts *opts,
                               const tm_engine_cuda_tp *tp, tm_engine **out, tm_err *err) {
    (void)tp;
    return tm_engine_cuda_create(m, opts, out, err);
}

tm_rc tm_engine_cuda_tp_serve(tm_engine *eng, tm_err *err) {
    (void)eng;
    return TM_ERR(err, TM_E_INVAL, "cuda engine: built without CUDA (configure with -DTM_CUDA=ON)");
}

int tm_engine_cuda_n_devices(void) { return 0; }

bool tm_engine_cuda_built(void) { return false; }
