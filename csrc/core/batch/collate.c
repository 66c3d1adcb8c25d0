/*
 * collate.c — finished samples, offered in stream order, become batches of named tensors:
 * padded rows [micro_batch_size, seq_length] or one packed row [1, pack_length].
 *
 * Design:
 *   - The collator keeps the samples of the batch being built (their buffers are swapped in
 *     from the engine's ring, never copied) and only writes tensors in emit(), once the
 *     composition is final.  Every tensor is a fresh pool buffer filled row by row.
 *   - Packing is greedy in stream order: a sample that does not fit closes the pack and is
 *     the first of the next one.  Batch composition is therefore a pure function of the
 *     sample stream, and the engine's stream cursor is all the state a resume needs.
 *   - Labels never cross a sample boundary: shifted labels end each sample with an ignored
 *     label; unshifted packed labels start each sample with one (see mml/collate.h).
 *   - A sample "slot" is the sample plus its padding up to pad_to_multiple (packed mode):
 *     qwen keys: cu_seqlens gives slot offsets, cu_seqlens_unpadded the real lengths;
 *     megatron keys: Megatron's names, cu_seqlens real and cu_seqlens_padded slots.
 *   - Flattened batches (cfg.flatten: Qwen's data_flatten, mml/collate.h) are composed
 *     exactly as padded ones (micro_batch_size samples, the mml_compose_* rule unchanged)
 *     and only laid out differently at emit: one row of the samples back to back, so a
 *     flattened stream holds the same samples in the same batches as the padded one.
 *   - cfg.rope2d (recipe="qwen-vl-finetune", padded rows): M-RoPE positions as Qwen's padded
 *     collator has them, its rope2d.py rule and padding positions 1 (mml/collate.h).
 *   - A sample that is a pack of records (Qwen's data_packing, mml/sample.h subs) is one
 *     sample to composition; only a flattened emit looks inside it: each record gets its
 *     own attention_mask entry and M-RoPE positions from 0, exactly as if its records had
 *     been samples of their own (so a batch of packs is the flattened batch of their
 *     records).  A pack offered to a collator that does not flatten is refused.
 *
 * Threads: a collator is used by one thread at a time; mml_collator_check is const and may
 * run concurrently with anything else.  Ownership: samples added are owned by the collator
 * until emit() or reset(); emitted buffers belong to the batch.
 */
#include "mml/collate.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "mml/mrope.h"
#include "mml/template.h"
#include "mml/vision.h"

struct mml_collator {
  mml_collate_cfg cfg;
  mml_pool *pool;
  int64_t budget;    /* tokens per row: seq_length (padded, 0 = longest) or pack_length */
  int multiple;      /* slot rounding (>= 1) */
  mml_sample *slots; /* samples of the current batch, [0, comp.count) */
  int cap;
  mml_compose comp;   /* the current batch's composition and sums */
  mml_buf *pixbuf[2]; /* attached pixel_values / pixel_values_videos buffers (pixels
                         written elsewhere), or NULL */
};

static int64_t round_up(int64_t n, int64_t m) { return m > 1 ? (n + m - 1) / m * m : n; }

/* Values per pixel_values_videos row. */
static int video_cols(const mml_collate_cfg *cfg) {
  return cfg->video_cols > 0 ? cfg->video_cols : cfg->pixel_cols;
}

/* What M-RoPE needs of a sample's images and videos. */
static mml_mrope_media media_of(const mml_collate_cfg *cfg, const mml_sample *s) {
  return (mml_mrope_media){
      .grids = s->grids.data,
      .nimages = s->nimages,
      .vgrids = s->vgrids.data,
      .nvideos = s->nvideos,
      .second_per_grid = cfg->second_per_grid ? (const float *)s->vsecs.data : NULL,
      .tokens_per_second = MML_QWEN25_TOKENS_PER_SECOND,
      .split_frames = cfg->split_video_frames,
      .legacy_advance = cfg->flatten || cfg->rope2d, /* Qwen's own rope2d.py (mml/collate.h) */
      .image_pad_id = cfg->image_pad_id,
      .video_pad_id = s->nvideos ? cfg->video_pad_id : -1}; /* (0 in a zeroed cfg is a token) */
}

/* Walks a sample's records in order (a pack's, mml/sample.h subs; else the sample as
 * one): record k's ids are [at, at + len), its media those M-RoPE reads. */
typedef struct rec_cursor {
  int k, n;     /* next record, records */
  int64_t at;   /* its first token */
  int img, vid; /* its first image and video */
} rec_cursor;

static rec_cursor records_of(const mml_sample *s) {
  return (rec_cursor){.n = s->subs.len ? (int)(s->subs.len / 3) : 1};
}

/* Record cur->k's ids (*at, *len) and media; advances the cursor. */
static mml_mrope_media next_record(const mml_collate_cfg *cfg, const mml_sample *s, rec_cursor *cur,
                                   int64_t *at, int64_t *len) {
  mml_mrope_media md = media_of(cfg, s);
  *at = cur->at;
  if (!s->subs.len) {
    *len = (int64_t)s->input_ids.len;
    cur->k++;
    return md;
  }
  const int32_t *e = s->subs.data + 3 * cur->k;
  if (cur->img) md.grids += 3 * cur->img;
  if (cur->vid) {
    md.vgrids += 3 * cur->vid;
    if (md.second_per_grid) md.second_per_grid += cur->vid;
  }
  md.nimages = e[1];
  md.nvideos = e[2];
  if (!e[2]) md.video_pad_id = -1;
  *len = e[0];
  cur->at += e[0];
  cur->img += e[1];
  cur->vid += e[2];
  cur->k++;
  return md;
}

