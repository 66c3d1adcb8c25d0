/*
 * mml/loader.h — the engine: one loader per DP rank turns JSONL shards into batches.
 *
 * Stream: the rank's samples in epoch order (mml/sampler.h); stream position `pos` of
 * epoch `e` is one sample.  Worker threads run the whole per-sample pipeline (read record,
 * parse, read images, plan, tokenize, decode + preprocess) on positions inside a bounded
 * window ahead of the collation point; one collation thread consumes finished samples
 * strictly in stream order and composes batches, which workers then emit (build the
 * tensors) in parallel; batches enter a bounded queue of `prefetch` batches in order.
 * Output is a pure function of the data, the config and the cursor, whatever the thread
 * count or timing.
 *
 * Epochs: padded mode yields floor(n_rank / micro_batch_size) batches per epoch, filling
 * with the epoch's own samples from the start (pos >= n_rank wraps) when skips make it
 * short (a failure met again there is not counted or reported twice); packed mode ends
 * the last pack at the end of the epoch.
 *
 * Threads: the consumer API (next, seek, stats, close) is for one consumer thread at a
 * time; the engine's threads never call back into the caller.
 */
#ifndef MML_LOADER_H
#define MML_LOADER_H

#include "mml/batch.h"
#include "mml/collate.h"
#include "mml/common.h"
#include "mml/fetch.h"
#include "mml/mixture.h"
#include "mml/record.h"
#include "mml/sample.h"
#include "mml/template.h"
#include "mml/tokenizer.h"
#include "mml/vision.h"

#define MML_DEFAULT_MAX_SAMPLE_PIXELS ((int64_t)1 << 27) /* 134,217,728 */
#define MML_DEFAULT_MAX_RECORD_BYTES ((int64_t)64 << 20) /* 64 MiB */
/* 2 GiB: the bytes of finished batches the loader keeps without max_memory */
#define MML_DEFAULT_MAX_SAMPLE_PIXEL_BYTES ((int64_t)2 << 30)

/* Loader pixel_format= (the option table's choices, in this order): the dtype the consumer
 * gets in pixel_values (and pixel_values_videos) and where the uint8 bytes become it.
 *   MML_PIXELS_FLOAT32 / _BFLOAT16  emitted in that dtype; images are decoded into uint8
 *       patch rows (an eighth of float32's bytes) while their batch is built and expanded
 *       when it is emitted (the same bits), except where that cannot hold (pinned or the
 *       caller's memory, a device stage, sources with different mean/std): then as _DECODE
 *   MML_PIXELS_UINT8  the uint8 patches themselves (mml/vision.h MML_PIXEL_UINT8)
 *   MML_PIXELS_FLOAT32_DECODE / _BFLOAT16_DECODE  the workers write float rows directly
 *   MML_PIXELS_FLOAT32_CONSUMER / _BFLOAT16_CONSUMER  the engine emits uint8 patches and
 *       the consumer expands them (mmloader.torch.Loader: expand_pixels where the tensor
 *       is, on the GPU after the copy)
 * Every choice gives the same values in the dtype it names, bit for bit. */
typedef enum {
  MML_PIXELS_FLOAT32 = 0,
  MML_PIXELS_BFLOAT16,
  MML_PIXELS_UINT8,
  MML_PIXELS_FLOAT32_DECODE,
  MML_PIXELS_BFLOAT16_DECODE,
  MML_PIXELS_FLOAT32_CONSUMER,
  MML_PIXELS_BFLOAT16_CONSUMER,
} mml_pixels;

/* The MML_PIXEL_* (mml/vision.h) the engine emits for `pixels` (MML_PIXELS_*). */
int mml_pixels_emitted(int pixels);
/* 1 when `pixels` expands uint8 rows into floats at emission (MML_PIXELS_FLOAT32/_BFLOAT16). */
int mml_pixels_compact(int pixels);
/* The Loader spelling of `pixels` ("float32-decode", ...; "?" out of range). */
const char *mml_pixels_name(int pixels);

/* When a loader's workers start producing (Loader start=, the option table's choices, in
 * this order).  Either way the batches are the same, bit for bit: the stream is a pure
 * function of the cursor, and a seek drops the work of the cursor before it.
 *   MML_START_CONSTRUCTION  at the end of mml_loader_new, for cursor {0, 0, 0}: a trainer's
 *       set-up between building the loader and its first next() finds batches made
 *   MML_START_NEXT          at the first mml_loader_next (nothing is read before it) */
