/* Converting a model to GGUF (see convert.h for what is written), and the
 * accuracy of quantized weights against the model they came from. */
#include "tools/convert.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "model/layout.h"
#include "model/quantize.h"
#include "text/embed_prompt.h"
#include "util/error.h"
#include "util/file.h"

/* Qwen2's pre-tokenizer split pattern, as tokenizer.json spells it: the one
 * llama.cpp knows as pre-tokenizer "qwen2". */
static const char qwen2_pattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

#define TOKENIZER_JSON_MAX (512u << 20)

static int is_kquant(q3_dtype t) { return t == Q3_Q4_K || t == Q3_Q5_K || t == Q3_Q6_K; }

uint32_t q3_convert_file_type(q3_dtype t, q3_kmix mix)
{
    switch (t) {
    case Q3_F32: return 0;
    case Q3_F16: return 1;
    case Q3_Q4_0: return 2;
    case Q3_Q8_0: return 7;
    case Q3_Q4_K: return mix == Q3_KMIX_S ? 14 : 15;
    case Q3_Q5_K: return mix == Q3_KMIX_S ? 16 : 17;
    case Q3_Q6_K: return 18;
    case Q3_BF16: return 32;
    default: return 0;
    }
}

static const struct {
    const char *name;
    q3_dtype type;
    q3_kmix mix;
} kquant_names[] = {
    {"q4_k_m", Q3_Q4_K, Q3_KMIX_M}, {"q4_k_s", Q3_Q4_K, Q3_KMIX_S}, {"q5_k_m", Q3_Q5_K, Q3_KMIX_M},
    {"q5_k_s", Q3_Q5_K, Q3_KMIX_S}, {"q6_k", Q3_Q6_K, Q3_KMIX_M},
};

int q3_convert_parse_type(const char *name, q3_dtype *type, q3_kmix *mix)
{
    for (size_t i = 0; i < sizeof kquant_names / sizeof kquant_names[0]; i++)
        if (!strcasecmp(name, kquant_names[i].name)) {
            *type = kquant_names[i].type;
            *mix = kquant_names[i].mix;
            return 0;
        }
    int t = q3_dtype_from_name(name); /* q4_k and q5_k: the _M mixes, as llama-quantize has them */
    if (t < 0) return -1;
    *type = (q3_dtype)t;
    *mix = Q3_KMIX_M;
    return 0;
}

const char *q3_convert_type_name(q3_dtype t, q3_kmix mix)
{
    for (size_t i = 0; i < sizeof kquant_names / sizeof kquant_names[0]; i++)
        if (kquant_names[i].type == t && (t == Q3_Q6_K || kquant_names[i].mix == mix)) return kquant_names[i].name;
    return q3_dtype_name(t);
}

q3_dtype q3_convert_tensor_type(q3_dtype want, int ndim, const int64_t *shape)
{
    if (ndim < 2) return Q3_F32;
    size_t block = q3_dtype_block_values(want);
    if (block > 1 && shape[ndim - 1] % (int64_t)block) return Q3_F16;
    return want;
}

/* llama-quantize's "use more bits" layers of the _M mixes: the first and last eighth,
 * and every third layer between. */
static int more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

static int name_ends(const char *name, const char *suffix)
{
    size_t n = strlen(name), k = strlen(suffix);
    return n >= k && !strcmp(name + n - k, suffix);
}

/* A layer tensor of this kind: "blk.N.<kind>.weight" (kind "ffn_down" also matches
 * "ffn_down_exps", as llama-quantize's categories match a name's substring). */
static int is_kind(const char *name, const char *kind, int with_exps)
{
    char a[64], b[64];
    snprintf(a, sizeof a, ".%s.weight", kind);
    snprintf(b, sizeof b, ".%s_exps.weight", kind);
    return name_ends(name, a) || (with_exps && name_ends(name, b));
}

q3_status q3_convert_pick_type(const q3_convert_opts *o, const q3_config *c, int tied, const char *name, int ndim,
                               const int64_t *shape, q3_dtype *out)
{
    /* the router stays F32 in every type: llama.cpp's converter keeps ffn_gate_inp F32 and
       llama-quantize never quantizes it (tensor_allows_quantization) */
    if (ndim < 2 || name_ends(name, ".ffn_gate_inp.weight")) {
        *out = Q3_F32;
        return Q3_OK;
    }
    if (!is_kquant(o->type)) {
        *out = q3_convert_tensor_type(o->type, ndim, shape);
        return Q3_OK;
    }
    int64_t cols = shape[ndim - 1];
    int layer = -1, n = c->n_layers, m_mix = o->kmix == Q3_KMIX_M, q4 = o->type == Q3_Q4_K;
    /* llama-quantize's Mixtral rules: hparams.n_expert == 8 exactly */
    int eight = c->n_experts == 8;
    if (sscanf(name, "blk.%d.", &layer) != 1) layer = -1;
    q3_dtype t = o->type;
    if (!strcmp(name, q3_lm_head_layout.gguf) || (tied && !strcmp(name, q3_embed_layout.gguf))) {
        t = cols % 256 ? Q3_Q8_0 : Q3_Q6_K;
    } else if (layer >= 0 && is_kind(name, "attn_v", 0)) {
        if (m_mix && (q4 || o->type == Q3_Q5_K) && more_bits(layer, n)) t = Q3_Q6_K;
        else if (!m_mix && q4 && layer < 4) t = Q3_Q5_K;
        if (eight) t = Q3_Q8_0;
    } else if (layer >= 0 && is_kind(name, "attn_k", 0)) {
        if (eight) t = Q3_Q8_0;
    } else if (layer >= 0 && is_kind(name, "attn_output", 0)) {
        if (eight && q4) t = Q3_Q5_K; /* Q4_K_M and Q4_K_S */
    } else if (layer >= 0 && is_kind(name, "ffn_down", 1)) {
        if (m_mix && (q4 || o->type == Q3_Q5_K) && more_bits(layer, n)) t = Q3_Q6_K;
        else if (!m_mix && q4 && layer < n / 8) t = Q3_Q5_K;
    }
    if (cols % (int64_t)q3_dtype_block_values(t)) { /* rows not of whole blocks: llama-quantize's fallback */
        const char *lacking = t == Q3_Q4_K ? "Q5_0" : t == Q3_Q5_K ? "Q5_1" : NULL;
        if (cols % 32) t = Q3_F16;
        else if (lacking)
            return q3_fail(Q3_ERR_UNSUPPORTED,
                           "%s has rows of %lld values, not whole 256-value super-blocks; llama-quantize "
                           "stores it in %s there, a type q3 has no quantizer for",
                           name, (long long)cols, lacking);
        else t = Q3_Q8_0; /* from Q6_K (Q8_0 itself fits: 32 divides cols) */
    }
    *out = t;
    return Q3_OK;
}

