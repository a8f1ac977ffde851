/* mt19937.h — the 32-bit Mersenne Twister (Matsumoto & Nishimura 1998) exactly as C++'s std::mt19937, and the double
 * that libstdc++'s std::uniform_real_distribution<double>(0, 1) draws from it: the random numbers llama.cpp's `dist`
 * sampler uses, so that a seed gives llama.cpp's text (runtime/sampler.c). Internal. */
#ifndef FLM_CORE_MT19937_H
#define FLM_CORE_MT19937_H
#include <stdint.h>

#define FLM_MT19937_N 624

typedef struct flm_mt19937 {
    uint32_t mt[FLM_MT19937_N];
    int i; /* the next word of mt to temper; FLM_MT19937_N: regenerate first */
} flm_mt19937;

/* std::mt19937's constructor with this seed (its default seed is 5489). */
void flm_mt19937_seed(flm_mt19937 *m, uint32_t seed);
/* The next 32-bit output, std::mt19937::operator(): seeded with 5489, the 10000th is 4123659995 (C++ [rand.predef]). */
uint32_t flm_mt19937_next(flm_mt19937 *m);
/* The next double in [0, 1) as libstdc++'s generate_canonical<double, 53> makes it from two outputs g1, g2:
 * (g1 + g2 * 2^32) / 2^64, rounded to double, 1 clamped to the double just below (what
 * std::uniform_real_distribution<double>(0, 1) returns with GCC's libstdc++; llama.cpp's dist sampler draws one per
 * token). */
double flm_mt19937_canonical(flm_mt19937 *m);

#endif
