/*
 * mml/video.h — video files decoded with FFmpeg (libavformat/libavcodec/libswscale):
 * probe once, then decode only the frames a sample keeps.
 *
 * Design
 *   - One mml_video per call site and thread: it owns its AVFormatContext, AVCodecContext
 *     (threads=1 unless asked) and SwsContext, so any number of worker threads decode
 *     different videos at once with the GIL released; nothing is shared but FFmpeg's own
 *     read-only tables.  No global state, no logging (FFmpeg's log is silenced once).
 *   - Bytes come through one custom AVIOContext from a local file (pread), a buffer in
 *     memory (a WebDataset member) or an http(s):// / s3:// object read in ranged blocks
 *     through the existing fetcher (ranged GETs, a few cached blocks): an mp4 whose moov
 *     comes first is never downloaded whole when a few frames are kept.  The blocks a
 *     read will need (the packet pass over an mkv/webm/avi: the rest of the file; a
 *     decode: the packets from the keyframe before each kept frame, from an mp4's index
 *     or the places the packet pass met them at) are
 *     fetched ahead, 4 at once, so the decode waits on about one round trip, not one per
 *     block; the bytes read are the same.
 *   - Frame index i means what qwen-vl-utils, decord, torchcodec and a full PyAV decode
 *     mean: the i-th frame in presentation order.  open builds the table of presentation
 *     timestamps: from the demuxer's sample index when it lists every frame (mp4/mov: no
 *     packet is read), else from one demux-only pass over the packets (no decoding).
 *     decode seeks to the keyframe before each needed run of frames, decodes forward to
 *     the wanted timestamp (skipping frames nothing references where the codec says so)
 *     and converts only kept frames to RGB; every delivered frame is
 *     checked against the table (a table derived from the mp4 index that the decoder
 *     contradicts is rebuilt by the packet pass and the call retried once).
 *   - RGB24 exactly as PyAV's frame.to_ndarray(format="rgb24"): swscale, SWS_BILINEAR,
 *     source colorspace/range from the frame (unspecified: BT.601, limited), full-range
 *     output.  Frames are not rotated (PyAV and decord do not rotate); info.rotation says
 *     what the container asks for.
 *   - Memory: one RGB frame + the decoder's reference frames + at most 4 I/O blocks (and
 *     4 more fetched ahead while a remote video is read),
 *     whatever the length of the video or the number of frames kept.
 */
#ifndef MML_VIDEO_H
#define MML_VIDEO_H

#include "mml/common.h"
#include "mml/fetch.h"

typedef struct mml_video_src {
  const char *name;    /* local path or URL; named in every message */
  const uint8_t *data; /* or the file's bytes in memory (then name only names them) */
  size_t len;
  mml_fetcher *fetcher;     /* required for http(s):// and s3:// names */
  int64_t max_bytes;        /* bytes read from the source, in total (0: no bound) ->
                       * MML_EOBJECTSIZE; per use: mml_video_idle starts a new one) */
  int threads;              /* decoder threads (0 or 1: one) */
  int plain_rgb;            /* 1: RGB24 as PyAV < 17 converts (its to_image / to_ndarray:
                             * swscale's defaults, BT.601 and the pixel format's range,
                             * whatever the frame's colorspace says; LLaMA-Factory 0.9.5's
                             * PyAV 16) */
  int64_t block;            /* remote read block size (0: MML_VIDEO_BLOCK) */
  int64_t max_pixels;       /* frame width*height bound, checked at open and by the decoder
                       * (0: MML_VIDEO_MAX_PIXELS) -> MML_ETOOBIG */
  const mml_cancel *cancel; /* once set, the open, probe or decode under way stops within a
                             * packet's work with MML_ECANCELLED (NULL: never); it must
                             * outlive the mml_video */
  /* a remote source's size and first bytes, when the caller fetched them ahead (the
   * loader, while the record's images come): size > 0 skips the open's HEAD; first (its
   * bytes [0, first->len), len exactly min(block, size)) becomes the first cached block,
   * its memory moved into the video, so the open reads it without a round trip */
  int64_t size;
  mml_bytes *first;
  /* and, with first, more of the header fetched ahead (mml_video_header_range): the bytes
   * [tail_off, tail_off + tail->len), moved into the video and read from memory by the
   * open (dropped by mml_video_idle) */
  mml_bytes *tail;
  int64_t tail_off;
} mml_video_src;

