/* Tests for the Qwen3 chat template (src/text/chat_template.c) and the
 * Python-style JSON writer it uses (src/text/json_write.c).
 *
 * Expected renders come from the reference: Jinja2 3.1.6 configured as
 * Hugging Face transformers configures it (sandboxed, trim_blocks,
 * lstrip_blocks, tojson = json.dumps(ensure_ascii=False)), run on
 * tests/data/tokenizer/chat_template.jinja. Run from the repository root. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "temps.h"
#include "test.h"
#include "text/chat_template.h"
#include "text/json_write.h"
#include "util/error.h"
#include "util/file.h"

#define CHAT_JSONL TEST_DATA "/tokenizer/chat_public.jsonl"
#define TEMPLATE_JINJA TEST_DATA "/tokenizer/chat_template.jinja"
#define E2E_DIR TEST_DATA "/golden/e2e"

/* ---- helpers --------------------------------------------------------------- */

/* Renders JSON text; returns the status, *out the render (or NULL). */
static q3_status render_text(const char *json, char **out)
{
    cJSON *conv = NULL;
    *out = NULL;
    q3_status st = q3_json_parse(json, &conv);
    if (st != Q3_OK) return st;
    st = q3_chat_render(conv, out);
    cJSON_Delete(conv);
    return st;
}

/* Checks got == want, and on a mismatch says where they part. */
static void check_same(const char *what, const char *got, const char *want)
{
    if (!got) {
        CHECK(got != NULL, "%s: no render (%s)", what, q3_last_error());
        return;
    }
    size_t i = 0;
    while (got[i] && got[i] == want[i]) i++;
    CHECK(got[i] == want[i], "%s: differs at byte %zu:\n  got  \"%.60s\"\n  want \"%.60s\"", what, i,
          got + i, want + i);
}

/* ---- the public conversations ------------------------------------------------ */

static void test_public_conversations(void)
{
    char *data = NULL;
    size_t len = 0;
    q3_status st = q3_read_file(CHAT_JSONL, 1 << 24, &data, &len);
    CHECK(st == Q3_OK, "%s", q3_last_error());
    if (st != Q3_OK) return;
    int lines = 0;
    for (char *line = strtok(data, "\n"); line; line = strtok(NULL, "\n")) {
        char what[64];
        snprintf(what, sizeof what, "chat_public.jsonl line %d", ++lines);
        cJSON *conv = NULL;
        st = q3_json_parse(line, &conv);
        CHECK(st == Q3_OK, "%s: %s", what, q3_last_error());
        if (st != Q3_OK) continue;
        const cJSON *want = cJSON_GetObjectItemCaseSensitive(conv, "rendered");
        char *got = NULL;
        st = q3_chat_render(conv, &got);
        CHECK(st == Q3_OK, "%s: %s", what, q3_last_error());
        if (st == Q3_OK && cJSON_IsString(want)) check_same(what, got, want->valuestring);
        free(got);
        cJSON_Delete(conv);
    }
    CHECK(lines == 12, "expected 12 conversations, read %d", lines);
    free(data);
}

/* ---- hand-made edge cases ---------------------------------------------------- */

