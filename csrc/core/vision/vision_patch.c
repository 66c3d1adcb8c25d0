/*
 * vision_patch.c — normalise + patchify (design: vision.c).  Resized output rows arrive
 * planar in a block of P*M rows (mml_patch_out's row_out); a full block's patches are
 * written in pixel_values' memory order, a share per output row of the next block (two
 * blocks alternate), so the output stores overlap decoding.
 *
 * One writer per pixel format (mml/vision.h MML_PIXEL_*), each writing the patches to the
 * destination and frame slots the caller gives (mml_pixel_dst: a batch's slice, or one
 * frame of a video's temporal patch):
 *   float32   the reference's exact arithmetic: a 256-entry table per channel (portable),
 *             the same IEEE operations in AVX2, or a division-free AVX2+FMA form used
 *             only when it matched the table bit for bit; with AVX-512 (F/BW) and every
 *             frame slot of a row (a still image), the same operations 16 lanes at a
 *             time, each 64-byte output line written once from a register (float_lines),
 *             otherwise each patch row assembled in a scratch row and streamed out
 *             (float_rows: video frames, no AVX-512, MML_DISABLE_AVX512=1);
 *   bfloat16  that table rounded to nearest even (portable), or the AVX2 / AVX-512
 *             float32 values rounded the same way (so the same bits);
 *   uint8     the resized bytes themselves: with AVX-512 (F/BW) and one frame slot a row
 *             (a still image), written through the block a whole 64-byte output line at
 *             a time from registers (u8_lines); otherwise
 *             scattered row by row into the patch rows as the resize announces them
 *             (u8_scatter: no block; the block writer write_u8 remains for P*M < 4,
 *             where the row ring would not fit in it).
 *
 * Layout (SPEC-QWEN.md): row = ((bh*(gw/M) + bw)*M + mh)*M + mw,
 *                        col = ((c*S + s)*P + py)*P + px  (S frame slots per row: T for
 *                        the float formats, 1 for a uint8 still image).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vision_int.h"

/* float32 -> bfloat16, round to nearest even (the values are finite). */
static uint16_t bf16_rne(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static void build_lut(const float mean[3], const float std[3], float lut[3][256],
                      uint16_t lut16[3][256]) {
  for (int c = 0; c < 3; c++) {
    const float m = mean[c], sd = std[c];
    for (int v = 0; v < 256; v++) {
      float x = (float)((double)v * (1.0 / 255.0));
      lut[c][v] = (x - m) / sd;
      lut16[c][v] = bf16_rne(lut[c][v]);
    }
  }
}

void mml_vision_pixel_table(const mml_vision_cfg *cfg, float table[3][256]) {
  uint16_t t16[3][256];
  build_lut(cfg->mean, cfg->std, table, t16);
}

/* The source bytes of patch row (c, py) of the patch at block column x0 (planar block). */
static const uint8_t *patch_src(const patch_ctx *g, int bh, int c, int mh, int py, int x0) {
  const size_t W = (size_t)g->gw * g->P + 16;
  return g->block + (size_t)(bh & 1) * g->half + (size_t)c * g->P * g->M * W +
         (size_t)(mh * g->P + py) * W + x0;
}

/* Output row r of block row bh, patch column bw, merge position (mh, mw). */
static uint8_t *patch_row(const patch_ctx *g, int bh, int bw, int mh, int mw) {
  const int64_t r = ((int64_t)(bh * (g->gw / g->M) + bw) * g->M + mh) * g->M + mw;
  return g->out + r * (int64_t)g->row_bytes;
}

/* Runs BODY for every patch row (c, py) of every patch of block row bh in [bw0, bw1), in
 * output memory order, with `row` the output row, `s` the P source bytes and `k` the
 * value index of (c, slot0, py, 0) in the row. */
#define FOR_PATCH_ROWS(g, bh, bw0, bw1, BODY)                                            \
  for (int bw = (bw0); bw < (bw1); bw++)                                                 \
    for (int mh = 0; mh < (g)->M; mh++)                                                  \
      for (int mw = 0; mw < (g)->M; mw++) {                                              \
        uint8_t *row = patch_row((g), (bh), bw, mh, mw);                                 \
        const int x0 = (bw * (g)->M + mw) * (g)->P;                                      \
        for (int c = 0; c < 3; c++)                                                      \
          for (int py = 0; py < (g)->P; py++) {                                          \
            const uint8_t *restrict s = patch_src((g), (bh), c, mh, py, x0);             \
            const size_t k = ((size_t)(c * (g)->S + (g)->slot0) * (g)->P + py) * (g)->P; \
            BODY                                                                         \
          }                                                                              \
      }

/* Writes P table values to each of the image's frame slots of one patch row.  PCONST is
 * a compile-time constant in the common cases (14, 16) so the loops unroll. */
#define SLOT_ROW(TYPE, PCONST)                              \
  do {                                                      \
    TYPE v[PCONST];                                         \
    for (int px = 0; px < (PCONST); px++) v[px] = l[s[px]]; \
    for (int t = 0; t < g->nslots; t++) {                   \
      TYPE *restrict d = d0 + (size_t)t * PP;               \
      for (int px = 0; px < (PCONST); px++) d[px] = v[px];  \
    }                                                       \
  } while (0)

#define TABLE_WRITER(NAME, TYPE, LUT)                                        \
  static void NAME(patch_ctx *g, int bh, int bw0, int bw1) {                 \
    const int P = g->P, PP = P * P;                                          \
    FOR_PATCH_ROWS(g, bh, bw0, bw1, {                                        \
      const TYPE *l = g->LUT[c];                                             \
      TYPE *d0 = (TYPE *)row + k;                                            \
      if (P == 14)                                                           \
        SLOT_ROW(TYPE, 14);                                                  \
      else if (P == 16)                                                      \
        SLOT_ROW(TYPE, 16);                                                  \
      else                                                                   \
        for (int t = 0; t < g->nslots; t++)                                  \
          for (int px = 0; px < P; px++) d0[(size_t)t * PP + px] = l[s[px]]; \
    })                                                                       \
  }

/* float32: the reference values through the table (portable). */
TABLE_WRITER(write_f32, float, lut)
/* bfloat16: the same values rounded to nearest even. */
TABLE_WRITER(write_bf16, uint16_t, lut16)

/* uint8: the resized bytes themselves, in the same (c, slot, py, px) order.  Everything
 * the loop needs is in locals (byte stores may alias any field of g, so reading them from
 * g in the loop reloads them after every copy), the rows of a block row are consecutive
 * (bw, mh, mw is their memory order), and the copies have a compile-time size in the
 * common cases (14, 16): a library call per 14 bytes cost more than the copy.  (Tried:
 * assembling a patch's rows in an aligned buffer and writing whole cache lines with
 * non-temporal stores, as the float writers do; in the Loader's steady state, uint8 on
 * the e2e photo set, it was no faster: write_u8 plus the flush took 743/691 perf samples
 * against 700/662.) */
static inline __attribute__((always_inline)) void u8_rows(const patch_ctx *g, int bh, int bw0,
                                                          int bw1, const int P) {
  const int M = g->M, ns = g->nslots;
  const size_t W = (size_t)g->gw * P + 16, PP = (size_t)P * P, plane = (size_t)P * M * W;
  const size_t rb = g->row_bytes, first = (size_t)g->slot0 * PP, cs = (size_t)g->S * PP;
  const uint8_t *blk = g->block + (size_t)(bh & 1) * g->half;
  uint8_t *row = patch_row(g, bh, bw0, 0, 0);
  for (int bw = bw0; bw < bw1; bw++)
    for (int mh = 0; mh < M; mh++)
      for (int mw = 0; mw < M; mw++, row += rb) {
        const uint8_t *src = blk + (size_t)mh * P * W + (size_t)(bw * M + mw) * P;
        for (int c = 0; c < 3; c++) {
          const uint8_t *sp = src + c * plane;
          uint8_t *d = row + first + c * cs;
          for (int py = 0; py < P; py++, sp += W, d += P)
            for (int t = 0; t < ns; t++) memcpy(d + t * PP, sp, (size_t)P);
        }
      }
}

static void write_u8(patch_ctx *g, int bh, int bw0, int bw1) {
  if (g->P == 14)
    u8_rows(g, bh, bw0, bw1, 14);
  else if (g->P == 16)
    u8_rows(g, bh, bw0, bw1, 16);
  else
    u8_rows(g, bh, bw0, bw1, g->P);
}
#undef TABLE_WRITER
#undef SLOT_ROW

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
/* Eight normalised values from eight bytes, with exactly the reference's operations:
 * float32(double(v) * (1/255)), then (x - mean) / std in float32. */
__attribute__((target("avx2"))) static inline __m256 norm8(const uint8_t *s, __m256d inv255,
                                                           __m256 mean, __m256 sd) {
  int32_t lo4, hi4;
  memcpy(&lo4, s, 4);
  memcpy(&hi4, s + 4, 4);
  __m256d lo = _mm256_mul_pd(_mm256_cvtepi32_pd(_mm_cvtepu8_epi32(_mm_cvtsi32_si128(lo4))), inv255);
  __m256d hi = _mm256_mul_pd(_mm256_cvtepi32_pd(_mm_cvtepu8_epi32(_mm_cvtsi32_si128(hi4))), inv255);
  __m256 f = _mm256_set_m128(_mm256_cvtpd_ps(hi), _mm256_cvtpd_ps(lo));
  return _mm256_div_ps(_mm256_sub_ps(f, mean), sd);
}

/* The same values without double precision or division: each quotient is a product with
 * the float reciprocal plus one FMA correction step.  That is correctly rounded for almost
 * all operands but not provably for all, so it is only used when norm_fast_exact() found
 * it equal, bit for bit, to the reference for all 256 byte values of every channel. */
__attribute__((target("avx2,fma"))) static inline __m256 norm8_fast(const uint8_t *s, __m256 mean,
                                                                    __m256 sd, __m256 rsd) {
  const __m256 c255 = _mm256_set1_ps(255.0f), r255 = _mm256_set1_ps(1.0f / 255.0f);
  __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)s)));
  __m256 q = _mm256_mul_ps(v, r255);
  __m256 x = _mm256_fmadd_ps(_mm256_fnmadd_ps(q, c255, v), r255, q);
  __m256 a = _mm256_sub_ps(x, mean);
  __m256 y = _mm256_mul_ps(a, rsd);
  return _mm256_fmadd_ps(_mm256_fnmadd_ps(y, sd, a), rsd, y);
}

