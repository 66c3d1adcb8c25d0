/*
 * dsindex_build.c — building a shard's dataset index (mml/dsindex.h) with a loader's
 * own machinery: its scan of the shard (offsets), its record parser and path policy,
 * each source's vision settings and chat template, and its fetcher for remote records
 * and images.  Only image headers are read (the first MML_DSX_HEAD_BYTES of a file,
 * member or object: a ranged GET when remote; the whole image only when its header
 * lies further in, e.g. a TIFF's first IFD at the end, or when it is a multi-scan JPEG
 * whose scans max_jpeg_scans limits: measure.c DESIGN 7), also of every frame of a
 * frame-list video; a video file is opened and probed as the loader's plan stage does
 * (container index or a demux-only pass: ranged reads through the fetcher when remote,
 * a WebDataset member's bytes); nothing is decoded.
 *
 * DESIGN
 *   Threads: `nthreads` workers take chunks of CHUNK consecutive samples (a counter
 *   under mu) and plan them with per-thread scratch; the calling thread writes finished
 *   chunks strictly in order to the partial file "<out>.partial" (the header, then one
 *   entry per sample), reports progress and polls the caller's callback (which may stop
 *   the build).  So the partial file is always a prefix of the shard's entries: a build
 *   that is interrupted (stopped, killed) resumes after the last complete entry, if the
 *   shard and settings are still those in the partial header; else it starts over.  At
 *   the end the whole index is serialised, written to a temporary file and renamed over
 *   `out` (readers never see a torn index), and the partial file is removed.
 *   Stopping (the callback, an error, the loader's close: ARCHITECTURE 4.8): the writer
 *   sets b->cancel before joining; workers check it between samples, and their fetches
 *   and video probes check it too (ld_measurer.cancel), so the build returns within a
 *   fraction of a second whatever a worker is reading.  A chunk they leave unfinished is
 *   never written (the partial file stays a prefix).
 *   Memory: entries of the whole shard (20 bytes a sample plus 12 an image or video) and
 *   chunks in flight, plus per worker one header buffer per frame of its record's videos
 *   and one open video file at a time (mml/video.h: a few I/O blocks).
 *
 * A sample's status and counts are what the loader's worker finds before decoding: each
 * worker measures with measure.c's ld_measure (headers only, videos as float32), which
 * feeds mml_sample_measure, the function the loader's workers plan with (measure.c
 * DESIGN 1-5): same parser options, media references, path policy, per-image budgets,
 * limits and template; then mml_sample_check_target, the part of mml_sample_check that
 * does not need max_length (no trainable turn: MML_ENOTARGET; it depends on the template,
 * label mode and recipe, all in the settings key), max_length and max_sample_pixel_bytes
 * (its bytes from the tokens and the pixel format: mml_sample_pixel_bytes) being applied
 * when the counts are used (loader_dsindex.c).  So an index-based global plan equals the planning pass's on every
 * sample (MML_DSX_STATUSES; tests/test_dsindex_agree.py, tests/c test-dsindex.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loader_int.h"

enum { CHUNK = 256 };

typedef struct chunk {
  mml_dsx_sample s[CHUNK];
  mml_dsx_image *imgs;
  int64_t nimgs, cap;
  uint64_t bytes;
  int done;
  mml_status first_st[8]; /* up to 8 example failures of this chunk, with messages */
  mml_err first_err[8];
  int nfirst;
} chunk;

typedef struct build {
  mml_loader *L;
  int shard;
  const mml_index_shard *sh;
  int64_t start, n; /* samples [start, n) of the shard are planned now */
  chunk *chunks;
  int64_t nchunks, next;
  int stop;
  mml_cancel cancel; /* set when the build stops: workers leave their sample at once */
  pthread_mutex_t mu;
  pthread_cond_t cv;
} build;

typedef struct bworker {
  build *b;
  ld_measurer m; /* headers only, videos as float32 (measure.c DESIGN 4, 5) */
} bworker;

