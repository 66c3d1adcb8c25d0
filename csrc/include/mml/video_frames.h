/*
 * mml/video_frames.h — a video's frames as model input: the plan (sizes, grid, token
 * counts, second_per_grid_ts, Qwen3-VL timestamps) from headers alone, then the frames
 * resized, normalised and patchified into pixel_values_videos rows, matching
 *   qwen-vl-utils 0.0.14 fetch_video (frame lists: each frame through fetch_image with
 *   the element's keys, Pillow bicubic; then the per-frame budget and torchvision's
 *   antialiased bicubic on the float video, rounded back to integers)
 * followed by transformers 5.24's Qwen2.5-VL / Qwen3-VL processors given qwen-vl-utils'
 * video metadata (process_vision_info(..., return_video_metadata=True); 5.24's Qwen2.5-VL
 * processor takes second_per_grid_ts from that metadata's sampled_fps and ignores an fps
 * argument, so without metadata it assumes 24 fps) and do_sample_frames=False (its own smart_resize under the video limits of the vision cfg —
 * torchvision's resize of the float video when that changes the size — then
 * (x - 255 mean) / (255 std) in float32 and the temporal patchify: T consecutive frames per
 * row, the last frame repeated to a multiple of T).
 *
 * Rows: row = ((g*(gh/M) + bh)*(gw/M) + bw)*M*M + mh*M + mw, column
 * ((c*T + t)*P + py)*P + px holds frame g*T + t, channel c, pixel ((bh*M+mh)*P+py,
 * (bw*M+mw)*P+px) — the HF layout of pixel_values_videos.
 *
 * Threads: a plan is per sample; mml_video_scratch is per worker thread.
 */
#ifndef MML_VIDEO_FRAMES_H
#define MML_VIDEO_FRAMES_H

#include "mml/common.h"
#include "mml/record.h"
#include "mml/video.h"
#include "mml/video_sample.h"
#include "mml/vision.h"

typedef struct mml_video_plan {
  int src_w, src_h;   /* the frames' decoded size (every listed frame, from its header) */
  int list_w, list_h; /* frame lists: after fetch_image's resize */
  int qvu_w, qvu_h;   /* after fetch_video's budget resize */
  int dst_w, dst_h;   /* after the processor's resize */
  int64_t nframes;    /* frames fed to the processor (even: the last one repeated) */
  int64_t listed;     /* frames the record lists */
  int grid_t, grid_h, grid_w;
  int64_t rows;          /* grid_t * grid_h * grid_w */
  int64_t group_tokens;  /* <|video_pad|> per temporal patch: grid_h * grid_w / M^2 */
  int64_t tokens;        /* grid_t * group_tokens */
  double fps;            /* the source rate the timestamps use (raw_fps for frame lists) */
  double sample_fps;     /* the processor's VideoMetadata.sampled_fps for qwen-vl-utils'
                            metadata: len(frames_indices) / total_num_frames * fps */
  float second_per_grid; /* temporal_patch_size / sample_fps (Qwen2.5-VL's processor) */
  int64_t src_pixels;    /* listed (files: kept) frames * src_w * src_h (max_sample_pixels) */
  /* video files: the kept frames (indices: mml_video_indices(&smp)) and what the probe
   * said, checked again when the file is opened for decoding */
  int file;
  mml_video_sampling smp;
  /* recipe="llama-factory" (cfg->lf): smp.n frames kept by its rule (mml_lf_video_indices),
   * the last one repeated when odd (nframes = smp.n rounded up to even), and each frame's
   * Pillow pre-resizes (mml_lf_pre_sizes with video_max/min_pixels) to qvu_w x qvu_h;
   * for a frame list every listed frame (smp.n = listed) */
  int lf;
  /* recipe="qwen-vl-finetune" (cfg->qft): smp.n frames kept by mml_qft_video_indices, the
   * last one repeated when odd, no pre-resize (lf_pre_n 0, qvu = src): then as lf */
  int qft;
  int lf_pre_n, lf_pre_cap; /* its resizes; how many are the video_max/min_pixels ones */
  int lf_pre_w[MML_LF_PRE_MAX], lf_pre_h[MML_LF_PRE_MAX];
  int64_t probe_nframes;
  double probe_fps;
} mml_video_plan;

/* What a video counts against max_sample_pixels: the most pixels its frames hold at any
 * stage — decoded, after fetch_image's or fetch_video's resize, after the processor's —
 * as a record's size keys can make the later stages far larger than the file. */