__attribute__((target("avx2,fma"))) static int norm_fast_exact(const float mean[3],
                                                               const float std[3],
                                                               const float lut[3][256]) {
  uint8_t bytes[256];
  for (int v = 0; v < 256; v++) bytes[v] = (uint8_t)v;
  for (int c = 0; c < 3; c++) {
    const __m256 m = _mm256_set1_ps(mean[c]), sd = _mm256_set1_ps(std[c]);
    const __m256 rsd = _mm256_set1_ps(1.0f / std[c]);
    for (int v = 0; v < 256; v += 8) {
      float got[8];
      _mm256_storeu_ps(got, norm8_fast(bytes + v, m, sd, rsd));
      if (memcmp(got, &lut[c][v], sizeof got)) return 0;
    }
  }
  return 1;
}

/* Eight float32 values to bfloat16, exactly bf16_rne's integer rounding (finite values). */
__attribute__((target("avx2"))) static inline __m128i bf16x8(__m256 f) {
  const __m256i u = _mm256_castps_si256(f);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb), 16);
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

/* The AVX2 writers of the float formats for 8 <= P <= 16: each patch row is two
 * overlapping groups of eight values (px 0..7 and P-8..P-1), computed with the reference's
 * operations (norm8, or norm8_fast where it was verified), rounded as bf16_rne for
 * bfloat16, and stored to the image's slots.  A patch is assembled in an aligned scratch
 * row and written with non-temporal stores when the image fills whole, aligned rows
 * (pixel_values is far larger than the caches, so this saves reading every output line
 * before writing it).  As in u8_rows, the loop state is in locals and the rows of a block
 * row are consecutive; P and the format are compile-time constants of each caller. */
