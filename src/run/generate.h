/* The generation loop: prefill a prompt, then sample and decode token by
 * token, streaming text that is always whole UTF-8, until an end-of-turn
 * token, a stop string, the token limit, an interrupt, or a full context. */
#ifndef Q3_RUN_GENERATE_H
#define Q3_RUN_GENERATE_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "q3.h"
#include "text/sampler.h"
#include "text/tokenizer.h"

typedef enum q3_stop_reason {
    Q3_STOP_END_OF_TURN,  /* <|im_end|> or <|endoftext|> */
    Q3_STOP_STRING,       /* a user stop string appeared (it is not emitted) */
    Q3_STOP_LENGTH,       /* max_tokens generated */
    Q3_STOP_INTERRUPT,    /* *interrupt became non-zero */
    Q3_STOP_CONTEXT,      /* the session's context is full */
} q3_stop_reason;

typedef struct q3_gen_opts {
    int max_tokens;                      /* 0: until the context is full */
    const char *const *stop;             /* user stop strings */
    int n_stop;
    volatile sig_atomic_t *interrupt;    /* NULL or a flag a signal handler sets */
    /* text as it is made (id: the token that completed it; text is valid UTF-8) */
    void (*on_text)(void *user, int32_t id, const char *text, size_t len);
    void *user;
} q3_gen_opts;

typedef struct q3_gen_result {
    int32_t *ids;        /* generated ids, the end-of-turn token included if one ended it (caller frees) */
    int n_ids;
    int n_prompt;
    double prefill_s, decode_s;
    q3_stop_reason stop;
} q3_gen_result;

/* Runs prompt[0..n) through the session (which may already hold earlier
 * turns), then generates. A prompt that does not fit fails with
 * Q3_ERR_CONTEXT and changes nothing; a context that fills while generating
 * ends the answer with Q3_STOP_CONTEXT. */
q3_status q3_generate(q3_session *s, q3_sampler *smp, const q3_tokenizer *tok, const int32_t *prompt, size_t n,
                      const q3_gen_opts *o, q3_gen_result *r);

const char *q3_stop_reason_name(q3_stop_reason r);

#endif
