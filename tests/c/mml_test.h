/*
 * mml_test.h — a tiny test harness for the C core (libuv style): TEST() functions in one
 * test-<area>.c per subsystem, listed in test-list.h, all linked into one program,
 * run-tests (run-tests.c), which runs each in its own child process.  Assertions print
 * both values on failure and return from the test.  Built plain, under ASan+UBSan and
 * under TSan by the Makefile.
 */
#ifndef MML_TEST_H
#define MML_TEST_H
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*mml_test_fn)(void);
typedef struct mml_test_entry {
  const char *name;
  mml_test_fn fn;
} mml_test_entry;
/* the running test's name and its failed checks (run-tests.c) */
extern int mml_test_failures;
extern const char *mml_test_current;

#define FAIL_AT(...)                                                              \
  do {                                                                            \
    fprintf(stderr, "  FAIL %s (%s:%d): ", mml_test_current, __FILE__, __LINE__); \
    fprintf(stderr, __VA_ARGS__);                                                 \
    fprintf(stderr, "\n");                                                        \
    mml_test_failures++;                                                          \
    return;                                                                       \
  } while (0)

#define CHECK(cond)                    \
  do {                                 \
    if (!(cond)) FAIL_AT("%s", #cond); \
  } while (0)
#define CHECK_EQ_INT(a, b)                                           \
  do {                                                               \
    long long _a = (long long)(a), _b = (long long)(b);              \
    if (_a != _b) FAIL_AT("%s == %s: %lld != %lld", #a, #b, _a, _b); \
  } while (0)
#define CHECK_EQ_STR(a, b)                                                     \
  do {                                                                         \
    const char *_a = (a), *_b = (b);                                           \
    if (strcmp(_a, _b)) FAIL_AT("%s == %s: \"%s\" != \"%s\"", #a, #b, _a, _b); \
  } while (0)
/* Checks an mml_status call; prints the error detail of `err` (an mml_err) on failure. */
#define CHECK_OK(call, err)                                                             \
  do {                                                                                  \
    mml_status _st = (call);                                                            \
    if (_st != MML_OK) FAIL_AT("%s -> %s: %s", #call, mml_status_name(_st), (err).msg); \
  } while (0)

#define TEST(name) void mml_test_##name(void)
#define TEST_DECLARE(name) void mml_test_##name(void);
#define TEST_ENTRY(name) {#name, mml_test_##name},
#endif
