/* tools/mkmodel.h - what the two files of the mkmodel tool share: tools/mkmodel.c (the Llama
 * family and DeepSeek-V4, and main) and tools/mkmodel_dsv41.c (--arch deepseek_v41). */
#ifndef TM_TOOLS_MKMODEL_H
#define TM_TOOLS_MKMODEL_H

/* `mkmodel --arch deepseek_v41 ...` (argv as main got it): 0 on success, 2 on a usage error, 1 on
 * a failure (the message on stderr). */
int mkmodel_dsv41_main(int argc, char **argv);

/* *out = the decimal integer s when all of s is one and it lies in [lo, hi]: 1; else 0 (*out
 * untouched). */
int mkmodel_parse_long(const char *s, long lo, long hi, long *out);

#endif /* TM_TOOLS_MKMODEL_H */
