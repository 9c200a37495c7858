/* Compute-units policies, in the spirit of Core ML's CPU_ONLY / CPU_AND_GPU /
 * ALL, plus the reference unit alone: which units a plan may use, in order of
 * preference. The reference unit is always the last resort of a policy. */
#ifndef Q3_PLAN_POLICY_H
#define Q3_PLAN_POLICY_H

#include "plan/plan.h"

typedef struct q3_policy {
    const char *name;          /* "ref", "cpu_only", "cpu_and_gpu", "all" */
    const char *units[Q3_PLAN_MAX_UNITS]; /* unit names, preferred first, NULL-terminated */
    const char *about;
} q3_policy;

extern const q3_policy q3_policies[]; /* terminated by name == NULL */

const q3_policy *q3_policy_find(const char *name);
/* Resolves a policy's unit names to this build's units (unknown names are
 * skipped: a build without a unit simply lacks it). Returns the count. */
int q3_policy_units(const q3_policy *p, const q3_backend **units);

#endif
