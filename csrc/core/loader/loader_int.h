/*
 * loader_int.h — private to the loader (loader.c: public API, construction, lifecycle,
 * the consumer; loader_worker.c: the worker threads and the per-sample task (its video
 * files: loader_video.c);
 * loader_collator.c: the collation thread and the emission/output queue).  The design
 * (threads, slots, plans, locking, ownership) is described at the top of loader.c; every
 * function named *_locked is called with `mu` held.
 */
#ifndef MML_LOADER_INT_H
#define MML_LOADER_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "mml/collate.h"
#include "mml/device.h"
#include "mml/dsindex.h"
#include "mml/index.h"
#include "mml/ledger.h"
#include "mml/loader.h"
#include "mml/mixture.h"
#include "mml/sampler.h"
#include "mml/video_frames.h"

/* A slot: EMPTY (free), BUSY (a worker or fetch is reading/planning it), PLANNED (its
 * counts are known; its pixels are not written yet), DONE (final: good with its pixels
 * written, or failed). */
enum { SLOT_EMPTY = 0, SLOT_BUSY, SLOT_PLANNED, SLOT_DONE };
/* The decode of a PLANNED slot: not queued, queued (waiting for a worker), running. */
enum { DEC_NONE = 0, DEC_QUEUED, DEC_RUNNING };
enum {
  STAGE_NEW = 0,
  STAGE_RECORD,
  STAGE_IMAGES,
  STAGE_VIDEOS /* planned; its videos' bytes come */
};
enum { ITEM_BATCH = 0, ITEM_ERROR, ITEM_DROP };
enum { WARN_BACKLOG = 32, SKIP_LOG = 256 };
enum { MML_SPARE_BUFS = 64 }; /* spare image byte buffers kept (ld_bytes_take) */
/* Video files kept open between their probe (plan stage) and their decode: each holds a
 * demuxer, a decoder and maybe a file descriptor; past this many the rest are closed
 * after the probe and opened again to decode. */
enum { MML_VIDEOS_KEPT_OPEN = 128 };

typedef struct task task;

/* A Parquet shard's row copied out of its decoded row group (loader_parquet.c): its JSON
 * record (NUL-terminated) and blobs; held by a task or a measurer once it has read the
 * record of a sample of a Parquet shard (consulted only then). */
typedef struct ld_pq_row {
  mml_bytes buf; /* the JSON (json_len bytes, NUL), then each blob's name (NUL) and bytes */
  size_t json_len;
  struct ld_pq_blob {
    size_t name, data, len; /* offsets into buf */
  } * blob;
  int n, cap;
  int shard; /* the row held (shard -1: none) */
  int64_t row;
} ld_pq_row;

/* The two pixel planes of a batch: pixel_values (image rows) and pixel_values_videos
 * (video rows), each its own buffer with its own row width. */
enum { PL_IMG = 0, PL_VID = 1, PLANES = 2 };

/* A sample's place in one plane: its first row in its ticket's plane, where its rows must
 * go (dest, a reference held; NULL: not known yet) and where they are (home, once
 * decoded). */
typedef struct place_at {
  int64_t row;
  mml_buf *dest, *home;
  size_t dest_off, home_off;
} place_at;

typedef struct fetch_ref {
  task *t;
  int which; /* -1: the record, else image index (video index: task_vhead) */
} fetch_ref;

/* A remote video file's size (HEAD) and first block, fetched with the record's images so
 * that its open at plan time need not wait for them (loader_video.c). */
typedef struct task_vhead {
  int64_t size;       /* 0: not known */
  int64_t open_bytes; /* what the video kept open for the decode holds (max_memory) */
  mml_bytes first;
  mml_bytes tail; /* an mp4's header past the first block (mml_video_header_range) */
  int64_t tail_off;
  fetch_ref ref[3]; /* the HEAD's, the first block's and the tail's completions */
} task_vhead;

/* The waits for room that still poll (loader_admit.c W2, W5: the stall detectors' looks):
 * cv (a CLOCK_MONOTONIC condition variable) for at most 5 ms, mu held.  The caller is
 * ld_work_wait_locked (loader_admit.c W4, W5). */
static inline void ld_wait_5ms(pthread_cond_t *cv, pthread_mutex_t *mu) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ts.tv_nsec += 5000000;
  if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
  pthread_cond_timedwait(cv, mu, &ts);
}

struct task {
  mml_loader *L;
  /* guarded by mu */
  int state;
  uint64_t gen;
  int64_t seq;
  int pending;            /* outstanding fetches + 1 while submitting */
  uint64_t fetched_bytes; /* bytes its completed fetches brought */
  mml_status fetch_st;    /* first fetch failure */
  mml_err fetch_err;
  task *next_ready;
  double started; /* when it was dispatched (what next() waits on) */
  /* owned by whoever holds the slot (BUSY) */
  int stage;
  mml_sample sample;
  mml_bytes rec_bytes;
  ld_pq_row pqrow; /* a Parquet shard's row: its record and blobs (shard -1: none) */
  mml_record rec;
  int rec_parsed;
  mml_bytes *imgs;
  fetch_ref *refs;
  int imgs_cap;
  mml_bytes path;
  mml_vision_plan *plans; /* per image, from its header (imgs_cap of them) */
  /* videos (vcap of them): each file's probe and every video's plan, from the plan stage
   * to the decode stage; a WebDataset member video's bytes are imgs[nmedia + v] */
  struct mml_video_info *vinfo;
  struct mml_video_plan *vplans;
  struct mml_video **vids; /* each file kept open from its probe to its decode (NULL:
                              closed; at most MML_VIDEOS_KEPT_OPEN per loader) */
  task_vhead *vhead;       /* remote files: what their open reads first */
  int vcap;
  /* remote video bytes held ahead of their use, counted in held / max_memory (mu): the
   * first blocks submitted with the images (until the probe), the packet ranges
   * preloaded for the decode (until it ends) */
  int64_t vhead_bytes, vpre_bytes;
  int vtails; /* the plan stage looked for mp4 headers past the first blocks (tail_video) */
  /* placement (loader_place.c; guarded by mu): the batch the planner put it in (a ticket,
   * -1: not placed) and, per plane (PL_IMG images, PL_VID videos), its place there */
  int64_t tk;
  int64_t decode_cost; /* set when it becomes PLANNED: the order of its batch's decodes */
  int dec;
  place_at at[PLANES];
  task *next_dec;
  int64_t held; /* capacity of its byte buffers, counted in win_bytes (mu) */
  /* of them, the slot's own (record, path, Parquet row: kept for the next sample in the
   * slot): the ledger's FIXED credit, the rest (media bytes ahead of their decode) ENGINE */
  int64_t held_fixed;
  /* max_memory: the decoder scratch its images' decodes map beyond a worker's reserve
   * (the most of its images' plans, mml_vision_plan.scratch), and what its running decode
   * was granted of it (counted in scratch_extra; mu) */
  int64_t scratch_need, scratch_granted;
  /* max_memory: its media's bytes were dropped to make room for earlier work
   * (ld_admit_drop_bytes_ahead_locked; reread_bytes of them) and are read again by its
   * decode, which takes room for them first (reread_granted, in scratch_extra until they
   * are read and counted in held; mu); fetched bytes are fetched again, and must be the
   * same: reread_sum, ld_task_media_sum's answer when they were dropped */
  int reread;
  int64_t reread_bytes, reread_granted;
  uint64_t reread_sum;
  /* max_memory: what was charged for its image bytes before they were read
   * (ld_bytes_take: the growth of the buffer they are read into), counted in read_extra
   * until they are counted in held (ld_mem_count_task_locked; mu) */
  int64_t read_cover;
  /* max_memory: its reads' bytes as charges in the ledger at its seq (ld_admit_read_locked,
   * loader_admit.c R1-R5), rc_cap of them (kept in place while any is in the ledger):
   * rc[0..nrc) granted and taken by their reads, revocable until its decode begins (R5;
   * c->revocable 0: settled, as any below rc[nrc] while that one is in the ledger);
   * rc[nrc] the one asked now, in the ledger while rch_on (WAITING: the task is parked for
   * room, on room_head, and goes on reading at media item room_at, -1 when not parked,
   * with room_nremote fetches of that stage submitted; GRANTED: not taken yet).  All mu's
   * but the charges' state (the ledger's: mml_ledger_state) and `revoked`, set by the
   * revoke callback (no mu) when the ledger asks one back (L10). */
  mml_charge *rc;
  int rc_cap, nrc;
  int rch_on, room_at, room_nremote;
  int resume_at; /* room_at when a look took it off room_head (the slot holder's) */
  /* max_memory: times its read, parked, gave back what it had read when asked and read
   * again from its first media item, and the ledger's head seq (the charge that asked) at
   * the last of them: again only for a later head (loader_admit.c R6; mu) */
  int restarted;
  int64_t restart_head;
  /* max_memory: the ledger's head seq (a ticket's charge) for which this parked read, its
   * out-of-turn try refused, gave back what it had read (loader_admit.c T6; -1: none; mu) */
  int64_t t5_head;
  /* max_memory: its decode's scratch and its re-read's bytes as one charge in the ledger
   * at its seq (ld_mem_scratch_take_locked, loader_admit.c D1-D4), in the ledger while
   * sch_on (WAITING: the decode stays queued; GRANTED: not taken yet; mu but its state) */
  mml_charge sch;
  int sch_on;
  _Atomic int revoked;
};
/* The read's charge asked now (rc[nrc]). */
#define LD_RCH(t) (&(t)->rc[(t)->nrc])

