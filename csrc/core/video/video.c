/*
 * video.c — probe and sparse decode of one video with libavformat/libavcodec/libswscale
 * (contract and design: mml/video.h).
 *
 * Open: a custom AVIOContext over the byte source (video_io.c), avformat_open_input +
 * avformat_find_stream_info (as PyAV opens a file, so fps and sizes agree), the first
 * video stream that is not cover art, its decoder (threads bounded by src->threads).
 * Then the frame table: tab[i] = presentation timestamp of frame i (sorted), keys[] =
 * timestamps of keyframes (sorted).  mp4/mov: from the demuxer's sample index (no packet
 * read); the index holds decode timestamps, so tab[i] = dts_i + (start_time - dts_0),
 * which is exact for constant frame durations and for streams without reordering; a
 * frame the decoder contradicts rebuilds the table from packets (exact) and decode goes
 * on from there.  Other containers: one demux-only pass over the packets, which for a
 * remote source also keeps each packet's place (pts, byte range; v->pk), so a decode's
 * byte ranges can be preloaded there as from an mp4's index (decode_ranges).
 *
 * Decode of sorted indices: for frame i with timestamp T, seek (av_seek_frame BACKWARD,
 * decoder flushed) when the decoder is not already before T with no keyframe in between;
 * decode forward, dropping earlier frames unconverted; deliver the frame whose pts is T
 * converted to RGB24.  On the way, a packet whose frame no other frame references (h264,
 * vp9, MPEG-1/2/4: AVDISCARD_NONREF) and that is not wanted is not decoded at all.
 * When a seek comes next anyway (a keyframe lies between T and the next wanted frame, or T
 * is the last) and a packet is known to hold a whole frame (mp4/mov samples of h264, hevc,
 * vp9, av1), the decoder is drained right after T's packet: frames decode in packet order,
 * so T's frame is complete then, and the packets the decoder would otherwise take in for
 * its reordering delay (decoded, then flushed by the seek) are never decoded.
 * Landing past T right after a seek (a keyframe whose decode time
 * precedes T while its presentation follows it, open-GOP leading frames) steps back one
 * keyframe and tries again.
 *
 * Idle (mml_video_idle, between a probe and a decode): the I/O blocks, the packets
 * avformat_find_stream_info read ahead and the decoder, which has decoded nothing yet, are
 * freed (h264's context alone is ~0.8 MiB; the decode opens a fresh one, as it had), so an
 * idle video holds its demuxer state and frame tables: mml_video_held_bytes.
 *
 * Cancellation (src->cancel, ARCHITECTURE 4.8): the byte source's read callback, the
 * demuxer's interrupt callback (avformat_find_stream_info checks it per packet) and the
 * packet loops (the table pass, the decode) check it, so an open, a packet pass over a
 * long file or a decode through a long GOP stops within one packet's work; the failure is
 * the source's (io.st = MML_ECANCELLED), so av_fail reports it as such.
 *
 * Ownership: everything hangs off the mml_video and is freed by mml_video_close.  Threads:
 * none created (decoder threads only when src->threads > 1); one mml_video is used by one
 * thread at a time.  FFmpeg's log is set to quiet once (pthread_once).
 */
#include "mml/video.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/display.h>
#include <libavutil/imgutils.h>
#include <libavutil/pixdesc.h>
#include <libswscale/swscale.h>

#include "video_io.h"

#define IO_BUF (64 << 10)
#define MAX_STEPBACK 6
/* mml_video_held_bytes: an open idle video's contexts (format, stream, codec with its
 * private state: h264's is the largest, ~70 KiB; swscale and the RGB frame come with the
 * decode), and per index entry the demuxer's AVIndexEntry plus an mp4/mov's own sample
 * tables (sizes, offsets, timestamps).  Measured upper bounds (tests/c test-video.c). */
#define VIDEO_HELD_BASE ((int64_t)192 << 10)
#define VIDEO_HELD_PER_ENTRY 64
/* "before the first frame": INT64_MIN overflows inside the mov demuxer's seek */
#define START_TS (-((int64_t)1 << 40))

struct mml_video {
  char *name;
  mml_vio io;
  AVIOContext *avio;
  AVFormatContext *fmt;
  AVCodecContext *dec;
  AVStream *st;
  int si;
  AVPacket *pkt;
  AVFrame *frm;
  struct SwsContext *sws;
  int sws_w, sws_h, sws_fmt, sws_cs, sws_range;
  uint8_t *rgb;
  size_t rgb_cap, rgb_stride;
  int rgb_w, rgb_h;
  int64_t *tab, *keys;
  int64_t n, nkeys;
  /* a remote source's packets as the pass over them met them (file order; table from
   * packets only): what a decode reads, for its preload (decode_ranges) */
  struct vpacket {
    int64_t pts, pos, end;
  } * pk;
  int64_t npk, *kpk, nkpk; /* kpk: the keyframes' indices in pk, by pts (-1 npk: none) */
  int64_t table_bytes;     /* malloc'd for tab, keys, pk and kpk */
  int64_t shift;           /* tab = index timestamp + shift (table_from_index) */
  int exact;               /* tab from packets */
  int ordinal;      /* packets without pts: frame i is the i-th out of a decode from the start */
  int64_t ord;      /* frames out since the start (ordinal mode) */
  int positioned;   /* the decoder runs forward from a seek or the start */
  int after_seek;   /* no frame out since the last seek */
  int draining;     /* demuxer at its end, decoder flushed */
  int64_t last_pts; /* pts of the last frame out */
  int64_t decoded;  /* frames out of the decoder so far (tests, benchmarks) */
  int64_t sent;     /* packets into the decoder so far (tests, benchmarks) */
  int64_t max_pixels;
  int plain_rgb;       /* mml_video_src.plain_rgb */
  int threads;         /* the decoder's */
  int skip_nonref;     /* the codec drops non-reference frames exactly (h264, vp9, mpeg2/4) */
  int whole_packets;   /* mp4/mov with h264/hevc/vp9/av1: one packet holds one whole frame */
  int cut_short;       /* the decoder was drained right after a wanted frame's packet */
  const int64_t *want; /* this decode's indices, from want_k on still to come */
  int want_n, want_k;
  mml_video_info info;
};

