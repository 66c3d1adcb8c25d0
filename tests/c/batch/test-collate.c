/*
 * test-collate.c — the collator (padded and packed batches, key styles, labels, vision
 * tensors, M-RoPE rows) checked against hand-worked values and against a plain reference packer
 * over random sample streams; plus allocation-failure injection.
 */
#include <stdbool.h>

#include "mml/collate.h"
#include "mml/mrope.h"
#include "mml/template.h"
#include "mml_test.h"

/* ---- allocation-failure injection ------------------------------------------------------
 * The tests create pools whose allocator fails the k-th allocation. */
static int g_fail_at = -1; /* fail when the countdown hits 0; -1: never */

static mml_status test_alloc(void *self, size_t n, void **out, mml_err *err) {
  (void)self;
  if (g_fail_at >= 0 && g_fail_at-- == 0) return mml_err_set(err, MML_ENOMEM, "injected");
  *out = malloc(n ? n : 1);
  return *out ? MML_OK : MML_ENOMEM;
}
static void test_free(void *self, void *p) {
  (void)self;
  free(p);
}
static const mml_allocator k_alloc = {MML_MEM_HOST, 0, test_alloc, test_free, NULL};

/* ---- helpers ---------------------------------------------------------------------------- */

enum { IMG = 151655, VSTART = 151652, VEND = 151653, PAD = 151643 };

/* A pool that caches nothing (1 byte), so every tensor is a fresh allocator call. */
static mml_pool *new_pool(void) {
  mml_pool *p = NULL;
  mml_err err = {0};
  if (mml_pool_new(&k_alloc, 1, &p, &err)) return NULL;
  return p;
}

static mml_collate_cfg base_cfg(void) {
  mml_collate_cfg c = {0};
  c.micro_batch_size = 2;
  c.seq_length = 16;
  c.pad_id = PAD;
  c.spatial_merge = 2;
  c.image_pad_id = IMG;
  c.vision_start_id = VSTART;
  c.pixel_cols = 6; /* small rows keep the checks readable */
  return c;
}

/* A text sample of n tokens: ids base+j, labels ignored for the first half. */
static void make_text(mml_sample *s, int64_t index, int n, int base) {
  mml_sample_reset(s);
  s->index = index;
  s->pos = index;
  for (int j = 0; j < n; j++) {
    mml_ids_push(&s->input_ids, base + j);
    mml_ids_push(&s->labels, j < n / 2 ? MML_IGNORE_INDEX : base + j);
  }
}

/* text(a) <vs> image(t,h,w) <ve> text(b); pixel rows hold (index, row, col) codes. */
static void make_image(mml_sample *s, int64_t index, int a, int t, int h, int w, int b, int cols) {
  mml_sample_reset(s);
  s->index = index;
  s->pos = index;
  int tok = t * (h / 2) * (w / 2);
  for (int j = 0; j < a; j++) mml_ids_push(&s->input_ids, 10 + j);
  mml_ids_push(&s->input_ids, VSTART);
  for (int j = 0; j < tok; j++) mml_ids_push(&s->input_ids, IMG);
  mml_ids_push(&s->input_ids, VEND);
  for (int j = 0; j < b; j++) mml_ids_push(&s->input_ids, 20 + j);
  for (size_t j = 0; j < s->input_ids.len; j++)
    mml_ids_push(&s->labels,
                 j + (size_t)b >= s->input_ids.len ? s->input_ids.data[j] : MML_IGNORE_INDEX);
  int32_t g[3] = {t, h, w};
  mml_ids_append(&s->grids, g, 3);
  s->nimages = 1;
  s->pixel_rows = (int64_t)t * h * w;
  s->pixel_cols = cols;
  for (int64_t r = 0; r < s->pixel_rows; r++)
    for (int col = 0; col < cols; col++) {
      float v = (float)(index * 10000 + r * 10 + col);
      mml_bytes_append(&s->pixels, &v, sizeof v);
    }
}

static const int64_t *I64(mml_batch *b, const char *name) {
  mml_tensor *t = mml_batch_find(b, name);
  return t ? (const int64_t *)((const char *)t->buf->data + t->offset) : NULL;
}
static const int32_t *I32(mml_batch *b, const char *name) {
  mml_tensor *t = mml_batch_find(b, name);
  return t ? (const int32_t *)((const char *)t->buf->data + t->offset) : NULL;
}
static const float *F32(mml_batch *b, const char *name) {
  mml_tensor *t = mml_batch_find(b, name);
  return t ? (const float *)((const char *)t->buf->data + t->offset) : NULL;
}
static const uint8_t *U8(mml_batch *b, const char *name) {
  mml_tensor *t = mml_batch_find(b, name);
  return t ? (const uint8_t *)t->buf->data + t->offset : NULL;
}
static bool shape_is(mml_batch *b, const char *name, int nd, int64_t d0, int64_t d1, int64_t d2,
                     int64_t d3) {
  mml_tensor *t = mml_batch_find(b, name);
  if (!t || t->ndim != nd) return false;
  int64_t d[4] = {d0, d1, d2, d3};
  for (int i = 0; i < nd; i++)
    if (t->shape[i] != d[i]) return false;
  return true;
}

/* mml_collator_emit, checking that mml_collator_emit_bytes said beforehand exactly the pool
 * bytes it allocates (each tensor's own buffer; these pools cache nothing, so a buffer's
 * size is what mml_pool_alloc mapped for it): what a memory cap charges before an emission
 * (csrc/core/loader/loader_admit.c A7). */
