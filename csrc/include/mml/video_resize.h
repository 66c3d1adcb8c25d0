/*
 * mml/video_resize.h — torch's antialiased bicubic resize of float32 and uint8 planes (what
 * torchvision's resize of video tensors runs; see video_resize.c for the exact kernel).
 *
 * Threads: pure, reentrant.
 */
#ifndef MML_VIDEO_RESIZE_H
#define MML_VIDEO_RESIZE_H

#include "mml/common.h"

/* Resizes `planes` planes of sw x sh floats (plane after plane, rows of sw) to dw x dh
 * into dst (planes * dw * dh floats), as torch.nn.functional.interpolate(mode="bicubic",
 * antialias=True, align_corners=False) does on float32 CPU tensors. */
mml_status mml_resize_aa_bicubic_f32(const float *src, int planes, int sw, int sh, float *dst,
                                     int dw, int dh, mml_err *err);

/* The same, each output then clamped to [0, 255] and rounded half to even (still float):
 * torchvision's resize of a uint8 video (qwen-vl-utils' fetch_video budget step). */
mml_status mml_resize_aa_bicubic_f32_u8(const float *src, int planes, int sw, int sh, float *dst,
                                        int dw, int dh, mml_err *err);

/* uint8 planes resized as torch.nn.functional.interpolate(mode="bicubic", antialias=True,
 * align_corners=False) resizes uint8 CPU tensors natively (int16 fixed-point weights:
 * video_resize_u8.c): torchvision v2's resize of a uint8 video, which transformers' video
 * processors run on PIL frames (recipe="llama-factory"). */
mml_status mml_resize_aa_bicubic_u8(const uint8_t *src, int planes, int sw, int sh, uint8_t *dst,
                                    int dw, int dh, mml_err *err);

#endif
