/* Reading GGUF files (versions 2 and 3, as llama.cpp writes them).
 *
 * Layout of a file, all integers little-endian:
 *   "GGUF"  u32 version  u64 n_tensors  u64 n_kv
 *   n_kv x      { string key, u32 value_type, value }
 *   n_tensors x { string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset }
 *   padding to general.alignment (default 32), then the data section; each
 *   tensor's offset is relative to the start of the data section.
 *   string = u64 length + bytes (no NUL); array = u32 element type + u64 count + elements.
 *
 * The file is mapped read-only and every count, length, dimension and offset is
 * checked against the bytes that remain before anything is allocated, so a
 * truncated or hostile file yields Q3_ERR_FORMAT with a message naming the file
 * and the place, never a crash or a huge allocation. */
#ifndef Q3_MODEL_GGUF_H
#define Q3_MODEL_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/tensor.h"
#include "util/status.h"

/* ---- value types ------------------------------------------------------- */

/* The on-disk value type codes of metadata values. */
typedef enum q3_gguf_type {
    Q3_GGUF_U8 = 0,
    Q3_GGUF_I8 = 1,
    Q3_GGUF_U16 = 2,
    Q3_GGUF_I16 = 3,
    Q3_GGUF_U32 = 4,
    Q3_GGUF_I32 = 5,
    Q3_GGUF_F32 = 6,
    Q3_GGUF_BOOL = 7,
    Q3_GGUF_STRING = 8,
    Q3_GGUF_ARRAY = 9,
    Q3_GGUF_U64 = 10,
    Q3_GGUF_I64 = 11,
    Q3_GGUF_F64 = 12,
    Q3_GGUF_TYPE_COUNT
} q3_gguf_type;

/* "u8", "i32", "f32", "string", "array", ...; "?" for codes out of range. */
const char *q3_gguf_type_name(q3_gguf_type t);

/* Default data alignment when general.alignment is absent. */
#define Q3_GGUF_DEFAULT_ALIGNMENT 32u
/* Deepest nesting of arrays accepted (an array of arrays of strings is depth 2). */
#define Q3_GGUF_MAX_ARRAY_DEPTH 8
/* Longest metadata key accepted, in bytes. */
#define Q3_GGUF_MAX_KEY_LEN 65535u
/* Most metadata pairs and tensors a header may declare (Qwen3 files have tens
 * of pairs and 3 + 11 x layers tensors), checked before anything is allocated. */
#define Q3_GGUF_MAX_KV (1u << 20)
#define Q3_GGUF_MAX_TENSORS (1u << 20)
/* Most bytes the copies of metadata strings and string/array item lists may
 * take (Qwen3's 151k tokens and merges take ~20 MB): a string as long as a
 * (sparse) file is a message, not an allocation. */
#define Q3_GGUF_MAX_METADATA_BYTES ((size_t)1 << 30)

/* ggml tensor type codes that q3 maps to its dtypes (others are named in messages). */
enum {
    Q3_GGML_F32 = 0,
    Q3_GGML_F16 = 1,
    Q3_GGML_Q4_0 = 2,
    Q3_GGML_Q8_0 = 8,
    Q3_GGML_Q4_K = 12,
    Q3_GGML_Q5_K = 13,
    Q3_GGML_Q6_K = 14,
    Q3_GGML_BF16 = 30,
};
/* "F32", "Q4_K", ... for a ggml type code; NULL if the code is unknown. */
const char *q3_ggml_type_name(uint32_t ggml_type);
/* The ggml type code q3 writes for a dtype. */
uint32_t q3_ggml_type_from_dtype(q3_dtype t);

/* ---- values -------------------------------------------------------------- */

/* One metadata value. Scalars are widened: unsigned integers and bools in u,
 * signed integers in i, floats in f (type says which was stored). Strings are
 * NUL-terminated copies owned by the q3_gguf (len excludes the NUL; a string
 * may itself contain NUL bytes). Arrays of numbers or bools keep their packed
 * little-endian elements in the mapping (raw, possibly unaligned: read them
 * with the q3_gguf_arr_* helpers); arrays of strings or arrays have items. */
typedef struct q3_gguf_value {
    q3_gguf_type type;
    union {
        uint64_t u;
        int64_t i;
        double f;
        struct {
            const char *s;
            size_t len;
        } str;
        struct {
            q3_gguf_type type;                  /* element type */
            size_t count;                       /* number of elements */
            const void *raw;                    /* [count] packed elements (numbers/bools) */
            const struct q3_gguf_value *items;  /* [count] (strings/arrays), else NULL */
        } arr;
    } as;
} q3_gguf_value;

