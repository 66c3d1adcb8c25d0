/*
 * mml/video_sample.h — which frames of a video are kept and how large each becomes, exactly
 * as qwen-vl-utils 0.0.14 decides (vision_process.py: calculate_video_frame_range,
 * smart_nframes, the torch.linspace index rule, fetch_video's per-frame budget), and the
 * per-video numbers the processors derive from them (sample fps, second_per_grid_ts,
 * Qwen3-VL timestamps).  Pure functions of the record's keys (mml_video_keys) and the
 * video's metadata: the plan knows every index and size before anything is decoded.
 *
 * Which metadata: total_frames and fps are the container's frame count and average rate
 * (what qwen-vl-utils' torchcodec / decord readers use: metadata.num_frames /
 * average_fps, len(vr) / get_avg_fps()); video_start / video_end then select a frame range
 * (calculate_video_frame_range) and smart_nframes counts within it.  (Its torchvision
 * reader instead decodes the time range and counts what it got.)
 *
 * Threads: pure, reentrant.
 */
#ifndef MML_VIDEO_SAMPLE_H
#define MML_VIDEO_SAMPLE_H

#include "mml/common.h"
#include "mml/record.h"

/* qwen-vl-utils 0.0.14's constants. */
#define MML_VIDEO_FPS 2.0
#define MML_VIDEO_FRAME_FACTOR 2
#define MML_VIDEO_FPS_MIN_FRAMES 4
#define MML_VIDEO_FPS_MAX_FRAMES 768
#define MML_VIDEO_MIN_TOKENS 128 /* VIDEO_MIN_TOKEN_NUM: per-frame min_pixels = 128 * f^2 */
#define MML_VIDEO_MAX_TOKENS 768 /* VIDEO_MAX_TOKEN_NUM: per-frame cap = 768 * f^2 */
#define MML_VIDEO_MODEL_SEQ_LEN \
  128000 /* MODEL_SEQ_LEN (its environment default):
total_pixels = 128000 * f^2 * 0.9 */

/* The frames of a video file one sample keeps. */
typedef struct mml_video_sampling {
  int64_t first, last; /* frame range (calculate_video_frame_range) */
  int64_t count;       /* last - first + 1: the total_frames smart_nframes sees */
  int64_t n;           /* frames kept (smart_nframes), even, 2 <= n <= count */
  double sample_fps;   /* n / count * fps: what qwen-vl-utils hands the processor */
} mml_video_sampling;

/* Range + count for a video of total_frames frames at fps.  Failures are MML_ERECORD with
 * qwen-vl-utils' reason (fps or frame count not positive, start frame >= end frame,
 * nframes outside [2, count]). */
mml_status mml_video_sample(const mml_video_keys *k, int64_t total_frames, double fps,
                            mml_video_sampling *out, mml_err *err);
/* The kept frame indices: torch.linspace(first, last, n) (float32, as torch's CPU kernel
 * computes it from both ends) rounded half to even.  idx holds n entries; ascending,
 * repeats possible when n > last - first + 1 would be (never with mml_video_sample). */
void mml_video_indices(const mml_video_sampling *s, int64_t *idx);

/* The size every frame of a video becomes in qwen-vl-utils' fetch_video, for nframes frames
 * (after padding to an even count) of height x width, with factor f = patch * merge:
 *   min_pixels   = keys.min_pixels or 128 f^2
 *   total_pixels = keys.total_pixels or 128000 f^2 * 0.9
 *   max_pixels   = max(min(768 f^2, total_pixels / nframes * 2), int(min_pixels * 1.05)),
 *                  then min(keys.max_pixels, that) when given
 *   resized_height and resized_width both given: smart_resize(those, f) with its image
 *   defaults; else smart_resize(height, width, f, min_pixels, max_pixels) — qwen-vl-utils'
 *   smart_resize (max(f, round) first, floors unclamped).  MML_EASPECT / MML_ERECORD. */
mml_status mml_video_frame_size(const mml_video_keys *k, int factor, int64_t nframes, int height,
                                int width, int *out_h, int *out_w, mml_err *err);
/* The size one frame of a frame list is first resized to: qwen-vl-utils hands each frame
 * to fetch_image with the video element's keys and image_patch_size = f (fetch_video passes
 * its image_factor there), so the frame factor is 2f: resized_height/width both given:
 * smart_resize(those, 2f) with defaults min 4 (2f)^2, max 16384 (2f)^2; else
 * smart_resize(height, width, 2f, keys.min_pixels or 4 (2f)^2, keys.max_pixels or
 * 16384 (2f)^2).  (Pillow bicubic then resizes the frame; mml_video_frame_size follows.) */
mml_status mml_video_list_frame_size(const mml_video_keys *k, int factor, int height, int width,
                                     int *out_h, int *out_w, mml_err *err);

/* Qwen3-VL's timestamp of each temporal patch (transformers' Qwen3VLProcessor
 * _calculate_timestamps): indices padded to a multiple of t by repeating the last, each
 * idx / fps, then the mean of the first and last of every group of t.  ts holds
 * ceil(n / t) values. */
void mml_video_timestamps(const int64_t *idx, int64_t n, double fps, int t, double *ts);

/* LLaMA-Factory 0.9.5's video sampling (mm_plugin.py _get_video_sample_indices, recipe=
 * "llama-factory"): n = min(total_frames, maxlen, max(1, floor(duration * fps))) frames
 * (duration: PyAV's stream duration in seconds), at np.linspace(0, total_frames - 1, n)
 * (float64: i * step, the last exactly total_frames - 1) truncated to integers.
 * MML_EVIDEO when total_frames or duration is not positive (its stream has no frame count
 * or duration: not reproduced). */
/* recipe="qwen-vl-finetune": the frames its processor's apply_chat_template keeps of a video
 * file that torchvision's read_video decodes to `total` frames at `src_fps` (its
 * average_rate).  Qwen2/2.5-VL (qwen3 = 0): the Qwen2-VL video processor samples nothing
 * (do_sample_frames False): every frame, n = total.  Qwen3-VL: Qwen3VLVideoProcessor's
 * sample_frames: n = min(max(int(total / src_fps * fps), min_frames), max_frames, total)
 * at np.linspace(0, total - 1, n).round() (half to even).  idx (n entries) may be NULL.
 * MML_EVIDEO when total < 1 or src_fps is not positive (Qwen3-VL). */
mml_status mml_qft_video_indices(int qwen3, int64_t total, double src_fps, double fps,
                                 int64_t min_frames, int64_t max_frames, int64_t *n, int64_t *idx,
                                 mml_err *err);

mml_status mml_lf_video_count(int64_t total_frames, double duration, double fps, int64_t maxlen,
                              int64_t *n, mml_err *err);
void mml_lf_video_indices(int64_t total_frames, int64_t n, int64_t *idx);

/* LLaMA-Factory 0.9.5's Qwen3-VL timestamps (Qwen3VLPlugin: frames_indices = idx /
 * average_fps * video_fps, then transformers' Qwen3VLProcessor._calculate_timestamps
 * divides by video_fps): the n kept indices padded with the last to a multiple of `merge`,
 * t_i = idx_i / avg_fps * video_fps / video_fps (float64, in that order), and per group of
 * `merge` the mean of its first and last; ceil(n / merge) values into ts. */
void mml_lf_video_timestamps(const int64_t *idx, int64_t n, double avg_fps, double video_fps,
                             int merge, double *ts);

#endif