static void quiet_log(void) { av_log_set_level(AV_LOG_QUIET); }

static mml_status av_fail(mml_video *v, mml_status st, int r, const char *what, mml_err *err) {
  if (v->io.st) { /* the byte source failed: that is the cause */
    if (err) *err = v->io.err;
    return v->io.st;
  }
  if (r == AVERROR(ENOMEM))
    return mml_err_set(err, MML_ENOMEM, "%s: %s: out of memory", v->name, what);
  char buf[AV_ERROR_MAX_STRING_SIZE] = {0};
  av_strerror(r, buf, sizeof buf);
  return mml_err_set(err, st, "%s: %s: %s", v->name, what, buf);
}

static int interrupted(void *opaque) { return mml_vio_cancelled(opaque); }

static int cmp64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

static mml_status grow(int64_t **p, int64_t *cap, int64_t need) {
  if (need <= *cap) return MML_OK;
  int64_t c = *cap ? *cap * 2 : 1024;
  while (c < need) c *= 2;
  int64_t *q = realloc(*p, (size_t)c * sizeof **p);
  if (!q) return MML_ENOMEM;
  *p = q;
  *cap = c;
  return MML_OK;
}

/* ---- the frame table ---------------------------------------------------------------- */

/* Room for one more packet in v->pk (*cap of them); 1 when out of memory. */
static int grow_pk(mml_video *v, int64_t *cap) {
  if (v->npk < *cap) return 0;
  int64_t c = *cap ? *cap * 2 : 1024;
  struct vpacket *q = realloc(v->pk, (size_t)c * sizeof *q);
  if (!q) return 1;
  v->pk = q;
  *cap = c;
  return 0;
}

/* mp4/mov: every sample is in the index (decode timestamps). 1 when used. */
static int table_from_index(mml_video *v) {
  if (!strstr(v->fmt->iformat->name, "mov")) return 0;
  int cnt = avformat_index_get_entries_count(v->st);
  if (cnt <= 0) return 0;
  v->tab = malloc((size_t)cnt * sizeof *v->tab);
  v->keys = malloc((size_t)cnt * sizeof *v->keys);
  if (!v->tab || !v->keys) return 0;
  v->table_bytes = 2 * (int64_t)cnt * (int64_t)sizeof *v->tab;
  v->n = v->nkeys = 0;
  for (int i = 0; i < cnt; i++) {
    const AVIndexEntry *e = avformat_index_get_entry(v->st, i);
    if (!e || (e->flags & AVINDEX_DISCARD_FRAME)) continue;
    v->tab[v->n++] = e->timestamp;
    if (e->flags & AVINDEX_KEYFRAME) v->keys[v->nkeys++] = e->timestamp;
  }
  if (!v->n) return 0;
  qsort(v->tab, (size_t)v->n, sizeof *v->tab, cmp64);
  int64_t shift = v->st->start_time != AV_NOPTS_VALUE ? v->st->start_time - v->tab[0] : 0;
  for (int64_t i = 0; i < v->n; i++) v->tab[i] += shift;
  for (int64_t i = 0; i < v->nkeys; i++) v->keys[i] += shift;
  v->shift = shift;
  v->exact = 0;
  return 1;
}

static mml_status seek_to(mml_video *v, int64_t ts, mml_err *err);

/* Every other container (and a contradicted mp4 index): one pass over the packets. */
static mml_status table_from_packets(mml_video *v, int rewind, mml_err *err) {
  if (rewind) {
    mml_status st = seek_to(v, START_TS, err);
    if (st) return st;
  }
  int64_t cap = 0, kcap = 0, pcap = 0, kpcap = 0, rest[2] = {v->io.pos, v->io.size};
  mml_vio_will_read(&v->io, rest, 1); /* the pass reads the rest of the file */
  free(v->tab);
  free(v->keys);
  free(v->pk);
  free(v->kpk);
  v->tab = v->keys = v->kpk = NULL;
  v->pk = NULL;
  v->n = v->nkeys = v->npk = v->nkpk = 0;
  int where = v->io.fetcher != NULL; /* remote: each packet's place, for preloads */
  int r = 0;
  while (!mml_vio_cancelled(&v->io) && (r = av_read_frame(v->fmt, v->pkt)) >= 0) {
    AVPacket *p = v->pkt;
    if (p->stream_index == v->si && !(p->flags & AV_PKT_FLAG_DISCARD)) {
      if (p->pts == AV_NOPTS_VALUE) v->ordinal = 1;
      int64_t ts = p->pts;
      if (grow(&v->tab, &cap, v->n + 1) || grow(&v->keys, &kcap, v->nkeys + 1)) {
        av_packet_unref(p);
        return mml_err_set(err, MML_ENOMEM, "%s: out of memory for the frame table", v->name);
      }
      v->tab[v->n++] = ts;
      if (p->flags & AV_PKT_FLAG_KEY) v->keys[v->nkeys++] = ts;
      if (where && p->pos >= 0 && p->pts != AV_NOPTS_VALUE) {
        if (grow_pk(v, &pcap) ||
            ((p->flags & AV_PKT_FLAG_KEY) && grow(&v->kpk, &kpcap, v->nkpk + 1))) {
          where = 0; /* no preload then: the decode reads on demand */
        } else {
          if (p->flags & AV_PKT_FLAG_KEY) v->kpk[v->nkpk++] = v->npk;
          v->pk[v->npk++] = (struct vpacket){ts, p->pos, p->pos + p->size};
        }
      } else {
        where = 0;
      }
    }
    av_packet_unref(p);
  }
  if (!where || v->npk != v->n) v->npk = v->nkpk = 0; /* a packet's place unknown: none */
  for (int64_t k = 1; k < v->nkpk; k++)               /* keyframes come in presentation order */
    if (v->pk[v->kpk[k]].pts <= v->pk[v->kpk[k - 1]].pts) v->npk = v->nkpk = 0;
  if (v->io.st) return av_fail(v, MML_EVIDEOCORRUPT, r, "reading packets", err);
  /* a read error after some packets: a cut-off file; its readable frames are the table */
  if (!v->n) return av_fail(v, MML_EVIDEOCORRUPT, r, "no video packets", err);
  if (v->ordinal) { /* no presentation times to go by (AVI with B-frames): count frames */
    if (grow(&v->keys, &kcap, 1)) return mml_err_set(err, MML_ENOMEM, "%s: out of memory", v->name);
    for (int64_t i = 0; i < v->n; i++) v->tab[i] = i;
    v->keys[0] = 0;
    v->nkeys = 1;
  }
  v->table_bytes =
      (cap + kcap + kpcap) * (int64_t)sizeof(int64_t) + pcap * (int64_t)sizeof(struct vpacket);
  qsort(v->tab, (size_t)v->n, sizeof *v->tab, cmp64);
  qsort(v->keys, (size_t)v->nkeys, sizeof *v->keys, cmp64);
  v->exact = 1;
  v->positioned = 0;
  return MML_OK;
}