/* ---- copying metadata ------------------------------------------------------------- */

static int is_int(q3_gguf_type t)
{
    return t == Q3_GGUF_U8 || t == Q3_GGUF_I8 || t == Q3_GGUF_U16 || t == Q3_GGUF_I16 || t == Q3_GGUF_U32 ||
           t == Q3_GGUF_I32 || t == Q3_GGUF_U64 || t == Q3_GGUF_I64;
}

q3_status q3_convert_copy_kv(q3_gguf_writer *w, const char *key, const q3_gguf_value *v)
{
    switch (v->type) {
    case Q3_GGUF_STRING: return q3_gguf_writer_add_str(w, key, v->as.str.s);
    case Q3_GGUF_BOOL: return q3_gguf_writer_add_bool(w, key, v->as.u != 0);
    case Q3_GGUF_U8:
    case Q3_GGUF_U16:
    case Q3_GGUF_U32: return q3_gguf_writer_add_u32(w, key, (uint32_t)v->as.u);
    case Q3_GGUF_U64: return q3_gguf_writer_add_u64(w, key, v->as.u);
    case Q3_GGUF_I8:
    case Q3_GGUF_I16:
    case Q3_GGUF_I32: return q3_gguf_writer_add_i32(w, key, (int32_t)v->as.i);
    case Q3_GGUF_I64:
        if (v->as.i >= INT32_MIN && v->as.i <= INT32_MAX) return q3_gguf_writer_add_i32(w, key, (int32_t)v->as.i);
        break;
    case Q3_GGUF_F32:
    case Q3_GGUF_F64: return q3_gguf_writer_add_f32(w, key, (float)v->as.f);
    case Q3_GGUF_ARRAY: {
        size_t n = v->as.arr.count;
        q3_gguf_type et = v->as.arr.type;
        q3_status st = Q3_OK;
        if (et == Q3_GGUF_STRING) {
            const char **s = malloc((n ? n : 1) * sizeof *s);
            if (!s) return q3_fail(Q3_ERR_NOMEM, "out of memory copying '%s'", key);
            for (size_t i = 0; i < n; i++) s[i] = q3_gguf_arr_str(v, i, NULL);
            st = q3_gguf_writer_add_str_array(w, key, s, n);
            free(s);
            return st;
        }
        if (is_int(et) || et == Q3_GGUF_BOOL) {
            int32_t *a = malloc((n ? n : 1) * sizeof *a);
            if (!a) return q3_fail(Q3_ERR_NOMEM, "out of memory copying '%s'", key);
            for (size_t i = 0; i < n && !st; i++) {
                int64_t x = q3_gguf_arr_i64(v, i);
                if ((et == Q3_GGUF_U64 && q3_gguf_arr_u64(v, i) > INT32_MAX) || x < INT32_MIN || x > INT32_MAX)
                    st = q3_fail(Q3_ERR_UNSUPPORTED, "metadata '%s'[%zu] does not fit in an i32", key, i);
                a[i] = (int32_t)x;
            }
            if (!st) st = q3_gguf_writer_add_i32_array(w, key, a, n);
            free(a);
            return st;
        }
        if (et == Q3_GGUF_F32 || et == Q3_GGUF_F64) {
            float *a = malloc((n ? n : 1) * sizeof *a);
            if (!a) return q3_fail(Q3_ERR_NOMEM, "out of memory copying '%s'", key);
            for (size_t i = 0; i < n; i++) a[i] = (float)q3_gguf_arr_f64(v, i);
            st = q3_gguf_writer_add_f32_array(w, key, a, n);
            free(a);
            return st;
        }
        break;
    }
    default: break;
    }
    return q3_fail(Q3_ERR_UNSUPPORTED, "metadata '%s' of type %s cannot be copied", key, q3_gguf_type_name(v->type));
}

/* ---- the tokenizer from tokenizer.json -------------------------------------------------- */

static q3_status read_json(const char *path, cJSON **out)
{
    char *text;
    size_t len;
    q3_status st = q3_read_file(path, TOKENIZER_JSON_MAX, &text, &len);
    if (st) return st;
    *out = cJSON_ParseWithLength(text, len);
    free(text);
    if (!*out) return q3_fail(Q3_ERR_FORMAT, "%s: malformed JSON", path);
    return Q3_OK;
}

/* The split regex of a pre_tokenizer (a Split, or a Sequence holding one); NULL if none. */
static const char *split_regex(const cJSON *pt)
{
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(pt, "type");
    if (!cJSON_IsString(ty)) return NULL;
    if (!strcmp(ty->valuestring, "Split")) {
        const cJSON *re = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(pt, "pattern"), "Regex");
        return cJSON_IsString(re) ? re->valuestring : NULL;
    }
    if (!strcmp(ty->valuestring, "Sequence")) {
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(pt, "pretokenizers")) {
            const char *r = split_regex(it);
            if (r) return r;
        }
    }
    return NULL;
}

/* A special token named in tokenizer_config.json: a string or {"content": ...}. */
static const char *token_content(const cJSON *v)
{
    if (cJSON_IsString(v)) return v->valuestring;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(v, "content");
    return cJSON_IsString(c) ? c->valuestring : NULL;
}

/* An id from config.json's key: a number, or a list whose first entry is one. */
static int config_id(const cJSON *config, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(config, key);
    if (cJSON_IsArray(v)) v = cJSON_GetArrayItem(v, 0);
    return cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble < INT_MAX ? v->valueint : -1;
}

