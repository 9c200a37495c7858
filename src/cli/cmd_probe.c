/* q3 probe: where each op of the prefill and decode graphs lands under each
 * compute-units policy, why ops fell back, and a short profiled run
 * (tools/probe.c does the work). */
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli.h"
#include "tools/defaults.h"
#include "cli/opts.h"
#include "q3.h"
#include "tools/probe.h"

int cmd_probe(int argc, char **argv)
{
    q3_probe_opts po = {.chunk = 128, .profile = 1};
    int threads = 0, no_profile = 0;
    const cli_opt tab[] = {
        CLI_OPT("model", 'm', CLI_FILE, &po.model, "PATH",
                "the model (default: the synthetic Qwen3-0.6B in the cache folder, as bench)"),
        CLI_OPT("threads", 't', CLI_INT, &threads, "N",
                "CPU threads of the profiled run (default: one per physical core, or $Q3_THREADS)", .lo = 1, .hi = 256),
        CLI_OPT("compute-units", 0, CLI_STR, &po.policy, "POLICY",
                "ref, cpu_only, cpu_and_gpu or all (default: each in turn)"),
        CLI_OPT("chunk", 0, CLI_INT, &po.chunk, "N", "prefill chunk of the graph (default 128)", .lo = 1, .hi = 4096),
        CLI_OPT("json", 0, CLI_FLAG, &po.json, NULL, "one JSON object (docs/probe.schema.json)"),
        CLI_OPT("no-profile", 0, CLI_FLAG, &no_profile, NULL, "no profiled run"),
        CLI_OPT("profile-ref", 0, CLI_FLAG, &po.profile_ref, NULL,
                "profile even when the matmuls of a big model land on the scalar reference unit"),
        {0},
    };
    cli_spec spec = {"probe", "q3 probe [-m MODEL] [-t N] [--compute-units POLICY] [--chunk N] [--json]",
                     "Places every op of the prefill and decode graphs under each compute-units policy,\n"
                     "says which unit refused which op and why, and profiles a short run.\n",
                     tab, 0, NULL};
    int rc = cli_parse(&spec, argc, argv, NULL);
    if (rc) return rc == CLI_HELP_SHOWN ? 0 : rc;
    po.profile = !no_profile;
    if (threads) { /* every unit this command opens takes it */
        char t[16];
        snprintf(t, sizeof t, "%d", threads);
        setenv("Q3_THREADS", t, 1);
    }
    if (po.policy && !q3_probe_policy_known(po.policy))
        return cli_usage_error("probe", "unknown policy '%.40s' (ref, cpu_only, cpu_and_gpu, all)", po.policy);
    if (!po.model && q3_default_model("probe", &po.model)) return cli_error("probe", "%s", q3_last_error());
    if (q3_probe_run(&po)) return cli_error("probe", "%s", q3_last_error());
    return 0;
}
