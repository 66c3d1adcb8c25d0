/*
 * image_jpeg_mem.c — the whole-image coefficient arrays of multi-scan (progressive) JPEGs
 * in memory that stays mapped, reused image after image.
 *
 * libjpeg decodes a multi-scan JPEG into "virtual" arrays of DCT coefficients covering
 * the whole image (128 bytes per 8x8 block and component: 3 bytes per pixel at 4:2:0),
 * pre-zeroed, which its memory manager takes from malloc and frees at the end of every
 * image.  They are large, so glibc maps them afresh (or grows and trims a thread arena)
 * each time, and every progressive image then cost one page fault (and the kernel's
 * zeroing) per 4 KiB: most of the loader's steady-state page faults.
 *
 * libjpeg calls its memory manager through the public jpeg_memory_mgr method table, so
 * the decompressor's virtual-block-array methods are replaced here: a request that is
 * pre-zeroed and of image lifetime (all the decompressor makes) becomes one of up to
 * MAX_ARRAYS arrays laid out, when libjpeg realizes them, in the decoder's mml_mapped
 * region, which is zeroed then as a whole (libjpeg zeroes rows at their first access;
 * every row holds the same values when read) and kept for the next image while it is at
 * most the decoder's bound (MML_JPEG_KEEP unless set: mml_decoder_set_jpeg_keep; a region
 * mapped afresh costs the kernel's zeroing of every page on top of the zeroing here).  Any other request, and everything else, goes to libjpeg's
 * own methods.  The arrays are forgotten when libjpeg frees its image pool (end of the
 * image, abort, error).  The coefficients and so the pixels are libjpeg's, bit for bit.
 *
 * Threads: one decoder (jpeg object and region) per thread at a time.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jerror.h>
#include <jpeglib.h>

#include "image_jpeg_mem.h"

typedef struct keep_array {
  JDIMENSION rows, blocks, maxaccess;
  JBLOCKARRAY mem; /* row pointers into the region once realized */
} keep_array;

struct mml_jpeg_keep {
  struct jpeg_memory_mgr *mem;
  jvirt_barray_ptr (*request)(j_common_ptr, int, boolean, JDIMENSION, JDIMENSION, JDIMENSION);
  void (*realize)(j_common_ptr);
  JBLOCKARRAY (*access)(j_common_ptr, jvirt_barray_ptr, JDIMENSION, JDIMENSION, boolean);
  void (*free_pool)(j_common_ptr, int);
  keep_array arr[MML_JPEG_MAX_ARRAYS];
  int n;
  mml_mapped region;
};

static mml_jpeg_keep *keep_of(j_common_ptr c) { return (mml_jpeg_keep *)c->client_data; }

static void fail(j_common_ptr c, int code) {
  c->err->msg_code = code;
  (*c->err->error_exit)(c);
}

static jvirt_barray_ptr request(j_common_ptr c, int pool, boolean pre_zero, JDIMENSION blocks,
                                JDIMENSION rows, JDIMENSION maxaccess) {
  mml_jpeg_keep *k = keep_of(c);
  if (!pre_zero || pool != JPOOL_IMAGE || k->n == MML_JPEG_MAX_ARRAYS)
    return k->request(c, pool, pre_zero, blocks, rows, maxaccess);
  keep_array *a = &k->arr[k->n++];
  *a = (keep_array){rows, blocks, maxaccess, NULL};
  return (jvirt_barray_ptr)(void *)a;
}

static keep_array *ours(mml_jpeg_keep *k, jvirt_barray_ptr p) {
  for (int i = 0; i < k->n; i++)
    if ((void *)p == (void *)&k->arr[i]) return &k->arr[i];
  return NULL;
}

static void realize(j_common_ptr c) {
  mml_jpeg_keep *k = keep_of(c);
  k->realize(c);
  size_t total = 0;
  for (int i = 0; i < k->n; i++) {
    keep_array *a = &k->arr[i];
    if (a->mem) continue;
    size_t row = (size_t)a->blocks * sizeof(JBLOCK);
    if (a->rows && row > (SIZE_MAX - total) / a->rows) fail(c, JERR_OUT_OF_MEMORY);
    total += row * a->rows;
  }
  if (!total) return;
  if (mml_mapped_reserve(&k->region, total)) fail(c, JERR_OUT_OF_MEMORY);
  memset(k->region.data, 0, total); /* libjpeg's pre-zero */
  uint8_t *p = k->region.data;
  for (int i = 0; i < k->n; i++) {
    keep_array *a = &k->arr[i];
    if (a->mem) continue;
    a->mem = (*c->mem->alloc_small)(c, JPOOL_IMAGE, (size_t)a->rows * sizeof(JBLOCKROW));
    for (JDIMENSION r = 0; r < a->rows; r++, p += (size_t)a->blocks * sizeof(JBLOCK))
      a->mem[r] = (JBLOCKROW)(void *)p;
  }
}

static JBLOCKARRAY access(j_common_ptr c, jvirt_barray_ptr p, JDIMENSION start, JDIMENSION num,
                          boolean writable) {
  mml_jpeg_keep *k = keep_of(c);
  keep_array *a = ours(k, p);
  if (!a) return k->access(c, p, start, num, writable);
  if (!a->mem || start > a->rows || num > a->rows - start || num > a->maxaccess)
    fail(c, JERR_BAD_VIRTUAL_ACCESS);
  return a->mem + start;
}

static void free_pool(j_common_ptr c, int pool) {
  mml_jpeg_keep *k = keep_of(c);
  k->free_pool(c, pool);
  if (pool == JPOOL_IMAGE) k->n = 0; /* the control blocks' row pointers went with it */
}

mml_status mml_jpeg_keep_install(struct jpeg_decompress_struct *jd, mml_jpeg_keep **out) {
  mml_jpeg_keep *k = calloc(1, sizeof *k);
  if (!k) return MML_ENOMEM;
  struct jpeg_memory_mgr *m = jd->mem;
  k->mem = m;
  k->request = m->request_virt_barray;
  k->realize = m->realize_virt_arrays;
  k->access = m->access_virt_barray;
  k->free_pool = m->free_pool;
  m->request_virt_barray = request;
  m->realize_virt_arrays = realize;
  m->access_virt_barray = access;
  m->free_pool = free_pool;
  jd->client_data = k;
  *out = k;
  return MML_OK;
}

void mml_jpeg_keep_trim(mml_jpeg_keep *k, size_t keep) {
  if (k && k->region.cap > keep) mml_mapped_free(&k->region);
}

size_t mml_jpeg_keep_bytes(const mml_jpeg_keep *k) { return k ? k->region.cap : 0; }

void mml_jpeg_keep_free(mml_jpeg_keep *k) {
  if (!k) return;
  mml_mapped_free(&k->region);
  free(k);
}