/* A pack's record table agrees with the sample: lengths and media counts add up. */
static mml_status check_records(const mml_sample *s, mml_err *err) {
  if (!s->subs.len) return MML_OK;
  int64_t t = 0, im = 0, vi = 0;
  bool ok = s->subs.len % 3 == 0;
  for (size_t k = 0; ok && k < s->subs.len; k += 3) {
    const int32_t *e = s->subs.data + k;
    ok = e[0] >= 1 && e[1] >= 0 && e[2] >= 0;
    t += e[0], im += e[1], vi += e[2];
  }
  if (!ok || t != (int64_t)s->input_ids.len || im != s->nimages || vi != s->nvideos)
    return mml_err_set(err, MML_EINVAL,
                       "sample %lld: its pack's records do not add up to its %zu tokens, %d "
                       "images and %d videos",
                       (long long)s->index, s->input_ids.len, s->nimages, s->nvideos);
  return MML_OK;
}

static mml_status check_cfg(const mml_collate_cfg *c, mml_err *err) {
  if (c->micro_batch_size < 1 && !c->pack && !c->rows_dynamic)
    return mml_err_set(err, MML_ECONFIG, "micro_batch_size must be >= 1 (got %d)",
                       c->micro_batch_size);
  if (c->seq_length < 0 || c->pack_length < 0)
    return mml_err_set(err, MML_ECONFIG, "seq_length and pack_length must be >= 0");
  if (c->pack && c->pack_length <= 0 && c->seq_length <= 0)
    return mml_err_set(err, MML_ECONFIG, "packing needs pack_length (or seq_length) > 0");
  if (c->pad_to_multiple < 0)
    return mml_err_set(err, MML_ECONFIG, "pad_to_multiple must be >= 0 (got %d)",
                       c->pad_to_multiple);
  int64_t row = c->pack ? (c->pack_length > 0 ? c->pack_length : c->seq_length) : c->seq_length;
  if (c->pad_to_multiple > 1 && row > 0 && row % c->pad_to_multiple)
    return mml_err_set(err, MML_ECONFIG, "%s %lld is not a multiple of pad_to_multiple %d",
                       c->pack ? "pack_length" : "seq_length", (long long)row, c->pad_to_multiple);
  if (c->pack && row > INT32_MAX)
    return mml_err_set(err, MML_ECONFIG, "pack_length %lld does not fit cu_seqlens (int32)",
                       (long long)row);
  if (c->keys != MML_KEYS_QWEN && c->keys != MML_KEYS_MEGATRON)
    return mml_err_set(err, MML_ECONFIG, "unknown key style %d", (int)c->keys);
  if (c->text_only_vision < MML_VISION_PLACEHOLDER || c->text_only_vision > MML_VISION_EMPTY)
    return mml_err_set(err, MML_ECONFIG, "unknown text_only_vision %d", c->text_only_vision);
  if (c->pixel_cols < 1 && c->text_only_vision != MML_VISION_OMIT)
    return mml_err_set(err, MML_ECONFIG, "pixel_cols must be >= 1 (got %d)", c->pixel_cols);
  if (c->mrope && c->spatial_merge < 1)
    return mml_err_set(err, MML_ECONFIG, "mrope needs spatial_merge >= 1 (got %d)",
                       c->spatial_merge);
  if (c->flatten && (c->pack || c->seq_length > 0 || c->shift_labels || c->rows_dynamic ||
                     c->keys != MML_KEYS_QWEN || !c->attention_mask))
    return mml_err_set(err, MML_ECONFIG,
                       "a flattened batch (data_flatten) is one row of whole samples with "
                       "cu_seqlens as its attention_mask: not with packing, seq_length, "
                       "shift_labels, a token budget, megatron keys or attention_mask=False");
  return MML_OK;
}

mml_status mml_collator_new(const mml_collate_cfg *cfg, mml_pool *pool, mml_collator **out,
                            mml_err *err) {
  if (!cfg || !pool || !out) return mml_err_set(err, MML_EINVAL, "collator: NULL argument");
  mml_status st = check_cfg(cfg, err);
  if (st) return st;
  mml_collator *c = calloc(1, sizeof *c);
  if (!c) return mml_err_set(err, MML_ENOMEM, "collator: out of memory");
  c->cfg = *cfg;
  if (c->cfg.pack) c->cfg.micro_batch_size = 1; /* one pack per batch */
  c->pool = pool;
  c->budget =
      cfg->pack ? (cfg->pack_length > 0 ? cfg->pack_length : cfg->seq_length) : cfg->seq_length;
  c->multiple = cfg->pad_to_multiple > 1 ? cfg->pad_to_multiple : 1;
  *out = c;
  return MML_OK;
}

void mml_collator_free(mml_collator *c) {
  if (!c) return;
  mml_buf_release(c->pixbuf[0]);
  mml_buf_release(c->pixbuf[1]);
  for (int i = 0; i < c->cap; i++) mml_sample_free(&c->slots[i]);
  free(c->slots);
  free(c);
}

int64_t mml_collator_sample_tokens(const mml_collator *c, const mml_sample *s) {
  int64_t n = (int64_t)s->input_ids.len;
  return c->cfg.pack ? round_up(n, c->multiple) : n;
}

