/*
 * video_sample.c — qwen-vl-utils 0.0.14's frame sampling and per-frame budget
 * (mml/video_sample.h), written to give the same numbers as its Python: Python floats
 * are doubles here, round() is nearbyint (half to even), math.floor/ceil are floor/ceil,
 * and torch.linspace is computed in float32 the way torch's CPU kernel does.
 *
 * Threads: pure functions; reentrant.
 */
#include "mml/video_sample.h"

#include <math.h>

/* qwen-vl-utils' smart_resize with real-valued limits (fetch_video passes a float
 * max_pixels): max(f, round(x / f) * f) first, then the floor / ceil rescale. */
static mml_status qvu_resize(int height, int width, int factor, double min_pixels,
                             double max_pixels, int *out_h, int *out_w, mml_err *err) {
  if (height < 1 || width < 1)
    return mml_err_set(err, MML_ERECORD, "bad video: frame size %dx%d", width, height);
  if (!(max_pixels >= min_pixels))
    return mml_err_set(err, MML_ERECORD,
                       "bad record: the video's max_pixels %.17g is below its min_pixels %.17g",
                       max_pixels, min_pixels);
  const double f = factor, H = height, W = width;
  double mx = H > W ? H : W, mn = H > W ? W : H;
  if (mx / mn > 200)
    return mml_err_set(err, MML_EASPECT,
                       "absolute aspect ratio must be smaller than 200, got %g (%dx%d)", mx / mn,
                       width, height);
  double h = nearbyint(H / f) * f, w = nearbyint(W / f) * f;
  if (h < f) h = f;
  if (w < f) w = f;
  if (h * w > max_pixels) {
    double beta = sqrt(H * W / max_pixels);
    h = floor(H / beta / f) * f;
    w = floor(W / beta / f) * f;
  } else if (h * w < min_pixels) {
    double beta = sqrt(min_pixels / (H * W));
    h = ceil(H * beta / f) * f;
    w = ceil(W * beta / f) * f;
  }
  if (!(h >= f && w >= f) || h > (1 << 30) || w > (1 << 30))
    return mml_err_set(err, MML_ERECORD,
                       "bad record: a %dx%d video frame resizes to %.0fx%.0f under its budget",
                       width, height, w, h);
  *out_h = (int)h;
  *out_w = (int)w;
  return MML_OK;
}

/* calculate_video_frame_range. */
static mml_status frame_range(const mml_video_keys *k, int64_t total, double fps,
                              mml_video_sampling *s, mml_err *err) {
  if (!(fps > 0))
    return mml_err_set(err, MML_ERECORD, "bad video: video_fps must be a positive number (got %g)",
                       fps);
  if (total <= 0)
    return mml_err_set(err, MML_ERECORD,
                       "bad video: total_frames must be a positive integer (got %lld)",
                       (long long)total);
  s->first = 0;
  s->last = total - 1;
  if (!k->has_start && !k->has_end) {
    s->count = total;
    return MML_OK;
  }
  const double max_duration = (double)total / fps;
  double start = 0, end = max_duration;
  if (k->has_start) {
    start = fmax(0.0, fmin(k->video_start, max_duration));
    s->first = (int64_t)ceil(start * fps);
  }
  if (k->has_end) {
    end = fmax(0.0, fmin(k->video_end, max_duration));
    int64_t e = (int64_t)floor(end * fps);
    s->last = e < total - 1 ? e : total - 1;
  }
  if (s->first >= s->last)
    return mml_err_set(err, MML_ERECORD,
                       "bad record: invalid time range: start frame %lld (at %gs) is not before "
                       "end frame %lld (at %gs); the video is %.2fs (%lld frames at %g fps)",
                       (long long)s->first, start, (long long)s->last, end, max_duration,
                       (long long)total, fps);
  s->count = s->last - s->first + 1;
  return MML_OK;
}

static double floor_by(double x, double f) { return floor(x / f) * f; }
static double ceil_by(double x, double f) { return ceil(x / f) * f; }

