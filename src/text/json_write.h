/* JSON the way Python writes it.
 *
 * Qwen3's chat template serializes tools and tool-call arguments with
 * `tojson`, which Hugging Face transformers defines as
 * json.dumps(x, ensure_ascii=False): separators ", " and ": ", no newlines,
 * non-ASCII kept as UTF-8, key order kept, Python's number formatting.
 * This module reproduces that byte for byte from a cJSON tree.
 *
 * Numbers are the delicate part: Python keeps `5` (int) and `5.0` (float)
 * apart and prints integers of any size exactly, while cJSON keeps only a
 * double. q3_json_parse therefore remembers each number's source text, and
 * the writer uses it to tell integers from floats. */
#ifndef Q3_TEXT_JSON_WRITE_H
#define Q3_TEXT_JSON_WRITE_H

#include <stddef.h>
#include <cjson/cJSON.h>

#include "util/status.h"

/* Parses NUL-terminated JSON text (one value; trailing whitespace allowed,
 * anything else after it is an error). Each number node keeps its literal
 * source text in its otherwise unused `valuestring` (freed by cJSON_Delete),
 * so that q3_json_dumps writes `1.0` as `1.0` and 2^70 as all its digits.
 * On failure *out is NULL and the message names the line and column.
 * The caller frees *out with cJSON_Delete. */
q3_status q3_json_parse(const char *text, cJSON **out);

/* NUL in JSON text: cJSON keeps strings NUL-terminated, so a string holding
 * "\u0000" would silently end there ("abc\u0000def" read as "abc"). q3 refuses
 * such text instead: q3_json_parse fails (Q3_ERR_UNSUPPORTED, naming the line and
 * column) on a "\u0000" escape, and callers that hold a length check raw NUL bytes
 * with this. Returns the offset of the first raw NUL byte or "\u0000" escape
 * inside a string in text[0..len), or len if there is none. */
size_t q3_json_find_nul(const char *text, size_t len);

/* Writes item as Python's json.dumps(item, ensure_ascii=False) would:
 *   strings  "..." with \" \\ \b \f \n \r \t escaped, other control
 *            characters as \u00XX (lowercase hex), everything else as is;
 *   objects  {"k": v, "k2": v2}; a key given twice appears once, in its
 *            first position with its last value (as a Python dict keeps it);
 *   numbers  see q3_json_format_number.
 * *out is a NUL-terminated heap string the caller frees; *len (may be NULL)
 * gets its length. */
q3_status q3_json_dumps(const cJSON *item, char **out, size_t *len);

/* Python's text for a number node, into buf (NUL-terminated; 32 bytes always
 * suffice except for integer literals longer than that, which are cut to
 * fit). Returns the length it needed, like snprintf.
 *   - parsed by q3_json_parse: an integer literal (no '.', 'e', 'E') prints
 *     as Python's int would (all digits, "-0" as "0"); anything else as a float;
 *   - built in memory (no literal): an integral value within +-2^53 prints
 *     as an integer, anything else as a float.
 * Floats print as Python's repr: shortest text that reads back to the same
 * double, "1.0", "0.0001", "1e-05", "1e+16", "1.5e+300", and "NaN",
 * "Infinity", "-Infinity" as json.dumps writes them. */
int q3_json_format_number(const cJSON *number, char *buf, size_t cap);

/* Whether Python would hold this number node as an int (the rule above). */
int q3_json_number_is_int(const cJSON *number);

/* Python's repr(float(x)) ("1.0", "1e-05", "inf", "nan"); same buffer rules. */
int q3_json_format_double(double x, char *buf, size_t cap);

#endif