static mml_status emit_counted(mml_collator *c, mml_batch *b, mml_err *err) {
  const int64_t want = mml_collator_emit_bytes(c);
  mml_status st = mml_collator_emit(c, b, err);
  if (st) return st;
  int64_t got = 0;
  for (int i = 0; i < b->ntensors; i++) {
    int seen = 0;
    for (int j = 0; j < i; j++) seen |= b->tensors[j].buf == b->tensors[i].buf;
    if (!seen) got += (int64_t)b->tensors[i].buf->size;
  }
  if (got != want)
    return mml_err_set(err, MML_EINTERNAL, "emit allocated %lld pool bytes, emit_bytes said %lld",
                       (long long)got, (long long)want);
  return MML_OK;
}

/* ---- padded ----------------------------------------------------------------------------- */

TEST(padded_qwen_text_only) {
  mml_pool *pool = new_pool();
  mml_collate_cfg cfg = base_cfg();
  cfg.micro_batch_size = 3;
  cfg.seq_length = 8;
  cfg.attention_mask = 1;
  cfg.mm_token_type_ids = 1;
  mml_collator *c = NULL;
  mml_err err = {0};
  CHECK_OK(mml_collator_new(&cfg, pool, &c, &err), err);
  mml_sample s = {0};
  make_text(&s, 0, 5, 100);
  CHECK(mml_collator_fits(c, &s));
  CHECK_OK(mml_collator_add(c, &s, &err), err);
  CHECK_EQ_INT(s.input_ids.len, 0); /* swapped out, left reset */
  make_text(&s, 1, 8, 200);
  CHECK(mml_collator_fits(c, &s));
  CHECK_OK(mml_collator_add(c, &s, &err), err);
  CHECK(!mml_collator_full(c));
  mml_batch b = {0};
  CHECK_OK(emit_counted(c, &b, &err), err);
  CHECK_EQ_INT(mml_collator_count(c), 0);
  CHECK_EQ_INT(b.nsamples, 2);
  CHECK_EQ_INT(b.real_tokens, 13);
  CHECK_EQ_INT(b.token_slots, 24);
  CHECK_EQ_INT(b.after.pos, 2);
  CHECK(shape_is(&b, "input_ids", 2, 3, 8, 0, 0));
  CHECK(shape_is(&b, "labels", 2, 3, 8, 0, 0));
  CHECK(shape_is(&b, "position_ids", 2, 3, 8, 0, 0));
  CHECK(shape_is(&b, "attention_mask", 2, 3, 8, 0, 0));
  CHECK(shape_is(&b, "mm_token_type_ids", 2, 3, 8, 0, 0));
  CHECK(shape_is(&b, "pixel_values", 2, 1, 6, 0, 0));
  CHECK(shape_is(&b, "image_grid_thw", 2, 1, 3, 0, 0));
  CHECK(!mml_batch_find(&b, "loss_mask"));
  CHECK(!mml_batch_find(&b, "cu_seqlens"));
  const int64_t *ids = I64(&b, "input_ids"), *lab = I64(&b, "labels");
  const int64_t *pos = I64(&b, "position_ids"), *am = I64(&b, "attention_mask");
  for (int j = 0; j < 8; j++) {
    CHECK_EQ_INT(ids[j], j < 5 ? 100 + j : PAD);
    CHECK_EQ_INT(lab[j], j < 2 || j >= 5 ? MML_IGNORE_INDEX : 100 + j);
    CHECK_EQ_INT(am[j], j < 5);
    CHECK_EQ_INT(ids[8 + j], 200 + j);
    CHECK_EQ_INT(lab[8 + j], j < 4 ? MML_IGNORE_INDEX : 200 + j);
    CHECK_EQ_INT(ids[16 + j], PAD); /* empty row */
    CHECK_EQ_INT(lab[16 + j], MML_IGNORE_INDEX);
    CHECK_EQ_INT(am[16 + j], 0);
    for (int r = 0; r < 3; r++) CHECK_EQ_INT(pos[r * 8 + j], j);
  }
  CHECK_EQ_INT(F32(&b, "pixel_values")[0], 0);
  for (int j = 0; j < 3; j++) CHECK_EQ_INT(I64(&b, "image_grid_thw")[j], 0);
  mml_batch_clear(&b);
  /* too long for seq_length */
  make_text(&s, 2, 9, 0);
  CHECK_EQ_INT(mml_collator_check(c, &s, &err), MML_ETOOLONG);
  CHECK(strstr(err.msg, "9 tokens") != NULL);
  CHECK_EQ_INT(mml_collator_add(c, &s, &err), MML_ETOOLONG);
  CHECK_EQ_INT(mml_collator_emit(c, &b, &err), MML_EINVAL);
  mml_sample_free(&s);
  mml_collator_free(c);
  mml_pool_close(pool);
}