mml_status mml_collator_check_length(const mml_collator *c, int64_t n, mml_err *err) {
  int64_t slot = c->cfg.pack ? round_up(n, c->multiple) : n;
  if (c->budget > 0 && slot > c->budget) {
    if (slot != n)
      return mml_err_set(err, MML_ETOOLONG,
                         "sample of %lld tokens (%lld padded to a multiple of %d) exceeds "
                         "%s %lld",
                         (long long)n, (long long)slot, c->multiple,
                         c->cfg.pack ? "pack_length" : "seq_length", (long long)c->budget);
    return mml_err_set(err, MML_ETOOLONG, "sample of %lld tokens exceeds %s %lld", (long long)n,
                       c->cfg.pack ? "pack_length" : "seq_length", (long long)c->budget);
  }
  return MML_OK;
}

mml_status mml_collator_check(const mml_collator *c, const mml_sample *s, mml_err *err) {
  int64_t n = (int64_t)s->input_ids.len;
  if (n < 1) return mml_err_set(err, MML_EINVAL, "sample %lld has no tokens", (long long)s->index);
  if (s->labels.len != s->input_ids.len)
    return mml_err_set(err, MML_EINVAL, "sample %lld: %zu ids but %zu labels", (long long)s->index,
                       s->input_ids.len, s->labels.len);
  mml_status st = mml_collator_check_length(c, n, err);
  if (st) return st;
  if (s->nimages < 0 || s->grids.len != (size_t)s->nimages * 3)
    return mml_err_set(err, MML_EINVAL, "sample %lld: %d images but %zu grid values",
                       (long long)s->index, s->nimages, s->grids.len);
  int64_t rows = 0;
  for (int i = 0; i < s->nimages; i++) {
    const int32_t *g = s->grids.data + 3 * i;
    if (g[0] < 1 || g[1] < 1 || g[2] < 1)
      return mml_err_set(err, MML_EINVAL, "sample %lld: image %d has grid (%d, %d, %d)",
                         (long long)s->index, i, g[0], g[1], g[2]);
    rows += (int64_t)g[0] * g[1] * g[2];
  }
  if (rows != s->pixel_rows)
    return mml_err_set(err, MML_EINVAL, "sample %lld: grids hold %lld patches but %lld pixel rows",
                       (long long)s->index, (long long)rows, (long long)s->pixel_rows);
  if (s->pixel_rows > 0) {
    if (s->pixel_cols != c->cfg.pixel_cols)
      return mml_err_set(err, MML_EINVAL, "sample %lld: %d pixel columns, the loader expects %d",
                         (long long)s->index, s->pixel_cols, c->cfg.pixel_cols);
    const mml_dtype dt = mml_pixel_format_dtype(c->cfg.pixel_format);
    if (!s->pixels_elsewhere &&
        s->pixels.len != (size_t)s->pixel_rows * (size_t)s->pixel_cols * mml_dtype_size(dt))
      return mml_err_set(err, MML_EINVAL, "sample %lld: %zu pixel bytes for [%lld, %d] %s",
                         (long long)s->index, s->pixels.len, (long long)s->pixel_rows,
                         s->pixel_cols, mml_dtype_name(dt));
  }
  if (s->nvideos < 0 || s->vgrids.len != (size_t)s->nvideos * 3 ||
      s->vsecs.len != (size_t)s->nvideos * sizeof(float))
    return mml_err_set(err, MML_EINVAL, "sample %lld: %d videos but %zu grid values",
                       (long long)s->index, s->nvideos, s->vgrids.len);
  int64_t vrows = 0;
  for (int i = 0; i < s->nvideos; i++) {
    const int32_t *g = s->vgrids.data + 3 * i;
    if (g[0] < 1 || g[1] < 1 || g[2] < 1)
      return mml_err_set(err, MML_EINVAL, "sample %lld: video %d has grid (%d, %d, %d)",
                         (long long)s->index, i, g[0], g[1], g[2]);
    vrows += (int64_t)g[0] * g[1] * g[2];
  }
  if (vrows != s->vpixel_rows)
    return mml_err_set(err, MML_EINVAL, "sample %lld: video grids hold %lld patches but %lld rows",
                       (long long)s->index, (long long)vrows, (long long)s->vpixel_rows);
  if ((st = check_records(s, err))) return st;
  if (s->subs.len && !c->cfg.flatten)
    return mml_err_set(err, MML_EINVAL,
                       "sample %lld is a pack of records: only flattened batches hold packs",
                       (long long)s->index);
  for (rec_cursor r = records_of(s); c->cfg.mrope && !st && r.k < r.n;) {
    int64_t at, len;
    mml_mrope_media md = next_record(&c->cfg, s, &r, &at, &len);
    st = mml_mrope_positions_media(s->input_ids.data + at, len, &md, c->cfg.spatial_merge, NULL, 0,
                                   NULL, err);
    if (st) mml_err_prefix(err, "sample %lld", (long long)s->index);
  }
  return st;
}

int mml_compose_fits(const mml_collator *c, const mml_compose *k, int64_t tokens) {
  if (k->count == 0) return 1;
  if (!c->cfg.pack) return c->cfg.rows_dynamic || k->count < c->cfg.micro_batch_size;
  return k->used + tokens <= c->budget;
}

void mml_compose_add(const mml_collator *c, mml_compose *k, const mml_sample *s) {
  const int64_t tokens = mml_collator_sample_tokens(c, s);
  k->count++;
  if (c->cfg.pack)
    k->used += tokens;
  else if (tokens > k->used)
    k->used = tokens;
  k->tokens += (int64_t)s->input_ids.len;
  k->rows += s->pixel_rows;
  k->images += s->nimages;
  k->videos += s->nvideos;
  k->records += records_of(s).n;
}

