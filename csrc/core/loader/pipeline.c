/*
 * pipeline.c — the per-sample pipeline the engine's workers run (mml_sample_plan, then
 * mml_sample_decode, in mml/loader.h); the sample container itself is batch/sample.c.
 *
 * Order of work for one sample, cheapest checks first so a bad sample costs little:
 *   mml_sample_plan:   1. plan every image from its header alone (size, grid, tokens);
 *                      2. render the chat template to ids + labels with those counts;
 *                      3. reject it as too long before any pixel work;
 *                      (videos: frame lists from their frames' headers, files from their
 *                      probe: frame indices, sizes, grids, tokens; nothing decoded);
 *   mml_sample_decode: 4. decode + resize + normalise + patchify every image straight
 *                      into the destination the caller gives (the loader: the sample's
 *                      slice of its batch's pixel_values buffer, once the batch
 *                      composition has been planned from the counts of step 1);
 *   mml_sample_decode_videos: 5. the same for every video's planned frames, into the
 *                      slice of the batch's pixel_values_videos buffer.
 * Threads: one worker owns a sample and its scratch while planning or decoding; nothing
 * is shared but the immutable config, template and tokenizer.
 */
#include "mml/loader.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "mml/message.h"
#include "mml/template.h"
#include "mml/video_frames.h"

mml_status mml_sample_scratch_init(mml_sample_scratch *s, mml_err *err) {
  memset(s, 0, sizeof *s);
  if (mml_vision_scratch_new(&s->vision) != MML_OK || mml_tok_scratch_new(&s->tok) != MML_OK) {
    mml_sample_scratch_free(s);
    return mml_err_set(err, MML_ENOMEM, "cannot allocate worker scratch");
  }
  return MML_OK;
}

void mml_sample_scratch_free(mml_sample_scratch *s) {
  mml_vision_scratch_free(s->vision);
  mml_tok_scratch_free(s->tok);
  mml_mix_scratch_free(&s->mix);
  free(s->tokens);
  mml_video_scratch_free(s->video);
  free(s->vtokens);
  free(s->vts);
  memset(s, 0, sizeof *s);
}

static mml_status scratch_fit(mml_sample_scratch *s, int n, mml_err *err) {
  if (n <= s->cap) return MML_OK;
  int nc = s->cap ? s->cap : 4;
  while (nc < n) nc *= 2;
  int64_t *t = realloc(s->tokens, (size_t)nc * sizeof *t);
  if (!t) return mml_err_set(err, MML_ENOMEM, "out of memory planning %d images", n);
  s->tokens = t;
  s->cap = nc;
  return MML_OK;
}

static mml_status video_scratch_fit(mml_sample_scratch *s, const mml_record *rec,
                                    const mml_video_info *vinfo, mml_err *err) {
  if (!s->video && mml_video_scratch_new(&s->video))
    return mml_err_set(err, MML_ENOMEM, "cannot allocate video scratch");
  int n = rec->nvideos;
  if (n > s->vcap) {
    void *q = realloc(s->vtokens, (size_t)n * sizeof *s->vtokens);
    if (!q) return mml_err_set(err, MML_ENOMEM, "out of memory planning %d videos", n);
    s->vtokens = q;
    s->vcap = n;
  }
  size_t need = (size_t)mml_record_frames(rec) + (size_t)n; /* >= every grid_t */
  for (int v = 0; v < n; v++)                               /* a file keeps at most its frames */
    if (rec->videos[v].ref && vinfo[v].nframes > 0) need += (size_t)vinfo[v].nframes;
  if (need > s->vts_cap) {
    double *t = realloc(s->vts, need * sizeof *t);
    if (!t) return mml_err_set(err, MML_ENOMEM, "out of memory planning %d videos", n);
    s->vts = t;
    s->vts_cap = need;
  }
  return MML_OK;
}

