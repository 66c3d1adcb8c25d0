/*
 * options.c — the loader's option table (see mml/options.h) and its checked setters.
 *
 * One row per option.  A row names the field it sets with CFG(field), which records the
 * field's offset and size; an option with MML_OPT_NONE takes None for "off/automatic"
 * (its default, usually 0).  Rows are in the order the Loader documents them.
 *
 * Pure data; every function is reentrant.
 */
#include "mml/options.h"

#include "mml/index.h"

#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define CFG(field) offsetof(mml_loader_cfg, field), (int)sizeof(((mml_loader_cfg *)0)->field)
#define FP MML_OPT_FINGERPRINT
#define NONE MML_OPT_NONE
#define INTERNAL MML_OPT_INTERNAL
#define SECRET MML_OPT_SECRET
#define I32 2147483647.0
#define I64 9223372036854775807.0

static const char *const k_data_format[] = {"auto", "jsonl", "json", "webdataset",
                                            NULL}; /* mml_layout */
static const char *const k_image_space[] = {"in_place", "qwen-vl-finetune",
                                            NULL}; /* mml_image_space */
static const char *const k_on_error[] = {"skip", "raise", NULL};
static const char *const k_keys[] = {"qwen", "megatron", NULL}; /* mml_key_style */
static const char *const k_label_mode[] = {"all_assistant", "last_assistant", "no_nonfinal_end",
                                           NULL}; /* mml_label_mode */
static const char *const k_text_only[] = {"placeholder", "omit", "empty",
                                          NULL}; /* mml_text_only_vision */
static const char *const k_pixel_format[] = {"float32", "bfloat16", "uint8",
                                             NULL}; /* MML_PIXEL_* (mml/vision.h) */
static const char *const k_balance[] = {"none", "tokens", "vision_tokens", NULL}; /* mml_balance */
static const char *const k_recipe[] = {"processor", "llama-factory", NULL};       /* MML_RECIPE_* */
static const char *const k_template[] = {"qwen2-vl", "qwen3-vl", NULL}; /* mml_template_style */

