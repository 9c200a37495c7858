/* libFuzzer target: a conversation JSON, as `q3 run --messages` and
 * `q3 chat-template` read it: q3_json_parse, then q3_chat_render.
 *
 * Checks:
 *   - q3_json_dumps of the parsed tree is idempotent: dumping, parsing the dump
 *     and dumping again gives the same text (when the dump is JSON, i.e. holds no
 *     NaN/Infinity);
 *   - every number node's float text (q3_json_format_double) reads back as the
 *     same double;
 *   - a render that succeeds is deterministic, NUL-free up to its end, begins with
 *     "<|im_start|>" and ends with the turn end or the generation prompt; if the
 *     input was valid UTF-8 the output is too;
 *   - rendering with every add_generation_prompt x enable_thinking option agrees
 *     with q3_chat_render on how the text starts.
 *
 * The same bytes are also a tokenizer_config.json for q3_chat_template_load:
 * it either names a template kind that its chat_template (a string, or the
 * entry named "default" of a list) identifies as, or fails with a message and
 * the kind UNKNOWN. */
#include <cjson/cJSON.h>
#include <math.h>

#include "fuzz_common.h"
#include "text/chat_template.h"
#include "text/json_write.h"

static void ct_check_numbers(const cJSON *node, int depth)
{
    for (; node && depth < 2000; node = node->next) {
        if (cJSON_IsNumber(node)) {
            double x = node->valuedouble;
            char buf[64], big[512];
            int n = q3_json_format_double(x, buf, sizeof buf);
            FUZZ_CHECK(n > 0 && n < (int)sizeof buf, "format_double(%.17g) needs %d bytes", x, n);
            if (isfinite(x)) {
                FUZZ_CHECK(strtod(buf, NULL) == x, "format_double(%.17g) = \"%s\" does not read back", x, buf);
            }
            n = q3_json_format_number(node, big, sizeof big);
            FUZZ_CHECK(n > 0, "format_number gave %d", n);
        }
        if (node->child) ct_check_numbers(node->child, depth + 1);
    }
}

/* 1 if s holds NaN or Infinity as json.dumps writes them (not JSON). */
static int ct_has_nonfinite(const cJSON *node)
{
    for (; node; node = node->next) {
        if (cJSON_IsNumber(node) && !isfinite(node->valuedouble)) return 1;
        if (node->child && ct_has_nonfinite(node->child)) return 1;
    }
    return 0;
}

static void ct_check_dumps(const cJSON *root)
{
    char *d1 = NULL, *d2 = NULL;
    size_t n1 = 0, n2 = 0;
    q3_status st = q3_json_dumps(root, &d1, &n1);
    FUZZ_CHECK(st == Q3_OK, "dumps of a parsed tree fails: %s", q3_last_error());
    if (st != Q3_OK) return;
    FUZZ_CHECK(strlen(d1) == n1, "dumps length %zu, strlen %zu", n1, strlen(d1));
    if (!ct_has_nonfinite(root)) {
        cJSON *again = NULL;
        st = q3_json_parse(d1, &again);
        FUZZ_CHECK(st == Q3_OK, "the dump does not parse: %s", q3_last_error());
        if (st == Q3_OK) {
            st = q3_json_dumps(again, &d2, &n2);
            FUZZ_CHECK(st == Q3_OK && n1 == n2 && !memcmp(d1, d2, n1), "dumps is not idempotent:\n%s\n%s", d1,
                       d2 ? d2 : "(null)");
            free(d2);
        }
        cJSON_Delete(again);
    }
    free(d1);
}

#define CT_PROMPT "<|im_start|>assistant\n"
#define CT_NO_THINK "<think>\n\n</think>\n\n"

/* Bytes the generation prompt adds at the end for these options. */
static size_t ct_prompt_len(int gen_prompt, int thinking)
{
    return gen_prompt ? strlen(CT_PROMPT) + (thinking == 0 ? strlen(CT_NO_THINK) : 0) : 0;
}

static int ct_ends_with(const char *s, size_t n, const char *lit)
{
    size_t k = strlen(lit);
    return n >= k && !memcmp(s + n - k, lit, k);
}

static void ct_check_render(const char *out, int input_utf8, int gen_prompt, int thinking)
{
    size_t n = strlen(out);
    if (input_utf8) FUZZ_CHECK(fuzz_utf8_valid(out, n), "valid UTF-8 in, invalid UTF-8 out");
    FUZZ_CHECK(!strncmp(out, "<|im_start|>", 12), "render does not begin with <|im_start|>");
    if (gen_prompt && thinking == 0)
        FUZZ_CHECK(ct_ends_with(out, n, CT_PROMPT CT_NO_THINK), "no empty think block");
    else if (gen_prompt)
        FUZZ_CHECK(ct_ends_with(out, n, CT_PROMPT), "no generation prompt at the end");
    else
        FUZZ_CHECK(ct_ends_with(out, n, "<|im_end|>\n"), "the render does not end a turn");
}