TEST(padded_megatron_shifted_with_images) {
  mml_pool *pool = new_pool();
  mml_collate_cfg cfg = base_cfg();
  cfg.keys = MML_KEYS_MEGATRON;
  cfg.shift_labels = 1;
  cfg.attention_mask = 1;
  cfg.mrope = 1;
  cfg.seq_length = 0; /* longest in batch, rounded to 4 */
  cfg.pad_to_multiple = 4;
  mml_collator *c = NULL;
  mml_err err = {0};
  CHECK_OK(mml_collator_new(&cfg, pool, &c, &err), err);
  mml_sample s = {0};
  make_image(&s, 7, 2, 1, 2, 4, 3, 6); /* 2 + 1 + 2 + 1 + 3 = 9 tokens, 8 pixel rows */
  CHECK_OK(mml_collator_add(c, &s, &err), err);
  make_text(&s, 8, 4, 300);
  CHECK_OK(mml_collator_add(c, &s, &err), err);
  CHECK(mml_collator_full(c));
  make_text(&s, 9, 4, 300);
  CHECK(!mml_collator_fits(c, &s));
  CHECK_EQ_INT(mml_collator_add(c, &s, &err), MML_EINVAL);
  mml_batch b = {0};
  CHECK_OK(emit_counted(c, &b, &err), err);
  const int64_t L = 12;
  CHECK(shape_is(&b, "tokens", 2, 2, L, 0, 0));
  CHECK(shape_is(&b, "loss_mask", 2, 2, L, 0, 0));
  CHECK(shape_is(&b, "position_ids", 3, 3, 2, L, 0));
  CHECK(shape_is(&b, "rope_deltas", 2, 2, 1, 0, 0));
  CHECK(shape_is(&b, "attention_mask", 4, 2, 1, L, L));
  CHECK(shape_is(&b, "pixel_values", 2, 8, 6, 0, 0));
  CHECK(shape_is(&b, "image_grid_thw", 2, 1, 3, 0, 0));
  CHECK(!mml_batch_find(&b, "input_ids"));
  CHECK(!mml_batch_find(&b, "mm_token_type_ids"));
  const int64_t *tok = I64(&b, "tokens"), *lab = I64(&b, "labels"), *pos = I64(&b, "position_ids");
  const float *lm = F32(&b, "loss_mask");
  /* row 0: 10 11 VS IMG IMG VE 20 21 22 pad pad pad; supervised labels are the last 3 ids,
   * shifted: labels[j] = label of token j+1 */
  CHECK_EQ_INT(tok[2], VSTART);
  CHECK_EQ_INT(tok[9], PAD);
  for (int j = 0; j < L; j++) {
    int64_t want = (j >= 5 && j <= 7) ? tok[j + 1] : MML_IGNORE_INDEX;
    CHECK_EQ_INT(lab[j], want);
    CHECK_EQ_INT(lm[j], want != MML_IGNORE_INDEX);
  }
  /* row 1: text 300..303, labels of tokens 2,3 supervised -> shifted to j=1,2 */
  for (int j = 0; j < L; j++) {
    int64_t want = (j == 1 || j == 2) ? 301 + j : MML_IGNORE_INDEX;
    CHECK_EQ_INT(lab[L + j], want);
  }
  /* M-RoPE row 0: 0 1 2 | image at 3: t=3, h=3, w=3,4 | 5(=3+max(2,4)/2) 6 7 8 | pad 0 */
  const int64_t et[] = {0, 1, 2, 3, 3, 5, 6, 7, 8, 0, 0, 0};
  const int64_t ew[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0};
  for (int j = 0; j < L; j++) {
    CHECK_EQ_INT(pos[j], et[j]);
    CHECK_EQ_INT(pos[2 * L + j], et[j]); /* h row equals t row here */
    CHECK_EQ_INT(pos[2 * 2 * L + j], ew[j]);
    CHECK_EQ_INT(pos[L + j], j < 4 ? j : 0); /* row 1 text: 0..3 */
  }
  CHECK_EQ_INT(I64(&b, "rope_deltas")[0], 9 - 9);
  CHECK_EQ_INT(I64(&b, "rope_deltas")[1], 0);
  /* causal mask, true above the diagonal */
  const uint8_t *m = U8(&b, "attention_mask");
  for (int r = 0; r < 2; r++)
    for (int q = 0; q < L; q++)
      for (int k = 0; k < L; k++) CHECK_EQ_INT(m[(r * L + q) * L + k], k > q);
  /* pixels copied in order */
  const float *px = F32(&b, "pixel_values");
  CHECK_EQ_INT(px[0], 70000);
  CHECK_EQ_INT(px[7 * 6 + 5], 70075);
  const int64_t *g = I64(&b, "image_grid_thw");
  CHECK_EQ_INT(g[0], 1);
  CHECK_EQ_INT(g[1], 2);
  CHECK_EQ_INT(g[2], 4);
  mml_batch_clear(&b);
  mml_sample_free(&s);
  mml_collator_free(c);
  mml_pool_close(pool);
}

/* ---- packed ----------------------------------------------------------------------------- */

