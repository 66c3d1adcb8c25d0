/*
 * loader_dsindex.c — the loader's use of a dataset index (mml/dsindex.h): finding a
 * shard's sidecar, refusing a stale one, adding the shard to the loader's index from it
 * (no scan), the settings key its counts are valid under, and the per-sample counts the
 * workers use to skip over-long samples before reading anything.
 *
 * DESIGN
 *   At construction, for each shard: the sidecar ("<shard>.mmlidx" next to a local
 *   shard, or under cfg.index for any shard) is read when it exists; the shard's identity now (local: size and
 *   mtime; remote: size and ETag from one HEAD) must be the one recorded, else the
 *   loader refuses to start (MML_ECONFIG naming shard and index, and what changed) —
 *   an index is never trusted blindly.  An uncompressed shard is then added from the
 *   sidecar's offsets without reading it; a compressed one is still decompressed (its
 *   records are read from the decompressed copy) and its sample count must agree.
 *   Counts (text tokens, image and video tokens) depend on settings: each source gets a
 *   key (a hash of the settings text: tokenizer, template, system turn, image whitespace,
 *   vision numbers, video limits and family, which videos the builder counts, image root,
 *   the label mode and the limits that decide a sample's status, and which statuses the
 *   builder records: MML_DSX_STATUSES).  A shard
 *   whose index was built under another key keeps its offsets (they do not depend on
 *   settings) but its counts are not used, with one warning naming both settings.
 *   Checks applied when the counts are used, not recorded (so not in the key):
 *   max_record_bytes, max_length, and max_sample_pixel_bytes (mml_sample_pixel_bytes
 *   of the image and video rows, tokens * merge^2 each, in this loader's pixel_format),
 *   in mml_sample_plan's order.
 *
 * Threads: everything here runs at construction (one thread) except ld_index_precheck,
 * which workers call on immutable data.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "loader_int.h"
#include "mml/fetch_sync.h"

/* what the tokenizer identity encodes (the Python package's probe text) */
static const char k_probe[] =
    "The quick brown fox jumps over 13 lazy dogs; don't stop! \xc3\x84pfel, "
    "\xe6\xbc\xa2\xe5\xad\x97, "
    "\xf0\x9f\x98\x80\n\t<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|><|im_end|>\n";

uint64_t ld_tokenizer_identity(const mml_tokenizer *tok) {
  mml_ids ids = {0};
  uint64_t h = mml_hash_bytes(0, "tok", 3);
  size_t v = mml_tokenizer_vocab_size(tok);
  h = mml_hash_bytes(h, &v, sizeof v);
  if (mml_tokenizer_encode(tok, NULL, k_probe, sizeof k_probe - 1, &ids, NULL) == MML_OK)
    h = mml_hash_bytes(h, ids.data, ids.len * sizeof *ids.data);
  mml_ids_free(&ids);
  return h;
}