__attribute__((target("avx2,fma"), always_inline)) static inline void float_rows(
    const patch_ctx *g, int bh, int bw0, int bw1, const int P, const int bf16) {
  const __m256d inv255 = _mm256_set1_pd(1.0 / 255.0);
  __m256 mean[3], sd[3], rsd[3];
  for (int c = 0; c < 3; c++) {
    mean[c] = _mm256_set1_ps(g->mean[c]);
    sd[c] = _mm256_set1_ps(g->std[c]);
    rsd[c] = _mm256_set1_ps(1.0f / g->std[c]);
  }
  const int M = g->M, ns = g->nslots, fast = g->fast;
  const size_t esz = bf16 ? 2 : 4, W = (size_t)g->gw * P + 16, PP = (size_t)P * P;
  const size_t plane = (size_t)P * M * W, rb = g->row_bytes, vec = bf16 ? 16 : 32;
  const size_t first = (size_t)g->slot0 * PP * esz, cs = (size_t)g->S * PP * esz;
  const uint8_t *blk = g->block + (size_t)(bh & 1) * g->half;
  uint8_t *row = patch_row(g, bh, bw0, 0, 0), *tmp = (uint8_t *)g->ptmp;
  const int stream = tmp && ns == g->S && (uintptr_t)g->out % vec == 0 && rb % vec == 0;
  for (int bw = bw0; bw < bw1; bw++)
    for (int mh = 0; mh < M; mh++)
      for (int mw = 0; mw < M; mw++, row += rb) {
        uint8_t *o = stream ? tmp : row;
        const uint8_t *src = blk + (size_t)mh * P * W + (size_t)(bw * M + mw) * P;
        for (int c = 0; c < 3; c++) {
          const uint8_t *sp = src + c * plane;
          uint8_t *d0 = o + first + c * cs;
          for (int py = 0; py < P; py++, sp += W, d0 += P * esz) {
            __m256 f0, f1;
            if (fast) {
              f0 = norm8_fast(sp, mean[c], sd[c], rsd[c]);
              f1 = norm8_fast(sp + P - 8, mean[c], sd[c], rsd[c]);
            } else {
              f0 = norm8(sp, inv255, mean[c], sd[c]);
              f1 = norm8(sp + P - 8, inv255, mean[c], sd[c]);
            }
            uint8_t *d = d0;
            if (bf16) {
              const __m128i h0 = bf16x8(f0), h1 = bf16x8(f1);
              for (int t = 0; t < ns; t++, d += PP * esz) {
                _mm_storeu_si128((__m128i *)d, h0);
                _mm_storeu_si128((__m128i *)(d + (P - 8) * esz), h1);
              }
            } else {
              for (int t = 0; t < ns; t++, d += PP * esz) {
                _mm256_storeu_ps((float *)d, f0);
                _mm256_storeu_ps((float *)(d + (P - 8) * esz), f1);
              }
            }
          }
        }
        if (stream && bf16)
          for (size_t i = 0; i < rb; i += 16)
            _mm_stream_si128((__m128i *)(row + i), _mm_load_si128((const __m128i *)(tmp + i)));
        else if (stream)
          for (size_t i = 0; i < rb; i += 32)
            _mm256_stream_ps((float *)(row + i), _mm256_load_ps((const float *)(tmp + i)));
      }
  if (stream) _mm_sfence();
}

