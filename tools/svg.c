/* svg.c — small self-contained SVG charts (see svg.h). */
#include "svg.h"

#include <math.h>
#include <string.h>

#include "flashlm_tools.h"

#define W 860.0
#define H 440.0
#define PX 80.0  /* plot area: left, top, width, height (the legend sits to its right) */
#define PY 50.0
#define PW 480.0
#define PH 320.0

static const char *const COLORS[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                     "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};
#define N_COLORS (int)(sizeof COLORS / sizeof *COLORS)

void svg_escape(FILE *f, const char *s) {
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        switch (c) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&apos;", f); break;
        default:
            if (c >= 32 || c == '\t' || c == '\n') fputc(c, f); /* XML 1.0 forbids the other control characters */
        }
    }
}

static double nice_step(double x) {
    double e = pow(10.0, floor(log10(x))), m = x / e;
    return (m <= 1.0 ? 1.0 : m <= 2.0 ? 2.0 : m <= 5.0 ? 5.0 : 10.0) * e;
}

int svg_ticks(double lo, double hi, int max_ticks, double *first, double *step) {
    if (max_ticks < 2) max_ticks = 2;
    if (!isfinite(lo) || !isfinite(hi)) lo = 0, hi = 1;
    if (hi < lo) { double t = lo; lo = hi; hi = t; }
    if (hi - lo <= 1e-9 * fmax(fabs(lo), fabs(hi))) { /* one value: widen around it */
        double d = lo != 0 ? fabs(lo) * 0.5 : 1.0;
        lo -= d;
        hi += d;
    }
    double s = nice_step((hi - lo) / (max_ticks - 1));
    for (;;) {
        double a = floor(lo / s + 1e-9) * s, b = ceil(hi / s - 1e-9) * s;
        int n = (int)llround((b - a) / s) + 1;
        if (n <= max_ticks || n < 2) {
            *first = a;
            *step = s;
            return n < 2 ? 2 : n;
        }
        s = nice_step(s * 1.01);
    }
}

typedef struct frame { double x0, x1, y0, y1; } frame; /* data range mapped onto the plot area */
static double fx(const frame *r, double x) { return PX + (x - r->x0) / (r->x1 - r->x0) * PW; }
static double fy(const frame *r, double y) { return PY + PH - (y - r->y0) / (r->y1 - r->y0) * PH; }

static void text(FILE *f, double x, double y, const char *anchor, int size, const char *extra, const char *s) {
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" font-size=\"%d\"%s%s>", x, y, anchor, size,
            extra ? " " : "", extra ? extra : "");
    svg_escape(f, s);
    fputs("</text>\n", f);
}

/* The chart being written (one at a time) through the checked writer, and the last error. */
static flm_out *g_out;
static flm_error g_err;
static bool g_replace;

void svg_set_replace(bool replace) { g_replace = replace; }

const char *svg_error(void) { return g_err.msg; }

static FILE *begin(const char *path, const char *title) {
    if (flm_out_open(path, NULL, g_replace ? FLM_OUT_REPLACE : 0u, &g_out, &g_err)) return NULL;
    FILE *f = flm_out_stream(g_out);
    if (!f) {
        flm_out_abort(g_out);
        g_out = NULL;
        snprintf(g_err.msg, sizeof g_err.msg, "%s: out of memory", path);
        return NULL;
    }
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%.0f\" height=\"%.0f\" "
               "viewBox=\"0 0 %.0f %.0f\" font-family=\"Helvetica, Arial, sans-serif\">\n<title>", W, H, W, H);
    svg_escape(f, title);
    fprintf(f, "</title>\n<rect x=\"0\" y=\"0\" width=\"%.0f\" height=\"%.0f\" fill=\"white\"/>\n", W, H);
    text(f, W / 2, 28, "middle", 16, "font-weight=\"bold\"", title);
    return f;
}

static bool end(FILE *f) {
    fputs("</svg>\n", f);
    flm_out *o = g_out;
    g_out = NULL;
    return flm_out_commit(o, &g_err) == FLM_OK; /* flushes, checks, renames; closes f */
}

/* The y axis (ticks, grid, label) and the x axis line; numeric x ticks when xn > 0. */
static void axes(FILE *f, const frame *r, double yfirst, double ystep, int yn, double xfirst, double xstep, int xn,
                 const char *xlabel, const char *ylabel) {
    char buf[64];
    for (int i = 0; i < yn; i++) {
        double v = yfirst + i * ystep, y = fy(r, v);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#dddddd\"/>\n", PX, y, PX + PW, y);
        snprintf(buf, sizeof buf, "%.6g", fabs(v) < 1e-9 * ystep ? 0.0 : v);
        text(f, PX - 6, y + 4, "end", 11, NULL, buf);
    }
    for (int i = 0; i < xn; i++) {
        double v = xfirst + i * xstep, x = fx(r, v);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", x, PY + PH, x,
                PY + PH + 5);
        snprintf(buf, sizeof buf, "%.6g", fabs(v) < 1e-9 * xstep ? 0.0 : v);
        text(f, x, PY + PH + 18, "middle", 11, NULL, buf);
    }
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", PX, PY, PX, PY + PH);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", PX, PY + PH, PX + PW,
            PY + PH);
    text(f, PX + PW / 2, PY + PH + 42, "middle", 13, NULL, xlabel);
    snprintf(buf, sizeof buf, "transform=\"rotate(-90 %.1f %.1f)\"", 22.0, PY + PH / 2);
    text(f, 22, PY + PH / 2, "middle", 13, buf, ylabel);
}

