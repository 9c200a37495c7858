/* Checks on parsed JSON that cJSON does not make. */
#ifndef Q3_UTIL_JSON_CHECK_H
#define Q3_UTIL_JSON_CHECK_H

#include <cjson/cJSON.h>

/* The first key that appears twice in one object anywhere in the tree under
 * root (cJSON keeps both and lookups find the first, while Python's json keeps
 * the last: a file with a repeated key means two things), or NULL if none.
 * The name points into the tree. O(n log n) in the members of each object. */
const char *q3_json_duplicate_key(const cJSON *root);

#endif
