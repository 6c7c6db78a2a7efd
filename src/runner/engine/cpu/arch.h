/* runner/engine/cpu/arch.h - the per-architecture table of the CPU engine, the same shape as the
 * CUDA engine's (runner/engine/cuda/arch.h). tm_engine_cpu_create (cpu/arch.c) checks what every
 * architecture shares (the KV dtype against the entry's list) and calls the entry's create, which
 * makes the whole engine behind the tm_engine vtable: the Llama family in engine_cpu.c, DeepSeek-V4
 * in dsv4.c. A new architecture is one file with its tm_cpu_arch and one line in the table of
 * cpu/arch.c. Constant data; any thread. */
#ifndef TM_RUNNER_ENGINE_CPU_ARCH_H
#define TM_RUNNER_ENGINE_CPU_ARCH_H

#include <stdint.h>

#include "base/err.h"
#include "runner/engine/engine.h"

/* Bit of a tm_kv_dtype in tm_cpu_arch.kv_dtypes. */
#define TM_CPU_KV(d) (1u << (d))

typedef struct tm_cpu_arch {
    const char *name;   /* "llama" */
    uint32_t kv_dtypes; /* the KV cache dtypes it stores: TM_CPU_KV bits */
    /* The engine for m (borrowed; must outlive it) with opts (kv_dtype one of kv_dtypes): the
     * contract of tm_engine_cpu_create (engine.h). On success *out owns the engine. */
    tm_rc (*create)(const tm_model *m, const tm_engine_opts *opts, tm_engine **out, tm_err *err);
} tm_cpu_arch;

/* The Llama family: Llama, Qwen2 (q/k/v bias), Mistral (sliding window); engine_cpu.c. */
extern const tm_cpu_arch tm_cpu_arch_llama;
/* DeepSeek-V4 (MTP and hidden states for speculation); dsv4.c. */
extern const tm_cpu_arch tm_cpu_arch_dsv4;
/* DeepSeek-V4.1 (Engram, CSA2, the reference's activation quantization); dsv41.c. */
extern const tm_cpu_arch tm_cpu_arch_dsv41;

#endif /* TM_RUNNER_ENGINE_CPU_ARCH_H */