/* An mp4/mov whose first `len` bytes (b) do not hold its whole moov (the index: read by
 * the open): the bytes past them the open reads for it, from the top-level box sizes:
 * the moov's rest (and a block past it, where its first packets are) when it starts in
 * b, else everything from the first box past b (after an mdat) to the end of the file
 * (`size` bytes), where a moov that follows the mdat is.  A Matroska/WebM or AVI file
 * (EBML / RIFF magic: no per-frame index, the open reads every packet): the rest of the
 * file, when it is at most `whole` bytes.  1 with [*off, *end); 0 when the first bytes
 * hold the header, or the container is another, or cannot be told. */
int mml_video_header_range(const uint8_t *b, size_t len, int64_t size, int64_t whole, int64_t *off,
                           int64_t *end);

#define MML_VIDEO_MAX_PIXELS ((int64_t)8192 * 8192)
#define MML_VIDEO_BLOCK ((int64_t)1 << 20) /* the default remote read block */

typedef struct mml_video_info {
  int width, height;  /* decoded frame size (what the RGB frames have) */
  int rotation;       /* display rotation in degrees, 0/90/180/270 (not applied) */
  double fps;         /* the stream's average frame rate (avg_frame_rate, else
                   * r_frame_rate), as PyAV average_rate and decord get_avg_fps */
  int64_t nframes;    /* frames in the stream, as decord len(vr), torchcodec's exact
                   * num_frames and a full PyAV decode count them */
  double duration_s;  /* stream duration (else the container's), seconds */
  double start_s;     /* presentation time of frame 0, seconds */
  char codec[32];     /* "h264", "hevc", "vp9", "av1", ... */
  char container[48]; /* libavformat's demuxer name, e.g. "mov,mp4,m4a,3gp,3g2,mj2" */
  int exact_index;    /* 1: timestamps from a packet pass; 0: from the container index */
  int64_t size;       /* bytes of the source (-1 unknown) */
  /* as PyAV reports them (LLaMA-Factory's video sampling, recipe="llama-factory"): the
   * stream's nb_frames header field (stream.frames; 0: unknown), and its duration
   * float(stream.duration * stream.time_base), the exact fraction rounded once (0: the
   * stream has none) */
  int64_t stream_frames;
  double stream_duration_s;
  double stream_avg_fps; /* float(stream.average_rate): avg_frame_rate (0: unknown) */
} mml_video_info;

typedef struct mml_video_frame {
  int k;              /* position in the idx[] array passed to decode */
  int64_t index;      /* frame index (idx[k]) */
  double pts_s;       /* its presentation time, seconds */
  const uint8_t *rgb; /* height rows of width*3 bytes, stride apart; valid during the call */
  int width, height;
  size_t stride;
} mml_video_frame;

/* Called once per k, in order; a non-OK status stops decode and is returned. */
typedef mml_status (*mml_video_frame_fn)(void *ctx, const mml_video_frame *f, mml_err *err);

typedef struct mml_video mml_video;

/* Opens and probes.  Failures name the file: MML_ENOENT / MML_EIO / MML_EFETCH (reading),
 * MML_EVIDEOCORRUPT (not a video / corrupt / truncated headers), MML_EVIDEOCODEC (no
 * video stream or no decoder for its codec), MML_EOBJECTSIZE (max_bytes), MML_ETOOBIG
 * (max_pixels). */
mml_status mml_video_open(const mml_video_src *src, mml_video **out, mml_err *err);
mml_status mml_video_probe(const mml_video *v, mml_video_info *info, mml_err *err);