/* One batch as the planner composed it from planned counts, ahead of the collator; its
 * pixel_values buffer once known. */
typedef struct tk_plane {
  int64_t rows;      /* rows placed */
  int64_t done_rows; /* rows of its samples the collator has taken */
  mml_buf *buf;      /* cap_rows rows; NULL until materialized */
  int64_t cap_rows;
  int64_t pending_rows; /* > 0: a buffer of this many rows waits for max_memory room */
  /* max_memory: the buffer's charge in the memory ledger (ld_admit_ticket_locked), in it
   * (WAITING, or GRANTED and not yet mapped) while `charged`; `charged` is mu's, ch.state
   * the ledger's (read it with mml_ledger_state) */
  mml_charge ch;
  int charged;
} tk_plane;

typedef struct ticket {
  mml_compose comp; /* its composition so far */
  int64_t epoch;
  int64_t first_seq;   /* its first sample */
  int closed;          /* complete by plan */
  tk_plane pl[PLANES]; /* pixel_values, pixel_values_videos */
  /* compact, max_memory: its expansion's charge (loader_admit.c E1), the float rows' pages
   * beyond its uint8 buffer, asked at first_seq once its rows are final; in the ledger
   * (WAITING, or GRANTED and held until its emission) while `xon` */
  mml_charge xch;
  int xon;
} ticket;

/* What one task_run call did, added to the stats by the worker (the task itself may
 * already belong to another worker when task_run returns). */
typedef struct run_acc {
  uint64_t bytes;
  double read_s;
} run_acc;

typedef struct out_item {
  int kind;
  int64_t epoch;
  mml_batch batch;
  mml_err err;
  size_t fbytes; /* compact: bytes of its expanded pixel_values (0: none) */
  size_t bytes;  /* its tensors' bytes (the output queue's byte budget) */
  double handed; /* batches: when the collator handed it off for emission (mml_now) */
} out_item;

enum { PEND_EMPTY = 0, PEND_QUEUED, PEND_EMITTING, PEND_READY };
typedef struct pend_item {
  int state;
  int coll;         /* PEND_QUEUED/EMITTING: the collator instance to emit from */
  mml_cursor after; /* batch items: the cursor once consumed */
  size_t fneed;     /* compact, queued: the pool bytes its emission adds (the gate's) */
  int64_t seq;      /* its batch's first sample (its ticket's): its emission's seq (M4) */
  /* max_memory, queued: the pool bytes its emission maps, for its float rows (fneed in
   * whole pages: 2 MiB in place, else a fresh buffer's) and its other tensors
   * (mml_collator_emit_bytes) */
  int64_t fpool, sneed;
  /* max_memory, queued: ENGINE credit its ticket's expansion charge was granted (E1), which
   * its emission takes as its float rows' pages (the rest of fpool is asked then) */
  int64_t xcarry;
  /* max_memory, queued: its emission's charge of fpool + sneed at `seq` (loader_admit.c E1),
   * in the ledger while `charged` (WAITING, or GRANTED and not taken yet) */
  mml_charge ch;
  int charged;
  out_item it; /* PEND_READY: the item (kind ITEM_DROP: nothing, after a failure) */
} pend_item;

/* One source at run time (loader_sources.c): the settings its samples are processed with,
 * and its stats (guarded by mu). */
typedef struct ld_source {
  char *name;
  char *image_root;        /* NULL: each shard's own folder */
  char **pq_map;           /* its `columns`: pairs {column, key, ..., NULL}, or NULL */
  int shard0, nshards;     /* its shards in ix */
  int64_t first, n, count; /* its samples in ix; its draws per epoch */
  mml_vision_cfg vision;
  mml_template *tmpl;
  mml_pipeline pl;          /* vision, tmpl, max_length: what the worker uses */
  mml_vision_cfg vision_u8; /* compact pixels (loader_place.c): vision as uint8 rows, */
  mml_pipeline pl_u8;       /* and pl with it: what images are decoded with */
  uint64_t good, skipped, bytes;
  uint64_t skip_by_status[MML_STATUS_COUNT];
  int64_t tokens, image_tokens;
  int drift_warned;
  uint64_t index_key;   /* the dataset-index settings key of its samples' counts */
  char *index_settings; /* what the key covers (for messages) */
} ld_source;

struct mml_loader {
  mml_loader_cfg cfg; /* strings below are owned copies */
  char **data;
  char *image_root;
  char *system_prompt;   /* NULL: the template's default system turn */
  char **roots;          /* per shard image root */
  int *remote;           /* per shard: 1 when remote */
  mml_bytes *shard_text; /* [shard_text_cap]: a remote shard's text kept from its scan
                            (len 0: none; loader.c scan_shard); read-only once built */
  int shard_text_cap;
  int64_t shard_text_bytes;
  int *shard_src; /* per shard: its source */
  mml_index ix;
  struct ld_pq_cache *pqc; /* Parquet shards' decoded row groups (loader_parquet.c), or NULL */
  mml_dsx **dsx;           /* per shard (dsx_cap): its dataset index's counts, or NULL */
  int dsx_cap;
  int index_used;  /* shards whose index counts are used */
  char *index_dir; /* owned copy of cfg.index */
  uint64_t tok_id; /* the tokenizer's identity (settings keys) */
  ld_source *src;  /* nsrc >= 1 sources (one without a mixture) */
  int nsrc;
  mml_mixture mix;           /* the epoch order over the sources */
  mml_sampler sm;            /* the rank's slots of the mixture's epoch order */
  int64_t n_rank, per_epoch; /* per_epoch: batches (padded) or -1 (packed) */
  int window;
  mml_pool *pool;
  mml_allocator alloc; /* behind pool: host, pinned, or the caller's */
  int pinned;
  int guard_device;          /* pinned: device whose default stream guards released batches */
  int consumer_device;       /* pinned: and this stream of that device, when not 0 */
  uintptr_t consumer_stream; /* (consumer thread only) */
  mml_device_stage *stage;   /* device >= 0: copies finished batches to the GPU */
  mml_collate_cfg ccfg;
  mml_collator *collator; /* colls[0]; workers also call its const, reentrant check */
  mml_collator **colls;   /* ncoll instances: batches are composed one at a time by the
                           collation thread and emitted (tensors built) by workers */
  int ncoll;