typedef struct tok_build {
    const char *json_path;
    int vocab_size;
    const char **tokens;  /* [vocab_size] */
    int32_t *types;       /* [vocab_size] */
    char *pad_text;       /* "[PAD<id>]" strings */
    const char **merges;  /* [n_merges] */
    char **merge_owned;   /* [n_merges] the joined pair, when given as a pair */
    size_t n_merges;
} tok_build;

static void tok_build_free(tok_build *b)
{
    for (size_t i = 0; b->merge_owned && i < b->n_merges; i++) free(b->merge_owned[i]);
    free(b->merge_owned);
    free(b->merges);
    free(b->tokens);
    free(b->types);
    free(b->pad_text);
}

static q3_status check_id(const tok_build *b, const cJSON *id, const char *what, const char *tok)
{
    if (!cJSON_IsNumber(id) || !(id->valuedouble >= 0 && id->valuedouble < INT_MAX) ||
        id->valuedouble != floor(id->valuedouble))
        return q3_fail(Q3_ERR_FORMAT, "%s: %s \"%s\" has no valid integer id", b->json_path, what, tok);
    if (id->valueint >= b->vocab_size)
        return q3_fail(Q3_ERR_INVALID, "%s: %s \"%s\" has id %d, but the model's vocabulary has %d ids",
                       b->json_path, what, tok, id->valueint, b->vocab_size);
    return Q3_OK;
}

/* Fills b from tokenizer.json's parsed root. */
static q3_status build_vocab(tok_build *b, const cJSON *root)
{
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    if (!cJSON_IsObject(model)) return q3_fail(Q3_ERR_FORMAT, "%s: no \"model\" object", b->json_path);
    if (type && (!cJSON_IsString(type) || strcmp(type->valuestring, "BPE")))
        return q3_fail(Q3_ERR_UNSUPPORTED, "%s: model.type is not \"BPE\"", b->json_path);
    const char *re = split_regex(cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"));
    if (!re || strcmp(re, qwen2_pattern))
        return q3_fail(Q3_ERR_UNSUPPORTED, "%s: the pre-tokenizer is not Qwen2's split regex; q3 convert writes "
                       "pre-tokenizer \"qwen2\" only", b->json_path);
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges))
        return q3_fail(Q3_ERR_FORMAT, "%s: model needs a \"vocab\" object and a \"merges\" array", b->json_path);

    size_t V = (size_t)b->vocab_size;
    b->tokens = calloc(V, sizeof *b->tokens);
    b->types = calloc(V, sizeof *b->types);
    if (!b->tokens || !b->types) return q3_fail(Q3_ERR_NOMEM, "out of memory for %zu tokens", V);
    q3_status st;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        if ((st = check_id(b, e, "token", e->string))) return st;
        b->tokens[e->valueint] = e->string;
        b->types[e->valueint] = 1;
    }
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(root, "added_tokens")) {
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(e, "content");
        if (!cJSON_IsString(content) || !content->valuestring[0])
            return q3_fail(Q3_ERR_FORMAT, "%s: an added token has no \"content\" string", b->json_path);
        if ((st = check_id(b, cJSON_GetObjectItemCaseSensitive(e, "id"), "added token", content->valuestring)))
            return st;
        int id = cJSON_GetObjectItemCaseSensitive(e, "id")->valueint;
        b->tokens[id] = content->valuestring;
        b->types[id] = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "special")) ? 3 : 4;
    }
    size_t missing = 0;
    for (size_t i = 0; i < V; i++) missing += !b->tokens[i];
    if (missing) {
        b->pad_text = malloc(missing * 20);
        if (!b->pad_text) return q3_fail(Q3_ERR_NOMEM, "out of memory");
        char *p = b->pad_text;
        for (size_t i = 0; i < V; i++)
            if (!b->tokens[i]) {
                b->tokens[i] = p;
                b->types[i] = 5;
                p += snprintf(p, 20, "[PAD%zu]", i) + 1;
            }
    }

    size_t n = (size_t)cJSON_GetArraySize(merges);
    b->merges = calloc(n + 1, sizeof *b->merges);
    b->merge_owned = calloc(n + 1, sizeof *b->merge_owned);
    if (!b->merges || !b->merge_owned) return q3_fail(Q3_ERR_NOMEM, "out of memory for %zu merges", n);
    cJSON_ArrayForEach(e, merges) {
        size_t i = b->n_merges++;
        if (cJSON_IsString(e) && strchr(e->valuestring, ' ')) {
            b->merges[i] = e->valuestring;
            continue;
        }
        const cJSON *l = cJSON_GetArrayItem(e, 0), *r = cJSON_GetArrayItem(e, 1);
        if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) != 2 || !cJSON_IsString(l) || !cJSON_IsString(r))
            return q3_fail(Q3_ERR_FORMAT, "%s: model.merges[%zu] is neither \"left right\" nor [\"left\", \"right\"]",
                           b->json_path, i);
        size_t ln = strlen(l->valuestring), rn = strlen(r->valuestring);
        char *s = malloc(ln + rn + 2);
        if (!s) return q3_fail(Q3_ERR_NOMEM, "out of memory");
        memcpy(s, l->valuestring, ln);
        s[ln] = ' ';
        memcpy(s + ln + 1, r->valuestring, rn + 1);
        b->merges[i] = b->merge_owned[i] = s;
    }
    return Q3_OK;
}

/* The id of a token given by its text: added tokens first, then the vocabulary. */
static int find_token(const cJSON *root, const char *text)
{
    if (!text) return -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(root, "added_tokens")) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "content"), *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        if (cJSON_IsString(c) && cJSON_IsNumber(id) && !strcmp(c->valuestring, text)) return id->valueint;
    }
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "model"), "vocab"), text);
    return cJSON_IsNumber(v) ? v->valueint : -1;
}

/* Chat templates: chat_template.jinja if present, else tokenizer_config.json's
 * "chat_template" (a string, or named templates: "default" becomes
 * tokenizer.chat_template, the others tokenizer.chat_template.<name>). */
