/* test-index-hostile.c — the sample index against hostile and unusual shards (issue 29):
 * blank lines kept as runs (line numbers by binary search, round trip through the
 * dataset index's list), the limits on text bytes and records, gzip zero padding, a zstd
 * skippable frame first, impossible tar member sizes, and non-regular files refused
 * without blocking. */
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include "mml/index.h"
#include "mml_test.h"

static int64_t line_of(const mml_index *ix, int64_t i) {
  int shard;
  int64_t off, len, line;
  mml_index_locate(ix, i, &shard, &off, &len, &line);
  return line;
}

TEST(index_blank_lines_are_runs) {
  /* 1000 blank lines, then records with a blank line after every other one */
  mml_bytes t = {0};
  for (int i = 0; i < 1000; i++) mml_bytes_append(&t, "\n", 1);
  for (int i = 0; i < 100; i++) mml_bytes_append(&t, i % 2 ? "{}\n\n" : "{}\n", i % 2 ? 4 : 3);
  mml_index ix = {0};
  mml_err err = {0};
  CHECK_OK(mml_index_add_bytes(&ix, "b.jsonl", MML_LAYOUT_AUTO, t.data, t.len, &err), err);
  const mml_index_shard *sh = &ix.shards[0];
  CHECK_EQ_INT(ix.n, 100);
  CHECK_EQ_INT(sh->nblank, 1050);
  CHECK_EQ_INT(sh->nruns, 51); /* the first 1000 are one run */
  int64_t want = 1001;
  for (int64_t i = 0; i < 100; i++) { /* a simple walk over the text is the reference */
    CHECK_EQ_INT(line_of(&ix, i), want);
    want += i % 2 ? 2 : 1;
  }
  int64_t *bl, n;
  CHECK_EQ_INT(mml_index_blank_lines(sh, &bl, &n), MML_OK);
  CHECK_EQ_INT(n, 1050);
  CHECK_EQ_INT(bl[0], 1);
  CHECK_EQ_INT(bl[999], 1000);
  CHECK_EQ_INT(bl[1000], 1003); /* after records 0 (line 1001) and 1 (line 1002) */
  CHECK_EQ_INT(bl[1049], want - 1);
  free(bl);
  mml_bytes_free(&t);
  mml_index_free(&ix);
}

TEST(index_limits_refuse_bombs) {
  mml_index ix = {.limits = {.max_records = 5}};
  mml_err err = {0};
  const char *six = "{}\n{}\n\n{}\n{}\n{}\n";
  CHECK(mml_index_add_bytes(&ix, "r.jsonl", MML_LAYOUT_AUTO, (const uint8_t *)six, strlen(six),
                            &err) == MML_ERECORD);
  CHECK(strstr(err.msg, "max_shard_records=5") && strstr(err.msg, "r.jsonl"));
  CHECK_EQ_INT(ix.nshards, 0);
  const char *arr = "[1, 2, 3, 4, 5, 6]";
  CHECK(mml_index_add_bytes(&ix, "a.json", MML_LAYOUT_AUTO, (const uint8_t *)arr, strlen(arr),
                            &err) == MML_ERECORD);
  CHECK(strstr(err.msg, "max_shard_records=5") && strstr(err.msg, "elements"));
  /* text bytes: a compressed shard's decompressed text is bounded, a plain one is not */
  ix.limits = (mml_index_limits){.max_text_bytes = 4096};
  uint8_t text[10000], gz[1000];
  memset(text, ' ', sizeof text);
  text[sizeof text - 1] = '\n';
  text[0] = '{', text[1] = '}';
  CHECK_OK(mml_index_add_bytes(&ix, "p.jsonl", MML_LAYOUT_AUTO, text, sizeof text, &err), err);
  size_t zn = ZSTD_compress(gz, sizeof gz, text, sizeof text, 3);
  CHECK(!ZSTD_isError(zn));
  CHECK(mml_index_add_bytes(&ix, "z.jsonl.zst", MML_LAYOUT_AUTO, gz, zn, &err) == MML_ERECORD);
  CHECK(strstr(err.msg, "max_shard_bytes=4096") && strstr(err.msg, "z.jsonl.zst"));
  CHECK_EQ_INT(ix.nshards, 1);
  mml_index_free(&ix);
}

