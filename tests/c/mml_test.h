/*
 * mml_test.h — a tiny test harness for the C core (libuv style): one test-<area>.c per
 * subsystem, each a program of TEST() functions run by MML_TEST_MAIN.  Assertions print
 * both values on failure.  Built plain, under ASan+UBSan and under TSan by the Makefile.
 */
#ifndef MML_TEST_H
#define MML_TEST_H
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*mml_test_fn)(void);
static int mml_test_failures;
static const char *mml_test_current;

#define FAIL_AT(...)                                                         \
  do {                                                                       \
    fprintf(stderr, "  FAIL %s (%s:%d): ", mml_test_current, __FILE__, __LINE__); \
    fprintf(stderr, __VA_ARGS__);                                            \
    fprintf(stderr, "\n");                                                   \
    mml_test_failures++;                                                     \
    return;                                                                  \
  } while (0)

#define CHECK(cond) \
  do { if (!(cond)) FAIL_AT("%s", #cond); } while (0)
#define CHECK_EQ_INT(a, b)                                                            \
  do {                                                                                \
    long long _a = (long long)(a), _b = (long long)(b);                               \
    if (_a != _b) FAIL_AT("%s == %s: %lld != %lld", #a, #b, _a, _b);                  \
  } while (0)
#define CHECK_EQ_STR(a, b)                                                            \
  do {                                                                                \
    const char *_a = (a), *_b = (b);                                                  \
    if (strcmp(_a, _b)) FAIL_AT("%s == %s: \"%s\" != \"%s\"", #a, #b, _a, _b);        \
  } while (0)
/* Checks an mml_status call; prints the error detail of `err` (an mml_err) on failure. */
#define CHECK_OK(call, err)                                                           \
  do {                                                                                \
    mml_status _st = (call);                                                          \
    if (_st != MML_OK) FAIL_AT("%s -> %s: %s", #call, mml_status_name(_st), (err).msg); \
  } while (0)

#define TEST(name) static void name(void)
#define RUN(name)                                             \
  do {                                                        \
    mml_test_current = #name;                                 \
    int _before = mml_test_failures;                          \
    name();                                                   \
    fprintf(stderr, "%s %s\n", mml_test_failures == _before ? "ok  " : "FAIL", #name); \
  } while (0)
#define MML_TEST_MAIN(...)                                    \
  int main(void) {                                            \
    __VA_ARGS__;                                              \
    if (mml_test_failures) fprintf(stderr, "%d failure(s)\n", mml_test_failures); \
    return mml_test_failures ? 1 : 0;                         \
  }
#endif
