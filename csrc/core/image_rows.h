/*
 * image_rows.h — private to csrc/core: the streaming form of the decoder.  Instead of
 * writing a whole RGB8 image, the decoder hands each converted RGB8 row to a sink as soon
 * as it is final, so vision.c can run the horizontal resize pass while rows are still in
 * cache and never keeps the full-size decoded image.  mml_image_decode is this with a sink
 * that copies rows into the decoder's own buffer.
 *
 * Threads: same rules as mml_decoder (per-thread).  Sinks are called on the calling thread,
 * rows in increasing y, each row exactly once, after begin().
 */
#ifndef MML_IMAGE_ROWS_H
#define MML_IMAGE_ROWS_H

#include "mml/image.h"

typedef struct mml_row_sink {
  /* Called once with the decoded size before the first row. */
  mml_status (*begin)(void *ctx, int width, int height, mml_err *err);
  /* `rgb` holds width*3 bytes, valid only during the call. */
  mml_status (*row)(void *ctx, int y, const uint8_t *rgb, mml_err *err);
  void *ctx;
} mml_row_sink;

mml_status mml_image_decode_rows(mml_decoder *d, const uint8_t *data, size_t len,
                                 int scale_denom, const mml_row_sink *sink, mml_err *err);

#endif