/* Room for n more index entries of images and videos on chunk c. */
static mml_status chunk_fit(chunk *c, int64_t n, mml_err *err) {
  if (c->nimgs + n <= c->cap) return MML_OK;
  int64_t nc = c->cap ? c->cap * 2 : 2 * CHUNK;
  while (nc < c->nimgs + n) nc *= 2;
  mml_dsx_image *p = realloc(c->imgs, (size_t)nc * sizeof *p);
  if (!p) return mml_err_set(err, MML_ENOMEM, "out of memory");
  c->imgs = p;
  c->cap = nc;
  return MML_OK;
}

/* Measures shard sample k (ld_measure: what the loader's worker finds before decoding)
 * into *out and its images and videos onto chunk c. */
static mml_status plan_sample(bworker *w, int64_t k, mml_dsx_sample *out, chunk *c, mml_err *err) {
  ld_measurer *m = &w->m;
  m->bytes = 0;
  mml_status st = ld_measure(m, w->b->sh->first + k, err);
  c->bytes += m->bytes;
  if (!st) st = mml_sample_check_target(&m->s, err); /* max_length: where counts are used */
  if (st) return st;
  const int n = m->rec.nimages, nv = m->rec.nvideos;
  int64_t text = (int64_t)m->s.input_ids.len - m->s.vision_tokens;
  if (n + nv > UINT16_MAX || nv > UINT8_MAX || text < 0 || text > UINT32_MAX)
    return mml_err_set(err, MML_EINTERNAL,
                       "%d images, %d videos, %lld text tokens: beyond the index format", n, nv,
                       (long long)text);
  for (int v = 0; v < nv; v++)
    if (m->vplans[v].tokens > UINT32_MAX)
      return mml_err_set(err, MML_EINTERNAL, "video %d: %lld tokens: beyond the index format", v,
                         (long long)m->vplans[v].tokens);
  if ((st = chunk_fit(c, n + nv, err))) return st;
  for (int i = 0; i < n; i++)
    c->imgs[c->nimgs++] = (mml_dsx_image){(uint32_t)m->plans[i].src_w, (uint32_t)m->plans[i].src_h,
                                          (uint32_t)m->plans[i].tokens};
  for (int v = 0; v < nv; v++) /* videos after the images */
    c->imgs[c->nimgs++] = (mml_dsx_image){
        (uint32_t)m->vplans[v].src_w, (uint32_t)m->vplans[v].src_h, (uint32_t)m->vplans[v].tokens};
  out->text_tokens = (uint32_t)text;
  out->nimages = (uint16_t)(n + nv);
  out->nvideos = (uint8_t)nv;
  return MML_OK;
}

static void run_chunk(bworker *w, int64_t ci) {
  build *b = w->b;
  chunk *c = &b->chunks[ci];
  int64_t k0 = b->start + ci * CHUNK, k1 = k0 + CHUNK < b->n ? k0 + CHUNK : b->n;
  for (int64_t k = k0; k < k1 && !mml_cancelled(&b->cancel); k++) {
    mml_dsx_sample *s = &c->s[k - k0];
    memset(s, 0, sizeof *s);
    mml_err err;
    mml_err_clear(&err);
    mml_status st = plan_sample(w, k, s, c, &err);
    if (!st) continue;
    s->status = (uint8_t)(st < 255 ? st : 255);
    s->text_tokens = 0;
    s->nimages = 0;
    s->nvideos = 0;
    if (c->nfirst < 8) {
      char where[1100];
      int shard;
      int64_t off, len, line;
      mml_index_locate(&b->L->ix, b->sh->first + k, &shard, &off, &len, &line);
      mml_index_name_sample(&b->L->ix, shard, b->sh->first + k, line, where, sizeof where);
      if (!err.msg[0]) mml_err_set(&err, st, "%s", mml_status_message(st));
      mml_err_prefix(&err, "%s", where);
      c->first_st[c->nfirst] = st;
      c->first_err[c->nfirst++] = err;
    }
  }
}