static const mml_option k_options[] = {
    /* name, type, CFG(field), default, lo, hi, enum names, flags, doc */
    {"data_format", MML_OPT_ENUM, CFG(data_format), 0, 0, 0, k_data_format, 0,
     "shard layout: auto (by name and content), jsonl, json (one array of records), or "
     "webdataset (tar)"},
    {"index", MML_OPT_STR, CFG(index), 0, 0, 0, NULL, NONE,
     "dataset index folder or URL prefix (python -m mmloader index --out) (None: "
     "<shard>.mmlidx next to each local shard; \"\": never read one)"},
    {"image_root", MML_OPT_STR, CFG(image_root), 0, 0, 0, NULL, NONE,
     "folder or URL prefix relative image paths are resolved against (None: the shard's)"},
    {"micro_batch_size", MML_OPT_INT, CFG(collate.micro_batch_size), 0, 1, I32, NULL, FP | NONE,
     "rows per padded batch (None: 8, or as many as max_tokens_per_batch allows)"},
    {"max_tokens_per_batch", MML_OPT_INT, CFG(max_tokens_per_batch), 0, 1, I64, NULL, FP | NONE,
     "token budget of a padded batch: rows x its longest sample (None: micro_batch_size rows)"},
    {"balance", MML_OPT_ENUM, CFG(balance), 0, 0, 0, k_balance, FP,
     "spread each global step's tokens or vision_tokens evenly over the DP ranks (none: off)"},
    {"global_plan", MML_OPT_BOOL, CFG(global_plan), 0, 0, 1, NULL, FP,
     "compose by the global plan (implied by max_tokens_per_batch, balance, group_by_length)"},
    {"group_by_length", MML_OPT_INT, CFG(group_by_length), 0, 1, 1 << 30, NULL, FP | NONE,
     "sort windows of this many samples by length, longest first, before batching"},
    {"seq_length", MML_OPT_INT, CFG(collate.seq_length), 0, 1, I64, NULL, FP | NONE,
     "padded row length (None: each batch's longest sample)"},
    {"shuffle", MML_OPT_BOOL, CFG(shuffle), 1, 0, 1, NULL, FP,
     "shuffle the epoch order (a pure function of seed and epoch)"},
    {"seed", MML_OPT_INT, CFG(seed), 0, -I64, I64, NULL, FP, "seed of the epoch order"},
    {"dp_rank", MML_OPT_INT, CFG(dp_rank), 0, 0, I32, NULL, FP | NONE,
     "this data-parallel rank (None: torch.distributed's, else $RANK; 0 alone)"},
    {"dp_size", MML_OPT_INT, CFG(dp_size), 1, 1, I32, NULL, FP | NONE,
     "data-parallel ranks (None: torch.distributed's world, else $WORLD_SIZE; 1 alone)"},
    {"num_threads", MML_OPT_INT, CFG(num_threads), 0, 1, 4096, NULL, NONE,
     "worker threads (None: CPUs in the affinity mask / LOCAL_WORLD_SIZE)"},
    {"prefetch", MML_OPT_INT, CFG(prefetch), 4, 1, 1 << 20, NULL, 0,
     "batches in memory ahead of the consumer: finished, or being decoded (finished ones also "
     "stop at max_memory's bytes, else 2 GiB)"},
    {"window", MML_OPT_INT, CFG(window), 0, 1, 1 << 24, NULL, NONE,
     "samples in flight ahead of collation (None: 2 * micro_batch_size, >= 4 * threads, 16; "
     "remote shards: >= (prefetch + 2) * micro_batch_size and 64)"},
    {"max_memory", MML_OPT_INT, CFG(max_memory), 0, 1, I64, NULL, NONE,
     "cap in bytes on the engine's memory: batch buffers (those the consumer holds too), "
     "the window's encoded bytes, worker scratch; work waits for room (None: no cap)"},
    {"on_error", MML_OPT_ENUM, CFG(on_error_raise), 0, 0, 0, k_on_error, 0,
     "a failed sample: skip (count, warn) or raise (in stream order)"},
    {"max_error_rate", MML_OPT_FLOAT, CFG(max_error_rate), 0.1, 0, 1, NULL, 0,
     "fail once more than this fraction of samples failed (over at least 100)"},
    {"min_error_samples", MML_OPT_INT, CFG(min_error_samples), 100, 1, I64, NULL, INTERNAL,
     "samples consumed before max_error_rate applies"},
    {"max_length", MML_OPT_INT, CFG(max_length), 0, 1, I64, NULL, FP | NONE,
     "skip samples with more tokens (reason too_long; None: no limit)"},
    {"packing", MML_OPT_BOOL, CFG(collate.pack), 0, 0, 1, NULL, FP,
     "pack samples into [1, pack_length] rows with cu_seqlens"},
    {"pack_length", MML_OPT_INT, CFG(collate.pack_length), 0, 1, I32, NULL, FP | NONE,
     "token budget of one pack (None: seq_length)"},
    {"pad_to_multiple", MML_OPT_INT, CFG(collate.pad_to_multiple), 0, 1, 1 << 20, NULL, FP | NONE,
     "pad each packed sample to a multiple of this (TP/CP)"},
    {"pad_id", MML_OPT_INT, CFG(collate.pad_id), -1, -1, I32, NULL, INTERNAL,
     "padding token id (-1: the tokenizer's <|endoftext|>)"},
    {"keys", MML_OPT_ENUM, CFG(collate.keys), 0, 0, 0, k_keys, FP,
     "tensor names: qwen (Hugging Face) or megatron"},
    {"shift_labels", MML_OPT_BOOL, CFG(collate.shift_labels), 0, 0, 1, NULL, FP,
     "labels shifted by one (Megatron convention)"},
    {"label_mode", MML_OPT_ENUM, CFG(label_mode), 0, 0, 0, k_label_mode, FP,
     "which assistant tokens are supervised"},
    {"image_whitespace", MML_OPT_ENUM, CFG(image_space), 0, 0, 0, k_image_space, FP,
     "text around <image> tags: in_place (as written) or qwen-vl-finetune (user text stripped)"},
    /* recipes: whose data path the samples follow; the llama-factory settings keep
     * LLaMA-Factory's own names (mmloader/recipes.py fills the recipe's defaults) */
    {"recipe", MML_OPT_ENUM, CFG(recipe), 0, 0, 0, k_recipe, FP,
     "whose data path: processor (HF processor + qwen-vl-utils keys) or llama-factory "
     "(its template, truncation and image pre-resize)"},
    {"cutoff_len", MML_OPT_INT, CFG(lf.cutoff_len), 0, 1, I64, NULL, FP | NONE,
     "llama-factory: truncate as its infer_seqlen does (None: 2048)"},
    {"mask_history", MML_OPT_BOOL, CFG(lf.mask_history), 0, 0, 1, NULL, FP,
     "llama-factory: train on the last turn only; truncation keeps the last turns first"},
    {"train_on_prompt", MML_OPT_BOOL, CFG(lf.train_on_prompt), 0, 0, 1, NULL, FP,
     "llama-factory: label the prompt tokens too"},
    {"enable_thinking", MML_OPT_BOOL, CFG(lf.enable_thinking), 0, 0, 1, NULL, FP,
     "llama-factory, Qwen3-VL: its qwen3_vl template (an empty <think> block trained before "
     "each answer) instead of qwen3_vl_nothink"},
    {"image_max_pixels", MML_OPT_INT, CFG(lf.image_max_pixels), 0, 1, I64, NULL, FP | NONE,
     "llama-factory: images over this many pixels are first shrunk with Pillow as its "
     "mm_plugin does (None: 768*768)"},
    {"image_min_pixels", MML_OPT_INT, CFG(lf.image_min_pixels), 0, 1, I64, NULL, FP | NONE,
     "llama-factory: images under this many pixels are first grown with Pillow (None: 32*32)"},
    {"video_fps", MML_OPT_FLOAT, CFG(lf.video_fps), 0, 0, 1e6, NULL, FP | NONE,
     "llama-factory: video frames sampled per second of the stream's duration (None: 2.0)"},
    {"video_maxlen", MML_OPT_INT, CFG(lf.video_maxlen), 0, 1, I32, NULL, FP | NONE,
     "llama-factory: at most this many sampled video frames (None: 128)"},
    {"video_max_pixels", MML_OPT_INT, CFG(lf.video_max_pixels), 0, 1, I64, NULL, FP | NONE,
     "llama-factory: video frames over this many pixels are first shrunk with Pillow (None: "
     "256*256)"},
    {"video_min_pixels", MML_OPT_INT, CFG(lf.video_min_pixels), 0, 1, I64, NULL, FP | NONE,
     "llama-factory: video frames under this many pixels are first grown with Pillow (None: "
     "16*16)"},
    {"mrope", MML_OPT_BOOL, CFG(collate.mrope), 0, 0, 1, NULL, FP,
     "3-row M-RoPE position ids and rope_deltas"},
    {"attention_mask", MML_OPT_BOOL, CFG(collate.attention_mask), 1, 0, 1, NULL, FP,
     "emit attention_mask"},
    {"text_only_vision", MML_OPT_ENUM, CFG(collate.text_only_vision), 0, 0, 0, k_text_only, FP,
     "vision keys of a batch without images: placeholder, omit or empty"},
    {"pixel_format", MML_OPT_ENUM, CFG(collate.pixel_format), 0, 0, 0, k_pixel_format, 0,
     "pixel_values as float32 (the HF values), bfloat16 (those rounded to nearest even) or "
     "uint8 (resized RGB patches, one frame per row: mmloader.torch.expand_pixels)"},
    {"compact_pixels", MML_OPT_BOOL, CFG(compact_pixels), 1, 0, 1, NULL, 0,
     "float formats: images in flight as uint8 patch rows, pixel_values expanded from them "
     "at emission (the same values, an eighth of the memory in flight)"},
    {"mm_token_type_ids", MML_OPT_BOOL, CFG(collate.mm_token_type_ids), 0, 0, 1, NULL, FP,
     "also emit mm_token_type_ids (transformers >= 5, qwen keys)"},
    {"template", MML_OPT_ENUM, CFG(template_style), 0, 0, 0, k_template, FP | INTERNAL,
     "chat template family (from the preset)"},
    {"cycle", MML_OPT_BOOL, CFG(cycle), 0, 0, 1, NULL, 0, "never stop at an epoch end"},
    {"pin_memory", MML_OPT_BOOL, CFG(pin_memory), 0, 0, 1, NULL, 0,
     "batches in page-locked memory"},
    {"device", MML_OPT_INT, CFG(device), -1, -1, 1 << 16, NULL, INTERNAL,
     "CUDA device batches are copied to (-1: host; Loader takes device='cuda:N')"},
    {"s3_endpoint", MML_OPT_STR, CFG(fetch.endpoint), 0, 0, 0, NULL, NONE,
     "S3 endpoint URL (None: AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, else AWS)"},
    {"s3_region", MML_OPT_STR, CFG(fetch.region), 0, 0, 0, NULL, NONE,
     "S3 region (None: AWS_REGION / AWS_DEFAULT_REGION, else us-east-1)"},
    {"aws_access_key_id", MML_OPT_STR, CFG(fetch.access_key), 0, 0, 0, NULL, NONE | SECRET,
     "S3 access key (None: AWS_ACCESS_KEY_ID)"},
    {"aws_secret_access_key", MML_OPT_STR, CFG(fetch.secret_key), 0, 0, 0, NULL, NONE | SECRET,
     "S3 secret key (None: AWS_SECRET_ACCESS_KEY)"},
    {"aws_session_token", MML_OPT_STR, CFG(fetch.session_token), 0, 0, 0, NULL, NONE | SECRET,
     "S3 session token (None: AWS_SESSION_TOKEN)"},
    {"max_inflight", MML_OPT_INT, CFG(fetch.max_inflight), 0, 1, 100000, NULL, NONE,
     "remote requests in flight (None: 64)"},
    {"plan_only", MML_OPT_BOOL, CFG(plan_only), 0, 0, 1, NULL, 0,
     "a planning pass: batches carry only their cursors (images never decoded)"},
    {"system_prompt", MML_OPT_STR, CFG(system_prompt), 0, 0, 0, NULL, FP | NONE,
     "system turn for conversations without one (None: the template's default; \"\": none)"},
    {"samples_per_epoch", MML_OPT_INT, CFG(samples_per_epoch), 0, 1, I64, NULL, NONE,
     "a mixture's epoch size (None: its sources' fixed counts plus weighted sizes)"},
    /* per-sample resource limits (a sample over one is skipped with its own reason) and
     * the path policy: they decide which samples are skipped, so they are fingerprinted */
    {"max_images_per_sample", MML_OPT_INT, CFG(max_images_per_sample),
     MML_DEFAULT_MAX_IMAGES_PER_SAMPLE, 1, I32, NULL, FP,
     "skip samples naming more images (too_many_images)"},
    {"max_sample_pixels", MML_OPT_INT, CFG(max_sample_pixels), MML_DEFAULT_MAX_SAMPLE_PIXELS, 1,
     I64, NULL, FP,
     "skip samples whose images hold more pixels in all (each at the larger of its size in "
     "the file and resized), from their headers"},
    {"max_record_bytes", MML_OPT_INT, CFG(max_record_bytes), MML_DEFAULT_MAX_RECORD_BYTES, 1, I64,
     NULL, FP, "skip longer records before reading them (record_too_large)"},
    {"max_json_depth", MML_OPT_INT, CFG(max_json_depth), MML_DEFAULT_MAX_JSON_DEPTH, 1, 100000,
     NULL, FP, "skip records nested deeper (bad_record)"},
    {"max_object_bytes", MML_OPT_INT, CFG(max_object_bytes), MML_DEFAULT_MAX_OBJECT_BYTES, 1, I64,
     NULL, FP, "skip samples with a larger encoded image, local or remote (object_too_large)"},
    {"max_jpeg_scans", MML_OPT_INT, CFG(max_jpeg_scans), MML_DEFAULT_MAX_JPEG_SCANS, 1, I32, NULL,
     FP,
     "skip samples with a JPEG of more scans: each decodes the whole image again (too_many_scans)"},
    /* per-shard limits: a shard over one is refused (hostile or corrupt data) */
    {"max_shard_bytes", MML_OPT_INT, CFG(max_shard_bytes), MML_DEFAULT_MAX_SHARD_BYTES, 1, I64,
     NULL, 0,
     "refuse a .gz/.zst or remote shard whose text passes this many bytes (compression bombs)"},
    {"max_shard_records", MML_OPT_INT, CFG(max_shard_records), MML_DEFAULT_MAX_SHARD_RECORDS, 1,
     I64, NULL, 0,
     "refuse a shard of more JSONL lines (blank ones too), array elements or tar members"},
    {"allow_paths_outside_root", MML_OPT_BOOL, CFG(allow_paths_outside_root), 1, 0, 1, NULL, FP,
     "False: image paths must stay inside the image root (path_refused)"},
    {"allow_remote_images_in_local_data", MML_OPT_BOOL, CFG(allow_remote_images), 1, 0, 1, NULL, FP,
     "False: records of local shards may not name URLs (path_refused)"},
    /* deadlines: every remote read and every next() is bounded */
    {"fetch_timeout_s", MML_OPT_FLOAT, CFG(fetch.timeout_s), 60, 0.001, 1e6, NULL, 0,
     "one remote request attempt's deadline (seconds)"},
    {"fetch_stall_s", MML_OPT_FLOAT, CFG(fetch.stall_s), 10, 0.001, 1e6, NULL, 0,
     "abandon an attempt that received nothing this long"},
    {"fetch_min_rate", MML_OPT_FLOAT, CFG(fetch.min_rate), 1024, 1, 1e12, NULL, 0,
     "abandon an attempt slower than this (bytes/s over fetch_stall_s)"},
    {"fetch_max_retries", MML_OPT_INT, CFG(fetch.max_retries), 8, 1, 1000, NULL, 0,
     "retries of a transient fetch failure"},
    {"fetch_retry_budget_s", MML_OPT_FLOAT, CFG(fetch.retry_budget_s), 60, 0.001, 1e6, NULL, 0,
     "no retry starts later than this after a request's first attempt"},
    {"next_timeout_s", MML_OPT_FLOAT, CFG(next_timeout_s), MML_DEFAULT_NEXT_TIMEOUT_S, 0.001, 1e9,
     NULL, 0, "next() raises, naming what it waits on, after this long without a batch"},
    {"mixture_tolerance", MML_OPT_FLOAT, CFG(mixture_tolerance), 0.05, -1, 1, NULL, 0,
     "warn when a source's share drifts by more than this (Loader: None never; -1 here)"},
};

