/* libFuzzer target: encoding and decoding arbitrary bytes with the real Qwen3
 * tokenizer (tests/data/golden/e2e/tokenizer.json, loaded once; another file
 * with Q3_FUZZ_TOKENIZER=PATH).
 *
 * The input is used twice:
 *   - as text: encoded with both flags. Invalid UTF-8 must fail with
 *     Q3_ERR_INVALID and leave the ids untouched; valid UTF-8 must encode, and
 *     decode back to its NFC form, cut at added tokens as HF tokenizers cuts it
 *     (added tokens match the raw text; the stretches between are normalised);
 *     with Q3_ENCODE_SPECIAL_AS_TEXT no special token may come out;
 *   - as ids (little-endian 24-bit, a few past either end of the vocabulary):
 *     decode succeeds exactly when every id is a token, the streaming
 *     detokenizer always gives valid UTF-8 and agrees with decode. */
#include "fuzz_common.h"
#include "fuzz_tokenizer.h"

static const q3_tokenizer *tokenize_tok;
static fuzz_added tokenize_added[64];
static size_t tokenize_n_added;

static void tokenize_free(void) { q3_tokenizer_free((q3_tokenizer *)tokenize_tok); }

static const q3_tokenizer *tokenize_load(void)
{
    if (tokenize_tok) return tokenize_tok;
    const char *path = getenv("Q3_FUZZ_TOKENIZER");
    if (!path || !*path) path = "tests/data/golden/e2e/tokenizer.json";
    q3_tokenizer *t;
    if (q3_tokenizer_load(path, &t) != Q3_OK) {
        fprintf(stderr, "fuzz_tokenize: %s (run from the repository root)\n", q3_last_error());
        abort();
    }
    tokenize_tok = t;
    tokenize_n_added = fuzz_added_list(t, tokenize_added, 64);
    atexit(tokenize_free);
    return t;
}

static int fuzz_tokenize(const uint8_t *data, size_t size)
{
    const q3_tokenizer *tok = tokenize_load();
    const char *text = (const char *)data;
    int valid = fuzz_utf8_valid(text, size);
    /* no NFC oracle for marks Unicode 9.0 did not have (fuzz_has_post_unicode9_mark):
     * such text is still encoded and decoded and checked, only not compared */
    int oracle = valid && !fuzz_has_post_unicode9_mark(text, size);
    for (int special_as_text = 0; special_as_text <= 1; special_as_text++) {
        size_t el = 0;
        char *expect = oracle ? fuzz_expected_text(tokenize_added, tokenize_n_added, special_as_text, 1, text, size, &el)
                             : NULL;
        FUZZ_CHECK(!oracle || expect, "the oracle could not normalise the text");
        q3_status st = fuzz_check_encode(tok, text, size, special_as_text ? Q3_ENCODE_SPECIAL_AS_TEXT : 0, expect, el);
        if (valid) FUZZ_CHECK(st == Q3_OK, "valid UTF-8 does not encode: %s", q3_last_error());
        free(expect);
    }

    /* the bytes as ids */
    int32_t vocab = q3_tokenizer_vocab_size(tok);
    size_t n = size / 3;
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    for (size_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)data[3 * i] | (uint32_t)data[3 * i + 1] << 8 | (uint32_t)data[3 * i + 2] << 16;
        ids[i] = (int32_t)(v % (uint32_t)(vocab + 4)) - 2; /* -2 .. vocab + 1 */
    }
    size_t len = 0;
    free(fuzz_check_decode(tok, ids, n, &len));
    free(ids);
    return 0;
}

#ifndef FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_tokenize(data, size); }
#endif
