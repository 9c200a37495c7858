/* AMX kernel of the limit microbenchmarks (see limits.h): TDPBF16PS on
 * tiles already loaded, four independent accumulators. */
#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16")
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "tools/limits.h"

double q3_limits_amx_bf16(long iters)
{
    struct {
        uint8_t palette, start_row, reserved[14];
        uint16_t colsb[16];
        uint8_t rows[16];
    } cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    __asm__ volatile("ldtilecfg %0" ::"m"(cfg)); /* see matmul_amx_avx512.c on _tile_loadconfig */
    static const uint16_t one_bf16[16 * 32] = {0};
    _tile_loadd(4, one_bf16, 64);
    _tile_loadd(5, one_bf16, 64);
    _tile_loadd(6, one_bf16, 64);
    _tile_loadd(7, one_bf16, 64);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (long i = 0; i < iters; i++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    float out[256];
    _tile_stored(0, out, 64);
    _tile_release();
    volatile float sink = out[0];
    (void)sink;
    return (double)iters * 4 * 16 * 16 * 32 * 2;
}

#pragma GCC pop_options