TEST(packed_boundaries) {
  mml_pool *pool = new_pool();
  mml_collate_cfg cfg = base_cfg();
  cfg.micro_batch_size = 4; /* ignored: one pack [1, pack_length] per batch */
  cfg.pack = 1;
  cfg.pack_length = 16;
  cfg.pad_to_multiple = 4;
  cfg.keys = MML_KEYS_MEGATRON;
  cfg.shift_labels = 1;
  cfg.attention_mask = 1;
  cfg.text_only_vision = MML_VISION_OMIT;
  mml_collator *c = NULL;
  mml_err err = {0};
  CHECK_OK(mml_collator_new(&cfg, pool, &c, &err), err);
  mml_sample s = {0};
  make_text(&s, 0, 5, 100); /* slot 8 */
  CHECK_EQ_INT(mml_collator_sample_tokens(c, &s), 8);
  CHECK_OK(mml_collator_add(c, &s, &err), err);
  make_text(&s, 1, 3, 200); /* slot 4 */
  CHECK(mml_collator_fits(c, &s));
  CHECK_OK(mml_collator_add(c, &s, &err), err);
  CHECK(!mml_collator_full(c));
  make_text(&s, 2, 5, 300); /* slot 8 > 4 left */
  CHECK(!mml_collator_fits(c, &s));
  mml_batch b = {0};
  CHECK_OK(emit_counted(c, &b, &err), err);
  CHECK(!mml_batch_find(&b, "pixel_values"));
  CHECK(!mml_batch_find(&b, "image_grid_thw"));
  CHECK(shape_is(&b, "tokens", 2, 1, 16, 0, 0));
  /* Megatron's names: cu_seqlens real lengths, cu_seqlens_padded slots covering the row
   * (the tail padding belongs to the last slot), max_seqlen the longest padded slot */
  CHECK(shape_is(&b, "cu_seqlens", 1, 3, 0, 0, 0));
  CHECK(shape_is(&b, "cu_seqlens_padded", 1, 3, 0, 0, 0));
  CHECK(!mml_batch_find(&b, "cu_seqlens_unpadded"));
  CHECK(shape_is(&b, "max_seqlen", 1, 1, 0, 0, 0));
  CHECK_EQ_INT(b.real_tokens, 8);
  CHECK_EQ_INT(b.token_slots, 16);
  const int32_t *cu = I32(&b, "cu_seqlens"), *cup = I32(&b, "cu_seqlens_padded");
  CHECK_EQ_INT(cu[0], 0);
  CHECK_EQ_INT(cu[1], 5);
  CHECK_EQ_INT(cu[2], 8);
  CHECK_EQ_INT(cup[0], 0);
  CHECK_EQ_INT(cup[1], 8);
  CHECK_EQ_INT(cup[2], 16);
  CHECK_EQ_INT(I32(&b, "max_seqlen")[0], 8);
  const int64_t *tok = I64(&b, "tokens"), *lab = I64(&b, "labels"), *pos = I64(&b, "position_ids");
  const int64_t et[] = {100, 101, 102, 103, 104, PAD, PAD, PAD,
                        200, 201, 202, PAD, PAD, PAD, PAD, PAD};
  const int64_t ep[] = {0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 0, 1, 2, 3};
  /* sample 0 labels supervise tokens 2..4 -> shifted to 1..3, last token ignored;
   * sample 1 supervises token 1..2 -> shifted 0..1; nothing crosses into the next slot */
  const int64_t el[] = {-100, 102, 103,  104,  -100, -100, -100, -100,
                        201,  202, -100, -100, -100, -100, -100, -100};
  for (int j = 0; j < 16; j++) {
    CHECK_EQ_INT(tok[j], et[j]);
    CHECK_EQ_INT(pos[j], ep[j]);
    CHECK_EQ_INT(lab[j], el[j]);
  }
  /* block-diagonal causal mask: slots [0,8) [8,12), tail [12,16) */
  const uint8_t *m = U8(&b, "attention_mask");
  for (int q = 0; q < 16; q++) {
    int lo = q < 8 ? 0 : q < 12 ? 8 : 12;
    for (int k = 0; k < 16; k++) CHECK_EQ_INT(m[q * 16 + k], !(k >= lo && k <= q));
  }
  mml_batch_clear(&b);

  /* the sample that did not fit opens the next pack; HF labels: each first label ignored */
  mml_collator_free(c);
  cfg.keys = MML_KEYS_QWEN;
  cfg.shift_labels = 0;
  cfg.pad_to_multiple = 0;
  cfg.attention_mask = 1;
  cfg.text_only_vision = MML_VISION_EMPTY;
  CHECK_OK(mml_collator_new(&cfg, pool, &c, &err), err);
  make_text(&s, 2, 4, 300);
  for (int j = 0; j < 4; j++) s.labels.data[j] = 300 + j; /* fully supervised */
  CHECK_OK(mml_collator_add(c, &s, &err), err);
  make_text(&s, 3, 12, 400);
  for (int j = 0; j < 12; j++) s.labels.data[j] = 400 + j;
  CHECK(mml_collator_fits(c, &s));
  CHECK_OK(mml_collator_add(c, &s, &err), err);
  CHECK(mml_collator_full(c));
  CHECK_OK(emit_counted(c, &b, &err), err);
  CHECK(shape_is(&b, "pixel_values", 2, 0, 6, 0, 0));
  CHECK(shape_is(&b, "image_grid_thw", 2, 0, 3, 0, 0));
  CHECK(!mml_batch_find(&b, "cu_seqlens_unpadded"));
  CHECK_EQ_INT(I32(&b, "max_seqlen")[0], 12);
  lab = I64(&b, "labels");
  const int64_t *am = I64(&b, "attention_mask");
  for (int j = 0; j < 16; j++) {
    int64_t want = (j == 0 || j == 4) ? MML_IGNORE_INDEX : (j < 4 ? 300 + j : 400 + j - 4);
    CHECK_EQ_INT(lab[j], want);
    CHECK_EQ_INT(am[j], 1);
  }
  CHECK_EQ_INT(b.real_tokens, b.token_slots);
  mml_batch_clear(&b);
  mml_sample_free(&s);
  mml_collator_free(c);
  mml_pool_close(pool);
}