void mml_sample_err_video(mml_err *err, const mml_video_ref *vr, int v) {
  if (!vr->ref) {
    mml_err_prefix(err, "video %d", v);
    return;
  }
  if (strstr(err->msg, vr->ref)) return;
  char shown[MML_SHORT_CAP(200)];
  mml_err_prefix(err, "video %s",
                 mml_text_short(vr->ref, strlen(vr->ref), 200, shown, sizeof shown));
}

/* Plans every video into vplans (frames: the frame bytes after the images; vinfo: the
 * files' probes); *src_px adds their frames' pixels. */
static mml_status plan_videos(const mml_pipeline *pl, mml_sample_scratch *sc, const mml_record *rec,
                              const mml_bytes *frames, const mml_video_info *vinfo,
                              mml_video_plan *vplans, int64_t *rows, int64_t *src_px,
                              mml_err *err) {
  mml_status st = video_scratch_fit(sc, rec, vinfo, err);
  if (st) return st;
  double *ts = sc->vts;
  for (int v = 0; v < rec->nvideos; v++) {
    const mml_video_ref *vr = &rec->videos[v];
    mml_video_plan *p = &vplans[v];
    if (vr->ref) {
      st = mml_video_plan_file(pl->vision, &vr->keys, &vinfo[v], p, ts, err);
    } else {
      st = mml_video_plan_list(pl->vision, vr, frames, p, ts, err);
      frames += vr->nframes;
    }
    if (st) {
      mml_sample_err_video(err, vr, v);
      return st;
    }
    sc->vtokens[v] =
        (mml_video_tokens){.groups = p->grid_t, .group_tokens = p->group_tokens, .timestamps = ts};
    ts += p->grid_t;
    *rows += p->rows;
    *src_px += mml_video_plan_pixels(p);
  }
  return MML_OK;
}

mml_status mml_sample_decode_videos(const mml_pipeline *pl, mml_sample_scratch *sc,
                                    const mml_record *rec, const mml_bytes *images,
                                    const mml_video_plan *vplans, mml_sample_video_open_fn open,
                                    void *ctx, void *out, mml_err *err) {
  double t0 = mml_now();
  const size_t row_bytes = mml_vision_video_row_bytes(pl->vision);
  mml_status st = MML_OK;
  if (!sc->video && mml_video_scratch_new(&sc->video))
    return mml_err_set(err, MML_ENOMEM, "cannot allocate video scratch");
  uint8_t *dst = out;
  const mml_bytes *frames = images + rec->nimages;
  for (int v = 0; v < rec->nvideos && !st; v++) {
    const mml_video_ref *vr = &rec->videos[v];
    const mml_video_plan *p = &vplans[v];
    if (vr->ref) {
      mml_video *vid = NULL;
      if (!(st = open(ctx, v, &vid, err)))
        st = mml_video_process_file(pl->vision, sc->video, vid, p, dst, err);
      mml_video_close(vid);
    } else {
      st = mml_video_process_list(pl->vision, sc->video, sc->vision, vr, frames, p, dst, err);
      frames += vr->nframes;
    }
    if (st) mml_sample_err_video(err, vr, v);
    dst += (size_t)p->rows * row_bytes;
  }
  sc->vision_s += mml_now() - t0;
  return st;
}

/* Whether any label is supervised (not -100). */
static int any_label(const mml_ids *labels) {
  for (size_t i = 0; i < labels->len; i++)
    if (labels->data[i] != -100) return 1;
  return 0;
}

/* The ids and labels of rec: a pack's records each rendered on its own (as Qwen's
 * _get_packed_item makes each with _get_item) and appended, each one's (tokens, images,
 * videos) noted in out->subs. */