static void *worker_main(void *arg) {
  bworker *w = arg;
  build *b = w->b;
  for (;;) {
    pthread_mutex_lock(&b->mu);
    int64_t ci = b->stop || b->next >= b->nchunks ? -1 : b->next++;
    pthread_mutex_unlock(&b->mu);
    if (ci < 0) break;
    run_chunk(w, ci);
    pthread_mutex_lock(&b->mu);
    b->chunks[ci].done = 1;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
  }
  return NULL;
}

/* ---- the partial file and the result ------------------------------------------------ */

typedef struct result {
  mml_dsx_sample *s;
  int64_t n, ncap;
  mml_dsx_image *img;
  int64_t nimg, icap;
} result;

static mml_status result_add(result *r, const mml_dsx_sample *s, int64_t n,
                             const mml_dsx_image *img, int64_t nimg) {
  if (r->n + n > r->ncap) {
    int64_t nc = r->ncap ? r->ncap : 4096;
    while (nc < r->n + n) nc *= 2;
    void *p = realloc(r->s, (size_t)nc * sizeof *r->s);
    if (!p) return MML_ENOMEM;
    r->s = p;
    r->ncap = nc;
  }
  if (r->nimg + nimg > r->icap) {
    int64_t nc = r->icap ? r->icap : 4096;
    while (nc < r->nimg + nimg) nc *= 2;
    void *p = realloc(r->img, (size_t)nc * sizeof *r->img);
    if (!p) return MML_ENOMEM;
    r->img = p;
    r->icap = nc;
  }
  if (n) memcpy(r->s + r->n, s, (size_t)n * sizeof *s);
  if (nimg) memcpy(r->img + r->nimg, img, (size_t)nimg * sizeof *img);
  r->n += n;
  r->nimg += nimg;
  return MML_OK;
}