static const struct {
    const char *name, *input, *want;
} edge_cases[] = {
    {"tool turns in a row",
     "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris, Rome and Oslo?\"}, {\"role\": \"assistant\", \"content\": \"<think>\\nThree calls.\\n</think>\\n\\nChecking.\", \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}}, {\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}}, {\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}}]}, {\"role\": \"tool\", \"content\": \"18 C\"}, {\"role\": \"tool\", \"content\": \"24 C\"}, {\"role\": \"tool\", \"content\": \"6 C\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather for a city.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}], \"add_generation_prompt\": true}",
     "<|im_start|>system\n"
        "# Tools\n"
        "\n"
        "You may call one or more functions to assist with the user query.\n"
        "\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        "<tools>\n"
        "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather for a city.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}\n"
        "</tools>\n"
        "\n"
        "For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n"
        "<tool_call>\n"
        "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n"
        "Weather in Paris, Rome and Oslo?<|im_end|>\n"
        "<|im_start|>assistant\n"
        "<think>\n"
        "Three calls.\n"
        "</think>\n"
        "\n"
        "Checking.\n"
        "<tool_call>\n"
        "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
        "</tool_call>\n"
        "<tool_call>\n"
        "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n"
        "</tool_call>\n"
        "<tool_call>\n"
        "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n"
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n"
        "<tool_response>\n"
        "18 C\n"
        "</tool_response>\n"
        "<tool_response>\n"
        "24 C\n"
        "</tool_response>\n"
        "<tool_response>\n"
        "6 C\n"
        "</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"},
    {"reasoning_content in a multi-step tool chain",
     "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"What is 2^10 + 1?\"}, {\"role\": \"assistant\", \"content\": \"\", \"reasoning_content\": \"\\nNeed a power first.\\n\", \"tool_calls\": [{\"function\": {\"name\": \"pow\", \"arguments\": \"{\\\"a\\\": 2, \\\"b\\\": 10}\"}}]}, {\"role\": \"tool\", \"content\": \"1024\"}, {\"role\": \"assistant\", \"content\": \"\\n\\nNow add.\", \"reasoning_content\": \"Add one.\", \"tool_calls\": [{\"function\": {\"name\": \"add\", \"arguments\": {\"a\": 1024, \"b\": 1}}}]}, {\"role\": \"tool\", \"content\": \"1025\"}, {\"role\": \"assistant\", \"content\": \"1025.\", \"reasoning_content\": \"\"}], \"add_generation_prompt\": false}",
     "<|im_start|>system\n"
        "Be brief.<|im_end|>\n"
        "<|im_start|>user\n"
        "What is 2^10 + 1?<|im_end|>\n"
        "<|im_start|>assistant\n"
        "<think>\n"
        "Need a power first.\n"
        "</think>\n"
        "\n"
        "<tool_call>\n"
        "{\"name\": \"pow\", \"arguments\": {\"a\": 2, \"b\": 10}}\n"
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n"
        "<tool_response>\n"
        "1024\n"
        "</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
        "<think>\n"
        "Add one.\n"
        "</think>\n"
        "\n"
        "Now add.\n"
        "<tool_call>\n"
        "{\"name\": \"add\", \"arguments\": {\"a\": 1024, \"b\": 1}}\n"
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n"
        "<tool_response>\n"
        "1025\n"
        "</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
        "<think>\n"
        "\n"
        "</think>\n"
        "\n"
        "1025.<|im_end|>\n"},
    {"thinking stripped only before the last user query",
     "{\"messages\": [{\"role\": \"user\", \"content\": \"Q1\"}, {\"role\": \"assistant\", \"content\": \"<think>\\nT1\\n</think>\\n\\nA1\"}, {\"role\": \"user\", \"content\": \"Q2\"}, {\"role\": \"assistant\", \"content\": \"<think>\\nT2\\n</think>\\n\\nA2\"}, {\"role\": \"user\", \"content\": \"Q3\"}, {\"role\": \"assistant\", \"content\": \"<think>\\nT3\\n</think>\\n\\nA3\"}], \"add_generation_prompt\": false}",
     "<|im_start|>user\n"
        "Q1<|im_end|>\n"
        "<|im_start|>assistant\n"
        "A1<|im_end|>\n"
        "<|im_start|>user\n"
        "Q2<|im_end|>\n"
        "<|im_start|>assistant\n"
        "A2<|im_end|>\n"
        "<|im_start|>user\n"
        "Q3<|im_end|>\n"
        "<|im_start|>assistant\n"
        "<think>\n"
        "T3\n"
        "</think>\n"
        "\n"
        "A3<|im_end|>\n"},
    {"intermediate assistant without reasoning after the last query",
     "{\"messages\": [{\"role\": \"user\", \"content\": \"Go\"}, {\"role\": \"assistant\", \"content\": \"Calling.\", \"tool_calls\": [{\"name\": \"f\", \"arguments\": {}}]}, {\"role\": \"tool\", \"content\": \"ok\"}, {\"role\": \"assistant\", \"content\": \"Done.\"}], \"add_generation_prompt\": true}",
     "<|im_start|>user\n"
        "Go<|im_end|>\n"
        "<|im_start|>assistant\n"
        "Calling.\n"
        "<tool_call>\n"
        "{\"name\": \"f\", \"arguments\": {}}\n"
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n"
        "<tool_response>\n"
        "ok\n"
        "</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
        "<think>\n"
        "\n"
        "</think>\n"
        "\n"
        "Done.<|im_end|>\n"
        "<|im_start|>assistant\n"},
    {"enable_thinking false without a generation prompt",
     "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"add_generation_prompt\": false, \"enable_thinking\": false}",
     "<|im_start|>user\n"
        "Hi<|im_end|>\n"},
    {"enable_thinking true",
     "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"add_generation_prompt\": true, \"enable_thinking\": true}",
     "<|im_start|>user\n"
        "Hi<|im_end|>\n"
        "<|im_start|>assistant\n"},
    {"arguments as strings and as objects, numbers and escapes",
     "{\"messages\": [{\"role\": \"user\", \"content\": \"Do it.\"}, {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"function\": {\"name\": \"s\", \"arguments\": \"{\\\"raw\\\":   \\\"kept as is\\\"}\"}}, {\"function\": {\"name\": \"o\", \"arguments\": {\"f\": 1.0, \"small\": 1e-05, \"big\": 1e+20, \"int\": 12345678901234567890123, \"neg0\": -0.0, \"txt\": \"\303\251 \\\"q\\\" \\\\ \\t\\n\\u0001 \360\237\230\200\", \"nested\": {\"a\": [true, false, null], \"e\": {}}}}}, {\"function\": {\"name\": \"n\", \"arguments\": null}}, {\"function\": {\"name\": \"l\", \"arguments\": [1, \"two\"]}}]}, {\"role\": \"tool\", \"content\": \"done\"}], \"add_generation_prompt\": true}",
     "<|im_start|>user\n"
        "Do it.<|im_end|>\n"
        "<|im_start|>assistant\n"
        "<tool_call>\n"
        "{\"name\": \"s\", \"arguments\": {\"raw\":   \"kept as is\"}}\n"
        "</tool_call>\n"
        "<tool_call>\n"
        "{\"name\": \"o\", \"arguments\": {\"f\": 1.0, \"small\": 1e-05, \"big\": 1e+20, \"int\": 12345678901234567890123, \"neg0\": -0.0, \"txt\": \"\303\251 \\\"q\\\" \\\\ \\t\\n\\u0001 \360\237\230\200\", \"nested\": {\"a\": [true, false, null], \"e\": {}}}}\n"
        "</tool_call>\n"
        "<tool_call>\n"
        "{\"name\": \"n\", \"arguments\": null}\n"
        "</tool_call>\n"
        "<tool_call>\n"
        "{\"name\": \"l\", \"arguments\": [1, \"two\"]}\n"
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n"
        "<tool_response>\n"
        "done\n"
        "</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"},
    {"think tags: several closes, text before the open",
     "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", \"content\": \"<think>a</think>b</think>\\n\\nc\"}, {\"role\": \"assistant\", \"content\": \"pre<think>\\n\\nr1\\n\\n</think>\\n\\npost\"}, {\"role\": \"user\", \"content\": \"y\"}, {\"role\": \"assistant\", \"content\": \"lead\\n<think>r2</think>tail\"}], \"add_generation_prompt\": false}",
     "<|im_start|>user\n"
        "x<|im_end|>\n"
        "<|im_start|>assistant\n"
        "c<|im_end|>\n"
        "<|im_start|>assistant\n"
        "post<|im_end|>\n"
        "<|im_start|>user\n"
        "y<|im_end|>\n"
        "<|im_start|>assistant\n"
        "<think>\n"
        "r2\n"
        "</think>\n"
        "\n"
        "tail<|im_end|>\n"},
    {"empty reasoning_content keeps think tags in content",
     "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", \"content\": \"<think>r</think>c\", \"reasoning_content\": \"\"}], \"add_generation_prompt\": false}",
     "<|im_start|>user\n"
        "x<|im_end|>\n"
        "<|im_start|>assistant\n"
        "<think>\n"
        "\n"
        "</think>\n"
        "\n"
        "<think>r</think>c<|im_end|>\n"},
    {"null reasoning_content falls back to splitting",
     "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", \"content\": \"<think>r</think>c\", \"reasoning_content\": null}], \"add_generation_prompt\": false}",
     "<|im_start|>user\n"
        "x<|im_end|>\n"
        "<|im_start|>assistant\n"
        "<think>\n"
        "r\n"
        "</think>\n"
        "\n"
        "c<|im_end|>\n"},
    {"tool contents: null, numbers, booleans, missing",
     "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"tool\", \"content\": null}, {\"role\": \"tool\", \"content\": 3}, {\"role\": \"tool\", \"content\": 2.5}, {\"role\": \"tool\", \"content\": true}, {\"role\": \"tool\"}, {\"role\": \"tool\", \"content\": 1e-07}], \"add_generation_prompt\": false}",
     "<|im_start|>user\n"
        "x<|im_end|>\n"
        "<|im_start|>user\n"
        "<tool_response>\n"
        "None\n"
        "</tool_response>\n"
        "<tool_response>\n"
        "3\n"
        "</tool_response>\n"
        "<tool_response>\n"
        "2.5\n"
        "</tool_response>\n"
        "<tool_response>\n"
        "True\n"
        "</tool_response>\n"
        "<tool_response>\n"
        "\n"
        "</tool_response>\n"
        "<tool_response>\n"
        "1e-07\n"
        "</tool_response><|im_end|>\n"},
    {"tools with a system message, later system message",
     "{\"messages\": [{\"role\": \"system\", \"content\": \"S1\"}, {\"role\": \"user\", \"content\": \"u\"}, {\"role\": \"system\", \"content\": \"S2\"}, {\"role\": \"user\", \"content\": \"v\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather for a city.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}, {\"name\": \"bare\", \"n\": [1, 2.0]}], \"add_generation_prompt\": true}",
     "<|im_start|>system\n"
        "S1\n"
        "\n"
        "# Tools\n"
        "\n"
        "You may call one or more functions to assist with the user query.\n"
        "\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        "<tools>\n"
        "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather for a city.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}\n"
        "{\"name\": \"bare\", \"n\": [1, 2.0]}\n"
        "</tools>\n"
        "\n"
        "For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n"
        "<tool_call>\n"
        "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n"
        "u<|im_end|>\n"
        "<|im_start|>system\n"
        "S2<|im_end|>\n"
        "<|im_start|>user\n"
        "v<|im_end|>\n"
        "<|im_start|>assistant\n"},
    {"tool call without function wrapper, and empty function",
     "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", \"content\": \"c\", \"tool_calls\": [{\"name\": \"direct\", \"arguments\": {\"k\": \"v\"}}, {\"function\": {}, \"name\": \"fallback\", \"arguments\": \"{}\"}, {\"function\": {\"name\": null, \"arguments\": \"1\"}}, {\"function\": {\"arguments\": \"2\"}}]}], \"add_generation_prompt\": false}",
     "<|im_start|>user\n"
        "x<|im_end|>\n"
        "<|im_start|>assistant\n"
        "<think>\n"
        "\n"
        "</think>\n"
        "\n"
        "c\n"
        "<tool_call>\n"
        "{\"name\": \"direct\", \"arguments\": {\"k\": \"v\"}}\n"
        "</tool_call>\n"
        "<tool_call>\n"
        "{\"name\": \"fallback\", \"arguments\": {}}\n"
        "</tool_call>\n"
        "<tool_call>\n"
        "{\"name\": \"None\", \"arguments\": 1}\n"
        "</tool_call>\n"
        "<tool_call>\n"
        "{\"name\": \"\", \"arguments\": 2}\n"
        "</tool_call><|im_end|>\n"},
    {"user turn wrapping a tool response is not a query",
     "{\"messages\": [{\"role\": \"user\", \"content\": \"real question\"}, {\"role\": \"assistant\", \"content\": \"<think>\\nkeep me\\n</think>\\n\\ncalling\", \"tool_calls\": [{\"function\": {\"name\": \"t\", \"arguments\": {}}}]}, {\"role\": \"user\", \"content\": \"<tool_response>\\nresult\\n</tool_response>\"}, {\"role\": \"assistant\", \"content\": \"<think>\\nand me\\n</think>\\n\\nanswer\"}], \"add_generation_prompt\": false}",
     "<|im_start|>user\n"
        "real question<|im_end|>\n"
        "<|im_start|>assistant\n"
        "<think>\n"
        "keep me\n"
        "</think>\n"
        "\n"
        "calling\n"
        "<tool_call>\n"
        "{\"name\": \"t\", \"arguments\": {}}\n"
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n"
        "<tool_response>\n"
        "result\n"
        "</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
        "<think>\n"
        "and me\n"
        "</think>\n"
        "\n"
        "answer<|im_end|>\n"},
    {"no user at all",
     "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"assistant\", \"content\": \"<think>t</think>a\"}], \"add_generation_prompt\": true, \"enable_thinking\": false}",
     "<|im_start|>system\n"
        "s<|im_end|>\n"
        "<|im_start|>assistant\n"
        "a<|im_end|>\n"
        "<|im_start|>assistant\n"
        "<think>\n"
        "\n"
        "</think>\n"
        "\n"},
    {"final assistant: empty content with tool calls",
     "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1}}}]}], \"add_generation_prompt\": false}",
     "<|im_start|>user\n"
        "x<|im_end|>\n"
        "<|im_start|>assistant\n"
        "<think>\n"
        "\n"
        "</think>\n"
        "\n"
        "<tool_call>\n"
        "{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n"
        "</tool_call><|im_end|>\n"},
    {"tool message first",
     "{\"messages\": [{\"role\": \"tool\", \"content\": \"orphan\"}, {\"role\": \"user\", \"content\": \"x\"}], \"add_generation_prompt\": true}",
     "<|im_start|>user\n"
        "<tool_response>\n"
        "orphan\n"
        "</tool_response><|im_end|>\n"
        "<|im_start|>user\n"
        "x<|im_end|>\n"
        "<|im_start|>assistant\n"},
    {"empty tools list means no tools",
     "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", \"content\": \"x\"}], \"tools\": [], \"add_generation_prompt\": true}",
     "<|im_start|>system\n"
        "s<|im_end|>\n"
        "<|im_start|>user\n"
        "x<|im_end|>\n"
        "<|im_start|>assistant\n"},
    {"duplicate keys: the last value wins, in the first place",
     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"content\":\"dup\"}],\"tools\":[{\"a\":1,\"b\":2.0,\"a\":[3, 4.50]}],\"add_generation_prompt\":false}",
     "<|im_start|>system\n"
        "# Tools\n"
        "\n"
        "You may call one or more functions to assist with the user query.\n"
        "\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        "<tools>\n"
        "{\"a\": [3, 4.5], \"b\": 2.0}\n"
        "</tools>\n"
        "\n"
        "For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n"
        "<tool_call>\n"
        "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n"
        "dup<|im_end|>\n"},
    {"bare messages array",
     "[{\"role\":\"user\",\"content\":\"hello\"}]",
     "<|im_start|>user\n"
        "hello<|im_end|>\n"
        "<|im_start|>assistant\n"},
};