static q3_status add_chat_templates(q3_gguf_writer *w, const char *dir, const cJSON *tcfg)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/chat_template.jinja", dir);
    int present;
    q3_status pst = q3_regular_or_absent(p, &present); /* a FIFO there is an error, not "no template" */
    if (pst) return pst;
    if (present) {
        char *text;
        q3_status st = q3_read_file(p, 16u << 20, &text, NULL);
        if (st) return st;
        st = q3_gguf_writer_add_str(w, "tokenizer.chat_template", text);
        free(text);
        return st;
    }
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(tcfg, "chat_template");
    if (cJSON_IsString(ct)) return q3_gguf_writer_add_str(w, "tokenizer.chat_template", ct->valuestring);
    const cJSON *e, *list = cJSON_IsArray(ct) ? ct : NULL;
    cJSON_ArrayForEach(e, list) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
        const cJSON *tmpl = cJSON_GetObjectItemCaseSensitive(e, "template");
        if (!cJSON_IsString(name) || !cJSON_IsString(tmpl)) continue;
        char key[256];
        if (!strcmp(name->valuestring, "default")) snprintf(key, sizeof key, "tokenizer.chat_template");
        else snprintf(key, sizeof key, "tokenizer.chat_template.%s", name->valuestring);
        q3_status st = q3_gguf_writer_add_str(w, key, tmpl->valuestring);
        if (st) return st;
    }
    return Q3_OK;
}

/* The tokenizer metadata; config (may be NULL) is the model's config.json, parsed. */
static q3_status add_tokenizer(q3_gguf_writer *w, const char *dir, const cJSON *config, int vocab_size)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    int present;
    q3_status pst = q3_regular_or_absent(path, &present);
    if (pst) return pst;
    if (!present) return q3_fail(Q3_ERR_IO, "%s: no tokenizer.json in the folder", dir);
    cJSON *root = NULL, *tcfg = NULL;
    tok_build b = {.json_path = path, .vocab_size = vocab_size};
    q3_status st = read_json(path, &root);
    if (!st) st = build_vocab(&b, root);
    char cfg_path[PATH_MAX];
    snprintf(cfg_path, sizeof cfg_path, "%s/tokenizer_config.json", dir);
    /* optional, but a FIFO or a device in their place is an error rather than silently skipped */
    if (!st && !(st = q3_regular_or_absent(cfg_path, &present)) && present) st = read_json(cfg_path, &tcfg);
    if (st) goto done;

    if ((st = q3_gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2")) ||
        (st = q3_gguf_writer_add_str(w, "tokenizer.ggml.pre", "qwen2")) ||
        (st = q3_gguf_writer_add_str_array(w, "tokenizer.ggml.tokens", b.tokens, (size_t)vocab_size)) ||
        (st = q3_gguf_writer_add_i32_array(w, "tokenizer.ggml.token_type", b.types, (size_t)vocab_size)) ||
        (st = q3_gguf_writer_add_str_array(w, "tokenizer.ggml.merges", b.merges, b.n_merges)))
        goto done;
    /* special ids as llama.cpp's SpecialVocab finds them: tokenizer_config.json's
       <kind>_token, else config.json's <kind>_token_id */
    static const char *const kinds[][3] = {
        {"bos_token", "bos_token_id", "tokenizer.ggml.bos_token_id"},
        {"eos_token", "eos_token_id", "tokenizer.ggml.eos_token_id"},
        {"pad_token", "pad_token_id", "tokenizer.ggml.padding_token_id"},
    };
    for (size_t k = 0; k < 3 && !st; k++) {
        int id = find_token(root, token_content(cJSON_GetObjectItemCaseSensitive(tcfg, kinds[k][0])));
        if (id < 0) id = config_id(config, kinds[k][1]);
        if (id >= 0 && id < vocab_size) st = q3_gguf_writer_add_u32(w, kinds[k][2], (uint32_t)id);
    }
    if (!st)
        st = q3_gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token",
                                     cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(tcfg, "add_bos_token")));
    if (!st) st = add_chat_templates(w, dir, tcfg);
done:
    tok_build_free(&b);
    cJSON_Delete(root);
    cJSON_Delete(tcfg);
    return st;
}

q3_status q3_convert_add_tokenizer(q3_gguf_writer *w, const char *dir, const char *config_json, int vocab_size)
{
    cJSON *config = NULL;
    int present;
    q3_status st = Q3_OK;
    if (config_json && !(st = q3_regular_or_absent(config_json, &present)) && present) st = read_json(config_json, &config);
    if (!st) st = add_tokenizer(w, dir, config, vocab_size);
    cJSON_Delete(config);
    return st;
}

q3_status q3_convert_add_tokenizer_text(q3_gguf_writer *w, const char *dir, const char *config_text, int vocab_size)
{
    cJSON *config = config_text ? cJSON_Parse(config_text) : NULL;
    if (config_text && !config) return q3_fail(Q3_ERR_FORMAT, "the model's config.json is not JSON");
    q3_status st = add_tokenizer(w, dir, config, vocab_size);
    cJSON_Delete(config);
    return st;
}

/* ---- the file's plan: metadata and tensors --------------------------------------- */

q3_status q3_convert_check_config(const q3_config *c, const char *source)
{
    if (q3_config_is_moe(c) && !c->norm_topk_prob)
        return q3_fail(Q3_ERR_UNSUPPORTED,
                       "%s: norm_topk_prob is false (the chosen experts' weights are not divided by their sum); "
                       "llama.cpp's qwen3moe always renormalizes them, so a GGUF of this model would compute "
                       "something else: q3 will not write it",
                       source);
    return Q3_OK;
}

