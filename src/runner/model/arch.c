/* runner/model/arch.c - the registry of model architectures: TM_ARCH_LIST
 * (runner/model/model_types.h) turned into a table of tm_arch_ops indexed by tm_arch. Constant
 * data; any thread. */
#include "runner/model/arch.h"

#include <stdio.h>
#include <string.h>

static const tm_arch_ops *const archs[TM_ARCH_COUNT] = {
#define TM_ARCH_ENTRY(e, name, ops) [TM_ARCH_##e] = &ops,
    TM_ARCH_LIST(TM_ARCH_ENTRY)
#undef TM_ARCH_ENTRY
};

const tm_arch_ops *tm_arch_ops_get(tm_arch arch) {
    return (unsigned)arch < TM_ARCH_COUNT ? archs[arch] : NULL;
}

int tm_arch_find(const char *s, int by_class) {
    for (int i = 0; i < TM_ARCH_COUNT; i++)
        if (!strcmp(s, by_class ? archs[i]->hf_class : archs[i]->name))
            return i;
    return -1;
}

void tm_arch_list_names(char *buf, size_t cap, int by_class) {
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < TM_ARCH_COUNT && at < cap; i++) {
        int n = snprintf(buf + at, cap - at, "%s%s", i ? ", " : "",
                         by_class ? archs[i]->hf_class : archs[i]->name);
        if (n < 0)
            break;
        at += (size_t)n;
    }
}