/* Decodes frames idx[0..n) (non-decreasing; duplicates delivered again) and calls fn for
 * each.  An index >= nframes is MML_EVIDEOSHORT; a frame the file cannot deliver (cut
 * off, corrupt packets) is MML_EVIDEOCORRUPT; both name the file and the frame. */
mml_status mml_video_decode(mml_video *v, const int64_t *idx, int n, mml_video_frame_fn fn,
                            void *ctx, mml_err *err);

/* Between the probe and the decode of a video kept open (the loader plans a sample, then
 * decodes it later, maybe on another thread): drops the cached I/O blocks, so an idle
 * open video holds only its demuxer and decoder state and the frame table (and a local
 * file's descriptor); max_bytes counts afresh for the next use.  The decode then needs
 * no second open: no second probe, and no second packet pass over an mkv/webm/avi. */
void mml_video_idle(mml_video *v);

/* Bytes an open video holds while idle (after mml_video_idle): its demuxer's and
 * decoder's state, the I/O buffer and the frame tables, an upper estimate from what it
 * knows (frame and packet counts, the sample index), for a memory budget (the loader's
 * max_memory counts the videos it keeps open from their probe to their decode). */
int64_t mml_video_held_bytes(const mml_video *v);

/* Preloading a planned decode (a remote video; local and in-memory ones: a no-op,
 * *submitted 0): the exact byte ranges of the packets mml_video_decode(v, idx, n) will
 * read (from the keyframe before each kept frame -- where the demuxer's seek lands -- through
 * its own packet and the decoder's reordering delay; close ones merged) are fetched now,
 * from an mp4/mov's sample index, or for mkv/webm/avi/... from the places of the packets
 * their open's packet pass met (plus the next packets the decoder may take in and 4 KiB of
 * element headers past the last), one ranged GET each,
 * through the fetcher; loaded(ctx, bytes) runs on the fetcher's I/O thread once per GET
 * submitted (*submitted; bytes 0: it failed).  Once all have run, the decode reads from
 * memory and never waits on the network; a failed range or a read the index did not
 * foresee is read on demand as without the preload (same frames, same errors), and
 * counted by mml_video_waits.  Ranges adding up to more than max_bytes are not preloaded
 * (the decode reads on demand, a few blocks at a time).  Call between mml_video_idle and
 * mml_video_decode, with the indices of that decode.  Failures: MML_ENOMEM. */
typedef void (*mml_video_loaded_fn)(void *ctx, size_t bytes);
/* The bytes mml_video_preload(v, idx, n, ...) would fetch, what the preload holds in memory
 * until the decode ends (0: nothing to preload: not remote, or no foreseeable ranges), so
 * a caller can make room for them first and pass them as its max_bytes. */
int64_t mml_video_preload_bytes(const mml_video *v, const int64_t *idx, int n);
mml_status mml_video_preload(mml_video *v, const int64_t *idx, int n, int64_t max_bytes,
                             mml_video_loaded_fn loaded, void *ctx, int *submitted, mml_err *err);
/* Times v's reader waited on the network (its HEAD, blocks read on demand, fetches still in
 * flight when read): 0 for a decode whose preload had arrived.  count_waits also adds each
 * later one (atomically) to *counter (NULL: none), e.g. a loader's stats. */
int64_t mml_video_waits(const mml_video *v);
void mml_video_count_waits(mml_video *v, uint64_t *counter);

/* Bytes read from the source so far (I/O accounting, tests of range reads). */
int64_t mml_video_bytes_read(const mml_video *v);
/* Frames the decoder produced so far (kept or dropped): the decode work done. */
int64_t mml_video_frames_decoded(const mml_video *v);
/* Packets handed to the decoder so far (a frame the decoder skips as unreferenced and
 * unwanted is sent, but not decoded; every decoded frame was sent). */
int64_t mml_video_packets_sent(const mml_video *v);

void mml_video_close(mml_video *v);

#endif
