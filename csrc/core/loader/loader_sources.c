/*
 * loader_sources.c — the loader's sources: construction (each source's shards into the
 * one index, per-epoch counts, the mixture and the rank's sampler, and the settings a
 * source's samples are processed with: image root, vision config, template, max_length),
 * the stream-position lookup the workers run, and per-source stats.
 *
 * A loader always has at least one source: without a mixture, the one made of cfg->data
 * with the loader's own settings, whose order is then exactly the plain sampler's.  A
 * worker finds a sample's settings as L->src[sample.source].pl (shards are grouped by
 * source, so L->shard_src maps a shard to its source).
 *
 * Threads: everything is immutable after construction except the stats, which only the
 * collation thread writes and the consumer reads, both under mu.  A sample is counted in
 * its source and in the loader's totals in one hold of mu, so mml_loader_get_stats_all
 * (all sources and the totals read in one hold) sees sum(samples) == good_samples.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loader_int.h"
#include "mml/record.h"

static char *dirname_of(const char *path) {
  const char *slash = strrchr(path, '/');
  if (!slash) return strdup(".");
  size_t n = (size_t)(slash - path);
  if (n == 0) n = 1; /* "/x.jsonl" -> "/" */
  char *d = malloc(n + 1);
  if (!d) return NULL;
  memcpy(d, path, n);
  d[n] = 0;
  return d;
}

static char *root_copy(const char *root) {
  if (!root || !root[0]) return NULL;
  char *r = strdup(root);
  if (!r) return NULL;
  size_t n = strlen(r);
  while (n > 1 && r[n - 1] == '/') r[--n] = 0;
  return r;
}

static mml_status oom(mml_err *err) {
  return mml_err_set(err, MML_ENOMEM, "out of memory building the loader");
}

/* `columns` ("column=key,column=key"; NULL: none) into NULL-terminated pairs {column,
 * key, ...} (*out, malloc'd, NULL when none): each key one a record reads
 * (mml_record_keys), no column or key twice. */
static mml_status parse_columns(const char *spec, char ***out, mml_err *err) {
  *out = NULL;
  if (!spec || !*spec) return MML_OK;
  size_t n = 1;
  for (const char *p = spec; *p; p++) n += *p == ',';
  char **m = calloc(2 * n + 1, sizeof *m);
  if (!m) return oom(err);
  *out = m;
  const char *p = spec;
  for (size_t i = 0; i < n; i++) {
    const char *end = strchr(p, ','), *eq = strchr(p, '=');
    if (!end) end = p + strlen(p);
    if (!eq || eq >= end || eq == p || eq + 1 == end)
      return mml_err_set(err, MML_ECONFIG,
                         "columns=%s: each entry must be column=key (got \"%.*s\")", spec,
                         (int)(end - p), p);
    if (!(m[2 * i] = strndup(p, (size_t)(eq - p))) ||
        !(m[2 * i + 1] = strndup(eq + 1, (size_t)(end - eq - 1))))
      return oom(err);
    int known = 0;
    for (int k = 0; mml_record_keys[k] && !known; k++)
      known = !strcmp(mml_record_keys[k], m[2 * i + 1]);
    if (!known)
      return mml_err_set(err, MML_ECONFIG,
                         "columns=%s: \"%s\" is not a key a record is read from (messages, "
                         "conversations, images, image, videos, video, system, tools, ...)",
                         spec, m[2 * i + 1]);
    for (size_t j = 0; j < i; j++)
      if (!strcmp(m[2 * j], m[2 * i]) || !strcmp(m[2 * j + 1], m[2 * i + 1]))
        return mml_err_set(err, MML_ECONFIG, "columns=%s: a column or key given twice", spec);
    p = end + 1;
  }
  return MML_OK;
}

static void free_columns(char **m) {
  for (size_t i = 0; m && m[i]; i++) free(m[i]);
  free(m);
}