int mml_compose_full(const mml_collator *c, const mml_compose *k) {
  if (!c->cfg.pack) return !c->cfg.rows_dynamic && k->count >= c->cfg.micro_batch_size;
  return c->budget - k->used < c->multiple;
}

mml_compose mml_collator_compose_state(const mml_collator *c) { return c->comp; }

int64_t mml_collator_rows_bound(const mml_collator *c, int max_merge) {
  if (!c->cfg.pack || c->budget <= 0) return -1;
  return c->budget * (int64_t)max_merge * max_merge;
}

void mml_collator_attach_pixels(mml_collator *c, int videos, mml_buf *buf) {
  mml_buf_retain(buf);
  mml_buf_release(c->pixbuf[videos != 0]);
  c->pixbuf[videos != 0] = buf;
}

mml_buf *mml_collator_attached_pixels(const mml_collator *c, int videos) {
  return c->pixbuf[videos != 0];
}
int64_t mml_collator_rows(const mml_collator *c) { return c->comp.rows; }

int mml_collator_fits(const mml_collator *c, const mml_sample *s) {
  mml_compose k = mml_collator_compose_state(c);
  return mml_compose_fits(c, &k, mml_collator_sample_tokens(c, s));
}

int mml_collator_count(const mml_collator *c) { return c->comp.count; }

int mml_collator_full(const mml_collator *c) {
  mml_compose k = mml_collator_compose_state(c);
  return mml_compose_full(c, &k);
}

mml_status mml_collator_add(mml_collator *c, mml_sample *s, mml_err *err) {
  /* emit() trusts what it was given: a bad sample is refused here, not written past a
   * buffer later. */
  mml_status st = mml_collator_check(c, s, err);
  if (st) return st;
  if (!mml_collator_fits(c, s))
    return mml_err_set(err, MML_EINVAL, "collator: sample %lld does not fit; emit first",
                       (long long)s->index);
  if (c->comp.count == c->cap) {
    int ncap = c->cap ? 2 * c->cap : 8;
    mml_sample *ns = realloc(c->slots, (size_t)ncap * sizeof *ns);
    if (!ns) return mml_err_set(err, MML_ENOMEM, "collator: out of memory");
    memset(ns + c->cap, 0, (size_t)(ncap - c->cap) * sizeof *ns);
    c->slots = ns;
    c->cap = ncap;
  }
  mml_sample *slot = &c->slots[c->comp.count];
  mml_sample_reset(slot);
  mml_sample_swap(slot, s);
  mml_compose_add(c, &c->comp, slot);
  return MML_OK;
}

void mml_collator_reset(mml_collator *c) {
  for (int i = 0; i < c->comp.count; i++) mml_sample_reset(&c->slots[i]);
  memset(&c->comp, 0, sizeof c->comp);
  for (int p = 0; p < 2; p++) {
    mml_buf_release(c->pixbuf[p]);
    c->pixbuf[p] = NULL;
  }
}

/* ---- emit ---------------------------------------------------------------------------- */

typedef struct {
  const char *ids, *labels, *loss_mask, *position_ids, *attention_mask;
} key_names;

static const key_names k_keys[2] = {
    [MML_KEYS_QWEN] = {"input_ids", "labels", NULL, "position_ids", "attention_mask"},
    [MML_KEYS_MEGATRON] = {"tokens", "labels", "loss_mask", "position_ids", "attention_mask"},
};

/* Label of token j of sample s as the batch carries it (see the labels rule in collate.h). */
static inline int64_t label_at(const mml_collator *c, const mml_sample *s, int64_t j) {
  int64_t n = (int64_t)s->labels.len;
  if (c->cfg.shift_labels) return j + 1 < n ? s->labels.data[j + 1] : MML_IGNORE_INDEX;
  if (c->cfg.pack && j == 0) return MML_IGNORE_INDEX;
  return s->labels.data[j];
}

/* Packed text positions: each slot counts from 0 through its padding; so does the tail. */
static void text_positions(int64_t *o, int n, const int64_t *start, const int64_t *slot,
                           int64_t end, int64_t L) {
  for (int i = 0; i < n; i++)
    for (int64_t j = 0; j < slot[i]; j++) o[start[i] + j] = j;
  for (int64_t j = end; j < L; j++) o[j] = j - end;
}

/* What every tensor family of one emit shares: the batch's geometry and where each sample
 * lies in the flattened [B, L] row space. */
typedef struct emit_ctx {
  const mml_collator *c;
  const mml_collate_cfg *cfg;
  const key_names *k;
  mml_batch *out;
  mml_err *err;
  bool pack;
  bool flat;             /* cfg.flatten: one row of whole samples, no padding */
  int n;                 /* samples */
  int64_t B, L, BL;      /* rows, row length, B * L */
  int64_t *start, *slot; /* per sample: first position and slot length (n each) */
  int64_t end;           /* packed: first position of the tail padding; padded: BL */
  int64_t real, maxslot; /* real tokens; longest slot */
} emit_ctx;

/* A new tensor `name` of nd dims in the batch; NULL with the status set on failure. */
static void *emit_tensor(emit_ctx *e, const char *name, mml_dtype dt, int nd, const int64_t *dims,
                         mml_status *st) {
  void *data = NULL;
  *st = mml_batch_add(e->out, e->c->pool, name, dt, nd, dims, &data, e->err);
  return *st ? NULL : data;
}