typedef enum { MML_START_CONSTRUCTION = 0, MML_START_NEXT = 1 } mml_start;

/* One source of a mixture (mml/mixture.h): its shards, how many samples it gives per
 * epoch, and the settings its samples are processed with (the worker looks them up by
 * the sample's source). */
/* Whose data path a source's samples follow (Loader recipe=): the HF processor (with the
 * record's qwen-vl-utils keys), LLaMA-Factory's (mml_template_set_llama_factory) or Qwen's
 * own fine-tuning code (mml_template_set_qwen_finetune). */
enum { MML_RECIPE_PROCESSOR = 0, MML_RECIPE_LLAMA_FACTORY = 1, MML_RECIPE_QWEN_VL_FINETUNE = 2 };

typedef struct mml_source_cfg {
  const char *name;        /* for stats and messages */
  const char *const *data; /* its shards, as mml_loader_cfg.data */
  int ndata;
  double weight, repeat; /* mml_mix_spec: at most one of weight, repeat, choose >= 0 */
  int64_t choose;
  const char *image_root;    /* NULL: each shard's own folder */
  const char *columns;       /* Parquet: "column=key,..." a dataset's own column names; NULL */
  mml_vision_cfg vision;     /* patch, merge and temporal sizes must be the loader's */
  const char *system_prompt; /* NULL: the template's default system turn; "": none */
  mml_label_mode label_mode;
  mml_image_space image_space; /* `<image>` whitespace convention */
  int64_t max_length;          /* 0: no limit */
  int recipe;                  /* MML_RECIPE_* */
  mml_lf_opts lf;              /* recipe MML_RECIPE_LLAMA_FACTORY's settings (mml/template.h) */
  mml_qft_opts qft;            /* recipe MML_RECIPE_QWEN_VL_FINETUNE's (mml/template.h) */
} mml_source_cfg;

