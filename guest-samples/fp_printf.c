/* Floating point: printf of doubles in %f/%e/%g/%a, sqrt via the builtin (sqrtsd), libm
 * functions (static libm picks FMA/AVX2 variants through ifuncs), float, and x87 long double. */
#include <stdio.h>
#include <math.h>
#include <float.h>
#include <stdint.h>
#include <string.h>
#include "common.h"

static volatile double vzero = 0.0; /* volatile: keep inf/nan computed at run time */

int main(void)
{
    const double vals[] = {0.0, -0.0, 1.0, -1.5, 3.141592653589793, 2.718281828459045, 1e-300, 1e300,
                           123456789.125, 0.1, 1.0 / 3.0, 6.02214076e23, DBL_MIN, DBL_MAX, DBL_EPSILON};
    for (unsigned i = 0; i < sizeof vals / sizeof vals[0]; i++) {
        double v = vals[i];
        printf("%-3u f=%.6f e=%.10e g=%g G=%.17G a=%a\n", i, v, v, v, v, v);
    }
    printf("inf=%f -inf=%e nan=%g\n", 1.0 / vzero, -1.0 / vzero, vzero / vzero);
    printf("widths [%12.3f] [%-12.3e] [%+g] [%012.4f]\n", -2.5, 1234.5678, 42.0, 3.14159);

    /* Arithmetic in loops: harmonic sum, Newton sqrt against the sqrtsd builtin. */
    double h = 0.0;
    for (int i = 1; i <= 1000000; i++)
        h += 1.0 / i;
    printf("harmonic(1e6) = %.15f\n", h);
    for (int i = 2; i <= 50; i += 12) {
        double x = i, g = x;
        for (int k = 0; k < 30; k++)
            g = 0.5 * (g + x / g);
        printf("sqrt(%d): newton=%.17g builtin=%.17g\n", i, g, __builtin_sqrt(x));
    }

    /* libm. */
    double s = 0;
    for (int i = 0; i < 2000; i++) {
        double x = i * 0.01;
        s += sin(x) * cos(x) + exp(-x) + log1p(x) + pow(x, 1.5) + atan2(x, 1.0 + x) + tanh(x - 10);
    }
    printf("libm sum = %.12e\n", s);
    printf("floor/ceil/round/trunc(-2.5) = %g %g %g %g\n", floor(-2.5), ceil(-2.5), round(-2.5), trunc(-2.5));
    printf("fmod(10,3)=%g hypot(3,4)=%g cbrt(27)=%g\n", fmod(10, 3), hypot(3, 4), cbrt(27));

    /* Conversions. */
    uint64_t hh = FNV_OFFSET;
    for (int i = -1000; i < 1000; i++) {
        double d = i * 1.37;
        float f = (float)d;
        long l = (long)d;
        unsigned long u = (unsigned long)(d < 0 ? -d : d);
        hh = fnv_u64(hh, (uint64_t)l ^ u);
        uint32_t fb;
        memcpy(&fb, &f, 4);
        hh = fnv_u64(hh, fb);
    }
    printf("conversions %016llx\n", (unsigned long long)hh);

    /* float and long double (x87). */
    float fs = 0;
    for (int i = 1; i < 10000; i++)
        fs += 1.0f / (float)i;
    printf("float harmonic = %.7g\n", fs);
    long double ld = 1.0L;
    for (int i = 1; i <= 20; i++)
        ld *= (long double)i;
    printf("20! as long double = %.0Lf, sqrtl(2) = %.18Lf\n", ld, sqrtl(2.0L));
    return 0;
}