#define FLOAT_WRITER(NAME, BF16)                                                                 \
  __attribute__((target("avx2,fma"))) static void NAME(patch_ctx *g, int bh, int bw0, int bw1) { \
    if (g->P == 14)                                                                              \
      float_rows(g, bh, bw0, bw1, 14, BF16);                                                     \
    else if (g->P == 16)                                                                         \
      float_rows(g, bh, bw0, bw1, 16, BF16);                                                     \
    else                                                                                         \
      float_rows(g, bh, bw0, bw1, g->P, BF16);                                                   \
  }
FLOAT_WRITER(write_f32_avx2, 0)
FLOAT_WRITER(write_bf16_avx2, 1)
#undef FLOAT_WRITER
#define MML_HAVE_AVX2_PATCH 1

/* uint8 of a still image (one frame slot a row), written a whole 64-byte output line at a
 * time straight from a register.  The rows of patch columns [bw0, bw1) of a block row are
 * one run of output bytes, and that run is the planar block's P-byte pieces (bw, mh, mw,
 * c, py) one after another: each piece is one masked load into the line's register at its
 * place in the line (and one more with what spills into the next line), a full line is
 * one aligned store, and only the run's first and last partial lines take masked stores
 * (they are shared with the runs before and after).  Each output line is written once,
 * where u8_scatter's 16-byte copies touch it four to five times from as many output rows,
 * and with no scratch row between (pixels.c's vbmi_lines).  Plain stores, not
 * non-temporal ones: the rows are read again soon (a Loader expands its uint8 rows into
 * float rows at emission; a processor's output is reused), and in the same A/B the
 * non-temporal form was no faster (docs/benchmarks.md, "The uint8 patch layout from
 * registers").  The pieces are read from the block, written one block row earlier.
 * P < 64. */
__attribute__((target("avx2,avx512f,avx512bw"), always_inline)) static inline void u8_lines(
    const patch_ctx *g, int bh, int bw0, int bw1, const int P) {
  const int M = g->M;
  const size_t W = (size_t)g->gw * P + 16, plane = (size_t)P * M * W;
  const uint8_t *blk = g->block + (size_t)(bh & 1) * g->half;
  uint8_t *o = patch_row(g, bh, bw0, 0, 0);
  size_t pos = (uintptr_t)o & 63;        /* the next byte's place in the line */
  uint8_t *d = o - pos;                  /* the line being filled */
  uint64_t keep = ~0ull << pos;          /* bytes of this line the run writes */
  const uint64_t pm = ~0ull >> (64 - P); /* a piece's bytes */
  __m512i v = _mm512_setzero_si512();
  for (int bw = bw0; bw < bw1; bw++)
    for (int mh = 0; mh < M; mh++)
      for (int mw = 0; mw < M; mw++) {
        const uint8_t *src = blk + (size_t)mh * P * W + (size_t)(bw * M + mw) * P;
        for (int c = 0; c < 3; c++)
          for (int py = 0; py < P; py++) {
            const uint8_t *sp = src + c * plane + (size_t)py * W;
            /* bytes sp[0, P) go to line places [pos, pos + P); the load's address is
             * sp - pos, of which only the masked bytes are read */
            v = _mm512_mask_loadu_epi8(v, pm << pos, (const void *)((uintptr_t)sp - pos));
            pos += (size_t)P;
            if (pos < 64) continue;
            if (keep == ~0ull)
              _mm512_store_si512((void *)d, v);
            else
              _mm512_mask_storeu_epi8(d, keep, v);
            d += 64;
            keep = ~0ull;
            pos -= 64; /* the piece's last pos bytes start the next line */
            v = _mm512_maskz_loadu_epi8(pm >> (P - pos), sp + P - pos);
          }
      }
  if (pos) _mm512_mask_storeu_epi8(d, keep & (~0ull >> (64 - pos)), v);
}

__attribute__((target("avx2,avx512f,avx512bw"))) static void write_u8_lines(patch_ctx *g, int bh,
                                                                            int bw0, int bw1) {
  if (g->P == 14)
    u8_lines(g, bh, bw0, bw1, 14);
  else if (g->P == 16)
    u8_lines(g, bh, bw0, bw1, 16);
  else
    u8_lines(g, bh, bw0, bw1, g->P);
}
#define MML_HAVE_U8_LINES 1

