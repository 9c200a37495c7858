/* q3 probe's work (the command's options are src/cli/cmd_probe.c): where each
 * op of the prefill and decode graphs lands under each compute-units policy,
 * which unit refused which op and why, and a short profiled run. */
#ifndef Q3_TOOLS_PROBE_H
#define Q3_TOOLS_PROBE_H

#include "q3.h"

typedef struct q3_probe_opts {
    const char *model;  /* a model folder or .gguf */
    const char *policy; /* one compute-units policy, or NULL: each in turn */
    int chunk;          /* prefill chunk of the graph */
    int json;           /* one JSON object (docs/probe.schema.json) instead of text */
    int profile;        /* a profiled run of each admitted graph */
    int profile_ref;    /* profile even when a big model's matmuls land on the reference unit */
} q3_probe_opts;

/* Whether name is a compute-units policy (ref, cpu_only, cpu_and_gpu, all). */
int q3_probe_policy_known(const char *name);

/* Opens the model and prints the probe to stdout. Q3_OK, or the status of
 * what failed with q3_last_error() saying why (nothing on stderr). */
q3_status q3_probe_run(const q3_probe_opts *o);

#endif