TEST(packed_mrope_per_sample) {
  mml_pool *pool = new_pool();
  mml_collate_cfg cfg = base_cfg();
  cfg.micro_batch_size = 1;
  cfg.pack = 1;
  cfg.pack_length = 32;
  cfg.mrope = 1;
  cfg.mm_token_type_ids = 1;
  mml_collator *c = NULL;
  mml_err err = {0};
  CHECK_OK(mml_collator_new(&cfg, pool, &c, &err), err);
  mml_sample s = {0};
  make_image(&s, 1, 1, 1, 4, 4, 1, 6); /* 1 + 1 + 4 + 1 + 1 = 8 tokens, 16 rows */
  CHECK_OK(mml_collator_add(c, &s, &err), err);
  make_image(&s, 2, 0, 1, 2, 2, 2, 6); /* 0 + 1 + 1 + 1 + 2 = 5 tokens, 4 rows */
  CHECK_OK(mml_collator_add(c, &s, &err), err);
  mml_batch b = {0};
  CHECK_OK(emit_counted(c, &b, &err), err);
  CHECK(shape_is(&b, "position_ids", 3, 4, 1, 32, 0)); /* text row + 3 M-RoPE rows */
  CHECK(shape_is(&b, "rope_deltas", 2, 2, 1, 0, 0));
  CHECK(shape_is(&b, "pixel_values", 2, 20, 6, 0, 0));
  CHECK(shape_is(&b, "image_grid_thw", 2, 2, 3, 0, 0));
  const int64_t *text = I64(&b, "position_ids"), *tt = I64(&b, "mm_token_type_ids");
  const int64_t *pos = text + 32;
  for (int j = 0; j < 32; j++) CHECK_EQ_INT(text[j], j < 8 ? j : j < 13 ? j - 8 : j - 13);
  /* sample 1: 0 1 | 2 2 2 2 (t) | 4 5  ; second sample restarts: 0 | 1 | 2 3 4 */
  const int64_t et[] = {0, 1, 2, 2, 2, 2, 4, 5, 0, 1, 2, 3, 4};
  const int64_t eh[] = {0, 1, 2, 2, 3, 3, 4, 5, 0, 1, 2, 3, 4};
  const int64_t ew[] = {0, 1, 2, 3, 2, 3, 4, 5, 0, 1, 2, 3, 4};
  for (int j = 0; j < 13; j++) {
    CHECK_EQ_INT(pos[j], et[j]);
    CHECK_EQ_INT(pos[32 + j], eh[j]);
    CHECK_EQ_INT(pos[64 + j], ew[j]);
  }
  for (int j = 13; j < 32; j++) CHECK_EQ_INT(pos[j] + pos[32 + j] + pos[64 + j], 0);
  CHECK_EQ_INT(I64(&b, "rope_deltas")[0], 6 - 8);
  CHECK_EQ_INT(I64(&b, "rope_deltas")[1], 0);
  CHECK_EQ_INT(tt[2] + tt[3] + tt[4] + tt[5], 4);
  CHECK_EQ_INT(tt[1] + tt[6] + tt[10], 0);
  CHECK_EQ_INT(tt[10 - 1], 1);
  const float *px = F32(&b, "pixel_values");
  CHECK_EQ_INT(px[15 * 6], 10150);
  CHECK_EQ_INT(px[16 * 6], 20000);
  mml_batch_clear(&b);
  /* a sample whose image tokens disagree with its grid is refused before collation */
  make_image(&s, 3, 1, 1, 4, 4, 1, 6);
  s.grids.data[1] = 6;
  CHECK_EQ_INT(mml_collator_check(c, &s, &err), MML_EINVAL);
  make_image(&s, 3, 1, 1, 4, 4, 1, 6);
  s.pixel_cols = 5;
  CHECK_EQ_INT(mml_collator_check(c, &s, &err), MML_EINVAL);
  make_image(&s, 3, 1, 1, 4, 4, 1, 6);
  s.labels.len--;
  CHECK_EQ_INT(mml_collator_add(c, &s, &err), MML_EINVAL);
  CHECK_EQ_INT(mml_collator_count(c), 0);
  mml_sample_free(&s);
  mml_collator_free(c);
  mml_pool_close(pool);
}

/* Qwen's flattened batch (cfg.flatten, mml/collate.h): two samples back to back in one
 * [1, 13] row, labels as given (the second sample's first not forced to ignored), M-RoPE
 * [3, 1, 13] from 0 per sample, attention_mask int32 cumulative lengths; no rope_deltas,
 * cu_seqlens, max_seqlen; composed by micro_batch_size like padded batches. */
