/* sink/nvml.h - the sink's wrapper of NVIDIA's management library (NVML), for the GPU names and
 * power draw in metrics.json. libnvidia-ml.so.1 is opened with dlopen at run time, so tokenmill has
 * no build or link dependency on it: on a machine without the NVIDIA driver tm_nvml_open returns
 * NULL and metrics say "gpus": null. Only the few calls metrics need are bound (names, instant
 * power, cumulative energy, driver version). One thread at a time per handle. Does not pick or
 * configure devices. */
#ifndef TM_SINK_NVML_H
#define TM_SINK_NVML_H

#include <stddef.h>
#include <stdint.h>

typedef struct tm_nvml tm_nvml; /* opaque */

/* Load and initialise NVML: the library named by the environment variable TM_NVML_LIB when set
 * ("none" disables NVML), else libnvidia-ml.so.1. Returns a new handle (close it with
 * tm_nvml_close), or NULL when the library is missing, a needed symbol is missing, NVML fails to
 * initialise, reports no device, or memory runs out. Never an error: no GPU is a normal case. */
tm_nvml *tm_nvml_open(void);
void tm_nvml_close(tm_nvml *nv); /* shuts NVML down and unloads it; NULL is a no-op */

uint32_t tm_nvml_count(const tm_nvml *nv);
/* Driver version ("580.95.05") into out; "" when NVML does not say. */
void tm_nvml_driver(const tm_nvml *nv, char *out, size_t n);
/* Name of device i ("NVIDIA H200") into out; "" when NVML does not say. */
void tm_nvml_name(const tm_nvml *nv, uint32_t i, char *out, size_t n);
/* Current board power draw of device i in milliwatts. Returns 0 on success, -1 if unsupported. */
int tm_nvml_power_mw(const tm_nvml *nv, uint32_t i, uint32_t *mw);
/* Energy device i used since the driver loaded, in millijoules (Volta and later). Returns 0 on
 * success, -1 if unsupported. */
int tm_nvml_energy_mj(const tm_nvml *nv, uint32_t i, uint64_t *mj);

#endif /* TM_SINK_NVML_H */
