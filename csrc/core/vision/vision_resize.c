/*
 * vision_resize.c — the streaming two-pass bicubic resize behind mml_vision_process_* and
 * mml_resize_bicubic_rgb8 (design: vision.c).  Decoded rows arrive in order through
 * mml_row_sink's callbacks (mml_resize_job_begin/row/row_buf); each output row is produced
 * as soon as the source rows it reads are there and handed, planar, to a row_out in
 * increasing order.  Intermediates are a few rows in the scratch (ring, pend, tbuf); the
 * resampling arithmetic itself is resize.c's (Pillow's, bit for bit).
 */
#include <stdlib.h>
#include <string.h>

#include "vision_int.h"
/* ---------------------------------------------------------------- the resize pipeline */

mml_status mml_resize_job_begin(void *ctx, int w, int h, mml_err *err) {
  resize_job *j = ctx;
  mml_vision_scratch *s = j->s;
  if ((j->expect_w && w != j->expect_w) || (j->expect_h && h != j->expect_h))
    return mml_err_set(err, MML_EDECODE, "decoded size %dx%d differs from the header's %dx%d", w, h,
                       j->expect_w, j->expect_h);
  j->src_w = w;
  j->src_h = h;
  j->need_h = w != j->dst_w;
  j->need_v = h != j->dst_h;
  j->vfirst = j->need_h && j->need_v && !j->h_first_always &&
              mml_resample_vertical_first(w, h, j->dst_w, j->dst_h);
  j->next = j->pend_n = j->pend_y0 = 0;
  j->row_end = h;
  mml_status st;
  size_t in_row = (size_t)w * 3, out_row = (size_t)j->dst_w * 3;
  j->pstride = in_row + MML_ROW_SLACK;
  /* into the ring: MML_HROWS_RING rows a pass; a row_out takes MML_HROWS at a time */
  j->hrows = j->need_h && j->need_v && !j->vfirst ? MML_HROWS_RING : MML_HROWS;
  if (j->need_h) {
    if ((st = mml_resample_axis_prepare(&s->ax, w, j->dst_w, 1, err)) != MML_OK) return st;
    if (mml_bytes_reserve(&s->pend, (size_t)j->hrows * j->pstride) ||
        mml_bytes_reserve(&s->tbuf, mml_resample_tbuf_size(w)))
      return mml_err_set(err, MML_ENOMEM, "resize: out of memory for %d-pixel rows", w);
    memset(s->pend.data, 0, (size_t)j->hrows * j->pstride); /* the slack is read, never used */
  }
  if (j->need_v) {
    if ((st = mml_resample_axis_prepare(&s->ay, h, j->dst_h, 0, err)) != MML_OK) return st;
    int first;
    mml_resample_axis_rows(&s->ay, j->dst_h - 1, &first, &j->row_end);
    j->ring_n = mml_resample_axis_taps(&s->ay) + j->hrows;
    j->slot = (j->vfirst || !j->need_h ? in_row : out_row) + MML_ROW_SLACK; /* see row_buf */
    if (mml_bytes_reserve(&s->ring, (size_t)j->ring_n * j->slot))
      return mml_err_set(err, MML_ENOMEM, "resize: out of memory for %d rows of %zu bytes",
                         j->ring_n, j->slot);
    if ((size_t)j->ring_n > s->rp_cap) {
      const uint8_t **rp = realloc(s->rp, (size_t)j->ring_n * sizeof *rp);
      if (!rp) return mml_err_set(err, MML_ENOMEM, "resize: out of memory");
      s->rp = rp;
      s->rp_cap = (size_t)j->ring_n;
    }
  }
  return MML_OK;
}

static uint8_t *ring_row(const resize_job *j, int r) {
  return j->s->ring.data + (size_t)(r % j->ring_n) * j->slot;
}

static void drain(resize_job *j, int last);

/* Runs the horizontal pass on the pending rows.  Horizontal-first: results go to the ring
 * and ready vertical outputs are drained; otherwise the results are output rows. */
static void flush_h(resize_job *j) {
  mml_vision_scratch *s = j->s;
  if (!j->pend_n) return;
  const uint8_t *src[MML_HROWS_RING] = {0};
  uint8_t *dst[MML_HROWS_RING] = {0};
  const int ring = j->need_v && !j->vfirst, n = j->pend_n, y0 = j->pend_y0;
  for (int r = 0; r < n; r++) {
    src[r] = s->pend.data + (size_t)r * j->pstride;
    dst[r] = ring ? ring_row(j, y0 + r) : j->out.dst(j->out.ctx, y0 + r);
  }
  mml_resample_rows_h(&s->ax, src, n, dst, ring ? (size_t)j->dst_w : j->out.plane, s->tbuf.data);
  j->pend_n = 0;
  if (ring) {
    drain(j, y0 + n - 1);
  } else {
    for (int r = 0; r < n; r++) j->out.done(j->out.ctx, y0 + r);
  }
}

static uint8_t *pend_slot(resize_job *j, int y) {
  if (!j->pend_n) j->pend_y0 = y;
  return j->s->pend.data + (size_t)(j->pend_n++) * j->pstride;
}

/* Output rows y and y + 1 (mml_resample_pair_fits) from the ring rows f .. f + 4: two pend
 * slots when vertical-first, else two planar output rows. */