q3_status q3_convert_add_metadata(q3_gguf_writer *w, const q3_config *c, const q3_convert_opts *o, const char *name)
{
    const char *arch = q3_config_is_moe(c) ? "qwen3moe" : "qwen3";
    char k[96];
    q3_status st;
#define KEY(suffix) (snprintf(k, sizeof k, "%s.%s", arch, suffix), k)
    if ((st = q3_gguf_writer_add_str(w, "general.architecture", arch)) ||
        (st = q3_gguf_writer_add_str(w, "general.type", "model")) ||
        (st = q3_gguf_writer_add_str(w, "general.name", name)) ||
        (st = q3_gguf_writer_add_u32(w, KEY("context_length"), (uint32_t)c->max_seq_len)) ||
        /* llama.cpp sizes the vocabulary from this key when the file has no tokenizer */
        (st = q3_gguf_writer_add_u32(w, KEY("vocab_size"), (uint32_t)c->vocab_size)) ||
        (st = q3_gguf_writer_add_u32(w, KEY("embedding_length"), (uint32_t)c->dim)) ||
        (st = q3_gguf_writer_add_u32(w, KEY("block_count"), (uint32_t)c->n_layers)) ||
        (st = q3_gguf_writer_add_u32(w, KEY("feed_forward_length"), (uint32_t)c->ffn_dim)))
        return st;
    if (q3_config_is_moe(c) && /* as llama.cpp's converter writes a Qwen3-MoE */
        ((st = q3_gguf_writer_add_u32(w, KEY("expert_feed_forward_length"), (uint32_t)c->expert_ffn_dim)) ||
         (st = q3_gguf_writer_add_u32(w, KEY("expert_count"), (uint32_t)c->n_experts)) ||
         (st = q3_gguf_writer_add_u32(w, KEY("expert_used_count"), (uint32_t)c->n_experts_used))))
        return st;
    if ((st = q3_gguf_writer_add_u32(w, KEY("attention.head_count"), (uint32_t)c->n_heads)) ||
        (st = q3_gguf_writer_add_u32(w, KEY("attention.head_count_kv"), (uint32_t)c->n_kv_heads)) ||
        (st = q3_gguf_writer_add_u32(w, KEY("attention.key_length"), (uint32_t)c->head_dim)) ||
        (st = q3_gguf_writer_add_u32(w, KEY("attention.value_length"), (uint32_t)c->head_dim)) ||
        (st = q3_gguf_writer_add_f32(w, KEY("rope.freq_base"), c->rope_theta)) ||
        (st = q3_gguf_writer_add_f32(w, KEY("attention.layer_norm_rms_epsilon"), c->rms_eps)) ||
        (st = q3_gguf_writer_add_u32(w, "general.file_type", q3_convert_file_type(o->type, o->kmix))) ||
        (st = q3_gguf_writer_add_u32(w, "general.quantization_version", 2)))
        return st;
    /* an embedding model or a reranker says so, as llama.cpp's converter writes it */
    if (c->pooling && (st = q3_gguf_writer_add_u32(w, KEY("pooling_type"), (uint32_t)c->pooling))) return st;
    if (c->pooling == Q3_POOLING_RANK) { /* llama.cpp's server renders a rerank prompt from this */
        char *t = q3_rerank_prompt_text(NULL, "{query}", "{document}");
        if (!t) return q3_fail(Q3_ERR_NOMEM, "out of memory");
        st = q3_gguf_writer_add_str(w, "tokenizer.chat_template.rerank", t);
        free(t);
        if (st) return st;
    }
    const q3_rope_scaling *y = &c->rope_scaling;
    if (y->type == Q3_ROPE_YARN) { /* the keys llama.cpp reads; a non-default extra has no key there */
        if (y->attn_factor > 0 || y->mscale > 0 || y->mscale_all_dim > 0 || !y->truncate)
            return q3_fail(Q3_ERR_UNSUPPORTED,
                           "YaRN with attention_factor, mscale or truncate=false has no GGUF key "
                           "llama.cpp reads; q3 will not write a GGUF that computes something else");
        if ((st = q3_gguf_writer_add_str(w, KEY("rope.scaling.type"), "yarn")) ||
            (st = q3_gguf_writer_add_f32(w, KEY("rope.scaling.factor"), y->factor)) ||
            (st = q3_gguf_writer_add_u32(w, KEY("rope.scaling.original_context_length"), (uint32_t)y->orig_ctx)) ||
            (y->beta_fast != 32 && (st = q3_gguf_writer_add_f32(w, KEY("rope.scaling.yarn_beta_fast"), y->beta_fast))) ||
            (y->beta_slow != 1 && (st = q3_gguf_writer_add_f32(w, KEY("rope.scaling.yarn_beta_slow"), y->beta_slow))))
            return st;
    }
#undef KEY
    return Q3_OK;
}

size_t q3_convert_plan_count(const q3_config *c)
{
    const q3_tensor_layout *ts[Q3_LAYER_TENSORS + Q3_MOE_TENSORS];
    int fields[Q3_LAYER_TENSORS + Q3_MOE_TENSORS];
    return 2 + !c->tied_embeddings + (size_t)c->n_layers * (size_t)q3_layer_tensors(c, ts, fields);
}

/* One entry of the plan: the layout, its names and shapes, the type. */
static q3_status plan_entry(const q3_convert_opts *o, const q3_config *c, const q3_tensor_layout *t, int layer,
                            int field, q3_convert_entry *e)
{
    memset(e, 0, sizeof *e);
    e->layout = t;
    e->layer = layer;
    e->field = field;
    if (layer >= 0) q3_layout_name(t, layer, 0, 1, e->name, sizeof e->name);
    else snprintf(e->name, sizeof e->name, "%s", t->gguf);
    e->ndim = q3_layout_shape(t, c, e->shape);
    return q3_convert_pick_type(o, c, c->tied_embeddings, e->name, e->ndim, e->shape, &e->type);
}

q3_status q3_convert_plan(const q3_convert_opts *o, const q3_config *c, q3_convert_entry *out)
{
    const q3_tensor_layout *ts[Q3_LAYER_TENSORS + Q3_MOE_TENSORS];
    int fields[Q3_LAYER_TENSORS + Q3_MOE_TENSORS], n = q3_layer_tensors(c, ts, fields);
    q3_convert_entry *e = out;
    q3_status st = plan_entry(o, c, &q3_embed_layout, -1, -1, e++);
    for (int l = 0; l < c->n_layers && !st; l++)
        for (int i = 0; i < n && !st; i++) st = plan_entry(o, c, ts[i], l, fields[i], e++);
    if (!st) st = plan_entry(o, c, &q3_out_norm_layout, -1, -1, e++);
    if (!st && !c->tied_embeddings) st = plan_entry(o, c, &q3_lm_head_layout, -1, -1, e++);
    return st;
}