/* The float formats of a still image (every frame slot of a row: nslots == S), written a
 * whole 64-byte output line at a time straight from registers, as u8_lines writes uint8:
 * the rows of patch columns [bw0, bw1) are one run of values, and that run is the planar
 * block's P-byte pieces (bw, mh, mw, c, slot, py) one after another (a piece per slot: a
 * still image's slots are the same frame).  Each piece is one masked load of its bytes
 * into the line's index register at its lanes (and one more with what spills into the
 * next line); a full line's 16 (float32) or 32 (bfloat16) bytes become its values with
 * float_rows' operations (norm8, or norm8_fast where it was verified; bf16x8's rounding)
 * 16 lanes at a time, each lane with its channel's mean and std (a line may hold the end
 * of one channel and the start of the next), and are stored once: a non-temporal store
 * for a full line, masked plain stores for the run's first and last partial lines (shared
 * with the runs before and after).  No scratch row between: float_rows assembles each
 * patch row in one and streams it out, and its stores into the scratch queue behind the
 * non-temporal ones (pixels.c's vbmi_lines, the same pattern removed from the expansion).
 * Measured (docs/benchmarks.md, "The float patch layout from registers"): lower CPU per
 * image at the model's limits; at 768x768 no change, where the writer's samples are
 * mostly the non-temporal stores draining (plain stores were slower).  The destination is
 * a multiple of the value size (pick_writer); 1 <= P <= 16. */
#define MML_TARGET_LINES __attribute__((target("avx2,fma,avx512f,avx512bw")))

/* norm8's values (norm8_fast's where FAST) of the 16 bytes in w's 32-bit lanes, with each
 * lane's mean m, std sd and 1/std r. */
MML_TARGET_LINES static inline __attribute__((always_inline)) __m512 norm16(__m512i w, __m512 m,
                                                                            __m512 sd, __m512 r,
                                                                            const int fast) {
  if (fast) {
    const __m512 c255 = _mm512_set1_ps(255.0f), r255 = _mm512_set1_ps(1.0f / 255.0f);
    const __m512 v = _mm512_cvtepi32_ps(w), q = _mm512_mul_ps(v, r255);
    const __m512 x = _mm512_fmadd_ps(_mm512_fnmadd_ps(q, c255, v), r255, q);
    const __m512 a = _mm512_sub_ps(x, m), y = _mm512_mul_ps(a, r);
    return _mm512_fmadd_ps(_mm512_fnmadd_ps(y, sd, a), r, y);
  }
  const __m512d inv255 = _mm512_set1_pd(1.0 / 255.0);
  const __m256 lo =
      _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_cvtepi32_pd(_mm512_castsi512_si256(w)), inv255));
  const __m256 hi =
      _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(w, 1)), inv255));
  const __m512 f = _mm512_castpd_ps(
      _mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(lo)), _mm256_castps_pd(hi), 1));
  return _mm512_div_ps(_mm512_sub_ps(f, m), sd);
}

/* 16 float32 values to bfloat16, bf16x8's rounding. */
MML_TARGET_LINES static inline __attribute__((always_inline)) __m256i bf16x16(__m512 f) {
  const __m512i u = _mm512_castps_si512(f);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  return _mm512_cvtepi32_epi16(
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16));
}

/* Lane means, stds and 1/stds of a line: [0] lanes 0-15, [1] lanes 16-31 (bfloat16). */
typedef struct lane_norm {
  __m512 m[2], sd[2], r[2];
} lane_norm;

/* One line's values from the indices in idx's first 16 (float32) or 32 bytes, stored to d:
 * all of it non-temporally when keep has every lane, else the lanes in keep. */
MML_TARGET_LINES static inline __attribute__((always_inline)) void line_out(
    uint8_t *d, uint32_t keep, __m512i idx, const lane_norm *n, const int bf16, const int fast) {
  if (!bf16) {
    const __m512 f =
        norm16(_mm512_cvtepu8_epi32(_mm512_castsi512_si128(idx)), n->m[0], n->sd[0], n->r[0], fast);
    if (keep == 0xFFFFu)
      _mm512_stream_ps((float *)d, f);
    else
      _mm512_mask_storeu_ps(d, (__mmask16)keep, f);
    return;
  }
  const __m256i h0 = bf16x16(
      norm16(_mm512_cvtepu8_epi32(_mm512_castsi512_si128(idx)), n->m[0], n->sd[0], n->r[0], fast));
  const __m256i h1 = bf16x16(norm16(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(idx, 1)),
                                    n->m[1], n->sd[1], n->r[1], fast));
  const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(h0), h1, 1);
  if (keep == 0xFFFFFFFFu)
    _mm512_stream_si512((__m512i *)d, v);
  else
    _mm512_mask_storeu_epi16(d, (__mmask32)keep, v);
}

