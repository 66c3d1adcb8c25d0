/*
 * mml/vision.h — Qwen-VL image preprocessing: smart_resize, Pillow-exact bicubic resize,
 * rescale + normalise, and patchify into the row layout of `pixel_values`
 * (see ../shared/SPEC-QWEN.md).  Planning (sizes, grid, token count) needs only the
 * image header, so the engine can plan batches before any pixel work.
 *
 * Threads: mml_vision_cfg is immutable and shared; mml_vision_scratch is per-thread.
 */
#ifndef MML_VISION_H
#define MML_VISION_H

#include "mml/batch.h"
#include "mml/common.h"
#include "mml/image.h"
#include "mml/record.h"

typedef struct mml_vision_cfg {
  int patch_size;          /* P: 14 (qwen2/2.5-vl) or 16 (qwen3-vl) */
  int merge_size;          /* M: 2 */
  int temporal_patch_size; /* T: 2 */
  int64_t min_pixels, max_pixels;
  float mean[3], std[3];
  int legacy_resize;        /* 1: older transformers smart_resize (no max(f,..) clamp) */
  int fast;                 /* 1: allow reduced-DCT JPEG decode when target <= source/2 */
  int64_t max_image_pixels; /* decompression-bomb guard on W*H before decode; 0 = none */
  int pillow_h_first;       /* 1: always resize horizontally first (Pillow <= 12); 0: Pillow
                              * 13's order (vertical first when the height shrinks by more than
                              * twice as many pixels as the width) */
  int strict_jpeg;          /* 1: "Corrupt JPEG data" warnings refuse the image (mml/image.h) */
  int route;                /* MML_ROUTE_*: which reference pipeline the pixels follow */
  /* Videos (mml/video_sample.h, sample_video.c): the video processor's own size limits
   * (size.shortest_edge / longest_edge of the checkpoint's video processor) and which
   * family's processor and position rules apply (MML_VIDEO_*). */
  int64_t video_min_pixels, video_max_pixels;
  int video_family;
  int pixel_format;         /* MML_PIXEL_*: what a pixel_values row holds (0: float32) */
  int max_jpeg_scans;       /* JPEGs of more scans are refused (MML_ESCANS; 0: no limit): from the
                       * header when planning, and by the decoder (mml_decoder_set_max_scans) */
  const mml_cancel *cancel; /* decodes stop with MML_ECANCELLED once set (NULL: never) */
  /* recipe="llama-factory" (prescale.c): images read as its mm_plugin reads them (alpha
   * dropped, no EXIF turn) and pre-resized with Pillow to within [lf_min_pixels,
   * lf_max_pixels] (its image_min_pixels / image_max_pixels) before the processor */
  int lf;
  int64_t lf_max_pixels, lf_min_pixels;
  /* and its video path (video_frames.c): video_fps, video_maxlen, and the pre-resize of
   * every frame to within [lf_video_min_pixels, lf_video_max_pixels] */
  double lf_video_fps;
  int64_t lf_video_maxlen, lf_video_max_pixels, lf_video_min_pixels;
  /* recipe="qwen-vl-finetune" (video_frames.c): video files as its processor's
   * apply_chat_template reads them: every decoded frame, or (Qwen3-VL) the video
   * processor's fps sampling within [qft_video_min_frames, qft_video_max_frames]; its
   * video_min_pixels / video_max_pixels are video_min_pixels / video_max_pixels above */
  int qft;
  double qft_video_fps;
  int64_t qft_video_min_frames, qft_video_max_frames;
} mml_vision_cfg;

/* Video families: Qwen2-VL (Qwen2VLVideoProcessor, plain M-RoPE), Qwen2.5-VL (the same
 * processor; second_per_grid_ts = temporal_patch_size / fps and temporal positions scaled
 * by tokens_per_second = 2), Qwen3-VL (Qwen3VLVideoProcessor's temporal smart_resize,
 * per-temporal-patch timestamps in the text, one position block per temporal patch). */
