/* q3 info's work (the command's options are src/cli/cmd_info.c). */
#ifndef Q3_TOOLS_INFO_H
#define Q3_TOOLS_INFO_H

#include "q3.h"

/* Opens the model at path and prints its config, parameter count, weight
 * bytes by dtype and KV-cache bytes per token to stdout: as text, or with
 * json as one JSON object (schema q3.info/1). Q3_OK, or the status of what
 * failed with q3_last_error() saying why. */
q3_status q3_info_print(const char *path, int json);

#endif
