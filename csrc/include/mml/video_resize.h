/*
 * mml/video_resize.h — torch's antialiased bicubic resize of float32 planes (what
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

#endif