static void test_edge_cases(void)
{
    for (size_t i = 0; i < sizeof edge_cases / sizeof edge_cases[0]; i++) {
        char *got = NULL;
        q3_status st = render_text(edge_cases[i].input, &got);
        CHECK(st == Q3_OK, "%s: %s", edge_cases[i].name, q3_last_error());
        if (st == Q3_OK) check_same(edge_cases[i].name, got, edge_cases[i].want);
        free(got);
    }
}

/* The explicit-options entry point, on a tree built in memory. */
static void test_render_messages_api(void)
{
    cJSON *messages = cJSON_CreateArray();
    cJSON *user = cJSON_CreateObject();
    cJSON_AddStringToObject(user, "role", "user");
    cJSON_AddStringToObject(user, "content", "Hi");
    cJSON_AddItemToArray(messages, user);
    cJSON *tool = cJSON_CreateObject();
    cJSON_AddStringToObject(tool, "role", "tool");
    cJSON_AddNumberToObject(tool, "content", 2.5);
    cJSON_AddItemToArray(messages, tool);
    cJSON *tools = cJSON_CreateArray();
    cJSON *schema = cJSON_CreateObject();
    cJSON_AddNumberToObject(schema, "int", 3);
    cJSON_AddNumberToObject(schema, "float", 0.5);
    cJSON_AddNumberToObject(schema, "huge", 1e300);
    cJSON_AddItemToArray(tools, schema);

    char *got = NULL;
    q3_status st = q3_chat_render_messages(messages, NULL, NULL, &got);
    CHECK(st == Q3_OK, "%s", q3_last_error());
    if (got)
        check_same("defaults", got,
                   "<|im_start|>user\nHi<|im_end|>\n<|im_start|>user\n<tool_response>\n2.5\n"
                   "</tool_response><|im_end|>\n<|im_start|>assistant\n");
    free(got);

    q3_chat_options no_think = {.add_generation_prompt = 1, .enable_thinking = 0};
    st = q3_chat_render_messages(messages, tools, &no_think, &got);
    CHECK(st == Q3_OK, "%s", q3_last_error());
    if (got) {
        CHECK_CONTAINS(got, "<tools>\n{\"int\": 3, \"float\": 0.5, \"huge\": 1e+300}\n</tools>");
        size_t n = strlen(got);
        const char *tail = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
        CHECK(n > strlen(tail) && !strcmp(got + n - strlen(tail), tail), "tail: %s", got);
    }
    free(got);
    cJSON_Delete(messages);
    cJSON_Delete(tools);
}

