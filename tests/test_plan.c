/* The planner: a pure function of graph + units. Test units refuse in-graph
 * state mutation, lack a device, or lack a kernel for a dtype; the plan must
 * fall back op by op and say why. */
#include <string.h>

#include "backend/registry.h"
#include "graph/graph.h"
#include "plan/plan.h"
#include "plan/policy.h"
#include "q3.h"
#include "test.h"

/* like a neural accelerator: static shapes only, no state mutation in-graph */
static const char *npu_refuses(const q3_backend *b, const q3_graph *g, const q3_op *op)
{
    return op->mutates_state ? "refuses in-graph state mutation" : NULL;
}
static bool yes(const q3_backend *b) { return true; }
static bool no(const q3_backend *b) { return false; }
static q3_status nop(void *impl, const q3_exec *e, const q3_op *op) { return Q3_OK; }

/* admits everything but BF16 matmuls */
static const char *no_bf16(const q3_backend *b, const q3_graph *g, const q3_op *op)
{
    return op->weight && op->weight->dtype == Q3_BF16 && op->kind == Q3_OP_MATMUL ? "no kernel for BF16 weights"
                                                                                 : NULL;
}

static q3_backend npu = {.name = "npu", .device = "test accelerator", .present = yes, .refuses = npu_refuses, .run = nop};
static q3_backend gone = {.name = "gpu", .device = "absent", .present = no, .refuses = npu_refuses, .run = nop};
static q3_backend f32only = {.name = "f32only", .device = "test", .present = yes, .refuses = no_bf16, .run = nop};

int main(void)
{
    q3_model *m, *mb;
    CHECK(q3_model_open(TEST_DATA "/golden/tiny", &m) == Q3_OK, "%s", q3_last_error());
    CHECK(q3_model_open(TEST_DATA "/golden/small-bf16", &mb) == Q3_OK, "%s", q3_last_error());
    if (!m || !mb) TEST_DONE();
    q3_graph pre, dec;
    CHECK(q3_graph_build_prefill(m, 128, false, &pre) == Q3_OK, "prefill graph");
    CHECK(q3_graph_build_decode(m, 1, &dec) == Q3_OK, "decode graph");

    /* the IR: prefill mutates nothing; decode appends K/V once per layer */
    int mut_pre = 0, mut_dec = 0, appends = 0;
    for (int i = 0; i < pre.n_ops; i++) mut_pre += pre.ops[i].mutates_state;
    for (int i = 0; i < dec.n_ops; i++) {
        mut_dec += dec.ops[i].mutates_state;
        appends += dec.ops[i].kind == Q3_OP_KV_APPEND;
    }
    CHECK(mut_pre == 0, "prefill has %d mutating ops", mut_pre);
    CHECK(mut_dec == 2 && appends == 2, "decode: %d mutating ops, %d appends (2 layers)", mut_dec, appends);
    CHECK(!strcmp(pre.ops[1].name, "blk.0.attn_norm"), "op names per layer: %s", pre.ops[1].name);
    CHECK(pre.values[pre.v_logits].rows == 1, "prefill logits: last row only");
    CHECK(pre.values[pre.v_k[1]].rows == 128, "prefill outputs the chunk's K");

    /* an accelerator that refuses state mutation: prefill whole, decode falls back */
    const q3_backend *units[] = {&npu, &q3_backend_ref};
    q3_plan p;
    CHECK(q3_plan_graph(&pre, units, 2, &p) == Q3_OK, "plan prefill");
    CHECK(q3_plan_count_on(&p, 0) == pre.n_ops, "prefill all on npu: %d of %d", q3_plan_count_on(&p, 0), pre.n_ops);
    q3_plan_free(&p);
    CHECK(q3_plan_graph(&dec, units, 2, &p) == Q3_OK, "plan decode");
    CHECK(q3_plan_count_on(&p, 1) == 2, "decode: the 2 KV appends fall back, got %d", q3_plan_count_on(&p, 1));
    for (int i = 0; i < dec.n_ops; i++) {
        if (dec.ops[i].kind != Q3_OP_KV_APPEND) continue;
        CHECK(p.unit_of[i] == 1, "%s on ref", dec.ops[i].name);
        const char *why = p.refusal[(size_t)i * 2 + 0];
        CHECK(why && !strcmp(why, "refuses in-graph state mutation"), "reason: %s", why ? why : "(none)");
    }
    q3_plan_free(&p);

    /* an absent device takes nothing, and says so */
    const q3_backend *units2[] = {&gone, &q3_backend_ref};
    CHECK(q3_plan_graph(&pre, units2, 2, &p) == Q3_OK, "plan with absent gpu");
    CHECK(q3_plan_count_on(&p, 0) == 0, "nothing on the absent device");
    CHECK(p.refusal[0] && !strcmp(p.refusal[0], "device absent"), "reason: %s", p.refusal[0] ? p.refusal[0] : "-");
    q3_plan_free(&p);

    /* no unit at all for an op: a clear failure */
    const q3_backend *units3[] = {&npu};
    CHECK(q3_plan_graph(&dec, units3, 1, &p) == Q3_ERR_UNSUPPORTED, "decode on npu alone fails");
    CHECK_CONTAINS(q3_last_error(), "refuses in-graph state mutation");

    /* a dtype without a kernel falls back op by op: BF16 matmuls only */
    q3_graph preb;
    CHECK(q3_graph_build_prefill(mb, 16, false, &preb) == Q3_OK, "bf16 prefill graph");
    const q3_backend *units4[] = {&f32only, &q3_backend_ref};
    CHECK(q3_plan_graph(&preb, units4, 2, &p) == Q3_OK, "plan bf16");
    int matmuls = 0;
    for (int i = 0; i < preb.n_ops; i++) {
        bool mm = preb.ops[i].kind == Q3_OP_MATMUL;
        matmuls += mm;
        CHECK(p.unit_of[i] == (mm ? 1 : 0), "%s placed on %d", preb.ops[i].name, p.unit_of[i]);
    }
    CHECK(q3_plan_count_on(&p, 1) == matmuls && matmuls == 4 * 7 + 1, "%d matmuls fell back", matmuls);
    q3_plan_free(&p);

    /* policies resolve to this build's units; cuda is registered but absent here */
    const q3_policy *pol = q3_policy_find("all");
    CHECK(pol != NULL, "policy all");
    const q3_backend *u[Q3_PLAN_MAX_UNITS];
    int n = pol ? q3_policy_units(pol, u) : 0;
    CHECK(n >= 2 && u[n - 1] == &q3_backend_ref, "ref is the last resort");
    CHECK(q3_policy_find("nope") == NULL, "unknown policy");

    q3_graph_free(&preb);
    q3_graph_free(&pre);
    q3_graph_free(&dec);
    q3_model_close(m);
    q3_model_close(mb);
    TEST_DONE();
}