/* Indexes one source's shards; its samples follow the previous source's in the index. */
static mml_status index_source(mml_loader *L, ld_source *src, const mml_source_cfg *sc, int mixture,
                               mml_err *err) {
  if (!sc->data || sc->ndata < 1)
    return mml_err_set(err, MML_ECONFIG, mixture ? "source %s: no data given" : "no data given",
                       src->name);
  src->shard0 = L->ix.nshards;
  src->first = L->ix.n;
  mml_status st = parse_columns(sc->columns, &src->pq_map, err);
  L->ix.pq_map = (const char *const *)src->pq_map; /* its Parquet shards' names */
  for (int i = 0; !st && i < sc->ndata; i++) st = ld_add_data(L, sc->data[i], err);
  L->ix.pq_map = NULL;
  for (int k = src->shard0; !st && src->pq_map && k < L->ix.nshards; k++)
    if (!mml_index_shard_parquet(&L->ix.shards[k]))
      st = mml_err_set(err, MML_ECONFIG,
                       "columns=%s: data shard %s is not a Parquet file (columns renames a "
                       "Parquet dataset's columns)",
                       sc->columns, L->ix.shards[k].path);
  if (st) {
    if (mixture) mml_err_prefix(err, "source %s", src->name);
    return st;
  }
  src->nshards = L->ix.nshards - src->shard0;
  src->n = L->ix.n - src->first;
  if (src->n == 0) {
    if (!mixture)
      return mml_err_set(err, MML_ECONFIG, "the data holds no samples (%d shard(s), all empty)",
                         src->nshards);
    return mml_err_set(err, MML_ECONFIG, "source %s holds no samples (%d shard(s), all empty)",
                       src->name, src->nshards);
  }
  return MML_OK;
}

/* A source's processing settings: vision config, template (label mode, system turn),
 * max_length. */
static mml_status source_pipeline(mml_loader *L, ld_source *src, const mml_source_cfg *sc,
                                  mml_err *err) {
  const mml_vision_cfg *lv = &L->cfg.vision;
  if (sc->vision.patch_size != lv->patch_size || sc->vision.merge_size != lv->merge_size ||
      sc->vision.temporal_patch_size != lv->temporal_patch_size)
    return mml_err_set(err, MML_ECONFIG,
                       "source %s: its patch, merge and temporal sizes must be the loader's",
                       src->name);
  src->vision = sc->vision;
  src->vision.pixel_format = L->cfg.collate.pixel_format; /* one format for the loader */
  src->vision.max_jpeg_scans = L->cfg.max_jpeg_scans;
  src->vision.cancel = &L->cancel;              /* close() stops a decode under way */
  if (sc->recipe == MML_RECIPE_LLAMA_FACTORY) { /* its image pre-resize (vision/prescale.c) */
    src->vision.lf = 1;
    src->vision.lf_max_pixels = sc->lf.image_max_pixels;
    src->vision.lf_min_pixels = sc->lf.image_min_pixels;
    src->vision.lf_video_fps = sc->lf.video_fps;
    src->vision.lf_video_maxlen = sc->lf.video_maxlen;
    src->vision.lf_video_max_pixels = sc->lf.video_max_pixels;
    src->vision.lf_video_min_pixels = sc->lf.video_min_pixels;
  }
  if (sc->recipe == MML_RECIPE_QWEN_VL_FINETUNE) { /* its video path (video/video_frames.c) */
    src->vision.qft = 1;
    src->vision.qft_video_fps = sc->lf.video_fps; /* the rows both recipes read */
    src->vision.qft_video_min_frames = sc->qft.video_min_frames;
    src->vision.qft_video_max_frames = sc->qft.video_max_frames;
    src->vision.video_min_pixels = sc->lf.video_min_pixels;
    src->vision.video_max_pixels = sc->lf.video_max_pixels;
  }
  mml_status st = mml_vision_cfg_check(&src->vision, err);
  if (!st)
    st = mml_template_new(L->cfg.template_style, sc->label_mode, L->cfg.tokenizer, &src->tmpl, err);
  if (!st && sc->system_prompt) st = mml_template_set_system(src->tmpl, sc->system_prompt, err);
  if (!st) st = mml_template_set_image_space(src->tmpl, sc->image_space, err);
  if (!st)
    st = mml_template_set_qwen3_video(src->tmpl, (mml_qwen3_video_form)L->cfg.qwen3_video_prompt,
                                      err);
  if (!st && sc->recipe == MML_RECIPE_LLAMA_FACTORY)
    st = mml_template_set_llama_factory(src->tmpl, &sc->lf, err);
  if (!st && sc->recipe == MML_RECIPE_QWEN_VL_FINETUNE)
    st = mml_template_set_qwen_finetune(src->tmpl, &sc->qft, err);
  if (st) {
    if (L->cfg.nsources > 0) mml_err_prefix(err, "source %s", src->name);
    return st;
  }
  src->pl.vision = &src->vision;
  src->pl.tmpl = src->tmpl;
  src->pl.max_length = sc->max_length;
  src->pl.plan_only = L->cfg.plan_only;
  src->pl.max_sample_pixels = L->cfg.max_sample_pixels;
  src->pl.max_sample_pixel_bytes = L->cfg.max_sample_pixel_bytes;
  return ld_index_source_key(L, src, sc, err);
}

