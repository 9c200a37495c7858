/* Per-vocabulary tables of one byte class (class_table.h). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/class_table.h"
#include "util/error.h"

static pthread_mutex_t tables_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    const gvocab *v;
    gclass_table *t;
} tables[GCLASS_TABLES];
static int n_tables;

static void table_free(gclass_table *t)
{
    if (!t) return;
    free(t->in_cls);
    free(t->exits);
    free(t);
}

/* Grows a list of int32 pairs (byte, kid) by one; -1 out of memory. */
static int push(int32_t **a, size_t *n, size_t *cap, int32_t x, int32_t y)
{
    if (*n + 2 > *cap) {
        size_t c = *cap ? 2 * *cap : 1024;
        int32_t *p = realloc(*a, c * sizeof *p);
        if (!p) return -1;
        *a = p;
        *cap = c;
    }
    (*a)[(*n)++] = x;
    (*a)[(*n)++] = y;
    return 0;
}

static q3_status build(const gvocab *v, const gclass *cls, gclass_table **out)
{
    gclass_table *t = calloc(1, sizeof *t);
    size_t words = gvocab_mask_words(v);
    int32_t *stack = malloc((size_t)(v->n_nodes > 1 ? v->n_nodes : 1) * sizeof *stack);
    int32_t *found = NULL; /* (byte, kid) pairs */
    size_t n_found = 0, cap_found = 0;
    if (!t || !stack || !(t->in_cls = calloc(words, sizeof *t->in_cls))) goto oom;
    t->cls = *cls;
    int32_t n = 0;
    for (int32_t k = 0; k < v->n_root_kids; k++)
        if (gclass_has(cls, v->kids[k].lab)) {
            stack[n++] = k;
            if (1 + (int32_t)v->kids[k].below > t->max_len) t->max_len = 1 + (int32_t)v->kids[k].below;
        }
    int32_t nodes = 0;
    while (n) { /* each node's path is all in cls */
        const gkid *e = &v->kids[stack[--n]];
        if (++nodes > GCLASS_MAX_NODES || n_found / 2 > GCLASS_MAX_EXITS) goto none;
        if (gclass_subset(&v->unions[e->uni], cls)) { /* so is every token below */
            gvocab_mask_put(t->in_cls, e->rank_lo, e->rank_hi, 1);
            continue;
        }
        if (e->tok_rank >= 0) t->in_cls[e->tok_rank >> 6] |= 1ull << (e->tok_rank & 63);
        for (int32_t k = e->kids_lo; k < e->kids_hi; k++) {
            if (gclass_has(cls, v->kids[k].lab)) stack[n++] = k; /* a node is pushed once: n stays under n_nodes */
            else if (push(&found, &n_found, &cap_found, v->kids[k].lab, k)) goto oom;
        }
    }
    size_t n_exits = n_found / 2;
    if (n_exits > GCLASS_MAX_EXITS) goto none;
    t->exits = malloc((n_exits ? n_exits : 1) * sizeof *t->exits);
    if (!t->exits) goto oom;
    for (size_t i = 0; i < n_exits; i++) t->exit_lo[found[2 * i] + 1]++;
    for (int b = 0; b < 256; b++) t->exit_lo[b + 1] += t->exit_lo[b];
    int32_t fill[256];
    memcpy(fill, t->exit_lo, sizeof fill);
    for (size_t i = 0; i < n_exits; i++) t->exits[fill[found[2 * i]]++] = found[2 * i + 1];
    t->bytes = sizeof *t + words * sizeof *t->in_cls + n_exits * sizeof *t->exits;
    free(stack);
    free(found);
    *out = t;
    return Q3_OK;
none: /* no table: the answer is kept all the same */
    free(t->in_cls);
    t->in_cls = NULL;
    t->bytes = sizeof *t;
    free(stack);
    free(found);
    *out = t;
    return Q3_OK;
oom:
    free(stack);
    free(found);
    table_free(t);
    return q3_fail(Q3_ERR_NOMEM, "out of memory building a byte class's token table");
}

q3_status gclass_table_get(const gvocab *v, const gclass *cls, const gclass_table **out)
{
    *out = NULL;
    q3_status st = Q3_OK;
    pthread_mutex_lock(&tables_lock);
    for (int i = 0; i < n_tables; i++)
        if (tables[i].v == v && !memcmp(&tables[i].t->cls, cls, sizeof *cls)) {
            *out = tables[i].t->in_cls ? tables[i].t : NULL;
            pthread_mutex_unlock(&tables_lock);
            return Q3_OK;
        }
    if (n_tables < GCLASS_TABLES) {
        gclass_table *t = NULL;
        st = build(v, cls, &t);
        if (!st) {
            tables[n_tables].v = v;
            tables[n_tables].t = t;
            n_tables++;
            *out = t->in_cls ? t : NULL;
        }
    }
    pthread_mutex_unlock(&tables_lock);
    return st;
}