  /* plan before decode (loader_place.c; collation thread, under mu): batches composed
   * from planned counts ahead of the collator, tickets tk_head..tk_tail in a ring of
   * ntk; place_seq: the next sample to place */
  int placing; /* 0: plan_only (no pixels) */
  ticket *tks;
  int ntk;
  int64_t tk_head, tk_tail;
  int64_t place_seq;
  int64_t rows_bound[PLANES]; /* packed: most rows a pack can hold; -1: padded */
  size_t row_bytes[PLANES];   /* bytes of one pixel_values / pixel_values_videos row (in
                                 flight: compact images are uint8 rows) */
  int compact;                /* images in flight as uint8 rows, expanded at emission */
  float ptable[3][256];       /* compact: the float value of each byte (all sources') */
  size_t expand_row_bytes;    /* compact: bytes of one emitted pixel_values row */
  uint64_t expanded_rows;     /* compact: rows expanded at emission (stats) */
  uint64_t inplace_rows;      /* compact: those of them expanded in place (stats) */
  uint64_t shared_rows;       /* compact: those of them expanded by a helping worker (stats) */
  struct ld_xshare *xs;       /* compact: the emission whose expansion is shared (mu) */
  task *dec_head, *dec_tail;  /* decode jobs, in placement order */
  uint64_t moved_rows;        /* rows copied after a late failure changed the plan */
  /* max_memory (loader_place.c, under mu) */
  int64_t win_bytes;        /* capacity of the window's byte buffers (records, images) */
  int64_t max_sample_bytes; /* the most encoded bytes one sample has had (0: none yet) */
  int mem_blocked;          /* a ticket waits (for room, or its turn: rebuffer) */
  int expand_waits;         /* a ticket's expansion charge waits (loader_admit.c E1) */
  int place_held;           /* placement stopped until the collator takes samples (C2) */
  /* decoder scratch beyond the per-worker reserve (ld_mem_scratch_take_locked): granted to
   * the decodes running */
  int64_t scratch_extra;
  /* compact: bytes granted to emissions running (their float rows) */
  int64_t emit_extra;
  /* bytes charged for reads before they were made, not yet counted in held (read_cover) */
  int64_t read_extra;
  /* tasks parked while their read's charge waits in the ledger (linked by next_ready;
   * loader_admit.c R2) and their count */
  task *room_head;
  int reads_parked;
  _Atomic int reads_revoked; /* some task's read charge was asked back (R5) */
  /* pool growth the ledger's hook charged without a charge made before it (atomic: the
   * hook runs on any thread); 0 is the aim (loader_admit.c A7) */
  _Atomic int64_t led_uncovered;
  /* batches queued for the consumer while the engine still held a reference to one of
   * their buffers (loader_admit.c A10: 0 is the rule; mu) */
  int64_t led_engine_refs;
  /* workers looking for work or room or waiting (from before their look: W4) and the
   * collator looking or waiting for a buffer (ld_coll_look_locked): the events that give
   * room back poke the ledger / the collator's count only while there is one (W1; atomic:
   * the pool's hook runs on any thread, with or without mu) */
  _Atomic int room_waiting_work, room_waiting_coll;
  /* events that gave room back (ld_room_wake): with withdrawals, what makes a refused
   * out-of-turn try stale (loader_admit.c T6: ld_admit_decode_events_locked) */
  _Atomic uint64_t room_events;
  int decoding; /* decodes running */
  /* the collation thread has taken a sample and not yet added it (mu dropped meanwhile:
   * a batch it completes is handed off after): engine work (loader_admit.c C2) */
  int collating;
  /* waiting charges withdrawn (ld_room_withdrawn_locked): with room_events, what lets a
   * parked read's out-of-turn try be granted (loader_admit.c T6) */
  uint64_t withdrawals;
  /* max_memory: the out-of-turn try (loader_admit.c T5) of parked read t5_refused_seq was
   * refused at the worker's look that read ld_admit_decode_events_locked n (n + 1; 0: none;
   * T6, C4; mu) */
  uint64_t t5_refused;
  int64_t t5_refused_seq;
  int consumer_waiting; /* the consumer is blocked in next() */
  uint64_t faults;      /* minor faults of the engine's threads (ld_count_faults) */
  uint64_t faults_warm; /* `faults` when batch MML_FAULT_WARMUP was delivered */

  /* image byte buffers of finished samples, for reuse (loader_bytes.c, under spare_mu:
   * B1); their capacity spare_bytes is not in win_bytes (B2) */
  pthread_mutex_t spare_mu;
  mml_bytes spare[MML_SPARE_BUFS];
  int nspare;
  int64_t spare_bytes;
  uint64_t room_waits;            /* workers' waits for room (ld_work_wait_locked) */
  uint64_t consumer_waits;        /* next()'s waits by the ledger (loader_admit.c C2) */
  uint64_t collator_room_waits;   /* the collation thread's waits for room (W2) */
  int room_waiters;               /* workers in such a wait now (W5) */
  uint64_t samples_reread;        /* max_memory: samples whose media bytes were dropped and read
                              again (ld_admit_drop_bytes_ahead_locked; mu) */
  uint64_t reads_restarted_again; /* of them, parked reads restarted a second time or more,
                                     asked by a later head (loader_admit.c R6; mu) */
  int videos_kept;                /* tasks' open videos (atomic, relaxed: MML_VIDEOS_KEPT_OPEN) */
  /* workers' waits on the network in remote video reads (atomic, relaxed): opening and
   * probing at plan time, and decoding (0 when every decode's bytes were preloaded) */
  uint64_t video_plan_waits, video_decode_waits;
  /* remote video bytes held ahead of their use, all tasks (mu): now, the most at once,
   * and preloads not made for want of max_memory room (their decode reads on demand) */
  int64_t video_held, video_held_peak;
  uint64_t video_preloads_refused;
  /* bytes of the videos kept open from their probe to their decode (mu; counted in
   * win_bytes through their tasks): now and the most at once */
  int64_t video_open_bytes, video_open_peak;
  /* the one ordered byte ledger (loader_admit.c THE LEDGER; NULL without max_memory):
   * every byte the cap covers is charged to it; its caches' ids (pooled pages, spare
   * byte buffers) */
  mml_ledger *ledger;
  int led_pool, led_spare;

  pthread_mutex_t mu;
  pthread_cond_t work_cv, coll_cv, out_cv;
  /* the collation thread's wait for a buffer (loader_admit.c W2): its event count, moved
   * by ld_coll_poke under coll_mu (a leaf lock: nothing is taken under it) */
  pthread_mutex_t coll_mu;
  pthread_cond_t coll_room_cv;
  uint64_t coll_events;
  int coll_waits_room; /* the collator is in that wait (mu): events under mu poke it */
  int started, stop, closed;
  /* set by close() before it joins the threads (read without mu): a decode, an index
   * scan or a fetch wait under way stops within milliseconds (ARCHITECTURE 4.8); its
   * parent is the caller's cfg.cancel (Ctrl-C during construction) */
  mml_cancel cancel;
  pthread_t *threads;
  int nthreads_started;
  pthread_t coll_thread;
  int coll_started;

