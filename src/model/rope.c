#include "model/rope.h"

#include <math.h>

/* YaRN's magnitude correction for a scale s. */
static double yarn_mscale(double s, double m)
{
    return s <= 1 ? 1.0 : 0.1 * m * log(s) + 1.0;
}

/* The (fractional) pair index whose wavelength makes `rotations` turns over the
 * original context. */
static double correction_dim(double rotations, int d, double theta, double orig_ctx)
{
    return d * log(orig_ctx / (rotations * 2 * M_PI)) / (2 * log(theta));
}

double q3_rope_freq(const q3_config *c, int i, double *scale)
{
    int d = c->head_dim;
    double theta = (double)c->rope_theta;
    double base = pow(theta, -2.0 * i / d);
    const q3_rope_scaling *y = &c->rope_scaling;
    if (y->type != Q3_ROPE_YARN) {
        *scale = 1.0;
        return base;
    }
    double s = y->factor;
    double low = correction_dim(y->beta_fast, d, theta, y->orig_ctx);
    double high = correction_dim(y->beta_slow, d, theta, y->orig_ctx);
    if (y->truncate) {
        low = floor(low);
        high = ceil(high);
    }
    if (low < 0) low = 0;
    if (high > d - 1) high = d - 1;
    if (high == low) high += 0.001;
    double ramp = (i - low) / (high - low);
    ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
    /* ramp 0: extrapolation (the base frequency), 1: interpolation (divided by s) */
    if (y->attn_factor > 0) *scale = y->attn_factor;
    else if (y->mscale > 0 && y->mscale_all_dim > 0)
        *scale = yarn_mscale(s, y->mscale) / yarn_mscale(s, y->mscale_all_dim);
    else *scale = yarn_mscale(s, 1.0);
    return base / s * ramp + base * (1 - ramp);
}