#define DIMS(...) ((const int64_t[]){__VA_ARGS__})

/* input_ids/tokens: each sample's ids, pad_id elsewhere. */
static mml_status emit_ids(emit_ctx *e) {
  mml_status st;
  int64_t *o = emit_tensor(e, e->k->ids, MML_DT_INT64, 2, DIMS(e->B, e->L), &st);
  if (!o) return st;
  for (int64_t j = 0; j < e->BL; j++) o[j] = e->cfg->pad_id;
  for (int i = 0; i < e->n; i++) {
    const mml_sample *s = &e->c->slots[i];
    for (size_t j = 0; j < s->input_ids.len; j++)
      o[e->start[i] + (int64_t)j] = s->input_ids.data[j];
  }
  return MML_OK;
}

/* labels (and Megatron's loss_mask): ignored outside the samples. */
static mml_status emit_labels(emit_ctx *e) {
  mml_status st;
  int64_t *labels = emit_tensor(e, e->k->labels, MML_DT_INT64, 2, DIMS(e->B, e->L), &st);
  if (!labels) return st;
  for (int64_t j = 0; j < e->BL; j++) labels[j] = MML_IGNORE_INDEX;
  for (int i = 0; i < e->n; i++) {
    const mml_sample *s = &e->c->slots[i];
    for (int64_t j = 0; j < (int64_t)s->labels.len; j++)
      labels[e->start[i] + j] = label_at(e->c, s, j);
  }
  if (!e->k->loss_mask) return MML_OK;
  float *o = emit_tensor(e, e->k->loss_mask, MML_DT_FLOAT32, 2, DIMS(e->B, e->L), &st);
  if (!o) return st;
  for (int64_t j = 0; j < e->BL; j++) o[j] = labels[j] != MML_IGNORE_INDEX ? 1.0f : 0.0f;
  return MML_OK;
}

/* M-RoPE position_ids [3 or 4, B, L] and rope_deltas. */
static mml_status emit_mrope(emit_ctx *e) {
  const mml_collate_cfg *cfg = e->cfg;
  /* qwen keys, packed: a text row first ([4, 1, L]), from which transformers derives the
   * per-sample attention; otherwise the three M-RoPE rows. */
  const int rows = e->pack && cfg->keys == MML_KEYS_QWEN ? 4 : 3;
  mml_status st;
  int64_t *pos = emit_tensor(e, e->k->position_ids, MML_DT_INT64, 3, DIMS(rows, e->B, e->L), &st);
  if (!pos) return st;
  if (cfg->rope2d && !e->pack && !e->flat) /* Qwen's pad_and_cat pads positions with 1 */
    for (int64_t j = 0; j < rows * e->BL; j++) pos[j] = 1;
  else
    memset(pos, 0, (size_t)(rows * e->BL) * sizeof(int64_t));
  if (rows == 4) {
    text_positions(pos, e->n, e->start, e->slot, e->end, e->L);
    pos += e->BL;
  }
  int64_t *deltas = malloc((size_t)e->n * sizeof(int64_t));
  if (!deltas) return mml_err_set(e->err, MML_ENOMEM, "collator: out of memory");
  for (int i = 0; i < e->n && !st; i++) {
    const mml_sample *s = &e->c->slots[i];
    /* a pack's records (flattened only): each its own positions from 0, as Qwen's
     * _get_packed_item concatenates its records' */
    for (rec_cursor r = records_of(s); !st && r.k < r.n;) {
      int64_t at, len;
      mml_mrope_media md = next_record(cfg, s, &r, &at, &len);
      st = mml_mrope_positions_media(s->input_ids.data + at, len, &md, cfg->spatial_merge,
                                     pos + e->start[i] + at, e->BL, &deltas[i], e->err);
    }
    if (st) mml_err_prefix(e->err, "sample %lld", (long long)s->index);
  }
  int64_t nd = e->pack ? e->n : e->B;
  int64_t *d = st || e->flat ? NULL /* Qwen's flattened batch has none */
                             : emit_tensor(e, "rope_deltas", MML_DT_INT64, 2, DIMS(nd, 1), &st);
  for (int64_t r = 0; d && r < nd; r++) d[r] = r < e->n ? deltas[r] : 0;
  free(deltas);
  return st;
}

/* position_ids: M-RoPE, or 0.. per row (padded) / per slot (packed). */
static mml_status emit_positions(emit_ctx *e) {
  if (e->cfg->mrope || e->flat) return emit_mrope(e); /* flattened: always Qwen's M-RoPE */
  mml_status st;
  int64_t *o = emit_tensor(e, e->k->position_ids, MML_DT_INT64, 2, DIMS(e->B, e->L), &st);
  if (!o) return st;
  if (e->pack) {
    text_positions(o, e->n, e->start, e->slot, e->end, e->L);
  } else {
    for (int64_t r = 0; r < e->B; r++)
      for (int64_t j = 0; j < e->L; j++) o[r * e->L + j] = j;
  }
  return MML_OK;
}

