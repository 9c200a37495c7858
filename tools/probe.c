/* q3 probe's work: where each op of the prefill and decode graphs lands under
 * each compute-units policy, why ops fell back, and a short profiled run. */
#include "tools/probe.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/registry.h"
#include "plan/policy.h"
#include "run/executor.h"
#include "util/error.h"

typedef q3_probe_opts probe_opts;

/* A unit admits a graph whole when it refuses none of its ops. */
static int refused_ops(const q3_plan *p, int u)
{
    int n = 0;
    for (int i = 0; i < p->n_ops; i++) n += p->refusal[(size_t)i * (size_t)p->n_units + (size_t)u] != NULL;
    return n;
}

static const char *first_reason(const q3_plan *p, int u)
{
    for (int i = 0; i < p->n_ops; i++) {
        const char *r = p->refusal[(size_t)i * (size_t)p->n_units + (size_t)u];
        if (r) return r;
    }
    return NULL;
}

static int matmuls_on_ref(const q3_graph *g, const q3_plan *p)
{
    for (int i = 0; i < g->n_ops; i++)
        if ((g->ops[i].kind == Q3_OP_MATMUL || g->ops[i].kind == Q3_OP_MATMUL_ID) && p->units[p->unit_of[i]] == &q3_backend_ref)
            return 1;
    return 0;
}