typedef struct mml_loader_cfg {
  const char *const *data; /* shard paths or URLs (local globs already expanded; s3:// may
                             hold a glob in its key, listed with the fetcher); ignored
                             when `sources` is given */
  int ndata;
  const char *image_root; /* NULL: each shard's own folder */
  const char *columns;    /* Parquet: "column=key,..." (mml_source_cfg.columns); NULL: none */
  int data_format;        /* mml_layout (mml/index.h): auto, JSONL, JSON, WebDataset */
  const char *index;      /* dataset index (mml/dsindex.h): NULL: "<shard>.mmlidx" next to
                           each local shard when present; a folder or URL prefix
                           holding them (any shard); "": never read one */
  int shuffle;
  uint64_t seed;
  int dp_rank, dp_size;
  int num_threads;           /* worker threads (>= 1) */
  int prefetch;              /* batches with pixels ahead of the consumer: finished or being
                                decoded (>= 1) */
  int start;                 /* mml_start: when the workers start producing (0: as soon as
                                 the loader is built; mml_loader_seek before the first
                                 mml_loader_next discards that work, by generation) */
  int window;                /* samples in flight ahead of collation;
                                 0: 2*mbs, at least 4*threads and 16; with a
                                 remote shard or image root at least
                                 (prefetch+2)*mbs and 64 */
  int64_t max_memory;        /* 0: no cap; else a cap in bytes on the engine's memory: every
                                 batch buffer of its pool (live, those the consumer holds
                                 included, and cached for reuse), the window's encoded bytes
                                 and MML_SCRATCH_RESERVE per worker; work waits for room */
  int pixels;                /* MML_PIXELS_* (Loader pixel_format=): the dtype pixel_values
                                is emitted in and where its floats are made; it sets
                                collate.pixel_format (mml_loader_new) */
  int on_error_raise;        /* 1: a failed sample is delivered as an error, in order */
  double max_error_rate;     /* fail when skipped/consumed exceeds it ... */
  int64_t min_error_samples; /* ... after at least this many samples (0: 100) */
  int64_t max_length;        /* skip samples longer than this (0: no limit) */
  /* Per-sample resource limits; 0 means the default.  A sample over one is skipped (or
   * raised) with its own reason, naming shard, line and the limit. */
  int max_images_per_sample;      /* too_many_images; default MML_DEFAULT_MAX_IMAGES_PER_SAMPLE */
  int64_t max_sample_pixels;      /* sample_too_large: sum of the images' width*height, from
                              their headers before any decode; default
                              MML_DEFAULT_MAX_SAMPLE_PIXELS */
  int64_t max_sample_pixel_bytes; /* sample_too_large: its pixel_values (and
                              pixel_values_videos) in the emitted pixel_format, from the
                              plan (resized sizes) before any decode; default
                              MML_DEFAULT_MAX_SAMPLE_PIXEL_BYTES */
  int64_t max_record_bytes;       /* record_too_large: one JSONL line, checked before reading
                              it; default MML_DEFAULT_MAX_RECORD_BYTES */
  int max_json_depth;             /* bad_record; default MML_DEFAULT_MAX_JSON_DEPTH */
  int64_t max_object_bytes;       /* object_too_large: one image file or object, refused before
                              it is read; default MML_DEFAULT_MAX_OBJECT_BYTES */
  int max_jpeg_scans;             /* too_many_scans: a JPEG of more scans, from its header when
                              planning, else when the decoder reaches the scan; default
                              MML_DEFAULT_MAX_JPEG_SCANS (mml/image.h) */
  /* Per-shard limits (mml/index.h: a shard over one fails the build); 0: the default. */
  int64_t max_shard_bytes;   /* text of a compressed or remote shard; default
                              MML_DEFAULT_MAX_SHARD_BYTES */
  int64_t max_shard_records; /* lines, elements or members of a shard; default
                              MML_DEFAULT_MAX_SHARD_RECORDS */
  /* Path policy (path_refused, checked before opening anything); the option table's
   * defaults are 1 (as in earlier releases), a zeroed cfg is the confined policy. */
  int allow_paths_outside_root; /* 0: relative image references must stay inside the image
                                    root: no absolute paths, no "..", no symlink out of it */
  int allow_remote_images;      /* 0: records of local shards may not name http(s)/s3 URLs */
  double next_timeout_s;        /* the binding's bound on one next() (0: the default) */
  /* Construction (index scans, listings, fetches, the plan) stops with MML_ECANCELLED
   * soon after this is set (NULL: never); it must outlive the loader, whose own flag
   * (set by close) reads it as its parent. */
  const mml_cancel *cancel;
  int cycle;               /* 1: never report the end of an epoch */
  mml_collate_cfg collate; /* collate.pixel_format is set from `pixels` */
  mml_vision_cfg vision;
  const mml_tokenizer *tokenizer; /* borrowed; must outlive the loader */
  mml_template_style template_style;
  mml_label_mode label_mode;
  mml_image_space image_space;    /* `<image>` whitespace convention (mml/template.h) */
  int qwen3_video_prompt;         /* mml_qwen3_video_form (mml/template.h) */
  int recipe;                     /* MML_RECIPE_*: whose data path the samples follow */
  mml_lf_opts lf;                 /* MML_RECIPE_LLAMA_FACTORY's settings (mml/template.h) */
  mml_qft_opts qft;               /* MML_RECIPE_QWEN_VL_FINETUNE's (mml/template.h) */
  int data_packing;               /* 1: a record that is a JSON list is a pack of records, one
                                    sample (mml_record_opts.packs; Qwen's data_packing); needs
                                    collate.flatten */
  mml_fetch_cfg fetch;            /* used only when data or images are remote */
  const mml_allocator *allocator; /* NULL: host memory (or pinned, see pin_memory) */
  int pin_memory;                 /* 1: batches in page-locked host memory (falls back to plain
                                           host memory without CUDA; stats report which) */
  int to_device;                  /* 1: batches are copied to CUDA device `device` (own stream);
                                           0: batches stay in host memory */
  int device;
  const char *system_prompt; /* NULL: the template's default system turn; "": none */
  /* A mixture: nsources sources blended per mml/mixture.h, each with its own settings.
   * NULL: one source made of `data` with the settings above. */
  const mml_source_cfg *sources;
  int nsources;
  int64_t samples_per_epoch; /* mixture epoch size (0: the sources' default) */
  double mixture_tolerance;  /* warn once per source when its share of the samples
                                 delivered so far differs from its share of the epoch by
                                 more than this (checked every 64 samples once 500 were
                                 delivered; 0: 0.05, < 0: never) */
  /* The global plan (mml/plan.h; on when any of these is set): batches are composed
   * over all DP ranks from token counts measured before any decode. */
  int64_t max_tokens_per_batch; /* padded batches: rows * longest <= this, rows dynamic
                                   (0: micro_batch_size rows) */
  int balance;                  /* mml_balance: the cost spread evenly over the ranks */
  int64_t group_by_length;      /* windows of this many samples sorted by length (0: off) */
  int global_plan;              /* 1: the global plan without any of the three (elastic resume) */
  int plan_only;                /* 1: a planning pass: samples are read, planned from image
                                       headers and tokenized, never decoded; batches carry no
                                       tensors, only their cursors (composition is the same unless
                                       an image fails only when decoded) */
} mml_loader_cfg;

