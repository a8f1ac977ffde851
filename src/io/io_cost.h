/* io_cost.h — the I/O cost model measured by `flashlm probe-disk` (src/probe/probe.h writes it), read back for the
 * runtime: the file "<model>.probe.json" holds the fitted {latency_us, bandwidth_gbps} the read planner uses
 * (io/reader.h flm_io_cost, docs/IO.md "Measuring the disk"). Internal. */
#ifndef FLM_IO_IO_COST_H
#define FLM_IO_IO_COST_H
#include <stddef.h>

#include "flashlm.h"
#include "io/reader.h"

#define FLM_PROBE_FORMAT "flashlm-probe" /* JSON "format" */
#define FLM_PROBE_VERSION 1              /* JSON "version" */
#define FLM_PROBE_SUFFIX ".probe.json"   /* the file next to the model: "<model>.probe.json" (as flashlm_tools.h) */

/* "<model_path>.probe.json", malloc'd (NULL when out of memory). */
char *flm_probe_json_path(const char *model_path);

/* Read the fitted cost (JSON "cost": {"latency_us", "bandwidth_gbps"}) from a probe file.
 * Errors: FLM_ERR_IO (the file is absent or unreadable: the caller keeps its defaults), FLM_ERR_FORMAT (not a
 * flashlm probe file, a wrong version, a missing or out-of-range value: latency_us must be in [0, 1e6],
 * bandwidth_gbps in (0, 1e4]; the message names the file and what is wrong), FLM_ERR_NOMEM, FLM_ERR_ARG.
 * *out is only written on success. */
flm_status flm_probe_load_cost_file(const char *json_path, flm_io_cost *out, flm_error *err);
/* The same for len bytes of probe JSON already in memory (text need not be NUL-terminated; name stands for the file
 * in messages). Errors: FLM_ERR_FORMAT (also for more than 16 MiB or a NUL byte), FLM_ERR_NOMEM, FLM_ERR_ARG. */
flm_status flm_probe_parse_cost(const char *name, const char *text, size_t len, flm_io_cost *out, flm_error *err);

/* flm_probe_load_cost_file(flm_probe_json_path(model_path)): the cost measured for the disk holding the model. */
flm_status flm_probe_load_cost(const char *model_path, flm_io_cost *out, flm_error *err);

#endif
