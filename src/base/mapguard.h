/* base/mapguard.h - read-only file mappings that cannot kill the process with SIGBUS (issue 35).
 * A file mapped with mmap raises SIGBUS when a page is read whose bytes the file no longer has
 * (someone truncated it after it was mapped) or cannot read (an I/O error). A guarded range turns
 * that into an error the owner checks: the first guarded range registered installs a SIGBUS
 * handler; a fault inside a guarded range maps zero-filled pages over the range from the faulting
 * page to its end (so the read goes on, reading zeros), and records the first faulting offset;
 * tm_mapguard_fault reports it and the owner stops with an error naming the file. A SIGBUS outside
 * every guarded range gets the default action (the process ends, as before).
 *
 * At most TM_MAPGUARD_MAX ranges at once. Thread-safe: the table is read by the handler with
 * atomic loads; add and remove take a mutex. Deliberately not done: reads that fault are not
 * retried or re-read from the file, and the zeros they read are not taken back; the owner must
 * check tm_mapguard_fault before it trusts what it computed from the range. */
#ifndef TM_BASE_MAPGUARD_H
#define TM_BASE_MAPGUARD_H

#include <stddef.h>

#include "base/err.h"

#define TM_MAPGUARD_MAX 4096

/* Guard [addr, addr + len), a range returned by mmap (addr is page-aligned). *slot receives the
 * range's slot, for tm_mapguard_fault and tm_mapguard_remove. TM_E_INTERNAL: the table is full or
 * the handler cannot be installed. */
tm_rc tm_mapguard_add(const void *addr, size_t len, int *slot, tm_err *err);
/* Stop guarding slot (before munmap of its range). A slot < 0 is a no-op. */
void tm_mapguard_remove(int slot);
/* 1 when a read in slot's range faulted since it was added, *off (when not NULL) then the offset
 * of the first faulting page from the range's start; 0 otherwise. */
int tm_mapguard_fault(int slot, size_t *off);

#endif /* TM_BASE_MAPGUARD_H */