static mml_status write_all(int fd, const void *p, size_t n, const char *path, mml_err *err) {
  const uint8_t *d = p;
  while (n) {
    ssize_t w = write(fd, d, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return mml_err_set(err, MML_EIO, "cannot write %s: %s", path, strerror(errno));
    d += w, n -= (size_t)w;
  }
  return MML_OK;
}

static int same_identity(const mml_dsx *a, const mml_dsx *b) {
  return a->shard_size == b->shard_size && a->shard_mtime_ns == b->shard_mtime_ns &&
         a->key == b->key && !strcmp(a->etag, b->etag) && a->layout == b->layout &&
         a->compression == b->compression && a->data_end == b->data_end &&
         !strcmp(a->settings ? a->settings : "", b->settings ? b->settings : "");
}

/* Opens the partial file for appending: its complete entries (when it describes this
 * shard and settings) into r, else a fresh one with the header. */
static mml_status open_partial(const char *ppath, const mml_dsx *id, int64_t count, result *r,
                               int *fd_out, mml_err *err) {
  mml_bytes old = {0};
  size_t used = 0;
  int keep = 0;
  if (mml_read_file(ppath, 0, -1, &old, NULL) == MML_OK) {
    mml_dsx p;
    mml_err e2;
    if (mml_dsx_partial_parse(old.data, old.len, ppath, &p, &used, &e2) == MML_OK) {
      keep = same_identity(&p, id) && p.n <= count;
      if (keep && result_add(r, p.samples, p.n, p.images, p.nimages)) keep = 0;
      mml_dsx_free(&p);
    }
  }
  mml_bytes_free(&old);
  int fd = open(ppath, O_WRONLY | O_CREAT | O_CLOEXEC | (keep ? 0 : O_TRUNC), 0644);
  if (fd < 0) return mml_err_set(err, MML_EIO, "cannot write %s: %s", ppath, strerror(errno));
  mml_status st = MML_OK;
  if (keep) {
    if (ftruncate(fd, (off_t)used) != 0 || lseek(fd, 0, SEEK_END) < 0)
      st = mml_err_set(err, MML_EIO, "cannot write %s: %s", ppath, strerror(errno));
  } else {
    r->n = r->nimg = 0;
    uint8_t h[MML_DSX_HEADER];
    mml_dsx_partial_header(id, h);
    static const uint8_t zero[8];
    size_t ne = strlen(id->etag), ns = strlen(id->settings);
    st = write_all(fd, h, sizeof h, ppath, err);
    if (!st) st = write_all(fd, id->etag, ne, ppath, err);
    if (!st) st = write_all(fd, zero, (8 - ne % 8) % 8, ppath, err);
    if (!st) st = write_all(fd, id->settings, ns, ppath, err);
    if (!st) st = write_all(fd, zero, (8 - ns % 8) % 8, ppath, err);
  }
  if (st)
    close(fd);
  else
    *fd_out = fd;
  return st;
}

/* Chunk c's entries appended to the partial file (each with its checksum) and to r. */
static mml_status flush_chunk(const chunk *c, int64_t nsamples, int fd, const char *ppath,
                              result *r, mml_bytes *buf, mml_err *err) {
  mml_bytes_clear(buf);
  int64_t im = 0;
  for (int64_t i = 0; i < nsamples; i++) {
    uint64_t h = mml_dsx_entry_hash(r->n + i, &c->s[i], c->s[i].nimages ? c->imgs + im : NULL);
    mml_status st = mml_bytes_append(buf, &c->s[i], sizeof c->s[i]);
    if (!st && c->s[i].nimages)
      st = mml_bytes_append(buf, c->imgs + im, (size_t)c->s[i].nimages * sizeof *c->imgs);
    if (!st) st = mml_bytes_append(buf, &h, sizeof h);
    if (st) return mml_err_set(err, MML_ENOMEM, "out of memory");
    im += c->s[i].nimages;
  }
  mml_status st = write_all(fd, buf->data, buf->len, ppath, err);
  if (!st && result_add(r, c->s, nsamples, c->imgs, c->nimgs))
    st = mml_err_set(err, MML_ENOMEM, "out of memory");
  return st;
}

static void summarize(const result *r, int64_t resumed, mml_index_summary *sum) {
  sum->samples = r->n;
  sum->resumed = resumed;
  int64_t im = 0;
  for (int64_t i = 0; i < r->n; i++) {
    const mml_dsx_sample *s = &r->s[i];
    sum->by_status[s->status < MML_STATUS_COUNT ? s->status : MML_EINTERNAL]++;
    if (s->status) continue;
    sum->good++;
    sum->text_tokens += s->text_tokens;
    const int nv = s->nvideos < s->nimages ? s->nvideos : s->nimages, ni = s->nimages - nv;
    for (int j = 0; j < ni; j++) {
      uint32_t t = r->img[im + j].tokens;
      int bk = 0;
      while (bk < 31 && (t >> (bk + 1))) bk++;
      sum->image_token_hist[bk]++;
      sum->image_tokens += t;
      sum->images++;
    }
    for (int j = ni; j < s->nimages; j++) sum->video_tokens += r->img[im + j].tokens;
    sum->videos += nv;
    im += s->nimages;
  }
}

/* 1 when `out` already is this shard's index under these settings (its entries into r). */
static int up_to_date(const char *out, const mml_dsx *id, int64_t count, result *r) {
  mml_bytes b = {0};
  int ok = 0;
  if (mml_read_file(out, 0, -1, &b, NULL) == MML_OK) {
    mml_dsx x;
    if (mml_dsx_parse(b.data, b.len, out, &x, NULL) == MML_OK) {
      ok = same_identity(&x, id) && x.n == count &&
           result_add(r, x.samples, x.n, x.images, x.nimages) == MML_OK;
      mml_dsx_free(&x);
    }
  }
  mml_bytes_free(&b);
  return ok;
}

/* The finished index: identity, the loader's offsets for the shard, the entries. */
static mml_status finish(build *b, const mml_dsx *id, const result *r, const char *out,
                         mml_err *err) {
  const mml_index_shard *sh = b->sh;
  mml_dsx x = *id;
  x.n = r->n;
  x.nimages = r->nimg;
  x.offsets = b->L->ix.offsets + sh->first;
  x.samples = r->s;
  x.images = r->img;
  if (mml_index_blank_lines(sh, &x.blank_lines, &x.nblank))
    return mml_err_set(err, MML_ENOMEM, "out of memory listing %lld blank lines",
                       (long long)sh->nblank);
  x.members = sh->members;
  x.nmembers = sh->nmembers;
  x.names = sh->names;
  x.names_len = (int64_t)sh->names_len;
  mml_bytes bytes = {0};
  mml_status st = mml_dsx_serialize(&x, &bytes, err);
  if (!st) st = mml_dsx_write_file(out, bytes.data, bytes.len, err);
  mml_bytes_free(&bytes);
  free(x.blank_lines);
  return st;
}

static mml_status cancelled(const build *b, const result *r, mml_err *err) {
  return mml_err_set(err, MML_ECANCELLED,
                     "index build of %s stopped after %lld of %lld samples (resumable)",
                     b->sh->path, (long long)r->n, (long long)b->n);
}

/* Waits (b->mu held) until chunk c is done, asking cb every 200 ms whether to stop. */
static mml_status wait_chunk(build *b, const chunk *c, const result *r, mml_index_progress_fn cb,
                             void *ctx, mml_err *err) {
  while (!c->done) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 200 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&b->cv, &b->mu, &ts);
    if (c->done) break;
    pthread_mutex_unlock(&b->mu);
    int stop = cb && cb(ctx, r->n, b->n);
    pthread_mutex_lock(&b->mu);
    if (stop) return cancelled(b, r, err);
  }
  return MML_OK;
}