/* ---- open --------------------------------------------------------------------------- */

static int rotation_of(AVStream *st) {
  const uint8_t *m = av_stream_get_side_data(st, AV_PKT_DATA_DISPLAYMATRIX, NULL);
  if (!m) return 0;
  double t = -round(av_display_rotation_get((const int32_t *)m));
  if (isnan(t)) return 0;
  t -= 360 * floor(t / 360);
  return ((int)t + 45) / 90 * 90 % 360;
}

/* The stream's decoder, opened (at the open, so a probe fails on a codec it cannot decode;
 * again at a decode after mml_video_idle closed it). */
static mml_status open_decoder(mml_video *v, mml_err *err) {
  const AVCodecParameters *par = v->st->codecpar;
  const AVCodec *codec = avcodec_find_decoder(par->codec_id);
  const char *cname = avcodec_get_name(par->codec_id);
  if (!codec)
    return mml_err_set(err, MML_EVIDEOCODEC, "%s: no decoder for codec %s", v->name, cname);
  if (!(v->dec = avcodec_alloc_context3(codec)))
    return mml_err_set(err, MML_ENOMEM, "%s: out of memory", v->name);
  int r;
  mml_status st = MML_OK;
  if ((r = avcodec_parameters_to_context(v->dec, par)) < 0) {
    st = av_fail(v, MML_EVIDEOCODEC, r, "decoder parameters", err);
  } else {
    v->dec->pkt_timebase = v->st->time_base;
    v->dec->thread_count = v->threads;
    v->dec->max_pixels = v->max_pixels; /* a frame growing past it mid-stream fails to decode */
    if ((r = avcodec_open2(v->dec, codec, NULL)) < 0)
      st = mml_err_set(err, MML_EVIDEOCODEC, "%s: cannot open the %s decoder", v->name, cname);
  }
  if (st) avcodec_free_context(&v->dec); /* (a decode opens it again) */
  return st;
}

static mml_status open_stream(mml_video *v, const mml_video_src *src, mml_err *err) {
  v->si = -1;
  for (unsigned i = 0; i < v->fmt->nb_streams; i++) {
    AVStream *s = v->fmt->streams[i];
    if (s->codecpar->codec_type == AVMEDIA_TYPE_VIDEO &&
        !(s->disposition & AV_DISPOSITION_ATTACHED_PIC)) {
      v->si = (int)i;
      break;
    }
  }
  if (v->si < 0)
    return mml_err_set(err, MML_EVIDEOCODEC, "%s: no video stream (%s)", v->name,
                       v->fmt->iformat->name);
  v->st = v->fmt->streams[v->si];
  for (unsigned i = 0; i < v->fmt->nb_streams; i++)
    if ((int)i != v->si) v->fmt->streams[i]->discard = AVDISCARD_ALL;
  const AVCodecParameters *par = v->st->codecpar;
  if (par->width <= 0 || par->height <= 0)
    return mml_err_set(err, MML_EVIDEOCORRUPT, "%s: video stream without a frame size", v->name);
  if ((int64_t)par->width * par->height > v->max_pixels)
    return mml_err_set(err, MML_ETOOBIG, "%s: video frames of %dx%d exceed the pixel limit (%lld)",
                       v->name, par->width, par->height, (long long)v->max_pixels);
  v->threads = src->threads > 1 ? src->threads : 1;
  /* decoders whose non-reference frames are never referenced by definition (h264
   * nal_ref_idc 0, vp9 frames refreshing no slot, MPEG-1/2/4 B-frames): those frames can
   * be left undecoded on the way to a wanted one; hevc's sub-layer non-reference pictures
   * may still be referenced from higher temporal layers, so hevc (and the rest) decode all */
  v->skip_nonref = par->codec_id == AV_CODEC_ID_H264 || par->codec_id == AV_CODEC_ID_VP9 ||
                   par->codec_id == AV_CODEC_ID_MPEG4 || par->codec_id == AV_CODEC_ID_MPEG2VIDEO ||
                   par->codec_id == AV_CODEC_ID_MPEG1VIDEO;
  v->whole_packets = strstr(v->fmt->iformat->name, "mov") &&
                     (par->codec_id == AV_CODEC_ID_H264 || par->codec_id == AV_CODEC_ID_HEVC ||
                      par->codec_id == AV_CODEC_ID_VP9 || par->codec_id == AV_CODEC_ID_AV1);
  return open_decoder(v, err);
}

