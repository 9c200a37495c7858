/* simple: open a model, chat one turn, stream the answer.
 *
 *   cc simple.c $(pkg-config --cflags --libs q3) -o simple
 *   ./simple MODEL "What is the capital of France?" [max_tokens]
 *
 * Greedy (temperature 0), without thinking, so the same model and prompt
 * always give the same answer: `q3 run -m MODEL -p PROMPT --temp 0 --no-think`
 * prints the same text. */
#include <q3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void print_text(void *user, const q3_text_piece *p)
{
    fwrite(p->text, 1, p->len, stdout);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL PROMPT [max_tokens]\n", argv[0]);
        return 2;
    }
    q3_model *model = NULL;
    q3_tokenizer *tok = NULL;
    q3_session *session = NULL;
    q3_sampler *sampler = NULL;
    int32_t *prompt = NULL;
    size_t n_prompt = 0;
    q3_gen_result result = {0};
    int rc = 1;

    if (q3_model_open(argv[1], &model) || q3_tokenizer_for_model(model, &tok) ||
        q3_session_new(model, NULL, &session))
        goto fail;

    /* the conversation, templated and tokenized (the message is plain text) */
    q3_chat_message turn = {.role = "user", .content = argv[2]};
    q3_chat_opts chat = {.add_generation_prompt = 1, .enable_thinking = 0};
    if (q3_chat_tokenize(tok, &turn, 1, &chat, &prompt, &n_prompt)) goto fail;

    q3_sampler_params sp = q3_sampler_defaults(0);
    sp.temperature = 0; /* greedy */
    if (q3_sampler_new(&sp, q3_model_vocab_size(model), &sampler)) goto fail;

    q3_gen_opts go = {.max_tokens = argc > 3 ? atoi(argv[3]) : 256, .on_text = print_text};
    if (q3_generate(session, sampler, tok, prompt, n_prompt, &go, &result)) goto fail;
    printf("\n[%d tokens, %s]\n", result.n_ids, q3_stop_reason_name(result.stop));
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "simple: %s\n", q3_last_error());
done:
    free(result.ids);
    free(prompt);
    q3_sampler_free(sampler);
    q3_session_free(session);
    q3_tokenizer_free(tok);
    q3_model_close(model);
    return rc;
}