mml_status ld_index_source_key(mml_loader *L, ld_source *src, const mml_source_cfg *sc,
                               mml_err *err) {
  const mml_vision_cfg *v = &src->vision;
  const mml_loader_cfg *c = &L->cfg;
  uint64_t sys =
      sc->system_prompt ? mml_hash_bytes(1, sc->system_prompt, strlen(sc->system_prompt)) : 0;
  uint64_t root = src->image_root ? mml_hash_bytes(1, src->image_root, strlen(src->image_root)) : 0;
  char text[1024];
  snprintf(text, sizeof text,
           "tokenizer=%016llx template=%d system=%s%016llx image_whitespace=%d "
           "patch=%d merge=%d temporal=%d min_pixels=%lld max_pixels=%lld legacy_resize=%d "
           "image_route=%d max_image_pixels=%lld max_images_per_sample=%d max_json_depth=%d "
           "max_sample_pixels=%lld allow_paths_outside_root=%d allow_remote_images=%d "
           "image_root=%s%016llx video_min_pixels=%lld video_max_pixels=%lld video_family=%d "
           "videos=%s label_mode=%d max_object_bytes=%lld max_jpeg_scans=%d statuses=%s",
           (unsigned long long)L->tok_id, (int)c->template_style,
           sc->system_prompt ? "" : "default:", (unsigned long long)sys, (int)sc->image_space,
           v->patch_size, v->merge_size, v->temporal_patch_size, (long long)v->min_pixels,
           (long long)v->max_pixels, v->legacy_resize, v->route, (long long)v->max_image_pixels,
           c->max_images_per_sample, c->max_json_depth, (long long)c->max_sample_pixels,
           c->allow_paths_outside_root, c->allow_remote_images,
           src->image_root ? "" : "shard-folder:", (unsigned long long)root,
           (long long)v->video_min_pixels, (long long)v->video_max_pixels, v->video_family,
           MML_DSX_VIDEOS, (int)sc->label_mode, (long long)c->max_object_bytes, v->max_jpeg_scans,
           MML_DSX_STATUSES);
  if (sc->columns && sc->columns[0]) { /* a Parquet dataset's own column names */
    size_t used = strlen(text);
    snprintf(text + used, sizeof text - used, " columns=%016llx",
             (unsigned long long)mml_hash_bytes(1, sc->columns, strlen(sc->columns)));
  }
  if (sc->recipe) { /* token counts follow the recipe (truncation, thinking) */
    size_t used = strlen(text);
    snprintf(text + used, sizeof text - used,
             " recipe=%d cutoff_len=%lld mask_history=%d train_on_prompt=%d enable_thinking=%d"
             " image_max_pixels=%lld image_min_pixels=%lld video_fps=%.17g video_maxlen=%lld"
             " video_max_pixels=%lld video_min_pixels=%lld",
             sc->recipe, (long long)sc->lf.cutoff_len, sc->lf.mask_history, sc->lf.train_on_prompt,
             sc->lf.enable_thinking, (long long)sc->lf.image_max_pixels,
             (long long)sc->lf.image_min_pixels, sc->lf.video_fps, (long long)sc->lf.video_maxlen,
             (long long)sc->lf.video_max_pixels, (long long)sc->lf.video_min_pixels);
  }
  if (sc->recipe == MML_RECIPE_QWEN_VL_FINETUNE) { /* and its cut */
    size_t used = strlen(text);
    snprintf(text + used, sizeof text - used,
             " model_max_length=%lld video_min_frames=%lld video_max_frames=%lld",
             (long long)sc->qft.model_max_length, (long long)sc->qft.video_min_frames,
             (long long)sc->qft.video_max_frames);
  }
  const int lf = sc->recipe == MML_RECIPE_LLAMA_FACTORY;
  /* BARE (the default since transformers 5.25) is named, OUTER (the default before) is
   * not: an index built before keeps its key only where its counts still hold */
  if (c->template_style == MML_TEMPLATE_QWEN3_VL &&
      (c->qwen3_video_prompt == MML_QWEN3_VIDEO_BARE || lf)) {
    size_t used = strlen(text); /* Qwen3-VL video prompts: the form, LLaMA-Factory's own */
    snprintf(text + used, sizeof text - used, " qwen3_video_prompt=%d",
             lf ? -1 : c->qwen3_video_prompt);
  }
  if (!(src->index_settings = strdup(text)))
    return mml_err_set(err, MML_ENOMEM, "out of memory building the loader");
  src->index_key = mml_hash_bytes(0, text, strlen(text));
  return MML_OK;
}