#define NOPT ((int)(sizeof k_options / sizeof *k_options))

const mml_option *mml_loader_options(int *n) {
  if (n) *n = NOPT;
  return k_options;
}

const mml_option *mml_loader_option(const char *name) {
  for (int i = 0; name && i < NOPT; i++)
    if (!strcmp(k_options[i].name, name)) return &k_options[i];
  return NULL;
}

static void *field(mml_loader_cfg *c, const mml_option *o) { return (char *)c + o->offset; }
static const void *cfield(const mml_loader_cfg *c, const mml_option *o) {
  return (const char *)c + o->offset;
}

static void store_int(mml_loader_cfg *c, const mml_option *o, int64_t v) {
  if (o->size == 8) {
    memcpy(field(c, o), &v, 8); /* int64_t, or uint64_t (seed): the same bits */
  } else {
    int32_t w = (int32_t)v;
    memcpy(field(c, o), &w, 4);
  }
}

void mml_loader_cfg_defaults(mml_loader_cfg *c) {
  memset(c, 0, sizeof *c);
  for (int i = 0; i < NOPT; i++) {
    const mml_option *o = &k_options[i];
    if (o->type == MML_OPT_FLOAT)
      *(double *)field(c, o) = o->def;
    else if (o->type != MML_OPT_STR)
      store_int(c, o, (int64_t)o->def);
  }
}

