/* util.h — small helpers every layer uses, defined once: alignment, little-endian byte order, a monotonic clock.
 * Internal. */
#ifndef FLM_CORE_UTIL_H
#define FLM_CORE_UTIL_H
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* The memory one thread costs, counted in the plan for every thread flashlm starts (compute threads, reader threads,
 * the read-ahead thread): its stack's touched pages, TLS and libgomp's per-thread state. Measured as peak RSS on
 * stories260K (issue 23): -t 1 vs -t 256 9.10 vs 26.34 MiB (69 KiB per OpenMP thread); --io threads --io-threads 1
 * vs 1024 8.80 vs 77.07 MiB (68 KiB per reader thread). Rounded up to 80 KiB. The process's allowance
 * (FLM_RSS_ALLOWANCE, 16 MiB) covers the first FLM_COMPUTE_THREADS_FREE compute threads and FLM_READER_THREADS_FREE
 * reader threads (the defaults on small machines: 40 threads, ~2.7 MiB measured) and the read-ahead thread; every
 * thread beyond is counted in the plan (runtime/budget.c, io/reader.c), so -t 256 on a 256-CPU host, or
 * --io-threads 1024, is planned inside --mem rather than past the allowance. */
#define FLM_THREAD_BYTES ((uint64_t)80 << 10)
#define FLM_COMPUTE_THREADS_FREE 8
#define FLM_READER_THREADS_FREE 32

/* x rounded up / down to a multiple of a (a > 0; any a, not only powers of two). x + a - 1 must not overflow. */
static inline uint64_t flm_align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }
static inline uint64_t flm_align_down(uint64_t x, uint64_t a) { return x / a * a; }

/* Little-endian stores and loads at p (any alignment): the byte order of GGUF, .flm and its regions. */
static inline void flm_put_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline uint16_t flm_get_u16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline void flm_put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void flm_put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint32_t flm_get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t flm_get_u64(const uint8_t *p) { return flm_get_u32(p) | (uint64_t)flm_get_u32(p + 4) << 32; }
/* IEEE-754 binary32, stored as its bit pattern (little-endian). */
static inline void flm_put_f32(uint8_t *p, float f) {
    uint32_t v;
    memcpy(&v, &f, 4);
    flm_put_u32(p, v);
}
static inline float flm_get_f32(const uint8_t *p) {
    uint32_t v = flm_get_u32(p);
    float f;
    memcpy(&f, &v, 4);
    return f;
}

/* Milliseconds on CLOCK_MONOTONIC (an arbitrary origin: only differences mean anything). */
double flm_now_ms(void);
/* true when the CPU has AVX and F16C (CPUID; GCC's and clang's __builtin_cpu_supports do not agree on "f16c"). */
bool flm_cpu_has_f16c(void);
/* true when the CPU has AVX-VNNI, the 256-bit VEX vpdpbusd / vpdpwssd (CPUID leaf 7 subleaf 1, EAX bit 4; clang 14's
 * __builtin_cpu_supports does not know "avxvnni"). The OS's saving of the AVX registers is the caller's check. */
bool flm_cpu_has_avxvnni(void);
/* The 64-bit Arm extensions the kernel levels use, from the kernel's hardware capability words
 * (getauxval(AT_HWCAP / AT_HWCAP2), Linux's arch/arm64 hwcaps: HWCAP_ASIMD bit 1, HWCAP_ASIMDDP bit 20, HWCAP2_I8MM
 * bit 13); all false on other architectures and systems. */
typedef struct flm_arm_caps {
    bool neon;    /* Advanced SIMD (ARMv8.0-A; every Linux aarch64 CPU has it) */
    bool dotprod; /* SDOT / UDOT (ARMv8.2-A dot product extension, FEAT_DotProd) */
    bool i8mm;    /* SMMLA / UMMLA / USDOT (ARMv8.6-A int8 matrix multiply, FEAT_I8MM) */
} flm_arm_caps;
flm_arm_caps flm_cpu_arm_caps(void);
/* true when the process runs under an address-space limit (RLIMIT_AS, `ulimit -v`). OpenBLAS worker threads that
 * cannot map their buffer there retry forever, so BLAS threads are not raised then. */
bool flm_address_space_limited(void);
/* A byte count for people: "512 bytes", "1.00 KiB", "26.52 MiB", "3.10 GiB" (so a 1K budget does not print as
 * "0.00 MiB"). Use the member of the returned value in the same expression: printf("%s", flm_size(n).s). */
typedef struct flm_size_str { char s[32]; } flm_size_str;
flm_size_str flm_size(uint64_t bytes);

/* The length (1..4) of the well-formed UTF-8 sequence at p[0, n) (RFC 3629 section 4), or 0 when none begins there
 * (n >= 1). flm_utf8_check's step. */
size_t flm_utf8_len(const unsigned char *p, size_t n);

#endif
