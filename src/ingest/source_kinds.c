/* ingest/source_kinds.c - the kinds of source tm_source_open asks, in order: the first whose
 * claims() takes the job's input reads it. Files and standard input claim whatever is left, so
 * they come last. A new kind of source is one line here (source_int.h, ARCHITECTURE.md). */
#include "ingest/source_int.h"

const tm_source_ops *const tm_source_kinds[] = {&tm_kafka_in_ops, &tm_file_in_ops, NULL};