  mml_fetcher *fetcher; /* created on first remote use (under mu) */
  mml_status fetcher_st;
  mml_err fetcher_err;

  /* plan and window, guarded by mu */
  uint64_t gen;
  int64_t base_epoch, base_pos, base_seq;
  int base_wrap;
  int64_t head_seq, next_seq;
  int64_t limit_seq; /* -1, or: no sample at seq >= limit_seq is started (seek_ahead) */
  mml_cursor start;  /* where the collator starts for the current gen */
  task *tasks;
  task *ready_head, *ready_tail;
  int in_flight;

  /* emission, guarded by mu: completed items wait in `pend` (in stream order) until
   * they fit in the output queue; batch items are emitted by a worker first */
  pend_item *pend;
  int npend; /* capacity */
  int64_t pend_head, pend_tail;
  int jobs_queued; /* pend items waiting for a worker to emit them */
  int emitting;    /* emits running now */
  int dropping;    /* drop_output_locked is waiting for emits (mu released) */
  int *coll_busy;  /* 1 while a worker emits from colls[i] */

  /* output queue, guarded by mu: a ring of out_cap slots that grows (doubling) up to
   * `prefetch` as items arrive, so an absurd prefetch costs nothing until used; it is
   * full at `prefetch` items or once its batches hold out_budget bytes (ld_out_full) */
  out_item *outq;
  int out_cap, out_head, out_count;
  size_t out_bytes, out_budget;
  mml_status fatal;
  mml_err fatal_err;

  /* consumer side, guarded by mu */
  int64_t consumer_epoch;
  mml_cursor delivered;
  /* the consumer received its epoch's last batch: its next next() ends the epoch
   * (MML_EEND) at once, without waiting for a batch of the next epoch */
  int epoch_done;
  /* the latest epoch the consumer asked a batch of (next() called in it, a seek): the
   * remote video bytes of a later epoch's sample are not fetched before it is asked for
   * (ld_video_park), so a consumer that stops at an epoch's end did not pay for them */
  int64_t asked_epoch;
  task *parked_head; /* those samples, parked (linked by next_ready) until then */

  /* warnings and stats, guarded by mu */
  mml_err warn[WARN_BACKLOG];
  int warn_head, warn_count;
  /* skipped samples composed but not yet passed by the consumer, in stream order: they
   * are counted and reported when the consumer's cursor passes them, so stats and
   * warnings describe what the consumer received, not what was prefetched */
  struct skip_entry {
    int64_t epoch, pos;
    int source;
    mml_err err;
  } * skips;
  int skip_head, skip_count;
  uint64_t coll_skipped; /* skips composed (the max_error_rate check) */
  /* wait_emit_s: of wait_s, while the batch waited for was composed (handed off for its
   * emission: queued for it or in it; compact pixels: its expansion) */
  double first_next, wait_s, wait_emit_s;
  double read_s, vision_s, text_s, collate_s;
  double decode_s; /* the decoder's part of vision_s */
  uint64_t samples, good, skipped, batches, bytes_read, images;
  uint64_t skip_by_status[MML_STATUS_COUNT];
  int64_t real_tokens, token_slots;

  /* the global plan (loader_plan.c): NULL unless max_tokens_per_batch, balance or
   * group_by_length is set */
  struct ld_gplan *gp;
};

/* loader.c */
/* The stream coordinate (epoch, pos) of seq under the current plan. */
void ld_plan_at_locked(const mml_loader *L, int64_t seq, int64_t *epoch, int64_t *pos);
/* Starts a new plan at (epoch, pos) from head_seq; discards finished work of the old one. */
void ld_rebase_locked(mml_loader *L, int64_t epoch, int64_t pos, int wrap);
/* The loader's fetcher, created on first use (takes mu). */
mml_status ld_get_fetcher(mml_loader *L, mml_fetcher **out, mml_err *err);

/* Indexes a data path (a shard, or an s3:// glob's shards) as the next shard(s). */
mml_status ld_add_data(mml_loader *L, const char *path, mml_err *err);

/* loader_sources.c */
/* Sources, index, counts, mixture, sampler, per-shard roots, per-source pipelines. */
mml_status ld_build_sources(mml_loader *L, const mml_loader_cfg *cfg, mml_err *err);
void ld_free_sources(mml_loader *L);
/* s->epoch, s->pos -> s->source, s->index (the mixture lookup; outside mu). */
mml_status ld_lookup(const mml_loader *L, mml_mix_scratch *sc, mml_sample *s, mml_err *err);
/* The collator consumed s: its source's stats, and the drift check. */
void ld_source_count_locked(mml_loader *L, const mml_sample *s);
/* A skipped sample of source `source`, counted when the consumer passes it. */
void ld_source_count_skip_locked(mml_loader *L, int source, mml_status st);
/* Source i's counters (samples, skips, tokens, bytes) into *o (mu held). */
void ld_source_counts_locked(const mml_loader *L, int i, mml_source_stats *o);
/* Sources 0..nsrc-1's fixed stats (name, sizes, data hash; counters zero), no lock. */
void ld_sources_fixed(const mml_loader *L, mml_source_stats *src, int nsrc);

/* Adds the calling thread's minor page faults since *last to L->faults (mu held). */
void ld_count_faults_locked(mml_loader *L, uint64_t *last);

/* loader_dsindex.c (see there) */
uint64_t ld_tokenizer_identity(const mml_tokenizer *tok);
/* src->index_key and index_settings from its settings. */
mml_status ld_index_source_key(mml_loader *L, ld_source *src, const mml_source_cfg *sc,
                               mml_err *err);
/* Local: size and mtime; remote: size and ETag (HEAD). */
mml_status ld_shard_identity(mml_loader *L, const char *path, int64_t *size, int64_t *mtime_ns,
                             char *etag, size_t cap, mml_err *err);
/* Before a shard is scanned: its index when there is one (stale: an error).  *added: the
 * shard was added from it (no scan); else *pending (compressed shards) goes to
 * ld_index_attach once the scan added the shard. */
mml_status ld_index_open(mml_loader *L, const char *path, mml_dsx **pending, int *added,
                         mml_err *err);
mml_status ld_index_attach(mml_loader *L, mml_dsx *pending, mml_err *err);
/* After the sources' keys are known: counts of indexes built under other settings are
 * dropped (one warning each). */
void ld_index_check_sources(mml_loader *L);
/* 1 when the index knows sample `index` (global, of `shard`; -1: looked up) planned under
 * its source's settings: its total tokens (text + image pads) and image tokens. */
int ld_index_counts(const mml_loader *L, int shard, int64_t index, int64_t *tokens,
                    int64_t *vision_tokens);
/* Every sample's counts from the dataset index, as a planning pass would find them
 * (tokens -1 and why = the status for a sample that fails; max_record_bytes and
 * max_length applied): 1 when every shard has an index whose counts apply, else 0 (and
 * nothing written). */
int ld_index_all_counts(const mml_loader *L, int64_t *tokens, int64_t *vision, uint8_t *why);
/* A worker's check before reading a sample: too long for max_length or the collator, from
 * the index (MML_OK when unknown). */
mml_status ld_index_precheck(const mml_loader *L, const mml_sample *s, mml_err *err);
void ld_index_free(mml_loader *L);

/* measure.c (see its top comment): one sample measured from its record and its media's
 * headers (or whole media: head < 0) with mml_sample_measure, outside the stream. */