MML_TARGET_LINES static inline __attribute__((always_inline)) void float_lines(
    const patch_ctx *g, int bh, int bw0, int bw1, const int P, const int bf16, const int fast) {
  const int M = g->M, S = g->S;
  const unsigned esz = bf16 ? 2 : 4, vpl = 64 / esz; /* values per line */
  const uint32_t full = bf16 ? 0xFFFFFFFFu : 0xFFFFu;
  const size_t W = (size_t)g->gw * P + 16, plane = (size_t)P * M * W;
  const uint8_t *blk = g->block + (size_t)(bh & 1) * g->half;
  __m512 mean[3], sd[3], rsd[3];
  for (int c = 0; c < 3; c++) {
    mean[c] = _mm512_set1_ps(g->mean[c]);
    sd[c] = _mm512_set1_ps(g->std[c]);
    rsd[c] = _mm512_set1_ps(1.0f / g->std[c]);
  }
  uint8_t *o = patch_row(g, bh, bw0, 0, 0);
  unsigned pos = (unsigned)((uintptr_t)o & 63) / esz; /* the next value's lane in the line */
  uint8_t *d = o - (size_t)pos * esz;                 /* the line being filled */
  uint32_t keep = full & (~0u << pos);                /* lanes of this line the run writes */
  const uint64_t pm = ~0ull >> (64 - P);              /* a piece's lanes */
  lane_norm n = {{mean[0], mean[0]}, {sd[0], sd[0]}, {rsd[0], rsd[0]}};
  __m512i idx = _mm512_setzero_si512();
  for (int bw = bw0; bw < bw1; bw++)
    for (int mh = 0; mh < M; mh++)
      for (int mw = 0; mw < M; mw++) {
        const uint8_t *src = blk + (size_t)mh * P * W + (size_t)(bw * M + mw) * P;
        for (int c = 0; c < 3; c++) {
          /* the line's lanes from pos on are channel c's (until the next channel's start) */
          const uint32_t from = ~0u << pos;
          n.m[0] = _mm512_mask_mov_ps(n.m[0], (__mmask16)from, mean[c]);
          n.sd[0] = _mm512_mask_mov_ps(n.sd[0], (__mmask16)from, sd[c]);
          n.r[0] = _mm512_mask_mov_ps(n.r[0], (__mmask16)from, rsd[c]);
          if (bf16) {
            n.m[1] = _mm512_mask_mov_ps(n.m[1], (__mmask16)(from >> 16), mean[c]);
            n.sd[1] = _mm512_mask_mov_ps(n.sd[1], (__mmask16)(from >> 16), sd[c]);
            n.r[1] = _mm512_mask_mov_ps(n.r[1], (__mmask16)(from >> 16), rsd[c]);
          }
          for (int t = 0; t < S; t++) {
            const uint8_t *sp = src + c * plane;
            for (int py = 0; py < P; py++, sp += W) {
              /* bytes sp[0, P) go to lanes [pos, pos + P); the load's address is sp - pos,
               * of which only the masked bytes are read */
              idx = _mm512_mask_loadu_epi8(idx, pm << pos, (const void *)((uintptr_t)sp - pos));
              pos += (unsigned)P;
              if (pos < vpl) continue;
              line_out(d, keep, idx, &n, bf16, fast);
              d += 64;
              keep = full;
              pos -= vpl; /* the piece's last pos bytes start the next line */
              idx = _mm512_maskz_loadu_epi8(pm >> (P - pos), sp + P - pos);
              n.m[0] = n.m[1] = mean[c];
              n.sd[0] = n.sd[1] = sd[c];
              n.r[0] = n.r[1] = rsd[c];
            }
          }
        }
      }
  if (pos) line_out(d, keep & ~(~0u << pos), idx, &n, bf16, fast);
  _mm_sfence();
}

#define LINES_WRITER(NAME, BF16)                                              \
  MML_TARGET_LINES static void NAME(patch_ctx *g, int bh, int bw0, int bw1) { \
    if (!g->fast)                                                             \
      float_lines(g, bh, bw0, bw1, g->P, BF16, 0);                            \
    else if (g->P == 14)                                                      \
      float_lines(g, bh, bw0, bw1, 14, BF16, 1);                              \
    else if (g->P == 16)                                                      \
      float_lines(g, bh, bw0, bw1, 16, BF16, 1);                              \
    else                                                                      \
      float_lines(g, bh, bw0, bw1, g->P, BF16, 1);                            \
  }
LINES_WRITER(write_f32_lines, 0)
LINES_WRITER(write_bf16_lines, 1)
#undef LINES_WRITER
#undef MML_TARGET_LINES
#define MML_HAVE_FLOAT_LINES 1
#endif
#undef FOR_PATCH_ROWS

/* Writes patch columns [bw0, bw1) of block row bh. */
static void write_patches(patch_ctx *g, int bh, int bw0, int bw1) {
  if (bw0 < bw1) g->write(g, bh, bw0, bw1);
}

/* Writes what is left of the waiting block. */
void mml_patch_finish(patch_ctx *g) {
  if (g->pend_bh < 0) return;
  write_patches(g, g->pend_bh, g->pend_bw, g->gw / g->M);
  g->pend_bh = -1;
}