static void fill_info(mml_video *v) {
  mml_video_info *in = &v->info;
  AVStream *s = v->st;
  in->width = s->codecpar->width;
  in->height = s->codecpar->height;
  in->rotation = rotation_of(s);
  AVRational fr =
      s->avg_frame_rate.num && s->avg_frame_rate.den ? s->avg_frame_rate : s->r_frame_rate;
  in->fps = fr.num && fr.den ? av_q2d(fr) : 0;
  in->nframes = v->n;
  double tb = av_q2d(s->time_base);
  in->duration_s = s->duration != AV_NOPTS_VALUE        ? s->duration * tb
                   : v->fmt->duration != AV_NOPTS_VALUE ? v->fmt->duration / (double)AV_TIME_BASE
                                                        : 0;
  in->start_s = v->n ? v->tab[0] * tb : 0;
  in->stream_frames = s->nb_frames > 0 ? s->nb_frames : 0;
  in->stream_duration_s = s->duration != AV_NOPTS_VALUE && s->time_base.den > 0
                              ? (double)(s->duration * s->time_base.num) / s->time_base.den
                              : 0;
  in->stream_avg_fps = s->avg_frame_rate.num > 0 && s->avg_frame_rate.den > 0
                           ? (double)s->avg_frame_rate.num / s->avg_frame_rate.den
                           : 0;
  snprintf(in->codec, sizeof in->codec, "%s", avcodec_get_name(s->codecpar->codec_id));
  snprintf(in->container, sizeof in->container, "%s", v->fmt->iformat->name);
  in->exact_index = v->exact;
  in->size = v->io.size;
}

mml_status mml_video_open(const mml_video_src *src, mml_video **out, mml_err *err) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, quiet_log);
  *out = NULL;
  if (!src || !src->name) return mml_err_set(err, MML_EINVAL, "video: no source");
  mml_video *v = calloc(1, sizeof *v);
  if (!v || !(v->name = strdup(src->name))) {
    free(v);
    return mml_err_set(err, MML_ENOMEM, "video: out of memory");
  }
  v->io.fd = -1;
  v->last_pts = INT64_MIN;
  v->max_pixels = src->max_pixels > 0 ? src->max_pixels : MML_VIDEO_MAX_PIXELS;
  v->plain_rgb = src->plain_rgb;
  mml_status st = mml_vio_open(&v->io, v->name, src->data, src->len, src->fetcher, src->max_bytes,
                               src->block, src->size, src->first, src->tail, src->tail_off, err);
  int r = 0;
  if (st) goto fail;
  v->io.cancel = src->cancel;
  uint8_t *buf = av_malloc(IO_BUF);
  v->avio =
      buf ? avio_alloc_context(buf, IO_BUF, 0, &v->io, mml_vio_read, NULL, mml_vio_seek) : NULL;
  v->fmt = avformat_alloc_context();
  v->pkt = av_packet_alloc();
  v->frm = av_frame_alloc();
  if (!v->avio || !v->fmt || !v->pkt || !v->frm) {
    if (!v->avio) av_free(buf);
    st = mml_err_set(err, MML_ENOMEM, "%s: out of memory", v->name);
    goto fail;
  }
  v->fmt->pb = v->avio;
  v->fmt->flags |= AVFMT_FLAG_CUSTOM_IO;
  v->fmt->interrupt_callback = (AVIOInterruptCB){interrupted, &v->io};
  if ((r = avformat_open_input(&v->fmt, v->name, NULL, NULL)) < 0) {
    v->fmt = NULL; /* freed by avformat_open_input on failure */
    st = av_fail(v, MML_EVIDEOCORRUPT, r, "not a readable video", err);
    goto fail;
  }
  if ((r = avformat_find_stream_info(v->fmt, NULL)) < 0) {
    st = av_fail(v, MML_EVIDEOCORRUPT, r, "reading stream info", err);
    goto fail;
  }
  if ((st = open_stream(v, src, err))) goto fail;
  if (!table_from_index(v) && (st = table_from_packets(v, 0, err))) goto fail;
  fill_info(v);
  *out = v;
  return MML_OK;
fail:
  mml_video_close(v);
  return st;
}

mml_status mml_video_probe(const mml_video *v, mml_video_info *info, mml_err *err) {
  if (!v || !info) return mml_err_set(err, MML_EINVAL, "video: NULL argument");
  *info = v->info;
  return MML_OK;
}

void mml_video_idle(mml_video *v) {
  if (!v) return;
  mml_vio_idle(&v->io);
  /* the packets avformat_find_stream_info read ahead (an mp4 opened from its index): a
   * decode seeks before its first read anyway (v->positioned is 0), which drops them too */
  if (v->fmt && !v->positioned) avformat_flush(v->fmt);
  /* and a decoder that has decoded nothing (its context is most of an open video's
   * memory: h264's ~0.8 MiB): the decode opens a fresh one, which is what it had */
  if (!v->positioned && !v->decoded && !v->sent) avcodec_free_context(&v->dec);
}

