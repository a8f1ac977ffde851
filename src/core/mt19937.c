/* mt19937.c — std::mt19937 and libstdc++'s uniform double from it (mt19937.h). The recurrence, tempering and
 * seeding are C++'s [rand.eng.mers] with w 32, n 624, m 397, r 31, a 0x9908b0df, u 11, d 0xffffffff, s 7,
 * b 0x9d2c5680, t 15, c 0xefc60000, l 18, f 1812433253. */
#include "core/mt19937.h"

#include <math.h>

#define MT_M 397

void flm_mt19937_seed(flm_mt19937 *m, uint32_t seed) {
    m->mt[0] = seed;
    for (uint32_t i = 1; i < FLM_MT19937_N; i++)
        m->mt[i] = 1812433253u * (m->mt[i - 1] ^ (m->mt[i - 1] >> 30)) + i;
    m->i = FLM_MT19937_N;
}

static void regenerate(flm_mt19937 *m) {
    for (int k = 0; k < FLM_MT19937_N; k++) {
        const uint32_t y = (m->mt[k] & 0x80000000u) | (m->mt[(k + 1) % FLM_MT19937_N] & 0x7fffffffu);
        m->mt[k] = m->mt[(k + MT_M) % FLM_MT19937_N] ^ (y >> 1) ^ (y & 1u ? 0x9908b0dfu : 0u);
    }
    m->i = 0;
}

uint32_t flm_mt19937_next(flm_mt19937 *m) {
    if (m->i >= FLM_MT19937_N) regenerate(m);
    uint32_t y = m->mt[m->i++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

double flm_mt19937_canonical(flm_mt19937 *m) {
    const double g1 = (double)flm_mt19937_next(m);
    const double g2 = (double)flm_mt19937_next(m);
    const double r = (g1 + g2 * 4294967296.0) / 18446744073709551616.0; /* the sum rounds to double, as libstdc++'s */
    return r >= 1.0 ? nextafter(1.0, 0.0) : r;
}