static mml_status encode_records(const mml_pipeline *pl, mml_sample_scratch *sc,
                                 const mml_record *rec, mml_sample *out, mml_err *err) {
  const mml_video_tokens *vt = rec->nvideos ? sc->vtokens : NULL;
  if (!rec->nsubs)
    return mml_template_encode_media(pl->tmpl, sc->tok, rec, sc->tokens, vt, &out->input_ids,
                                     &out->labels, err);
  for (int k = 0; k < rec->nsubs; k++) {
    const mml_record one = mml_record_sub(rec, k);
    const size_t at = out->input_ids.len;
    mml_status st = mml_template_encode_media(pl->tmpl, sc->tok, &one, sc->tokens, vt,
                                              &out->input_ids, &out->labels, err);
    if (st) {
      mml_err_prefix(err, "record %d of the pack", k);
      return st;
    }
    int32_t e[3] = {(int32_t)(out->input_ids.len - at), 0, 0}; /* tokens, images, videos */
    for (int m = 0; m < one.nmessages; m++)
      for (int i = 0; i < one.messages[m].nparts; i++) {
        mml_part_kind kind = one.messages[m].parts[i].kind;
        if (kind != MML_PART_TEXT) e[kind == MML_PART_IMAGE ? 1 : 2]++;
      }
    if ((st = mml_ids_append(&out->subs, e, 3)))
      return mml_err_set(err, st, "out of memory for a pack's records");
  }
  return MML_OK;
}

mml_status mml_sample_measure(const mml_pipeline *pl, mml_sample_scratch *sc, const mml_record *rec,
                              const mml_bytes *media, mml_vision_plan *plans,
                              const mml_video_info *vinfo, mml_video_plan *vplans, mml_sample *out,
                              mml_err *err) {
  mml_status st;
  int n = rec->nimages;
  if ((st = scratch_fit(sc, n, err))) return st;
  double t0 = mml_now();
  int64_t src_px = 0;
  out->vision_tokens = 0;
  for (int i = 0; i < n; i++) {
    st = mml_vision_plan_bytes_budget(pl->vision, media[i].data, media[i].len,
                                      rec->budgets ? &rec->budgets[i] : NULL, &plans[i], err);
    if (st) {
      mml_sample_err_image(err, rec->images[i]);
      return st;
    }
    sc->tokens[i] = plans[i].tokens;
    out->vision_tokens += plans[i].tokens;
    src_px += mml_vision_plan_pixels(&plans[i]);
  }
  int64_t vrows = 0;
  if (rec->nvideos &&
      (st = plan_videos(pl, sc, rec, media + n, vinfo, vplans, &vrows, &src_px, err)))
    return st;
  for (int v = 0; v < rec->nvideos; v++) out->vision_tokens += vplans[v].tokens;
  if (pl->max_sample_pixels > 0 && src_px > pl->max_sample_pixels)
    return mml_err_set(err, MML_ESAMPLEPIXELS,
                       "%d image(s) and %d video(s) of %lld pixels in all (each at its larger "
                       "size: in the file or resized), above max_sample_pixels=%lld",
                       n, rec->nvideos, (long long)src_px, (long long)pl->max_sample_pixels);
  double t1 = mml_now();
  sc->vision_s += t1 - t0;
  st = encode_records(pl, sc, rec, out, err);
  sc->text_s += mml_now() - t1;
  return st;
}

mml_status mml_sample_check_target(const mml_sample *s, mml_err *err) {
  if (!any_label(&s->labels))
    return mml_err_set(err, MML_ENOTARGET,
                       "no trainable turn: no token of the sample is supervised (no assistant "
                       "reply, or label_mode leaves none)");
  return MML_OK;
}

mml_status mml_sample_check(const mml_pipeline *pl, const mml_sample *s, mml_err *err) {
  mml_status st = mml_sample_check_target(s, err);
  if (st) return st;
  if (pl->max_length > 0 && (int64_t)s->input_ids.len > pl->max_length)
    return mml_err_set(err, MML_ETOOLONG, "%zu tokens > max_length %lld", s->input_ids.len,
                       (long long)pl->max_length);
  return MML_OK;
}