mml_status ld_shard_identity(mml_loader *L, const char *path, int64_t *size, int64_t *mtime_ns,
                             char *etag, size_t cap, mml_err *err) {
  etag[0] = 0;
  *mtime_ns = 0;
  if (mml_path_is_remote(path)) {
    mml_fetcher *f;
    mml_status st = ld_get_fetcher(L, &f, err);
    if (!st) st = mml_fetch_stat(f, path, size, etag, cap, err);
    if (st) mml_err_prefix(err, "data shard %s", path);
    return st;
  }
  struct stat sb;
  if (stat(path, &sb) != 0)
    return mml_err_set(err, errno == ENOENT ? MML_ENOENT : MML_EIO, "data shard %s: %s", path,
                       strerror(errno));
  *size = (int64_t)sb.st_size;
  *mtime_ns = (int64_t)sb.st_mtim.tv_sec * 1000000000LL + sb.st_mtim.tv_nsec;
  return MML_OK;
}

/* The sidecar's bytes into *out; *found = 0 when there is none. */
static mml_status read_sidecar(mml_loader *L, const char *where, mml_bytes *out, int *found,
                               mml_err *err) {
  mml_status st;
  if (mml_path_is_remote(where)) {
    mml_fetcher *f;
    if ((st = ld_get_fetcher(L, &f, err))) return st;
    st = mml_fetch_get(f, where, 0, -1, out, err);
  } else {
    st = mml_read_file(where, 0, -1, out, err);
  }
  *found = st != MML_ENOENT;
  if (st == MML_ENOENT) {
    mml_err_clear(err);
    return MML_OK;
  }
  if (st) mml_err_prefix(err, "dataset index %s", where);
  return st;
}

static mml_status stale(mml_err *err, const char *path, const char *where, const char *what) {
  return mml_err_set(err, MML_ECONFIG,
                     "data shard %s no longer matches its index %s (%s): rebuild it with "
                     "`python -m mmloader index %s`, or delete it",
                     path, where, what, path);
}

/* Whether the shard is still the one the index describes; a message saying what changed. */
static mml_status check_fresh(mml_loader *L, const mml_dsx *x, const char *path, const char *where,
                              mml_err *err) {
  int64_t size, mtime;
  char etag[sizeof x->etag], what[400];
  mml_status st = ld_shard_identity(L, path, &size, &mtime, etag, sizeof etag, err);
  if (st) return st;
  if (size != x->shard_size) {
    snprintf(what, sizeof what, "size %lld bytes, indexed at %lld", (long long)size,
             (long long)x->shard_size);
    return stale(err, path, where, what);
  }
  if (mtime != x->shard_mtime_ns) {
    snprintf(what, sizeof what, "modified since it was indexed (mtime %lld ns, indexed at %lld)",
             (long long)mtime, (long long)x->shard_mtime_ns);
    return stale(err, path, where, what);
  }
  if (strcmp(etag, x->etag)) {
    snprintf(what, sizeof what, "ETag %s, indexed at %s", etag[0] ? etag : "(none)",
             x->etag[0] ? x->etag : "(none)");
    return stale(err, path, where, what);
  }
  int want = L->cfg.data_format;
  if (want != MML_LAYOUT_AUTO && want != (int)x->layout)
    return mml_err_set(err, MML_ECONFIG,
                       "data shard %s: its index %s was built for another data_format", path,
                       where);
  return MML_OK;
}

static mml_status keep(mml_loader *L, int shard, mml_dsx *x, mml_err *err) {
  if (shard >= L->dsx_cap) {
    int nc = L->dsx_cap ? 2 * L->dsx_cap : 16;
    while (nc <= shard) nc *= 2;
    mml_dsx **p = realloc(L->dsx, (size_t)nc * sizeof *p);
    if (!p) return mml_err_set(err, MML_ENOMEM, "out of memory");
    memset(p + L->dsx_cap, 0, (size_t)(nc - L->dsx_cap) * sizeof *p);
    L->dsx = p;
    L->dsx_cap = nc;
  }
  /* the offsets, members and names now live in the loader's index */
  free(x->offsets), x->offsets = NULL;
  free(x->blank_lines), x->blank_lines = NULL;
  free(x->members), x->members = NULL;
  free(x->names), x->names = NULL;
  L->dsx[shard] = x;
  return MML_OK;
}

