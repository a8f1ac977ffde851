/* calibrate.h — `flashlm calibrate`: record FFN inputs on text, fix each layer's activation rule and its operating
 * points (levels), train one low-rank predictor per layer, choose the default level by measuring held-out perplexity,
 * and store everything in the .flm file (paper Knowl 2, 3, 10; docs/SPARSITY.md). Internal. */
#ifndef FLM_CALIBRATE_CALIBRATE_H
#define FLM_CALIBRATE_CALIBRATE_H
#include <stdint.h>
#include <sys/types.h>
#include "flashlm.h"
#include "flashlm_tools.h"
#include "format/flm.h"
#include "model/model.h"

/* flm_calib_opts and flm_calib_opts_default are public: include/flashlm_tools.h. */

/* The tokens of a calibration text: text (tokenized whole), or when it is NULL the first max (0: all) tokens of the
 * file text_file read as a stream (flm_tokenize_file: nothing past them is read), or when files is set (a
 * NULL-terminated list, at least one) the files' tokens in turns of chunk: chunk tokens of each file in order, each
 * from where its last turn ended, a file that ends dropping out, until max tokens (0: all) or every file has ended;
 * each file's first max tokens tokenized on its own (flm_tokenize_file; add_bos: BOS before each file's first
 * token, as the model adds it). *ids malloc'd. Errors: FLM_ERR_ARG (none given, chunk 0 with files), those of
 * flm_tokenize_file, FLM_ERR_NOMEM. */
flm_status flm_calib_tokens(flm_ctx *ctx, const char *text, const char *text_file, const char *const *files,
                            uint32_t chunk, bool add_bos, size_t max, int32_t **ids, size_t *n, flm_error *err);

/* true when one of text, text_file, files (a non-empty list) is given. */
static inline bool flm_calib_has_text(const char *text, const char *text_file, const char *const *files) {
    return text || text_file || (files && files[0]);
}

/* The standard levels (eps values) calibrate measures for gated non-ReLU FFNs, ascending; returns their count. */
uint32_t flm_calib_standard_levels(float *eps, uint32_t cap);

/* Bytes that training one layer holds at these options for a model of these hyper-parameters, with the predictors
 * of every layer: gate/up rows as floats (2 d_ffn d_model), pre-activations and energies (2 tokens d_ffn floats),
 * labels (tokens d_ffn bytes), the layer's recorded inputs (tokens d_model floats), the held-out logits, the
 * histogram, the optimiser's state, and all layers' predictors (f32 and f16). What a budget must hold besides the
 * process itself (see flm_calib_opts.mem_bytes). */
uint64_t flm_calibrate_train_bytes(const flm_hparams *hp, const flm_calib_opts *o);

/* Take the exclusive advisory lock (flock, non-blocking) on the model file at path that one calibration (or hot
 * ordering) holds while it works: returns the locked descriptor (close it to release), or -1 with *st and err set:
 * FLM_ERR_IO (cannot be opened, not a regular file, or "another `flashlm calibrate` is writing this file"). */
int flm_calib_lock(const char *path, flm_status *st, flm_error *err);

/* Write n bytes of buf at offset off of fd (the recorded FFN inputs' spill file, MODEL.flm.x.tmp), retrying short
 * writes and EINTR: 0, or the errno of the failure (ENOSPC for a write that makes no progress). */
int flm_calib_pwrite_all(int fd, const void *buf, size_t n, off_t off);

/* Calibrate the .flm file at path in place (atomically: see flm_file_put_region). Prints nothing; per-layer results
 * and the levels (with their measured held-out loss) are in the stored region (read them back with
 * flm_predictor_region_deserialize) and returned in *report when non-NULL (at the default level).
 * One calibration of a file at a time: an exclusive advisory lock (flock) on path is held throughout; a second run
 * fails at once with FLM_ERR_IO ("another `flashlm calibrate` is writing this file").
 * Errors: those of flm_open / flm_file_put_region, FLM_ERR_ARG (bad options; text too short: fewer than 64 tokens
 * to record), FLM_ERR_IO (locked, or cannot be opened), FLM_ERR_NOMEM. */
struct flm_predictor_region;
flm_status flm_calibrate(const char *path, const flm_calib_opts *o, struct flm_predictor_region *report,
                         flm_error *err);

/* flm_calibrate, and with o->hot_tokens > 0 the hot order first (see flm_calib_opts.hot_tokens); *hot (may be NULL)
 * gets what happened to the order: FLM_CALIB_HOT_NONE (not asked), _DONE, _KEPT or _UNSUPPORTED (flashlm_tools.h). */
flm_status flm_calibrate_ex(const char *path, const flm_calib_opts *o, struct flm_predictor_region *report, int *hot,
                            flm_error *err);

/* flm_hot_order_ex without taking the calibration lock (the caller holds it: flm_calib_lock). */
flm_status flm_hot_order_unlocked(const char *path, const char *text, const flm_hot_opts *o, flm_error *err);
/* flm_coact_order without taking the calibration lock (the caller holds it); text: o->text or another in-memory text
 * (NULL: o->text_file). */
flm_status flm_coact_order_unlocked(const char *path, const char *text, const flm_coact_opts *o,
                                    flm_coact_report *rep, flm_error *err);

/* Choose the default level of an already calibrated .flm again, on new text, without recording or training: the
 * held-out check above on the last eval_tokens tokens of o->text (of a text_file: the eval_tokens read after
 * the recorded ones), against o->max_loss (o->curve: every level). The
 * stored predictors, thresholds and s_agg are kept (s_agg stays the one measured at the old default level).
 * Errors: FLM_ERR_ARG (not calibrated, a single-level (ReLU) calibration, text shorter than 2 chunks), those of
 * flm_open and flm_file_put_region, FLM_ERR_NOMEM. */
flm_status flm_calibrate_levels(const char *path, const flm_calib_opts *o, struct flm_predictor_region *report,
                                flm_error *err);

#endif