int64_t mml_video_held_bytes(const mml_video *v) {
  if (!v) return 0;
  int64_t idx = 0; /* every stream's index: an mp4's audio samples are indexed too */
  for (unsigned i = 0; v->fmt && i < v->fmt->nb_streams; i++)
    idx += avformat_index_get_entries_count(v->fmt->streams[i]);
  return VIDEO_HELD_BASE + IO_BUF + idx * VIDEO_HELD_PER_ENTRY + v->table_bytes;
}

int64_t mml_video_bytes_read(const mml_video *v) { return v ? v->io.bytes_read : 0; }

int64_t mml_video_frames_decoded(const mml_video *v) { return v ? v->decoded : 0; }

int64_t mml_video_packets_sent(const mml_video *v) { return v ? v->sent : 0; }

void mml_video_close(mml_video *v) {
  if (!v) return;
  sws_freeContext(v->sws);
  av_free(v->rgb);
  av_frame_free(&v->frm);
  av_packet_free(&v->pkt);
  avcodec_free_context(&v->dec);
  avformat_close_input(&v->fmt);
  if (v->avio) av_freep(&v->avio->buffer);
  avio_context_free(&v->avio);
  mml_vio_close(&v->io);
  free(v->tab);
  free(v->keys);
  free(v->pk);
  free(v->kpk);
  free(v->name);
  free(v);
}

/* ---- decode ------------------------------------------------------------------------- */

static mml_status seek_to(mml_video *v, int64_t ts, mml_err *err) {
  avcodec_flush_buffers(v->dec);
  int r = av_seek_frame(v->fmt, v->si, ts, AVSEEK_FLAG_BACKWARD);
  if (r < 0) r = avformat_seek_file(v->fmt, v->si, INT64_MIN, ts, ts, 0);
  if (r < 0 && ts == START_TS)
    r = av_seek_frame(v->fmt, v->si, 0, AVSEEK_FLAG_BYTE | AVSEEK_FLAG_BACKWARD);
  if (r < 0) return av_fail(v, MML_EVIDEOCORRUPT, r, "seek", err);
  v->positioned = 1;
  v->after_seek = 1;
  v->draining = 0;
  v->cut_short = 0;
  v->last_pts = INT64_MIN;
  v->ord = 0;
  return MML_OK;
}

/* Where to seek for keyframe number key (-1 or ordinal mode: the start). */
static int64_t key_ts(const mml_video *v, int64_t key) {
  return key >= 0 && !v->ordinal ? v->keys[key] : START_TS;
}

/* Index in keys of the largest keyframe timestamp <= t (-1: none). */
static int64_t key_at_or_before(const mml_video *v, int64_t t) {
  int64_t lo = 0, hi = v->nkeys; /* first key > t */
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (v->keys[mid] <= t)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo - 1;
}

/* 1 when a packet's frame is one this decode still has to deliver (or cannot be told). */
static int wanted(const mml_video *v, int64_t pts) {
  if (pts == AV_NOPTS_VALUE || !v->want || v->ordinal) return 1;
  int lo = v->want_k, hi = v->want_n; /* first wanted frame with pts >= pts */
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    int64_t i = v->want[mid];
    if (i >= v->n || v->tab[i] >= pts)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo < v->want_n && (v->want[lo] >= v->n || v->tab[v->want[lo]] == pts);
}

/* 1 when the packet with pts just sent holds the frame this decode wants now and the next
 * wanted one (if any) is past a keyframe after it: the decoder can be drained here. */
static int last_needed(const mml_video *v, int64_t pts) {
  if (!v->whole_packets || !v->want || v->ordinal || pts == AV_NOPTS_VALUE) return 0;
  int k = v->want_k;
  if (k >= v->want_n || v->want[k] < 0 || v->want[k] >= v->n || v->tab[v->want[k]] != pts) return 0;
  int j = k + 1;
  while (j < v->want_n && v->want[j] == v->want[k]) j++;
  if (j == v->want_n) return 1;
  if (v->want[j] < v->want[k] || v->want[j] >= v->n) return 0; /* refused by decode_all */
  int64_t key = key_at_or_before(v, v->tab[v->want[j]]);
  return key >= 0 && v->keys[key] > pts;
}

/* The next decoded frame into v->frm: 0, AVERROR_EOF at the end, or an error. */
static int next_frame(mml_video *v) {
  for (;;) {
    int r = avcodec_receive_frame(v->dec, v->frm);
    if (r == 0) v->decoded++;
    if (r != AVERROR(EAGAIN)) return r;
    if (v->draining) return AVERROR_EOF;
    if (mml_vio_cancelled(&v->io)) return AVERROR_EXIT;
    r = av_read_frame(v->fmt, v->pkt);
    if (r < 0) {
      if (v->io.st) return r;
      v->draining = 1; /* end of file (or a cut-off one): drain the decoder */
      avcodec_send_packet(v->dec, NULL);
      continue;
    }
    if (v->pkt->stream_index == v->si) {
      if (v->skip_nonref) /* a frame nobody references and nobody wants: not decoded */
        v->dec->skip_frame = wanted(v, v->pkt->pts) ? AVDISCARD_DEFAULT : AVDISCARD_NONREF;
      r = avcodec_send_packet(v->dec, v->pkt);
      if (r < 0 && r != AVERROR(EAGAIN)) {
        av_packet_unref(v->pkt);
        return r;
      }
      if (r == 0) v->sent++;
      if (r == 0 && last_needed(v, v->pkt->pts)) { /* a seek comes next: no more packets */
        v->draining = v->cut_short = 1;
        avcodec_send_packet(v->dec, NULL);
      }
    }
    av_packet_unref(v->pkt);
  }
}