typedef struct ld_measurer {
  mml_loader *L;
  int64_t head;   /* bytes of each image or frame read first; < 0: whole */
  int f32_videos; /* videos planned as for float32 (the index) */
  int64_t gi;     /* the sample measured last, its shard */
  int shard;
  mml_sample_scratch sc;
  mml_record rec;
  int rec_parsed;
  mml_bytes rec_bytes, path;
  ld_pq_row pqrow;  /* a Parquet shard's row (shard -1: none) */
  mml_bytes *media; /* images, frames, WebDataset member videos */
  int media_cap, plans_cap, vcap;
  mml_vision_plan *plans;
  struct mml_video_info *vinfo;
  struct mml_video_plan *vplans;
  mml_sample s;             /* the result: input_ids, labels, vision_tokens */
  uint64_t bytes;           /* read so far (the caller may take and reset it) */
  const mml_cancel *cancel; /* its fetches and video probes stop once set (init: the
                             * loader's; the index builder's own, a child of it) */
} ld_measurer;
mml_status ld_measurer_init(ld_measurer *m, mml_loader *L, int64_t head, int f32_videos,
                            mml_err *err);
void ld_measurer_free(ld_measurer *m);
/* Measures global sample gi into m->s, m->plans[0, rec.nimages), m->vplans[0,
 * rec.nvideos) (m->rec: its record).  Does not apply mml_sample_check. */
mml_status ld_measure(ld_measurer *m, int64_t gi, mml_err *err);

/* loader_plan.c (see its top comment); every call site is guarded by L->gp */
typedef struct ld_gplan ld_gplan;
int ld_plan_wanted(const mml_loader_cfg *cfg);
/* Measures every sample (a planning pass) and switches the loader to planned epochs. */
mml_status ld_plan_new(mml_loader *L, const mml_loader_cfg *cfg, mml_err *err);
void ld_plan_free(mml_loader *L);
/* Stream position -> epoch position; MML_EEND past this rank's plan (takes mu). */
mml_status ld_plan_slot(const mml_loader *L, int64_t epoch, int64_t pos, int64_t *j, mml_err *err);
/* This rank's samples in `epoch`; whether position pos ends one of its batches. */
int64_t ld_plan_rank_len_locked(mml_loader *L, int64_t epoch);
int ld_plan_batch_end_locked(mml_loader *L, int64_t epoch, int64_t pos);

/* loader_parquet.c (see its top comment): rows of Parquet shards, from a cache of
 * decoded row groups.  A row copied out: its JSON record (NUL-terminated) and blobs. */
#define LD_PQ_DEFAULT_ROOM ((int64_t)512 << 20) /* the cache's room without max_memory */
typedef struct ld_pq_cache ld_pq_cache;
typedef struct ld_pq_stats {
  uint64_t row_groups_decoded, bytes_read;
  int64_t cache_bytes, cache_peak_bytes, cache_room;
} ld_pq_stats;
/* The cache (L->pqc), when any shard is a Parquet file; freed with ld_pq_cache_free. */
mml_status ld_pq_cache_new(mml_loader *L, mml_err *err);
void ld_pq_cache_free(mml_loader *L);
void ld_pq_cache_stats(const mml_loader *L, ld_pq_stats *s);
/* The bytes of max_memory set aside for the cache (its room; 0 without a cap or cache). */
int64_t ld_pq_reserved(const mml_loader *L);
/* The file's row `row` of Parquet shard `shard` into *out (its row group decoded, or
 * waited for, or taken from the cache).  Stops with MML_ECANCELLED once cancel is set. */
mml_status ld_pq_read_row(mml_loader *L, int shard, int64_t row, const mml_cancel *cancel,
                          ld_pq_row *out, mml_err *err);
void ld_pq_row_free(ld_pq_row *r);
/* The blob of the row that ref names (as a WebDataset member is named): 1 and its bytes. */
int ld_pq_row_member(const ld_pq_row *r, const char *ref, const uint8_t **data, size_t *len);
/* Its bytes copied into *out (*found 0, out untouched: no such blob). */
mml_status ld_pq_blob_copy(const ld_pq_row *r, const char *ref, mml_bytes *out, int *found,
                           mml_err *err);
/* The names of its blobs that is_kind accepts, in order, into names (at most max). */
int ld_pq_row_names(const ld_pq_row *r, int (*is_kind)(const char *), const char **names, int max);

/* loader_worker.c */
void *ld_worker_main(void *loader);
/* Parses global sample gi of `shard` from the bytes read for its range into *rec (zeroed
 * or freed before): the record trimmed as its shard's layout says; a WebDataset sample's
 * image and video members stand for an absent image / video list.  The one parse the
 * loader and the index builder share. */
mml_status ld_parse_record(const mml_loader *L, int shard, int64_t gi, const mml_bytes *bytes,
                           const ld_pq_row *row, mml_record *rec, mml_err *err);

/* loader_place.c (collation thread, mu held) */
mml_status ld_place_new(mml_loader *L, mml_err *err);
void ld_place_free(mml_loader *L);
/* Places planned samples from place_seq on into tickets, as far as they are known, in the
 * collator's epoch `epoch` with `bie` batches handed off (c composes the head ticket);
 * queues decodes into buffers. */
void ld_place_locked(mml_loader *L, int64_t epoch, int64_t bie, mml_collator *c);
/* Forget every placement (a seek: the collators were reset). */
void ld_place_reset_locked(mml_loader *L);
/* Keep the head ticket's part the collator holds (`c` composes it) and re-place every
 * sample from seq on (a placed sample failed at decode, or the plan wrapped). */
void ld_place_rewind_locked(mml_loader *L, mml_collator *c, int64_t seq);
/* The collator `c` takes good sample s of ticket tk whose rows lie at at[p].dest +
 * dest_off: attaches the head ticket's buffers to c and checks they are where c expects
 * them. */
mml_status ld_place_take_locked(mml_loader *L, mml_collator *c, int64_t tk,
                                const place_at at[PLANES], const mml_sample *s, mml_err *err);
/* The collator handed off the batch of the head ticket. */
void ld_place_pop_locked(mml_loader *L);
/* 1 when t's pixels are in their final place (the collator may take it). */
int ld_place_ready(const mml_loader *L, const task *t);
/* Releases t's placement (a slot reused or freed). */
void ld_place_clear(task *t);
/* 1 when every plane t has rows in has given it a destination (its decode may run). */
int ld_place_has_dests(const task *t);
/* Whether ticket k holds a buffer in any plane. */
int ld_place_has_buf(const ticket *k);
/* The ticket the collator's next sample is in (the head, or the one after an open head
 * pack or batch). */
int64_t ld_place_needed_ticket(mml_loader *L);
/* 1 while ticket id's first buffer waits for its turn: `prefetch` batches ahead of the
 * consumer, or decodes enough queued ahead of the workers. */
int ld_place_turn_waits_locked(mml_loader *L, int64_t id);

/* loader_admit.c (see its top comment): admission under max_memory, mu held.  Plane p of
 * ticket id may take a buffer of cap_rows rows now (1): its turn (`turn`, the planner's
 * rules) has come, it fits beside what it leaves earlier work and the memory ledger grants
 * its bytes at the ticket's first sample's seq (*grant: the bytes granted, 0 without a
 * ledger; rebuffer maps the buffer at once, the grant covering the pool's growth:
 * ld_ledger_cover_begin).  Records the largest buffers asked for either way. */
int ld_admit_ticket_locked(mml_loader *L, int64_t id, int p, int64_t cap_rows, int turn,
                           int64_t *grant);
/* Plane q's charge leaves the ledger (its ticket is dropped, its request is gone): a
 * waiting one is withdrawn, a granted one not mapped yet gives its bytes back (T2). */
