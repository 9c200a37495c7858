/* Internals of the tokenizer, shared by its files (not for use outside src/text/tokenizer*.c,
 * bpe.c, pretokenize.c, normalize.c):
 *
 *   tokenizer.c       building (from parts), encode/decode, streaming detokenizer, lookups
 *   tokenizer_json.c  reading tokenizer.json
 *   bpe.c             vocabulary and merge hash maps, byte-level BPE with a piece cache
 *   pretokenize.c     the split regex: PCRE2, or a hand-written matcher for Qwen2's pattern
 *   normalize.c       NFC that leaves text alone unless something in it can change */
#ifndef Q3_TEXT_TOKENIZER_IMPL_H
#define Q3_TEXT_TOKENIZER_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "text/tokenizer.h"

/* The Qwen2 pre-tokenizer pattern, exactly as tokenizer.json spells it. */
#define TK_QWEN2_PATTERN                                                                   \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|" \
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* GPT-2's pattern: what a ByteLevel pre-tokenizer with use_regex=true applies. */
#define TK_GPT2_PATTERN                                                                    \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

/* Ids are stored in arrays indexed by id, and packed in 20 bits in the merge map;
 * larger ones are refused. Ranks take 24 bits. */
#define TK_ID_BITS 20
#define TK_RANK_BITS 24
#define TK_MAX_ID ((1 << TK_ID_BITS) - 1)
#define TK_MAX_MERGES ((1 << TK_RANK_BITS) - 1)

/* ---- growable byte buffer ---------------------------------------------- */

typedef struct tk_buf {
    char *data;
    size_t len, cap;
} tk_buf;

int tk_buf_reserve(tk_buf *b, size_t extra); /* 0 on success, -1 out of memory */
int tk_buf_append(tk_buf *b, const void *p, size_t n);
void tk_buf_free(tk_buf *b);

/* ---- hashing and maps ---------------------------------------------------- */

uint64_t tk_hash_bytes(const void *p, size_t n);

/* bytes -> id for the BPE vocabulary. The first 8 bytes of the key sit in the slot, so
 * most lookups (tokens are short) touch one cache line and never the arena. */
typedef struct tk_vocab_slot {
    uint32_t hash; /* low 32 bits of tk_hash_bytes */
    int32_t id;    /* -1: empty */
    uint32_t len;  /* key length */
    uint32_t off;  /* key bytes in the token arena */
    uint64_t head; /* key bytes 0..7, zero-padded */
} tk_vocab_slot;

/* ---- the splitter --------------------------------------------------------- */

typedef enum tk_split_kind {
    TK_SPLIT_NONE,  /* no pre-tokenizer regex: the whole text is one piece */
    TK_SPLIT_QWEN2, /* hand-written matcher for TK_QWEN2_PATTERN */
    TK_SPLIT_PCRE2, /* any other pattern, compiled by PCRE2 */
} tk_split_kind;

typedef struct tk_splitter {
    tk_split_kind kind;
    pcre2_code *re;  /* TK_SPLIT_PCRE2 (also kept for TK_SPLIT_QWEN2, for tests) */
    int jit;         /* re was JIT-compiled */
} tk_splitter;

/* Compiles `pattern` (a Rust-regex pattern as tokenizer.json holds it). `\s` and `\S`
 * are rewritten into Unicode White_Space classes (PCRE2's \s differs). `use_fast`
 * selects the hand-written matcher when the pattern is Qwen2's. */
q3_status tk_splitter_init(tk_splitter *sp, const char *pattern, int use_fast, const char *name);
void tk_splitter_free(tk_splitter *sp);

/* Iterates the pieces of valid UTF-8 s[0..n): every byte belongs to exactly one piece
 * (matches and the gaps between them, as HF's Split with behavior Isolated). */
typedef struct tk_split_iter {
    const tk_splitter *sp;
    const unsigned char *s;
    size_t n, pos;
    pcre2_match_data *md;   /* owned by the caller's scratch */
    pcre2_match_context *mc; /* the caller's scratch's (the limits are set per call); NULL: none */
    size_t next_s, next_e;  /* a match found while emitting the gap before it */
    int have_next;
} tk_split_iter;

/* PCRE2's work on a pattern that backtracks is bounded per byte of text: a match call
 * may take TK_MATCH_BASE steps (PCRE2's match-limit units) plus TK_MATCH_PER_BYTE for
 * each byte it moves the split on; a call that needs more fails the encode with a
 * message (so `(?:a|a){0,21}c|.`, 2^21 steps a byte, fails at once instead of taking
 * 11 ms a character). Qwen2's, GPT-2's and Llama 3's patterns take about one step per
 * byte. TK_MATCH_DEPTH bounds the interpreter's backtracking memory. */
