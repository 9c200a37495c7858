/* q3 info -m MODEL: config, parameters, weight bytes by dtype, KV bytes per
 * token (tools/info.c does the work). */
#include "cli/cli.h"
#include "cli/opts.h"
#include "q3.h"
#include "tools/info.h"

int cmd_info(int argc, char **argv)
{
    const char *path = NULL;
    int json = 0;
    const cli_opt tab[] = {
        CLI_OPT("model", 'm', CLI_FILE, &path, "PATH", "a Hugging Face folder or a .gguf", .flags = CLI_REQUIRED),
        CLI_OPT("json", 0, CLI_FLAG, &json, NULL, "print it as one JSON object (schema q3.info/1)"),
        {0},
    };
    cli_spec spec = {"info", "q3 info -m MODEL [--json]",
                     "Prints a model's config, parameter count, weight bytes by dtype and KV-cache bytes per token.\n",
                     tab, 0, NULL};
    int rc = cli_parse(&spec, argc, argv, NULL);
    if (rc) return rc == CLI_HELP_SHOWN ? 0 : rc;
    if (q3_info_print(path, json)) return cli_error("info", "%s", q3_last_error());
    return 0;
}