void ld_admit_ticket_cancel_locked(mml_loader *L, tk_plane *q);
/* E1 (compact under max_memory): ticket id's expansion is asked at its first_seq once its
 * rows are final and its image buffer is mapped (after the decodes placed in it that need
 * scratch have begun); asked again for another size; its failure (L7) is the loader's
 * error.  ld_admit_expand_all_locked asks for every ticket, in order, and returns 1 while
 * one waits (the collator then waits for room: its grant or failure pokes it). */
void ld_admit_expand_locked(mml_loader *L, int64_t id);
int ld_admit_expand_all_locked(mml_loader *L);
/* E3: ticket k's expansion charge leaves the ledger (dropped, rewound, re-buffered). */
void ld_admit_expand_cancel_locked(mml_loader *L, ticket *k);
/* E1: at hand-off the head ticket's granted expansion becomes pend item p's xcarry (the
 * credit stays ENGINE, its emission takes it); a waiting one leaves (the emission asks). */
/* The pool bytes a compact image buffer of `size` bytes (room for `capacity`) adds to hold
 * `rows` float rows: in place the float rows' pages beyond the uint8 ones, else a float
 * buffer (a queued batch's fpool; a ticket's expansion charge, E1). */
int64_t ld_admit_expansion_bytes(const mml_loader *L, int64_t rows, int64_t size, int64_t capacity);
void ld_admit_expand_hand_off_locked(mml_loader *L, pend_item *p);
/* The head ticket waits for room, not its turn: caches are dropped for it (spare byte
 * buffers, videos later samples keep open); 1 when any was (the planner retries). */
int ld_admit_make_way_locked(mml_loader *L);
/* 1 when a pack's buffer may be its bound of `bytes` (no cap, or at most a quarter of
 * max_memory: a larger one would starve the rest); else it is sized when complete. */
int ld_admit_pack_bound_ok(const mml_loader *L, int64_t bytes);
/* 1 when a ticket's decodes are queued in stream order, not largest first (max_memory:
 * loader_place.c P1). */
int ld_admit_decodes_in_order(const mml_loader *L);
/* The planner asked for an open pack's rows so far (ld_admit_bound_stuck_locked): the
 * consumer may declare its wait now (C2, C6). */
void ld_admit_bound_asked_locked(mml_loader *L);
/* After placing: 1 when an open pack the consumer waits for waits for buffers of its bound
 * where nothing else can give room back (the state in which the deadlock rule, L7, would
 * decide but for the bound): the planner asks for its rows so far instead. */
int ld_admit_bound_stuck_locked(mml_loader *L);
/* loader_admit.c: max_memory: 1 when the memory ledger has room for `need` more bytes (its
 * caches, pooled pages and spare byte buffers, evicted to make it: A9).  Also what bytes held
 * ahead of their use ask (a remote video's first block or preloads, a video kept open):
 * none kept for the next batch's buffer, as make-way gives them back (C8). */
int ld_mem_room_locked(mml_loader *L, int64_t need);
/* max_memory: 1 when a worker may start reading one more sample: room for the reads in
 * flight and it, at the most one sample has held (R7). */
int ld_mem_may_read_locked(mml_loader *L);
/* max_memory: a decode whose images need scratch beyond the worker's reserve (or whose
 * media bytes are read again) takes it before it starts: 1 when its charge is granted; 0
 * while it waits in the ledger (the decode stays queued, the grant moves the change count)
 * or when it failed (the ledger's deadlock rule: the loader's fatal error is set).  It
 * gives it back when it has trimmed its scratch (ld_mem_scratch_give). */
int ld_mem_scratch_take_locked(mml_loader *L, task *t);
/* max_memory: t's decode is queued with every destination (loader_place.c set_dest, in the
 * critical section that mapped its ticket's buffer): its scratch charge is asked now, at
 * its seq (loader_admit.c D1); the worker's look only takes the answer. */
void ld_admit_decode_queued_locked(mml_loader *L, task *t);
/* A decode's scratch charge leaves the ledger (withdrawn, or given back when granted and
 * not taken): its decode left the queue without running, or a seek, rewind or close. */
void ld_admit_scratch_drop_locked(mml_loader *L, task *t);
/* max_memory: the oldest queued batch's emission takes its charge -- what its float rows
 * add (fpool) and its other tensors (sneed) -- before it runs (returns the bytes, to give
 * back after it: emit_extra; 0: nothing to take; -1: its charge waits in the ledger, the
 * caller goes on and a grant moves the change count (loader_admit.c E1-E3) -- or the
 * loader's fatal error is set: the charge failed, E4). */
int64_t ld_mem_emit_take_locked(mml_loader *L);
/* E3: pend item q's emission charge leaves the ledger (a seek, a rewind, a close drops the
 * output): withdrawn while it waits, given back once granted and not taken.  mu held. */
void ld_admit_emit_cancel_locked(mml_loader *L, pend_item *q);
/* A compact batch's expansion shared with helping workers (loader_expand.c): the job,
 * on the emitting worker's stack while published in L->xs. */
typedef struct ld_xshare {
  const uint8_t *src; /* uint8 row r at src + r * in_row, its float row at dst + r * out_row */
  uint8_t *dst;
  size_t in_row, out_row;
  int patch, T, format;
  const float (*table)[256];
  int64_t next, end; /* rows [next, end) not taken yet (mu) */
  int helpers;       /* helpers expanding a chunk now (mu) */
  mml_status st;     /* the first failure (mu) */
  mml_err err;
  pthread_cond_t done_cv; /* the last helper out (with mu) */
} ld_xshare;
/* Expands the emission's rows (u8 == f: in place, mml_pixels_expand_inplace; else u8's
 * rows into f, mml_pixels_expand), sharing them with helpers when it can: the same bytes
 * (X1).  mu not held. */
mml_status ld_expand_shared(mml_loader *L, mml_buf *u8, mml_buf *f, int64_t rows, mml_err *err);
/* A worker looking for work (mu held): expands one chunk of the shared expansion when one
 * is left and the output queue is empty (mu dropped meanwhile): 1; else 0. */
int ld_expand_help_locked(mml_loader *L);
void ld_mem_scratch_give_locked(mml_loader *L, task *t);
/* max_memory: planned samples after seq `after` whose decode has not begun and whose media
 * were read without the network (no video) drop their media bytes, latest first, until
 * `want` bytes are freed; their decodes read them again (task.reread).  Returns the bytes
 * freed. */
int64_t ld_admit_drop_bytes_ahead_locked(mml_loader *L, int64_t after, int64_t want);
/* The capacity mml_bytes_reserve gives a new buffer for `need` bytes (doublings from 16):
 * what a read of them maps (loader_bytes.c B4). */
static inline int64_t ld_bytes_cap(size_t need) {
  int64_t cap = 16;
  while ((size_t)cap < need) cap *= 2;
  return cap;
}
/* max_memory: `grow` more bytes of t's media are about to be read (ld_bytes_take): one
 * charge at t's seq in the ledger (loader_admit.c R1), later samples' bytes that can be
 * read again making way.  1: granted (t->read_cover, in read_extra until counted in held);
 * -1: it waits, and the caller parks t (R2: ld_admit_park_locked); -2: it is above
 * max_memory alone (the sample fails); 0: it never can have room (the loader's fatal error
 * is set: MML_ENOMEM naming the sample) or the loader stops. */
int ld_admit_read_locked(mml_loader *L, task *t, int64_t grow);
/* The sample's error for -2 above (loader_admit.c X1: the one explainer, unnamed: the
 * sample's error is prefixed with its name): MML_ENOMEM. */