/* Plain data: one source with the loader's settings. */
static mml_source_cfg the_one_source(const mml_loader_cfg *cfg) {
  return (mml_source_cfg){.name = "data",
                          .data = cfg->data,
                          .ndata = cfg->ndata,
                          .weight = -1,
                          .repeat = -1,
                          .choose = -1,
                          .image_root = cfg->image_root,
                          .columns = cfg->columns,
                          .vision = cfg->vision,
                          .system_prompt = cfg->system_prompt,
                          .label_mode = cfg->label_mode,
                          .image_space = cfg->image_space,
                          .max_length = cfg->max_length,
                          .recipe = cfg->recipe,
                          .lf = cfg->lf,
                          .qft = cfg->qft};
}

mml_status ld_build_sources(mml_loader *L, const mml_loader_cfg *cfg, mml_err *err) {
  mml_source_cfg one;
  const mml_source_cfg *scs = cfg->sources;
  int n = cfg->nsources, mixture = scs && n > 0;
  if (!mixture) {
    one = the_one_source(cfg);
    scs = &one;
    n = 1;
  }
  L->src = calloc((size_t)n, sizeof *L->src);
  mml_mix_spec *spec = calloc((size_t)n, sizeof *spec);
  int64_t *sizes = calloc((size_t)n, sizeof *sizes), *counts = calloc((size_t)n, sizeof *counts);
  mml_status st = MML_OK;
  if (!L->src || !spec || !sizes || !counts) {
    st = oom(err);
    goto done;
  }
  L->nsrc = n;
  L->tok_id = ld_tokenizer_identity(cfg->tokenizer);
  for (int i = 0; i < n && !st; i++) {
    ld_source *src = &L->src[i];
    const mml_source_cfg *sc = &scs[i];
    src->name = strdup(sc->name ? sc->name : "?");
    src->image_root = root_copy(sc->image_root);
    if (!src->name || (sc->image_root && sc->image_root[0] && !src->image_root)) {
      st = oom(err);
      break;
    }
    st = index_source(L, src, sc, mixture, err);
    spec[i] = (mml_mix_spec){src->name, src->n, sc->weight, sc->repeat, sc->choose};
    sizes[i] = src->n;
  }
  if (st) goto done;
  if ((st = mml_mixture_counts(spec, n, cfg->samples_per_epoch, counts, err)) ||
      (st = mml_mixture_init(&L->mix, sizes, counts, n, cfg->seed, cfg->shuffle, err)) ||
      (st = mml_sampler_init(&L->sm, L->mix.total, cfg->seed, cfg->shuffle, cfg->dp_rank,
                             cfg->dp_size, err)))
    goto done;
  for (int i = 0; i < n; i++) L->src[i].count = counts[i];

  int ns = L->ix.nshards;
  L->shard_src = calloc((size_t)ns, sizeof *L->shard_src);
  L->roots = calloc((size_t)ns, sizeof *L->roots);
  L->remote = calloc((size_t)ns, sizeof *L->remote);
  if (!L->shard_src || !L->roots || !L->remote) {
    st = oom(err);
    goto done;
  }
  for (int i = 0; i < n && !st; i++) {
    ld_source *src = &L->src[i];
    for (int k = src->shard0; k < src->shard0 + src->nshards; k++) {
      const char *path = L->ix.shards[k].path;
      L->shard_src[k] = i;
      L->remote[k] = mml_index_shard_remote(&L->ix.shards[k]);
      L->roots[k] = src->image_root ? strdup(src->image_root) : dirname_of(path);
      if (!L->roots[k]) {
        st = oom(err);
        break;
      }
    }
    if (!st) st = source_pipeline(L, src, &scs[i], err);
  }
  if (!st) ld_index_check_sources(L);
  if (!st) st = ld_pq_cache_new(L, err); /* Parquet shards' row groups (loader_parquet.c) */
done:
  free(spec);
  free(sizes);
  free(counts);
  return st;
}

void ld_free_sources(mml_loader *L) {
  for (int i = 0; L->src && i < L->nsrc; i++) {
    free(L->src[i].name);
    free(L->src[i].image_root);
    free(L->src[i].index_settings);
    free_columns(L->src[i].pq_map);
    if (L->src[i].tmpl) mml_template_free(L->src[i].tmpl);
  }
  free(L->src);
  L->src = NULL;
  if (L->roots)
    for (int i = 0; i < L->ix.nshards; i++) free(L->roots[i]);
  free(L->roots);
  free(L->remote);
  free(L->shard_src);
  L->roots = NULL;
  L->remote = NULL;
  L->shard_src = NULL;
  mml_mixture_free(&L->mix);
}