/* ---- bad inputs ------------------------------------------------------------- */

static void test_bad_inputs(void)
{
    static const struct {
        const char *input;
        q3_status status;
        const char *message; /* a part of the error message */
    } bad[] = {
        {"{\"messages\": [{\"role\": \"developer\", \"content\": \"x\"}]}", Q3_ERR_INVALID,
         "unknown role \"developer\""},
        {"[{\"content\": \"x\"}]", Q3_ERR_INVALID, "messages[0]: \"role\" must be a string, not missing"},
        {"[{\"role\": 7, \"content\": \"x\"}]", Q3_ERR_INVALID, "\"role\" must be a string, not a number"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}", Q3_ERR_FORMAT, "JSON syntax error at line 1"},
        {"not json", Q3_ERR_FORMAT, "JSON syntax error"},
        {"", Q3_ERR_FORMAT, "empty input"},
        {"{\"messages\": {\"role\": \"user\"}}", Q3_ERR_INVALID, "messages must be an array, not an object"},
        {"{\"messages\": \"hi\"}", Q3_ERR_INVALID, "messages must be an array, not a string"},
        {"{\"prompt\": \"hi\"}", Q3_ERR_INVALID, "no \"messages\""},
        {"\"hi\"", Q3_ERR_INVALID, "a conversation is an object"},
        {"[]", Q3_ERR_INVALID, "messages is empty"},
        {"[\"hi\"]", Q3_ERR_INVALID, "messages[0] must be an object, not a string"},
        {"[{\"role\": \"user\", \"content\": null}]", Q3_ERR_INVALID,
         "messages[0] (user): content must be a string, not null"},
        {"[{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"x\"}]}]", Q3_ERR_INVALID,
         "content must be a string, not an array"},
        {"[{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\"}]", Q3_ERR_INVALID,
         "messages[1] (assistant): content must be a string, not missing (use \"\""},
        {"[{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", \"content\": null, "
         "\"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": {}}}]}]",
         Q3_ERR_INVALID, "content must be a string, not null"},
        {"[{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"tool\", \"content\": {\"a\": 1}}]",
         Q3_ERR_UNSUPPORTED, "messages[1] (tool): content is an object"},
        {"[{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", \"content\": \"\", "
         "\"tool_calls\": [{\"function\": {\"name\": \"f\"}}]}]",
         Q3_ERR_INVALID, "messages[1].tool_calls[0] has no \"arguments\""},
        {"[{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", \"content\": \"\", "
         "\"tool_calls\": {\"name\": \"f\"}}]",
         Q3_ERR_INVALID, "tool_calls must be an array, not an object"},
        {"[{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", \"content\": \"\", "
         "\"tool_calls\": [\"f\"]}]",
         Q3_ERR_INVALID, "tool_calls[0] must be an object, not a string"},
        {"[{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", \"content\": \"\", "
         "\"reasoning_content\": 5}]",
         Q3_ERR_INVALID, "reasoning_content must be a string, not a number"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": {}}", Q3_ERR_INVALID,
         "tools must be an array or null, not an object"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"add_generation_prompt\": \"yes\"}",
         Q3_ERR_INVALID, "add_generation_prompt must be true, false or null, not a string"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"enable_thinking\": 0}",
         Q3_ERR_INVALID, "enable_thinking must be true, false or null, not a number"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *got = NULL;
        q3_clear_error();
        q3_status st = render_text(bad[i].input, &got);
        CHECK(st == bad[i].status, "input %s: status %s, want %s", bad[i].input, q3_status_name(st),
              q3_status_name(bad[i].status));
        CHECK(got == NULL, "input %s rendered", bad[i].input);
        CHECK_CONTAINS(q3_last_error(), bad[i].message);
        free(got);
    }
    /* The C entry points refuse NULL without crashing. */
    char *got = NULL;
    CHECK(q3_chat_render(NULL, &got) == Q3_ERR_INVALID && !got, "NULL conversation");
    CHECK(q3_chat_render_messages(NULL, NULL, NULL, &got) == Q3_ERR_INVALID && !got, "NULL messages");
}

