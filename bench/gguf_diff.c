/* Compares two GGUF files tensor by tensor: for every tensor of A, whether B
 * has it with the same type, shape and bytes. Used to check q3 convert's
 * output against llama-quantize's (bench/llamacpp/kquant-check.sh); the order
 * of the tensors in the files does not matter.
 *
 *   build/bench/gguf_diff A.gguf B.gguf [-v]
 *
 * Prints one line per type of A: tensors byte-identical / tensors of that type,
 * and with -v each tensor that differs (with the first differing byte). Exits 0
 * when every tensor matches and both files hold the same tensors, else 1.
 */
#include <stdio.h>
#include <string.h>

#include "model/gguf.h"
#include "q3.h"

int main(int argc, char **argv)
{
    int verbose = argc == 4 && !strcmp(argv[3], "-v");
    if (argc != 3 && !verbose) {
        fprintf(stderr, "usage: %s A.gguf B.gguf [-v]\n", argv[0]);
        return 2;
    }
    q3_gguf *a = NULL, *b = NULL;
    if (q3_gguf_open(argv[1], &a) || q3_gguf_open(argv[2], &b)) {
        fprintf(stderr, "%s\n", q3_last_error());
        q3_gguf_close(a);
        return 2;
    }
    size_t same[Q3_DTYPE_COUNT] = {0}, all[Q3_DTYPE_COUNT] = {0}, missing = 0;
    size_t na = q3_gguf_tensor_count(a), nb = q3_gguf_tensor_count(b);
    for (size_t i = 0; i < na; i++) {
        const q3_tensor *ta = q3_gguf_tensor_at(a, i), *tb = q3_gguf_find_tensor(b, ta->name);
        all[ta->dtype]++;
        if (!tb) {
            missing++;
            if (verbose) printf("  %s: not in B\n", ta->name);
            continue;
        }
        if (tb->dtype != ta->dtype || tb->ndim != ta->ndim ||
            memcmp(tb->shape, ta->shape, sizeof ta->shape[0] * (size_t)ta->ndim) || tb->nbytes != ta->nbytes) {
            if (verbose)
                printf("  %s: %s in A, %s in B (or another shape)\n", ta->name, q3_dtype_name(ta->dtype),
                       q3_dtype_name(tb->dtype));
            continue;
        }
        const unsigned char *pa = ta->data, *pb = tb->data;
        size_t k = 0;
        while (k < ta->nbytes && pa[k] == pb[k]) k++;
        if (k == ta->nbytes) same[ta->dtype]++;
        else if (verbose) printf("  %s (%s): differs from byte %zu of %zu\n", ta->name, q3_dtype_name(ta->dtype), k, ta->nbytes);
    }
    size_t n_same = 0;
    for (int t = 0; t < Q3_DTYPE_COUNT; t++) {
        if (!all[t]) continue;
        printf("%-5s %zu / %zu tensors byte-identical\n", q3_dtype_name((q3_dtype)t), same[t], all[t]);
        n_same += same[t];
    }
    printf("all   %zu / %zu (B holds %zu tensors)\n", n_same, na, nb);
    q3_gguf_close(a);
    q3_gguf_close(b);
    return n_same == na && na == nb && !missing ? 0 : 1;
}
