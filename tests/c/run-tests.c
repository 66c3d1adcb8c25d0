/*
 * run-tests.c — the one runner of the C core's tests (libuv's test runner model).
 *
 *   ./run-tests              every test of test-list.h, in order, each in its own child
 *   ./run-tests NAME...      only those (each still in its own child)
 *   ./run-tests --list       the names
 *   ./run-tests --no-fork NAME  one test in this process (for a debugger)
 *
 * Each test runs in a forked child with a timeout (MML_TEST_TIMEOUT seconds, default
 * 600: sanitizer builds on a busy machine are slow); the child's exit status is the
 * test's result, so a crash, a sanitizer report that exits non-zero, or a hang fails that
 * test alone and the others still run.  Prints "ok   NAME" or "FAIL NAME (why)" per test
 * and "N of M failed" at the end; exits 1 when any failed.  The parent is single-threaded
 * (fork is safe under TSan); a test may start threads of its own.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test-list.h"

int mml_test_failures;
const char *mml_test_current;

static const mml_test_entry *find(const char *name) {
  for (const mml_test_entry *t = k_tests; t->name; t++)
    if (!strcmp(t->name, name)) return t;
  return NULL;
}

/* In this process: 0 when every check passed. */
static int run_here(const mml_test_entry *t) {
  mml_test_current = t->name;
  mml_test_failures = 0;
  t->fn();
  fflush(stdout);
  return mml_test_failures ? 1 : 0;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* In a child with a timeout: 0 when it passed. */
static int run_child(const mml_test_entry *t, unsigned timeout) {
  fflush(stdout);
  fflush(stderr);
  double t0 = now();
  pid_t pid = fork();
  if (pid < 0) {
    fprintf(stderr, "FAIL %s (fork: %s)\n", t->name, strerror(errno));
    return 1;
  }
  if (pid == 0) {
    signal(SIGALRM, SIG_DFL);
    alarm(timeout);
    exit(run_here(t)); /* atexit handlers (fixtures' cleanup) and sanitizers' run here */
  }
  int ws;
  while (waitpid(pid, &ws, 0) < 0)
    if (errno != EINTR) {
      fprintf(stderr, "FAIL %s (waitpid: %s)\n", t->name, strerror(errno));
      return 1;
    }
  double dt = now() - t0;
  if (WIFEXITED(ws) && WEXITSTATUS(ws) == 0) {
    fprintf(stderr, "ok   %s (%.1f s)\n", t->name, dt);
    return 0;
  }
  if (WIFSIGNALED(ws) && WTERMSIG(ws) == SIGALRM)
    fprintf(stderr, "FAIL %s (timed out after %u s)\n", t->name, timeout);
  else if (WIFSIGNALED(ws))
    fprintf(stderr, "FAIL %s (signal %d: %s)\n", t->name, WTERMSIG(ws), strsignal(WTERMSIG(ws)));
  else
    fprintf(stderr, "FAIL %s (exit status %d)\n", t->name, WEXITSTATUS(ws));
  return 1;
}

int main(int argc, char **argv) {
  const char *to = getenv("MML_TEST_TIMEOUT");
  unsigned timeout = to && atoi(to) > 0 ? (unsigned)atoi(to) : 600;
  if (argc == 2 && !strcmp(argv[1], "--list")) {
    for (const mml_test_entry *t = k_tests; t->name; t++) printf("%s\n", t->name);
    return 0;
  }
  if (argc == 3 && !strcmp(argv[1], "--no-fork")) {
    const mml_test_entry *t = find(argv[2]);
    if (!t) {
      fprintf(stderr, "no test named %s (./run-tests --list)\n", argv[2]);
      return 2;
    }
    int r = run_here(t);
    fprintf(stderr, "%s %s\n", r ? "FAIL" : "ok  ", t->name);
    return r;
  }
  int failed = 0, ran = 0;
  if (argc > 1) {
    for (int i = 1; i < argc; i++)
      if (!find(argv[i])) {
        fprintf(stderr, "no test named %s (./run-tests --list)\n", argv[i]);
        return 2;
      }
    for (int i = 1; i < argc; i++, ran++) failed += run_child(find(argv[i]), timeout);
  } else {
    for (const mml_test_entry *t = k_tests; t->name; t++, ran++) failed += run_child(t, timeout);
  }
  if (failed) fprintf(stderr, "%d of %d failed\n", failed, ran);
  return failed ? 1 : 0;
}
