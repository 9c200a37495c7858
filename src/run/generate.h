/* The generation loop: prefill a prompt, then sample and decode token by
 * token, streaming text that is always whole UTF-8, until an end-of-turn
 * token, a stop string, the token limit, an interrupt, or a full context.
 * Its API is public: include/q3.h (generation). */
#ifndef Q3_RUN_GENERATE_H
#define Q3_RUN_GENERATE_H

#include "q3.h"
#include "sample/sampler.h"
#include "text/tokenizer.h"

#endif