#define TK_MATCH_BASE 4096u
#define TK_MATCH_PER_BYTE 64u
#define TK_MATCH_DEPTH 1000000u

/* 1: a piece [*start, *end); 0: done; -1: PCRE2 failed, or the pattern backtracked
 * beyond the limits above (message set). */
int tk_split_next(tk_split_iter *it, size_t *start, size_t *end);

/* The matcher for Qwen2's pattern alone: the end of the piece that starts at pos < n. */
size_t tk_qwen2_piece_end(const unsigned char *s, size_t n, size_t pos);

/* ---- NFC -------------------------------------------------------------------------- */

/* NFC of valid UTF-8 s[0..n). If nothing in s can change, *res = s (no copy); otherwise
 * the result is built in out and *res points into it. */
q3_status tk_nfc(const char *s, size_t n, tk_buf *out, const char **res, size_t *res_len);

/* 1 for the code points where tk_nfc follows the reference's Unicode 9.0 tables rather
 * than utf8proc_NFC (marks and composition parts assigned later: see normalize.c). An
 * oracle built on utf8proc must treat text with them as an expected difference. */
int tk_nfc_newer_than_unicode9(uint32_t cp);

/* ---- the tokenizer ---------------------------------------------------------------- */

/* How many idle scratches a tokenizer keeps (about one per encoding thread). */
#define TK_POOL 8

enum { TK_KIND_NONE = 0, TK_KIND_BPE = 1, TK_KIND_ADDED = 2, TK_KIND_SPECIAL = 3 };

typedef struct tk_added {
    uint32_t off, len; /* content in the token arena */
    int32_t id;
    uint8_t special, lstrip, rstrip;
} tk_added;

struct q3_tokenizer {
    char *name; /* file path or the caller's name, for messages */

    /* Tokens by id: bytes in one arena. */
    int32_t n_ids;      /* largest id + 1 */
    uint32_t *tok_off;  /* [n_ids] offset into bytes */
    uint32_t *tok_len;  /* [n_ids] length in bytes */
    uint8_t *tok_kind;  /* [n_ids] TK_KIND_* */
    tk_buf bytes;       /* the arena */

    /* BPE vocabulary: bytes -> id (open addressing, power-of-two size). */
    tk_vocab_slot *vocab_slots;
    uint32_t vocab_mask;
    size_t n_bpe;
    int32_t byte_id[256]; /* the token of each single byte */

    /* Merges: (left, right) -> rank (see bpe.c for the slot layout); rank -> merged id. */
    uint64_t *merge_slots;
    uint32_t merge_mask;
    size_t n_merges;
    int32_t *merge_result;     /* [n_merges] the token each merge makes */
    size_t merge_result_cap;
    int32_t *byte_pair_rank;   /* [256 * 256] rank of merging two single-byte tokens, or INT32_MAX */
    int ignore_merges; /* a piece that is a whole vocabulary token is taken as is */
    int32_t merge_guess; /* while loading: the likely id of the next merge's result */

    /* Added tokens, longest first (so the first that matches is the longest). */
    tk_added *added;
    size_t n_added;
    uint8_t added_first[256]; /* 1 if some added token starts with this byte */
    int added_one_first;      /* the first byte of every added token, if they share it; else -1 */

    int nfc;
    tk_splitter split;

    /* Scratch (and piece caches) of finished encode calls, for the next ones. Encode
     * takes a const tokenizer: this pool is its only mutable part, under the lock. */
    pthread_mutex_t pool_lock;
    struct tk_scratch *pool[TK_POOL];
    int n_pool;
};

/* ---- building (tokenizer.c); the JSON reader and from_parts both use these ------- */

/* A string that is not NUL-terminated. */
typedef struct tk_str {
    const char *p;
    size_t n;
} tk_str;

/* A merge decoded from its byte-level strings: its left part's bytes then its right
 * part's, at `off` in some buffer, with their hashes (tk_hash_bytes). */
typedef struct tk_merge_rec {
    size_t off;
    uint32_t a_len, b_len;
    uint64_t ha, hb;
} tk_merge_rec;

/* The most entries one tk_add_*_batch call takes. */
#define TK_BATCH 64

/* A new, empty tokenizer with room for about n_vocab BPE tokens and n_merges merges. */
q3_status tk_new(const char *name, size_t n_vocab, size_t n_merges, q3_tokenizer **out);

/* Adds BPE tokens ids[k] given in byte-level form bl[k] (e.g. "Ġthe"), n <= TK_BATCH. */
q3_status tk_add_vocab_batch(q3_tokenizer *t, const tk_str *bl, const int32_t *ids, size_t n);

/* Adds the merges a[k] + b[k] (byte-level strings) in order, n <= TK_BATCH; a merge's
 * rank is the number of merges added before it. */
q3_status tk_add_merge_batch(q3_tokenizer *t, const tk_str *a, const tk_str *b, size_t n);