static void free_workers(bworker *ws, int nthreads) {
  for (int i = 0; ws && i < nthreads; i++) ld_measurer_free(&ws[i].m);
  free(ws);
}

/* Runs the workers over samples [start, n) and the writer; returns with them joined. */
static mml_status run(build *b, int nthreads, int fd, const char *ppath, result *r,
                      mml_index_progress_fn cb, void *ctx, mml_index_summary *sum, mml_err *err) {
  mml_status st = MML_OK;
  b->nchunks = (b->n - b->start + CHUNK - 1) / CHUNK;
  b->chunks = calloc((size_t)(b->nchunks ? b->nchunks : 1), sizeof *b->chunks);
  bworker *ws = calloc((size_t)nthreads, sizeof *ws);
  pthread_t *th = calloc((size_t)nthreads, sizeof *th);
  int started = 0;
  if (!b->chunks || !ws || !th) st = mml_err_set(err, MML_ENOMEM, "out of memory");
  for (int i = 0; !st && i < nthreads; i++) {
    ws[i].b = b;
    if ((st = ld_measurer_init(&ws[i].m, b->L, MML_DSX_HEAD_BYTES, 1, err))) break;
    ws[i].m.cancel = &b->cancel;
    if (pthread_create(&th[i], NULL, worker_main, &ws[i]))
      st = mml_err_set(err, MML_ENOMEM, "cannot start index thread %d", i);
    else
      started++;
  }
  mml_bytes buf = {0};
  double last = 0;
  for (int64_t ci = 0; !st && ci < b->nchunks; ci++) {
    chunk *c = &b->chunks[ci];
    pthread_mutex_lock(&b->mu);
    st = wait_chunk(b, c, r, cb, ctx, err);
    pthread_mutex_unlock(&b->mu);
    if (!st && mml_cancelled(&b->cancel)) st = cancelled(b, r, err); /* c may be cut short */
    if (st) break;
    int64_t k0 = b->start + ci * CHUNK, k1 = k0 + CHUNK < b->n ? k0 + CHUNK : b->n;
    st = flush_chunk(c, k1 - k0, fd, ppath, r, &buf, err);
    sum->bytes_read += c->bytes;
    for (int i = 0; i < c->nfirst; i++) {
      mml_status s = c->first_st[i];
      if (s < MML_STATUS_COUNT && !sum->example[s][0])
        snprintf(sum->example[s], sizeof sum->example[s], "%s", c->first_err[i].msg);
    }
    free(c->imgs);
    c->imgs = NULL;
    double now = mml_now();
    if (cb && now - last > 0.2) {
      last = now;
      if (cb(ctx, r->n, b->n)) st = cancelled(b, r, err);
    }
  }
  mml_bytes_free(&buf);
  mml_cancel_set(&b->cancel); /* a worker inside a sample (a fetch, a video pass) leaves it */
  pthread_mutex_lock(&b->mu);
  b->stop = 1;
  pthread_mutex_unlock(&b->mu);
  for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
  free_workers(ws, nthreads);
  for (int64_t ci = 0; b->chunks && ci < b->nchunks; ci++) free(b->chunks[ci].imgs);
  free(b->chunks);
  free(th);
  return st;
}

