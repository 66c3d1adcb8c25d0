/*
 * mml/sample.h — one finished sample: what a worker produces (token ids, labels, pixel
 * rows, image grids) and the collator consumes, in stream order.
 *
 * Ownership: the engine owns a ring of samples and reuses their buffers (capacity is kept,
 * so steady state does not allocate).  The collator takes a sample's contents with
 * mml_sample_swap, leaving it its own spare buffers.
 */
#ifndef MML_SAMPLE_H
#define MML_SAMPLE_H

#include "mml/common.h"

typedef struct mml_sample {
  int64_t epoch, pos; /* stream coordinates */
  int64_t index;      /* global sample index (over all shards) */
  int source;         /* its source (mixture) */
  uint64_t bytes;     /* record + image bytes read for it */
  int shard;          /* shard number and 1-based line, for messages */
  int64_t line;
  mml_status status; /* MML_OK, or why it failed */
  mml_err err;
  mml_ids input_ids;    /* L token ids */
  mml_ids labels;       /* L labels, MML_IGNORE_INDEX where unsupervised */
  mml_bytes pixels;     /* [pixel_rows, pixel_cols] in the loader's pixel_format;
                        empty when pixels_elsewhere */
  int pixels_elsewhere; /* 1: the rows are written straight into the batch's buffer
                        (the loader: planned from headers, decoded in place) */
  int64_t pixel_rows;
  int pixel_cols;
  mml_ids grids; /* int32 [nimages * 3]: (t, h, w) per image */
  int nimages;
  int64_t vision_tokens; /* its <|image_pad|> tokens (also in a planning pass, which
                          has no grids) */
  /* videos (mml/video_frames.h), in order of appearance; their pixel_values_videos rows
   * ([vpixel_rows, mml_vision_video_cols] in the pixel format) are always written
   * elsewhere: straight into the batch's buffer (mml_sample_decode_videos) */
  int64_t vpixel_rows; /* planned rows */
  mml_ids vgrids;      /* int32 [nvideos * 3]: (t, h, w) per video */
  mml_bytes vsecs;     /* float32 [nvideos]: second_per_grid_ts (Qwen2.5-VL) */
  int nvideos;
  /* A pack of records (Qwen's data_packing, mml/record.h): int32 [nsubs * 3], per record
   * in order (tokens, images, videos), the records' ids back to back in input_ids and
   * their images / videos in order in grids / vgrids.  Empty: one plain record. */
  mml_ids subs;
} mml_sample;

/* Clears contents, keeps capacity. */
void mml_sample_reset(mml_sample *s);
void mml_sample_free(mml_sample *s);
/* Exchanges every field of a and b (buffers move, nothing is copied). */
void mml_sample_swap(mml_sample *a, mml_sample *b);

#endif
