/* q3_status for the library's internals: what every module returns, without
 * the public API around it (a module that includes only this sees no q3_*
 * function it could call up into). include/q3.h is installed alone, so it
 * defines the same enum under the same guard; whichever comes first wins, and
 * tests/test_status.c checks that the two agree value for value. */
#ifndef Q3_STATUS_DEFINED
#define Q3_STATUS_DEFINED

typedef enum q3_status {
    Q3_OK = 0,
    Q3_ERR_IO,          /* a file is missing, unreadable, or cannot be mapped */
    Q3_ERR_FORMAT,      /* a file's contents are malformed (header, JSON, offsets) */
    Q3_ERR_INVALID,     /* an argument or config value is out of range */
    Q3_ERR_UNSUPPORTED, /* well-formed, but not something q3 runs (arch, dtype) */
    Q3_ERR_NOMEM,       /* an allocation failed */
    Q3_ERR_CONTEXT,     /* the session's context length would be exceeded */
    Q3_ERR_KV_FULL,     /* the context's KV pool has no free block (others' sequences hold them) */
} q3_status;

#endif
