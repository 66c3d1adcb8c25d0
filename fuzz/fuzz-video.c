/* fuzz-video.c — mml_video_open / probe / decode over bytes in memory: libavformat's
 * probing and demuxers, our frame table (mp4 index or packet pass), the keyframe seeks
 * and step-backs, and the RGB conversion.  Frames are bounded to 1 MP; the first, middle
 * and last frames are decoded (the frame callback reads each whole row). */
#include "fuzz.h"
#include "mml/video.h"

static mml_status on_frame(void *ctx, const mml_video_frame *f, mml_err *err) {
  if ((int64_t)f->width * f->height > (1 << 20)) abort(); /* the pixel bound held */
  volatile uint8_t x = 0;
  for (int y = 0; y < f->height; y++) x ^= f->rgb[(size_t)y * f->stride + (size_t)f->width * 3 - 1];
  (void)x;
  (*(int *)ctx)++;
  return MML_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > (1 << 20)) return 0;
  mml_video_src src = {.name = "fuzz.video", .data = data, .len = size, .max_pixels = 1 << 20};
  mml_video *v = NULL;
  mml_err e = {0};
  if (mml_video_open(&src, &v, &e)) {
    if (!e.msg[0]) abort(); /* every failure says why */
    return 0;
  }
  mml_video_info info;
  if (mml_video_probe(v, &info, &e)) abort();
  if (info.nframes > 0) {
    int64_t idx[3] = {0, info.nframes / 2, info.nframes - 1};
    int got = 0;
    mml_status st = mml_video_decode(v, idx, 3, on_frame, &got, &e);
    if (st == MML_OK && got != 3) abort(); /* success delivers every frame asked for */
    if (st && !e.msg[0]) abort();
  }
  mml_video_close(v);
  return 0;
}
