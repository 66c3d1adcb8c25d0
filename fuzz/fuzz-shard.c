/* fuzz-shard.c — the sample index's shard reader (mml/index.h) on untrusted shard bytes:
 * the raw layer (gzip with members and zero padding, zstd with skippable frames, plain),
 * the text layer (JSONL, JSON array, or, with FUZZ_TAR, the WebDataset tar scanner:
 * ustar/GNU/pax headers, long names, member grouping) and the readers: every sample is
 * located, its record read back (from the decompressed copy when compressed), trimmed and
 * named, and a tar sample's members and images listed.  The limits are small, as a loader
 * sets them, so a compression bomb is refused early.  The first input byte picks the chunk
 * size the bytes are fed in (chunk boundaries anywhere). */
#include "fuzz.h"
#include "mml/index.h"

#ifdef FUZZ_TAR
#define LAYOUT MML_LAYOUT_WDS
#define NAME "fuzz.tar"
#else
#define LAYOUT MML_LAYOUT_AUTO
#define NAME "fuzz.jsonl"
#endif

static void read_back(mml_index *ix) {
  mml_bytes rec = {0};
  mml_err err;
  for (int64_t i = 0; i < ix->n; i++) {
    int shard;
    int64_t off, len, where;
    mml_index_locate(ix, i, &shard, &off, &len, &where);
    if (off < 0 || len < 0) abort(); /* a range the loader would read */
    const mml_index_shard *sh = &ix->shards[shard];
    if (sh->fd >= 0 && len <= (1 << 20) && mml_index_read(sh, off, len, &rec, &err) == MML_OK) {
      if (mml_index_record_len(sh, rec.data, rec.len) > rec.len) abort();
    }
    char name[256];
    mml_index_name_sample(ix, shard, i, where, name, sizeof name);
    const char *names[8];
    int n = mml_index_images(ix, shard, i, names, 8);
    for (int k = 0; k < n && k < 8; k++) {
      int64_t mo, ml;
      if (!mml_index_member(ix, shard, i, names[k], &mo, &ml) || mo < 0 || ml < 0) abort();
    }
    mml_index_videos(ix, shard, i, names, 8);
  }
  int64_t *bl, nb;
  if (ix->nshards && mml_index_blank_lines(&ix->shards[0], &bl, &nb) == MML_OK) {
    if (nb != ix->shards[0].nblank) abort();
    for (int64_t k = 1; k < nb; k++)
      if (bl[k] <= bl[k - 1]) abort(); /* ascending line numbers */
    free(bl);
  }
  mml_bytes_free(&rec);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  size_t step = (size_t)data[0] * 37 + 1; /* 1 .. 9436 bytes per feed */
  data++, size--;
  mml_index ix = {.limits = {.max_text_bytes = 4 << 20, .max_records = 1 << 16}};
  mml_err err;
  mml_index_builder *b;
  if (mml_index_begin(&ix, NAME, LAYOUT, &b, &err) != MML_OK) return 0;
  mml_status st = MML_OK;
  for (size_t i = 0; !st && i < size; i += step)
    st = mml_index_feed(b, data + i, size - i < step ? size - i : step, &err);
  if (st)
    mml_index_abort(b);
  else
    st = mml_index_end(b, &err);
  if (!st)
    read_back(&ix);
  else if (ix.nshards)
    abort(); /* a failed build drops its shard */
  mml_index_free(&ix);
  return 0;
}
