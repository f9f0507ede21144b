/* The harness of the C tests (csrc/tests/test_*.c, one binary each): checks that
 * count and report instead of aborting, a named test runner, a seeded generator. */
#ifndef SPARSECOMM_TESTS_HARNESS_H
#define SPARSECOMM_TESTS_HARNESS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static const char* g_test = "";
static long g_checks = 0, g_failed = 0;

#define CHECK(cond)                                                                     \
  do {                                                                                  \
    g_checks++;                                                                         \
    if (!(cond)) {                                                                      \
      g_failed++;                                                                       \
      if (g_failed < 50)                                                                \
        fprintf(stderr, "%s:%d: [%s] check failed: %s\n", __FILE__, __LINE__, g_test, #cond); \
    }                                                                                   \
  } while (0)

#define RUN(fn)                                                                         \
  do {                                                                                  \
    g_test = #fn;                                                                       \
    long before = g_failed;                                                             \
    fn();                                                                               \
    printf("%-32s %s\n", #fn, g_failed == before ? "ok" : "FAILED");                    \
  } while (0)

static uint64_t g_rng = 42;
static uint64_t rnd(void) {
  uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static double rnd_unit(void) { return (double)(rnd() >> 11) / 9007199254740992.0; }

static void* xmalloc(size_t n) {
  void* p = malloc(n ? n : 1);
  if (!p) { fprintf(stderr, "out of memory\n"); exit(2); }
  return p;
}

#endif
