/*
 * loader_expand.c — a compact batch's expansion (its uint8 image rows into float rows:
 * loader_collator.c emit_expand) shared with the workers that look for work while the
 * consumer has nothing ready.
 *
 * Why (issue 34, never late).  With float pixels a batch is decoded as uint8 rows and
 * expanded when it is emitted: about 24 float bytes written per image pixel, a fifth of
 * the loader's CPU on the never-late bench's photo mix (benchmarks/bench_never_late.py:
 * the emissions' busy time 2.1 s against 8.9 s of decode and resize over 96 batches, a
 * batch's expansion 22 ms on average and 60 ms and more for the batches holding an
 * 8-12 MP photo).  One worker expanded a whole batch while the other went on decoding
 * later batches, so a batch the consumer was already waiting for arrived a whole
 * expansion after its last decode, and the slowest batches (one large photo: its decode
 * on one worker, then its expansion on one worker) were slowest by that much.
 *
 * How.  The emitting worker cuts the rows that may be expanded in any order into chunks
 * of XS_CHUNK rows (in place: the first run, mml_pixels_inplace_free_from, 7/8 of the
 * rows for float32 with T = 2; into a separate float buffer: all rows) and publishes them
 * in L->xs; it takes chunks itself, front to back.  A worker looking for work
 * (loader_worker.c take_task_locked, after emitting and before any decode) takes a chunk
 * of it while the output queue is empty: the consumer waits for this batch or will next.
 * With batches queued for the consumer the helpers decode as before (later batches).
 * Once every chunk is taken the emitter unpublishes the job, waits for the helpers still
 * expanding theirs, and finishes the remaining in-place runs alone (mml_pixels_expand_inplace
 * on the rows before the first run: 1/8 of them).
 *
 * Invariants (tests/c/vision/test-vision.c pixels_expand_in_place_split,
 * tests/test_compact_pixels.py test_shared_expansion_is_the_same_batches cite them):
 *   X1. The bytes are those of the unshared expansion whoever expands which chunk: each
 *       chunk goes through mml_pixels_expand on its own rows, its output past every uint8
 *       row still unread (pixels.c), and the in-place runs after the first start only
 *       once every chunk is done.
 *   X2. The emitter returns only when no helper writes into its buffer any more: the job
 *       lives on its stack, is unpublished once its chunks are all taken, and the emitter
 *       waits (under mu) until the helpers' count is 0.
 *   X3. Bounded, interruptible: a chunk is XS_CHUNK rows (2.4 MB of float32 output for
 *       patch 14, well under a millisecond); a helper takes one chunk per look and goes
 *       back to its loop, which checks `stop`; the emitter waits at most for the chunks
 *       the helpers hold.
 *   X4. Nothing is allocated and no byte is counted anew (max_memory): the rows are the
 *       emission's, already in its buffers; one job is shared at a time.
 *
 * Locking: L->xs and the job's next, helpers and status are guarded by the loader's mu.
 */
#include "loader_int.h"

enum { XS_CHUNK = 512 }; /* rows per chunk */

/* Rows [a, b) of job x (mu not held). */
static mml_status xs_rows(const ld_xshare *x, int64_t a, int64_t b, mml_err *err) {
  return mml_pixels_expand(x->src + (size_t)a * x->in_row, b - a, x->patch, 1, x->T, x->table,
                           x->format, x->dst + (size_t)a * x->out_row, err);
}

mml_status ld_expand_shared(mml_loader *L, mml_buf *u8, mml_buf *f, int64_t rows, mml_err *err) {
  const mml_vision_cfg *v = &L->src[0].vision;
  const float(*table)[256] = (const float(*)[256])L->ptable;
  const int fmt = L->ccfg.pixel_format, P = v->patch_size, T = v->temporal_patch_size;
  const int inplace = u8 == f;
  /* the rows that may go in any order: [from, rows) */
  const int64_t from = inplace ? mml_pixels_inplace_free_from(rows, P, T, fmt) : 0;
  ld_xshare x = {.src = u8->data,
                 .dst = f->data,
                 .in_row = 3 * (size_t)P * P,
                 .out_row = L->expand_row_bytes,
                 .patch = P,
                 .T = T,
                 .format = fmt,
                 .table = table,
                 .next = from,
                 .end = rows};
  int shared = 0;
  if (L->cfg.num_threads > 1 && rows - from >= 2 * XS_CHUNK) {
    pthread_mutex_lock(&L->mu);
    if (!L->xs) {
      pthread_cond_init(&x.done_cv, NULL);
      L->xs = &x;
      shared = 1;
      ld_work_wake(L, 1); /* idle workers: a chunk for you */
    }
    pthread_mutex_unlock(&L->mu);
  }
  mml_status st = MML_OK;
  if (!shared) {
    if (inplace) return mml_pixels_expand_inplace(f->data, rows, P, T, table, fmt, err);
    return mml_pixels_expand(u8->data, rows, P, 1, T, table, fmt, f->data, err);
  }
  pthread_mutex_lock(&L->mu);
  while (x.next < x.end && !x.st) { /* X3: a chunk at a time, like the helpers */
    const int64_t a = x.next, b = a + XS_CHUNK < x.end ? a + XS_CHUNK : x.end;
    x.next = b;
    pthread_mutex_unlock(&L->mu);
    mml_err e;
    mml_err_clear(&e);
    mml_status s = xs_rows(&x, a, b, &e);
    pthread_mutex_lock(&L->mu);
    if (s && !x.st) x.st = s, x.err = e;
  }
  if (L->xs == &x) L->xs = NULL; /* X2: no helper takes a chunk any more */
  while (x.helpers > 0) pthread_cond_wait(&x.done_cv, &L->mu);
  pthread_mutex_unlock(&L->mu);
  pthread_cond_destroy(&x.done_cv);
  if (x.st) {
    *err = x.err;
    return x.st;
  }
  if (inplace) st = mml_pixels_expand_inplace(f->data, from, P, T, table, fmt, err); /* X1 */
  return st;
}

int ld_expand_help_locked(mml_loader *L) {
  ld_xshare *x = L->xs;
  if (!x || L->out_count > 0 || x->next >= x->end || x->st) return 0;
  const int64_t a = x->next, b = a + XS_CHUNK < x->end ? a + XS_CHUNK : x->end;
  x->next = b;
  if (b >= x->end) L->xs = NULL; /* every chunk taken */
  x->helpers++;
  pthread_mutex_unlock(&L->mu);
  const double t0 = mml_now();
  mml_err e;
  mml_err_clear(&e);
  mml_status s = xs_rows(x, a, b, &e);
  const double dt = mml_now() - t0;
  pthread_mutex_lock(&L->mu);
  L->collate_s += dt; /* the emission's busy time, wherever it runs */
  L->shared_rows += (uint64_t)(b - a);
  if (s && !x->st) x->st = s, x->err = e;
  if (--x->helpers == 0) pthread_cond_signal(&x->done_cv); /* X2: x is not touched after */
  return 1;
}