mml_status ld_index_open(mml_loader *L, const char *path, mml_dsx **pending, int *added,
                         mml_err *err) {
  *pending = NULL;
  *added = 0;
  if (L->cfg.index && !L->cfg.index[0]) return MML_OK; /* index="" : never */
  /* by default only next to local shards: looking next to each remote one would cost a
   * request per shard (a 404 for data never indexed) before the first batch */
  if (!L->cfg.index && mml_path_is_remote(path)) return MML_OK;
  mml_bytes where = {0}, body = {0};
  if (mml_dsx_sidecar_path(path, L->cfg.index, &where))
    return mml_err_set(err, MML_ENOMEM, "out of memory");
  int found = 0;
  mml_dsx *x = NULL;
  const char *w = (const char *)where.data;
  mml_status st = read_sidecar(L, w, &body, &found, err);
  if (!st && found) {
    if (!(x = calloc(1, sizeof *x)))
      st = mml_err_set(err, MML_ENOMEM, "out of memory");
    else
      st = mml_dsx_parse(body.data, body.len, w, x, err);
    if (st == MML_ERECORD && err) /* a bad index refuses the loader: not a sample's error */
      st = err->status = MML_ECONFIG;
    if (st) free(x), x = NULL;
  }
  mml_bytes_free(&body);
  if (!st && x) st = check_fresh(L, x, path, w, err);
  if (!st && x && x->compression == MML_COMPRESS_NONE) {
    int shard = L->ix.nshards;
    if (!(st = mml_dsx_add_to_index(x, &L->ix, path, err))) {
      st = keep(L, shard, x, err);
      *added = 1;
      x = NULL;
    }
  }
  if (x && !st) {
    *pending = x; /* compressed: counts kept once the scan agrees (ld_index_attach) */
    x = NULL;
  }
  if (x) {
    mml_dsx_free(x);
    free(x);
  }
  mml_bytes_free(&where);
  return st;
}

mml_status ld_index_attach(mml_loader *L, mml_dsx *x, mml_err *err) {
  int shard = L->ix.nshards - 1;
  const mml_index_shard *sh = &L->ix.shards[shard];
  mml_status st = MML_OK;
  if (sh->count != x->n || sh->layout != x->layout) {
    char what[200];
    snprintf(what, sizeof what, "%lld samples, indexed with %lld", (long long)sh->count,
             (long long)x->n);
    mml_bytes where = {0};
    mml_dsx_sidecar_path(sh->path, L->cfg.index, &where);
    st = stale(err, sh->path, where.data ? (const char *)where.data : "?", what);
    mml_bytes_free(&where);
  } else {
    st = keep(L, shard, x, err);
  }
  if (st) {
    mml_dsx_free(x);
    free(x);
  }
  return st;
}

void ld_index_check_sources(mml_loader *L) {
  for (int i = 0; i < L->nsrc; i++) {
    ld_source *src = &L->src[i];
    for (int k = src->shard0; k < src->shard0 + src->nshards && k < L->dsx_cap; k++) {
      mml_dsx *x = L->dsx[k];
      if (!x) continue;
      if (x->key == src->index_key) {
        L->index_used++;
        continue;
      }
      free(x->samples), x->samples = NULL; /* offsets only: the counts do not apply */
      free(x->images), x->images = NULL;
      free(x->first_image), x->first_image = NULL;
      mml_err e;
      mml_err_set(&e, MML_OK,
                  "data shard %s: its index was built with other settings (%s), this %s "
                  "uses (%s): its offsets are used, its token counts are not; rebuild it with "
                  "these settings",
                  L->ix.shards[k].path, x->settings, L->cfg.nsources > 0 ? "source" : "loader",
                  src->index_settings);
      e.status = MML_OK;
      pthread_mutex_lock(&L->mu);
      ld_push_warning_locked(L, &e);
      pthread_mutex_unlock(&L->mu);
    }
  }
}