typedef struct mml_loader mml_loader;

/* Rows per padded batch when neither micro_batch_size nor max_tokens_per_batch is set. */
#define MML_DEFAULT_MICRO_BATCH_SIZE 8

/* Validates the config and builds the shard index (reads every shard once).  Starts no
 * threads: they start on the first mml_loader_next. */
mml_status mml_loader_new(const mml_loader_cfg *cfg, mml_loader **out, mml_err *err);
/* Stops and joins every thread (within the time one sample takes), frees everything.
 * Batches already handed out stay valid.  NULL is fine. */
void mml_loader_free(mml_loader *L);
/* Stops the threads and drops queued batches; later calls return MML_ECLOSED. */
void mml_loader_close(mml_loader *L);

int64_t mml_loader_num_samples(const mml_loader *L);      /* N over all shards */
int64_t mml_loader_samples_per_rank(const mml_loader *L); /* n_rank */
/* Padded mode: batches per epoch; packed mode: -1. */
int64_t mml_loader_batches_per_epoch(const mml_loader *L);
/* Hash of the shard list (file names, sizes, sample counts). */
uint64_t mml_loader_data_hash(const mml_loader *L);
/* The loader's configuration as built (its own copies of the strings). */
const mml_loader_cfg *mml_loader_config(const mml_loader *L);
/* Draws per epoch over all ranks (the mixture's M; N without a mixture). */
int64_t mml_loader_samples_per_epoch(const mml_loader *L);

/* Per source (one without a mixture): sizes and what collation has consumed from it. */
typedef struct mml_source_stats {
  const char *name;          /* valid while the loader lives */
  int64_t num_samples;       /* samples in its shards */
  int64_t per_epoch;         /* its draws per epoch (all ranks) */
  uint64_t data_hash;        /* as mml_loader_data_hash, over its shards */
  uint64_t samples, skipped; /* good samples collated, samples skipped */
  uint64_t skip_by_status[MML_STATUS_COUNT];
  int64_t tokens, image_tokens; /* of its good samples */
  uint64_t bytes;               /* record + image bytes read for it */
} mml_source_stats;
int mml_loader_num_sources(const mml_loader *L);
void mml_loader_source_stats(mml_loader *L, int source, mml_source_stats *out);

/* Restarts the stream at cursor c (a cursor taken from a delivered batch, or
 * {epoch, 0, 0}): drops prefetched batches and in-flight work.  A cursor at the end of an
 * epoch resumes with the next epoch, reporting the epoch end first (as the original
 * loader would) unless batch_in_epoch is 0.  MML_ESTATE, naming the field, for a cursor
 * this loader cannot have produced (ranges and consistency, see check_cursor). */
#define MML_MAX_EPOCH ((int64_t)1 << 40)
mml_status mml_loader_seek(mml_loader *L, const mml_cursor *c, mml_err *err);
/* mml_loader_seek, and then no work is started beyond the `ahead` samples from c plus
 * one more for each sample skipped (ahead <= 0: no bound): the caller knows how many
 * samples the batches it wants take (mmloader.ray: one batch per seek), so nothing is
 * made only to be dropped by the next seek.  Output is unchanged: when the bound is
 * reached the engine waits (for the next seek or close). */
mml_status mml_loader_seek_ahead(mml_loader *L, const mml_cursor *c, int64_t ahead, mml_err *err);
/* The cursor after the last batch delivered by mml_loader_next (the resume point). */
mml_cursor mml_loader_cursor(const mml_loader *L);
/* The global plan (cfg.max_tokens_per_batch / balance / group_by_length; mml/plan.h).
 * Every global step gives each rank one batch; the state of every rank is the same global
 * count, so a stream may resume on another dp_size, micro_batch_size or token budget.
 * An epoch's plan may start at a global count q0 (0 unless resumed elastically). */