static int count_choices(const mml_option *o);

mml_status mml_loader_cfg_check(const mml_loader_cfg *c, mml_err *err) {
  for (int i = 0; i < NOPT; i++) { /* a cfg built in C (not through the setters) */
    const mml_option *o = &k_options[i];
    if (o->type == MML_OPT_STR || o->flags & MML_OPT_INTERNAL) continue;
    if (o->type == MML_OPT_FLOAT) {
      double v = mml_option_get_float(c, o);
      if (!(v >= o->lo && v <= o->hi))
        return mml_err_set(err, MML_ECONFIG, "%s must be a number in [%g, %g], got %g", o->name,
                           o->lo, o->hi, v);
      continue;
    }
    int64_t v = mml_option_get_int(c, o);
    if (v == (int64_t)o->def && o->flags & MML_OPT_NONE) continue; /* None: automatic */
    double lo = o->type == MML_OPT_INT ? o->lo : 0;
    double hi = o->type == MML_OPT_INT ? o->hi : o->type == MML_OPT_BOOL ? 1 : count_choices(o) - 1;
    if ((double)v < lo || (double)v > hi)
      return mml_err_set(err, MML_ECONFIG, "%s must be in [%.0f, %.0f], got %lld", o->name, lo, hi,
                         (long long)v);
  }
  if (c->dp_rank >= c->dp_size)
    return mml_err_set(err, MML_ECONFIG, "dp_rank must be < dp_size (%d), got %d", c->dp_size,
                       c->dp_rank);
  if (c->collate.pack && c->collate.pack_length <= 0 && c->collate.seq_length <= 0)
    return mml_err_set(err, MML_ECONFIG, "packing=True needs pack_length (or seq_length)");
  if (!c->collate.pack && c->collate.pack_length > 0)
    return mml_err_set(err, MML_ECONFIG, "pack_length is only meaningful with packing=True");
  if (c->max_tokens_per_batch > 0) {
    if (c->collate.micro_batch_size > 0)
      return mml_err_set(err, MML_ECONFIG,
                         "give micro_batch_size (fixed rows) or max_tokens_per_batch (rows by "
                         "token budget), not both");
    if (c->collate.pack)
      return mml_err_set(err, MML_ECONFIG,
                         "max_tokens_per_batch budgets padded batches; with packing=True a "
                         "batch is one pack of pack_length tokens: set pack_length instead");
    if (c->collate.seq_length > 0)
      return mml_err_set(err, MML_ECONFIG,
                         "max_tokens_per_batch pads each batch to its longest sample; with "
                         "seq_length=%lld every row costs seq_length tokens: use "
                         "micro_batch_size=%lld instead",
                         (long long)c->collate.seq_length,
                         (long long)(c->max_tokens_per_batch / c->collate.seq_length));
  }
  return MML_OK;
}

