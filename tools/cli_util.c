#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

double cli_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

double cli_mib(uint64_t b) { return (double)b / (1024.0 * 1024.0); }

int cli_die(const char *fmt, const char *a) {
    fprintf(stderr, "flashlm: ");
    fprintf(stderr, fmt, a);
    fprintf(stderr, "\n");
    return 2;
}

bool cli_parse_long(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

bool cli_parse_float(const char *s, float lo, float hi, float *out) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) return false;
    *out = v;
    return true;
}

void cli_progress(void *user, const char *what, uint64_t done, uint64_t total) {
    (void)user;
    if (!isatty(2)) {
        if (done == total)
            fprintf(stderr, "flashlm: %s: %llu/%llu done\n", what, (unsigned long long)done, (unsigned long long)total);
        return;
    }
    fprintf(stderr, "\rflashlm: %s: %llu/%llu (%3.0f%%)", what, (unsigned long long)done, (unsigned long long)total,
            total ? 100.0 * (double)done / (double)total : 100.0);
    if (done == total) fprintf(stderr, "\n");
}

bool cli_is_help(int argc, char **argv) {
    return argc >= 1 && (!strcmp(argv[0], "-h") || !strcmp(argv[0], "--help"));
}