static inline int64_t mml_video_plan_pixels(const mml_video_plan *p) {
  double px[4] = {(double)p->src_pixels, (double)p->listed * p->list_w * p->list_h,
                  (double)p->nframes * p->qvu_w * p->qvu_h,
                  (double)p->nframes * p->dst_w * p->dst_h};
  double m = 0;
  for (int i = 0; i < 4; i++) m = px[i] > m ? px[i] : m;
  return m < 4e18 ? (int64_t)m : (int64_t)4e18; /* sums of a few stay in range */
}

typedef struct mml_video_scratch mml_video_scratch;
mml_status mml_video_scratch_new(mml_video_scratch **out);
void mml_video_scratch_free(mml_video_scratch *s);

/* Plans a frame list (v->frames; frames[j] the encoded bytes of frame j).  ts receives
 * grid_t Qwen3-VL timestamps (frame indices 0..nframes-1 at fps, as qwen-vl-utils' fake
 * metadata says) when not NULL.  Failures: the image header's (MML_EDECODE,
 * MML_EUNSUPPORTED, MML_ETOOBIG), MML_ERECORD (frames of different sizes after
 * fetch_image — torch.stack refuses them — or a budget qwen-vl-utils rejects),
 * MML_EASPECT, MML_EVIDEO (pixel_format uint8 and a processor resize, see
 * mml_video_frame_write).  recipe="llama-factory" (cfg->lf): its own frame-list path
 * instead (every frame, the last repeated when odd, its Pillow pre-resizes: lf below;
 * timestamps at frame k / its video_fps; frames of different sizes are MML_ERECORD). */
mml_status mml_video_plan_list(const mml_vision_cfg *cfg, const mml_video_ref *v,
                               const mml_bytes *frames, mml_video_plan *p, double *ts,
                               mml_err *err);
/* Plans a video file from its probe (mml_video_open + mml_video_probe): qwen-vl-utils'
 * frame range and count for info->nframes frames at info->fps (its torchcodec / decord
 * readers' metadata), the kept indices, fetch_video's per-frame budget on the decoded
 * frame size, then the processor's size and grid; ts (when not NULL) receives grid_t
 * Qwen3-VL timestamps from the real indices at info->fps.  A video too short for what the
 * element asks (nframes above the frames in range, a start at or past the end) is
 * MML_EVIDEOSHORT; otherwise the failures of mml_video_sample / mml_video_frame_size. */
mml_status mml_video_plan_file(const mml_vision_cfg *cfg, const mml_video_keys *keys,
                               const mml_video_info *info, mml_video_plan *p, double *ts,
                               mml_err *err);
/* Decodes exactly the planned frames of an opened video file (the same file the plan
 * probed: frame count, rate and size are checked, MML_EVIDEOCORRUPT when they changed),
 * each straight through fetch_video's resize, the processor's resize, normalise and
 * patchify into `out` (p->rows rows of mml_vision_video_row_bytes(cfg) bytes, in
 * cfg->pixel_format); one RGB frame alive
 * at a time. */
mml_status mml_video_process_file(const mml_vision_cfg *cfg, mml_video_scratch *s, mml_video *v,
                                  const mml_video_plan *p, void *out, mml_err *err);
/* Decodes, resizes, normalises and patchifies a planned frame list into `out`
 * (p->rows rows of mml_vision_video_row_bytes(cfg) bytes, in cfg->pixel_format). */
mml_status mml_video_process_list(const mml_vision_cfg *cfg, mml_video_scratch *s,
                                  mml_vision_scratch *vs, const mml_video_ref *v,
                                  const mml_bytes *frames, const mml_video_plan *p, void *out,
                                  mml_err *err);
/* The tail every planned video's frame k (0 <= k < p->nframes) goes through, whatever its
 * source: `planes` holds its 3 float planes (R, G, B) at the qwen-vl-utils size (qvu_w x
 * qvu_h, integral values as fetch_video leaves them); the processor's resize when the plan
 * changes the size, then normalise in cfg->pixel_format and write the frame into its
 * temporal slot of `out` (the video's rows, as mml_video_process_list).  Formats:
 *   float32   (x - 255 mean) / (255 std) in float32 (the torchvision backend's fused form)
 *   bfloat16  that value rounded to nearest even
 *   uint8     x itself; mml_video_plan_* refuse (MML_EVIDEO) a uint8 video whose size the
 *             processor changes, as its values are then not bytes.
 * mmloader.torch.expand_pixels(..., videos=True) turns uint8 rows into the float values. */
mml_status mml_video_frame_write(const mml_vision_cfg *cfg, mml_video_scratch *s,
                                 const mml_video_plan *p, const float *planes, int64_t k, void *out,
                                 mml_err *err);

#endif
