/* Building the tokenizer from a GGUF file's tokenizer.* metadata. */
#include "text/tokenizer_gguf.h"

#include <stdlib.h>
#include <string.h>

#include "text/tokenizer_impl.h"
#include "util/error.h"

/* An integer element type (token_type is i32 as llama.cpp writes it; accept any). */
static int is_int_type(q3_gguf_type t)
{
    return t == Q3_GGUF_U8 || t == Q3_GGUF_I8 || t == Q3_GGUF_U16 || t == Q3_GGUF_I16 || t == Q3_GGUF_U32 ||
           t == Q3_GGUF_I32 || t == Q3_GGUF_U64 || t == Q3_GGUF_I64;
}

q3_status q3_tokenizer_load_gguf(const q3_gguf *g, q3_tokenizer **out)
{
    *out = NULL;
    const char *path = q3_gguf_path(g);
    const char *model, *pre;
    q3_status st = q3_gguf_get_str(g, "tokenizer.ggml.model", &model);
    if (st) return q3_fail_wrap(st, "the GGUF has no tokenizer");
    if (!strcmp(model, "none") || !strcmp(model, "no_vocab"))
        return q3_fail(Q3_ERR_UNSUPPORTED, "%s: the GGUF carries no tokenizer (tokenizer.ggml.model is \"%s\")", path,
                       model);
    if (strcmp(model, "gpt2"))
        return q3_fail(Q3_ERR_UNSUPPORTED, "%s: tokenizer.ggml.model is \"%s\"; q3 reads \"gpt2\" (byte-level BPE) only",
                       path, model);
    if ((st = q3_gguf_get_str(g, "tokenizer.ggml.pre", &pre))) return st;
    if (strcmp(pre, "qwen2"))
        return q3_fail(Q3_ERR_UNSUPPORTED, "%s: tokenizer.ggml.pre is \"%s\"; q3 knows Qwen's \"qwen2\" only", path,
                       pre);

    const q3_gguf_value *tokens, *types = NULL, *merges;
    if ((st = q3_gguf_get_arr(g, "tokenizer.ggml.tokens", Q3_GGUF_STRING, &tokens)) ||
        (st = q3_gguf_get_arr(g, "tokenizer.ggml.merges", Q3_GGUF_STRING, &merges)))
        return st;
    size_t n = tokens->as.arr.count, n_merges = merges->as.arr.count;
    if (n == 0) return q3_fail(Q3_ERR_FORMAT, "%s: tokenizer.ggml.tokens is empty", path);
    /* The counts are bounded by the file only: check them before the arrays below. */
    if (n > TK_MAX_ID)
        return q3_fail(Q3_ERR_FORMAT, "%s: tokenizer.ggml.tokens has %zu entries, more than the %d q3 reads", path, n,
                       TK_MAX_ID);
    if (n_merges > TK_MAX_MERGES)
        return q3_fail(Q3_ERR_FORMAT, "%s: tokenizer.ggml.merges has %zu entries, more than the %d q3 reads", path,
                       n_merges, TK_MAX_MERGES);
    if (q3_gguf_find(g, "tokenizer.ggml.token_type")) {
        if ((st = q3_gguf_get_arr(g, "tokenizer.ggml.token_type", -1, &types))) return st;
        if (!is_int_type(types->as.arr.type))
            return q3_fail(Q3_ERR_FORMAT, "%s: tokenizer.ggml.token_type is an array of %s, expected integers", path,
                           q3_gguf_type_name(types->as.arr.type));
        if (types->as.arr.count != n)
            return q3_fail(Q3_ERR_FORMAT, "%s: tokenizer.ggml.token_type has %zu entries but tokenizer.ggml.tokens %zu",
                           path, types->as.arr.count, n);
    }

    const char **vocab = calloc(n, sizeof *vocab);
    const char **merge_list = calloc(n_merges + 1, sizeof *merge_list);
    q3_added_token *added = calloc(n, sizeof *added);
    size_t n_added = 0;
    if (!vocab || !merge_list || !added) {
        st = q3_fail(Q3_ERR_NOMEM, "%s: out of memory for %zu tokens", path, n);
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        size_t len;
        const char *s = q3_gguf_arr_str(tokens, i, &len);
        int64_t type = types ? q3_gguf_arr_i64(types, i) : Q3_TOKEN_TYPE_NORMAL;
        if (type == Q3_TOKEN_TYPE_UNUSED) continue;
        if (len != strlen(s) || len == 0) {
            st = q3_fail(Q3_ERR_FORMAT, "%s: tokenizer.ggml.tokens[%zu] is %s", path, i,
                         len ? "a string with a NUL byte inside" : "empty");
            goto done;
        }
        switch (type) {
        case Q3_TOKEN_TYPE_NORMAL:
        case Q3_TOKEN_TYPE_UNKNOWN:
        case Q3_TOKEN_TYPE_BYTE:
            vocab[i] = s;
            break;
        case Q3_TOKEN_TYPE_CONTROL:
        case Q3_TOKEN_TYPE_USER_DEFINED:
            added[n_added++] = (q3_added_token){.content = s, .id = (int32_t)i,
                                                .special = type == Q3_TOKEN_TYPE_CONTROL};
            break;
        default:
            st = q3_fail(Q3_ERR_FORMAT, "%s: tokenizer.ggml.token_type[%zu] = %lld is not a known token type (1..6)",
                         path, i, (long long)type);
            goto done;
        }
    }
    for (size_t i = 0; i < n_merges; i++) {
        size_t len;
        merge_list[i] = q3_gguf_arr_str(merges, i, &len);
        if (len != strlen(merge_list[i])) {
            st = q3_fail(Q3_ERR_FORMAT, "%s: tokenizer.ggml.merges[%zu] has a NUL byte inside", path, i);
            goto done;
        }
    }
    q3_tokenizer_parts parts = {
        .vocab = vocab, .n_vocab = n, .merges = merge_list, .n_merges = n_merges,
        .added = added, .n_added = n_added, .split_regex = NULL, .nfc = 1,
    };
    st = q3_tokenizer_from_parts(&parts, path, out);
done:
    free(vocab);
    free(merge_list);
    free(added);
    return st;
}