/* ---- JSON writing ------------------------------------------------------------ */

static void test_json_write(void)
{
    /* input -> json.dumps(json.loads(input), ensure_ascii=False) */
    static const char *pairs[][2] = {
        {"{\"a\":1,\"b\":[true,false,null],\"c\":{}}", "{\"a\": 1, \"b\": [true, false, null], \"c\": {}}"},
        {"[1, 1.0, -0, -0.0, 1e5, 1E-5, 0.0001, 1e16, 1e15, 123456789012345678901234567890]",
         "[1, 1.0, 0, -0.0, 100000.0, 1e-05, 0.0001, 1e+16, 1000000000000000.0, "
         "123456789012345678901234567890]"},
        {"[0.1, 0.30000000000000004, 1.7976931348623157e308, 5e-324, 2.5e-7, 1e400, -1e400]",
         "[0.1, 0.30000000000000004, 1.7976931348623157e+308, 5e-324, 2.5e-07, Infinity, -Infinity]"},
        {"\"\\u0000x\\u0001\\u001f\\u007f\\b\\f\\n\\r\\t\\\"\\\\/\"", "\"\""}, /* see below */
        {"\"é 中文 😀 \\u2028\"", "\"é 中文 😀 \u2028\""},
        {"{\"k\":1,\"j\":2,\"k\":3}", "{\"k\": 3, \"j\": 2}"},
        {"{\"\\n\":\"key escaped\"}", "{\"\\n\": \"key escaped\"}"},
        {"  [ ]  ", "[]"},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        if (i == 3) continue; /* cJSON ends a string at \u0000; checked separately */
        cJSON *v = NULL;
        char *text = NULL;
        q3_status st = q3_json_parse(pairs[i][0], &v);
        CHECK(st == Q3_OK, "%s: %s", pairs[i][0], q3_last_error());
        if (st != Q3_OK) continue;
        st = q3_json_dumps(v, &text, NULL);
        CHECK(st == Q3_OK, "%s", q3_last_error());
        if (text) check_same(pairs[i][0], text, pairs[i][1]);
        free(text);
        cJSON_Delete(v);
    }
    /* Control characters: the short escapes where JSON has them, \u00XX
     * (lowercase) otherwise; DEL and '/' as they are. */
    cJSON *s = cJSON_CreateString("\x01\x1f\x7f\b\f\n\r\t\"\\/\x1b");
    char *text = NULL;
    CHECK(q3_json_dumps(s, &text, NULL) == Q3_OK, "%s", q3_last_error());
    if (text) check_same("control characters", text, "\"\\u0001\\u001f\x7f\\b\\f\\n\\r\\t\\\"\\\\/\\u001b\"");
    free(text);
    cJSON_Delete(s);

    /* Numbers built in memory (no literal): integral values as integers. */
    char buf[64];
    cJSON *n = cJSON_CreateNumber(42);
    q3_json_format_number(n, buf, sizeof buf);
    CHECK(!strcmp(buf, "42"), "%s", buf);
    n->valuedouble = 1e17; /* beyond 2^53: a float, as Python would hold it */
    q3_json_format_number(n, buf, sizeof buf);
    CHECK(!strcmp(buf, "1e+17"), "%s", buf);
    cJSON_Delete(n);

    /* A literal that no longer matches the value is not used. */
    cJSON *v = NULL;
    CHECK(q3_json_parse("7", &v) == Q3_OK, "%s", q3_last_error());
    cJSON_SetNumberValue(v, 7.25);
    q3_json_format_number(v, buf, sizeof buf);
    CHECK(!strcmp(buf, "7.25"), "%s", buf);
    cJSON_Delete(v);

    static const struct {
        double x;
        const char *repr;
    } reprs[] = {{1, "1.0"}, {-2.5, "-2.5"}, {1e-5, "1e-05"}, {1e22, "1e+22"}, {123456.789, "123456.789"},
                 {9007199254740993.0, "9007199254740992.0"}, {0.0, "0.0"}, {1.0 / 0.0, "inf"}};
    for (size_t i = 0; i < sizeof reprs / sizeof reprs[0]; i++) {
        q3_json_format_double(reprs[i].x, buf, sizeof buf);
        CHECK(!strcmp(buf, reprs[i].repr), "repr(%g) = %s, want %s", reprs[i].x, buf, reprs[i].repr);
    }
}