TEST(index_gzip_padding_and_zstd_skippable_frame) {
  const char *recs = "{\"a\": 1}\n{\"b\": 2}\n";
  uint8_t gz[512], buf[2048];
  uLongf zn;
  z_stream z = {0};
  CHECK(deflateInit2(&z, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) == Z_OK);
  z.next_in = (Bytef *)recs, z.avail_in = (uInt)strlen(recs);
  z.next_out = gz, z.avail_out = sizeof gz;
  CHECK(deflate(&z, Z_FINISH) == Z_STREAM_END);
  zn = sizeof gz - z.avail_out;
  deflateEnd(&z);
  /* member, 100 zero bytes, member, 700 zero bytes (as gzip -t and Python accept) */
  size_t n = 0;
  memcpy(buf, gz, zn), n += zn;
  memset(buf + n, 0, 100), n += 100;
  memcpy(buf + n, gz, zn), n += zn;
  memset(buf + n, 0, 700), n += 700;
  for (size_t step = 1; step <= n; step = step * 4 + 1) {
    mml_index ix = {0};
    mml_err err = {0};
    mml_index_builder *b;
    CHECK_OK(mml_index_begin(&ix, "pad.jsonl.gz", MML_LAYOUT_AUTO, &b, &err), err);
    for (size_t i = 0; i < n; i += step)
      CHECK_OK(mml_index_feed(b, buf + i, n - i < step ? n - i : step, &err), err);
    CHECK_OK(mml_index_end(b, &err), err);
    CHECK_EQ_INT(ix.n, 4);
    mml_index_free(&ix);
  }
  /* zero padding then garbage is still an error */
  buf[zn + 50] = 'x';
  mml_index ix = {0};
  mml_err err = {0};
  CHECK(mml_index_add_bytes(&ix, "bad.gz", MML_LAYOUT_AUTO, buf, n, &err) == MML_ERECORD);
  /* a zstd stream that starts with a skippable frame (metadata) */
  static const uint8_t skip[] = {0x50, 0x2a, 0x4d, 0x18, 4, 0, 0, 0, 'm', 'e', 't', 'a'};
  memcpy(buf, skip, sizeof skip);
  size_t k = ZSTD_compress(buf + sizeof skip, sizeof buf - sizeof skip, recs, strlen(recs), 3);
  CHECK(!ZSTD_isError(k));
  CHECK_OK(mml_index_add_bytes(&ix, "s.jsonl.zst", MML_LAYOUT_AUTO, buf, sizeof skip + k, &err),
           err);
  CHECK_EQ_INT(ix.shards[0].compression, MML_COMPRESS_ZSTD);
  CHECK_EQ_INT(ix.n, 2);
  mml_index_free(&ix);
}

/* A ustar header block for `name` of `size` bytes (octal) and type `type`. */
static void tar_header(uint8_t h[512], const char *name, int64_t size, char type) {
  memset(h, 0, 512);
  snprintf((char *)h, 100, "%s", name);
  memcpy(h + 100, "0000644", 8);
  snprintf((char *)h + 124, 12, "%011llo", (unsigned long long)size);
  h[156] = (uint8_t)type;
  memcpy(h + 257, "ustar", 6);
  memcpy(h + 148, "        ", 8);
  unsigned sum = 0;
  for (int i = 0; i < 512; i++) sum += h[i];
  snprintf((char *)h + 148, 8, "%06o", sum);
}

TEST(index_tar_impossible_member_size) {
  uint8_t t[512 * 6] = {0};
  const char pax[] = "28 size=9223372036854775707\n";
  tar_header(t, "pax", (int64_t)strlen(pax), 'x');
  memcpy(t + 512, pax, strlen(pax));
  tar_header(t + 1024, "a.json", 0, '0');
  mml_index ix = {0};
  mml_err err = {0};
  CHECK(mml_index_add_bytes(&ix, "p.tar", MML_LAYOUT_AUTO, t, sizeof t, &err) == MML_ERECORD);
  CHECK(strstr(err.msg, "impossible member size") != NULL);
  /* a size just in range is a member longer than the data: a truncated tar */
  const char pax2[] = "28 size=9223372036854775296\n";
  memcpy(t + 512, pax2, strlen(pax2));
  CHECK(mml_index_add_bytes(&ix, "q.tar", MML_LAYOUT_AUTO, t, sizeof t, &err) == MML_ERECORD);
  CHECK(strstr(err.msg, "truncated tar") != NULL);
  mml_index_free(&ix);
}

TEST(index_non_regular_files_refused) {
  char dir[] = "/tmp/mml-hostile-XXXXXX", fifo[64];
  CHECK(mkdtemp(dir) != NULL);
  snprintf(fifo, sizeof fifo, "%s/f.jsonl", dir);
  CHECK(mkfifo(fifo, 0600) == 0);
  mml_index ix = {0};
  mml_err err = {0};
  CHECK(mml_index_add_file(&ix, fifo, MML_LAYOUT_AUTO, &err) == MML_ECONFIG); /* no wait */
  CHECK(strstr(err.msg, "FIFO") != NULL);
  CHECK(mml_index_add_file(&ix, "/dev/zero", MML_LAYOUT_AUTO, &err) == MML_ECONFIG);
  CHECK(strstr(err.msg, "character device") != NULL);
  CHECK(mml_index_add_file(&ix, dir, MML_LAYOUT_AUTO, &err) == MML_ECONFIG);
  CHECK_EQ_INT(ix.nshards, 0);
  unlink(fifo);
  rmdir(dir);
}
