/* libFuzzer target: a tokenizer.json (q3_tokenizer_load).
 *
 * The input is written to a file preceded by enough spaces (JSON whitespace:
 * the meaning is unchanged) to make the file a whole number of pages, so that
 * the loader's mapping ends exactly at a page end and a read past the last byte
 * faults instead of reading the mapping's zero padding.
 *
 * A tokenizer that loads must be consistent:
 *   - every byte has a token (byte-level BPE needs all 256);
 *   - for each id with a token, looking its bytes up gives a token with the same
 *     bytes; special tokens are added tokens;
 *   - decoding all its ids (and streaming them) passes fuzz_check_decode;
 *   - a few fixed texts, and each token's own text, encode and decode back to
 *     themselves (in NFC, or as they are: the file may or may not ask for NFC),
 *     unless an added token with lstrip/rstrip could take whitespace. */
#include "fuzz_common.h"
#include "fuzz_tokenizer.h"

static const char *const tj_texts[] = {
    "Hello, world! 123 4567",
    "h\xc3\xa9llo \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80 e\xcc\x81",
    " \n\t  x  \r\n  ",
    "<|im_start|>user\nhi<|im_end|>\n<think>x</think>",
    "I'm you'LL 3.14 a-b_c",
};

static void tj_round_trip(const q3_tokenizer *tok, const fuzz_added *added, size_t n_added, const char *text,
                          size_t len)
{
    if (!fuzz_utf8_valid(text, len)) return;
    size_t el = 0, nl = 0;
    char *as_is = fuzz_expected_text(added, n_added, 1, 0, text, len, &el);
    char *nfc = fuzz_expected_text(added, n_added, 1, 1, text, len, &nl);
    q3_tokens toks = {0};
    q3_status st = q3_tokenizer_encode_append(tok, text, len, Q3_ENCODE_SPECIAL_AS_TEXT, &toks);
    if (st == Q3_OK) {
        size_t dl = 0;
        char *dec = fuzz_check_decode(tok, toks.ids, toks.n, &dl);
        FUZZ_CHECK(dec != NULL, "encode gave an id decode refuses");
        if (dec && as_is && nfc)
            FUZZ_CHECK((dl == el && !memcmp(dec, as_is, dl)) || (dl == nl && !memcmp(dec, nfc, dl)),
                       "decode(encode(\"%.*s\")) = \"%.*s\"", (int)len, text, (int)dl, dec);
        free(dec);
    } else {
        /* A hostile split regex may hit PCRE2's limits: a failure, never a crash. */
        FUZZ_CHECK_FAILURE(st);
        FUZZ_CHECK(toks.n == 0, "a failed encode left ids");
    }
    q3_tokens_free(&toks);
    free(as_is);
    free(nfc);
}

static int fuzz_tokenizer_json(const uint8_t *data, size_t size)
{
    size_t pad = (4096 - size % 4096) % 4096;
    char *buf = malloc(size + pad + 1);
    memset(buf, ' ', pad);
    if (size) memcpy(buf + pad, data, size);
    const char *path = fuzz_path("tokenizer_json", "tokenizer.json");
    fuzz_write(path, buf, size + pad);
    free(buf);

    q3_tokenizer *tok = NULL;
    q3_status st = q3_tokenizer_load(path, &tok);
    fuzz_note("q3_tokenizer_load", st);
    if (st != Q3_OK) {
        FUZZ_CHECK_FAILURE(st);
        FUZZ_CHECK(tok == NULL, "a failed load returned a tokenizer");
        return 0;
    }
    int32_t n = q3_tokenizer_vocab_size(tok);
    FUZZ_CHECK(n >= 256, "a byte-level vocabulary of %d ids", (int)n);
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        FUZZ_CHECK(q3_tokenizer_token_id(tok, &c, 1) >= 0, "no token for byte 0x%02x", b);
    }
    fuzz_added added[256];
    size_t n_added = fuzz_added_list(tok, added, 256);
    int strips = 0; /* lstrip/rstrip tokens eat whitespace: round trips are not exact then */
    for (size_t k = 0; k < n_added; k++) {
        char probe[600];
        if (added[k].n + 2 > sizeof probe) continue;
        probe[0] = ' ';
        memcpy(probe + 1, added[k].s, added[k].n);
        probe[added[k].n + 1] = ' ';
        q3_tokens t = {0};
        if (q3_tokenizer_encode_append(tok, probe, added[k].n + 2, 0, &t) == Q3_OK) {
            size_t dl = 0;
            char *dec = NULL;
            q3_tokenizer_decode(tok, t.ids, t.n, &dec, &dl);
            strips |= !dec || dl != added[k].n + 2;
            free(dec);
        }
        q3_tokens_free(&t);
    }

    int32_t *all = malloc(sizeof *all * (size_t)(n ? n : 1));
    size_t n_all = 0;
    for (int32_t id = 0; id < n; id++) {
        size_t len = 0;
        const char *s = q3_tokenizer_token_bytes(tok, id, &len);
        if (!s) {
            FUZZ_CHECK(!q3_tokenizer_is_added(tok, id), "added id %d without bytes", (int)id);
            continue;
        }
        all[n_all++] = id;
        FUZZ_CHECK(!q3_tokenizer_is_special(tok, id) || q3_tokenizer_is_added(tok, id), "special but not added");
        if (!len) continue;
        int32_t j = q3_tokenizer_token_id(tok, s, len);
        size_t jl = 0;
        const char *js = j >= 0 ? q3_tokenizer_token_bytes(tok, j, &jl) : NULL;
        FUZZ_CHECK(js && jl == len && !memcmp(js, s, len), "token %d: its bytes look up as %d", (int)id, (int)j);
        if (!strips && id < 2048) tj_round_trip(tok, added, n_added, s, len);
    }
    size_t dl = 0;
    free(fuzz_check_decode(tok, all, n_all, &dl));
    free(all);
    if (!strips)
        for (size_t i = 0; i < sizeof tj_texts / sizeof tj_texts[0]; i++)
            tj_round_trip(tok, added, n_added, tj_texts[i], strlen(tj_texts[i]));
    q3_tokenizer_free(tok);
    return 0;
}

#ifndef FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_tokenizer_json(data, size); }
#endif
