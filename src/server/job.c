/* The job's life cycle (see job.h); no I/O, no libmicrohttpd. */
#include "job.h"

#include <stdlib.h>

#include "embed_api.h"

srv_job *srv_job_new(void)
{
    srv_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    pthread_mutex_init(&j->mu, NULL);
    j->refs = 1;
    j->st.fd = -1;
    return j;
}

void srv_job_ref(srv_job *j)
{
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_mutex_unlock(&j->mu);
}

/* An embed or rerank request's inputs and results (embed_api.h), freed with its job. */
void srv_embed_free(srv_embed_req *r)
{
    if (!r) return;
    for (int i = 0; r->ids && i < r->n; i++) free(r->ids[i]);
    for (int i = 0; r->docs && i < r->n; i++) free(r->docs[i]);
    free(r->ids);
    free(r->lens);
    free(r->docs);
    free(r->out);
    free(r);
}

void srv_job_unref(srv_job *j)
{
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left) return;
    free(j->req.prompt);
    free(j->req.bias);
    srv_embed_free(j->req.embed);
    q3_grammar_free(j->req.grammar);
    for (int i = 0; i < j->req.n_stop; i++) free(j->req.stop[i]);
    for (int i = 0; i < j->res.n_tool_calls; i++) {
        free(j->res.tool_calls[i].name);
        free(j->res.tool_calls[i].arguments);
    }
    free(j->res.lp);
    free(j->st.sse.data);
    free(j->res.content.data);
    free(j->res.reasoning.data);
    pthread_mutex_destroy(&j->mu);
    free(j);
}
