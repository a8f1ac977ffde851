/* svg.h — a small writer of self-contained SVG charts for `flashlm bench --svg`: line charts and stacked bar charts
 * with axes, ticks, labels, a legend and a title. Plain SVG 1.1 text, no scripts, no external references; every
 * caller-supplied string is escaped for XML. */
#ifndef FLM_TOOLS_SVG_H
#define FLM_TOOLS_SVG_H
#include <stdbool.h>
#include <stdio.h>

/* One line of a line chart: n points (x[i], y[i]); non-finite points are skipped. A line with no points still gets
 * its legend entry (e.g. a mode that did not fit any budget). */
typedef struct svg_line {
    const char *name;
    const double *x, *y;
    int n;
    bool dashed;  /* drawn dashed (e.g. an expectation next to a measurement) */
    bool markers; /* a dot on each point */
} svg_line;

/* Every chart is written through the checked writer (flm_out_open: a link, a device or another non-regular file is
 * refused; a unique temporary renamed onto path). An existing file is replaced only after svg_set_replace(true) (the
 * CLI's --force), also one that appeared while the command ran (RENAME_NOREPLACE); that path is not the model, the
 * caller checks first (flm_out_check). */

/* Whether the charts written from now on may replace an existing file (default false). */
void svg_set_replace(bool replace);

/* Write a line chart to path. The y axis starts at 0 (or below, for negative data); the x axis spans the data.
 * Returns false when the file cannot be written (svg_error says why). */
bool svg_line_chart(const char *path, const char *title, const char *xlabel, const char *ylabel,
                    const svg_line *lines, int n_lines);

/* Write a stacked bar chart to path: one bar per category (cats[c]), made of n_parts stacked parts (parts[p], bottom
 * first) of heights v[c * n_parts + p] (negative or non-finite parts count as 0); each bar's total is printed above
 * it. Returns false when the file cannot be written. */
bool svg_stacked_bars(const char *path, const char *title, const char *ylabel, const char *const *cats, int n_cats,
                      const char *const *parts, int n_parts, const double *v);

/* Why the last chart could not be written: "<path>: ..." (empty before any error). */
const char *svg_error(void);

/* Write s to f with & < > " ' replaced by entities and control characters other than tab and newline dropped. */
void svg_escape(FILE *f, const char *s);

/* "Nice" axis ticks (steps of 1, 2 or 5 times a power of ten) covering [lo, hi] with at most max_ticks ticks:
 * *first and *step describe them; returns their count (>= 2). lo == hi is widened. */
int svg_ticks(double lo, double hi, int max_ticks, double *first, double *step);

#endif
