/* libFuzzer target: a POST /v1/chat/completions body through srv_parse_chat
 * (the OpenAI request into a job: fields, sampling, tools, the conversation
 * rendered with Qwen3's template and tokenized). Checks: fuzz/fuzz_srv.h;
 * besides, an accepted chat's prompt decodes to text that starts a turn
 * ("<|im_start|>") and ends with the assistant's generation prompt. */
#include "fuzz_srv.h"

static int fuzz_srv_chat(const uint8_t *data, size_t size)
{
    srv_job *j = NULL;
    if (srv_fuzz_run(srv_parse_chat, SRV_CHAT, data, size, &j) || !j) return 0;
    char *text = NULL;
    size_t len = 0;
    q3_status st = q3_tokenizer_decode(j->req.tok, j->req.prompt, (size_t)j->req.n_prompt, &text, &len);
    FUZZ_CHECK(st == Q3_OK && text, "the prompt does not decode: %s", q3_last_error());
    if (text) {
        static const char *const ends[] = {"<|im_start|>assistant\n", "<|im_start|>assistant\n<think>\n\n</think>\n\n"};
        int ok = 0;
        for (int k = 0; k < 2; k++) {
            size_t n = strlen(ends[k]);
            ok |= len >= n && !memcmp(text + len - n, ends[k], n);
        }
        FUZZ_CHECK(!strncmp(text, "<|im_start|>", 12), "the prompt starts with \"%.40s\"", text);
        FUZZ_CHECK(ok, "the prompt ends with \"%s\"", len > 60 ? text + len - 60 : text);
    }
    free(text);
    srv_job_unref(j);
    return 0;
}

#ifndef FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_srv_chat(data, size); }
#endif
