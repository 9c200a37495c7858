/* libFuzzer target: config.json (q3_config_parse_json, as q3_config_load calls it).
 *
 * A config that parses must:
 *   - pass q3_config_validate, with finite positive rope_theta and rms_norm_eps;
 *   - hold what the JSON says: each integer field equals the JSON number (or its
 *     documented default), tie_word_embeddings the JSON boolean;
 *   - survive a round trip: written back as config.json and parsed again, it gives
 *     the same q3_config. */
#include <cjson/cJSON.h>
#include <math.h>

#include "fuzz_common.h"
#include "model/config.h"

/* The JSON integer under key, or dflt when missing or null. */
static int cfg_int(const cJSON *root, const char *key, int dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) return dflt;
    return cJSON_IsNumber(v) && v->valuedouble >= 1 && v->valuedouble <= 1e9 ? (int)v->valuedouble : -12345;
}

static void cfg_check_fields(const q3_config *c, const char *text)
{
    cJSON *root = cJSON_Parse(text);
    FUZZ_CHECK(cJSON_IsObject(root), "accepted a config that is not a JSON object");
    if (!root) return;
    FUZZ_CHECK(c->n_layers == cfg_int(root, "num_hidden_layers", -1), "n_layers %d", c->n_layers);
    FUZZ_CHECK(c->dim == cfg_int(root, "hidden_size", -1), "dim %d", c->dim);
    FUZZ_CHECK(c->ffn_dim == cfg_int(root, "intermediate_size", -1), "ffn_dim %d", c->ffn_dim);
    FUZZ_CHECK(c->n_heads == cfg_int(root, "num_attention_heads", -1), "n_heads %d", c->n_heads);
    FUZZ_CHECK(c->n_kv_heads == cfg_int(root, "num_key_value_heads", c->n_heads), "n_kv_heads %d", c->n_kv_heads);
    FUZZ_CHECK(c->head_dim == cfg_int(root, "head_dim", c->n_heads ? c->dim / c->n_heads : 0), "head_dim %d",
               c->head_dim);
    FUZZ_CHECK(c->vocab_size == cfg_int(root, "vocab_size", -1), "vocab_size %d", c->vocab_size);
    FUZZ_CHECK(c->max_seq_len == cfg_int(root, "max_position_embeddings", 40960), "max_seq_len %d",
               c->max_seq_len);
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings");
    FUZZ_CHECK(c->tied_embeddings == cJSON_IsTrue(tie), "tied_embeddings %d", c->tied_embeddings);
    cJSON_Delete(root);
}

static int fuzz_config(const uint8_t *data, size_t size)
{
    char *text = fuzz_cstr(data, size);
    q3_config c;
    q3_status st = q3_config_parse_json(text, "fuzz/config.json", &c);
    fuzz_note("q3_config_parse_json", st);
    if (st != Q3_OK) {
        FUZZ_CHECK_FAILURE(st);
        free(text);
        return 0;
    }
    FUZZ_CHECK(q3_config_validate(&c, "fuzz") == Q3_OK, "accepted config fails validation: %s", q3_last_error());
    FUZZ_CHECK(isfinite(c.rope_theta) && c.rope_theta > 0, "accepted rope_theta %g", (double)c.rope_theta);
    FUZZ_CHECK(isfinite(c.rms_eps) && c.rms_eps > 0 && c.rms_eps < 1, "accepted rms_norm_eps %g", (double)c.rms_eps);
    FUZZ_CHECK(memchr(c.torch_dtype, 0, sizeof c.torch_dtype) != NULL, "torch_dtype not terminated");
    cfg_check_fields(&c, text);
    free(text);

    /* Round trip: describe the config as JSON, parse it back. %.9g prints a
     * float exactly enough to read back as the same float. */
    char buf[1024];
    snprintf(buf, sizeof buf,
             "{\"model_type\": \"qwen3\", \"num_hidden_layers\": %d, \"hidden_size\": %d, "
             "\"intermediate_size\": %d, \"num_attention_heads\": %d, \"num_key_value_heads\": %d, "
             "\"head_dim\": %d, \"vocab_size\": %d, \"max_position_embeddings\": %d, \"rms_norm_eps\": %.9g, "
             "\"rope_theta\": %.9g, \"tie_word_embeddings\": %s}",
             c.n_layers, c.dim, c.ffn_dim, c.n_heads, c.n_kv_heads, c.head_dim, c.vocab_size, c.max_seq_len,
             (double)c.rms_eps, (double)c.rope_theta, c.tied_embeddings ? "true" : "false");
    q3_config c2;
    st = q3_config_parse_json(buf, "fuzz/roundtrip.json", &c2);
    FUZZ_CHECK(st == Q3_OK, "the config written back does not parse: %s", q3_last_error());
    if (st == Q3_OK) {
        FUZZ_CHECK(c2.n_layers == c.n_layers && c2.dim == c.dim && c2.ffn_dim == c.ffn_dim &&
                       c2.n_heads == c.n_heads && c2.n_kv_heads == c.n_kv_heads && c2.head_dim == c.head_dim &&
                       c2.vocab_size == c.vocab_size && c2.max_seq_len == c.max_seq_len &&
                       c2.rms_eps == c.rms_eps && c2.rope_theta == c.rope_theta &&
                       c2.tied_embeddings == c.tied_embeddings,
                   "round trip changed the config: %s", buf);
    }
    return 0;
}

#ifndef FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_config(data, size); }
#endif