static int count_choices(const mml_option *o) {
  int n = 0;
  while (o->choices && o->choices[n]) n++;
  return n;
}

mml_status mml_option_set_int(mml_loader_cfg *c, const mml_option *o, int64_t v, mml_err *err) {
  switch (o->type) {
    case MML_OPT_BOOL:
      if (v != 0 && v != 1)
        return mml_err_set(err, MML_ECONFIG, "%s must be True or False, got %lld", o->name,
                           (long long)v);
      break;
    case MML_OPT_ENUM:
      if (v < 0 || v >= count_choices(o))
        return mml_err_set(err, MML_ECONFIG, "%s: no choice number %lld", o->name, (long long)v);
      break;
    case MML_OPT_INT:
      if ((double)v < o->lo)
        return mml_err_set(err, MML_ECONFIG, "%s must be >= %.0f, got %lld", o->name, o->lo,
                           (long long)v);
      if ((double)v > o->hi)
        return mml_err_set(err, MML_ECONFIG, "%s must be <= %.0f, got %lld", o->name, o->hi,
                           (long long)v);
      break;
    default:
      return mml_err_set(err, MML_ECONFIG, "%s is not an integer option", o->name);
  }
  store_int(c, o, v);
  return MML_OK;
}

mml_status mml_option_set_float(mml_loader_cfg *c, const mml_option *o, double v, mml_err *err) {
  if (o->type != MML_OPT_FLOAT)
    return mml_err_set(err, MML_ECONFIG, "%s is not a number option", o->name);
  if (!(v >= o->lo && v <= o->hi)) /* NaN fails too */
    return mml_err_set(err, MML_ECONFIG, "%s must be a number in [%g, %g], got %g", o->name, o->lo,
                       o->hi, v);
  *(double *)field(c, o) = v;
  return MML_OK;
}