int64_t mml_sample_pixel_bytes(const mml_vision_cfg *v, int64_t rows, int64_t vrows) {
  const int64_t rb = (int64_t)mml_vision_row_bytes(v), vb = (int64_t)mml_vision_video_row_bytes(v);
  if (rows < 0 || vrows < 0 || (rb && rows > INT64_MAX / rb) || (vb && vrows > INT64_MAX / vb))
    return INT64_MAX;
  const int64_t a = rows * rb, b = vrows * vb;
  return a > INT64_MAX - b ? INT64_MAX : a + b;
}

mml_status mml_sample_check_pixel_bytes(const mml_pipeline *pl, int nimages, int nvideos,
                                        int64_t rows, int64_t vrows, mml_err *err) {
  const int64_t bytes = mml_sample_pixel_bytes(pl->vision, rows, vrows);
  if (pl->max_sample_pixel_bytes > 0 && bytes > pl->max_sample_pixel_bytes)
    return mml_err_set(err, MML_ESAMPLEPIXELS,
                       "%d image(s) and %d video(s) whose pixel values take %lld bytes as %s "
                       "(resized), above max_sample_pixel_bytes=%lld",
                       nimages, nvideos, (long long)bytes,
                       mml_dtype_name(mml_vision_pixel_dtype(pl->vision)),
                       (long long)pl->max_sample_pixel_bytes);
  return MML_OK;
}

mml_status mml_sample_plan(const mml_pipeline *pl, mml_sample_scratch *sc, const mml_record *rec,
                           const mml_bytes *images, mml_vision_plan *plans,
                           const mml_video_info *vinfo, mml_video_plan *vplans, mml_sample *out,
                           mml_err *err) {
  mml_status st = mml_sample_measure(pl, sc, rec, images, plans, vinfo, vplans, out, err);
  if (!st) st = mml_sample_check(pl, out, err);
  if (st) return st;
  const int n = rec->nimages;
  int64_t rows = 0, vrows = 0;
  for (int i = 0; i < n; i++) rows += plans[i].rows;
  for (int v = 0; v < rec->nvideos; v++) vrows += vplans[v].rows;
  const int cols = n ? plans[n - 1].cols : 0;
  if ((st = mml_sample_check_pixel_bytes(pl, n, rec->nvideos, rows, vrows, err))) return st;
  out->pixels_elsewhere = 1;
  if (pl->plan_only) { /* composition needs only the token count */
    out->pixel_rows = 0;
    out->pixel_cols = 0;
    out->nimages = 0;
    out->nvideos = 0;
    return MML_OK;
  }
  for (int i = 0; i < n; i++) {
    int32_t g[3] = {plans[i].grid_t, plans[i].grid_h, plans[i].grid_w};
    if ((st = mml_ids_append(&out->grids, g, 3)))
      return mml_err_set(err, st, "out of memory for the image grids");
  }
  for (int v = 0; v < rec->nvideos; v++) { /* their pixels: mml_sample_decode_videos */
    const mml_video_plan *p = &vplans[v];
    int32_t g[3] = {p->grid_t, p->grid_h, p->grid_w};
    if ((st = mml_ids_append(&out->vgrids, g, 3)) ||
        (st = mml_bytes_append(&out->vsecs, &p->second_per_grid, sizeof(float))))
      return mml_err_set(err, st, "out of memory for the video grids");
  }
  out->nvideos = rec->nvideos;
  out->vpixel_rows = vrows;
  out->pixel_rows = rows;
  out->pixel_cols = cols;
  out->nimages = n;
  return MML_OK;
}

mml_status mml_sample_decode(const mml_pipeline *pl, mml_sample_scratch *sc, const mml_record *rec,
                             const mml_bytes *images, const mml_vision_plan *plans, int nimages,
                             void *dst, mml_err *err) {
  double t0 = mml_now();
  mml_status st = MML_OK;
  uint8_t *o = dst;
  const size_t row_bytes = mml_vision_row_bytes(pl->vision);
  for (int i = 0; i < nimages && !st; i++) {
    st = mml_vision_process_bytes(pl->vision, sc->vision, images[i].data, images[i].len, &plans[i],
                                  o, err);
    if (st) mml_sample_err_image(err, rec->images[i]);
    o += (size_t)plans[i].rows * row_bytes;
  }
  sc->vision_s += mml_now() - t0;
  return st;
}

