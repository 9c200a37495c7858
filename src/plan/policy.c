#include "plan/policy.h"

#include <strings.h>

#include "backend/registry.h"

const q3_policy q3_policies[] = {
    {"ref", {"ref", NULL}, "the scalar reference unit alone (the oracle)"},
    {"cpu_only", {"cpu", "ref", NULL}, "SIMD CPU, reference CPU for what it refuses"},
    {"cpu_and_gpu", {"cuda", "cpu", "ref", NULL}, "GPU first, then the CPUs"},
    {"all", {"cuda", "cpu", "ref", NULL}, "every unit this build has"},
    {NULL, {NULL}, NULL},
};

const q3_policy *q3_policy_find(const char *name)
{
    for (int i = 0; q3_policies[i].name; i++)
        if (!strcasecmp(name, q3_policies[i].name)) return &q3_policies[i];
    return NULL;
}

int q3_policy_units(const q3_policy *p, const q3_backend **units)
{
    int n = 0;
    for (int i = 0; p->units[i] && n < Q3_PLAN_MAX_UNITS; i++) {
        const q3_backend *b = q3_backend_find(p->units[i]);
        if (b) units[n++] = b;
    }
    return n;
}