TEST(flattened_batch) {
  mml_pool *pool = new_pool();
  mml_collate_cfg cfg = base_cfg();
  cfg.seq_length = 0;
  cfg.flatten = 1;
  cfg.attention_mask = 1;
  mml_collator *c = NULL;
  mml_err err = {0};
  CHECK_OK(mml_collator_new(&cfg, pool, &c, &err), err);
  mml_sample s = {0};
  make_image(&s, 1, 1, 1, 4, 4, 1, 6); /* 8 tokens, 16 rows */
  CHECK_OK(mml_collator_add(c, &s, &err), err);
  CHECK(!mml_collator_full(c));
  make_text(&s, 2, 5, 100);
  s.labels.data[0] = 100; /* a labelled first token stays labelled */
  CHECK(mml_collator_fits(c, &s));
  CHECK_OK(mml_collator_add(c, &s, &err), err);
  CHECK(mml_collator_full(c)); /* micro_batch_size = 2 samples */
  mml_batch b = {0};
  CHECK_OK(emit_counted(c, &b, &err), err);
  CHECK(shape_is(&b, "input_ids", 2, 1, 13, 0, 0));
  CHECK(shape_is(&b, "labels", 2, 1, 13, 0, 0));
  CHECK(shape_is(&b, "position_ids", 3, 3, 1, 13, 0));
  CHECK(shape_is(&b, "attention_mask", 1, 3, 0, 0, 0));
  CHECK(mml_batch_find(&b, "attention_mask")->dtype == MML_DT_INT32);
  CHECK(mml_batch_find(&b, "rope_deltas") == NULL);
  CHECK(mml_batch_find(&b, "cu_seqlens") == NULL && mml_batch_find(&b, "max_seqlen") == NULL);
  CHECK(shape_is(&b, "pixel_values", 2, 16, 6, 0, 0));
  const int32_t *cu = I32(&b, "attention_mask");
  CHECK_EQ_INT(cu[0], 0);
  CHECK_EQ_INT(cu[1], 8);
  CHECK_EQ_INT(cu[2], 13);
  const int64_t *ids = I64(&b, "input_ids"), *labels = I64(&b, "labels");
  CHECK_EQ_INT(ids[7], 20);
  CHECK_EQ_INT(ids[8], 100);
  CHECK_EQ_INT(labels[8], 100);
  CHECK_EQ_INT(labels[12], 104);
  const int64_t *pos = I64(&b, "position_ids");
  const int64_t et[] = {0, 1, 2, 2, 2, 2, 4, 5, 0, 1, 2, 3, 4};
  const int64_t eh[] = {0, 1, 2, 2, 3, 3, 4, 5, 0, 1, 2, 3, 4};
  for (int j = 0; j < 13; j++) {
    CHECK_EQ_INT(pos[j], et[j]);
    CHECK_EQ_INT(pos[13 + j], eh[j]);
  }
  mml_batch_clear(&b);
  mml_sample_free(&s);
  mml_collator_free(c);
  /* what a flattened batch cannot be */
  int *bad[] = {&cfg.pack, &cfg.shift_labels, &cfg.rows_dynamic};
  for (int k = 0; k < 3; k++) {
    *bad[k] = 1;
    cfg.pack_length = 64;
    CHECK_EQ_INT(mml_collator_new(&cfg, pool, &c, &err), MML_ECONFIG);
    CHECK(strstr(err.msg, "data_flatten") != NULL);
    *bad[k] = 0;
  }
  cfg.pack_length = 0;
  cfg.seq_length = 16;
  CHECK_EQ_INT(mml_collator_new(&cfg, pool, &c, &err), MML_ECONFIG);
  cfg.seq_length = 0;
  cfg.keys = MML_KEYS_MEGATRON;
  CHECK_EQ_INT(mml_collator_new(&cfg, pool, &c, &err), MML_ECONFIG);
  cfg.keys = MML_KEYS_QWEN;
  cfg.attention_mask = 0;
  CHECK_EQ_INT(mml_collator_new(&cfg, pool, &c, &err), MML_ECONFIG);
  mml_pool_close(pool);
}

/* A pack of records (Qwen's data_packing, mml/sample.h subs) in a flattened batch: one
 * sample to composition, each record its own attention_mask entry and positions from 0
 * (collate.c design); a pack is refused by a collator that does not flatten, and a record
 * table that does not add up is refused. */
TEST(flattened_packs) {
  mml_pool *pool = new_pool();
  mml_collate_cfg cfg = base_cfg();
  cfg.seq_length = 0;
  cfg.flatten = 1;
  cfg.mrope = 1;
  cfg.attention_mask = 1;
  mml_collator *c = NULL;
  mml_err err = {0};
  CHECK_OK(mml_collator_new(&cfg, pool, &c, &err), err);
  mml_sample s = {0};
  make_image(&s, 1, 1, 1, 4, 4, 1, 6); /* record 0: 8 tokens, one image */
  for (int j = 0; j < 5; j++) {        /* record 1: 5 text tokens */
    mml_ids_push(&s.input_ids, 300 + j);
    mml_ids_push(&s.labels, 300 + j);
  }
  const int32_t subs[] = {8, 1, 0, 5, 0, 0};
  mml_ids_append(&s.subs, subs, 6);
  CHECK_OK(mml_collator_check(c, &s, &err), err);
  CHECK_OK(mml_collator_add(c, &s, &err), err);
  make_text(&s, 2, 5, 100); /* a plain sample: one record */
  CHECK_OK(mml_collator_add(c, &s, &err), err);
  CHECK(mml_collator_full(c)); /* micro_batch_size = 2 samples (packs) */
  mml_batch b = {0};
  CHECK_OK(emit_counted(c, &b, &err), err);
  CHECK(shape_is(&b, "input_ids", 2, 1, 18, 0, 0));
  CHECK(shape_is(&b, "position_ids", 3, 3, 1, 18, 0));
  CHECK(shape_is(&b, "attention_mask", 1, 4, 0, 0, 0));
  const int32_t *cu = I32(&b, "attention_mask");
  const int32_t ecu[] = {0, 8, 13, 18};
  for (int j = 0; j < 4; j++) CHECK_EQ_INT(cu[j], ecu[j]);
  const int64_t *pos = I64(&b, "position_ids");
  const int64_t et[] = {0, 1, 2, 2, 2, 2, 4, 5, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4};
  const int64_t eh[] = {0, 1, 2, 2, 3, 3, 4, 5, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4};
  for (int j = 0; j < 18; j++) {
    CHECK_EQ_INT(pos[j], et[j]);
    CHECK_EQ_INT(pos[18 + j], eh[j]);
  }
  CHECK_EQ_INT(I64(&b, "input_ids")[8], 300);
  mml_batch_clear(&b);
  /* a record table that does not add up */
  make_text(&s, 3, 5, 100);
  const int32_t wrong[] = {3, 0, 0, 3, 0, 0};
  mml_ids_append(&s.subs, wrong, 6);
  CHECK_EQ_INT(mml_collator_check(c, &s, &err), MML_EINVAL);
  CHECK(strstr(err.msg, "do not add up") != NULL);
  mml_collator_free(c);
  /* a pack offered to a collator that does not flatten */
  cfg = base_cfg();
  CHECK_OK(mml_collator_new(&cfg, pool, &c, &err), err);
  make_text(&s, 4, 5, 100);
  const int32_t two[] = {2, 0, 0, 3, 0, 0};
  mml_ids_append(&s.subs, two, 6);
  CHECK_EQ_INT(mml_collator_check(c, &s, &err), MML_EINVAL);
  CHECK(strstr(err.msg, "pack of records") != NULL);
  mml_sample_free(&s);
  mml_collator_free(c);
  mml_pool_close(pool);
}

