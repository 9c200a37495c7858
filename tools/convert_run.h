/* q3 convert's work (the command's options are src/cli/cmd_convert.c). */
#ifndef Q3_TOOLS_CONVERT_RUN_H
#define Q3_TOOLS_CONVERT_RUN_H

#include "tools/convert.h"

/* Opens the model at path model and writes the GGUF out (tools/convert.c)
 * with the weights in type_name ("q4_k_m", ...; NULL: the model's own type),
 * the rest of o as given; progress on stderr unless quiet, one line on stdout
 * saying what was written. Q3_OK, or the status of what failed with
 * q3_last_error() saying why, and *usage 1 when type_name is not a type. */
q3_status q3_convert_run(const char *model, const char *out, const char *type_name, q3_convert_opts *o, int quiet,
                         int *usage);

#endif
