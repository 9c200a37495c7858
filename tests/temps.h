/* Counting the temporary files an output left beside it (util/outfile.h
 * names them PATH.<hex>.tmp, or .q3-<hex>.tmp for very long names). */
#ifndef Q3_TEST_TEMPS_H
#define Q3_TEST_TEMPS_H

#include <dirent.h>
#include <stdio.h>
#include <string.h>

/* Entries in path's folder named BASE.*.tmp or .q3-*.tmp; -1 if the folder cannot be read. */
static int temps_beside(const char *path)
{
    char dir[512];
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    size_t bl = strlen(base);
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        int tmp = len > 4 && !strcmp(e->d_name + len - 4, ".tmp");
        if (tmp && ((len > bl + 1 && !strncmp(e->d_name, base, bl) && e->d_name[bl] == '.') ||
                    !strncmp(e->d_name, ".q3-", 4)))
            n++;
    }
    closedir(d);
    return n;
}

#endif