/* uint8, row by row (mml_patch_out's row_out for the uint8 format): output rows go to a
 * ring of MML_HROWS planar rows in the scratch block (the most a resize asks for before
 * announcing the first: L1-sized for common widths) and each announced row is scattered
 * straight into its patch rows: the P bytes of (c, slot, py) of each patch.  No block of
 * P*M rows is written and read back from L2 (that second pass was write_u8).  Where 8 <= P <=
 * 16 and py < P - 1 each piece is one 16-byte copy: its last 16 - P bytes land on the first
 * bytes of (c, slot, py + 1) of the same patch, which the next output row rewrites
 * (rows come in increasing y); row py = P - 1 is copied exactly.  (Under P = 8 the copy
 * at py = P - 2 would pass the channel's P*P bytes: into the next channel, already
 * written, or past the last row.)  Bytes written: the same
 * as the block path's.  The output is not in the caches: each piece prefetches (for
 * writing) the place of the piece four rows on, ~a cache line ahead. */
static inline __attribute__((always_inline)) void u8_scatter(const patch_ctx *g, int y,
                                                             const uint8_t *buf, const int P) {
  const int M = g->M, ns = g->nslots, PM = P * M, nb = g->gw / M;
  const int bh = y / PM, mh = (y % PM) / P, py = y % P, wide = P >= 8 && P <= 16 && py < P - 1;
  const size_t W = (size_t)g->gw * P + 16, PP = (size_t)P * P, rb = g->row_bytes;
  const size_t cs = (size_t)g->S * PP;
  uint8_t *base = patch_row(g, bh, 0, mh, 0) + (size_t)g->slot0 * PP + (size_t)py * P;
  if (ns == 1 && wide) { /* a still image's row: three 16-byte copies per patch, nothing else */
    const size_t pf = 4 * (size_t)P, step = (size_t)M * M * rb;
    const uint8_t *restrict src = buf;
    for (int bw = 0; bw < nb; bw++, base += step)
      for (int mw = 0; mw < M; mw++, src += P) {
        uint8_t *restrict d = base + (size_t)mw * rb;
        __builtin_prefetch(d + pf, 1);
        __builtin_prefetch(d + cs + pf, 1);
        __builtin_prefetch(d + 2 * cs + pf, 1);
        memcpy(d, src, 16);
        memcpy(d + cs, src + W, 16);
        memcpy(d + 2 * cs, src + 2 * W, 16);
      }
    return;
  }
  for (int bw = 0; bw < nb; bw++)
    for (int mw = 0; mw < M; mw++) {
      uint8_t *row = base + ((size_t)bw * M * M + mw) * rb;
      const uint8_t *src = buf + (size_t)(bw * M + mw) * P;
      for (int c = 0; c < 3; c++) {
        const uint8_t *sp = src + c * W;
        uint8_t *d = row + c * cs;
        for (int t = 0; t < ns; t++, d += PP) {
          __builtin_prefetch(d + 4 * P, 1);
          if (wide)
            memcpy(d, sp, 16);
          else
            memcpy(d, sp, (size_t)P);
        }
      }
    }
}

static uint8_t *u8_dst(void *ctx, int y) {
  patch_ctx *g = ctx;
  return g->block + (size_t)(y % MML_HROWS) * 3 * ((size_t)g->gw * g->P + 16);
}

static void key_white(const patch_ctx *g, uint8_t *r, size_t plane) {
  for (int x = 0; x < g->gw * g->P; x++)
    if (r[x] == g->kc[0] && r[plane + x] == g->kc[1] && r[2 * plane + x] == g->kc[2])
      r[x] = r[plane + x] = r[2 * plane + x] = 255;
}

static void u8_done(void *ctx, int y) {
  patch_ctx *g = ctx;
  uint8_t *r = u8_dst(ctx, y);
  if (g->key < 0) g->key = mml_decoder_color_key(g->dec, g->kc);
  if (g->key) key_white(g, r, (size_t)g->gw * g->P + 16); /* the keyed colour becomes white */
  if (g->P == 14)
    u8_scatter(g, y, r, 14);
  else if (g->P == 16)
    u8_scatter(g, y, r, 16);
  else
    u8_scatter(g, y, r, g->P);
}

/* row_out for patchify: output rows go straight into the planar block.  A full block is
 * not written out at once: its patches are written a share per output row of the next
 * block (two blocks alternate), so the stream of output stores is spread over the whole
 * decode and resize instead of stalling on memory bandwidth in bursts. */
static uint8_t *patch_dst(void *ctx, int y) {
  patch_ctx *g = ctx;
  const int PM = g->P * g->M, b = y / PM;
  if (g->pend_bh >= 0 && b >= g->pend_bh + 2) mml_patch_finish(g); /* its half is reused */
  return g->block + (size_t)(b & 1) * g->half + (size_t)(y % PM) * (g->gw * g->P + 16);
}

static void patch_done(void *ctx, int y) {
  patch_ctx *g = ctx;
  const int PM = g->P * g->M, in_block = y % PM + 1, bw_n = g->gw / g->M;
  if (g->key < 0) g->key = mml_decoder_color_key(g->dec, g->kc);
  if (g->key) { /* the keyed colour of the resized row becomes white */
    const size_t stride = (size_t)g->gw * g->P + 16;
    key_white(g, g->block + (size_t)((y / PM) & 1) * g->half + (size_t)(y % PM) * stride,
              (size_t)PM * stride);
  }
  if (g->pend_bh >= 0) {
    int to = (int)(((int64_t)bw_n * in_block + PM - 1) / PM);
    write_patches(g, g->pend_bh, g->pend_bw, to);
    if (to > g->pend_bw) g->pend_bw = to;
  }
  if (in_block == PM) {
    mml_patch_finish(g);
    g->pend_bh = y / PM;
    g->pend_bw = 0;
  }
}

