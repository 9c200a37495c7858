#include "server/job.h"

#include <microhttpd.h>
#include <stdlib.h>

srv_job *srv_job_new(void)
{
    srv_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    pthread_mutex_init(&j->mu, NULL);
    j->refs = 1;
    j->fd = -1;
    return j;
}

void srv_job_ref(srv_job *j)
{
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_mutex_unlock(&j->mu);
}

void srv_job_unref(srv_job *j)
{
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left) return;
    free(j->prompt);
    for (int i = 0; i < j->n_stop; i++) free(j->stop[i]);
    for (int i = 0; i < j->n_tool_calls; i++) {
        free(j->tool_calls[i].name);
        free(j->tool_calls[i].arguments);
    }
    free(j->lp);
    free(j->sse.data);
    free(j->content.data);
    free(j->reasoning.data);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

void srv_job_wake(srv_job *j)
{
    if (j->suspended && j->conn) {
        j->suspended = 0;
        MHD_resume_connection(j->conn);
    }
}