/* attention_mask: qwen [B, L] ones on tokens; Megatron [B, 1, L, L] bool, true = masked. */
static mml_status emit_attention(emit_ctx *e) {
  mml_status st;
  const int64_t B = e->B, L = e->L;
  if (e->flat) { /* int32 [records + 1]: cumulative lengths, as Qwen's flattened collator */
    int64_t nrec = 0;
    for (int i = 0; i < e->n; i++) nrec += records_of(&e->c->slots[i]).n;
    int32_t *cu = emit_tensor(e, e->k->attention_mask, MML_DT_INT32, 1, DIMS(nrec + 1), &st);
    if (!cu) return st;
    *cu++ = 0;
    for (int i = 0; i < e->n; i++) {
      const mml_sample *s = &e->c->slots[i];
      for (rec_cursor r = records_of(s); r.k < r.n;) {
        int64_t at, len;
        (void)next_record(e->cfg, s, &r, &at, &len);
        *cu++ = (int32_t)(e->start[i] + at + len);
      }
    }
    return MML_OK;
  }
  if (e->cfg->keys == MML_KEYS_QWEN) {
    int64_t *o = emit_tensor(e, e->k->attention_mask, MML_DT_INT64, 2, DIMS(B, L), &st);
    if (!o) return st;
    memset(o, 0, (size_t)e->BL * sizeof(int64_t));
    for (int i = 0; i < e->n; i++)
      for (size_t j = 0; j < e->c->slots[i].input_ids.len; j++) o[e->start[i] + (int64_t)j] = 1;
    return MML_OK;
  }
  uint8_t *o = emit_tensor(e, e->k->attention_mask, MML_DT_BOOL, 4, DIMS(B, 1, L, L), &st);
  if (!o) return st;
  /* causal: key kk is masked for query q when kk > q; packed also masks keys before the
   * query's slot (the tail padding is a block of its own). */
  for (int64_t r = 0; r < B; r++) {
    int i = 0;
    for (int64_t q = 0; q < L; q++) {
      int64_t lo = 0;
      if (e->pack) {
        while (i < e->n && q >= e->start[i] + e->slot[i]) i++;
        lo = i < e->n ? e->start[i] : e->end;
      }
      uint8_t *rowp = o + (r * L + q) * L;
      memset(rowp, 1, (size_t)L);
      memset(rowp + lo, 0, (size_t)(q + 1 - lo));
    }
  }
  return MML_OK;
}

/* mm_token_type_ids (qwen keys): 1 on image-pad tokens, 2 on video-pad tokens. */
static mml_status emit_token_types(emit_ctx *e) {
  mml_status st;
  int64_t *o = emit_tensor(e, "mm_token_type_ids", MML_DT_INT64, 2, DIMS(e->B, e->L), &st);
  if (!o) return st;
  memset(o, 0, (size_t)e->BL * sizeof(int64_t));
  for (int i = 0; i < e->n; i++) {
    const mml_sample *s = &e->c->slots[i];
    const int32_t vpad = s->nvideos ? e->cfg->video_pad_id : -1;
    for (size_t j = 0; j < s->input_ids.len; j++) {
      int32_t id = s->input_ids.data[j];
      o[e->start[i] + (int64_t)j] = id == e->cfg->image_pad_id ? 1 : id == vpad ? 2 : 0;
    }
  }
  return MML_OK;
}

/* pixel_values and image_grid_thw (or what text_only_vision asks for without images). */
static mml_status emit_vision(emit_ctx *e) {
  const mml_collate_cfg *cfg = e->cfg;
  int64_t rows = 0, nimg = 0;
  for (int i = 0; i < e->n; i++) {
    rows += e->c->slots[i].pixel_rows;
    nimg += e->c->slots[i].nimages;
  }
  if (nimg == 0 && cfg->text_only_vision == MML_VISION_OMIT) return MML_OK;
  const bool holder = nimg == 0 && cfg->text_only_vision == MML_VISION_PLACEHOLDER;
  const int64_t cols = cfg->pixel_cols;
  mml_status st;
  const mml_dtype dt = mml_pixel_format_dtype(cfg->pixel_format);
  uint8_t *o = NULL;
  mml_buf *pixbuf = e->c->pixbuf[0];
  if (!holder && pixbuf) { /* written in place: the tensor views the buffer */
    if (pixbuf->size < (size_t)rows * (size_t)cols * mml_dtype_size(dt))
      return mml_err_set(e->err, MML_EINTERNAL, "collator: %lld pixel rows in a %zu-byte buffer",
                         (long long)rows, pixbuf->size);
    st = mml_batch_add_view(e->out, "pixel_values", dt, 2, DIMS(rows, cols), pixbuf, 0, e->err);
    if (st) return st;
  } else if (!(o = emit_tensor(e, "pixel_values", dt, 2, DIMS(holder ? 1 : rows, cols), &st))) {
    return st;
  }
  if (!o) {
    /* in place already */
  } else if (holder) {
    memset(o, 0, (size_t)cols * mml_dtype_size(dt));
  } else {
    for (int i = 0; i < e->n; i++) {
      const mml_sample *s = &e->c->slots[i];
      if (s->pixel_rows && s->pixels_elsewhere)
        return mml_err_set(e->err, MML_EINTERNAL, "collator: sample %lld has no pixels",
                           (long long)s->index);
      if (s->pixel_rows) memcpy(o, s->pixels.data, s->pixels.len);
      o += s->pixels.len;
    }
  }
  int64_t *g = emit_tensor(e, "image_grid_thw", MML_DT_INT64, 2, DIMS(holder ? 1 : nimg, 3), &st);
  if (!g) return st;
  if (holder) {
    g[0] = g[1] = g[2] = 0;
  } else {
    for (int i = 0; i < e->n; i++) {
      const mml_sample *s = &e->c->slots[i];
      for (size_t j = 0; j < s->grids.len; j++) *g++ = s->grids.data[j];
    }
  }
  return MML_OK;
}

/* pixel_values_videos, video_grid_thw and (Qwen2.5-VL) second_per_grid_ts, in batches
 * that hold a video. */