/* ---- tensors ------------------------------------------------------------------------ */

typedef struct tensor_job {
    const q3_tensor *src; /* a matrix or vector, or a stack (its mats) */
    q3_dtype dst;
} tensor_job;

/* Rows [r0, r1) of one matrix converted into the file type. */
typedef struct row_range {
    const q3_tensor *t;
    q3_dtype dt;
    void *dst;
    size_t r0, r1;
    q3_status st;
} row_range;

static void *convert_rows(void *arg)
{
    row_range *rr = arg;
    const q3_tensor *t = rr->t;
    q3_dtype dt = rr->dt;
    size_t cols = (size_t)t->shape[t->ndim - 1];
    size_t src_row = q3_dtype_row_bytes(t->dtype, cols), dst_row = q3_dtype_row_bytes(dt, cols);
    float *buf = malloc(cols * sizeof *buf);
    if (!buf) {
        rr->st = q3_fail(Q3_ERR_NOMEM, "out of memory");
        return NULL;
    }
    for (size_t r = rr->r0; r < rr->r1 && !rr->st; r++) {
        q3_row_to_f32(t->dtype, (const char *)t->data + r * src_row, buf, cols);
        rr->st = q3_quantize(dt, buf, (char *)rr->dst + r * dst_row, cols);
    }
    free(buf);
    return NULL;
}

#define CONVERT_MAX_THREADS 8
#define CONVERT_VALUES_PER_THREAD (1u << 20)

/* Converts one matrix (or vector) t into dst in type dt: a copy when the type is
 * unchanged, else row by row (through F32), on up to CONVERT_MAX_THREADS threads for
 * large tensors. */
static q3_status convert_matrix(const q3_tensor *t, q3_dtype dt, void *dst)
{
    size_t cols = (size_t)t->shape[t->ndim - 1], rows = q3_tensor_numel(t) / cols;
    if (t->dtype == dt) {
        size_t n = rows * q3_dtype_row_bytes(dt, cols);
        if (n > t->nbytes) return q3_fail(Q3_ERR_INVALID, "tensor \"%s\": size mismatch", t->name);
        memcpy(dst, t->data, n);
        return Q3_OK;
    }
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    size_t nt = q3_tensor_numel(t) / CONVERT_VALUES_PER_THREAD;
    if (nt > (size_t)(cpus > 0 ? cpus : 1)) nt = (size_t)(cpus > 0 ? cpus : 1);
    if (nt > CONVERT_MAX_THREADS) nt = CONVERT_MAX_THREADS;
    if (nt > rows) nt = rows;
    if (nt < 1) nt = 1;
    row_range rr[CONVERT_MAX_THREADS];
    pthread_t th[CONVERT_MAX_THREADS];
    int started[CONVERT_MAX_THREADS] = {0};
    for (size_t i = 0; i < nt; i++) {
        rr[i] = (row_range){.t = t, .dt = dt, .dst = dst, .r0 = rows * i / nt, .r1 = rows * (i + 1) / nt};
        if (i) started[i] = pthread_create(&th[i], NULL, convert_rows, &rr[i]) == 0;
    }
    convert_rows(&rr[0]);
    q3_status st = rr[0].st;
    for (size_t i = 1; i < nt; i++) {
        if (started[i]) pthread_join(th[i], NULL);
        else convert_rows(&rr[i]); /* no thread: do it here */
        if (!st && rr[i].st) st = rr[i].st;
    }
    return st;
}

/* Makes a tensor's file bytes: one matrix, or a stack's matrices one after another
 * (expert-major, as llama.cpp's 3-D expert tensors are laid out); a stack is read
 * through its mats only (a folder's stack has no data of its own). */
static q3_status fill_tensor(void *user, void *dst, size_t nbytes)
{
    const tensor_job *j = user;
    const q3_tensor *t = j->src;
    size_t n_mat = t->mats ? (size_t)t->shape[0] : 1, done = 0;
    for (size_t e = 0; e < n_mat; e++) {
        const q3_tensor *mat = t->mats ? t->mats[e] : t;
        size_t cols = (size_t)mat->shape[mat->ndim - 1], rows = q3_tensor_numel(mat) / cols;
        size_t bytes = rows * q3_dtype_row_bytes(j->dst, cols);
        if (done + bytes > nbytes) return q3_fail(Q3_ERR_INVALID, "tensor \"%s\": size mismatch", t->name);
        q3_status st = convert_matrix(mat, j->dst, (char *)dst + done);
        if (st) return st;
        done += bytes;
    }
    if (done != nbytes) return q3_fail(Q3_ERR_INVALID, "tensor \"%s\": size mismatch", t->name);
    return Q3_OK;
}

/* The model's tensor of plan entry e. */
static const q3_tensor *source_of(const q3_model *m, const q3_convert_entry *e)
{
    if (e->layer >= 0) return ((const q3_tensor *const *)&m->w.layers[e->layer])[e->field];
    if (e->layout == &q3_embed_layout) return m->w.embed;
    if (e->layout == &q3_out_norm_layout) return m->w.out_norm;
    return m->w.lm_head;
}

static q3_status add_model(q3_gguf_writer *w, const q3_model *m, const q3_convert_opts *o, const char *name,
                           const q3_convert_entry *plan, size_t n_plan, tensor_job *jobs)
{
    q3_status st = q3_convert_add_metadata(w, &m->cfg, o, name);
    for (size_t i = 0; i < n_plan && !st; i++) {
        const q3_convert_entry *e = &plan[i];
        const q3_tensor *t = source_of(m, e);
        if (!t) return q3_fail(Q3_ERR_INVALID, "the model has no tensor for %s", e->name);
        jobs[i] = (tensor_job){.src = t, .dst = e->type};
        st = q3_gguf_writer_add_tensor_fn(w, e->name, e->type, e->ndim, e->shape, fill_tensor, &jobs[i]);
    }
    return st;
}