/* Runs the graph once with per-op timing; fills seconds by op kind and by unit. */
static q3_status profile_graph(const q3_graph *g, const q3_backend *const *units, int n_units, int steps,
                               double *by_kind, double *by_unit, double *total)
{
    q3_unit *inst[Q3_PLAN_MAX_UNITS] = {0};
    q3_runner r = {0};
    q3_kv_pool kv = {0};
    int32_t *tokens = NULL, *pos = NULL;
    const int32_t **table = NULL;
    int opened = 0, seq = 0;
    q3_status st = Q3_OK;
    for (; opened < n_units; opened++)
        if ((st = q3_unit_open(units[opened], NULL, &inst[opened]))) goto done;
    if ((st = q3_runner_init(&r, g, inst, n_units))) goto done;
    int ctx = g->rows + steps + 1;
    if ((st = q3_kv_pool_init(&kv, g->cfg, units[0]->kv_default, q3_kv_blocks_for(ctx), 1, ctx))) goto done;
    if ((st = q3_kv_seq_add(&kv, &seq)) || (st = q3_kv_seq_reserve(&kv, seq, ctx))) goto done;
    tokens = calloc((size_t)g->rows, sizeof *tokens);
    pos = calloc((size_t)g->rows, sizeof *pos);
    table = calloc((size_t)g->rows, sizeof *table);
    if (!tokens || !pos || !table) {
        st = q3_fail(Q3_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < g->rows; i++) {
        tokens[i] = (int32_t)((i * 7919) % g->cfg->vocab_size);
        pos[i] = i;
        table[i] = kv.seqs[seq].table;
    }
    if ((st = q3_runner_run(&r, tokens, g->rows, pos, &kv, table))) goto done; /* warm-up */
    if ((st = q3_runner_profile(&r, 1))) goto done;
    for (int s = 0; s < steps; s++) {
        if (g->kind == Q3_GRAPH_DECODE) pos[0] = s;
        if ((st = q3_runner_run(&r, tokens, g->rows, pos, &kv, table))) goto done;
    }
    *total = 0;
    for (int i = 0; i < g->n_ops; i++) {
        by_kind[g->ops[i].kind] += r.op_seconds[i] / steps;
        by_unit[r.plan.unit_of[i]] += r.op_seconds[i] / steps;
        *total += r.op_seconds[i] / steps;
    }
done:
    free(tokens);
    free(pos);
    free(table);
    q3_kv_pool_free(&kv);
    q3_runner_free(&r);
    for (int i = 0; i < opened; i++) q3_unit_close(inst[i]);
    return st;
}

static cJSON *probe_graph(const q3_graph *g, const char *gname, const q3_policy *pol, const probe_opts *po)
{
    cJSON *jg = cJSON_CreateObject();
    cJSON_AddStringToObject(jg, "graph", gname);
    cJSON_AddNumberToObject(jg, "rows", g->rows);
    cJSON_AddNumberToObject(jg, "n_ops", g->n_ops);
    const q3_backend *units[Q3_PLAN_MAX_UNITS];
    int n = q3_policy_units(pol, units);
    q3_plan p;
    if (q3_plan_graph(g, units, n, &p)) {
        cJSON_AddBoolToObject(jg, "admitted", 0);
        cJSON_AddStringToObject(jg, "reason", q3_last_error());
        if (!po->json) printf("  %-8s REJECTED: %s\n", gname, q3_last_error());
        return jg;
    }
    cJSON_AddBoolToObject(jg, "admitted", 1);
    if (!po->json) printf("  %-8s admitted (%d ops):", gname, g->n_ops);
    cJSON *jp = cJSON_AddObjectToObject(jg, "placement");
    for (int u = 0; u < n; u++) {
        int c = q3_plan_count_on(&p, u);
        cJSON_AddNumberToObject(jp, units[u]->name, c);
        if (!po->json && c) printf(" %d of %d on %s;", c, g->n_ops, units[u]->name);
    }
    if (!po->json) printf("\n");
    cJSON *ju = cJSON_AddArrayToObject(jg, "units");
    for (int u = 0; u < n; u++) {
        int refused = refused_ops(&p, u), asked = 0;
        for (int i = 0; i < p.n_ops; i++) asked += p.unit_of[i] >= u;
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "name", units[u]->name);
        cJSON_AddBoolToObject(x, "present", !units[u]->present || units[u]->present(units[u]));
        cJSON_AddNumberToObject(x, "refused_ops", refused);
        cJSON_AddBoolToObject(x, "admits_whole_graph", refused == 0 && asked == p.n_ops);
        if (refused) cJSON_AddStringToObject(x, "reason", first_reason(&p, u));
        cJSON_AddItemToArray(ju, x);
        if (!po->json && refused)
            printf("           %s refuses %d ops: %s\n", units[u]->name, refused, first_reason(&p, u));
        else if (!po->json && asked == p.n_ops)
            printf("           %s admits the whole %s graph\n", units[u]->name, gname);
    }
    /* by op kind: where each kind's ops landed and why each unit passed over them (the
       first reason per unit); the text lists the mixture-of-experts kinds */
    cJSON *jk = cJSON_AddArrayToObject(jg, "by_kind");
    for (int k = 0; k < Q3_OP_KIND_COUNT; k++) {
        int n_k = 0, on[Q3_PLAN_MAX_UNITS] = {0};
        const char *why[Q3_PLAN_MAX_UNITS] = {0};
        for (int i = 0; i < p.n_ops; i++) {
            if (g->ops[i].kind != (q3_op_kind)k) continue;
            n_k++;
            on[p.unit_of[i]]++;
            for (int u = 0; u < n; u++)
                if (!why[u]) why[u] = p.refusal[(size_t)i * (size_t)n + (size_t)u];
        }
        if (!n_k) continue;
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "kind", q3_op_kind_name((q3_op_kind)k));
        cJSON_AddNumberToObject(x, "ops", n_k);
        cJSON *xp = cJSON_AddObjectToObject(x, "placement"), *xr = cJSON_AddObjectToObject(x, "refusals");
        for (int u = 0; u < n; u++) {
            if (on[u]) cJSON_AddNumberToObject(xp, units[u]->name, on[u]);
            if (why[u]) cJSON_AddStringToObject(xr, units[u]->name, why[u]);
        }
        cJSON_AddItemToArray(jk, x);
        bool moe = k == Q3_OP_MATMUL_ID || k == Q3_OP_MOE_ROUTE || k == Q3_OP_MOE_SUM;
        if (po->json || !moe) continue;
        printf("           %-9s %3d ops:", q3_op_kind_name((q3_op_kind)k), n_k);
        const char *sep = " ";
        for (int u = 0; u < n; u++)
            if (on[u]) printf("%s%d on %s", sep, on[u], units[u]->name), sep = ", ";
        for (int u = 0; u < n; u++)
            if (why[u]) printf("; %s refuses: %s", units[u]->name, why[u]);
        printf("\n");
    }
    /* fallbacks: ops not on the policy's first present unit, grouped by kind and reason */
    int first = 0;
    while (first < n - 1 && units[first]->present && !units[first]->present(units[first])) first++;
    cJSON *jf = cJSON_AddArrayToObject(jg, "fallbacks");
    for (int i = 0; i < p.n_ops; i++) {
        if (p.unit_of[i] <= first) continue;
        const char *why = p.refusal[(size_t)i * (size_t)n + (size_t)first];
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "op", g->ops[i].name);
        cJSON_AddStringToObject(x, "kind", q3_op_kind_name(g->ops[i].kind));
        cJSON_AddStringToObject(x, "placed_on", units[p.unit_of[i]]->name);
        cJSON_AddStringToObject(x, "refused_by", units[first]->name);
        cJSON_AddStringToObject(x, "reason", why ? why : "");
        cJSON_AddItemToArray(jf, x);
    }
    if (!po->json) {
        int shown = 0;
        for (int i = 0; i < p.n_ops && shown < 6; i++) {
            if (p.unit_of[i] <= first) continue;
            printf("           fell back: %s (%s) -> %s: %s\n", g->ops[i].name, q3_op_kind_name(g->ops[i].kind),
                   units[p.unit_of[i]]->name, p.refusal[(size_t)i * (size_t)n + (size_t)first]);
            shown++;
        }
        int total = cJSON_GetArraySize(jf);
        if (total > shown) printf("           ... and %d more fallbacks\n", total - shown);
    }
    if (po->profile) {
        size_t params = 0;
        for (int i = 0; i < g->n_ops; i++)
            if (g->ops[i].weight) params += q3_tensor_numel(g->ops[i].weight);
        if (matmuls_on_ref(g, &p) && params > 50000000 && !po->profile_ref) {
            if (!po->json) printf("           profile: skipped (matmuls on the scalar reference unit; --profile-ref to run)\n");
        } else {
            double by_kind[Q3_OP_KIND_COUNT] = {0}, by_unit[Q3_PLAN_MAX_UNITS] = {0}, total = 0;
            int steps = g->kind == Q3_GRAPH_DECODE ? 8 : 1;
            if (!profile_graph(g, units, n, steps, by_kind, by_unit, &total)) {
                cJSON *jpr = cJSON_AddObjectToObject(jg, "profile");
                cJSON_AddNumberToObject(jpr, "ms_per_run", total * 1e3);
                cJSON *bk = cJSON_AddObjectToObject(jpr, "share_by_kind");
                cJSON *bu = cJSON_AddObjectToObject(jpr, "share_by_unit");
                if (!po->json) printf("           profile: %.2f ms per run; by op kind:", total * 1e3);
                for (int k = 0; k < Q3_OP_KIND_COUNT; k++)
                    if (by_kind[k] > 0) {
                        cJSON_AddNumberToObject(bk, q3_op_kind_name((q3_op_kind)k), by_kind[k] / total);
                        if (!po->json && by_kind[k] / total >= 0.005)
                            printf(" %s %.1f%%", q3_op_kind_name((q3_op_kind)k), 100 * by_kind[k] / total);
                    }
                if (!po->json) printf("\n           by unit:");
                for (int u = 0; u < n; u++)
                    if (by_unit[u] > 0) {
                        cJSON_AddNumberToObject(bu, units[u]->name, by_unit[u] / total);
                        if (!po->json) printf(" %s %.1f%%", units[u]->name, 100 * by_unit[u] / total);
                    }
                if (!po->json) printf("\n");
            }
        }
    }
    q3_plan_free(&p);
    return jg;
}