mml_status mml_option_set_str(mml_loader_cfg *c, const mml_option *o, const char *v, mml_err *err) {
  if (o->type != MML_OPT_STR)
    return mml_err_set(err, MML_ECONFIG, "%s is not a string option", o->name);
  *(const char **)field(c, o) = v;
  return MML_OK;
}

mml_status mml_option_set_enum(mml_loader_cfg *c, const mml_option *o, const char *name,
                               mml_err *err) {
  if (o->type != MML_OPT_ENUM)
    return mml_err_set(err, MML_ECONFIG, "%s is not a choice option", o->name);
  int n = count_choices(o);
  for (int i = 0; name && i < n; i++)
    if (!strcmp(o->choices[i], name)) return mml_option_set_int(c, o, i, err);
  char list[256] = "";
  size_t used = 0;
  for (int i = 0; i < n && used < sizeof list; i++)
    used +=
        (size_t)snprintf(list + used, sizeof list - used, "%s'%s'", i ? ", " : "", o->choices[i]);
  return mml_err_set(err, MML_ECONFIG, "%s must be one of (%s), got '%.200s'", o->name, list,
                     name ? name : "(null)");
}

int64_t mml_option_get_int(const mml_loader_cfg *c, const mml_option *o) {
  if (o->type == MML_OPT_FLOAT || o->type == MML_OPT_STR) return 0;
  if (o->size == 8) {
    int64_t v;
    memcpy(&v, cfield(c, o), 8);
    return v;
  }
  int32_t w;
  memcpy(&w, cfield(c, o), 4);
  return w;
}

double mml_option_get_float(const mml_loader_cfg *c, const mml_option *o) {
  return o->type == MML_OPT_FLOAT ? *(const double *)cfield(c, o) : 0.0;
}

const char *mml_option_get_str(const mml_loader_cfg *c, const mml_option *o) {
  return o->type == MML_OPT_STR ? *(const char *const *)cfield(c, o) : NULL;
}

const char *mml_option_enum_name(const mml_option *o, int64_t v) {
  return o->type == MML_OPT_ENUM && v >= 0 && v < count_choices(o) ? o->choices[v] : NULL;
}