typedef struct mml_plan_info {
  int64_t q0;           /* where this epoch's plan starts (plan order) */
  int64_t usable;       /* samples of the epoch in the plan order */
  int64_t end;          /* where its last step ends (usable - end: the dropped tail) */
  int64_t steps;        /* batches of every rank in the epoch */
  int64_t rank_samples; /* samples of this rank in the epoch */
  int64_t unusable;     /* samples of the dataset left out at planning (failed, or too
                       long for one batch), counted in the stats once */
  int64_t indexed;      /* samples whose counts a sidecar index gave */
  int64_t measured;     /* samples counted by a planning pass (0: the index knew all) */
} mml_plan_info;
/* 1 when the loader composes by a global plan. */
int mml_loader_has_plan(const mml_loader *L);
/* MML_EINVAL without a plan; MML_ENOMEM. */
mml_status mml_loader_plan_info(mml_loader *L, int64_t epoch, mml_plan_info *out, mml_err *err);
/* The global count after cursor c of this loader (its epoch's q0 and the plan position
 * where the step after batch c->batch_in_epoch starts), for the state. */
mml_status mml_loader_plan_position(mml_loader *L, const mml_cursor *c, int64_t *q0, int64_t *q,
                                    mml_err *err);
/* Seeks to cursor c of the plan of c->epoch that starts at global count q0 (a cursor of a
 * state saved with the same q0; or {epoch, 0, 0} with the saved global count as q0 to
 * resume elastically).  MML_ESTATE when q0 is past the epoch's usable samples. */
mml_status mml_loader_seek_plan(mml_loader *L, const mml_cursor *c, int64_t q0, mml_err *err);
/* pin_memory: batches delivered from now on are also kept from reuse until the work
 * queued on this CUDA stream (a raw cudaStream_t of `device`) before their release has
 * completed, besides the default stream (always).  0 drops the extra stream.  The
 * consumer's thread calls it (the Python wrapper passes torch's current stream). */
void mml_loader_set_consumer_stream(mml_loader *L, int device, uintptr_t stream);

/* Waits up to timeout_s for the next batch (timeout_s < 0: forever).
 *   MML_OK        *out holds the batch (the caller owns its buffer references)
 *   MML_EEND      the epoch ended (once; the next call starts the next epoch)
 *   MML_ETIMEDOUT nothing yet (call again)
 *   MML_ECLOSED   closed
 *   other         on_error="raise": the failed sample's status, err naming shard, line,
 *                 image and reason (the next call continues after it); MML_ETOOMANYERR
 *                 and internal failures are sticky. */
mml_status mml_loader_next(mml_loader *L, mml_batch *out, double timeout_s, mml_err *err);

/* What mml_loader_next waits on now, for a message: the oldest sample in flight (shard and
 * line), its stage, how long it has been running and, when it waits on the network, the
 * (redacted) reference it fetches; into err->msg (status MML_ETIMEDOUT). */
void mml_loader_describe_wait(mml_loader *L, mml_err *err);
/* The binding's default bound on one next() call without any item (seconds). */
#define MML_DEFAULT_NEXT_TIMEOUT_S 600.0

/* Messages of skipped samples not yet taken (oldest first, at most `max`); returns the
 * count copied.  Messages beyond a small backlog are dropped (stats still count them).
 * A message whose status is MML_OK is a notice, not a skip (a mixture's share drift). */
int mml_loader_take_warnings(mml_loader *L, mml_err *out, int max);