/* cfg.rope2d (recipe="qwen-vl-finetune", padded rows): padding positions are 1 in every
 * M-RoPE row, as its pad_and_cat pads them; 0 without it (collate.c design). */
TEST(rope2d_padded_positions) {
  mml_pool *pool = new_pool();
  for (int rope2d = 0; rope2d < 2; rope2d++) {
    mml_collate_cfg cfg = base_cfg();
    cfg.seq_length = 0; /* the longest row: 8 */
    cfg.mrope = 1;
    cfg.rope2d = rope2d;
    mml_collator *c = NULL;
    mml_err err = {0};
    CHECK_OK(mml_collator_new(&cfg, pool, &c, &err), err);
    mml_sample s = {0};
    make_image(&s, 1, 1, 1, 4, 4, 1, 6); /* 8 tokens */
    CHECK_OK(mml_collator_add(c, &s, &err), err);
    make_text(&s, 2, 5, 100);
    CHECK_OK(mml_collator_add(c, &s, &err), err);
    mml_batch b = {0};
    CHECK_OK(emit_counted(c, &b, &err), err);
    CHECK(shape_is(&b, "position_ids", 3, 3, 2, 8, 0));
    const int64_t *pos = I64(&b, "position_ids");
    for (int r = 0; r < 3; r++) {
      for (int j = 0; j < 5; j++) CHECK_EQ_INT(pos[r * 16 + 8 + j], j);      /* row 1's text */
      for (int j = 5; j < 8; j++) CHECK_EQ_INT(pos[r * 16 + 8 + j], rope2d); /* its padding */
    }
    mml_batch_clear(&b);
    mml_sample_free(&s);
    mml_collator_free(c);
  }
  mml_pool_close(pool);
}

TEST(config_errors) {
  mml_pool *pool = new_pool();
  mml_collator *c = NULL;
  mml_err err = {0};
  mml_collate_cfg cfg = base_cfg();
  cfg.micro_batch_size = 0;
  CHECK_EQ_INT(mml_collator_new(&cfg, pool, &c, &err), MML_ECONFIG);
  CHECK(strstr(err.msg, "micro_batch_size") != NULL);
  cfg = base_cfg();
  cfg.pack = 1;
  cfg.micro_batch_size = 1;
  cfg.seq_length = 0;
  CHECK_EQ_INT(mml_collator_new(&cfg, pool, &c, &err), MML_ECONFIG);
  cfg.pack_length = 10;
  cfg.pad_to_multiple = 4;
  CHECK_EQ_INT(mml_collator_new(&cfg, pool, &c, &err), MML_ECONFIG);
  cfg = base_cfg();
  cfg.micro_batch_size = 0;
  CHECK_EQ_INT(mml_collator_new(&cfg, pool, &c, &err), MML_ECONFIG);
  cfg = base_cfg();
  cfg.pixel_cols = 0;
  CHECK_EQ_INT(mml_collator_new(&cfg, pool, &c, &err), MML_ECONFIG);
  cfg.text_only_vision = MML_VISION_OMIT;
  CHECK_OK(mml_collator_new(&cfg, pool, &c, &err), err);
  mml_collator_free(c);
  cfg = base_cfg();
  cfg.keys = (mml_key_style)7;
  CHECK_EQ_INT(mml_collator_new(&cfg, pool, &c, &err), MML_ECONFIG);
  mml_pool_close(pool);
}

/* ---- reference packer over random streams ----------------------------------------------
 * Greedy packing restated with plain arrays: pack boundaries, ids, labels and positions of
 * every pack are compared; then the stream is restarted at each pack's first sample (what a
 * resume does) and the packs that follow must be identical. */

typedef struct {
  int len;
  int base;
} ref_sample;

static uint64_t rng_next(uint64_t *s) {
  *s += 0x9E3779B97F4A7C15ull;
  return mml_mix64(*s);
}

static void fill(mml_sample *s, int64_t idx, const ref_sample *r) {
  make_text(s, idx, r->len, r->base);
}