enum { MML_VIDEO_QWEN2 = 0, MML_VIDEO_QWEN25 = 1, MML_VIDEO_QWEN3 = 2 };

/* The formats of pixel_values (Loader pixel_format=).  The row order is the same in all.
 *   MML_PIXEL_FLOAT32   the reference's float32 values, 3*T*P*P per row (col =
 *                       ((c*T + t)*P + py)*P + px; a still image's T frames are equal)
 *   MML_PIXEL_BFLOAT16  the same layout, each float32 value rounded to nearest even
 *   MML_PIXEL_UINT8     the resized RGB bytes before rescale/normalise, ONE frame per
 *                       row for images: 3*P*P bytes, col = (c*P + py)*P + px (a video's
 *                       rows keep its T distinct frames: 3*T*P*P) — expanded to the
 *                       float values by mmloader.torch.expand_pixels */
enum { MML_PIXEL_FLOAT32 = 0, MML_PIXEL_BFLOAT16 = 1, MML_PIXEL_UINT8 = 2 };

/* The image reference route: what a user's pipeline does before the processor.
 *   MML_ROUTE_PROCESSOR      the processor given Image.open (transformers' convert_to_rgb:
 *                            transparency composited onto white; EXIF ignored)
 *   MML_ROUTE_LOAD_IMAGE     transformers.image_utils.load_image: ImageOps.exif_transpose,
 *                            then convert("RGB") (alpha dropped), then the processor
 *   MML_ROUTE_QWEN_VL_UTILS  qwen-vl-utils' fetch_image: to_rgb (RGBA pasted onto white,
 *                            other modes convert("RGB")), its smart_resize
 *                            (MML_RESIZE_QWEN_VL_UTILS) and a bicubic resize, then the
 *                            processor, whose own resize is then the identity (same
 *                            limits) but whose convert_to_rgb whitens a transparency
 *                            colour Pillow kept (mml_decoder_color_key) */
enum { MML_ROUTE_PROCESSOR = 0, MML_ROUTE_LOAD_IMAGE = 1, MML_ROUTE_QWEN_VL_UTILS = 2 };

/* Values per patch row of an image's pixel_values in cfg->pixel_format: 3*T*P*P (float
 * formats), 3*P*P (uint8). */
int mml_vision_pixel_cols(const mml_vision_cfg *cfg);
/* Bytes of one such row, and the element type of cfg->pixel_format. */
size_t mml_vision_row_bytes(const mml_vision_cfg *cfg);
/* Values and bytes per pixel_values_videos row: 3*T*P*P in every format (a video's T
 * frames are distinct, uint8 keeps them all), times the format's element size. */
int mml_vision_video_cols(const mml_vision_cfg *cfg);
size_t mml_vision_video_row_bytes(const mml_vision_cfg *cfg);
mml_dtype mml_vision_pixel_dtype(const mml_vision_cfg *cfg);
/* The element type of an MML_PIXEL_* format (MML_DT_FLOAT32 for an unknown one). */
mml_dtype mml_pixel_format_dtype(int format);

/* Checks a configuration (sizes >= 1, 0 < min_pixels <= max_pixels, std != 0):
 * MML_ECONFIG naming the bad field. */
mml_status mml_vision_cfg_check(const mml_vision_cfg *cfg, mml_err *err);

/* Fills cfg for "qwen2-vl", "qwen2.5-vl" or "qwen3-vl" (checkpoint limits);
 * MML_ECONFIG for an unknown name. */
mml_status mml_vision_preset(const char *name, mml_vision_cfg *cfg, mml_err *err);

/* smart_resize variants (the `legacy` argument of mml_smart_resize). */
enum {
  MML_RESIZE_TRANSFORMERS = 0,  /* the current transformers release */
  MML_RESIZE_LEGACY = 1,        /* older transformers: no max(factor, ...) clamp */
  MML_RESIZE_QWEN_VL_UTILS = 2, /* qwen-vl-utils: max(factor, round) first, floors unclamped */
};
/* smart_resize (legacy: one of the variants above).
 * MML_EASPECT above 200:1, MML_EINVAL for sizes it rejects. */
