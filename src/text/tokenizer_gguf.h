/* The tokenizer a GGUF file carries in its metadata, so that a .gguf alone is
 * enough to chat.
 *
 * Keys read (as llama.cpp's converter writes them for Qwen models):
 *   tokenizer.ggml.model       "gpt2" (byte-level BPE); anything else is refused
 *   tokenizer.ggml.pre         "qwen2" (Qwen2's split regex; NFC first, as tokenizer.json says)
 *   tokenizer.ggml.tokens      [n] token strings by id, byte-level ("Ġthe") for normal tokens,
 *                              plain text for control / user-defined ones
 *   tokenizer.ggml.token_type  [n] 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
 *                              6 byte (optional: all normal when absent)
 *   tokenizer.ggml.merges      [m] "left right", in rank order
 *   tokenizer.ggml.{bos,eos,padding,eot}_token_id, tokenizer.ggml.add_bos_token (optional)
 *   tokenizer.chat_template    the Jinja chat template (optional)
 * Control tokens become added tokens flagged special; user-defined tokens become added
 * tokens not flagged special (both are matched before splitting, as in Hugging Face);
 * unused tokens (llama.cpp's "[PAD<id>]" padding) have no token. */
#ifndef Q3_TEXT_TOKENIZER_GGUF_H
#define Q3_TEXT_TOKENIZER_GGUF_H

#include <stdint.h>

#include "model/gguf.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

/* llama.cpp's token types (tokenizer.ggml.token_type). */
enum {
    Q3_TOKEN_TYPE_NORMAL = 1,
    Q3_TOKEN_TYPE_UNKNOWN = 2,
    Q3_TOKEN_TYPE_CONTROL = 3,
    Q3_TOKEN_TYPE_USER_DEFINED = 4,
    Q3_TOKEN_TYPE_UNUSED = 5,
    Q3_TOKEN_TYPE_BYTE = 6,
};

/* Builds the tokenizer g describes. Fails with Q3_ERR_FORMAT (a key missing or of the
 * wrong type, counts that disagree, a malformed merge, a special id out of range),
 * Q3_ERR_UNSUPPORTED (a tokenizer model or pre-tokenizer q3 does not implement), or
 * whatever q3_tokenizer_from_parts reports; the message names the file and the key. */
q3_status q3_tokenizer_load_gguf(const q3_gguf *g, q3_tokenizer **out);

/* The same, opening path (a .gguf) just for this. */
q3_status q3_tokenizer_load_gguf_file(const char *path, q3_tokenizer **out);

/* The special ids and flags of a GGUF's tokenizer (-1: absent). */
typedef struct q3_gguf_tokenizer_info {
    int32_t bos_id, eos_id, pad_id, eot_id;
    int add_bos;                  /* tokenizer.ggml.add_bos_token (0 when absent) */
    const char *chat_template;    /* tokenizer.chat_template, NUL-terminated, owned by g; NULL if absent */
    q3_chat_template_kind template_kind; /* which known template it is (UNKNOWN if absent) */
} q3_gguf_tokenizer_info;

/* Reads the info; fails (Q3_ERR_FORMAT) only if a present key has the wrong type or an
 * id is not below the number of tokens. */
q3_status q3_gguf_tokenizer_info_read(const q3_gguf *g, q3_gguf_tokenizer_info *out);

#endif