#define MML_MAX_REASONS 32
typedef struct mml_loader_stats {
  double wait_s;      /* consumer time blocked in mml_loader_next */
  double wait_emit_s; /* of wait_s, while that batch was composed: waiting for or in its emission */
  double wall_s;      /* since the first mml_loader_next */
  double read_s, vision_s, text_s, collate_s; /* busy seconds per stage, all threads */
  double decode_s;                            /* the image decoder's part of vision_s */
  int queue_depth;                            /* finished batches waiting */
  int prefetch;
  int window, in_flight; /* sample window and samples being processed now */
  int num_threads;
  uint64_t samples; /* samples consumed by collation (good + skipped) */
  uint64_t good_samples;
  uint64_t skipped;    /* skipped samples the consumer has passed (with reason[]
                     below): a skip is counted, and its warning queued, when the
                     consumer's cursor passes it, never for prefetched work; a
                     padded epoch's fill pass does not count a failure again */
  uint64_t batches;    /* batches delivered */
  uint64_t bytes_read; /* record + image bytes read or fetched */
  uint64_t images;
  int64_t real_tokens, token_slots; /* over delivered batches */
  int nreasons;
  const char *reason[MML_MAX_REASONS]; /* static skip-reason names */
  uint64_t reason_count[MML_MAX_REASONS];
  int pinned;                      /* batches are in page-locked memory */
  int device;                      /* CUDA device of the batches, -1: host */
  size_t pool_cached, pool_live;   /* bytes in the host buffer pool */
  size_t pool_live_peak;           /* the most bytes of the pool's buffers in use at one time */
  size_t pool_peak;                /* the most bytes the pool held at one time (in use + cached) */
  int64_t memory_peak;             /* max_memory: the most bytes it covers that the loader's
                                    memory ledger counted at one time (the pool's, the window's,
                                    the scratch reserve and grants, the Parquet room); a count,
                                    not RSS: a re-read's grant and the bytes it re-reads count
                                    together until its decode counts them; 0 without */
  size_t scratch_mapped;           /* decoder scratch mapped now, the whole process's */
  size_t scratch_mapped_peak;      /* ... and the most at one time (mml_mapped_usage) */
  int64_t window_bytes;            /* capacity of the window's byte buffers: records, encoded
                                    images of samples in flight, spare image buffers */
  uint64_t page_faults;            /* minor page faults of the engine's own threads (workers and
                                         collator: decode, resize, the writes into batch buffers) */
  double page_faults_per_batch;    /* the same per delivered batch after the first
                                 MML_FAULT_WARMUP(prefetch) batches (the pool fills), or -1 */
  uint64_t moved_rows;             /* pixel rows copied because a sample failed only at decode
                                         (the batches after it were planned again); 0 otherwise */
  uint64_t expanded_rows;          /* pixel_format float32/bfloat16: pixel_values rows
                                    expanded from uint8 rows at emission (0: the images
                                    were decoded as they are delivered) */
  uint64_t expanded_inplace_rows;  /* ... of them, in their own buffer (grown in place) */
  uint64_t expanded_shared_rows;   /* ... of them, by a worker other than the emitting one
                                    while the consumer had nothing ready (loader_expand.c) */
  uint64_t video_plan_waits;       /* times a worker waited on the network opening/probing a
                                    remote video for its plan (a HEAD, header blocks) */
  uint64_t video_decode_waits;     /* ... while decoding one (0: every decode read preloaded
                                    bytes from memory) */
  int64_t video_preload_peak;      /* the most remote video bytes held at once ahead of their
                                    use (first blocks fetched with the images, packets
                                    preloaded for decodes), counted in max_memory */
  uint64_t video_preloads_refused; /* decodes not preloaded for want of max_memory room
                                      (they read on demand: video_decode_waits) */
  uint64_t samples_reread;         /* samples whose media bytes were dropped for earlier work
                                      under max_memory and read again by their decode */
  uint64_t reads_restarted_again;  /* of them, reads parked for room that gave back what they
                                      had read a second time or more, asked by a later head
                                      (csrc/core/loader/loader_admit.c R6; not in Python's
                                      stats: the C stress test's) */
  uint64_t room_waits;             /* waits of the workers for max_memory room (a read, a
                                      decode's scratch, an emission): one per look that found
                                      none */
  uint64_t consumer_waits;         /* next()'s waits under max_memory: one per look that found
                                      nothing for it (woken by an end of work or a batch) */
  uint64_t collator_room_waits;    /* the collation thread's waits for a batch's buffer (room
                                      or its turn): one per look that found none */
  int64_t video_open_peak;         /* the most bytes held at once by videos kept open from
                                    their probe to their decode, counted in max_memory */
  int remote;                      /* a fetcher is in use; `fetch` is valid */
  mml_fetch_stats fetch;
  int parquet;            /* a shard is a Parquet file; the pq_ fields are valid */
  uint64_t pq_row_groups; /* row groups decoded (each once while it stays cached) */
  uint64_t pq_bytes_read; /* column-chunk bytes read or fetched for them */
  int64_t pq_cache_bytes; /* decoded row groups held now */
  int64_t pq_cache_peak;  /* ... the most at one time */
  int64_t pq_cache_room;  /* the cache's room (a quarter of max_memory, else 512 MiB) */
} mml_loader_stats;
void mml_loader_get_stats(mml_loader *L, mml_loader_stats *out);
/* Under max_memory: whether the loader's memory ledger holds exactly the bytes its memory
 * is (csrc/core/loader/loader_admit.c A6), at a quiescent point (no batch being built or
 * released meanwhile: the pool's changes reach the ledger after the pool's lock).
 * MML_EINTERNAL naming both sides when not; MML_OK without max_memory. */
mml_status mml_loader_check_memory(mml_loader *L, mml_err *err);
/* mml_loader_get_stats and mml_loader_source_stats of sources 0..nsrc-1 into src[] as one
 * snapshot (one hold of the loader's lock): while the collator runs, separate calls can
 * see different moments (sum of src[].samples != good_samples); this one cannot.
 * nsrc is clamped to mml_loader_num_sources; src may be NULL when nsrc is 0. */
