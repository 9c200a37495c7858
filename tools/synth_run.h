/* q3 synth's work (the command's options are src/cli/cmd_synth.c). */
#ifndef Q3_TOOLS_SYNTH_RUN_H
#define Q3_TOOLS_SYNTH_RUN_H

#include "q3.h"

typedef struct q3_synth_run_opts {
    const char *out_dir;       /* created if missing; files in it are replaced (with type_name: the
                                  GGUF file) */
    long long seed;            /* the weights depend only on seed, dtype and config */
    const char *dtype_name;    /* "bf16" or "f32"; NULL: bf16, or f32 when the config says float32 */
    const char *preset;        /* "0.6b" (NULL), "tiny", "qwen3-30b-a3b", "qwen3-235b-a22b", "tiny-moe" */
    int layers;                /* > 0: that many layers instead of the preset's or config's; 0: theirs;
                                  < 0 is refused */
    const char *type_name;     /* a q3 convert --type: write out_dir as that GGUF file, streamed (no
                                  folder); NULL: the folder */
    const char *name;          /* with type_name: general.name (NULL: the file's base name) */
    int quiet;                 /* with type_name: no progress on stderr */
    const char *config_path;   /* the shapes of a Qwen3 config.json instead of the preset */
    const char *tokenizer_dir; /* copy its tokenizer files; NULL: the built-in one when its vocabulary fits */
    int no_tokenizer;          /* write no tokenizer */
} q3_synth_run_opts;

/* Writes the checkpoint and prints one line on stdout saying what. Q3_OK, or
 * the status of what failed with q3_last_error() saying why, and *usage 1
 * when an option was wrong (an unknown preset, dtype or type, a layer count
 * below 1). */
q3_status q3_synth_run(const q3_synth_run_opts *o, int *usage);

#endif