/* ---- template recognition ------------------------------------------------------ */

static int write_file(const char *path, const char *text, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    int ok = fwrite(text, 1, len, f) == len;
    return fclose(f) == 0 && ok;
}

static void test_template_recognition(void)
{
    char *tmpl = NULL;
    size_t len = 0;
    q3_status st = q3_read_file(TEMPLATE_JINJA, 1 << 20, &tmpl, &len);
    CHECK(st == Q3_OK, "%s", q3_last_error());
    if (st != Q3_OK) return;

    CHECK(q3_chat_template_is_qwen3(tmpl), "the real template is not recognised");
    CHECK(q3_chat_template_identify(tmpl, len) == Q3_CHAT_TEMPLATE_QWEN3, "identify");
    CHECK(!strcmp(q3_chat_template_name(Q3_CHAT_TEMPLATE_QWEN3), "qwen3"), "name");
    CHECK(!q3_chat_template_is_qwen3(NULL) && !q3_chat_template_is_qwen3(""), "NULL or empty");
    CHECK(q3_chat_template_identify(tmpl, len - 1) == Q3_CHAT_TEMPLATE_UNKNOWN, "a byte short");

    /* One character changed (same length): not Qwen3's any more. */
    char *modified = strdup(tmpl);
    char *at = strstr(modified, "<think>\\n\\n</think>");
    CHECK(at != NULL, "the template has an empty think block");
    if (at) at[1] = 'T';
    CHECK(!q3_chat_template_is_qwen3(modified), "a modified template is recognised");

    /* Loading: the e2e model folder, its tokenizer_config.json, the .jinja file. */
    q3_chat_template_kind kind = Q3_CHAT_TEMPLATE_UNKNOWN;
    st = q3_chat_template_load(E2E_DIR, &kind);
    CHECK(st == Q3_OK && kind == Q3_CHAT_TEMPLATE_QWEN3, "folder: %s", q3_last_error());
    kind = Q3_CHAT_TEMPLATE_UNKNOWN;
    st = q3_chat_template_load(E2E_DIR "/tokenizer_config.json", &kind);
    CHECK(st == Q3_OK && kind == Q3_CHAT_TEMPLATE_QWEN3, "config: %s", q3_last_error());
    kind = Q3_CHAT_TEMPLATE_UNKNOWN;
    st = q3_chat_template_load(TEMPLATE_JINJA, &kind);
    CHECK(st == Q3_OK && kind == Q3_CHAT_TEMPLATE_QWEN3, "jinja: %s", q3_last_error());

    /* Unknown, missing and named templates, in a scratch folder. */
    char dir[600];
    snprintf(dir, sizeof dir, "%s/chat", test_tmpdir());
    CHECK(mkdir(dir, 0700) == 0, "mkdir %s", dir);
    char config[700], jinja[700];
    snprintf(config, sizeof config, "%s/tokenizer_config.json", dir);
    snprintf(jinja, sizeof jinja, "%s/chat_template.jinja", dir);

    cJSON *cfg = cJSON_CreateObject();
    cJSON_AddStringToObject(cfg, "chat_template", modified);
    char *cfg_text = cJSON_Print(cfg);
    CHECK(write_file(config, cfg_text, strlen(cfg_text)), "write %s", config);
    st = q3_chat_template_load(dir, &kind);
    CHECK(st == Q3_ERR_UNSUPPORTED && kind == Q3_CHAT_TEMPLATE_UNKNOWN, "modified: %s", q3_status_name(st));
    CHECK_CONTAINS(q3_last_error(), "tokenizer_config.json: the chat template (4116 bytes");
    CHECK_CONTAINS(q3_last_error(), "is not one q3 knows");
    free(cfg_text);

    /* chat_template.jinja takes precedence over tokenizer_config.json. */
    CHECK(write_file(jinja, tmpl, len), "write %s", jinja);
    st = q3_chat_template_load(dir, &kind);
    CHECK(st == Q3_OK && kind == Q3_CHAT_TEMPLATE_QWEN3, "jinja in folder: %s", q3_last_error());
    unlink(jinja);

    /* A list of named templates: the "default" one counts. */
    cJSON_DeleteItemFromObject(cfg, "chat_template");
    cJSON *list = cJSON_AddArrayToObject(cfg, "chat_template");
    cJSON *tool_use = cJSON_CreateObject(), *dflt = cJSON_CreateObject();
    cJSON_AddStringToObject(tool_use, "name", "tool_use");
    cJSON_AddStringToObject(tool_use, "template", "{{ messages }}");
    cJSON_AddStringToObject(dflt, "name", "default");
    cJSON_AddStringToObject(dflt, "template", tmpl);
    cJSON_AddItemToArray(list, tool_use);
    cJSON_AddItemToArray(list, dflt);
    cfg_text = cJSON_Print(cfg);
    CHECK(write_file(config, cfg_text, strlen(cfg_text)), "write %s", config);
    st = q3_chat_template_load(config, &kind);
    CHECK(st == Q3_OK && kind == Q3_CHAT_TEMPLATE_QWEN3, "named list: %s", q3_last_error());
    free(cfg_text);

    /* No template at all. */
    CHECK(write_file(config, "{\"eos_token\": \"x\"}", 18), "write %s", config);
    st = q3_chat_template_load(dir, &kind);
    CHECK(st == Q3_ERR_UNSUPPORTED, "no template: %s", q3_status_name(st));
    CHECK_CONTAINS(q3_last_error(), "has no chat_template");
    unlink(config);
    st = q3_chat_template_load(dir, &kind);
    CHECK(st == Q3_ERR_IO, "empty folder: %s", q3_status_name(st));
    CHECK_CONTAINS(q3_last_error(), "no chat template");
    rmdir(dir);

    cJSON_Delete(cfg);
    free(modified);
    free(tmpl);
}

int main(void)
{
    test_public_conversations();
    test_edge_cases();
    test_render_messages_api();
    test_bad_inputs();
    test_json_write();
    test_template_recognition();
    TEST_DONE();
}