/* smart_nframes on `total` frames (the range's count). */
static mml_status smart_nframes(const mml_video_keys *k, int64_t total, double fps, int64_t *out,
                                mml_err *err) {
  const double F = MML_VIDEO_FRAME_FACTOR;
  double n;
  if (k->nframes > 0) {
    n = nearbyint((double)k->nframes / F) * F;
  } else {
    double want = k->fps > 0 ? k->fps : MML_VIDEO_FPS;
    double min_frames =
        ceil_by(k->min_frames > 0 ? (double)k->min_frames : MML_VIDEO_FPS_MIN_FRAMES, F);
    double max_default =
        total < MML_VIDEO_FPS_MAX_FRAMES ? (double)total : MML_VIDEO_FPS_MAX_FRAMES;
    double max_frames = floor_by(k->max_frames > 0 ? (double)k->max_frames : max_default, F);
    n = (double)total / fps * want;
    n = fmin(fmin(fmax(n, min_frames), max_frames), (double)total);
    n = floor_by(n, F);
  }
  if (!(n >= F && n <= (double)total))
    return mml_err_set(err, MML_ERECORD,
                       "bad record: nframes should be in [%d, %lld] (the frames in range), but "
                       "got %.0f",
                       MML_VIDEO_FRAME_FACTOR, (long long)total, n);
  *out = (int64_t)n;
  return MML_OK;
}

mml_status mml_video_sample(const mml_video_keys *k, int64_t total_frames, double fps,
                            mml_video_sampling *out, mml_err *err) {
  mml_status st = frame_range(k, total_frames, fps, out, err);
  if (!st) st = smart_nframes(k, out->count, fps, &out->n, err);
  if (st) return st;
  double c = (double)out->count;
  out->sample_fps = (double)out->n / (c > 1e-6 ? c : 1e-6) * fps;
  return MML_OK;
}

void mml_video_indices(const mml_video_sampling *s, int64_t *idx) {
  const int64_t n = s->n;
  if (n <= 0) return;
  const float start = (float)s->first, end = (float)s->last;
  if (n == 1) {
    idx[0] = (int64_t)nearbyintf(start);
    return;
  }
  /* torch's linspace kernel: step in float32, the first half counted from start, the
   * second from end, each a single fused multiply-add (torch's CPU kernels are built with
   * FMA contraction: start + step * i and end - step * (n - 1 - i) round once) */
  const float step = (end - start) / (float)(n - 1);
  const int64_t half = n / 2;
  for (int64_t i = 0; i < n; i++) {
    float v = i < half ? fmaf(step, (float)i, start) : fmaf(-step, (float)(n - 1 - i), end);
    idx[i] = (int64_t)nearbyintf(v);
  }
}

mml_status mml_video_frame_size(const mml_video_keys *k, int factor, int64_t nframes, int height,
                                int width, int *out_h, int *out_w, mml_err *err) {
  const double f2 = (double)factor * factor;
  if (k->resized_height > 0 && k->resized_width > 0)
    return qvu_resize((int)k->resized_height, (int)k->resized_width, factor, 4 * f2, 16384 * f2,
                      out_h, out_w, err);
  double min_pixels = k->min_pixels > 0 ? (double)k->min_pixels : MML_VIDEO_MIN_TOKENS * f2;
  double total = k->total_pixels > 0 ? k->total_pixels : MML_VIDEO_MODEL_SEQ_LEN * f2 * 0.9;
  double max_pixels =
      fmax(fmin(MML_VIDEO_MAX_TOKENS * f2, total / (double)nframes * MML_VIDEO_FRAME_FACTOR),
           (double)(int64_t)(min_pixels * 1.05));
  if (k->max_pixels > 0 && (double)k->max_pixels < max_pixels) max_pixels = (double)k->max_pixels;
  return qvu_resize(height, width, factor, min_pixels, max_pixels, out_h, out_w, err);
}

mml_status mml_video_list_frame_size(const mml_video_keys *k, int factor, int height, int width,
                                     int *out_h, int *out_w, mml_err *err) {
  const int f = 2 * factor;
  const double f2 = (double)f * f;
  if (k->resized_height > 0 && k->resized_width > 0)
    return qvu_resize((int)k->resized_height, (int)k->resized_width, f, 4 * f2, 16384 * f2, out_h,
                      out_w, err);
  double mn = k->min_pixels > 0 ? (double)k->min_pixels : 4 * f2;
  double mx = k->max_pixels > 0 ? (double)k->max_pixels : 16384 * f2;
  return qvu_resize(height, width, f, mn, mx, out_h, out_w, err);
}