/* Decodes the merge a + b (byte-level strings) into bytes (appended) and rec. Needs no
 * tokenizer (so it can run on another thread). Returns 0; 1 or 2 if the left or right
 * part has a character outside the alphabet; -1 out of memory. */
int tk_decode_merge(const char *a, size_t a_len, const char *b, size_t b_len, tk_buf *bytes, tk_merge_rec *rec);

/* Adds decoded merges (recs[k].off relative to base) in order, looking their parts up. */
q3_status tk_add_decoded_merges(q3_tokenizer *t, const char *base, const tk_merge_rec *recs, size_t n);

/* Byte-level string -> raw bytes appended to out: 0; 1 (a character outside the
 * alphabet at *bad_at); -1 out of memory. tk_byte_level_init() must have run once
 * (tk_new runs it). */
void tk_byte_level_init(void);
int tk_byte_level_decode(const char *bl, size_t n, tk_buf *out, size_t *bad_at);

q3_status tk_add_added(q3_tokenizer *t, const char *content, size_t len, int32_t id, int special,
                       int lstrip, int rstrip);

/* Checks the whole (every byte has a token, ...), sorts the added tokens, sets up the
 * splitter. pattern: NULL for no split regex. */
q3_status tk_finish(q3_tokenizer *t, const char *pattern, int nfc);

/* Maps (bpe.c). */
int32_t tk_vocab_find(const q3_tokenizer *t, const void *bytes, size_t n);
/* The same with the key's tk_hash_bytes already computed; and a prefetch of its slot. */
int32_t tk_vocab_find_h(const q3_tokenizer *t, const void *bytes, size_t n, uint64_t h);
void tk_vocab_prefetch(const q3_tokenizer *t, uint64_t h);
void tk_merge_prefetch(const q3_tokenizer *t, int32_t left, int32_t right);
/* Maps token id's bytes (already in the arena) to id, unless a token with the same
 * bytes is there already: then returns that token's id and changes nothing. */
q3_status tk_vocab_insert_h(q3_tokenizer *t, int32_t id, uint64_t h, int32_t *existing);
q3_status tk_merge_insert(q3_tokenizer *t, int32_t left, int32_t right, int32_t merged);
int tk_maps_alloc(q3_tokenizer *t, size_t n_vocab, size_t n_merges); /* 0 ok, -1 nomem */
/* Fills byte_pair_rank (needs byte_id). */
q3_status tk_build_byte_pairs(q3_tokenizer *t);

/* ---- encoding scratch (bpe.c): used by one encode call at a time, pooled by the
 * tokenizer between calls (see scratch_acquire in tokenizer.c) --------------------- */

typedef struct tk_cache_slot {
    uint64_t head;    /* key bytes 0..7, zero-padded */
    uint32_t hash;
    uint32_t key_len; /* 0: empty slot */
    uint32_t key_off; /* key bytes 8.. in cache_keys (when key_len > 8) */
    uint32_t n_ids;
    uint32_t ids;     /* n_ids == 1: the id itself; else the offset of the ids in cache_ids */
    uint32_t unused;
} tk_cache_slot;

typedef struct tk_scratch {
    tk_buf nfc;
    pcre2_match_data *md;
    pcre2_match_context *mc; /* the per-call match limits (see tk_split_iter) */
    /* BPE working arrays, [cap] each */
    size_t cap;
    int32_t *sym, *prev, *next, *rank;
    uint64_t *heap; /* rank << 32 | position */
    /* piece -> ids cache */
    tk_cache_slot *cache;
    uint32_t cache_mask, cache_used;
    tk_buf cache_keys;
    int32_t *cache_ids;
    size_t cache_ids_len, cache_ids_cap;
} tk_scratch;

void tk_scratch_free(tk_scratch *sc);

/* Frees what a scratch grew for an unusually long piece or text (kept: the cache,
 * which is bounded, and arrays up to TK_SCRATCH_KEEP entries / bytes). */
#define TK_SCRATCH_KEEP (1u << 16)
void tk_scratch_trim(tk_scratch *sc);

/* Appends the BPE ids of one piece (raw bytes, n >= 1) to out. */
q3_status tk_bpe_piece(const q3_tokenizer *t, tk_scratch *sc, const unsigned char *piece,
                       size_t n, q3_tokens *out);

/* BPE without the cache; `use_heap` picks the priority-queue variant (else the linear
 * scan used for short pieces). For tests: both must agree with each other. */
q3_status tk_bpe_uncached(const q3_tokenizer *t, tk_scratch *sc, const unsigned char *piece,
                          size_t n, int use_heap, q3_tokens *out);

int tk_tokens_reserve(q3_tokens *out, size_t extra); /* 0 ok, -1 nomem */

#endif
