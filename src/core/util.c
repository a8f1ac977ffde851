/* util.c — the monotonic clock, the CPU feature test and the UTF-8 check of core/util.h (flm_utf8_check). */
#include "core/util.h"
#include "flashlm.h" /* flm_utf8_check: FLM_API */

#include <stdio.h>
#include <sys/resource.h>
#include <time.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

double flm_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

bool flm_cpu_has_f16c(void) {
#if defined(__x86_64__)
    unsigned a = 0, b = 0, c = 0, d = 0; /* CPUID leaf 1: ECX bit 29 is F16C, bit 28 AVX */
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) && (c & (1u << 28));
#else
    return false;
#endif
}

bool flm_cpu_has_avxvnni(void) {
#if defined(__x86_64__)
    unsigned a = 0, b = 0, c = 0, d = 0; /* CPUID leaf 7 subleaf 1: EAX bit 4 is AVX-VNNI */
    return __get_cpuid_max(0, NULL) >= 7 && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 4));
#else
    return false;
#endif
}

flm_arm_caps flm_cpu_arm_caps(void) {
    flm_arm_caps c = {false, false, false};
#if defined(__aarch64__) && defined(__linux__)
    const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    c.neon = (hw >> 1) & 1;     /* HWCAP_ASIMD */
    c.dotprod = (hw >> 20) & 1; /* HWCAP_ASIMDDP */
    c.i8mm = (hw2 >> 13) & 1;   /* HWCAP2_I8MM */
#endif
    return c;
}

bool flm_address_space_limited(void) {
    struct rlimit rl;
    return getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY;
}

flm_size_str flm_size(uint64_t b) {
    flm_size_str r;
    if (b < 1024) snprintf(r.s, sizeof r.s, "%llu bytes", (unsigned long long)b);
    else if (b < (1ull << 20)) snprintf(r.s, sizeof r.s, "%.2f KiB", (double)b / 1024.0);
    else if (b < (1ull << 30)) snprintf(r.s, sizeof r.s, "%.2f MiB", (double)b / 1048576.0);
    else snprintf(r.s, sizeof r.s, "%.2f GiB", (double)b / 1073741824.0);
    return r;
}

size_t flm_utf8_len(const unsigned char *p, size_t n) {
    const unsigned c = p[0];
    if (c < 0x80) return 1;
    const size_t k = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (!k || k > n) return 0;
    /* the second byte's range excludes overlong forms, surrogates and code points above U+10FFFF */
    const unsigned lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80, hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
    if (p[1] < lo || p[1] > hi) return 0;
    for (size_t j = 2; j < k; j++)
        if ((p[j] & 0xC0) != 0x80) return 0;
    return k;
}

size_t flm_utf8_check(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        const size_t k = flm_utf8_len(u + i, n - i);
        if (!k) return i;
        i += k;
    }
    return SIZE_MAX;
}
