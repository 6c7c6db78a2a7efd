/* base/err.h - the one error type: functions return a tm_rc, and a tm_err carries the story
 * (code, human-readable message, file:line where it was raised). Plain data; no threading
 * concerns. Foreign status codes (errno, jansson, LZ4, CUDA, ...) are turned into a tm_rc at the
 * wrapper that called the library, with the library's own text copied into msg. */
#ifndef TM_BASE_ERR_H
#define TM_BASE_ERR_H

#include <stddef.h>

typedef enum tm_rc {
    TM_OK = 0,
    TM_E_AGAIN,    /* not now: no free blocks, queue full; caller may retry */
    TM_E_INVAL,    /* bad argument, job file or configuration: fail the job, not the process.
                    * Modules that do not know about records (tokenizer, sampler) also use it
                    * for bad input; the runner turns that into TM_E_RECORD */
    TM_E_NOMEM,    /* host allocation failed */
    TM_E_IO,       /* file or OS call failed */
    TM_E_PARSE,    /* malformed data (JSON, safetensors header, tokenizer file) */
    TM_E_CUDA,     /* CUDA runtime / driver error; the engine is dead */
    TM_E_NCCL,     /* NCCL error */
    TM_E_KAFKA,    /* librdkafka error */
    TM_E_EOF,      /* end of a stream: not an error for the caller that expects it */
    TM_E_INTERNAL, /* a bug of ours that was caught without aborting */
    TM_E_RECORD,   /* this record cannot be served (prompt too long, bad template or text, non-
                    * finite logits): fail the record with an error completion, not the job.
                    * Last, so that the older codes keep their numbers */
} tm_rc;

typedef struct tm_err {
    tm_rc rc;
    const char *file; /* where TM_ERR was called; static storage */
    int line;
    char msg[512]; /* human readable; includes the foreign library's text */
} tm_err;

/* Fill err (never NULL) and return rc. printf-style message. */
tm_rc tm_err_set(tm_err *err, tm_rc rc, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* Prefix err->msg with more context ("loading model X: " + old message); returns err->rc. */
tm_rc tm_err_wrap(tm_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Short stable name of a code ("inval", "io", ...). Never NULL. */
const char *tm_rc_name(tm_rc rc);

#define TM_ERR(err, rc, ...) tm_err_set((err), (rc), __FILE__, __LINE__, __VA_ARGS__)

/* Always-on assertion for programmer errors: prints file:line and aborts. */
void tm_assert_fail(const char *cond, const char *file, int line) __attribute__((noreturn));
#define TM_ASSERT(cond)                                                                            \
    do {                                                                                           \
        if (!(cond))                                                                               \
            tm_assert_fail(#cond, __FILE__, __LINE__);                                             \
    } while (0)

#define TM_CEIL_DIV(a, b) (((a) + (b)-1) / (b))
#define TM_MIN(a, b) ((a) < (b) ? (a) : (b))
#define TM_MAX(a, b) ((a) > (b) ? (a) : (b))

#endif /* TM_BASE_ERR_H */
