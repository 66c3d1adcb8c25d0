/*
 * image_jpeg_mem.h — internal: a libjpeg decompressor's whole-image coefficient arrays
 * in memory that stays mapped (design: image_jpeg_mem.c).  Include after jpeglib.h.
 */
#ifndef MML_IMAGE_JPEG_MEM_H
#define MML_IMAGE_JPEG_MEM_H

#include "mml/batch.h"

/* One array per component of a multi-scan image (JPEG allows at most 10 components). */
#define MML_JPEG_MAX_ARRAYS 10
/* The region is kept between images up to this size by default (a 4:2:0 progressive
 * image of about 2.7 megapixels); a larger one is unmapped after its image
 * (mml_jpeg_keep_trim), so a worker's kept scratch stays within max_memory's per-worker
 * reserve.  A decoder's own bound: mml_decoder_set_jpeg_keep (mml/image.h). */
#define MML_JPEG_KEEP ((size_t)8 << 20)

typedef struct mml_jpeg_keep mml_jpeg_keep;

/* Replaces jd's virtual-block-array methods (after jpeg_create_decompress; uses
 * jd->client_data); MML_ENOMEM when the state cannot be allocated (jd is unchanged). */
mml_status mml_jpeg_keep_install(struct jpeg_decompress_struct *jd, mml_jpeg_keep **out);
/* After an image: unmaps the region if it grew beyond `keep` bytes. */
void mml_jpeg_keep_trim(mml_jpeg_keep *k, size_t keep);
/* Bytes of the region now mapped (tests). */
size_t mml_jpeg_keep_bytes(const mml_jpeg_keep *k);
/* After jpeg_destroy_decompress. */
void mml_jpeg_keep_free(mml_jpeg_keep *k);

#endif