int ld_index_counts(const mml_loader *L, int shard, int64_t index, int64_t *tokens,
                    int64_t *vision_tokens) {
  if (shard < 0) {
    int64_t off, len, where;
    mml_index_locate(&L->ix, index, &shard, &off, &len, &where);
  }
  const mml_dsx *x = shard < L->dsx_cap ? L->dsx[shard] : NULL;
  if (!x || !x->samples) return 0;
  int64_t k = index - L->ix.shards[shard].first;
  const mml_dsx_sample *s = &x->samples[k];
  if (s->status) return 0;
  int64_t v = 0;
  for (int64_t j = x->first_image[k]; j < x->first_image[k + 1]; j++) v += x->images[j].tokens;
  *tokens = (int64_t)s->text_tokens + v;
  *vision_tokens = v;
  return 1;
}

int ld_index_all_counts(const mml_loader *L, int64_t *tokens, int64_t *vision, uint8_t *why) {
  for (int k = 0; k < L->ix.nshards; k++)
    if (k >= L->dsx_cap || !L->dsx[k] || !L->dsx[k]->samples) return 0;
  for (int k = 0; k < L->ix.nshards; k++) {
    const mml_index_shard *sh = &L->ix.shards[k];
    const mml_dsx *x = L->dsx[k];
    const mml_pipeline *pl = &L->src[L->shard_src[k]].pl;
    const int64_t max = pl->max_length,
                  mm = (int64_t)pl->vision->merge_size * pl->vision->merge_size;
    for (int64_t j = 0; j < sh->count; j++) {
      int64_t i = sh->first + j, off, len, where, v = 0, vv = 0;
      int shard;
      const mml_dsx_sample *s = &x->samples[j];
      mml_index_locate(&L->ix, i, &shard, &off, &len, &where);
      const int64_t m0 = x->first_image[j], m1 = x->first_image[j + 1];
      for (int64_t m = m0; m < m1; m++) v += x->images[m].tokens;
      for (int64_t m = m1 - (s->nvideos < m1 - m0 ? s->nvideos : m1 - m0); m < m1; m++)
        vv += x->images[m].tokens; /* the videos: the last nvideos entries */
      mml_status st = len > L->cfg.max_record_bytes ? MML_ERECORDSIZE /* as stage_record */
                      : s->status                   ? (mml_status)s->status
                      : max > 0 && (int64_t)s->text_tokens + v > max ? MML_ETOOLONG
                                                                     : MML_OK;
      /* then max_sample_pixel_bytes, as mml_sample_plan: a patch row per token * merge^2 */
      if (!st && mml_sample_check_pixel_bytes(pl, 0, 0, (v - vv) * mm, vv * mm, NULL))
        st = MML_ESAMPLEPIXELS;
      tokens[i] = st ? -1 : (int64_t)s->text_tokens + v;
      vision[i] = st ? 0 : v;
      why[i] = (uint8_t)st;
    }
  }
  return 1;
}

mml_status ld_index_precheck(const mml_loader *L, const mml_sample *s, mml_err *err) {
  int64_t n, v;
  if (!ld_index_counts(L, s->shard, s->index, &n, &v)) return MML_OK;
  int64_t max = L->src[s->source].pl.max_length;
  if (max > 0 && n > max) /* the message mml_sample_plan gives */
    return mml_err_set(err, MML_ETOOLONG, "%lld tokens > max_length %lld", (long long)n,
                       (long long)max);
  return mml_collator_check_length(L->collator, n, err);
}

void ld_index_free(mml_loader *L) {
  for (int i = 0; i < L->dsx_cap; i++)
    if (L->dsx[i]) {
      mml_dsx_free(L->dsx[i]);
      free(L->dsx[i]);
    }
  free(L->dsx);
  L->dsx = NULL;
  L->dsx_cap = 0;
}
