/* batch: several prompts answered at once, one pass over the weights per step.
 *
 *   cc batch.c $(pkg-config --cflags --libs q3) -o batch
 *   ./batch MODEL "first prompt" "second prompt" ...
 *
 * Each prompt gets a sequence of one context and a generator; every step
 * decodes one token of each generating sequence (and prefills a chunk of a
 * newcomer). Greedy and without thinking: each answer is exactly what
 * `q3 run -m MODEL -p PROMPT --temp 0 --no-think -n 64` prints alone. */
#include <q3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PROMPTS 16

typedef struct answer {
    char text[8192];
    size_t len;
} answer;

static void collect(void *user, const q3_text_piece *p)
{
    answer *a = user;
    if (a->len + p->len < sizeof a->text) {
        memcpy(a->text + a->len, p->text, p->len);
        a->len += p->len;
    }
}

int main(int argc, char **argv)
{
    int n = argc - 2;
    if (n < 1 || n > MAX_PROMPTS) {
        fprintf(stderr, "usage: %s MODEL PROMPT... (1 to %d prompts)\n", argv[0], MAX_PROMPTS);
        return 2;
    }
    q3_model *model = NULL;
    q3_tokenizer *tok = NULL;
    q3_ctx *ctx = NULL;
    q3_sampler *samplers[MAX_PROMPTS] = {0};
    q3_gen *gens[MAX_PROMPTS] = {0};
    static answer answers[MAX_PROMPTS];
    int rc = 1;

    if (q3_model_open(argv[1], &model) || q3_tokenizer_for_model(model, &tok)) goto fail;
    q3_ctx_opts co = {.max_seqs = n, .n_ctx = 1024};
    if (q3_ctx_new(model, &co, &ctx)) goto fail;

    q3_sampler_params sp = q3_sampler_defaults(0);
    sp.temperature = 0;
    for (int i = 0; i < n; i++) {
        int seq;
        int32_t *prompt;
        size_t n_prompt;
        q3_chat_message turn = {.role = "user", .content = argv[2 + i]};
        q3_chat_opts chat = {.add_generation_prompt = 1, .enable_thinking = 0};
        q3_gen_opts go = {.max_tokens = 64, .on_text = collect, .user = &answers[i]};
        if (q3_seq_new(ctx, &seq) || q3_sampler_new(&sp, q3_model_vocab_size(model), &samplers[i]) ||
            q3_gen_new(ctx, seq, samplers[i], tok, &go, &gens[i]))
            goto fail;
        if (q3_chat_tokenize(tok, &turn, 1, &chat, &prompt, &n_prompt)) goto fail;
        q3_status st = q3_gen_prompt(gens[i], prompt, n_prompt);
        free(prompt);
        if (st) goto fail;
    }
    /* step until every answer is done */
    for (;;) {
        int live = 0;
        for (int i = 0; i < n; i++) live += !q3_gen_done(gens[i]);
        if (!live) break;
        if (q3_gen_step(gens, n)) goto fail;
    }
    for (int i = 0; i < n; i++) {
        const q3_gen_result *r = q3_gen_result_get(gens[i]);
        printf("[%d] %.*s\n[%d tokens, %s]\n", i, (int)answers[i].len, answers[i].text, r->n_ids,
               q3_stop_reason_name(r->stop));
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "batch: %s\n", q3_last_error());
done:
    for (int i = 0; i < n; i++) {
        q3_gen_free(gens[i]);
        q3_sampler_free(samplers[i]);
    }
    q3_ctx_free(ctx);
    q3_tokenizer_free(tok);
    q3_model_close(model);
    return rc;
}