mml_status ld_lookup(const mml_loader *L, mml_mix_scratch *sc, mml_sample *s, mml_err *err) {
  int64_t j;
  if (!L->gp)
    j = mml_sampler_slot(&L->sm, s->pos);
  else if (ld_plan_slot(L, s->epoch, s->pos, &j, err))
    return err->status; /* past the plan */
  if (mml_mixture_at(&L->mix, sc, s->epoch, j, &s->source, &s->index))
    return mml_err_set(err, MML_ENOMEM, "out of memory looking up epoch %lld position %lld",
                       (long long)s->epoch, (long long)j);
  return MML_OK;
}

/* ---- stats ---------------------------------------------------------------------------- */

static void check_drift_locked(mml_loader *L) {
  double tol = L->cfg.mixture_tolerance == 0 ? 0.05 : L->cfg.mixture_tolerance;
  if (tol < 0 || L->nsrc < 2 || L->good < 500 || (L->samples & 63) != 0) return;
  if (L->cfg.group_by_length > 0) return; /* its windows reorder the sources on purpose */
  for (int i = 0; i < L->nsrc; i++) {
    ld_source *src = &L->src[i];
    if (src->drift_warned) continue;
    double share = (double)src->good / (double)L->good;
    double want = (double)src->count / (double)L->mix.total;
    if (fabs(share - want) <= tol) continue;
    src->drift_warned = 1;
    mml_err e;
    mml_err_set(&e, MML_OK,
                "source %s makes up %.1f%% of the %llu samples delivered so far, but %.1f%% "
                "of the epoch (%lld of %lld draws; it skipped %llu of its samples); "
                "mixture_tolerance=%g",
                src->name, 100 * share, (unsigned long long)L->good, 100 * want,
                (long long)src->count, (long long)L->mix.total, (unsigned long long)src->skipped,
                tol);
    e.status = MML_OK;
    ld_push_warning_locked(L, &e);
  }
}

void ld_source_count_skip_locked(mml_loader *L, int source, mml_status st) {
  ld_source *src = &L->src[source];
  src->skipped++;
  src->skip_by_status[st < MML_STATUS_COUNT ? st : MML_EINTERNAL]++;
}

void ld_source_count_locked(mml_loader *L, const mml_sample *s) {
  ld_source *src = &L->src[s->source];
  src->bytes += s->bytes;
  if (s->status == MML_OK) { /* failures: ld_source_count_skip_locked, when delivered */
    src->good++;
    src->tokens += (int64_t)s->input_ids.len;
    int64_t merge2 = (int64_t)src->vision.merge_size * src->vision.merge_size;
    for (int k = 0; k < s->nimages; k++) {
      const int32_t *g = &s->grids.data[3 * k];
      src->image_tokens += (int64_t)g[0] * g[1] * g[2] / merge2;
    }
  }
  check_drift_locked(L);
}

int mml_loader_num_sources(const mml_loader *L) { return L->nsrc; }
int64_t mml_loader_samples_per_epoch(const mml_loader *L) { return L->mix.total; }

/* The fixed part of source i's stats (name, sizes, data hash): no lock needed. */
static void source_fixed(const mml_loader *L, int i, mml_source_stats *o) {
  memset(o, 0, sizeof *o);
  if (i < 0 || i >= L->nsrc) return;
  const ld_source *src = &L->src[i];
  o->name = src->name;
  o->num_samples = src->n;
  o->per_epoch = src->count;
  o->data_hash = mml_index_hash_shards(&L->ix, src->shard0, src->nshards);
}

void ld_source_counts_locked(const mml_loader *L, int i, mml_source_stats *o) {
  if (i < 0 || i >= L->nsrc) return;
  const ld_source *src = &L->src[i];
  o->samples = src->good;
  o->skipped = src->skipped;
  memcpy(o->skip_by_status, src->skip_by_status, sizeof o->skip_by_status);
  o->tokens = src->tokens;
  o->image_tokens = src->image_tokens;
  o->bytes = src->bytes;
}

void mml_loader_source_stats(mml_loader *L, int i, mml_source_stats *o) {
  source_fixed(L, i, o);
  pthread_mutex_lock(&L->mu);
  ld_source_counts_locked(L, i, o);
  pthread_mutex_unlock(&L->mu);
}

void ld_sources_fixed(const mml_loader *L, mml_source_stats *src, int nsrc) {
  for (int i = 0; i < nsrc; i++) source_fixed(L, i, &src[i]);
}