q3_status q3_tokenizer_load_gguf_file(const char *path, q3_tokenizer **out)
{
    *out = NULL;
    q3_gguf *g;
    q3_status st = q3_gguf_open(path, &g);
    if (st) return st;
    st = q3_tokenizer_load_gguf(g, out);
    q3_gguf_close(g);
    return st;
}

static q3_status read_id(const q3_gguf *g, const char *key, size_t n_tokens, int32_t *out)
{
    *out = -1;
    if (!q3_gguf_find(g, key)) return Q3_OK;
    uint32_t v;
    q3_status st = q3_gguf_get_u32(g, key, &v);
    if (st) return st;
    if (v >= n_tokens)
        return q3_fail(Q3_ERR_FORMAT, "%s: %s = %u, but there are %zu tokens", q3_gguf_path(g), key, v, n_tokens);
    *out = (int32_t)v;
    return Q3_OK;
}

q3_status q3_gguf_tokenizer_info_read(const q3_gguf *g, q3_gguf_tokenizer_info *out)
{
    memset(out, 0, sizeof *out);
    out->bos_id = out->eos_id = out->pad_id = out->eot_id = -1;
    const q3_gguf_value *tokens = q3_gguf_find(g, "tokenizer.ggml.tokens");
    size_t n = tokens && tokens->type == Q3_GGUF_ARRAY ? tokens->as.arr.count : 0;
    q3_status st;
    if ((st = read_id(g, "tokenizer.ggml.bos_token_id", n, &out->bos_id)) ||
        (st = read_id(g, "tokenizer.ggml.eos_token_id", n, &out->eos_id)) ||
        (st = read_id(g, "tokenizer.ggml.padding_token_id", n, &out->pad_id)) ||
        (st = read_id(g, "tokenizer.ggml.eot_token_id", n, &out->eot_id)))
        return st;
    if (q3_gguf_find(g, "tokenizer.ggml.add_bos_token")) {
        bool b;
        if ((st = q3_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b))) return st;
        out->add_bos = b;
    }
    const q3_gguf_value *t = q3_gguf_find(g, "tokenizer.chat_template");
    if (t) {
        if (t->type != Q3_GGUF_STRING)
            return q3_fail(Q3_ERR_FORMAT, "%s: tokenizer.chat_template is %s, expected string", q3_gguf_path(g),
                           q3_gguf_type_name(t->type));
        out->chat_template = t->as.str.s;
        out->template_kind = q3_chat_template_identify(t->as.str.s, t->as.str.len);
    }
    return Q3_OK;
}
