/* runner/engine/cpu/arch.c - the CPU engine's table of architectures (runner/engine/cpu/arch.h),
 * indexed by tm_arch, and tm_engine_cpu_create, which picks the entry. Constant data; any
 * thread. */
#include "runner/engine/cpu/arch.h"

#include "runner/model/model.h"

static const tm_cpu_arch *const cpu_archs[TM_ARCH_COUNT] = {
    [TM_ARCH_LLAMA] = &tm_cpu_arch_llama,        [TM_ARCH_QWEN2] = &tm_cpu_arch_llama,
    [TM_ARCH_MISTRAL] = &tm_cpu_arch_llama,      [TM_ARCH_DEEPSEEK_V4] = &tm_cpu_arch_dsv4,
    [TM_ARCH_DEEPSEEK_V41] = &tm_cpu_arch_dsv41,
};

tm_rc tm_engine_cpu_create(const tm_model *m, const tm_engine_opts *opts, tm_engine **out,
                           tm_err *err) {
    const tm_cpu_arch *a = (unsigned)m->cfg.arch < TM_ARCH_COUNT ? cpu_archs[m->cfg.arch] : NULL;
    if (!a)
        return TM_ERR(err, TM_E_INVAL, "cpu engine: architecture %s is not supported",
                      tm_model_arch_name(m));
    if ((unsigned)opts->kv_dtype > TM_KV_DTYPE_FP8_HEAD ||
        !(a->kv_dtypes & TM_CPU_KV(opts->kv_dtype)))
        return TM_ERR(err, TM_E_INVAL, "cpu engine: kv_cache_dtype %s not supported for %s",
                      tm_kv_dtype_name(opts->kv_dtype), tm_model_arch_name(m));
    return a->create(m, opts, out, err);
}