mml_status mml_loader_build_index(mml_loader *L, int shard, const char *out, int nthreads,
                                  mml_index_progress_fn cb, void *ctx, mml_index_summary *sum,
                                  mml_err *err) {
  memset(sum, 0, sizeof *sum);
  double t0 = mml_now();
  if (shard < 0 || shard >= L->ix.nshards)
    return mml_err_set(err, MML_EINVAL, "no shard %d (the loader has %d)", shard, L->ix.nshards);
  if (nthreads < 1) nthreads = 1;
  const mml_index_shard *sh = &L->ix.shards[shard];
  const ld_source *src = &L->src[L->shard_src[shard]];
  mml_dsx id = {0};
  mml_status st = ld_shard_identity(L, sh->path, &id.shard_size, &id.shard_mtime_ns, id.etag,
                                    sizeof id.etag, err);
  if (st) return st;
  if (id.shard_size != sh->size)
    return mml_err_set(err, MML_ECONFIG,
                       "data shard %s changed while it was indexed (%lld "
                       "bytes, scanned %lld)",
                       sh->path, (long long)id.shard_size, (long long)sh->size);
  id.key = src->index_key;
  id.settings = src->index_settings;
  id.layout = sh->layout;
  id.compression = sh->compression;
  id.data_end = sh->data_end;
  size_t pl = strlen(out);
  char *ppath = malloc(pl + 9);
  if (!ppath) return mml_err_set(err, MML_ENOMEM, "out of memory");
  memcpy(ppath, out, pl);
  memcpy(ppath + pl, ".partial", 9);
  result r = {0};
  if (up_to_date(out, &id, sh->count, &r)) { /* a finished index of this shard and settings */
    summarize(&r, r.n, sum);
    sum->up_to_date = 1;
    sum->seconds = mml_now() - t0;
    free(r.s);
    free(r.img);
    free(ppath);
    return MML_OK;
  }
  int fd = -1;
  build b = {.L = L, .shard = shard, .sh = sh, .n = sh->count, .cancel = {0, &L->cancel}};
  pthread_mutex_init(&b.mu, NULL);
  pthread_cond_init(&b.cv, NULL);
  st = open_partial(ppath, &id, sh->count, &r, &fd, err);
  if (!st) {
    b.start = r.n;
    st = run(&b, nthreads, fd, ppath, &r, cb, ctx, sum, err);
    if (close(fd) != 0 && !st)
      st = mml_err_set(err, MML_EIO, "cannot write %s: %s", ppath, strerror(errno));
  }
  if (!st) st = finish(&b, &id, &r, out, err);
  if (!st) unlink(ppath);
  summarize(&r, b.start, sum);
  sum->seconds = mml_now() - t0;
  pthread_mutex_destroy(&b.mu);
  pthread_cond_destroy(&b.cv);
  free(r.s);
  free(r.img);
  free(ppath);
  return st;
}

int mml_loader_num_shards(const mml_loader *L) { return L->ix.nshards; }

const char *mml_loader_shard_path(const mml_loader *L, int shard) {
  return shard >= 0 && shard < L->ix.nshards ? L->ix.shards[shard].path : NULL;
}

int mml_loader_index_used(const mml_loader *L) { return L->index_used; }