static mml_status emit_videos(emit_ctx *e) {
  int64_t rows = 0, nv = 0;
  for (int i = 0; i < e->n; i++) {
    rows += e->c->slots[i].vpixel_rows;
    nv += e->c->slots[i].nvideos;
  }
  if (nv == 0) return MML_OK;
  const mml_dtype dt = mml_pixel_format_dtype(e->cfg->pixel_format);
  const int64_t cols = video_cols(e->cfg);
  mml_buf *buf = e->c->pixbuf[1]; /* written in place: the tensor views the buffer */
  if (!buf || buf->size < (size_t)rows * (size_t)cols * mml_dtype_size(dt))
    return mml_err_set(e->err, MML_EINTERNAL,
                       "collator: %lld pixel_values_videos rows in a %zu-byte buffer",
                       (long long)rows, buf ? buf->size : 0);
  mml_status st =
      mml_batch_add_view(e->out, "pixel_values_videos", dt, 2, DIMS(rows, cols), buf, 0, e->err);
  if (st) return st;
  int64_t *g = emit_tensor(e, "video_grid_thw", MML_DT_INT64, 2, DIMS(nv, 3), &st);
  if (!g) return st;
  for (int i = 0; i < e->n; i++)
    for (size_t j = 0; j < e->c->slots[i].vgrids.len; j++) *g++ = e->c->slots[i].vgrids.data[j];
  if (!e->cfg->second_per_grid) return MML_OK;
  float *t = emit_tensor(e, "second_per_grid_ts", MML_DT_FLOAT32, 1, DIMS(nv), &st);
  if (!t) return st;
  for (int i = 0; i < e->n; i++) {
    const mml_sample *s = &e->c->slots[i];
    if (s->vsecs.len) memcpy(t, s->vsecs.data, s->vsecs.len);
    t += s->nvideos;
  }
  return MML_OK;
}

/* Packed-sequence boundaries, qwen keys: cu_seqlens (slots), cu_seqlens_unpadded (when
 * slots are padded), max_seqlen (longest slot). */
static mml_status emit_seqlens(emit_ctx *e) {
  mml_status st;
  const int n = e->n;
  int32_t *cu = emit_tensor(e, "cu_seqlens", MML_DT_INT32, 1, DIMS(n + 1), &st);
  if (!cu) return st;
  cu[0] = 0;
  for (int i = 0; i < n; i++) cu[i + 1] = (int32_t)(e->start[i] + e->slot[i]);
  if (e->c->multiple > 1) {
    int32_t *cu2 = emit_tensor(e, "cu_seqlens_unpadded", MML_DT_INT32, 1, DIMS(n + 1), &st);
    if (!cu2) return st;
    cu2[0] = 0;
    for (int i = 0; i < n; i++) cu2[i + 1] = cu2[i] + (int32_t)e->c->slots[i].input_ids.len;
  }
  int32_t *mx = emit_tensor(e, "max_seqlen", MML_DT_INT32, 1, DIMS(1), &st);
  if (!mx) return st;
  *mx = (int32_t)e->maxslot;
  return MML_OK;
}

/* Packed-sequence boundaries, Megatron's names: cu_seqlens = real lengths,
 * cu_seqlens_padded = slot offsets that cover the row (the tail padding belongs to the
 * last slot), max_seqlen = longest of those padded slots. */
static mml_status emit_seqlens_megatron(emit_ctx *e) {
  mml_status st;
  const int n = e->n;
  int32_t *cu = emit_tensor(e, "cu_seqlens", MML_DT_INT32, 1, DIMS(n + 1), &st);
  if (!cu) return st;
  cu[0] = 0;
  for (int i = 0; i < n; i++) cu[i + 1] = cu[i] + (int32_t)e->c->slots[i].input_ids.len;
  int32_t *cup = emit_tensor(e, "cu_seqlens_padded", MML_DT_INT32, 1, DIMS(n + 1), &st);
  if (!cup) return st;
  cup[0] = 0;
  for (int i = 0; i < n; i++) cup[i + 1] = (int32_t)(e->start[i] + e->slot[i]);
  cup[n] = (int32_t)e->L;
  int64_t longest = 0;
  for (int i = 0; i < n; i++)
    if (cup[i + 1] - cup[i] > longest) longest = cup[i + 1] - cup[i];
  int32_t *mx = emit_tensor(e, "max_seqlen", MML_DT_INT32, 1, DIMS(1), &st);
  if (!mx) return st;
  *mx = (int32_t)longest;
  return MML_OK;
}

