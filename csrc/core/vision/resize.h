/*
 * resize.h — private to csrc/core: the two passes of Pillow's bicubic resample
 * (Resample.c semantics, 8 bits per channel) as building blocks, so vision.c can run the
 * horizontal pass on rows as they come out of the decoder and fuse the vertical pass with
 * normalisation and patchify.  An axis holds the fixed-point coefficients for one
 * (in, out) pair; it is part of per-thread scratch and recomputed only when the pair
 * changes.
 */
#ifndef MML_RESIZE_H
#define MML_RESIZE_H

#include "mml/common.h"

typedef struct mml_resample_axis {
  int in, out; /* sizes the coefficients below are for (0: none yet) */
  int ksize;   /* coefficients stored per output pixel */
  int rows_h;  /* prepared for mml_resample_rows_h: the VNNI tables below were built */
  int32_t *k;  /* out * ksize fixed-point weights (22 fractional bits) */
  int *bounds; /* out pairs: first input index, number of inputs */
  double *pre; /* out * ksize double weights before fixed-point conversion */
  size_t cap_k, cap_b;
  /* the AVX-512 VNNI horizontal pass (resize_vnni.c): per group of 16 outputs a byte
   * offset (vbase) and vtapg tap groups of 4 vectors (indices, weight digits d0, d1, d2);
   * vgroups 0: that pass is not used for these sizes */
  uint8_t *vt;
  int *vbase;
  size_t cap_vt, cap_vbase;
  int vgroups, vtapg;
  /* its wide variant (downscales past ~2x, vgroups 0): per group of 16 outputs and tap
   * group, wnw[g * wtapg + q] windows of 128 bytes of the row; wt: per (group, tap group)
   * 3 weight-digit vectors, then 3 index vectors (one per channel) per window; wwin: each
   * window's byte offset in the row and byte-lane mask; wgroups 0: not used */
  uint8_t *wt, *wnw;
  struct mml_vwin *wwin;
  size_t cap_wt, cap_wnw, cap_wwin;
  int wgroups, wtapg;
  /* the VNNI vertical pass (a vertical axis: rows_h 0): per output y, MML_VNNI_VWORDS words
   * of packed weight digits (tap group q, digit d: word 3q + d, 4 taps a word), then a word
   * 1 when that pass applies to y; vw_n: outputs it holds (0: none, digits made per call) */
  uint32_t *vw;
  size_t cap_vw;
  int vw_n;
} mml_resample_axis;

#define MML_VNNI_VWORDS 24 /* 8 tap groups x 3 digits: up to 32 taps */

/* One window of resize_vnni.c's wide horizontal pass. */
typedef struct mml_vwin {
  uint64_t mask; /* the byte lanes (4 per output) whose taps this window holds */
  int32_t base;  /* first byte of the window in the interleaved row */
  int32_t pad;
} mml_vwin;

/* Computes (or keeps) the coefficients for resampling `in` samples to `out`; rows_h: the
 * axis is for mml_resample_rows_h, so the VNNI horizontal pass's table is built too (a
 * vertical axis never reads it: building it there cost as much as for the horizontal one,
 * per image). */
mml_status mml_resample_axis_prepare(mml_resample_axis *a, int in, int out, int rows_h,
                                     mml_err *err);
void mml_resample_axis_free(mml_resample_axis *a);

/* 1 when the AVX2 code paths may run (CPU support, and MML_DISABLE_AVX2 unset or "0"). */
int mml_cpu_avx2(void);
/* 1 when mml_cpu_avx2() and the CPU has FMA. */
int mml_cpu_fma(void);
/* 1 when mml_cpu_avx2() and the CPU has AVX-512 F and BW (MML_DISABLE_AVX512 unset or "0"). */
int mml_cpu_avx512(void);
/* 1 when mml_cpu_avx512() and the CPU has AVX-512 VBMI (pixels.c's table lookups). */
int mml_cpu_avx512_vbmi(void);
/* 1 when mml_cpu_avx512() and the CPU has AVX-512 VL, VBMI and VNNI (resize_vnni.c). */
int mml_cpu_avx512_vnni(void);

/* resize_vnni.c: builds the VNNI pass's table for a prepared axis where that pass applies
 * (else leaves vgroups 0); fails only for memory. */
mml_status mml_resample_vnni_prepare(mml_resample_axis *a, mml_err *err);
/* resize_vnni.c: the vertical pass's digits of every output of a prepared vertical axis
 * (a->vw), where the CPU has the pass (else vw_n 0); fails only for memory. */