/* Legend entry i: a swatch (a box, or a line, dashed or not) and the name. */
static void legend(FILE *f, int i, const char *name, const char *color, int style) {
    double x = PX + PW + 20, y = PY + 10 + 22 * i;
    if (style == 0)
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"14\" height=\"12\" fill=\"%s\"/>\n", x, y - 10, color);
    else
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"%s/>\n", x,
                y - 4, x + 22, y - 4, color, style == 2 ? " stroke-dasharray=\"6 4\"" : "");
    text(f, x + 28, y, "start", 12, NULL, name);
}

bool svg_line_chart(const char *path, const char *title, const char *xlabel, const char *ylabel,
                    const svg_line *lines, int n_lines) {
    double xlo = INFINITY, xhi = -INFINITY, ylo = 0, yhi = -INFINITY;
    for (int l = 0; l < n_lines; l++)
        for (int i = 0; i < lines[l].n; i++) {
            double x = lines[l].x[i], y = lines[l].y[i];
            if (!isfinite(x) || !isfinite(y)) continue;
            xlo = fmin(xlo, x); xhi = fmax(xhi, x); ylo = fmin(ylo, y); yhi = fmax(yhi, y);
        }
    if (xlo > xhi) xlo = 0, xhi = 1;
    if (yhi <= ylo) yhi = ylo + 1;
    double xf, xs, yf, ys;
    int xn = svg_ticks(xlo, xhi, 8, &xf, &xs), yn = svg_ticks(ylo, yhi, 7, &yf, &ys);
    frame r = {xf, xf + (xn - 1) * xs, yf, yf + (yn - 1) * ys};
    FILE *f = begin(path, title);
    if (!f) return false;
    axes(f, &r, yf, ys, yn, xf, xs, xn, xlabel, ylabel);
    for (int l = 0; l < n_lines; l++) {
        const char *c = COLORS[l % N_COLORS];
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"", c,
                lines[l].dashed ? " stroke-dasharray=\"6 4\"" : "");
        for (int i = 0; i < lines[l].n; i++)
            if (isfinite(lines[l].x[i]) && isfinite(lines[l].y[i]))
                fprintf(f, "%.2f,%.2f ", fx(&r, lines[l].x[i]), fy(&r, lines[l].y[i]));
        fputs("\"/>\n", f);
        for (int i = 0; lines[l].markers && i < lines[l].n; i++)
            if (isfinite(lines[l].x[i]) && isfinite(lines[l].y[i]))
                fprintf(f, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"3.5\" fill=\"%s\"/>\n", fx(&r, lines[l].x[i]),
                        fy(&r, lines[l].y[i]), c);
        legend(f, l, lines[l].name, c, lines[l].dashed ? 2 : 1);
    }
    return end(f);
}

bool svg_stacked_bars(const char *path, const char *title, const char *ylabel, const char *const *cats, int n_cats,
                      const char *const *parts, int n_parts, const double *v) {
#define PART(c, p) (isfinite(v[(c) * n_parts + (p)]) && v[(c) * n_parts + (p)] > 0 ? v[(c) * n_parts + (p)] : 0.0)
    double top = 0;
    for (int c = 0; c < n_cats; c++) {
        double s = 0;
        for (int p = 0; p < n_parts; p++) s += PART(c, p);
        top = fmax(top, s);
    }
    double yf, ys;
    int yn = svg_ticks(0, top > 0 ? top * 1.08 : 1, 7, &yf, &ys);
    frame r = {0, n_cats > 0 ? n_cats : 1, yf, yf + (yn - 1) * ys};
    FILE *f = begin(path, title);
    if (!f) return false;
    axes(f, &r, yf, ys, yn, 0, 0, 0, "", ylabel);
    char buf[64];
    double slot = PW / (n_cats > 0 ? n_cats : 1), bw = fmin(70.0, slot * 0.6);
    for (int c = 0; c < n_cats; c++) {
        double x = PX + slot * (c + 0.5) - bw / 2, s = 0;
        for (int p = 0; p < n_parts; p++) {
            double h = PART(c, p);
            if (h > 0)
                fprintf(f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\"/>\n", x,
                        fy(&r, s + h), bw, fy(&r, s) - fy(&r, s + h), COLORS[p % N_COLORS]);
            s += h;
        }
        snprintf(buf, sizeof buf, "%.3g", s);
        text(f, x + bw / 2, fy(&r, s) - 5, "middle", 11, NULL, buf);
        text(f, x + bw / 2, PY + PH + 18, "middle", 12, NULL, cats[c]);
    }
    for (int p = 0; p < n_parts; p++) legend(f, p, parts[p], COLORS[p % N_COLORS], 0);
    return end(f);
#undef PART
}