void mml_loader_get_stats_all(mml_loader *L, mml_loader_stats *out, mml_source_stats *src,
                              int nsrc);
/* What max_memory sets aside for each worker's decode/resize scratch: what stays mapped
 * between images (rows, the kept multi-scan JPEG region of up to 8 MiB, whole-image buffers
 * trimmed to MML_SCRATCH_KEEP after each decode).  A decode whose image needs more (its
 * header says: mml_vision_plan.scratch) takes that much more room before it starts. */
#define MML_SCRATCH_RESERVE ((int64_t)16 << 20)
#define MML_SCRATCH_KEEP ((size_t)4 << 20)
/* Without max_memory a worker keeps its decoder's multi-scan JPEG region between images up
 * to this size (a 4:2:0 progressive image of about 22 megapixels; with max_memory: 8 MiB,
 * within MML_SCRATCH_RESERVE), as it keeps its other scratch untrimmed there: a region
 * mapped afresh for every large progressive photo cost the kernel's zeroing of every page
 * (docs/benchmarks.md "End to end at the caps"). */
#define MML_WORKER_JPEG_KEEP ((size_t)64 << 20)
/* Batches delivered before page faults are counted per batch (every buffer the pipeline
 * circulates has been mapped once by then). */
#define MML_FAULT_WARMUP(prefetch) (2 * (prefetch) + 8)

/* ---- the per-sample pipeline (loader/pipeline.c), used by the workers ---------------- */

typedef struct mml_pipeline {
  const mml_vision_cfg *vision;
  const mml_template *tmpl;
  int64_t max_length;             /* 0: no limit */
  int64_t max_sample_pixels;      /* > 0 */
  int64_t max_sample_pixel_bytes; /* > 0: mml_sample_plan's bound on the pixel bytes */
  int plan_only;                  /* stop before decoding: no pixels, no images (cfg.plan_only) */
} mml_pipeline;

struct mml_video;
struct mml_video_info;
struct mml_video_plan;

/* Per-worker scratch, reused across samples. */
typedef struct mml_sample_scratch {
  mml_vision_scratch *vision;
  mml_tok_scratch *tok;
  int64_t *tokens;
  int cap;
  mml_mix_scratch mix;     /* the mixture lookup's */
  double vision_s, text_s; /* accumulated busy time, taken by the engine */
  /* videos */
  struct mml_video_scratch *video;
  struct mml_video_tokens *vtokens;
  int vcap;
  double *vts; /* every video's Qwen3-VL timestamps, one array */
  size_t vts_cap;
} mml_sample_scratch;

mml_status mml_sample_scratch_init(mml_sample_scratch *s, mml_err *err);
void mml_sample_scratch_free(mml_sample_scratch *s);

/* THE measuring function: the one place a sample's sizes are computed, shared by the
 * loader's workers (through mml_sample_plan), the global plan's planning pass and the
 * dataset-index builder (loader/measure.c reads a record and its media's headers for
 * those two).  From a parsed record, the bytes of its media (images[0, rec->nimages),
 * then the frames of every frame-list video in order; a header is enough) and the probe
 * of each video file (vinfo[v]): each image's plan (plans[i]: size after EXIF
 * orientation, smart_resize grid, token count), each video's plan (vplans[v]: frame
 * indices, sizes, grid, tokens, timestamps), out->vision_tokens, and the template's
 * out->input_ids + out->labels with those counts (appended); the max_sample_pixels check.
 * Nothing else of `out` is touched.  On failure err names the image or video and reason. */
mml_status mml_sample_measure(const mml_pipeline *pl, mml_sample_scratch *sc, const mml_record *rec,
                              const mml_bytes *media, mml_vision_plan *plans,
                              const struct mml_video_info *vinfo, struct mml_video_plan *vplans,
                              mml_sample *out, mml_err *err);
/* The checks on a measured sample that depend on the loader's settings, not its sizes:
 * some label supervised (mml_sample_check_target), max_length (MML_ETOOLONG). */
mml_status mml_sample_check(const mml_pipeline *pl, const mml_sample *s, mml_err *err);
/* MML_ENOTARGET when no label of s is supervised (no trainable turn): the part of
 * mml_sample_check a dataset index records (max_length is checked where counts are used). */
