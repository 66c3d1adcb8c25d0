/*
 * sample.c — the sample container (mml/sample.h): one sample's ids, labels, pixel rows
 * and grids, reset for reuse without giving back its buffers.
 *
 * Threads: none; one worker owns a sample at a time (the collator after it is handed on).
 * Ownership: a sample owns its buffers; mml_sample_swap exchanges two samples' contents
 * and buffers whole.
 */
#include "mml/sample.h"

#include <string.h>

void mml_sample_reset(mml_sample *s) {
  s->epoch = s->pos = s->index = s->line = 0;
  s->shard = s->source = 0;
  s->bytes = 0;
  s->status = MML_OK;
  mml_err_clear(&s->err);
  mml_ids_clear(&s->input_ids);
  mml_ids_clear(&s->labels);
  mml_bytes_clear(&s->pixels);
  s->pixel_rows = 0;
  s->pixel_cols = 0;
  s->pixels_elsewhere = 0;
  mml_ids_clear(&s->grids);
  s->nimages = 0;
  s->vpixel_rows = 0;
  mml_ids_clear(&s->vgrids);
  mml_bytes_clear(&s->vsecs);
  s->nvideos = 0;
  s->vision_tokens = 0;
  mml_ids_clear(&s->subs);
}

void mml_sample_free(mml_sample *s) {
  mml_ids_free(&s->input_ids);
  mml_ids_free(&s->labels);
  mml_bytes_free(&s->pixels);
  mml_ids_free(&s->grids);
  mml_ids_free(&s->vgrids);
  mml_bytes_free(&s->vsecs);
  mml_ids_free(&s->subs);
  memset(s, 0, sizeof *s);
}

void mml_sample_swap(mml_sample *a, mml_sample *b) {
  mml_sample t = *a;
  *a = *b;
  *b = t;
}
