/* fuzz_probe.c — the probe JSON (src/io/io_cost.c, flm_probe_parse_cost: the cost file `flashlm probe-disk` writes and
 * every run reads when it is there) on arbitrary bytes. Seeds: tests/fuzz/seeds/fuzz_probe. */
#include "fuzz_common.h"

#include <math.h>

#include "io/io_cost.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    flm_io_cost c = {-1, -1};
    flm_error err;
    if (flm_probe_parse_cost("fuzz.probe.json", (const char *)data, size, &c, &err) == FLM_OK)
        fz_check(isfinite(c.latency_us) && c.latency_us >= 0 && c.latency_us <= 1e6 && c.bandwidth_gbps > 0 &&
                 c.bandwidth_gbps <= 1e4, "cost %g us, %g GB/s", c.latency_us, c.bandwidth_gbps);
    else
        fz_check(err.msg[0] != 0, "an error without a message");
    return 0;
}