mml_status mml_smart_resize(int height, int width, int factor, int64_t min_pixels,
                            int64_t max_pixels, int legacy, int *out_h, int *out_w, mml_err *err);

/* LLaMA-Factory's _preprocess_image (recipe="llama-factory", prescale.c) resizes an image
 * at most this many times before the processor does. */
#define MML_LF_PRE_MAX 4

/* What an image becomes, known from its header alone. */
typedef struct mml_vision_plan {
  int src_w, src_h; /* decoded size */
  int dst_w, dst_h; /* after smart_resize */
  int grid_t, grid_h, grid_w;
  int64_t rows;            /* grid_t*grid_h*grid_w rows of pixel_values */
  int cols;                /* mml_vision_pixel_cols: 3*T*P*P, or 3*P*P for uint8 */
  int64_t tokens;          /* rows / merge^2 <|image_pad|> tokens */
  mml_image_format format; /* from the header (MML_FMT_UNKNOWN for mml_vision_plan_size) */
  int decode_scale;        /* JPEG IDCT scale denominator the decode will use: 1, or 2/4/8
                              * in `fast` mode when the target is at most src/scale */
  int orientation;         /* EXIF orientation the route applies (1: none); src_w/src_h are
                              * the size after it */
  int pre_n, pre_cap;      /* recipe llama-factory: Pillow resizes before the processor's, and
                              how many of them are its image_max/min_pixels ones */
  int pre_w[MML_LF_PRE_MAX], pre_h[MML_LF_PRE_MAX]; /* their sizes, in order (prescale.c) */
  int64_t scratch; /* decoder scratch its decode maps beyond a few rows, at most
                              (mml_image_info.scratch, and the whole image twice when
                              turned): what max_memory charges the decode */
} mml_vision_plan;

/* What an image counts against max_sample_pixels: the larger of its size in the file
 * (the decode) and after smart_resize (its pixel_values rows) — a record's min_pixels or
 * resized_height/width keys can make the second far larger than the first (issue 29). */
static inline int64_t mml_vision_plan_pixels(const mml_vision_plan *p) {
  int64_t in = (int64_t)p->src_w * p->src_h, out = (int64_t)p->dst_w * p->dst_h;
  return in > out ? in : out;
}

mml_status mml_vision_plan_size(const mml_vision_cfg *cfg, int width, int height,
                                mml_vision_plan *plan, mml_err *err);
/* Probe + plan from encoded bytes (also enforces max_image_pixels). */
mml_status mml_vision_plan_bytes(const mml_vision_cfg *cfg, const uint8_t *data, size_t len,
                                 mml_vision_plan *plan, mml_err *err);
/* The same for an image whose record entry carries its own budget (NULL or all zero: as
 * above), sized as qwen-vl-utils' fetch_image sizes it (factor f = patch * merge):
 *   resized_height and resized_width both given: qwen-vl-utils' smart_resize of that size
 *     with its defaults min 4*f*f, max 16384*f*f (the image's own size is ignored);
 *   else: qwen-vl-utils' smart_resize of the image's size, with min_pixels / max_pixels
 *     from the entry, each absent one from cfg (the source's or loader's value).
 * The image is then resized once, to that size.  min > max is MML_ERECORD. */
mml_status mml_vision_plan_bytes_budget(const mml_vision_cfg *cfg, const uint8_t *data, size_t len,
                                        const mml_image_budget *budget, mml_vision_plan *plan,
                                        mml_err *err);
/* The failures a plan can report: MML_EUNSUPPORTED / MML_EDECODE (header), MML_ETOOBIG
 * (width*height > max_image_pixels, checked before any decode), MML_EASPECT,
 * MML_EINVAL (size smart_resize rejects), MML_ECONFIG (bad cfg). */