void q3_convert_base_name(const char *path, char *out, size_t n)
{
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/') len--;
    size_t start = len;
    while (start > 0 && path[start - 1] != '/') start--;
    size_t k = len - start;
    if (k > 5 && !memcmp(path + len - 5, ".gguf", 5)) k -= 5;
    snprintf(out, n, "%.*s", (int)k, path + start);
}

static int has_tokenizer_keys(const q3_gguf *g)
{
    const q3_gguf_value *v = q3_gguf_find(g, "tokenizer.ggml.model");
    return v && v->type == Q3_GGUF_STRING && strcmp(v->as.str.s, "none");
}

q3_status q3_convert_model(const q3_model *m, const char *out_path, const q3_convert_opts *o)
{
    q3_clear_error();
    if ((unsigned)o->type >= Q3_DTYPE_COUNT || !q3_traits(o->type)->from_f32) /* the types with a quantizer */
        return q3_fail(Q3_ERR_INVALID,
                       "q3 convert cannot write %s weights (f32, f16, bf16, q8_0, q4_0, q4_k_m, q4_k_s, q5_k_m, "
                       "q5_k_s, q6_k): pass --type", q3_dtype_name(o->type));
    q3_status cst = q3_convert_check_config(&m->cfg, m->path);
    if (cst) return cst;
    const q3_gguf *src_gguf = m->gguf;
    int folder = q3_is_dir(m->path);
    char tok_dir[PATH_MAX] = "", config_json[PATH_MAX] = "";
    if (folder) snprintf(config_json, sizeof config_json, "%s/config.json", m->path);
    if (!o->no_tokenizer) {
        if (o->tokenizer_dir) {
            snprintf(tok_dir, sizeof tok_dir, "%s", o->tokenizer_dir);
            char p[PATH_MAX];
            snprintf(p, sizeof p, "%s/tokenizer.json", tok_dir);
            if (!q3_file_exists(p)) return q3_fail(Q3_ERR_IO, "%s: no tokenizer.json in the --tokenizer folder", tok_dir);
        } else if (src_gguf && has_tokenizer_keys(src_gguf)) {
            /* copied from the source GGUF below */
        } else {
            char p[PATH_MAX];
            snprintf(p, sizeof p, "%s/tokenizer.json", m->path);
            if (!folder || !q3_file_exists(p))
                return q3_fail(Q3_ERR_IO, "%s has no tokenizer (no tokenizer.json%s): pass --tokenizer DIR, a folder "
                               "with the model's tokenizer.json", m->path, folder ? " in the folder" : "");
            snprintf(tok_dir, sizeof tok_dir, "%s", m->path);
        }
    }

    char name[256];
    if (o->name) snprintf(name, sizeof name, "%s", o->name);
    else q3_convert_base_name(m->path, name, sizeof name);

    q3_gguf_writer *w;
    q3_status st = q3_gguf_writer_new(&w);
    if (st) return st;
    size_t n_plan = q3_convert_plan_count(&m->cfg);
    tensor_job *jobs = calloc(n_plan, sizeof *jobs);
    q3_convert_entry *plan = calloc(n_plan, sizeof *plan);
    if (!jobs || !plan) {
        q3_gguf_writer_free(w);
        free(jobs);
        free(plan);
        return q3_fail(Q3_ERR_NOMEM, "out of memory");
    }
    st = q3_convert_plan(o, &m->cfg, plan);
    if (!st) st = add_model(w, m, o, name, plan, n_plan, jobs);
    if (!st) {
        if (o->no_tokenizer) {
            st = q3_gguf_writer_add_str(w, "tokenizer.ggml.model", "none");
        } else if (tok_dir[0]) {
            st = q3_convert_add_tokenizer(w, tok_dir, config_json[0] ? config_json : NULL, m->cfg.vocab_size);
        } else {
            for (size_t i = 0; i < q3_gguf_kv_count(src_gguf) && !st; i++) {
                const char *key = q3_gguf_kv_key(src_gguf, i);
                if (!strncmp(key, "tokenizer.", 10)) st = q3_convert_copy_kv(w, key, q3_gguf_kv_value(src_gguf, i));
            }
        }
    }
    if (!st) st = q3_gguf_writer_write(w, out_path, o->progress, o->user);
    q3_gguf_writer_free(w);
    free(jobs);
    free(plan);
    return st;
}

q3_status q3_convert(const char *model_path, const char *out_path, const q3_convert_opts *o)
{
    q3_model *m;
    q3_status st = q3_model_open(model_path, &m);
    if (st) return st;
    st = q3_convert_model(m, out_path, o);
    q3_model_close(m);
    return st;
}

/* ---- accuracy ------------------------------------------------------------------------- */

/* KL(p || q) of the softmaxes of logits a (reference) and b, in nats; also the
 * largest |a - b|. */
static double kl_logits(const float *a, const float *b, size_t n, double *max_abs)
{
    double ma = -INFINITY, mb = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        if (a[i] > ma) ma = a[i];
        if (b[i] > mb) mb = b[i];
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= *max_abs)) *max_abs = d;
    }
    double sa = 0, sb = 0;
    for (size_t i = 0; i < n; i++) {
        sa += exp(a[i] - ma);
        sb += exp(b[i] - mb);
    }
    double la = ma + log(sa), lb = mb + log(sb), kl = 0;
    for (size_t i = 0; i < n; i++) {
        double lpa = a[i] - la, lpb = b[i] - lb;
        kl += exp(lpa) * (lpa - lpb);
    }
    return kl > 0 ? kl : 0;
}