/* Runs the driver loop over samples [from, n) and records pack starts; checks each pack. */
static int run_stream(const ref_sample *rs, int from, int n, const mml_collate_cfg *cfg,
                      int *starts, int max_packs, uint64_t *digests) {
  mml_pool *pool = new_pool();
  mml_collator *c = NULL;
  mml_err err = {0};
  int npacks = 0, bad = 0;
  if (mml_collator_new(cfg, pool, &c, &err)) return -1;
  mml_sample s = {0};
  int first = from;
  int64_t m = cfg->pad_to_multiple > 1 ? cfg->pad_to_multiple : 1;
  for (int i = from; i <= n && npacks < max_packs; i++) {
    bool flush = i == n;
    if (!flush) fill(&s, i, &rs[i]);
    if (flush ? mml_collator_count(c) > 0 : !mml_collator_fits(c, &s)) {
      mml_batch b = {0};
      if (mml_collator_emit(c, &b, &err)) bad++;
      /* reference: samples [first, i) laid out slot by slot */
      const int64_t *ids = I64(&b, "input_ids"), *lab = I64(&b, "labels");
      const int64_t *pos = I64(&b, "position_ids");
      const int32_t *cu = I32(&b, "cu_seqlens");
      int64_t off = 0;
      uint64_t h = 1469598103934665603ull;
      for (int k = first; k < i; k++) {
        int64_t slot = (rs[k].len + m - 1) / m * m;
        if (cu[k - first] != off) bad++;
        for (int j = 0; j < slot; j++) {
          int64_t wid = j < rs[k].len ? rs[k].base + j : cfg->pad_id;
          int64_t wl = MML_IGNORE_INDEX;
          if (j + 1 < rs[k].len && j + 1 >= rs[k].len / 2) wl = rs[k].base + j + 1;
          if (ids[off + j] != wid || lab[off + j] != wl || pos[off + j] != j) bad++;
        }
        off += slot;
      }
      if (cu[i - first] != off) bad++;
      /* greedy: the next sample really did not fit */
      if (!flush && off + (rs[i].len + m - 1) / m * m <= cfg->pack_length) bad++;
      for (int64_t j = off; j < cfg->pack_length; j++)
        if (ids[j] != cfg->pad_id || lab[j] != MML_IGNORE_INDEX || pos[j] != j - off) bad++;
      for (int t = 0; t < b.ntensors; t++)
        h = mml_hash_bytes(
            h, b.tensors[t].buf->data,
            (size_t)mml_tensor_numel(&b.tensors[t]) * mml_dtype_size(b.tensors[t].dtype));
      starts[npacks] = first;
      digests[npacks] = h;
      npacks++;
      mml_batch_clear(&b);
      first = i;
    }
    if (!flush && mml_collator_add(c, &s, &err)) bad++;
  }
  mml_sample_free(&s);
  mml_collator_free(c);
  mml_pool_close(pool);
  return bad ? -1 : npacks;
}

TEST(packed_random_vs_reference_and_resume) {
  enum { N = 300, MAXP = 300 };
  static ref_sample rs[N];
  static int starts[MAXP], starts2[MAXP];
  static uint64_t dig[MAXP], dig2[MAXP];
  uint64_t seed = 42;
  for (int mult = 0; mult <= 8; mult += 8) {
    mml_collate_cfg cfg = base_cfg();
    cfg.micro_batch_size = 1;
    cfg.pack = 1;
    cfg.pack_length = 64;
    cfg.pad_to_multiple = mult;
    cfg.shift_labels = 1;
    cfg.text_only_vision = MML_VISION_OMIT;
    for (int i = 0; i < N; i++) {
      rs[i].len = 1 + (int)(rng_next(&seed) % (mult ? 56 : 64));
      rs[i].base = 1000 * i;
    }
    int np = run_stream(rs, 0, N, &cfg, starts, MAXP, dig);
    CHECK(np > 0);
    for (int p = 1; p < np; p += 7) { /* resume at pack p: identical packs from there */
      int np2 = run_stream(rs, starts[p], N, &cfg, starts2, MAXP, dig2);
      CHECK_EQ_INT(np2, np - p);
      for (int q = 0; q < np2; q++) {
        CHECK_EQ_INT(starts2[q], starts[p + q]);
        CHECK(dig2[q] == dig[p + q]);
      }
    }
  }
}

/* ---- allocation failures ---------------------------------------------------------------- */

TEST(emit_allocation_failures) {
  mml_collate_cfg cfg = base_cfg();
  cfg.micro_batch_size = 1;
  cfg.pack = 1;
  cfg.pack_length = 32;
  cfg.pad_to_multiple = 2;
  cfg.mrope = 1;
  cfg.attention_mask = 1;
  cfg.keys = MML_KEYS_MEGATRON;
  mml_pool *pool = new_pool();
  mml_collator *c = NULL;
  mml_err err = {0};
  CHECK_OK(mml_collator_new(&cfg, pool, &c, &err), err);
  mml_sample s = {0};
  make_image(&s, 1, 1, 1, 4, 4, 1, 6);
  CHECK_OK(mml_collator_add(c, &s, &err), err);
  make_text(&s, 2, 5, 50);
  CHECK_OK(mml_collator_add(c, &s, &err), err);
  mml_batch b = {0};
  int k = 0;
  for (;; k++) {
    g_fail_at = k;
    mml_status st = mml_collator_emit(c, &b, &err);
    g_fail_at = -1;
    if (st == MML_OK) break;
    CHECK_EQ_INT(st, MML_ENOMEM);
    CHECK_EQ_INT(b.ntensors, 0);
    CHECK_EQ_INT(mml_collator_count(c), 2); /* samples kept for a retry */
    if (k > 40) break;
  }
  CHECK(k >= 8); /* failed at every tensor before succeeding */
  CHECK_EQ_INT(b.nsamples, 2);
  mml_batch_clear(&b);
  mml_sample_free(&s);
  mml_collator_free(c);
  mml_pool_close(pool);
}