mml_status ld_admit_read_alone_locked(mml_loader *L, int64_t grow, mml_err *err);
/* max_memory, a worker's look (mu held): a task parked for room whose charge was granted
 * (or failed, or whose plan was abandoned, or that gave its bytes back: R6) leaves
 * room_head; returned to run on (room_at), or NULL.  *waiting is set when some still wait;
 * the room made for the earliest (READ AGAIN) and its out-of-turn ask (T5) are applied
 * here. */
task *ld_admit_parked_locked(mml_loader *L, int *waiting);
/* R2: t, whose read's charge waits (ld_admit_read_locked returned -1 for media item i,
 * nremote fetches of its stage submitted), is parked on room_head; mu held. */
void ld_admit_park_locked(mml_loader *L, task *t, int i, int nremote);
/* R4: t's read's charge, if it has one, leaves the ledger (withdrawn, or given back). */
void ld_admit_read_drop_locked(mml_loader *L, task *t);
/* R5: t's reads' revocable grants become final: its decode begins (1), or it finished
 * without one (`decode` 0: kept even when asked back).  With `decode`, 0 when one was
 * asked back: its media bytes were dropped instead, for its decode to read again. */
int ld_admit_reads_settle_locked(mml_loader *L, task *t, int decode);
/* R5: the reads' grants the ledger asked back (their revoke callbacks) are given back
 * where the tasks allow it now: planned samples drop their media bytes (READ AGAIN),
 * parked ones read theirs again from the first, once (R6); the others when their worker
 * is done. */
void ld_admit_revoked_locked(mml_loader *L);
void ld_admit_revoked_task_locked(mml_loader *L, task *t);
/* max_memory: the planned sample alone cannot fit (MML_ENOMEM naming its sizes); sets
 * t->scratch_need. */
mml_status ld_mem_check_sample(const mml_loader *L, task *t, mml_err *err);
/* Image byte buffers reused across samples (loader_place.c): before image bytes are read
 * into *b (need bytes; t's, busy on this thread), the smallest spare buffer that holds
 * them (else the largest, which then grows) is swapped in; a finished task's buffers go
 * back to the spares (mu held).  Their pages stay mapped: reading the next image into
 * one costs no page fault, where a freed and reallocated buffer faulted on every page.
 * Under max_memory ld_bytes_take also charges and maps the buffer's growth before the
 * read (loader_bytes.c B4): MML_ENOMEM (*err the loader's error) when it never can;
 * *parked when its charge waits (nothing allocated: the caller parks the task, R2). */
mml_status ld_bytes_take(mml_loader *L, task *t, mml_bytes *b, size_t need, int *parked,
                         mml_err *err);
void ld_bytes_return_locked(mml_loader *L, task *t);
void ld_bytes_free_spares(mml_loader *L);
/* The spares' bytes now (takes spare_mu); the ledger's evict callback of the spares'
 * cache (under the ledger's lock: frees spares until `want` bytes are freed). */
int64_t ld_bytes_spares(mml_loader *L);
int64_t ld_bytes_evict(void *arg, int64_t want);
/* max_memory: t's byte buffers (re)counted once its reading is done, and its remote video
 * bytes (vhead_bytes, vpre_bytes) and open videos (vhead[].open_bytes) whenever they
 * change. */
void ld_mem_count_task_locked(mml_loader *L, task *t);
/* The same, where `cover` bytes of ENGINE credit already granted for t (a re-read's
 * grant, its bytes now in its buffers) pay for its growth first; the rest goes back. */
void ld_mem_count_task_cover_locked(mml_loader *L, task *t, int64_t cover);
/* The ledger (loader_admit.c THE LEDGER): made after the pool (MML_OK without
 * max_memory), its fixed charges when the threads start, the pool unhooked before the pool
 * closes and the ledger freed after it; ld_ledger_count / _release: `bytes` of
 * ENGINE credit taken (counted, ledger.c L13) or given back; ld_ledger_spare_*: the
 * spare byte buffers' cache.  All are no-ops without a ledger. */
mml_status ld_ledger_open(mml_loader *L, mml_err *err);
void ld_ledger_start_locked(mml_loader *L);
void ld_ledger_unhook(mml_loader *L);
void ld_ledger_free(mml_loader *L);
void ld_ledger_count(mml_loader *L, int64_t bytes);
/* ld_ledger_cover_begin: `bytes` of ENGINE credit granted to this thread's next pool
 * growths (an emission's float rows): the pool's hook hands them over instead of charging
 * them again; ld_ledger_cover_end gives back what they did not use. */
void ld_ledger_cover_begin(mml_loader *L, int64_t bytes);
void ld_ledger_cover_end(mml_loader *L);
void ld_ledger_release(mml_loader *L, int64_t bytes);
/* Room came back (loader_admit.c W1): pokes the ledger while a worker or the collator
 * looks or waits (W4, W2); never takes mu, so any thread may call it, holding mu or not
 * (the pool's hook). */
void ld_room_wake(mml_loader *L);
/* The collation thread's waits (loader_admit.c W2), mu held: ld_coll_look_locked before
 * its look (counts it as looking, reads its event count coll_events); then
 * ld_coll_wait_locked -- for a buffer (room: 1) until that count moves, without a bound,
 * else on coll_cv -- or, when it found work, ld_coll_looked_locked.  ld_coll_wake_locked
 * is every event's wake of the collator under mu (coll_cv, and ld_coll_poke while it
 * waits for a buffer); ld_coll_poke moves the count from any thread, mu held or not
 * (coll_mu is a leaf lock; events without mu poke while it looks or waits). */
uint64_t ld_coll_look_locked(mml_loader *L);
void ld_coll_wait_locked(mml_loader *L, uint64_t seen, int room);
void ld_coll_looked_locked(mml_loader *L);
void ld_coll_wake_locked(mml_loader *L, int all);
void ld_coll_poke(mml_loader *L);
/* ld_coll_poke when the collator waits for a buffer (mu held; not during its own look). */
void ld_coll_room_wake_locked(mml_loader *L);
/* The workers' waits (loader_admit.c W4, ledger.c L11): ld_work_look_locked reads the
 * ledger's change count under mu before a worker looks for work (or room), and
 * ld_work_wait_locked drops mu and waits until it changes, for room (room: 1, W5) or
 * work, without a bound.  ld_work_wake is the poke of everything that
 * queues work for the workers or may let one go on (work_cv without a ledger). */
uint64_t ld_work_look_locked(mml_loader *L);
/* An input of the workers' room gates changed (W5): pokes while a worker waits for room,
 * and the consumer while it waits in next() (C2: the engine may be idle now). */
void ld_room_gates_changed_locked(mml_loader *L);
/* A waiting charge left the ledger (withdrawn): tries behind it may be granted now (T6's
 * mark moves), and the room gates' inputs changed. */
void ld_room_withdrawn_locked(mml_loader *L);
/* Its workers' part alone (next(): the consumer's own change, which must not wake it). */
void ld_room_gates_wake_workers_locked(mml_loader *L);
/* The consumer's wait in next() (loader_admit.c C1-C4, ledger.c L7): ld_consumer_wake_locked
 * moves the ledger's consumer count while the consumer waits (all: whether or not), under
 * mu, and ends its declared wait (it looks again); ld_admit_engine_idle_locked says
 * whether none of the engine's work runs without ledger credit, so that the consumer may
 * declare its wait (L7). */
void ld_consumer_wake_locked(mml_loader *L, int all);
/* An event that changes only whether the consumer may declare its wait (C6: work started
 * without credit, work that may have left the engine idle): ends the declaration, and
 * wakes the consumer only where its answer can change -- an epoch for it to ask for
 * (ld_consumer_would_ask_locked), or the ledger's head in L7's case. */
