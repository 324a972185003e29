/* STREAM-style memory read bandwidth: every thread sums its share of a large uint64 array
   (OpenMP, first-touch placement), best of N passes. Reports GB/s = bytes read / s (1e9).
   usage: stream [GiB=2] [passes=10]   (threads: OMP_NUM_THREADS, default all cores) */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  double gib = argc > 1 ? atof(argv[1]) : 2.0;
  int passes = argc > 2 ? atoi(argv[2]) : 10;
  size_t n = (size_t)(gib * (double)(1ull << 30)) / sizeof(uint64_t);
  uint64_t *a = aligned_alloc(4096, n * sizeof(uint64_t));
  if (!a) { fprintf(stderr, "stream: cannot allocate %.2f GiB\n", gib); return 1; }
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) a[i] = i * 2654435761u;
  double best = 1e30, sum_t = 0;
  uint64_t check = 0;
  for (int p = 0; p < passes; p++) {
    uint64_t s = 0;
    double t0 = now();
#pragma omp parallel for schedule(static) reduction(+ : s)
    for (size_t i = 0; i < n; i++) s += a[i];
    double t = now() - t0;
    check += s;
    sum_t += t;
    if (t < best) best = t;
  }
  double bytes = (double)n * sizeof(uint64_t);
  printf("stream read: %d threads, %.2f GiB array, %d passes: best %.2f GB/s, mean %.2f GB/s (check %llx)\n",
         omp_get_max_threads(), gib, passes, bytes / best / 1e9, bytes * passes / sum_t / 1e9,
         (unsigned long long)(check & 0xff));
  printf("STREAM_BEST_GBS %.3f\n", bytes / best / 1e9);
  free(a);
  return 0;
}