static int is_url(const char *s) {
  return !strncmp(s, "http://", 7) || !strncmp(s, "https://", 8) || !strncmp(s, "s3://", 5);
}

mml_status mml_sample_image_path(const char *root, const char *ref, mml_bytes *out, mml_err *err) {
  mml_bytes_clear(out);
  mml_status st = MML_OK;
  if (!strncmp(ref, "file://", 7)) ref += 7;
  if (is_url(ref) || ref[0] == '/' || !root || !root[0]) {
    st = mml_bytes_append(out, ref, strlen(ref) + 1);
  } else {
    size_t rl = strlen(root);
    while (ref[0] == '.' && ref[1] == '/') ref += 2;
    st = mml_bytes_append(out, root, rl);
    if (!st && root[rl - 1] != '/') st = mml_bytes_append(out, "/", 1);
    if (!st) st = mml_bytes_append(out, ref, strlen(ref) + 1);
  }
  if (st) return mml_err_set(err, st, "out of memory building an image path");
  out->len--; /* keep the NUL out of len */
  return MML_OK;
}

void mml_sample_err_image(mml_err *err, const char *ref) {
  char shown[MML_SHORT_CAP(200)];
  mml_err_prefix(err, "image %s", mml_text_short(ref, strlen(ref), 200, shown, sizeof shown));
}

/* 1 when the relative path p climbs above its start ("..", "a/../.."). */
static int climbs_out(const char *p) {
  int depth = 0;
  while (*p) {
    size_t n = strcspn(p, "/");
    if (n == 2 && p[0] == '.' && p[1] == '.') {
      if (--depth < 0) return 1;
    } else if (n && !(n == 1 && p[0] == '.')) {
      depth++;
    }
    p += n;
    while (*p == '/') p++;
  }
  return 0;
}

/* 1 when the file `path` (symlinks followed) lies inside the folder `root`. */
static int resolves_inside(const char *root, const char *path) {
  char rr[PATH_MAX], rp[PATH_MAX];
  if (!realpath(root, rr)) return 0;
  if (!realpath(path, rp)) return 1; /* missing: nothing to follow; the read reports it */
  size_t n = strlen(rr);
  if (n == 1) return 1; /* root is "/" */
  return !strncmp(rr, rp, n) && rp[n] == '/';
}

mml_status mml_sample_image_allowed(const mml_loader_cfg *cfg, const char *root, const char *ref,
                                    const char *resolved, int local_shard, mml_err *err) {
  char shown[MML_SHORT_CAP(200)];
#define SHOWN mml_text_short(ref, strlen(ref), 200, shown, sizeof shown)
  if (!cfg->allow_remote_images && local_shard && is_url(ref))
    return mml_err_set(err, MML_EPATH,
                       "image %s: a local record names a remote image, refused by "
                       "allow_remote_images_in_local_data=False",
                       SHOWN);
  if (cfg->allow_paths_outside_root || is_url(ref)) return MML_OK;
  const char *r = strncmp(ref, "file://", 7) ? ref : ref + 7;
  if (r[0] == '/')
    return mml_err_set(err, MML_EPATH,
                       "image %s: an absolute path, refused by allow_paths_outside_root=False",
                       SHOWN);
  if (climbs_out(r))
    return mml_err_set(err, MML_EPATH,
                       "image %s: climbs out of the image root with \"..\", refused by "
                       "allow_paths_outside_root=False",
                       SHOWN);
  if (root && root[0] && !mml_path_is_remote(resolved) && !resolves_inside(root, resolved))
    return mml_err_set(err, MML_EPATH,
                       "image %s: resolves (through a symlink) outside the image root, refused "
                       "by allow_paths_outside_root=False",
                       SHOWN);
#undef SHOWN
  return MML_OK;
}
