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
    int32_t *ids;        /* generated ids, the end-of-turn token included if one ended it (q3_generate: caller frees) */
    int n_ids;
    int n_prompt;
    double prefill_s, decode_s;
    q3_stop_reason stop;
} q3_gen_result;

/* Runs prompt[0..n) through the session (which may already hold earlier
 * turns), then generates. A prompt that does not fit fails with
 * Q3_ERR_CONTEXT and changes nothing; a context that fills while generating
 * ends the answer with Q3_STOP_CONTEXT. The loop of q3_gen_step over one
 * generator. */
q3_status q3_generate(q3_session *s, q3_sampler *smp, const q3_tokenizer *tok, const int32_t *prompt, size_t n,
                      const q3_gen_opts *o, q3_gen_result *r);

/* ---- step by step, many sequences at once ------------------------------------------ */

/* One sequence being generated: its prompt still to prefill, its sampler,
 * its streaming detokenizer and stop strings. Generators of one context
 * advance together, one q3_ctx_step at a time (q3_gen_step): each step
 * carries the decode row of every generator that is generating and the
 * next prefill chunk of the first one still prefilling. */
typedef struct q3_gen q3_gen;

/* A generator for sequence seq of c (which may already hold earlier turns).
 * smp, tok and the strings of o are borrowed: they must outlive it. */
q3_status q3_gen_new(q3_ctx *c, int seq, q3_sampler *smp, const q3_tokenizer *tok, const q3_gen_opts *o,
                     q3_gen **out);
void q3_gen_free(q3_gen *g);

/* Queues the prompt (copied): the next steps prefill it, then generation
 * starts. Q3_ERR_CONTEXT when it does not fit beside what the sequence
 * holds (at least one position must stay free to generate). */
q3_status q3_gen_prompt(q3_gen *g, const int32_t *prompt, size_t n);

/* One step for the generators gens[0..n) (all of one context; finished ones
 * are skipped). on_text callbacks run before it returns. A failed step
 * (Q3_ERR_NOMEM: the KV pool is full) changes no sequence; the caller may
 * finish a generator (q3_gen_cancel) and step again. */
q3_status q3_gen_step(q3_gen *const *gens, int n);

/* Ends a generator now with the given reason (text not yet emitted is dropped). */
void q3_gen_cancel(q3_gen *g, q3_stop_reason why);

/* 1 once the generator has stopped (its result is final). */
int q3_gen_done(const q3_gen *g);
/* 1 while the prompt is still being prefilled. */
int q3_gen_prefilling(const q3_gen *g);
/* The result so far (ids: owned by the generator, valid until it is freed). */
const q3_gen_result *q3_gen_result_get(const q3_gen *g);

const char *q3_stop_reason_name(q3_stop_reason r);

#endif
