/*
 * video_resize_kernel.h — private to video_resize.c: the kernel body, included once per
 * compiled copy (K(name) gives each copy its own names, KFN its target attributes).
 */
/* ((a + 2) * x - (a + 3)) * x * x + 1 and ((a * x - 5a) * x + 8a) * x - 4a, with the
 * multiply-adds a contracting compiler fuses (KFMA) spelled out, so every optimisation
 * level (the sanitizer builds' -O1 fuses nothing by itself) gives torch's weights. */
KFN static float K(cubic_aa)(float x) {
  const float a = -0.5f;
  x = fabsf(x);
  if (x < 1.0f) return KFMA(KFMA(a + 2, x, -(a + 3)) * x, x, 1.0f);
  if (x < 2.0f) return KFMA(KFMA(KFMA(a, x, -5 * a), x, 8 * a), x, -4 * a);
  return 0.0f;
}

KFN static mml_status K(axis_make)(axis *ax, int in, int out, mml_err *err) {
  const float scale = (float)in / (float)out;
  const float support = scale >= 1.0f ? (float)(2.0 * (double)scale) : 2.0f;
  const float invscale = scale >= 1.0f ? (float)(1.0 / (double)scale) : 1.0f;
  ax->taps = (int)ceil(support) * 2 + 1;
  ax->xmin = malloc((size_t)out * sizeof(int));
  ax->xsize = malloc((size_t)out * sizeof(int));
  ax->w = malloc((size_t)out * (size_t)ax->taps * sizeof(float));
  if (!ax->xmin || !ax->xsize || !ax->w)
    return mml_err_set(err, MML_ENOMEM, "resize: out of memory for %d -> %d weights", in, out);
  for (int i = 0; i < out; i++) {
    float center = (float)((double)scale * (i + 0.5));
    int64_t lo = (int64_t)((double)(center - support) + 0.5);
    int64_t hi = (int64_t)((double)(center + support) + 0.5);
    if (lo < 0) lo = 0;
    if (hi > in) hi = in;
    int64_t n = hi - lo;
    if (n < 0) n = 0;
    if (n > ax->taps) n = ax->taps;
    float *w = ax->w + (size_t)i * ax->taps, total = 0.0f;
    for (int64_t j = 0; j < n; j++) {
      float d = (float)(j + lo) - center;
      w[j] = K(cubic_aa)((float)(((double)d + 0.5) * (double)invscale));
      total += w[j];
    }
    if (total != 0.0f)
      for (int64_t j = 0; j < n; j++) w[j] /= total;
    ax->xmin[i] = (int)lo;
    ax->xsize[i] = (int)n;
  }
  return MML_OK;
}

KFN static inline float K(dot)(const float *src, size_t stride, const float *w, int n) {
  float out = src[0] * w[0];
  for (int j = 1; j < n; j++) out += src[(size_t)j * stride] * w[j];
  return out;
}

/* Width: rows of sw -> rows of dw. */
KFN __attribute__((unused)) static void K(hpass)(const float *src, size_t nrows, int sw,
                                                 const axis *ax, float *dst, int dw) {
  for (size_t r = 0; r < nrows; r++) {
    const float *row = src + r * sw;
    float *orow = dst + r * dw;
    for (int x = 0; x < dw; x++)
      orow[x] = K(dot)(row + ax->xmin[x], 1, ax->w + (size_t)x * ax->taps, ax->xsize[x]);
  }
}

/* Height of one plane: sh rows of w -> dh rows of w. */
KFN __attribute__((unused)) static void K(vpass)(const float *plane, int w, const axis *ay, int dh,
                                                 float *op) {
  for (int y = 0; y < dh; y++) {
    const float *wt = ay->w + (size_t)y * ay->taps;
    const float *col0 = plane + (size_t)ay->xmin[y] * w;
    for (int x = 0; x < w; x++)
      op[(size_t)y * w + x] = K(dot)(col0 + x, (size_t)w, wt, ay->xsize[y]);
  }
}
