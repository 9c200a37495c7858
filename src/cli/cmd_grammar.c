/* q3 grammar: compiles a constraint (JSON Schema, GBNF, regex, choice) and,
 * given a text, walks it through the token masks as the tokenizer splits it:
 * accepted (complete), incomplete (a valid prefix) or rejected at byte N. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/gen_common.h"
#include "cli/opts.h"
#include "q3.h"
#include "tools/defaults.h"

static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

int cmd_grammar(int argc, char **argv)
{
    const char *model = NULL, *tokenizer = NULL, *schema = NULL, *schema_file = NULL, *gbnf = NULL,
               *gbnf_file = NULL, *regex = NULL, *choice = NULL, *check = NULL;
    int json = 0;
    const cli_opt tab[] = {
        CLI_OPT("json-schema-file", 0, CLI_FILE, &schema_file, "FILE", "a JSON Schema", .flags = CLI_STDIN),
        CLI_OPT("json-schema", 'j', CLI_STR, &schema, "SCHEMA", "a JSON Schema given inline"),
        CLI_OPT("grammar-file", 0, CLI_FILE, &gbnf_file, "FILE", "a GBNF grammar (llama.cpp's syntax; the rule root starts)", .flags = CLI_STDIN),
        CLI_OPT("grammar", 0, CLI_STR, &gbnf, "GBNF", "a GBNF grammar given inline"),
        CLI_OPT("regex", 0, CLI_STR, &regex, "RE", "a regex the whole text must match"),
        CLI_OPT("choice", 0, CLI_STR, &choice, "JSON", "a JSON array of strings: the text is one of them"),
        CLI_OPT("check", 0, CLI_FILE, &check, "TEXT_FILE", "walk this text through the token masks ('-': stdin)", .flags = CLI_STDIN),
        CLI_OPT("model", 'm', CLI_FILE, &model, "PATH", "the model whose tokenizer splits the text"),
        CLI_OPT("tokenizer", 0, CLI_FILE, &tokenizer, "PATH", "a tokenizer.json or its folder (neither: the built-in Qwen3 one)"),
        CLI_OPT("json", 0, CLI_FLAG, &json, NULL, "print the answer as one JSON object"),
        {0},
    };
    cli_spec spec = {
        "grammar",
        "q3 grammar (--json-schema-file F | -j SCHEMA | --grammar-file F | --grammar G | --regex R | --choice JSON)\n"
        "           [--check TEXT_FILE] [-m MODEL | --tokenizer PATH] [--json]",
        "Compiles a constraint for structured output, or says which keyword or rule it refuses\n"
        "(exit 2). With --check, splits the text into tokens as the model's tokenizer does and\n"
        "walks them through the token masks: `accepted` (complete and valid), `incomplete` (a\n"
        "valid prefix) or `rejected at byte N` (exit 0, 0, 1).\n",
        tab, 0, NULL};
    int rc = cli_parse(&spec, argc, argv, NULL);
    if (rc) return rc == CLI_HELP_SHOWN ? 0 : rc;
    int given = !!schema + !!schema_file + !!gbnf + !!gbnf_file + !!regex + !!choice;
    if (given != 1)
        return cli_usage_error("grammar", "give exactly one of --json-schema-file, --json-schema, --grammar-file, "
                                          "--grammar, --regex, --choice");
    if (model && tokenizer) return cli_usage_error("grammar", "-m and --tokenizer exclude each other");
    if (!model && !tokenizer && !(tokenizer = q3_default_tokenizer_dir()))
        return cli_usage_error("grammar", "no tokenizer: pass -m MODEL or --tokenizer PATH (or fetch the built-in one: make deps)");

    q3_model *m = NULL;
    q3_tokenizer *tok = NULL;
    q3_grammar *G = NULL;
    q3_matcher *mt = NULL;
    char *text = NULL, *ctext = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0, len = 0, clen = 0;
    uint32_t *bits = NULL;
    rc = 1;
    if (model && q3_model_open(model, &m)) {
        cli_error("grammar", "%s", q3_last_error());
        goto done;
    }
    if (cli_open_tokenizer("grammar", tokenizer, m, &tok)) goto done;
    q3_grammar_kind kind = schema || schema_file ? Q3_GRAMMAR_JSON_SCHEMA
                           : gbnf || gbnf_file   ? Q3_GRAMMAR_GBNF
                           : regex               ? Q3_GRAMMAR_REGEX
                                                 : Q3_GRAMMAR_CHOICE;
    const char *file = schema_file ? schema_file : gbnf_file;
    const char *src = schema ? schema : gbnf ? gbnf : regex ? regex : choice;
    if (file) {
        if (!(ctext = cli_read_path("grammar", file, &clen))) goto done;
        src = ctext;
    } else {
        clen = strlen(src);
    }
    double t0 = cli_now();
    q3_status st = q3_grammar_compile(tok, kind, src, clen, &G);
    double t_compile = cli_now() - t0;
    if (st) {
        if (json) {
            printf("{\"status\": \"refused\", \"error\": ");
            json_string(stdout, q3_last_error());
            printf("}\n");
        }
        cli_error("grammar", "%s%s%s", file ? file : "", file ? ": " : "", q3_last_error());
        rc = st == Q3_ERR_INVALID || st == Q3_ERR_UNSUPPORTED ? 2 : 1;
        goto done;
    }
    if (q3_matcher_new(G, 0, &mt)) {
        cli_error("grammar", "%s", q3_last_error());
        goto done;
    }
    int n_vocab = q3_tokenizer_vocab_size(tok);
    bits = malloc(((size_t)n_vocab + 31) / 32 * sizeof *bits);
    if (!bits) {
        cli_error("grammar", "out of memory");
        goto done;
    }
    if (!check) {
        t0 = cli_now();
        if (q3_matcher_mask(mt, bits, n_vocab)) {
            cli_error("grammar", "%s", q3_last_error());
            goto done;
        }
        double t_mask = cli_now() - t0;
        int allowed = 0;
        for (int id = 0; id < n_vocab; id++) allowed += bits[id >> 5] >> (id & 31) & 1;
        if (json)
            printf("{\"status\": \"compiled\", \"bytes\": %zu, \"compile_ms\": %.3f, \"first_mask_ms\": %.3f, "
                   "\"first_allowed\": %d}\n",
                   q3_grammar_bytes(G), 1e3 * t_compile, 1e3 * t_mask, allowed);
        else
            printf("compiled: %zu bytes in %.3f ms (with the vocabulary's tables, built once per process); first mask: "
                   "%d of %d tokens allowed in %.3f ms\n",
                   q3_grammar_bytes(G), 1e3 * t_compile, allowed, n_vocab, 1e3 * t_mask);
        rc = 0;
        goto done;
    }
    if (!(text = cli_read_path("grammar", check, &len))) goto done;
    if (q3_tokenizer_encode(tok, text, len, Q3_ENCODE_DEFAULT, &ids, &n_ids)) {
        cli_error("grammar", "%s: %s", check, q3_last_error());
        goto done;
    }
    size_t off = 0;
    long rejected_at = -1;
    size_t bad_token = 0;
    for (size_t i = 0; i < n_ids; i++) {
        if (q3_matcher_mask(mt, bits, n_vocab)) {
            cli_error("grammar", "%s", q3_last_error());
            goto done;
        }
        int allowed = (int)(bits[ids[i] >> 5] >> (ids[i] & 31) & 1);
        const char *b;
        size_t bl = 0;
        q3_tokenizer_piece(tok, ids[i], &b, &bl);
        if (!allowed) {
            size_t ok = 0;
            if (!q3_tokenizer_is_special(tok, ids[i]) && bl) q3_matcher_accept_bytes(mt, b, bl, &ok);
            rejected_at = (long)(off + ok);
            bad_token = i;
            break;
        }
        if (q3_matcher_accept(mt, ids[i])) {
            cli_error("grammar", "internal error: the mask allows token %d but the matcher refuses it: %s", ids[i],
                      q3_last_error());
            goto done;
        }
        off += bl;
    }
    q3_match_state ms = q3_matcher_state(mt);
    const char *verdict = rejected_at >= 0 ? "rejected" : ms == Q3_MATCH_OPEN ? "incomplete" : "accepted";
    if (json) {
        printf("{\"status\": \"%s\", \"tokens\": %zu, \"bytes\": %zu", verdict, rejected_at >= 0 ? bad_token : n_ids,
               rejected_at >= 0 ? (size_t)rejected_at : len);
        if (rejected_at >= 0) printf(", \"byte\": %ld, \"token_index\": %zu, \"token\": %d", rejected_at, bad_token, ids[bad_token]);
        printf("}\n");
    } else if (rejected_at >= 0) {
        printf("rejected at byte %ld (token %zu, id %d)\n", rejected_at, bad_token, ids[bad_token]);
    } else {
        printf("%s (%zu tokens, %zu bytes)\n", verdict, n_ids, len);
    }
    rc = rejected_at >= 0 ? 1 : 0;
done:
    free(bits);
    free(ids);
    free(text);
    free(ctext);
    q3_matcher_free(mt);
    q3_grammar_free(G);
    q3_tokenizer_free(tok);
    q3_model_close(m);
    return rc;
}