void ld_consumer_stale_locked(mml_loader *L);
/* next() would ask for the next epoch now (nothing of its epoch left on its way). */
int ld_consumer_would_ask_locked(mml_loader *L);
int ld_admit_engine_idle_locked(mml_loader *L);
/* Room events and withdrawals of waiting charges so far (T6's mark).  mu held. */
uint64_t ld_admit_decode_events_locked(mml_loader *L);
/* With the engine idle (ld_admit_engine_idle_locked): the ENGINE credit its slots hold, all
 * of it work that waits behind the ledger's head (C7), the head's own task left out. */
int64_t ld_admit_behind_locked(mml_loader *L);
void ld_work_wait_locked(mml_loader *L, uint64_t seen, int room);
void ld_work_wake(mml_loader *L, int all);
void ld_ledger_spare_put(mml_loader *L, int64_t bytes);
void ld_ledger_spare_drop(mml_loader *L, int64_t bytes);
/* A batch enters the consumer's queue (ld_move_ready_locked): with a ledger, counts it in
 * led_engine_refs when a reference other than its tensors' holds one of its buffers
 * (loader_admit.c A10), which ld_ledger_check_locked reports. */
void ld_ledger_queued_locked(mml_loader *L, const mml_batch *b);
/* A1's accounting (A6): the ledger holds exactly what the loader's memory is -- the pool's
 * live and cached bytes, the window's byte buffers (tasks' and spares', summed afresh),
 * the scratch reserve and grants, the emissions' grants, the Parquet room.  MML_EINTERNAL
 * naming both sides when not; MML_OK without a ledger. */
mml_status ld_ledger_check_locked(mml_loader *L, mml_err *err);
/* With the threads joined and no pool buffer live (nothing the consumer could release
 * meanwhile): asserts ld_ledger_check_locked in a debug build (NDEBUG unset). */
void ld_ledger_assert_quiet(mml_loader *L);
/* The most bytes the ledger held at one time (0 without one). */
int64_t ld_ledger_peak(mml_loader *L);
/* (mu held) Whether planned sample t's video bytes (kept open, preloaded) wait ahead of its
 * decode for make-way to give back: its decode not running, nor queued in the head batch
 * (loader_admit.c C7, C8). */
int ld_video_ahead(const mml_loader *L, const task *t);
/* (mu held) max_memory, a charge waits at the head: the planned samples whose video bytes
 * wait ahead (ld_video_ahead) close the videos they kept open (their preloads go with them;
 * their decodes open and read them again, as past MML_VIDEOS_KEPT_OPEN).  Returns the
 * bytes given back (loader_video.c). */
int64_t ld_release_videos_ahead_locked(mml_loader *L);
typedef struct ld_video_ctx {
  mml_loader *L;
  task *t;
  run_acc *acc;
  int decoding; /* the decode stage (else the plan's probe): where network waits count */
} ld_video_ctx;

/* loader_worker.c, shared with loader_video.c: a task whose fetches are in is ready
 * (mu held); one more fetch of t outstanding (the first sets pending's guard); a submit
 * that failed. */
void ld_ready_push_locked(mml_loader *L, task *t);
void ld_fetch_one_more(mml_loader *L, task *t, int *nremote);
void ld_fetch_undo(mml_loader *L, task *t);
/* A hash of t's media bytes (images and frames, lengths included): a refetch's check. */
uint64_t ld_task_media_sum(const task *t);
/* (mu held) What t's sample holds that no decode will read gives it back: a read's charge
 * still in the ledger, its reads' grants (settled: final), its videos (closed, their bytes
 * released) and its image byte buffers (into the spares: ld_bytes_return_locked).  Called
 * wherever a slot is emptied without its decode (a plan abandoned: ld_rebase_locked,
 * take_decode_locked, a ready task of an old generation) so that no ENGINE credit waits
 * in an EMPTY slot for the slot's next sample (loader_admit.c A11). */
void ld_task_give_back_locked(mml_loader *L, task *t);
/* The consumer asks for epoch `epoch` (or, after a seek, `force`: exactly that one): the
 * samples parked for it go to the ready list (loader_video.c). */
void ld_ask_epoch_locked(mml_loader *L, int64_t epoch, int force);
/* Stage 2, t's record parsed: 1 when t names a remote video file and its epoch is past the
 * one the consumer asked for: t is parked (it waits, holding no thread and nothing fetched
 * for its media) until the consumer asks for its epoch (loader_video.c). */
int ld_video_park(mml_loader *L, task *t);
/* loader_video.c: the stages' video parts (loader_worker.c calls them) */
mml_status ld_video_path(mml_loader *L, task *t, const char *ref, int check, mml_err *err);
mml_status ld_video_open(void *ctx, int v, mml_video **out, mml_err *err);
mml_status ld_probe_videos(mml_loader *L, task *t, run_acc *acc, mml_err *err);
mml_status ld_preload_videos(mml_loader *L, task *t, int *wait, mml_err *err);
void ld_head_video(mml_loader *L, task *t, int v, mml_fetcher **f, int *nremote);
void ld_tail_video(mml_loader *L, task *t, int v, mml_fetcher **f, int *nremote);
/* Closes the videos t kept open since its probe (loader_video.c). */
void ld_task_close_videos(mml_loader *L, task *t);
/* (mu held) t's remote video bytes held ahead of their use are gone: its first blocks
 * freed, their count and its preloads' (freed by closing its videos) taken off, and the
 * count of each video no longer kept open. */
void ld_task_release_videos_locked(mml_loader *L, task *t);
/* A worker finished decoding t's plane p into (buf, off): its home; copied to dest if it
 * moved. */
void ld_place_decoded_locked(mml_loader *L, task *t, int p, mml_buf *buf, size_t off);

/* loader_collator.c */
void *ld_collator_main(void *loader);
void ld_set_fatal_locked(mml_loader *L, mml_status st, const mml_err *e);
/* Queues a message for mml_loader_take_warnings (dropped beyond the backlog). */
void ld_push_warning_locked(mml_loader *L, const mml_err *e);
/* Moves finished items, in stream order, from `pend` into the output queue while it has
 * room.  Called by whoever changes either: workers (an emit finished), the collator (an
 * error item), the consumer (popped one). */
void ld_move_ready_locked(mml_loader *L);
/* The output queue's i-th item ahead of the consumer (0: the next one). */
static inline out_item *ld_out_at(const mml_loader *L, int i) {
  return &L->outq[(L->out_head + i) % L->out_cap];
}
/* Takes the next item off the output queue into *it (out_count > 0). */
void ld_out_pop_locked(mml_loader *L, out_item *it);
/* Counts (and queues the warnings of) the logged skips before stream coordinate
 * (epoch, pos); ld_release_oldest_skip_locked the oldest one (a raised error). */
void ld_release_skips_locked(mml_loader *L, int64_t epoch, int64_t pos);
void ld_release_oldest_skip_locked(mml_loader *L);
/* Drops everything queued or pending (seek, close); waits for running emits first. */
void ld_drop_output_locked(mml_loader *L);
/* Compact pixels: 1 while the next queued batch must not be emitted (expanded) yet
 * (loader_collator.c, G1 / G2): `prefetch` are ahead of the consumer or their expanded
 * bytes would pass the output queue's budget; under max_memory the ledger's grant for its
 * rows (ld_mem_emit_take_locked) decides the room besides. */
int ld_emit_gated_locked(const mml_loader *L);
/* A worker emits the oldest queued batch (called with mu held, returns with it held).
 * *grant: the ledger's charge for its float rows (ld_mem_emit_take_locked), given back
 * (and zeroed) once those rows are live in the pool; the caller gives back what is left. */
void ld_emit_job_locked(mml_loader *L, int64_t *grant);

#endif