mml_status mml_resample_vnni_prepare_v(mml_resample_axis *a, mml_err *err);
/* The horizontal pass of mml_resample_rows_h by VNNI when the axis has its table (returns
 * 1, the same bytes), else 0 and nothing done. */
int mml_resample_rows_h_vnni(const mml_resample_axis *a, const uint8_t *const *src, int nrows,
                             uint8_t *const *dst, size_t plane);
/* mml_resample_row_v by VNNI where it applies (n >= 64, at most 32 taps; returns 1, the
 * same bytes), else 0 and nothing done. */
int mml_resample_row_v_vnni(const mml_resample_axis *a, int y, const uint8_t *const *rows,
                            size_t off, int n, uint8_t *restrict dst);

/* Horizontal pass over nrows rows (the same result as row by row), MML_HROWS at a time:
 * the rows are transposed into `tbuf` (mml_resample_tbuf_size(a) bytes of scratch) so
 * each output pixel of all rows is one short vector loop.  Source rows are interleaved
 * RGB, readable MML_ROW_SLACK bytes past their end (a->in * 3 + MML_ROW_SLACK bytes).
 * The output is planar: channel c of output pixel x of row r goes to
 * dst[r][c * plane + x] (nothing outside those a->out bytes per plane is written). */
#define MML_HROWS 8
#define MML_ROW_SLACK 16
/* Rows the streaming resize (vision_resize.c) gathers before each horizontal pass when the
 * results go to the vertical pass's ring (horizontal pass first): fewer, longer turns
 * between the decoder and the pass, whose tables and the decoder's buffers then evict
 * each other less (issue 34: perf at the recipe caps, 8 -> 32 rows: libjpeg's samples -4%,
 * the pass's -8%; 16 rows between the two). */
#define MML_HROWS_RING 32
void mml_resample_rows_h(const mml_resample_axis *a, const uint8_t *const *src, int nrows,
                         uint8_t *const *dst, size_t plane, uint8_t *restrict tbuf);

/* Bytes of the horizontal pass's transposed rows: 3 * MML_HROWS per input pixel, and 8 of
 * slack for the last column's 32-byte vector store. */
static inline size_t mml_resample_tbuf_size(int in) { return (size_t)in * 3 * MML_HROWS + 8; }

/* Vertical pass for output row y: rows[j] + off is input row bounds[2y] + j (the caller
 * keeps only the rows still needed, e.g. in a ring); n bytes per row starting at `off`
 * (any layout: the pass is per byte) go to dst[0, n).  Nothing outside them is read or
 * written. */
void mml_resample_row_v(const mml_resample_axis *a, int y, const uint8_t *const *rows, size_t off,
                        int n, uint8_t *restrict dst);

/* Output rows y and y + 1 at once (the same bytes as two mml_resample_row_v calls):
 * rows[j] + off is input row bounds[2y] + j, for every row either output reads (rows
 * bounds[2y] .. the last row of y + 1).  Faster when mml_resample_pair_fits(a, y): each
 * input row is then loaded once for both outputs. */
void mml_resample_rows_v2(const mml_resample_axis *a, int y, const uint8_t *const *rows, size_t off,
                          int n, uint8_t *restrict dst0, uint8_t *restrict dst1);

/* 1 when output rows y and y + 1 read four rows each, the second starting one row later. */
static inline int mml_resample_pair_fits(const mml_resample_axis *a, int y) {
  return y + 1 < a->out && a->bounds[2 * y + 1] == 4 && a->bounds[2 * y + 3] == 4 &&
         a->bounds[2 * y + 2] == a->bounds[2 * y] + 1;
}

/* Input rows [first, last) that output row y reads. */
static inline void mml_resample_axis_rows(const mml_resample_axis *a, int y, int *first,
                                          int *last) {
  *first = a->bounds[2 * y];
  *last = a->bounds[2 * y] + a->bounds[2 * y + 1];
}

/* Interleaved RGB (w pixels at rgb) -> planar: channel c of pixel x goes to
 * dst[c * plane + x] (nothing else is written; the planes must not overlap rgb). */
void mml_rgb8_split_planar(const uint8_t *restrict rgb, int w, uint8_t *restrict dst, size_t plane);

/* Largest number of inputs any output reads. */
static inline int mml_resample_axis_taps(const mml_resample_axis *a) { return a->ksize; }

/* Pillow >= 13 runs the vertical pass first when the height shrinks by more than twice
 * as many pixels as the width does (older Pillow: always horizontal first). */
static inline int mml_resample_vertical_first(int src_w, int src_h, int dst_w, int dst_h) {
  return (src_h - dst_h) > 0 && (src_h - dst_h) > (src_w - dst_w) * 2;
}

#endif
