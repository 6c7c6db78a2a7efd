/* sink/nvml.c - NVML through dlopen. The prototypes below are written from NVML's documented C API
 * (nvml.h is not needed to build): every call returns an int status, 0 meaning success; device
 * handles are opaque pointers. The _v2 entry points are the ones current drivers export. */
#include "sink/nvml.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"

#define MAX_DEV 64

typedef void *nvml_dev; /* nvmlDevice_t */

struct tm_nvml {
    void *lib; /* dlopen handle */
    int (*shutdown)(void);
    int (*get_name)(nvml_dev, char *, unsigned);
    int (*get_power)(nvml_dev, unsigned *);            /* mW */
    int (*get_energy)(nvml_dev, unsigned long long *); /* mJ; may be absent (old drivers) */
    int (*driver_version)(char *, unsigned);
    nvml_dev dev[MAX_DEV];
    uint32_t n_dev;
};

// dlsym's void * to a function pointer goes through memcpy (ISO C has no such conversion).
static int bind(void *lib, const char *name, void *fn_ptr, size_t fn_size) {
    void *sym = dlsym(lib, name);
    if (!sym)
        return -1;
    memcpy(fn_ptr, &sym, fn_size);
    return 0;
}

tm_nvml *tm_nvml_open(void) {
    const char *path = getenv("TM_NVML_LIB");
    if (path && !strcmp(path, "none"))
        return NULL;
    void *lib = dlopen(path && path[0] ? path : "libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return NULL;
    tm_nvml *nv = tm_calloc(1, sizeof(*nv));
    if (!nv) {
        dlclose(lib);
        return NULL;
    }
    nv->lib = lib;
    int (*init)(void) = NULL;
    int (*count)(unsigned *) = NULL;
    int (*by_index)(unsigned, nvml_dev *) = NULL;
    int bad = bind(lib, "nvmlInit_v2", &init, sizeof(init));
    bad |= bind(lib, "nvmlShutdown", &nv->shutdown, sizeof(nv->shutdown));
    bad |= bind(lib, "nvmlDeviceGetCount_v2", &count, sizeof(count));
    bad |= bind(lib, "nvmlDeviceGetHandleByIndex_v2", &by_index, sizeof(by_index));
    bad |= bind(lib, "nvmlDeviceGetName", &nv->get_name, sizeof(nv->get_name));
    bad |= bind(lib, "nvmlDeviceGetPowerUsage", &nv->get_power, sizeof(nv->get_power));
    bad |= bind(lib, "nvmlSystemGetDriverVersion", &nv->driver_version, sizeof(nv->driver_version));
    bind(lib, "nvmlDeviceGetTotalEnergyConsumption", &nv->get_energy, sizeof(nv->get_energy));
    if (bad || init() != 0) {
        nv->shutdown = NULL; // not initialised: nothing to shut down
        tm_nvml_close(nv);
        return NULL;
    }
    unsigned n = 0;
    if (count(&n) != 0)
        n = 0;
    for (unsigned i = 0; i < n && nv->n_dev < MAX_DEV; i++)
        if (by_index(i, &nv->dev[nv->n_dev]) == 0)
            nv->n_dev++;
    if (nv->n_dev == 0) {
        tm_nvml_close(nv);
        return NULL;
    }
    return nv;
}

void tm_nvml_close(tm_nvml *nv) {
    if (!nv)
        return;
    if (nv->shutdown)
        nv->shutdown();
    dlclose(nv->lib);
    tm_free(nv);
}

uint32_t tm_nvml_count(const tm_nvml *nv) { return nv ? nv->n_dev : 0; }

void tm_nvml_driver(const tm_nvml *nv, char *out, size_t n) {
    char buf[96] = "";
    if (nv && nv->driver_version(buf, sizeof(buf)) != 0)
        buf[0] = '\0';
    buf[sizeof(buf) - 1] = '\0';
    snprintf(out, n, "%s", buf);
}

void tm_nvml_name(const tm_nvml *nv, uint32_t i, char *out, size_t n) {
    char buf[128] = "";
    if (nv && i < nv->n_dev && nv->get_name(nv->dev[i], buf, sizeof(buf)) != 0)
        buf[0] = '\0';
    buf[sizeof(buf) - 1] = '\0';
    snprintf(out, n, "%s", buf);
}

int tm_nvml_power_mw(const tm_nvml *nv, uint32_t i, uint32_t *mw) {
    unsigned v = 0;
    if (!nv || i >= nv->n_dev || nv->get_power(nv->dev[i], &v) != 0)
        return -1;
    *mw = v;
    return 0;
}

int tm_nvml_energy_mj(const tm_nvml *nv, uint32_t i, uint64_t *mj) {
    unsigned long long v = 0;
    if (!nv || i >= nv->n_dev || !nv->get_energy || nv->get_energy(nv->dev[i], &v) != 0)
        return -1;
    *mj = v;
    return 0;
}
