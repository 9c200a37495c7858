#include "tools/files.h"

#include <stdio.h>

#include "util/file.h"
#include "util/outfile.h"

q3_status q3_tool_read_file(const char *path, size_t max_bytes, char **text, size_t *len)
{
    return q3_read_file(path, max_bytes, text, len);
}

q3_status q3_tool_read_stdin(size_t max_bytes, char **text, size_t *len)
{
    return q3_read_stream(stdin, "stdin", max_bytes, text, len);
}

q3_status q3_tool_output_check(const char *path) { return q3_outfile_check(path); }

q3_status q3_tool_write_file(const char *path, const void *data, size_t n)
{
    return q3_write_file_atomic(path, data, n);
}
