/* A session: one sequence of a context of its own (the single-stream
 * wrapper that run, chat and the benchmarks use). */
#ifndef Q3_RUN_SESSION_H
#define Q3_RUN_SESSION_H

#include "run/context.h"

struct q3_session {
    q3_ctx *ctx;
    int seq;
};

#endif
