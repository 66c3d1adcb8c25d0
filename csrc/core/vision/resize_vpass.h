/*
 * resize_vpass.h — private to resize.c: the vertical passes' bodies, included once per
 * vector width (AVX2: 8 int32 lanes, AVX-512: 16).  The including file defines VX(name)
 * (each copy's own names), VFN (its target attributes), V (the vector of VN int32 lanes)
 * and the operations: V_SET1, V_ADD, V_MUL (low 32 bits), V_WIDEN(p) (VN bytes at p,
 * zero-extended), V_PACK4(s0, s1, s2, s3) (shift, clip8 by saturating packs, and the
 * 4 * VN bytes in order: s0's values, s1's, s2's, s3's), V_STORE(p, v) (4 * VN bytes),
 * V_STORE_LO / V_STORE_HI(p, v) (its first / second 2 * VN bytes).  The integer
 * arithmetic is exact in any order, so both copies give the same bytes as the portable
 * loops.  The macros are #undef'd at the end, ready for the next copy.
 */

/* One output row, 4 * VN outputs at a time with all taps accumulated in registers; the
 * last step is placed to end at byte n (overlapping the previous one).  Four taps (the
 * common case) are unrolled with the rows and weights in registers.  Needs n >= 4 * VN. */
VFN static void VX(row_v)(const int32_t *k, int cnt, const uint8_t *const *rows, size_t off, int n,
                          uint8_t *restrict dst) {
  const V half = V_SET1(1 << (PRECISION_BITS - 1));
  if (cnt == 4) {
    const uint8_t *r0 = rows[0] + off, *r1 = rows[1] + off, *r2 = rows[2] + off,
                  *r3 = rows[3] + off;
    const V w0 = V_SET1(k[0]), w1 = V_SET1(k[1]), w2 = V_SET1(k[2]), w3 = V_SET1(k[3]);
    for (int i = 0;; i += 4 * VN) {
      if (i > n - 4 * VN) i = n - 4 * VN;
      V s[4];
      for (int q = 0; q < 4; q++) {
        const int o = i + VN * q;
        s[q] = V_ADD(half, V_MUL(V_WIDEN(r0 + o), w0));
        s[q] = V_ADD(s[q], V_MUL(V_WIDEN(r1 + o), w1));
        s[q] = V_ADD(s[q], V_MUL(V_WIDEN(r2 + o), w2));
        s[q] = V_ADD(s[q], V_MUL(V_WIDEN(r3 + o), w3));
      }
      V_STORE(dst + i, V_PACK4(s[0], s[1], s[2], s[3]));
      if (i == n - 4 * VN) break;
    }
    return;
  }
  for (int i = 0;; i += 4 * VN) {
    if (i > n - 4 * VN) i = n - 4 * VN;
    V s0 = half, s1 = half, s2 = half, s3 = half;
    for (int j = 0; j < cnt; j++) {
      const uint8_t *row = rows[j] + off + i;
      const V w = V_SET1(k[j]);
      s0 = V_ADD(s0, V_MUL(V_WIDEN(row), w));
      s1 = V_ADD(s1, V_MUL(V_WIDEN(row + VN), w));
      s2 = V_ADD(s2, V_MUL(V_WIDEN(row + 2 * VN), w));
      s3 = V_ADD(s3, V_MUL(V_WIDEN(row + 3 * VN), w));
    }
    V_STORE(dst + i, V_PACK4(s0, s1, s2, s3));
    if (i == n - 4 * VN) break;
  }
}

/* Two consecutive output rows that read rows[0..3] and rows[1..4] (four taps each, the
 * common case when the height changes by less than half): each input row is loaded and
 * widened once for both, 2 * VN outputs of each row per step (four accumulators and the
 * eight weights stay in registers).  Needs n >= 2 * VN. */
VFN static void VX(rows_v2)(const int32_t *k0, const int32_t *k1, const uint8_t *const *rows,
                            size_t off, int n, uint8_t *restrict dst0, uint8_t *restrict dst1) {
  const V half = V_SET1(1 << (PRECISION_BITS - 1));
  const uint8_t *r0 = rows[0] + off, *r1 = rows[1] + off, *r2 = rows[2] + off, *r3 = rows[3] + off,
                *r4 = rows[4] + off;
  const V a0 = V_SET1(k0[0]), a1 = V_SET1(k0[1]), a2 = V_SET1(k0[2]), a3 = V_SET1(k0[3]);
  const V b0 = V_SET1(k1[0]), b1 = V_SET1(k1[1]), b2 = V_SET1(k1[2]), b3 = V_SET1(k1[3]);
  for (int i = 0;; i += 2 * VN) {
    if (i > n - 2 * VN) i = n - 2 * VN;
    V s0 = half, s1 = half, t0 = half, t1 = half; /* s: row 0, t: row 1 */
    for (int q = 0; q < 2; q++) {
      const int o = i + VN * q;
      V *s = q ? &s1 : &s0, *t = q ? &t1 : &t0, x;
      x = V_WIDEN(r0 + o);
      *s = V_ADD(*s, V_MUL(x, a0));
      x = V_WIDEN(r1 + o);
      *s = V_ADD(*s, V_MUL(x, a1));
      *t = V_ADD(*t, V_MUL(x, b0));
      x = V_WIDEN(r2 + o);
      *s = V_ADD(*s, V_MUL(x, a2));
      *t = V_ADD(*t, V_MUL(x, b1));
      x = V_WIDEN(r3 + o);
      *s = V_ADD(*s, V_MUL(x, a3));
      *t = V_ADD(*t, V_MUL(x, b2));
      x = V_WIDEN(r4 + o);
      *t = V_ADD(*t, V_MUL(x, b3));
    }
    const V p = V_PACK4(s0, s1, t0, t1); /* row 0's 2 * VN bytes | row 1's */
    V_STORE_LO(dst0 + i, p);
    V_STORE_HI(dst1 + i, p);
    if (i == n - 2 * VN) break;
  }
}

#undef VX
#undef VFN
#undef V
#undef VN
#undef V_SET1
#undef V_ADD
#undef V_MUL
#undef V_WIDEN
#undef V_PACK4
#undef V_STORE
#undef V_STORE_LO
#undef V_STORE_HI