typedef struct mml_vision_scratch mml_vision_scratch;
mml_status mml_vision_scratch_new(mml_vision_scratch **out);
void mml_vision_scratch_free(mml_vision_scratch *s);
/* Seconds mml_vision_process_bytes has spent inside the image decoder on this scratch,
 * excluding the resize/normalise/patchify work the decoded rows feed (for stats). */
double mml_vision_scratch_decode_s(const mml_vision_scratch *s);
/* Frees the whole-image buffers (the decoder's and a turned image's) that hold more than
 * `keep` bytes, so what stays between images is a few rows, the kept multi-scan JPEG
 * region (MML_JPEG_KEEP) and at most `keep` per buffer (max_memory's per-worker reserve). */
void mml_vision_scratch_trim(mml_vision_scratch *s, size_t keep);
/* How large a multi-scan JPEG region the decoder keeps between images
 * (mml_decoder_set_jpeg_keep; MML_JPEG_KEEP, 8 MiB, unless set). */
void mml_vision_scratch_set_jpeg_keep(mml_vision_scratch *s, size_t bytes);

/* Decode + resize + normalise + patchify `data` into `out`, which holds plan->rows rows of
 * mml_vision_row_bytes(cfg) bytes in cfg->pixel_format (plan from mml_vision_plan_bytes on
 * the same bytes).  Every byte of those rows is written; nothing else is. */
mml_status mml_vision_process_bytes(const mml_vision_cfg *cfg, mml_vision_scratch *s,
                                    const uint8_t *data, size_t len, const mml_vision_plan *plan,
                                    void *out, mml_err *err);
/* The same from an already decoded RGB8 image (plan from mml_vision_plan_size). */
mml_status mml_vision_process_rgb(const mml_vision_cfg *cfg, mml_vision_scratch *s,
                                  const mml_rgb8 *img, const mml_vision_plan *plan, void *out,
                                  mml_err *err);

/* Where an image's patches go when rows hold several frames (a video's temporal patch):
 * rows of 3*slots*P*P values in cfg->pixel_format at `out` (plan->rows of them), of which
 * this image fills frame slots [slot0, slot0 + nslots) of every row and leaves the others
 * as they are.  A still image is {out, slots = T (1 for uint8), 0, slots}; frame k of a
 * video's temporal patch is {out, T, k, 1} in every format. */
typedef struct mml_pixel_dst {
  void *out;
  int slots, slot0, nslots;
} mml_pixel_dst;
mml_status mml_vision_process_rgb_dst(const mml_vision_cfg *cfg, mml_vision_scratch *s,
                                      const mml_rgb8 *img, const mml_vision_plan *plan,
                                      const mml_pixel_dst *dst, mml_err *err);

/* The float32 value the float formats write for each byte value of each channel of an
 * image (cfg's mean and std): table[c][v] = (float32(v * (1/255.0)) - mean[c]) / std[c]
 * in float32, the table mml_pixels_expand takes (vision_patch.c). */
void mml_vision_pixel_table(const mml_vision_cfg *cfg, float table[3][256]);

/* uint8 patch rows -> float32 / bfloat16 rows (pixels.c, the CPU side of
 * mmloader.torch.expand_pixels): `rows` rows of 3*frames*P*P bytes at src (frames 1: a
 * still image's one frame, repeated into the T slots; frames == T: rows that keep their
 * T frames) into rows of 3*T*P*P values at dst, value = table[c][byte] (as float32, or
 * rounded to nearest even for MML_PIXEL_BFLOAT16).  MML_EINVAL for bad arguments. */
mml_status mml_pixels_expand(const uint8_t *src, int64_t rows, int patch_size, int frames, int T,
                             const float table[3][256], int format, void *dst, mml_err *err);

/* The same for still images (frames 1) in place: buf holds `rows` uint8 rows at its
 * start and has room for their float rows, which replace them (the same values). */
mml_status mml_pixels_expand_inplace(void *buf, int64_t rows, int patch_size, int T,
                                     const float table[3][256], int format, mml_err *err);