static void drain_pair(resize_job *j, int y, int f) {
  mml_vision_scratch *s = j->s;
  for (int r = 0; r < 5; r++) s->rp[r] = ring_row(j, f + r);
  if (j->vfirst) {
    uint8_t *d0 = pend_slot(j, y), *d1 = pend_slot(j, y + 1);
    mml_resample_rows_v2(&s->ay, y, s->rp, 0, j->src_w * 3, d0, d1);
    j->next = y + 2;
    if (j->pend_n == j->hrows || j->next == j->dst_h) flush_h(j);
    return;
  }
  uint8_t *d0 = j->out.dst(j->out.ctx, y);
  uint8_t *d1 = j->out.dst(j->out.ctx, y + 1);
  for (int c = 0; c < 3; c++)
    mml_resample_rows_v2(&s->ay, y, s->rp, (size_t)c * j->dst_w, j->dst_w, d0 + c * j->out.plane,
                         d1 + c * j->out.plane);
  j->out.done(j->out.ctx, y);
  j->out.done(j->out.ctx, y + 1);
  j->next = y + 2;
}

/* Produces every vertical output whose input rows (up to `last`) are all in the ring; two
 * at a time where they share rows (drain_pair: the first then waits for the second's last
 * row, so the ring holds at most 5 + hrows - 1 rows at once, within ring_n), else one.  A pair's two output rows are
 * asked for before either is done: the patch block holds both (see patch_dst: only a
 * row two blocks on releases a block, and y + 1 is at most one block on). */
static void drain(resize_job *j, int last) {
  mml_vision_scratch *s = j->s;
  while (j->next < j->dst_h) {
    int f, l;
    mml_resample_axis_rows(&s->ay, j->next, &f, &l);
    if (l - 1 > last) break;
    if (mml_resample_pair_fits(&s->ay, j->next) && (!j->vfirst || j->pend_n + 2 <= j->hrows)) {
      if (l > last) break; /* the pair's last row (l) comes next: it is below row_end */
      drain_pair(j, j->next, f);
      continue;
    }
    for (int r = f; r < l; r++) s->rp[r - f] = ring_row(j, r);
    if (j->vfirst) {
      mml_resample_row_v(&s->ay, j->next, s->rp, 0, j->src_w * 3, pend_slot(j, j->next));
      j->next++;
      if (j->pend_n == j->hrows || j->next == j->dst_h) flush_h(j);
    } else { /* planar ring rows of dst_w pixels */
      uint8_t *d = j->out.dst(j->out.ctx, j->next);
      for (int c = 0; c < 3; c++)
        mml_resample_row_v(&s->ay, j->next, s->rp, (size_t)c * j->dst_w, j->dst_w,
                           d + c * j->out.plane);
      j->out.done(j->out.ctx, j->next);
      j->next++;
    }
  }
}

/* mml_row_sink.row_buf: where mml_resize_job_row will keep source row y (a pend or ring
 * slot, both with MML_ROW_SLACK bytes to spare), so the decoder can write it there; NULL
 * when the row is dropped or split.  No state changes: mml_resize_job_row makes the same
 * choice. */
uint8_t *mml_resize_job_row_buf(void *ctx, int y) {
  resize_job *j = ctx;
  if (!j->need_h) return NULL;
  uint8_t *pend = j->s->pend.data + (size_t)j->pend_n * j->pstride;
  if (!j->need_v) return pend;
  if (j->next >= j->dst_h || y >= j->row_end) return NULL;
  int f, l;
  mml_resample_axis_rows(&j->s->ay, j->next, &f, &l);
  if (y < f && !j->pend_n) return NULL;
  return j->vfirst ? ring_row(j, y) : pend;
}

mml_status mml_resize_job_row(void *ctx, int y, const uint8_t *rgb, mml_err *err) {
  resize_job *j = ctx;
  (void)err;
  size_t in_row = (size_t)j->src_w * 3;
  if (!j->need_v) {
    if (!j->need_h) {
      mml_rgb8_split_planar(rgb, j->src_w, j->out.dst(j->out.ctx, y), j->out.plane);
      j->out.done(j->out.ctx, y);
    } else {
      uint8_t *d = pend_slot(j, y);
      if (d != rgb) memcpy(d, rgb, in_row);
      if (j->pend_n == j->hrows || y == j->src_h - 1) flush_h(j);
    }
    j->next = y + 1;
    return MML_OK;
  }
  if (j->next >= j->dst_h || y >= j->row_end) return MML_OK;
  int f, l;
  mml_resample_axis_rows(&j->s->ay, j->next, &f, &l);
  if (y < f && !j->pend_n) return MML_OK; /* no output still to come reads this row */
  if (j->need_h && !j->vfirst) {
    uint8_t *d = pend_slot(j, y);
    if (d != rgb) memcpy(d, rgb, in_row);
    if (j->pend_n == j->hrows || y == j->row_end - 1) flush_h(j);
  } else {
    uint8_t *d = ring_row(j, y);
    if (j->vfirst) {
      if (d != rgb) memcpy(d, rgb, in_row);
    } else {
      mml_rgb8_split_planar(rgb, j->src_w, d, (size_t)j->src_w);
    }
    drain(j, y);
  }
  return MML_OK;
}

mml_status mml_resize_job_done(const resize_job *j, mml_err *err) {
  if (j->next != j->dst_h || j->pend_n)
    return mml_err_set(err, MML_EINTERNAL, "resize produced %d of %d rows", j->next, j->dst_h);
  return MML_OK;
}

mml_status mml_resize_job_feed(resize_job *j, const mml_rgb8 *img, mml_err *err) {
  if (!img || !img->pixels || img->width < 1 || img->height < 1 ||
      img->stride < (size_t)img->width * 3)
    return mml_err_set(err, MML_EINVAL, "bad RGB8 image");
  mml_status st = mml_resize_job_begin(j, img->width, img->height, err);
  if (st != MML_OK) return st;
  for (int y = 0; y < img->height; y++)
    mml_resize_job_row(j, y, img->pixels + (size_t)y * img->stride, err);
  return mml_resize_job_done(j, err);
}
