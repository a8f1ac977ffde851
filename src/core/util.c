/* util.c — the monotonic clock of core/util.h. */
#include "core/util.h"

#include <time.h>

double flm_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}
