/*
 * probe.h — measuring the disk that holds a model: random-read throughput and latency by request size and reads in
 * flight, sequential throughput, and the planner's cost model fitted from them (`flashlm probe-disk`). The tools tier (src/probe/); the runtime reads the saved
 * fit through io/io_cost.h. Internal.
 *
 * Source: "LLM in a flash" (shared/paper/llm-in-a-flash.txt), Knowl 6: every read pays a fixed latency (OS, driver,
 * interrupt, controller), so random-read throughput grows with the chunk size and with the number of reads in
 * flight (the paper's Figure 2; it reads with 32 threads and chunks >= 32 KiB). The probe measures that curve on
 * the target machine, through the engine's own read path (flm_reader, O_DIRECT, both back ends), and turns it into
 * the flm_io_cost the read planner uses to decide which gaps to read through (src/io/reader.h, docs/IO.md).
 *
 * What is measured (a "cell" per back end x pattern x request size x reads in flight):
 *   - random: each flm_reader_read call reads `batch` extents of request_bytes at random aligned offsets spread
 *     over the file; extents are at least one alignment unit apart and the cost model has latency_us = 0, so the
 *     planner never merges two of them: one extent = one device request, read zero-copy into aligned memory.
 *     Reads in flight = n_threads (threads back end) or queue_depth (io_uring back end).
 *   - sequential: consecutive 4 MiB extents (one request each: max_request is 4 MiB) from a random start.
 * A cell runs whole batches until its share of the time budget is spent or it has read cell_bytes; the first
 * batch is a warm-up and is not counted. Throughput = device bytes / time in flm_reader_read; the mean latency
 * per request follows from Little's law: latency = in_flight x time / requests, with in_flight = min(asked, batch)
 * (it includes the reader's planning and the wait for the last request of each batch, so it is an upper bound).
 *
 * The fit (flm_probe_fit_cost): see the comment above that function and docs/IO.md "Measuring the disk".
 *
 * Results are saved as JSON (cJSON) next to the model, "<model>.probe.json"; flm_probe_load_cost (io/io_cost.h)
 * reads the fitted cost back for the runtime.
 */
#ifndef FLM_PROBE_PROBE_H
#define FLM_PROBE_PROBE_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "flashlm.h"
#include "flashlm_tools.h"
#include "io/io_cost.h"
#include "io/reader.h"

/* The options, results and functions of the probe are public: include/flashlm_tools.h. */

#endif
