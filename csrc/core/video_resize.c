/*
 * video_resize.c — torch's antialiased bicubic interpolation of float32 planes
 * (torch.nn.functional.interpolate(x, size, mode="bicubic", antialias=True,
 * align_corners=False) on a float32 CPU tensor), which the video paths of qwen-vl-utils
 * (torchvision.transforms.functional.resize) and of transformers' video processors
 * (torchvision v2 resize of float videos) run.  torchvision cannot be installed beside
 * the CPU torch of the test environment; this reproduces the torch kernel it calls
 * (aten/src/ATen/native/cpu/UpSampleKernel.cpp, the separable AA path), and the tests
 * compare against F.interpolate directly.
 *
 * The kernel, as torch computes it in float32 (scalar_t = float):
 *   scale = in / out;  support = 2 * scale (scale >= 1) else 2;  invscale = 1 / scale or 1
 *   for output i: center = scale * (i + 0.5); xmin = max(0, (int)(center - support + 0.5));
 *   xsize = min(in, (int)(center + support + 0.5)) - xmin (clamped to ceil(support)*2+1);
 *   w_j = K((j + xmin - center + 0.5) * invscale), Keys cubic with a = -0.5, normalised
 *   by their float sum; out = sum_j src[xmin + j] * w_j accumulated left to right with
 *   fused multiply-adds (torch's CPU kernels are built with FMA contraction).
 * Width is resampled first, then height; an unchanged axis is skipped.
 * The arithmetic is written as torch's C++ writes it and compiled the way torch compiles
 * its CPU kernels: floating-point contraction on, with FMA in the copy used on CPUs that
 * have it (torch's AVX2 kernels are built with -mfma) and without in the other copy
 * (torch's default kernels).  That is what makes the results bitwise equal; the kernel
 * body lives in video_resize_kernel.h, included once per copy.
 *
 * Threads: pure; the caller owns every buffer.
 */
#include "mml/video_resize.h"

#include <math.h>
#include <stdlib.h>

#include "resize.h" /* mml_cpu_fma */

#pragma GCC optimize("fp-contract=fast")

typedef struct axis {
  int *xmin, *xsize;
  float *w; /* out * taps */
  int taps;
} axis;

static void axis_free(axis *ax) {
  free(ax->xmin);
  free(ax->xsize);
  free(ax->w);
}

#define K(name) name##_fma
#define KFN __attribute__((target("fma")))
#include "video_resize_kernel.h"
#undef K
#undef KFN
#define K(name) name##_plain
#define KFN
#include "video_resize_kernel.h"
#undef K
#undef KFN

mml_status mml_resize_aa_bicubic_f32(const float *src, int planes, int sw, int sh, float *dst,
                                     int dw, int dh, mml_err *err) {
  return mml_cpu_fma() ? resize_fma(src, planes, sw, sh, dst, dw, dh, err)
                       : resize_plain(src, planes, sw, sh, dst, dw, dh, err);
}