static int sws_cs_of(enum AVColorSpace cs) {
  switch (cs) {
    case AVCOL_SPC_BT709:
      return SWS_CS_ITU709;
    case AVCOL_SPC_FCC:
      return SWS_CS_FCC;
    case AVCOL_SPC_BT470BG:
    case AVCOL_SPC_SMPTE170M:
      return SWS_CS_ITU601;
    case AVCOL_SPC_SMPTE240M:
      return SWS_CS_SMPTE240M;
    case AVCOL_SPC_BT2020_NCL:
    case AVCOL_SPC_BT2020_CL:
      return SWS_CS_BT2020;
    default:
      return SWS_CS_DEFAULT;
  }
}

/* v->frm to RGB24 in v->rgb (PyAV's reformat: bilinear, the frame's colorspace/range). */
static mml_status to_rgb(mml_video *v, mml_err *err) {
  const AVFrame *f = v->frm;
  int cs = sws_cs_of(f->colorspace), fmt = f->format;
  int range = f->color_range == AVCOL_RANGE_JPEG || fmt == AV_PIX_FMT_YUVJ420P ||
              fmt == AV_PIX_FMT_YUVJ422P || fmt == AV_PIX_FMT_YUVJ444P ||
              fmt == AV_PIX_FMT_YUVJ440P;
  if (v->plain_rgb) cs = range = -1; /* swscale's own defaults, whatever the frame says */
  if (f->width <= 0 || f->height <= 0 || (int64_t)f->width * f->height > v->max_pixels)
    return mml_err_set(err, MML_EVIDEOCORRUPT, "%s: frame of %dx%d", v->name, f->width, f->height);
  if (!v->sws || v->sws_w != f->width || v->sws_h != f->height || v->sws_fmt != fmt ||
      v->sws_cs != cs || v->sws_range != range) {
    sws_freeContext(v->sws);
    v->sws = sws_getContext(f->width, f->height, fmt, f->width, f->height, AV_PIX_FMT_RGB24,
                            SWS_BILINEAR, NULL, NULL, NULL);
    if (!v->sws)
      return mml_err_set(err, MML_EVIDEOCODEC, "%s: cannot convert pixel format %s to RGB", v->name,
                         av_get_pix_fmt_name(fmt) ? av_get_pix_fmt_name(fmt) : "?");
    if (!v->plain_rgb)
      sws_setColorspaceDetails(v->sws, sws_getCoefficients(cs), range,
                               sws_getCoefficients(SWS_CS_DEFAULT), 1, 0, 1 << 16, 1 << 16);
    v->sws_w = f->width, v->sws_h = f->height, v->sws_fmt = fmt, v->sws_cs = cs,
    v->sws_range = range;
  }
  size_t stride = ((size_t)f->width * 3 + 63) & ~(size_t)63, need = stride * (size_t)f->height;
  if (need > v->rgb_cap) {
    av_free(v->rgb);
    v->rgb_cap = 0;
    if (!(v->rgb = av_malloc(need)))
      return mml_err_set(err, MML_ENOMEM, "%s: out of memory for a %dx%d frame", v->name, f->width,
                         f->height);
    v->rgb_cap = need;
  }
  uint8_t *dst[4] = {v->rgb, NULL, NULL, NULL};
  int dst_stride[4] = {(int)stride, 0, 0, 0};
  if (sws_scale(v->sws, (const uint8_t *const *)f->data, f->linesize, 0, f->height, dst,
                dst_stride) != f->height)
    return mml_err_set(err, MML_EVIDEOCORRUPT, "%s: RGB conversion failed", v->name);
  v->rgb_stride = stride;
  v->rgb_w = f->width;
  v->rgb_h = f->height;
  return MML_OK;
}

static int64_t frame_pts(const AVFrame *f) {
  return f->pts != AV_NOPTS_VALUE ? f->pts : f->best_effort_timestamp;
}

/* Seeks when the decoder cannot reach t going forward, or a keyframe lies between. */
static mml_status position_for(mml_video *v, int64_t t, int64_t *key, mml_err *err) {
  *key = key_at_or_before(v, t);
  if (v->positioned && !v->cut_short && v->last_pts < t &&
      (*key < 0 || v->keys[*key] <= v->last_pts || v->last_pts == INT64_MIN))
    return MML_OK;
  return seek_to(v, key_ts(v, *key), err);
}

/* Decodes up to the frame with pts t (1: found and converted; 0: the table is wrong). */
static mml_status find_frame(mml_video *v, int64_t index, int64_t t, int *found, mml_err *err) {
  int64_t key;
  mml_status st = position_for(v, t, &key, err);
  for (int back = 0; !st;) {
    int r = next_frame(v);
    if (r == AVERROR_EOF) break;
    if (r < 0) return av_fail(v, MML_EVIDEOCORRUPT, r, "decoding", err);
    int64_t p = v->ordinal ? v->ord++ : frame_pts(v->frm);
    int first = v->after_seek;
    v->after_seek = 0;
    v->last_pts = p;
    if (p < t) {
      av_frame_unref(v->frm);
      continue;
    }
    if (p == t) {
      *found = 1;
      st = to_rgb(v, err);
      av_frame_unref(v->frm);
      return st;
    }
    av_frame_unref(v->frm);
    if (!first || back >= MAX_STEPBACK || key < 0) break; /* t was skipped: not in the stream */
    back++; /* landed past t right after a seek: one keyframe earlier */
    key = key > 0 ? key - 1 : -1;
    st = seek_to(v, key_ts(v, key), err);
  }
  if (st) return st;
  *found = 0;
  v->positioned = 0;
  (void)index;
  return MML_OK;
}

static mml_status deliver(mml_video *v, int k, int64_t index, mml_video_frame_fn fn, void *ctx,
                          mml_err *err) {
  mml_video_frame fr = {.k = k,
                        .index = index,
                        .pts_s = v->tab[index] * av_q2d(v->st->time_base),
                        .rgb = v->rgb,
                        .width = v->rgb_w,
                        .height = v->rgb_h,
                        .stride = v->rgb_stride};
  return fn(ctx, &fr, err);
}