void mml_video_timestamps(const int64_t *idx, int64_t n, double fps, int t, double *ts) {
  if (n <= 0 || t < 1) return;
  int64_t groups = (n + t - 1) / t;
  for (int64_t g = 0; g < groups; g++) {
    int64_t a = g * t, b = g * t + t - 1;
    if (b >= n) b = n - 1; /* padding repeats the last index */
    ts[g] = ((double)idx[a] / fps + (double)idx[b] / fps) / 2;
  }
}

/* ---------------------------------------------------------------- qwen-vl-finetune */

mml_status mml_qft_video_indices(int qwen3, int64_t total, double src_fps, double fps,
                                 int64_t min_frames, int64_t max_frames, int64_t *n, int64_t *idx,
                                 mml_err *err) {
  if (total < 1 || (qwen3 && !(src_fps > 0)))
    return mml_err_set(err, MML_EVIDEO,
                       "recipe=\"qwen-vl-finetune\": the video decodes to %lld frames at %g fps; "
                       "its processor's sampling of such a video is not reproduced",
                       (long long)total, src_fps);
  if (!qwen3) {
    *n = total;
    if (idx)
      for (int64_t i = 0; i < total; i++) idx[i] = i;
    return MML_OK;
  }
  const double want = (double)total / src_fps * fps; /* int(): toward zero */
  int64_t k = want >= 9e18 ? INT64_MAX : (int64_t)want;
  if (k < min_frames) k = min_frames;
  if (k > max_frames) k = max_frames;
  if (k > total) k = total;
  *n = k;
  if (idx) { /* numpy's linspace: i * step, the last set to stop; then round half to even */
    const double stop = (double)(total - 1), step = k > 1 ? stop / (double)(k - 1) : 0;
    for (int64_t i = 0; i < k; i++) idx[i] = (int64_t)nearbyint((double)i * step);
    if (k > 1) idx[k - 1] = total - 1;
  }
  return MML_OK;
}

/* ---------------------------------------------------------------- LLaMA-Factory */

mml_status mml_lf_video_count(int64_t total_frames, double duration, double fps, int64_t maxlen,
                              int64_t *n, mml_err *err) {
  if (total_frames <= 0 || !(duration > 0) || !(fps > 0) || maxlen < 1)
    return mml_err_set(err, MML_EVIDEO,
                       "recipe=\"llama-factory\": the stream gives %lld frames and %g s (its "
                       "header's frame count and duration); LLaMA-Factory's sampling of such a "
                       "video is not reproduced",
                       (long long)total_frames, duration);
  double f = floor(duration * fps);
  int64_t k = f < 1 ? 1 : f > 9e18 ? INT64_MAX : (int64_t)f;
  if (k > maxlen) k = maxlen;
  *n = k < total_frames ? k : total_frames;
  return MML_OK;
}

void mml_lf_video_indices(int64_t total_frames, int64_t n, int64_t *idx) {
  const double stop = (double)(total_frames - 1), step = n > 1 ? stop / (double)(n - 1) : 0;
  for (int64_t i = 0; i < n; i++) idx[i] = (int64_t)((double)i * step);
  if (n > 1) idx[n - 1] = total_frames - 1;
}

void mml_lf_video_timestamps(const int64_t *idx, int64_t n, double avg_fps, double video_fps,
                             int merge, double *ts) {
  if (merge < 1) merge = 1;
  for (int64_t g = 0; g * merge < n; g++) {
    int64_t a = g * merge, b = a + merge - 1 < n ? a + merge - 1 : n - 1; /* padded: the last */
    double ta = (double)idx[a] / avg_fps * video_fps / video_fps;
    double tb = (double)idx[b] / avg_fps * video_fps / video_fps;
    ts[g] = (ta + tb) / 2;
  }
}