/* The normalisation tables of cfg's mean and std (rebuilt only when they change). */
static void scratch_tables(mml_vision_scratch *s, const float mean[3], const float std[3]) {
  if (s->norm_valid && !memcmp(s->norm_mean, mean, sizeof s->norm_mean) &&
      !memcmp(s->norm_std, std, sizeof s->norm_std))
    return;
  build_lut(mean, std, s->lut, s->lut16);
  s->norm_fast = 0;
#ifdef MML_HAVE_AVX2_PATCH
  s->norm_fast = mml_cpu_fma() && norm_fast_exact(mean, std, s->lut);
#endif
  memcpy(s->norm_mean, mean, sizeof s->norm_mean);
  memcpy(s->norm_std, std, sizeof s->norm_std);
  s->norm_valid = 1;
}

/* Picks the writer of cfg->pixel_format (the AVX2 one for the float formats where it runs). */
static void pick_writer(patch_ctx *g, mml_vision_scratch *s, int format) {
  g->write = format == MML_PIXEL_UINT8      ? write_u8
             : format == MML_PIXEL_BFLOAT16 ? write_bf16
                                            : write_f32;
  g->fast = 0;
  g->ptmp = NULL;
#ifdef MML_HAVE_FLOAT_LINES
  /* a still image's float rows: whole lines from registers (float_lines), no scratch row */
  const size_t esz = format == MML_PIXEL_BFLOAT16 ? 2 : 4;
  if (format != MML_PIXEL_UINT8 && g->nslots == g->S && g->P <= 16 &&
      (uintptr_t)g->out % esz == 0 && mml_cpu_avx512()) {
    g->write = format == MML_PIXEL_BFLOAT16 ? write_bf16_lines : write_f32_lines;
    g->fast = s->norm_fast;
    return;
  }
#endif
#ifdef MML_HAVE_AVX2_PATCH
  if (format != MML_PIXEL_UINT8 && mml_cpu_avx2() && g->P >= 8 && g->P <= 16) {
    g->write = format == MML_PIXEL_BFLOAT16 ? write_bf16_avx2 : write_f32_avx2;
    g->fast = s->norm_fast;
    size_t need = g->row_bytes / sizeof(float) + 16;
    if (s->ptmp_cap < need) {
      free(s->ptmp);
      s->ptmp_cap = 0;
      if (posix_memalign((void **)&s->ptmp, 64, need * sizeof(float)))
        s->ptmp = NULL;
      else
        s->ptmp_cap = need;
    }
    g->ptmp = s->ptmp; /* NULL (allocation failed): plain stores */
  }
#endif
#ifdef MML_HAVE_U8_LINES
  /* a still image's uint8 rows: whole lines from registers (u8_lines) through the block */
  if (format == MML_PIXEL_UINT8 && g->S == 1 && g->nslots == 1 && g->P < 64 && mml_cpu_avx512())
    g->write = write_u8_lines;
#endif
}

mml_status mml_patch_init(patch_ctx *g, mml_vision_scratch *s, const mml_vision_cfg *cfg,
                          const mml_vision_plan *plan, const mml_pixel_dst *dst, mml_err *err) {
  size_t half = ((size_t)plan->dst_w + 16) * 3 * cfg->patch_size * cfg->merge_size, n = 2 * half;
  if (mml_bytes_reserve(&s->block, n))
    return mml_err_set(err, MML_ENOMEM, "vision: out of memory for a %zu-byte block", n);
  memset(g, 0, sizeof *g);
  g->block = s->block.data;
  g->half = half;
  g->P = cfg->patch_size;
  g->M = cfg->merge_size;
  g->gw = plan->grid_w;
  g->out = dst->out;
  g->S = dst->slots;
  g->slot0 = dst->slot0;
  g->nslots = dst->nslots;
  g->row_bytes = (size_t)3 * g->S * g->P * g->P * mml_dtype_size(mml_vision_pixel_dtype(cfg));
  for (int c = 0; c < 3; c++) {
    g->mean[c] = cfg->mean[c];
    g->std[c] = cfg->std[c];
  }
  g->pend_bh = -1;
  scratch_tables(s, g->mean, g->std);
  g->lut = (const float(*)[256])s->lut;
  g->lut16 = (const uint16_t(*)[256])s->lut16;
  pick_writer(g, s, cfg->pixel_format);
  return MML_OK;
}

row_out mml_patch_out(patch_ctx *g) {
  if (g->write == write_u8 && g->P * g->M * 2 >= MML_HROWS) /* the ring fits in the block */
    return (row_out){u8_dst, u8_done, g, (size_t)g->gw * g->P + 16};
  return (row_out){patch_dst, patch_done, g, (size_t)g->P * g->M * (g->gw * g->P + 16)};
}