static size_t argmax(const float *x, size_t n)
{
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* A quantized copy of ref, through a temporary GGUF that is unlinked once mapped. */
static q3_status quantized_copy(const q3_model *ref, q3_dtype type, q3_model **out)
{
    const char *tmp = getenv("TMPDIR");
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/q3-compare-XXXXXX.gguf", tmp && *tmp ? tmp : "/tmp");
    int fd = mkstemps(path, 5);
    if (fd < 0) return q3_fail(Q3_ERR_IO, "%s: cannot create a temporary file", path);
    close(fd);
    q3_convert_opts o = {.type = type, .no_tokenizer = 1};
    q3_status st = q3_convert_model(ref, path, &o);
    if (!st) st = q3_model_open(path, out);
    unlink(path);
    return st;
}

/* Runs every sequence through ss[n] (the reference) and ss[0..n), one prefill
 * each with every row's logits, and fills out[k]'s KL, top-1 and logit figures. */
static q3_status compare_sessions(q3_session **ss, size_t n, size_t V, size_t max_len, const int32_t *const *seqs,
                                  const size_t *lens, size_t n_seqs, q3_quant_report *out)
{
    float *lref = malloc(max_len * V * sizeof *lref), *lq = malloc(max_len * V * sizeof *lq);
    size_t *agree = calloc(n + 1, sizeof *agree);
    double *kl_sum = calloc(n + 1, sizeof *kl_sum);
    q3_status st = Q3_OK;
    if (!lref || !lq || !agree || !kl_sum) st = q3_fail(Q3_ERR_NOMEM, "out of memory for %zu x %zu logits", max_len, V);
    for (size_t i = 0; i < n_seqs && !st; i++) {
        if (!lens[i]) continue;
        q3_session_reset(ss[n]);
        if ((st = q3_session_prefill(ss[n], seqs[i], lens[i], lref, 1))) break;
        for (size_t k = 0; k < n && !st; k++) {
            q3_session_reset(ss[k]);
            if ((st = q3_session_prefill(ss[k], seqs[i], lens[i], lq, 1))) break;
            for (size_t t = 0; t < lens[i]; t++) {
                const float *a = lref + t * V, *b = lq + t * V;
                double kl = kl_logits(a, b, V, &out[k].max_abs_logit);
                kl_sum[k] += kl;
                if (kl > out[k].kl_max) out[k].kl_max = kl;
                agree[k] += argmax(a, V) == argmax(b, V);
                out[k].n_positions++;
            }
        }
    }
    for (size_t k = 0; k < n && !st; k++) {
        out[k].kl_mean = out[k].n_positions ? kl_sum[k] / (double)out[k].n_positions : 0;
        out[k].top1_agree = out[k].n_positions ? (double)agree[k] / (double)out[k].n_positions : 0;
    }
    free(agree);
    free(kl_sum);
    free(lref);
    free(lq);
    return st;
}

static q3_status check_seqs(const q3_model *m, const size_t *lens, size_t n_seqs, size_t *max_len)
{
    *max_len = 0;
    for (size_t i = 0; i < n_seqs; i++)
        if (lens[i] > *max_len) *max_len = lens[i];
    if (!n_seqs || !*max_len) return q3_fail(Q3_ERR_INVALID, "no token sequences to compare on");
    if (*max_len > (size_t)m->cfg.max_seq_len)
        return q3_fail(Q3_ERR_INVALID, "a sequence of %zu tokens is longer than the model's context (%d)", *max_len,
                       m->cfg.max_seq_len);
    return Q3_OK;
}

q3_status q3_convert_compare(q3_model *ref, const q3_dtype *types, size_t n_types, const int32_t *const *seqs,
                             const size_t *lens, size_t n_seqs, const char *backend, q3_quant_report *out)
{
    size_t V = (size_t)ref->cfg.vocab_size, max_len;
    q3_status st = check_seqs(ref, lens, n_seqs, &max_len);
    if (st) return st;
    q3_model **qm = calloc(n_types + 1, sizeof *qm);
    q3_session **ss = calloc(n_types + 1, sizeof *ss);
    if (!qm || !ss) st = q3_fail(Q3_ERR_NOMEM, "out of memory");
    q3_session_opts so = {.n_ctx = (int)max_len, .backend = backend};
    if (!st) st = q3_session_new(ref, &so, &ss[n_types]);
    for (size_t k = 0; k < n_types && !st; k++) {
        memset(&out[k], 0, sizeof out[k]);
        out[k].type = types[k];
        if (!(st = quantized_copy(ref, types[k], &qm[k]))) st = q3_session_new(qm[k], &so, &ss[k]);
        if (!st) out[k].weight_bytes = q3_model_weight_bytes(qm[k]);
    }
    if (!st) st = compare_sessions(ss, n_types, V, max_len, seqs, lens, n_seqs, out);
    for (size_t k = 0; k <= n_types; k++) {
        if (ss) q3_session_free(ss[k]);
        if (qm && k < n_types) q3_model_close(qm[k]);
    }
    free(qm);
    free(ss);
    return st;
}

q3_status q3_convert_compare_kv(q3_model *m, q3_dtype ref_kv, const q3_dtype *kv_types, size_t n_types,
                                const int32_t *const *seqs, const size_t *lens, size_t n_seqs, const char *backend,
                                q3_quant_report *out)
{
    size_t V = (size_t)m->cfg.vocab_size, max_len;
    q3_status st = check_seqs(m, lens, n_seqs, &max_len);
    if (st) return st;
    q3_session **ss = calloc(n_types + 1, sizeof *ss);
    if (!ss) return q3_fail(Q3_ERR_NOMEM, "out of memory");
    q3_session_opts so = {.n_ctx = (int)max_len, .backend = backend, .kv_dtype = q3_dtype_name(ref_kv)};
    st = q3_session_new(m, &so, &ss[n_types]);
    for (size_t k = 0; k < n_types && !st; k++) {
        memset(&out[k], 0, sizeof out[k]);
        out[k].type = kv_types[k];
        out[k].weight_bytes = 2 * (size_t)m->cfg.n_layers *
                              q3_dtype_row_bytes(kv_types[k], (size_t)m->cfg.n_kv_heads * (size_t)m->cfg.head_dim);
        so.kv_dtype = q3_dtype_name(kv_types[k]);
        st = q3_session_new(m, &so, &ss[k]);
    }
    if (!st) st = compare_sessions(ss, n_types, V, max_len, seqs, lens, n_seqs, out);
    for (size_t k = 0; k <= n_types; k++) q3_session_free(ss[k]);
    free(ss);
    return st;
}