/* Element i of an array of integers (any width, signed or unsigned) or bools,
 * or of floats (truncated). Precondition: i < count and the element type is a
 * number or bool (asserted). A u64 above INT64_MAX wraps; use _u64 for those. */
int64_t q3_gguf_arr_i64(const q3_gguf_value *arr, size_t i);
uint64_t q3_gguf_arr_u64(const q3_gguf_value *arr, size_t i);
/* Element i of an array of numbers as a double (same precondition). */
double q3_gguf_arr_f64(const q3_gguf_value *arr, size_t i);
/* Element i of an array of strings: the NUL-terminated string (len may be
 * NULL); NULL if arr is not an array of strings or i is out of range. */
const char *q3_gguf_arr_str(const q3_gguf_value *arr, size_t i, size_t *len);
/* Element i of an array of arrays; NULL if not such an array or i out of range. */
const q3_gguf_value *q3_gguf_arr_arr(const q3_gguf_value *arr, size_t i);

/* ---- the file ------------------------------------------------------------ */

typedef struct q3_gguf q3_gguf;

/* Maps and validates path. On success *out owns the mapping; every pointer it
 * hands out (strings, values, tensors and their data) lives until
 * q3_gguf_close. On failure *out is NULL and q3_last_error() names the file
 * and what is wrong: Q3_ERR_IO (cannot open/map), Q3_ERR_FORMAT (malformed),
 * Q3_ERR_UNSUPPORTED (a version other than 2/3, or a tensor of a ggml type q3
 * cannot run: F32, F16, BF16, Q8_0 and Q4_0 are accepted), Q3_ERR_NOMEM. */
q3_status q3_gguf_open(const char *path, q3_gguf **out);
void q3_gguf_close(q3_gguf *g);

const char *q3_gguf_path(const q3_gguf *g);
uint32_t q3_gguf_version(const q3_gguf *g);
size_t q3_gguf_alignment(const q3_gguf *g);
/* Byte offset of the data section in the file. */
size_t q3_gguf_data_offset(const q3_gguf *g);

/* ---- metadata: iteration and lookup -------------------------------------- */

size_t q3_gguf_kv_count(const q3_gguf *g);
/* Key and value of the i-th pair in file order (i < kv_count). */
const char *q3_gguf_kv_key(const q3_gguf *g, size_t i);
const q3_gguf_value *q3_gguf_kv_value(const q3_gguf *g, size_t i);
/* The value stored under key, or NULL if there is none. */
const q3_gguf_value *q3_gguf_find(const q3_gguf *g, const char *key);

/* Typed getters. Each returns Q3_OK and stores the value, or fails (leaving
 * *out untouched) with a message naming the file and key:
 * Q3_ERR_FORMAT if the key is missing, has the wrong type, or its value does
 * not fit. Integer getters accept any integer type whose value fits; the
 * float getter accepts f32 and f64 (an f64 beyond a float's range fails). */
q3_status q3_gguf_get_str(const q3_gguf *g, const char *key, const char **out);
q3_status q3_gguf_get_u32(const q3_gguf *g, const char *key, uint32_t *out);
q3_status q3_gguf_get_i32(const q3_gguf *g, const char *key, int32_t *out);
q3_status q3_gguf_get_u64(const q3_gguf *g, const char *key, uint64_t *out);
q3_status q3_gguf_get_f32(const q3_gguf *g, const char *key, float *out);
q3_status q3_gguf_get_bool(const q3_gguf *g, const char *key, bool *out);
/* An array under key. elem_type: the element type required, or -1 for any.
 * *out points at the array value (type Q3_GGUF_ARRAY). */
q3_status q3_gguf_get_arr(const q3_gguf *g, const char *key, int elem_type,
                          const q3_gguf_value **out);

/* ---- tensors --------------------------------------------------------------- */

size_t q3_gguf_tensor_count(const q3_gguf *g);
/* The i-th tensor in file order (i < tensor_count): shape converted to q3's
 * row-major order (GGUF's ne[0], the innermost, becomes shape[ndim-1]); data
 * points into the mapping, aligned to the file's alignment. */
const q3_tensor *q3_gguf_tensor_at(const q3_gguf *g, size_t i);
/* The tensor named name, or NULL. */
const q3_tensor *q3_gguf_find_tensor(const q3_gguf *g, const char *name);

#endif
