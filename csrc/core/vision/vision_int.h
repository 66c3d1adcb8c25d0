/*
 * vision_int.h — private to the image preprocessing (vision.c: configuration, planning,
 * scratch and the process entry points; vision_resize.c: the streaming two-pass bicubic
 * resize; vision_patch.c: normalise + patchify into pixel_values).  The design is
 * described at the top of vision.c.  Data flows decoder rows -> resize_job (rows in
 * order) -> row_out (patch_ctx or the plain resize's copy) -> pixel_values.
 */
#ifndef MML_VISION_INT_H
#define MML_VISION_INT_H

#include "mml/image.h"
#include "mml/vision.h"
#include "resize.h"

struct mml_vision_scratch {
  mml_decoder *dec;
  mml_resample_axis ax, ay;
  mml_bytes ring;     /* rows the vertical pass still needs (see resize_job) */
  mml_bytes pend;     /* rows waiting for the horizontal pass */
  mml_bytes tbuf;     /* transposed rows for the horizontal pass */
  mml_bytes rows;     /* planar output rows of the plain resize (mml_resize_bicubic_rgb8) */
  const uint8_t **rp; /* row pointers for one vertical output */
  size_t rp_cap;
  mml_bytes block;  /* two blocks of P*M planar output rows for patchify */
  mml_bytes turned; /* an EXIF-transposed image (the load_image route), or a pre-resized one */
  mml_bytes pre;    /* the other pre-resized image (recipe llama-factory: prescale.c) */
  float *ptmp;      /* one patch, aligned, for non-temporal output stores */
  size_t ptmp_cap;
  /* normalisation of the last config seen: the reference values per channel and byte,
   * and whether the division-free vector formula reproduces all of them */
  int norm_valid, norm_fast;
  float norm_mean[3], norm_std[3];
  float lut[3][256];
  uint16_t lut16[3][256]; /* lut rounded to bfloat16 */
  double decode_s;        /* time inside the decoder itself (mml_vision_scratch_decode_s) */
};

/* A streaming two-pass resize.  Decoded rows arrive in order; each output row is produced
 * as soon as the input rows it reads are there, written planar where the consumer says
 * (row_out) and announced in order.  The horizontal pass runs on groups of rows (resize.c
 * vectorises across MML_HROWS of them; MML_HROWS_RING rows are gathered when the results
 * go to the ring, MML_HROWS when they go to a row_out) and writes planar rows, so rows wait
 * in `pend` until a group is full or no more rows will come.  Rows the vertical pass still needs live in a
 * ring: horizontally resized rows (planar) when the horizontal pass runs first, source rows
 * (interleaved) when the vertical pass runs first (Pillow 13's choice, resize.h), source
 * rows split to planar when there is no horizontal pass. */
typedef struct row_out {
  /* Planar destination of output row y: channel c of pixel x goes to dst + c*plane + x.
   * Up to MML_HROWS rows may be asked for before the first of them is announced. */
  uint8_t *(*dst)(void *ctx, int y);
  void (*done)(void *ctx, int y); /* row y is written; rows come in increasing y */
  void *ctx;
  size_t plane;
} row_out;

typedef struct resize_job {
  mml_vision_scratch *s;
  int dst_w, dst_h;
  int expect_w, expect_h; /* 0: accept the decoder's size (fast JPEG decode) */
  int h_first_always;     /* Pillow <= 12 order */
  row_out out;
  int src_w, src_h;
  int need_h, need_v, vfirst;
  int ring_n;
  size_t slot;         /* bytes per ring row */
  size_t pstride;      /* bytes per pend row (a source-width row and MML_ROW_SLACK) */
  int row_end;         /* source rows from here on are not read */
  int next;            /* next vertical output row (or next row when there is no vertical pass) */
  int pend_n, pend_y0; /* rows waiting for the horizontal pass and the first one's index */
  int hrows;           /* rows gathered for each horizontal pass: MML_HROWS_RING when its
                        * results go to the ring, else MML_HROWS (what a row_out takes) */
} resize_job;

/* The resize job (vision_resize.c).  begin/row/row_buf have mml_row_sink's signatures
 * (ctx is the resize_job); feed runs a whole RGB8 image through begin/row/done. */
mml_status mml_resize_job_begin(void *ctx, int w, int h, mml_err *err);
mml_status mml_resize_job_row(void *ctx, int y, const uint8_t *rgb, mml_err *err);
uint8_t *mml_resize_job_row_buf(void *ctx, int y);
mml_status mml_resize_job_done(const resize_job *j, mml_err *err);
mml_status mml_resize_job_feed(resize_job *j, const mml_rgb8 *img, mml_err *err);

typedef struct patch_ctx patch_ctx;
/* A writer: every patch of block row bh, patch columns [bw0, bw1), in one pixel format. */
typedef void (*patch_writer)(patch_ctx *g, int bh, int bw0, int bw1);

struct patch_ctx {
  int P, M, gw;
  int S, slot0, nslots; /* frame slots per output row; the ones this image fills */
  uint8_t *out;         /* first output row */
  size_t row_bytes;     /* bytes per output row: 3*S*P*P values */
  patch_writer write;   /* the writer of the format (mml_patch_init) */
  uint8_t *block;       /* 2 x 3 planes x P*M output rows of W+16 bytes (scratch) */
  size_t half;          /* bytes of one block */
  float *ptmp;          /* one patch row (row_bytes), 64-byte aligned, or NULL */
  int fast;             /* the AVX2 float32 writer may use norm8_fast (verified for this config) */
  int pend_bh, pend_bw; /* block row still being written (-1: none), next patch column */
  float mean[3], std[3];
  const float (*lut)[256];      /* [3][256] reference values (scratch) */
  const uint16_t (*lut16)[256]; /* [3][256] the same, rounded to bfloat16 (scratch) */
  /* qwen-vl-utils route: a colour the processor turns white after that route's resize
   * (mml_decoder_color_key), asked of `dec` at the first output row */
  const mml_decoder *dec;
  int key; /* -1: not asked yet, 0: none, 1: kc */
  uint8_t kc[3];
};

/* Patchify (vision_patch.c): init for one image and plan, the row_out that writes output
 * rows into the planar block, and finish, which writes the last waiting block. */
mml_status mml_patch_init(patch_ctx *g, mml_vision_scratch *s, const mml_vision_cfg *cfg,
                          const mml_vision_plan *plan, const mml_pixel_dst *dst, mml_err *err);
row_out mml_patch_out(patch_ctx *g);
void mml_patch_finish(patch_ctx *g);

#endif