int q3_probe_policy_known(const char *name) { return q3_policy_find(name) != NULL; }

q3_status q3_probe_run(const q3_probe_opts *o)
{
    const probe_opts po = *o;
    const char *model = o->model, *policy = o->policy;
    q3_model *m;
    q3_status st = q3_model_open(model, &m);
    if (st) return st;
    q3_graph pre, dec;
    if ((st = q3_graph_build_prefill(m, po.chunk, false, &pre)) || (st = q3_graph_build_decode(m, 1, &dec))) {
        q3_model_close(m);
        return st;
    }
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "schema", "q3.probe/1");
    cJSON_AddStringToObject(root, "model", model);
    cJSON *jus = cJSON_AddArrayToObject(root, "units");
    cJSON_AddNumberToObject(root, "threads", q3_cpu_default_threads());
    cJSON_AddStringToObject(root, "cpu_kernels", q3_cpu_default_isa_name());
    if (!po.json)
        printf("q3 probe: %s\n%d thread%s, cpu kernels %s\ncompute units in this build:\n", model,
               q3_cpu_default_threads(), q3_cpu_default_threads() == 1 ? "" : "s", q3_cpu_default_isa_name());
    for (int i = 0; q3_backends[i]; i++) {
        const q3_backend *b = q3_backends[i];
        int present = !b->present || b->present(b);
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "name", b->name);
        cJSON_AddStringToObject(x, "device", b->device);
        cJSON_AddBoolToObject(x, "present", present);
        cJSON_AddItemToArray(jus, x);
        if (!po.json) printf("  %-6s %-45s %s\n", b->name, b->device, present ? "present" : "device absent");
    }
    cJSON *jps = cJSON_AddArrayToObject(root, "policies");
    for (int i = 0; q3_policies[i].name; i++) {
        const q3_policy *pol = &q3_policies[i];
        if (policy && pol != q3_policy_find(policy)) continue;
        if (!po.json) printf("\npolicy %s (%s)\n", pol->name, pol->about);
        cJSON *jp = cJSON_CreateObject();
        cJSON_AddStringToObject(jp, "policy", pol->name);
        cJSON *jgs = cJSON_AddArrayToObject(jp, "graphs");
        cJSON_AddItemToArray(jgs, probe_graph(&pre, "prefill", pol, &po));
        cJSON_AddItemToArray(jgs, probe_graph(&dec, "decode", pol, &po));
        cJSON_AddItemToArray(jps, jp);
    }
    if (po.json) {
        char *text = cJSON_Print(root);
        printf("%s\n", text);
        free(text);
    }
    cJSON_Delete(root);
    q3_graph_free(&pre);
    q3_graph_free(&dec);
    q3_model_close(m);
    return Q3_OK;
}