/* The frames of idx[0..n), in order (the body of mml_video_decode). */
static mml_status decode_all(mml_video *v, const int64_t *idx, int n, int64_t nframes,
                             mml_video_frame_fn fn, void *ctx, mml_err *err) {
  for (int k = 0; k < n; k++) {
    int64_t i = idx[k];
    v->want_k = k;
    if (i < 0 || (k > 0 && i < idx[k - 1]))
      return mml_err_set(err, MML_EINVAL, "%s: frame indices must be ascending and >= 0", v->name);
    if (i >= nframes)
      return mml_err_set(err, MML_EVIDEOSHORT, "%s: frame %lld wanted, the video has %lld frames",
                         v->name, (long long)i, (long long)nframes);
    mml_status st;
    if (k == 0 || i != idx[k - 1]) {
      int found = 0;
      if (i < v->n && (st = find_frame(v, i, v->tab[i], &found, err))) return st;
      if (!found && !v->exact) { /* the mp4 index misled: the exact table, then again */
        if ((st = table_from_packets(v, 1, err))) return st;
        if (i < v->n && (st = find_frame(v, i, v->tab[i], &found, err))) return st;
      }
      if (!found)
        return mml_err_set(err, MML_EVIDEOCORRUPT,
                           "%s: frame %lld of %lld could not be decoded (cut-off or corrupt file: "
                           "%lld frames readable)",
                           v->name, (long long)i, (long long)nframes, (long long)v->n);
    }
    if ((st = deliver(v, k, i, fn, ctx, err))) return st;
  }
  return MML_OK;
}

/* Appends the bytes [pos, pos + size) to the ranges r (*nr of them, *cap room), merged
 * into the last one when they follow it within gap bytes; 0 when there is no room. */
static int add_range(int64_t **r, int *nr, int *cap, int64_t pos, int64_t size, int64_t gap) {
  if (*nr && pos >= (*r)[2 * *nr - 2] && pos <= (*r)[2 * *nr - 1] + gap) {
    if (pos + size > (*r)[2 * *nr - 1]) (*r)[2 * *nr - 1] = pos + size;
    return 1;
  }
  if (*nr == *cap) {
    int c = *cap ? *cap * 2 : 64;
    int64_t *q = c <= 8192 ? realloc(*r, (size_t)c * 2 * sizeof **r) : NULL;
    if (!q) return 0;
    *r = q;
    *cap = c;
  }
  (*r)[2 * *nr] = pos;
  (*r)[2 * *nr + 1] = pos + size;
  (*nr)++;
  return 1;
}

#define PACKET_SLACK 4096

/* Frames of the table with a timestamp in [from, last]. */
static int64_t frames_within(const mml_video *v, int64_t from, int64_t last) {
  int64_t lo = 0, hi = v->n; /* first >= from */
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (v->tab[mid] < from)
      lo = mid + 1;
    else
      hi = mid;
  }
  int64_t a = lo;
  for (hi = v->n; lo < hi;) { /* first > last */
    int64_t mid = lo + (hi - lo) / 2;
    if (v->tab[mid] <= last)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo - a;
}

/* Frames the decoder holds back for reordering (video_delay). */
static int64_t reorder_delay(const mml_video *v) {
  return v->st->codecpar->video_delay > 0 ? v->st->codecpar->video_delay : 0;
}

/* The timestamps a decode of wanted frame idx[k] runs through: from its keyframe (the
 * first frame when none) to the frame `past` after it (the decoder's reordering delay).
 * 0: nothing to read for it (out of range, or the same frame as idx[k - 1]). */
static int frame_span(const mml_video *v, const int64_t *idx, int k, int64_t past, int64_t *from,
                      int64_t *last) {
  int64_t i = idx[k];
  if (i < 0 || i >= v->n || (k && i == idx[k - 1])) return 0;
  int64_t key = key_at_or_before(v, v->tab[i]);
  *from = key >= 0 ? v->keys[key] : v->tab[0];
  *last = v->tab[i + past < v->n ? i + past : v->n - 1];
  return 1;
}

/* decode_ranges for a table from packets (mkv, webm, avi, ...: no per-frame index) from
 * the places the pass met the packets at: for each wanted frame, from where the demuxer's
 * seek to its keyframe lands (the index entry at or before it: an mkv's cluster, else the
 * keyframe's packet) through every packet up to the last frame the decoder needs (the
 * wanted one plus its reordering delay), in file order.  Without the places (local, or
 * one unknown): 0, nothing foreseeable. */
static int packet_ranges(const mml_video *v, const int64_t *idx, int n, int64_t gap, int64_t **out,
                         int *nr) {
  if (!v->npk) return 0;
  int cap = 0, room = 1;
  const int64_t past = reorder_delay(v);
  for (int k = 0; k < n && room; k++) {
    int64_t from, last;
    if (!frame_span(v, idx, k, past, &from, &last)) continue;
    int64_t lo = 0, hi = v->nkpk; /* the keyframe's packet: the last one at or before from */
    while (lo < hi) {
      int64_t mid = lo + (hi - lo) / 2;
      if (v->pk[v->kpk[mid]].pts <= from)
        lo = mid + 1;
      else
        hi = mid;
    }
    int64_t j = lo > 0 ? v->kpk[lo - 1] : 0, start = v->pk[j].pos, end = v->pk[j].end;
    int e = av_index_search_timestamp(v->st, from, AVSEEK_FLAG_BACKWARD);
    const AVIndexEntry *ie = e >= 0 ? avformat_index_get_entry(v->st, e) : NULL;
    if (ie && ie->pos >= 0 && ie->pos < start) start = ie->pos;
    int64_t more = past + 2; /* then packets the decoder may take in before it lets the
                              * last frame out (decode order is not pts order) */
    for (int64_t got = 0, want = frames_within(v, from, last); j < v->npk && more > 0; j++) {
      got += v->pk[j].pts >= from && v->pk[j].pts <= last;
      if (v->pk[j].end > end) end = v->pk[j].end;
      more -= got >= want;
    }
    /* and the element headers the demuxer reads past a packet to find the next one (or the
     * end of the file) */
    room = add_range(out, nr, &cap, start, end + PACKET_SLACK - start, gap);
  }
  return room;
}

