// bench/sort_times.h: the host-side benchmarks' timings sorted ascending, in place (each takes its median from them).
#ifndef DJINN_BENCH_SORT_TIMES_H
#define DJINN_BENCH_SORT_TIMES_H

#include <stdlib.h>

static int sort_times_cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static inline void sort_times(double *t, int n) { qsort(t, (size_t)n, sizeof *t, sort_times_cmp); }

#endif