/* The batch geometry and each sample's place in it (e->start/slot: caller frees start). */
static mml_status emit_layout(mml_collator *c, emit_ctx *e) {
  const mml_collate_cfg *cfg = &c->cfg;
  e->cfg = cfg;
  e->k = &k_keys[cfg->keys];
  e->pack = cfg->pack != 0;
  e->flat = cfg->flatten != 0;
  e->n = c->comp.count;
  e->B = e->pack || e->flat ? 1 : cfg->rows_dynamic ? c->comp.count : cfg->micro_batch_size;
  e->L = e->pack ? c->budget : (c->budget > 0 ? c->budget : round_up(c->comp.used, c->multiple));
  if (e->flat) { /* the samples back to back */
    e->L = 0;
    for (int i = 0; i < e->n; i++) e->L += (int64_t)c->slots[i].input_ids.len;
    if (e->L > INT32_MAX)
      return mml_err_set(e->err, MML_ETOOLONG,
                         "a flattened batch of %lld tokens does not fit its attention_mask "
                         "(int32 cumulative lengths)",
                         (long long)e->L);
  }
  e->BL = e->B * e->L;
  e->start = malloc((size_t)e->n * 2 * sizeof(int64_t));
  if (!e->start) return mml_err_set(e->err, MML_ENOMEM, "collator: out of memory");
  e->slot = e->start + e->n;
  int64_t tail = 0;
  for (int i = 0; i < e->n; i++) {
    int64_t len = (int64_t)c->slots[i].input_ids.len;
    e->slot[i] = e->pack ? round_up(len, c->multiple) : e->flat ? len : e->L;
    e->start[i] = e->pack || e->flat ? tail : (int64_t)i * e->L;
    tail = e->start[i] + (e->pack || e->flat ? e->slot[i] : len);
    e->real += len;
    if (e->slot[i] > e->maxslot) e->maxslot = e->slot[i];
  }
  e->end = e->pack || e->flat ? tail : e->BL;
  return MML_OK;
}

/* Mirrors mml_collator_emit's tensors, in its order (keep the two together). */
int64_t mml_compose_emit_bytes(const mml_collator *c, const mml_compose *k, int pixels_attached) {
  if (k->count == 0) return 0;
  const mml_collate_cfg *cfg = &c->cfg;
  const key_names *kn = &k_keys[cfg->keys];
  const int pack = cfg->pack != 0, flat = cfg->flatten != 0, n = k->count;
  const int64_t B = pack || flat ? 1 : cfg->rows_dynamic ? n : cfg->micro_batch_size;
  const int64_t L = flat   ? k->tokens
                    : pack ? c->budget
                           : (c->budget > 0 ? c->budget : round_up(k->used, c->multiple));
  const int64_t rows = k->rows, nimg = k->images, nv = k->videos, nrec = k->records;
  const int64_t BL = B * L;
  int64_t b = 2 * mml_pool_bytes(BL * 8); /* ids, labels */
  if (kn->loss_mask) b += mml_pool_bytes(BL * 4);
  if (cfg->mrope || flat) {
    b += mml_pool_bytes((pack && cfg->keys == MML_KEYS_QWEN ? 4 : 3) * BL * 8);
    if (!flat) b += mml_pool_bytes((pack ? n : B) * 8); /* rope_deltas */
  } else {
    b += mml_pool_bytes(BL * 8);
  }
  if (cfg->attention_mask)
    b += mml_pool_bytes(flat ? (nrec + 1) * 4 : cfg->keys == MML_KEYS_QWEN ? BL * 8 : BL * L);
  if (cfg->keys == MML_KEYS_QWEN && cfg->mm_token_type_ids) b += mml_pool_bytes(BL * 8);
  if (nimg > 0 || cfg->text_only_vision != MML_VISION_OMIT) {
    const int holder = nimg == 0 && cfg->text_only_vision == MML_VISION_PLACEHOLDER;
    const int64_t px = (int64_t)cfg->pixel_cols *
                       (int64_t)mml_dtype_size(mml_pixel_format_dtype(cfg->pixel_format));
    if (holder || !pixels_attached) b += mml_pool_bytes((holder ? 1 : rows) * px);
    b += mml_pool_bytes((holder ? 1 : nimg) * 3 * 8); /* image_grid_thw */
  }
  if (nv > 0) {
    b += mml_pool_bytes(nv * 3 * 8); /* video_grid_thw */
    if (cfg->second_per_grid) b += mml_pool_bytes(nv * 4);
  }
  if (pack) { /* cu_seqlens, its unpadded (qwen, padded slots) or padded (Megatron) twin, max_seqlen */
    const int twin = cfg->keys == MML_KEYS_MEGATRON || c->multiple > 1;
    b += (1 + twin) * mml_pool_bytes((int64_t)(n + 1) * 4) + mml_pool_bytes(4);
  }
  return b;
}

int64_t mml_collator_emit_bytes(const mml_collator *c) {
  return mml_compose_emit_bytes(c, &c->comp, c->pixbuf[0] != NULL);
}

mml_status mml_collator_emit(mml_collator *c, mml_batch *out, mml_err *err) {
  if (c->comp.count == 0) return mml_err_set(err, MML_EINVAL, "collator: emit of an empty batch");
  memset(out, 0, sizeof *out);
  emit_ctx e = {.c = c, .out = out, .err = err};
  mml_status st = emit_layout(c, &e);
  if (st) return st;
  const mml_collate_cfg *cfg = &c->cfg;
  /* the tensors, in this order */
  if (!st) st = emit_ids(&e);
  if (!st) st = emit_labels(&e);
  if (!st) st = emit_positions(&e);
  if (!st && cfg->attention_mask) st = emit_attention(&e);
  if (!st && cfg->keys == MML_KEYS_QWEN && cfg->mm_token_type_ids) st = emit_token_types(&e);
  if (!st) st = emit_vision(&e);
  if (!st) st = emit_videos(&e);
  if (!st && e.pack)
    st = cfg->keys == MML_KEYS_MEGATRON ? emit_seqlens_megatron(&e) : emit_seqlens(&e);
  free(e.start);
  if (st) {
    mml_batch_clear(out);
    return st;
  }
  const int n = e.n;
  out->nsamples = n;
  out->real_tokens = e.real;
  out->token_slots = e.BL;
  out->after.epoch = c->slots[n - 1].epoch;
  out->after.pos = c->slots[n - 1].pos + 1;
  mml_collator_reset(c);
  return MML_OK;
}
