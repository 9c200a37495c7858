/* The Qwen3 tokenizer: byte-level BPE as Hugging Face `tokenizers` runs it.
 *
 * encode:  added tokens (<|im_start|>, <think>, ...) are matched first, on the raw
 *          text, leftmost-longest; each stretch between them is NFC-normalised (with
 *          the reference's Unicode 9.0 composition rules), split by the pre-tokenizer
 *          regex (Qwen2's, read from tokenizer.json), and each piece is turned into
 *          ids by byte-level BPE (merges applied by rank).
 * decode:  ids -> the tokens' bytes (added tokens as their text).
 *
 * A q3_tokenizer does not change once built: any number of threads may encode and
 * decode with the same one at once. (Internally it keeps, under a lock, a few idle
 * scratch areas with their piece -> ids caches, for the next encode calls.) */
#ifndef Q3_TEXT_TOKENIZER_H
#define Q3_TEXT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "q3.h"

/* The public part (loading, encode, decode, the detokenizer, lookups) is
 * declared in include/q3.h; what follows is for q3's own code. */

/* ---- construction ----------------------------------------------------- */

/* An added token: matched in the raw text before any splitting. */
typedef struct q3_added_token {
    const char *content; /* its text, UTF-8, NUL-terminated */
    int32_t id;
    int special;         /* a control token (<|im_end|>): q3_tokenizer_is_special says so */
    int lstrip, rstrip;  /* also swallow the whitespace to the left / right of a match */
} q3_added_token;

/* Everything a tokenizer is made of, e.g. from GGUF metadata
 * (tokenizer.ggml.tokens / .merges / .token_type / .pre). */
typedef struct q3_tokenizer_parts {
    const char *const *vocab;  /* [n_vocab] token strings in byte-level form ("Ġthe");
                                  vocab[i] has id i; NULL: no token has id i. An id that
                                  is also in `added` takes the added token's content. */
    size_t n_vocab;
    const char *const *merges; /* [n_merges] "left right" in byte-level form, rank order */
    size_t n_merges;
    const q3_added_token *added; /* [n_added] */
    size_t n_added;
    const char *split_regex;   /* the pre-tokenizer's split pattern; NULL: Qwen2's */
    int nfc;                   /* normalise to NFC before splitting (Qwen: 1) */
} q3_tokenizer_parts;

/* Builds a tokenizer from parts; the parts are copied (the caller keeps them).
 * `name` (may be NULL) prefixes error messages, e.g. the GGUF file's path. */
q3_status q3_tokenizer_from_parts(const q3_tokenizer_parts *parts, const char *name,
                                  q3_tokenizer **out);


/* ---- encode ------------------------------------------------------------ */

/* A growable array of token ids; zero-initialise it, free it with q3_tokens_free. */
typedef struct q3_tokens {
    int32_t *ids;
    size_t n, cap;
} q3_tokens;

void q3_tokens_free(q3_tokens *t);

/* Appends the ids of text[0..len) to out (so a caller can build a prompt piece by
 * piece). Invalid UTF-8 fails with Q3_ERR_INVALID naming the byte offset, and leaves
 * out as it was. */
q3_status q3_tokenizer_encode_append(const q3_tokenizer *tok, const char *text, size_t len,
                                     unsigned flags, q3_tokens *out);

/* A stretch text[start, start + len) of a text. */
typedef struct q3_text_span {
    size_t start, len;
} q3_text_span;

/* Like q3_tokenizer_encode_append with Q3_ENCODE_DEFAULT, except that a special added
 * token is matched only where it lies wholly outside the `plain` spans (sorted by
 * start, not overlapping): inside them "<|im_end|>" is ordinary text. The text is
 * still split in one pass, so with no special-token text inside the spans the ids
 * are those of q3_tokenizer_encode_append. Used for templated chats (the spans are
 * the messages' content). */
q3_status q3_tokenizer_encode_spans(const q3_tokenizer *tok, const char *text, size_t len,
                                    const q3_text_span *plain, size_t n_plain, q3_tokens *out);


/* ---- decode ------------------------------------------------------------ */


/* Streaming detokenizer: feed ids one at a time, get text that is always valid
 * UTF-8. A character whose bytes are split across tokens is held back until it is
 * whole; bytes that can never form a character become U+FFFD (as HF's lossy decode
 * does). Embed it anywhere; init, push..., flush, free. */
typedef struct q3_detok {
    const q3_tokenizer *tok;
    unsigned char held[4]; /* the start of a character still waiting for its last bytes */
    size_t n_held;
    char *buf;             /* output of the last push/flush (owned) */
    size_t cap;
} q3_detok;

void q3_detok_init(q3_detok *d, const q3_tokenizer *tok);
/* text, len: the newly completed text (possibly empty), valid until the next call. */
q3_status q3_detok_push(q3_detok *d, int32_t id, const char **text, size_t *len);
/* Emits what is still held (an unfinished character becomes U+FFFD) and resets. */
q3_status q3_detok_flush(q3_detok *d, const char **text, size_t *len);
void q3_detok_free(q3_detok *d);

/* ---- lookups ----------------------------------------------------------- */


/* The bytes of token `id` (not NUL-terminated), or NULL (and *len = 0) if no token has
 * this id. Valid as long as the tokenizer. */
const char *q3_tokenizer_token_bytes(const q3_tokenizer *tok, int32_t id, size_t *len);

/* 1 if id is an added token (matched before splitting), 0 otherwise. */
int q3_tokenizer_is_added(const q3_tokenizer *tok, int32_t id);

#endif