/* A remote video: the byte ranges the decode of idx[0..n) reads, from the keyframe before
 * each wanted frame to the frames the decoder holds back for reordering past it
 * (video_delay), in reading order, into *out (*nr of them; malloc'd, NULL when none): an
 * mp4/mov's samples from its index, else packet_ranges.  Returns 0 when there were more
 * than fit (the ranges then cover only the start of the decode), or they cannot be known. */
static int decode_ranges(const mml_video *v, const int64_t *idx, int n, int64_t gap, int64_t **out,
                         int *nr) {
  *out = NULL;
  *nr = 0;
  if (!v->io.fetcher || v->ordinal || n <= 0) return 1;
  if (v->exact) return packet_ranges(v, idx, n, gap, out, nr);
  int cnt = avformat_index_get_entries_count(v->st), cap = 0, room = 1;
  const int64_t past = reorder_delay(v);
  for (int k = 0; k < n && room; k++) {
    int64_t from, last;
    if (!frame_span(v, idx, k, past, &from, &last)) continue;
    int e = av_index_search_timestamp(v->st, from - v->shift, AVSEEK_FLAG_BACKWARD);
    for (e = e < 0 ? 0 : e; e < cnt && room; e++) {
      const AVIndexEntry *ie = avformat_index_get_entry(v->st, e);
      if (!ie || ie->timestamp + v->shift > last) break;
      room = add_range(out, nr, &cap, ie->pos, ie->size, gap);
    }
  }
  return room;
}

/* Ranges closer than this are fetched as one: libavformat reads through a forward seek
 * shorter than its buffer + its short-seek threshold (32 KiB) rather than seeking, and
 * those bytes must be in memory too. */
#define PRELOAD_GAP (IO_BUF + (64 << 10))

/* The decode's ranges named to the byte source, which fetches them ahead in pieces of
 * their own (video_io.c invariant 2), unless they were preloaded (mml_video_preload).
 * Merged as a preload merges them: a gap the demuxer reads through is fetched with its
 * ranges, not as the aligned block around it. */
static void will_decode(mml_video *v, const int64_t *idx, int n) {
  if (v->io.npre) return;
  int64_t *r;
  int nr;
  decode_ranges(v, idx, n, PRELOAD_GAP, &r, &nr);
  mml_vio_will_read(&v->io, r, nr);
  free(r);
}

/* Bytes of the ranges r (nr of them) inside the source, as mml_vio_preload fetches them. */
static int64_t ranges_bytes(const mml_video *v, const int64_t *r, int nr) {
  int64_t sum = 0;
  for (int k = 0; k < nr; k++) {
    int64_t end = r[2 * k + 1] < v->io.size ? r[2 * k + 1] : v->io.size;
    if (r[2 * k] >= 0 && end > r[2 * k]) sum += end - r[2 * k];
  }
  return sum;
}

int64_t mml_video_preload_bytes(const mml_video *v, const int64_t *idx, int n) {
  if (!v || n <= 0 || !idx || v->io.size < 0) return 0;
  int64_t *r;
  int nr;
  int whole = decode_ranges(v, idx, n, PRELOAD_GAP, &r, &nr);
  int64_t sum = ranges_bytes(v, r, nr);
  free(r);
  return whole ? sum : 0;
}

mml_status mml_video_preload(mml_video *v, const int64_t *idx, int n, int64_t max_bytes,
                             mml_video_loaded_fn loaded, void *ctx, int *submitted, mml_err *err) {
  *submitted = 0;
  if (!v || (n > 0 && !idx)) return mml_err_set(err, MML_EINVAL, "video: NULL argument");
  int64_t *r;
  int nr;
  int whole = decode_ranges(v, idx, n, PRELOAD_GAP, &r, &nr);
  if (!whole || ranges_bytes(v, r, nr) > max_bytes)
    nr = 0; /* not foreseeable whole, or too much at once */
  mml_status st = mml_vio_preload(&v->io, r, nr, loaded, ctx, submitted, err);
  free(r);
  return st;
}

void mml_video_count_waits(mml_video *v, uint64_t *counter) {
  if (v) v->io.wait_count = counter;
}

int64_t mml_video_waits(const mml_video *v) { return v ? v->io.waits : 0; }

mml_status mml_video_decode(mml_video *v, const int64_t *idx, int n, mml_video_frame_fn fn,
                            void *ctx, mml_err *err) {
  if (!v || (n > 0 && (!idx || !fn))) return mml_err_set(err, MML_EINVAL, "video: NULL argument");
  int64_t nframes = v->n; /* what the caller's indices were computed from */
  mml_status st;
  if (!v->dec && (st = open_decoder(v, err))) return st; /* closed by mml_video_idle */
  will_decode(v, idx, n);
  v->want = idx;
  v->want_n = n;
  st = decode_all(v, idx, n, nframes, fn, ctx, err);
  v->want = NULL;
  v->dec->skip_frame = AVDISCARD_DEFAULT;
  return st;
}