mml_status mml_sample_check_target(const mml_sample *s, mml_err *err);
/* The bytes of a sample's pixel_values (rows image patch rows) and pixel_values_videos
 * (vrows) in v's pixel_format (saturating at INT64_MAX): the one formula the worker
 * (mml_sample_plan), the planning pass and the index-based plan (rows = tokens * merge^2)
 * apply max_sample_pixel_bytes with. */
int64_t mml_sample_pixel_bytes(const mml_vision_cfg *v, int64_t rows, int64_t vrows);
/* MML_ESAMPLEPIXELS (skip reason sample_too_large) when mml_sample_pixel_bytes is above
 * pl->max_sample_pixel_bytes; the last check of mml_sample_plan before its grids. */
mml_status mml_sample_check_pixel_bytes(const mml_pipeline *pl, int nimages, int nvideos,
                                        int64_t rows, int64_t vrows, mml_err *err);
/* mml_sample_measure, mml_sample_check, then the rest of the sample's plan:
 * plans `out` from a parsed record and the encoded bytes of each of its images, before
 * any pixel work: each image's plan from its header alone (plans[i], nimages of them:
 * size after EXIF orientation, smart_resize grid, token count), each video's plan
 * (vplans[v], nvideos of them, kept by the caller until mml_sample_decode_videos: frame
 * lists from their frames' headers, files from their probe vinfo[v] — qwen-vl-utils'
 * frame indices, sizes, grid, tokens, timestamps), the template's ids + labels with
 * those token counts, the grids (image and video), pixel_rows/cols, vpixel_rows, and the
 * max_length and max_sample_pixels checks.  out->pixels_elsewhere is set: the image
 * pixels are written later, by mml_sample_decode, wherever the caller wants them; the
 * video pixels likewise by mml_sample_decode_videos.  images[0, rec->nimages) are the images, then come the frames of every
 * frame-list video in order (mml_record_frames(rec) in all).  On failure err names the
 * image or video and reason; the caller prefixes shard and line. */
mml_status mml_sample_plan(const mml_pipeline *pl, mml_sample_scratch *sc, const mml_record *rec,
                           const mml_bytes *images, mml_vision_plan *plans,
                           const struct mml_video_info *vinfo, struct mml_video_plan *vplans,
                           mml_sample *out, mml_err *err);
/* Decodes + resizes + normalises + patchifies every image of a planned sample straight
 * into dst (its pixel_rows rows of mml_vision_row_bytes, the images in order). */
mml_status mml_sample_decode(const mml_pipeline *pl, mml_sample_scratch *sc, const mml_record *rec,
                             const mml_bytes *images, const mml_vision_plan *plans, int nimages,
                             void *dst, mml_err *err);
/* Opens video file v of the record (the caller knows where it lives). */
typedef mml_status (*mml_sample_video_open_fn)(void *ctx, int v, struct mml_video **out,
                                               mml_err *err);
/* Decodes every planned video of a sample straight into dst (its vpixel_rows rows of
 * mml_vision_video_row_bytes, the videos in order): frame lists from their frames' bytes
 * (images + rec->nimages on), files opened by `open` and decoded at exactly the planned
 * frames, then closed. */
mml_status mml_sample_decode_videos(const mml_pipeline *pl, mml_sample_scratch *sc,
                                    const mml_record *rec, const mml_bytes *images,
                                    const struct mml_video_plan *vplans,
                                    mml_sample_video_open_fn open, void *ctx, void *dst,
                                    mml_err *err);

/* Resolves an image reference against a root ("dir", "s3://bucket/prefix", or NULL):
 * URLs and absolute paths are kept, anything else is joined to root. */
mml_status mml_sample_image_path(const char *root, const char *ref, mml_bytes *out, mml_err *err);
/* The path policy for one reference `ref` of a record (resolved: its mml_sample_image_path)
 * of a shard (local_shard: the shard is a local file): MML_EPATH naming the option when
 * !cfg->allow_remote_images and a local shard's record names a URL, or
 * !cfg->allow_paths_outside_root
 * and the reference is absolute, climbs out of the root with "..", or resolves (symlinks
 * followed) outside the root.  Checks names only: nothing is opened. */
/* Prefixes err with "image <ref>" (the reference shortened in the middle). */
void mml_sample_err_image(mml_err *err, const char *ref);
/* Prefixes err with "video <ref>" (a file, unless the message names it already) or
 * "video <v>" (a frame list: video v of the record). */
void mml_sample_err_video(mml_err *err, const mml_video_ref *vr, int v);
mml_status mml_sample_image_allowed(const mml_loader_cfg *cfg, const char *root, const char *ref,
                                    const char *resolved, int local_shard, mml_err *err);

#endif