/* The chat template a parsed tokenizer_config.json holds, as the loader picks it. */
static const char *ct_config_template(const cJSON *config)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(config, "chat_template"), *e;
    if (cJSON_IsString(t)) return t->valuestring;
    if (!cJSON_IsArray(t)) return NULL;
    cJSON_ArrayForEach(e, t) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(e, "template");
        if (cJSON_IsString(name) && !strcmp(name->valuestring, "default") && cJSON_IsString(text))
            return text->valuestring;
    }
    return NULL;
}

static void ct_check_config(const uint8_t *data, size_t size)
{
    const char *file = fuzz_path("chat_template", "tokenizer_config.json");
    fuzz_write(file, data, size);
    q3_chat_template_kind kind = (q3_chat_template_kind)77;
    q3_status st = q3_chat_template_load(file, &kind);
    fuzz_note("q3_chat_template_load", st);
    if (st != Q3_OK) {
        FUZZ_CHECK_FAILURE(st);
        FUZZ_CHECK(kind == Q3_CHAT_TEMPLATE_UNKNOWN, "a failed load named kind %d", (int)kind);
        return;
    }
    FUZZ_CHECK(kind != Q3_CHAT_TEMPLATE_UNKNOWN, "a load succeeded without a known template");
    cJSON *config = cJSON_ParseWithLength((const char *)data, size); /* as the loader parses it */
    const char *tmpl = config ? ct_config_template(config) : NULL;
    FUZZ_CHECK(tmpl && q3_chat_template_identify(tmpl, strlen(tmpl)) == kind,
               "loaded kind %d is not what the file's chat_template identifies as", (int)kind);
    cJSON_Delete(config);
}

static int fuzz_chat_template(const uint8_t *data, size_t size)
{
    ct_check_config(data, size);

    char *text = fuzz_cstr(data, size);
    int input_utf8 = fuzz_utf8_valid(text, strlen(text));
    cJSON *conv = NULL;
    q3_status st = q3_json_parse(text, &conv);
    fuzz_note("q3_json_parse", st);
    free(text);
    if (st != Q3_OK) {
        FUZZ_CHECK_FAILURE(st);
        FUZZ_CHECK(conv == NULL, "a failed parse returned a tree");
        return 0;
    }
    ct_check_numbers(conv, 0);
    ct_check_dumps(conv);

    char *out = NULL, *again = NULL;
    st = q3_chat_render(conv, &out);
    fuzz_note("q3_chat_render", st);
    if (st == Q3_OK) {
        FUZZ_CHECK(out != NULL, "render OK without text");
        if (!out) goto done;
        int gen = 1, think = -1;
        if (cJSON_IsObject(conv)) {
            const cJSON *g = cJSON_GetObjectItemCaseSensitive(conv, "add_generation_prompt");
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(conv, "enable_thinking");
            /* duplicate keys: the renderer keeps the last, cJSON finds the first */
            int dup = 0;
            for (const cJSON *c = conv->child; c; c = c->next)
                if (c->string && (c != g && !strcmp(c->string, "add_generation_prompt"))) dup = 1;
            for (const cJSON *c = conv->child; c; c = c->next)
                if (c->string && (c != t && !strcmp(c->string, "enable_thinking"))) dup = 1;
            if (dup) goto done;
            if (cJSON_IsBool(g)) gen = cJSON_IsTrue(g);
            if (cJSON_IsBool(t)) think = cJSON_IsTrue(t);
        }
        ct_check_render(out, input_utf8, gen, think);
        st = q3_chat_render(conv, &again);
        FUZZ_CHECK(st == Q3_OK && again && !strcmp(out, again), "rendering twice differs");
        free(again);
        again = NULL;
        /* The messages alone, with every option: same prefix up to the prompt. */
        const cJSON *msgs = conv;
        const cJSON *tools = NULL;
        if (cJSON_IsObject(conv)) {
            msgs = NULL, tools = NULL;
            for (const cJSON *c = conv->child; c; c = c->next) { /* the last, as the renderer */
                if (c->string && !strcmp(c->string, "messages")) msgs = c;
                if (c->string && !strcmp(c->string, "tools")) tools = c;
            }
        }
        size_t base_len = strlen(out);
        for (int gp = 0; gp <= 1; gp++)
            for (int th = -1; th <= 1; th++) {
                q3_chat_options o = {.add_generation_prompt = gp, .enable_thinking = th};
                st = q3_chat_render_messages(msgs, tools, &o, &again);
                FUZZ_CHECK(st == Q3_OK && again, "render with options (%d, %d) fails: %s", gp, th, q3_last_error());
                if (st != Q3_OK || !again) continue;
                ct_check_render(again, input_utf8, gp, th);
                /* Options only change the end: the turns are the same. */
                size_t turns = base_len - ct_prompt_len(gen, think);
                size_t own = strlen(again) - ct_prompt_len(gp, th);
                FUZZ_CHECK(own == turns && !memcmp(again, out, turns), "options changed the turns");
                free(again);
                again = NULL;
            }
    } else {
        FUZZ_CHECK_FAILURE(st);
        FUZZ_CHECK(out == NULL, "a failed render returned text");
    }
done:
    free(out);
    cJSON_Delete(conv);
    return 0;
}

#ifndef FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_chat_template(data, size); }
#endif