/* Splitting that in-place expansion (loader_expand.c shares a batch's among workers): the
 * first row r0 of its first run.  Rows [r0, rows) may be expanded in any pieces, in any
 * order, on any threads at once, each piece [a, b) as mml_pixels_expand(buf + a*U, b - a,
 * patch_size, 1, T, table, format, buf + a*F) (U = 3*P*P bytes in, F = 3*T*P*P values
 * out): their outputs lie past every uint8 row still unread.  Once all of them are done,
 * mml_pixels_expand_inplace(buf, r0, ...) finishes the buffer; the result is the bytes
 * of mml_pixels_expand_inplace(buf, rows, ...).  rows itself (no free rows) for rows <= 1
 * or bad arguments. */
int64_t mml_pixels_inplace_free_from(int64_t rows, int patch_size, int T, int format);

/* recipe="llama-factory" (prescale.c): the sizes LLaMA-Factory 0.9.5's Qwen2VLPlugin.
 * _preprocess_image resizes a width x height image to, in order (at most MML_LF_PRE_MAX;
 * *n = 0: none), and the size the processor then gets (*out_w, *out_h):
 *   1. width*height > max_pixels: int(side * sqrt(max_pixels / (width*height))) each;
 *   2. then width*height < min_pixels: int(side * sqrt(min_pixels / (width*height)));
 *   3. then a side under 28: that side to 28;
 *   4. then width / height > 200: (height*180, height); 5. height / width > 200:
 *      (width, width*180).
 * *n_cap: how many of them are 1.'s (those run in the mode Pillow opened the image in).
 * A step to an empty side is MML_EINVAL (Pillow refuses it). */
mml_status mml_lf_pre_sizes(int width, int height, int64_t max_pixels, int64_t min_pixels, int *n,
                            int *n_cap, int *ws, int *hs, int *out_w, int *out_h, mml_err *err);

/* MML_OK when the encoded image is one Pillow opens as RGB or L, or when `resized` is 0
 * (no image_max_pixels / image_min_pixels step runs on it); else MML_EUNSUPPORTED naming
 * Pillow's mode (4. of prescale.c).  what: "image" or "video frame" in the message. */
mml_status mml_lf_check_mode(const uint8_t *data, size_t len, int resized, const char *what,
                             mml_err *err);

/* Decodes an image whose plan has pre_n > 0, runs its Pillow resizes (bicubic, each pass
 * rounded to uint8, horizontal pass first as Pillow 11 does) and the processor's path on
 * the result.  The image must be one Pillow opens as RGB or L (its resize is then the
 * same on the RGB decode): other modes (RGBA, LA, P, 1, I;16, CMYK, and GIF, BMP, TIFF
 * files) are MML_EUNSUPPORTED, naming the mode. */
mml_status mml_lf_process(const mml_vision_cfg *cfg, mml_vision_scratch *s, const uint8_t *data,
                          size_t len, const mml_vision_plan *plan, const mml_pixel_dst *dst,
                          mml_err *err);

/* Pillow-exact bicubic resize of RGB8 (exposed for tests).  dst has dst_w*3 byte rows. */
mml_status mml_resize_bicubic_rgb8(mml_vision_scratch *s, const mml_rgb8 *src, int dst_w, int dst_h,
                                   uint8_t *dst, mml_err *err);
/* The same with the pass order chosen: h_first_always=1 is Pillow <= 12. */
mml_status mml_resize_bicubic_rgb8_order(mml_vision_scratch *s, const mml_rgb8 *src, int dst_w,
                                         int dst_h, int h_first_always, uint8_t *dst, mml_err *err);
/* The same resize written as three byte planes (channel c of pixel (x, y) at
 * planes[c*dst_w*dst_h + y*dst_w + x]), the way the video path takes a frame list's
 * frames: no interleaved copy in between. */
mml_status mml_resize_bicubic_rgb8_planes(mml_vision_scratch *s, const mml_rgb8 *src, int dst_w,
                                          int dst_h, int h_first_always, uint8_t *planes,
                                          mml_err *err);

#endif
