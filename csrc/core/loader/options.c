/*
 * options.c — the loader's option table (see mml/options.h) and its checked setters.
 *
 * One row per option.  A row names the field it sets with CFG(field), which records the
 * field's offset and size; an option with MML_OPT_NONE takes None for "off/automatic"
 * (its default, usually 0); one with MML_OPT_PYTHON (PY) is a Loader keyword mmloader
 * resolves in Python and has no field.  Rows are in the order the Loader documents them
 * (its docstring's option section is built from them, doc by doc).
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
#define PY MML_OPT_PYTHON
#define PYFIELD 0, 0 /* a row resolved in Python: no field of mml_loader_cfg */
#define I32 2147483647.0
#define I64 9223372036854775807.0

static const char *const k_data_format[] = {"auto", "jsonl", "json", "webdataset",
                                            NULL}; /* mml_layout */
static const char *const k_image_space[] = {"in_place", "qwen-vl-finetune",
                                            NULL}; /* mml_image_space */
static const char *const k_qwen3_video[] = {"blocks", "blocks-in-pair",
                                            NULL}; /* mml_qwen3_video_form */
static const char *const k_on_error[] = {"skip", "raise", NULL};
static const char *const k_keys[] = {"qwen", "megatron", NULL}; /* mml_key_style */
static const char *const k_label_mode[] = {"all_assistant", "last_assistant", "no_nonfinal_end",
                                           NULL}; /* mml_label_mode */
static const char *const k_text_only[] = {"placeholder", "omit", "empty",
                                          NULL}; /* mml_text_only_vision */
static const char *const k_pixel_format[] = {
    "float32",          "bfloat16",          "uint8", "float32-decode", "bfloat16-decode",
    "float32-consumer", "bfloat16-consumer", NULL}; /* mml_pixels (mml/loader.h) */
_Static_assert(sizeof k_pixel_format / sizeof *k_pixel_format == MML_PIXELS_BFLOAT16_CONSUMER + 2,
               "k_pixel_format lists mml_pixels in order");
static const char *const k_balance[] = {"none", "tokens", "vision_tokens", NULL}; /* mml_balance */
static const char *const k_recipe[] = {"processor", "llama-factory", "qwen-vl-finetune",
                                       NULL};                           /* MML_RECIPE_* */
static const char *const k_template[] = {"qwen2-vl", "qwen3-vl", NULL}; /* mml_template_style */
static const char *const k_preset[] = {"qwen2-vl", "qwen2.5-vl", "qwen3-vl",
                                       NULL}; /* mmloader/presets.py PRESETS */
static const char *const k_start[] = {"construction", "next", NULL}; /* mml_start */
static const char *const k_image_route[] = {"processor", "load_image", "qwen-vl-utils",
                                            NULL}; /* mml_image_route (mml/vision.h) */

static const mml_option k_options[] = {
    /* name, type, CFG(field) (PY: no field), default, lo, hi, enum names, flags, doc.
     * The doc is the Loader docstring's entry (mmloader.Loader.__doc__ is built from it)
     * and its first sentence the command lines' --help. */
    /* ---- the data */
    {"data_format", MML_OPT_ENUM, CFG(data_format), 0, 0, 0, k_data_format, 0,
     "Shard layout: auto, jsonl, json or webdataset. \"auto\": a ``.tar`` shard or one with a "
     "tar header is WebDataset, a shard whose first non-blank character is ``[`` a JSON array, "
     "anything else JSON lines; \"json\" is one array of records; \"webdataset\" groups tar "
     "members by key, ``000123.json`` the record and ``000123.jpg`` / ``000123.0.png`` its "
     "images, ``000123.mp4`` (m4v, mov, mkv, webm, avi) its videos when the record lists none, "
     "in tar order; range-read from the shard."},
    {"index", MML_OPT_STR, CFG(index), 0, 0, 0, NULL, NONE,
     "The dataset index (``python -m mmloader index``). None (default) uses ``<shard>.mmlidx`` "
     "next to each local shard when it exists; a folder or URL prefix (``--out`` of the index "
     "command) uses the files there, named by ``mmloader.dsindex.sidecar_path`` (remote shards "
     "need this: no request per shard is made to look for one); False (\"\" here) never reads "
     "one.  An indexed shard is not scanned at start, and samples longer than ``max_length`` / "
     "``seq_length`` / ``pack_length`` are skipped from their indexed token counts before "
     "anything is read; batches are bitwise those without the index.  An index whose shard "
     "changed (size, mtime; ETag for remote shards) is refused with ConfigError; one built with "
     "other settings (tokenizer, preset, pixel limits, ...) gives its offsets but not its "
     "counts (a warning)."},
    {"image_root", MML_OPT_STR, CFG(image_root), 0, 0, 0, NULL, NONE,
     "Folder or URL prefix relative image paths are resolved against (None: each shard's own "
     "folder)."},
    {"columns", MML_OPT_STR, CFG(columns), 0, 0, 0, NULL, NONE | FP,
     "A Parquet dataset's own column names, ``{column: key}`` (``\"column=key,...\"`` on the "
     "command line): each column is read as the record key it stands for (messages, "
     "conversations, images, image, videos, video, system, tools, ...), and a column named "
     "like one of those keys is then not read.  A column it names must be in every shard, "
     "and every shard must be a Parquet file (an error at construction otherwise). Per source "
     "too (None: the columns' own names)."},
    {"samples_per_epoch", MML_OPT_INT, CFG(samples_per_epoch), 0, 1, I64, NULL, NONE,
     "A mixture's epoch size (None: the fixed repeat/choose counts plus the weighted "
     "sources' sizes)."},
    {"allow_mixture_change", MML_OPT_BOOL, PYFIELD, 0, 0, 1, NULL, PY,
     "Restore a state saved under a different mixture. A source added, removed, reweighted, "
     "its data or settings changed: continue from the same sample count under the new mixture "
     "instead of raising StateError."},
    {"mixture_tolerance", MML_OPT_FLOAT, CFG(mixture_tolerance), 0.05, -1, 1, NULL, 0,
     "Warn when a source's share drifts by more than this. Warned once per source, when its "
     "share of the samples delivered so far differs from its share of the epoch by more than "
     "this, e.g. because many of its samples are skipped.  None: never (and not with "
     "group_by_length, whose windows reorder the sources on purpose); the engine's -1."},
    /* ---- the model: preset, checkpoint, tokenizer */
    {"preset", MML_OPT_ENUM, PYFIELD, 1, 0, 0, k_preset, PY,
     "The model family: qwen2-vl, qwen2.5-vl or qwen3-vl. It sets the vision numbers and the "
     "chat template."},
    {"model_dir", MML_OPT_STR, PYFIELD, 0, 0, 0, NULL, PY | NONE,
     "A checkpoint folder. Its preprocessor_config.json overrides the preset and its "
     "tokenizer.json is the default tokenizer."},
    {"tokenizer", MML_OPT_STR, PYFIELD, 0, 0, 0, NULL, PY | NONE,
     "tokenizer.json path (or a folder with one) or an mmloader.Tokenizer. None: the "
     "model_dir's tokenizer.json (ConfigError without one); \"tiny\": the small bundled test "
     "tokenizer, whose ids match no real model."},
    {"template", MML_OPT_ENUM, CFG(template_style), 0, 0, 0, k_template, FP | INTERNAL,
     "chat template family (from the preset)"},
    /* ---- vision (mmloader.presets.vision_config) */
    {"min_pixels", MML_OPT_INT, PYFIELD, 0, 1, I64, NULL, PY | NONE,
     "Smallest resized image area in pixels (None: the preset's / model_dir's)."},
    {"max_pixels", MML_OPT_INT, PYFIELD, 0, 1, I64, NULL, PY | NONE,
     "Largest resized image area in pixels (None: the preset's / model_dir's)."},
    {"max_image_pixels", MML_OPT_INT, PYFIELD, 0, 1, I64, NULL, PY | NONE,
     "Refuse images with more pixels, before decoding. Pillow's decompression-bomb error "
     "threshold by default (None)."},
    {"legacy_resize", MML_OPT_BOOL, PYFIELD, 0, 0, 1, NULL, PY | NONE,
     "The older smart_resize (None: off, or model_dir's; see mmloader.presets.vision_config)."},
    {"fast_decode", MML_OPT_BOOL, PYFIELD, 0, 0, 1, NULL, PY | NONE,
     "Reduced-scale JPEG decode when the target is at most half the source. Faster, not "
     "bit-exact (None: off)."},
    {"strict_jpeg", MML_OPT_BOOL, PYFIELD, 0, 0, 1, NULL, PY,
     "Also skip JPEGs that decode only with warnings. Reason \"corrupt_image\": JPEGs that "
     "libjpeg decodes only with \"Corrupt JPEG data\" warnings.  By default they load as Pillow "
     "loads them; like Pillow, a libjpeg error anywhere (also after the last row) is a skip."},
    {"image_route", MML_OPT_ENUM, PYFIELD, 0, 0, 0, k_image_route, PY,
     "The reference pipeline pixels match, bit for bit: processor, load_image or qwen-vl-utils. "
     "\"processor\": Image.open, then the HF processor (transparency composited onto white, EXIF "
     "orientation ignored); \"load_image\": transformers' load_image first (EXIF orientation "
     "applied, alpha dropped by convert(\"RGB\")); \"qwen-vl-utils\": its fetch_image first "
     "(RGBA pasted onto white, other modes convert(\"RGB\"), its own smart_resize, then one "
     "bicubic resize; a palette/tRNS transparency colour is whitened after that resize, as the "
     "processor then does)."},
    /* ---- text: template, labels */
    {"system_prompt", MML_OPT_STR, CFG(system_prompt), 0, 0, 0, NULL, FP | NONE,
     "The system turn added to conversations without one. None: the template's default "
     "(\"You are a helpful assistant.\" for qwen2/2.5-vl, none for qwen3-vl); \"\": none."},
    {"label_mode", MML_OPT_ENUM, CFG(label_mode), 0, 0, 0, k_label_mode, FP,
     "Which assistant tokens are supervised: all_assistant, last_assistant or "
     "no_nonfinal_end."},
    {"image_whitespace", MML_OPT_ENUM, CFG(image_space), 0, 0, 0, k_image_space, FP,
     "Text around ``<image>`` tags: in_place or qwen-vl-finetune. \"in_place\": as written (the "
     "HF processor, LLaMA-Factory, ms-swift); \"qwen-vl-finetune\": Qwen's official "
     "fine-tuning code (user text between tags stripped, empty pieces dropped, so "
     "``\"<image>\\nWhat is it?\"`` has no newline after the image)."},
    {"qwen3_video_prompt", MML_OPT_ENUM, CFG(qwen3_video_prompt), 0, 0, 0, k_qwen3_video, FP,
     "Qwen3-VL: how a video's timestamped frames sit in the prompt, as transformers' "
     "processor writes them. \"blocks\" (default; transformers 4.57 to 5.9 and 5.25 on, "
     "the engine's reference is 5.25): the per-frame \"<t seconds><|vision_start|>pads"
     "<|vision_end|>\" blocks alone, replacing the whole "
     "<|vision_start|><|video_pad|><|vision_end|>; \"blocks-in-pair\" (transformers 5.10 "
     "to 5.24): the chat template's <|vision_start|> and <|vision_end|> kept around them "
     "(two tokens more per video). "
     "recipe=\"llama-factory\" writes LLaMA-Factory's own form (the blocks alone): leave "
     "this at its default there (docs/recipes.md)."},
    /* recipes: whose data path the samples follow; the llama-factory settings keep
     * LLaMA-Factory's own names (mmloader/recipes.py fills the recipe's defaults) */
    {"recipe", MML_OPT_ENUM, CFG(recipe), 0, 0, 0, k_recipe, FP,
     "Whose data path the samples follow: processor, llama-factory or qwen-vl-finetune. "
     "\"processor\": the HF processor (default); \"llama-factory\": LLaMA-Factory's template, "
     "per-message tokenization and truncation; \"qwen-vl-finetune\": Qwen's own fine-tuning "
     "code (QwenLM/Qwen3-VL qwen-vl-finetune: its messages, labels, pixel limits and "
     "model_max_length; see :mod:`mmloader.recipes`, docs/recipes.md)."},
    {"cutoff_len", MML_OPT_INT, CFG(lf.cutoff_len), 0, 1, I64, NULL, FP | NONE,
     "llama-factory: truncate to this many tokens as its infer_seqlen does. It splits source "
     "and target (None: 2048; LLaMA-Factory's settings keep its names and defaults, "
     "recipe=\"llama-factory\" only)."},
    {"mask_history", MML_OPT_BOOL, CFG(lf.mask_history), 0, 0, 1, NULL, FP,
     "llama-factory: train on the last turn only. Truncation keeps the last turns first."},
    {"train_on_prompt", MML_OPT_BOOL, CFG(lf.train_on_prompt), 0, 0, 1, NULL, FP,
     "llama-factory: label the prompt tokens too."},
    {"enable_thinking", MML_OPT_BOOL, CFG(lf.enable_thinking), 0, 0, 1, NULL, FP,
     "llama-factory, Qwen3-VL: its qwen3_vl template. An empty ``<think>`` block trained before "
     "each answer, instead of qwen3_vl_nothink."},
    {"image_max_pixels", MML_OPT_INT, CFG(lf.image_max_pixels), 0, 1, I64, NULL, FP | NONE,
     "llama-factory: images over this many pixels are first shrunk with Pillow. As its "
     "mm_plugin does, before the processor's own resize (None: 768*768)."},
    {"image_min_pixels", MML_OPT_INT, CFG(lf.image_min_pixels), 0, 1, I64, NULL, FP | NONE,
     "llama-factory: images under this many pixels are first grown with Pillow (None: 32*32)."},
    /* video_fps, video_max_pixels and video_min_pixels: one row each, read by both recipes
     * under the name both frameworks give them, each with its framework's default (stored
     * in lf.*; loader_sources.c copies them into the vision cfg of either recipe) */
    {"video_fps", MML_OPT_FLOAT, CFG(lf.video_fps), 0, 0, 1e6, NULL, FP | NONE,
     "llama-factory: video frames kept per second of the stream's duration (None: 2.0). "
     "qwen-vl-finetune: its DataArguments.video_fps, the video processor's fps: Qwen3-VL "
     "samples by it, and second_per_grid_ts is 2 / video_fps (None: 2)."},
    {"video_maxlen", MML_OPT_INT, CFG(lf.video_maxlen), 0, 1, I32, NULL, FP | NONE,
     "llama-factory: at most this many video frames kept (None: 128)."},
    {"video_max_pixels", MML_OPT_INT, CFG(lf.video_max_pixels), 0, 1, I64, NULL, FP | NONE,
     "llama-factory: video frames over this many pixels are first shrunk with Pillow (None: "
     "256*256). qwen-vl-finetune: the video processor's max_pixels, as its "
     "update_processor_pixels sets them (None: 1024*28*28)."},
    {"video_min_pixels", MML_OPT_INT, CFG(lf.video_min_pixels), 0, 1, I64, NULL, FP | NONE,
     "llama-factory: video frames under this many pixels are first grown with Pillow (None: "
     "16*16). qwen-vl-finetune: the video processor's min_pixels (None: 256*28*28)."},
    {"video_min_frames", MML_OPT_INT, CFG(qft.video_min_frames), 0, 1, I32, NULL, FP | NONE,
     "qwen-vl-finetune: Qwen3-VL videos keep at least this many frames (its "
     "DataArguments.video_min_frames; None: 4)."},
    {"video_max_frames", MML_OPT_INT, CFG(qft.video_max_frames), 0, 1, I32, NULL, FP | NONE,
     "qwen-vl-finetune: Qwen3-VL videos keep at most this many frames (None: 8)."},
    {"model_max_length", MML_OPT_INT, CFG(qft.model_max_length), 0, 1, I64, NULL, FP | NONE,
     "qwen-vl-finetune: cut each sample to its first this many tokens. As its collator cuts "
     "each padded row; a cut through an image's tokens skips the sample as \"too_long\" (None: "
     "the checkpoint tokenizer's model_max_length from its tokenizer_config.json, model_dir's "
     "else the tokenizer file's folder, as its collator cuts at processor.tokenizer's; no "
     "cut where it gives none; recipe=\"qwen-vl-finetune\" only)."},
    {"data_flatten", MML_OPT_BOOL, CFG(collate.flatten), 0, 0, 1, NULL, FP,
     "qwen-vl-finetune: its DataArguments.data_flatten. Each batch's micro_batch_size samples "
     "concatenated into one row, as its FlattenedDataCollatorForSupervisedDataset does: "
     "input_ids and labels [1, L] (L the sum of their lengths, no padding, no model_max_length "
     "cut), position_ids [3, 1, L] (each sample's M-RoPE positions; mrope is implied), "
     "attention_mask int32 [n+1] (the cumulative lengths: its cu_seqlens), the samples' "
     "pixel_values and grids in order.  recipe=\"qwen-vl-finetune\" only (every source of a "
     "mixture); not with packing, seq_length, max_tokens_per_batch, shift_labels, "
     "keys=\"megatron\", attention_mask=False or model_max_length."},
    {"data_packing", MML_OPT_BOOL, CFG(data_packing), 0, 0, 1, NULL, FP,
     "qwen-vl-finetune: its DataArguments.data_packing. A record that is a JSON list of "
     "records (an entry of the packed files its tools/pack_data.py writes) is one sample, a "
     "pack: sampled, sharded, counted, skipped and resumed as a unit; each of its records is "
     "made as on its own and batches are Qwen's flattened ones (data_flatten is implied): "
     "micro_batch_size packs, their records back to back, attention_mask the cumulative "
     "lengths of the records, position_ids restarting at each record.  A plain record is a "
     "pack of one.  max_length and max_images_per_sample bound the whole pack."},
    {"dataloader_drop_last", MML_OPT_BOOL, PYFIELD, 0, 0, 1, NULL, PY,
     "qwen-vl-finetune: the Hugging Face TrainingArguments name. Its Trainer's default "
     "(False) trains an epoch's last partial batch, which mmloader's epochs never hold (they "
     "end at the last full batch): under the recipe a Loader whose epoch leaves samples after "
     "the last full batch is a ConfigError naming them, unless dataloader_drop_last=True "
     "(what its --dataloader_drop_last True trains).  recipe=\"qwen-vl-finetune\" only."},
    {"max_length", MML_OPT_INT, CFG(max_length), 0, 1, I64, NULL, FP | NONE,
     "Skip samples with more tokens (reason \"too_long\"; None: no limit)."},
    /* ---- batches */
    {"micro_batch_size", MML_OPT_INT, CFG(collate.micro_batch_size), 0, 1, I32, NULL, FP | NONE,
     "Rows per padded batch (None: 8; not with max_tokens_per_batch)."},
    {"seq_length", MML_OPT_INT, CFG(collate.seq_length), 0, 1, I64, NULL, FP | NONE,
     "Padded row length (None: each batch's longest sample)."},
    {"max_tokens_per_batch", MML_OPT_INT, CFG(max_tokens_per_batch), 0, 1, I64, NULL, FP | NONE,
     "Batches by token budget instead of a fixed row count. A padded batch of r samples whose "
     "longest has m tokens (text + vision tokens) holds r * m <= max_tokens_per_batch (its "
     "input_ids tensor, padding included); needs seq_length=None and packing=False (with "
     "packing, a batch is one pack of pack_length tokens).  A sample longer than the budget is "
     "skipped (reason \"too_long\", warned about when the loader is built).  Turns on the "
     "global plan."},
    {"balance", MML_OPT_ENUM, CFG(balance), 0, 0, 0, k_balance, FP,
     "Spread each global step's tokens or vision_tokens evenly over the DP ranks. \"tokens\" "
     "or \"vision_tokens\": each global step's samples are spread over the DP ranks so that the "
     "most loaded rank's cost is close to the mean (longest first to the least loaded rank where "
     "the sample fits the batch); None or \"none\": each rank takes consecutive samples of the "
     "step.  Turns on the global plan."},
    {"group_by_length", MML_OPT_INT, CFG(group_by_length), 0, 1, 1 << 30, NULL, FP | NONE,
     "Sort windows of this many samples by length, longest first, before batching. Less "
     "padding, better balance with a token budget; still a pure function of (seed, epoch).  "
     "Turns on the global plan."},
    {"global_plan", MML_OPT_BOOL, CFG(global_plan), 0, 0, 1, NULL, FP,
     "Compose by the global plan even without the three options above. Fixed micro_batch_size "
     "rows, or packs: for elastic resume.  The global plan (any of the four): every sample's "
     "token count is measured before training by a planning pass (records, template, "
     "tokenizer, image headers; no decode), then each epoch is cut into global steps that give "
     "every DP rank exactly one batch, decided from counts alone.  Samples that fail while "
     "planning are skipped (counted and warned about when the loader is built); an epoch's "
     "tail too short for one more step is dropped.  ``len()`` is the epoch's step count.  The "
     "state holds the global sample count (``plan_pos``), so a checkpoint resumes on another "
     "dp_size, micro_batch_size, max_tokens_per_batch or balance with no sample repeated or "
     "lost over the epoch (same configuration: the exact next batch)."},
    {"packing", MML_OPT_BOOL, CFG(collate.pack), 0, 0, 1, NULL, FP,
     "Pack samples into ``[1, pack_length]`` rows with ``cu_seqlens``."},
    {"pack_length", MML_OPT_INT, CFG(collate.pack_length), 0, 1, I32, NULL, FP | NONE,
     "Token budget of one pack (None: seq_length)."},
    {"pad_to_multiple", MML_OPT_INT, CFG(collate.pad_to_multiple), 0, 1, 1 << 20, NULL, FP | NONE,
     "Pad each packed sample to a multiple of this (TP/CP)."},
    {"pad_id", MML_OPT_INT, CFG(collate.pad_id), -1, -1, I32, NULL, INTERNAL,
     "padding token id (-1: the tokenizer's <|endoftext|>)"},
    /* ---- order and ranks */
    {"shuffle", MML_OPT_BOOL, CFG(shuffle), 1, 0, 1, NULL, FP,
     "Shuffle the epoch order (a pure function of seed and epoch)."},
    {"seed", MML_OPT_INT, CFG(seed), 0, -I64, I64, NULL, FP, "Seed of the epoch order."},
    {"dp_rank", MML_OPT_INT, CFG(dp_rank), 0, 0, I32, NULL, FP | NONE,
     "This rank of a data-parallel group. Ranks get disjoint samples and the same number of "
     "batches.  None (default): Megatron's data-parallel rank when its model parallelism is "
     "initialised, else the rank of an initialised torch.distributed, else of the RANK "
     "environment variable (torchrun, accelerate launch), else 0.  Under a distributed "
     "launch give both dp_rank and dp_size or neither; a dp_size must divide the world "
     "size."},
    {"dp_size", MML_OPT_INT, CFG(dp_size), 1, 1, I32, NULL, FP | NONE,
     "Data-parallel ranks. None (default): Megatron's data-parallel size when its model "
     "parallelism is initialised, else the world size of an initialised torch.distributed, "
     "else of the WORLD_SIZE environment variable, else 1."},
    {"cycle", MML_OPT_BOOL, CFG(cycle), 0, 0, 1, NULL, 0,
     "Never stop at an epoch end (Megatron-style iterators)."},
    /* ---- the batch's tensors */
    {"keys", MML_OPT_ENUM, CFG(collate.keys), 0, 0, 0, k_keys, FP,
     "Tensor names: qwen (Hugging Face) or megatron."},
    {"shift_labels", MML_OPT_BOOL, CFG(collate.shift_labels), 0, 0, 1, NULL, FP,
     "Labels shifted by one (Megatron convention)."},
    {"mrope", MML_OPT_BOOL, CFG(collate.mrope), 0, 0, 1, NULL, FP,
     "Emit 3-row M-RoPE position ids and rope_deltas."},
    {"attention_mask", MML_OPT_BOOL, CFG(collate.attention_mask), 1, 0, 1, NULL, FP,
     "Emit attention_mask."},
    {"text_only_vision", MML_OPT_ENUM, CFG(collate.text_only_vision), 0, 0, 0, k_text_only, FP,
     "Vision keys of a batch without images: placeholder, omit or empty. \"placeholder\": one "
     "zero pixel row and grid [[0, 0, 0]] (a fixed key set); \"omit\": no vision keys; "
     "\"empty\": zero-row tensors."},
    {"pixel_format", MML_OPT_ENUM, CFG(pixels), 0, 0, 0, k_pixel_format, 0,
     "What ``pixel_values`` holds and where its floats are made: float32, bfloat16, uint8, "
     "float32-decode, bfloat16-decode, float32-consumer or bfloat16-consumer. Every float "
     "choice gives the HF processor's values bit for bit; they differ in where the resized "
     "uint8 bytes become floats.  \"float32\": ``[patches, 3*T*P*P]``, images decoded into "
     "uint8 patch rows (an eighth of the bytes) while their batch is built and expanded in "
     "the engine when it is finished (far less memory in flight; under ``max_memory`` the "
     "uint8 rows count and room for the expansions is kept; float rows are written directly "
     "under ``pin_memory``, ``device`` or sources with different image mean/std; "
     "``stats()[\"pixel_rows_expanded\"]`` counts the expanded rows); \"bfloat16\": the "
     "same, each value rounded to nearest even (exactly "
     "``float32_values.to(torch.bfloat16)``); \"uint8\": the resized RGB patches before "
     "rescale/normalise, ``[patches, 3*P*P]`` (one frame per row, a still image's T copies "
     "left out, 8x fewer bytes than float32), for :func:`mmloader.torch.expand_pixels`; "
     "\"float32-decode\" / \"bfloat16-decode\": the decode workers write float rows "
     "directly; \"float32-consumer\" / \"bfloat16-consumer\": the engine ships uint8 "
     "patches and the consumer expands them where the tensor is (on the GPU after the copy: "
     "8x fewer host-to-device bytes), which :class:`mmloader.torch.Loader` and the Megatron "
     "and Bridge adapters do (their default with a CUDA ``device``); the core Loader, whose "
     "batches are the engine's, refuses them.  docs/pixels.md has the old ``compact_pixels`` "
     "/ ``wire_format`` spellings."},
    {"mm_token_type_ids", MML_OPT_BOOL, CFG(collate.mm_token_type_ids), 0, 0, 1, NULL, FP,
     "Also emit mm_token_type_ids (transformers >= 5, qwen keys)."},
    {"pin_memory", MML_OPT_BOOL, CFG(pin_memory), 0, 0, 1, NULL, 0,
     "Batches in page-locked memory (fast .cuda(non_blocking=True)). Plain memory, with one "
     "warning, when CUDA is unavailable (stats()[\"pinned\"] tells).  A released pinned batch is "
     "reused only after the work queued on the default CUDA stream (of the device current when "
     "the loader was built) before the release has completed, so ``b.cuda(non_blocking=True)`` "
     "followed by dropping ``b`` is safe there; for copies on other streams keep the batch "
     "alive until they are done, or use ``device=``."},
    {"device", MML_OPT_INT, CFG(device), -1, -1, 1 << 16, NULL, INTERNAL,
     "CUDA device batches are copied to (-1: host; Loader takes device='cuda:N')"},
    /* ---- the engine: threads, memory, failures */
    {"num_threads", MML_OPT_INT, CFG(num_threads), 0, 1, 4096, NULL, NONE,
     "Worker threads (None: CPUs in the affinity mask divided by ``LOCAL_WORLD_SIZE``)."},
    {"prefetch", MML_OPT_INT, CFG(prefetch), 4, 1, 1 << 20, NULL, 0,
     "Batches in memory ahead of the consumer, finished or being decoded. The depth of a "
     "DataLoader's prefetch_factor x num_workers.  Finished ones also stop at max_memory's "
     "bytes (2 GiB without it), and the queue's slots grow with use: a huge value costs only "
     "what is queued."},
    {"start", MML_OPT_ENUM, CFG(start), 0, 0, 0, k_start, 0,
     "When the workers start producing: construction or next. \"construction\" (default): as "
     "soon as the Loader is built, the first batches of its start (epoch 0), so the trainer's "
     "set-up between building the loader and its first next() (loading the model, compiling) "
     "overlaps them; load_state_dict / set_epoch before the first next() drop that work and "
     "the batches are bitwise the same.  It is the production a running loader holds "
     "(``prefetch`` batches and the ``window``, within ``max_memory``), made earlier.  "
     "\"next\": no sample is read before the first next() (a loader built only to be "
     "inspected, or one always restored before it is read: mmloader.ray's producers)."},
    {"window", MML_OPT_INT, CFG(window), 0, 1, 1 << 24, NULL, NONE,
     "Samples in flight ahead of collation. None: 2 * micro_batch_size, at least 4 * "
     "num_threads and 16; with a remote shard or image root at least (prefetch + 2) * "
     "micro_batch_size and 64, so the round trips of the samples being fetched overlap the "
     "decoding.  With ``prefetch`` it bounds memory."},
    {"max_memory", MML_OPT_INT, CFG(max_memory), 0, 1, I64, NULL, NONE,
     "A cap in bytes on the engine's memory (None: no cap). It counts every batch buffer of its "
     "pool (the batches it prepares, those the consumer still holds, and those kept mapped for "
     "reuse), the encoded bytes of the samples in flight (with the bytes of remote videos "
     "fetched ahead of their decode: fetched only with room, at most a quarter of the cap, else "
     "read when needed), the videos kept open from their probe to their decode (demuxer state "
     "and frame tables: ``stats()[\"video_open_peak_bytes\"]``; one without room is opened again "
     "by its decode), 16 MiB of scratch per worker, and the decoder scratch an image needs "
     "beyond that while it is decoded (from its header: a progressive JPEG's coefficients, 3 "
     "bytes a pixel at 4:2:0; a whole-image buffer for interlaced PNG, WebP, GIF, TIFF; "
     "``ImageProcessor.plan(data)[\"scratch\"]``), taken before its decode starts.  With Parquet "
     "shards a quarter of the cap is set aside for the row groups being read.  Video bytes "
     "held ahead of their use are taken only with room left for a batch as large as the "
     "largest so far, and give way when the next batch cannot get its buffer.  Work waits for "
     "room (backpressure); a sample that alone cannot fit raises OutOfMemoryError naming it "
     "(and its image, when its decoder scratch is what does not fit), and so does a next() "
     "whose batch cannot fit beside the batches the consumer still holds (the message names "
     "the max_memory that would hold it)."},
    {"on_error", MML_OPT_ENUM, CFG(on_error_raise), 0, 0, 0, k_on_error, 0,
     "A failed sample: skip or raise. \"skip\": count, warn, continue; \"raise\": ``next`` raises "
     "the sample's error, in stream order (iteration may continue afterwards)."},
    {"max_error_rate", MML_OPT_FLOAT, CFG(max_error_rate), 0.1, 0, 1, NULL, 0,
     "Raise once more than this fraction of samples failed (over at least 100)."},
    {"min_error_samples", MML_OPT_INT, CFG(min_error_samples), 100, 1, I64, NULL, INTERNAL,
     "samples consumed before max_error_rate applies"},
    {"plan_only", MML_OPT_BOOL, CFG(plan_only), 0, 0, 1, NULL, 0,
     "A planning pass: batches carry only their cursors. Samples are read, planned from their "
     "image headers and tokenized but never decoded; each batch is an empty dict and "
     "``state_dict()`` after it tells where it ends (the same composition, unless an image "
     "fails only when decoded).  mmloader.ray plans packed streams with it."},
    /* ---- per-sample resource limits (a sample over one is skipped with its own reason) and
     * the path policy: they decide which samples are skipped, so they are fingerprinted */
    {"max_images_per_sample", MML_OPT_INT, CFG(max_images_per_sample),
     MML_DEFAULT_MAX_IMAGES_PER_SAMPLE, 1, I32, NULL, FP,
     "Skip samples naming more images (reason \"too_many_images\")."},
    {"max_sample_pixels", MML_OPT_INT, CFG(max_sample_pixels), MML_DEFAULT_MAX_SAMPLE_PIXELS, 1,
     I64, NULL, FP,
     "Skip samples whose images hold more pixels in all. Each image counts at the larger of "
     "its size in the file and after resizing (which a record's min_pixels or "
     "resized_height/width keys decide), from the headers, checked before any decode (reason "
     "\"sample_too_large\"; the default 2**27 is e.g. 16 4K frames)."},
    {"max_sample_pixel_bytes", MML_OPT_INT, CFG(max_sample_pixel_bytes),
     MML_DEFAULT_MAX_SAMPLE_PIXEL_BYTES, 1, I64, NULL, FP,
     "Skip samples whose pixel_values (and pixel_values_videos) would take more bytes in the "
     "pixel_format, from the resized sizes, checked before any decode (reason "
     "\"sample_too_large\"; the default 2 GiB is the finished batches' budget without "
     "max_memory).  A record's size keys can ask for any size: transformers' processor "
     "builds 2.4 GB of float32 for a 32x24 image whose record says min_pixels=max_pixels=1e8."},
    {"max_record_bytes", MML_OPT_INT, CFG(max_record_bytes), MML_DEFAULT_MAX_RECORD_BYTES, 1, I64,
     NULL, FP, "Skip longer records before reading them (reason \"record_too_large\")."},
    {"max_json_depth", MML_OPT_INT, CFG(max_json_depth), MML_DEFAULT_MAX_JSON_DEPTH, 1, 100000,
     NULL, FP, "Skip records nested deeper (reason \"bad_record\")."},
    {"max_object_bytes", MML_OPT_INT, CFG(max_object_bytes), MML_DEFAULT_MAX_OBJECT_BYTES, 1, I64,
     NULL, FP,
     "Skip samples with a larger encoded image, local or remote (reason \"object_too_large\"). A "
     "WebDataset member is checked from its tar header, before it is read."},
    {"max_jpeg_scans", MML_OPT_INT, CFG(max_jpeg_scans), MML_DEFAULT_MAX_JPEG_SCANS, 1, I32, NULL,
     FP,
     "Skip samples with a JPEG of more scans (reason \"too_many_scans\"). Encoders write "
     "about 10; each scan of a progressive JPEG decodes the whole image again, so a few "
     "hundred KB can cost minutes."},
    /* per-shard limits: a shard over one is refused (hostile or corrupt data) */
    {"max_shard_bytes", MML_OPT_INT, CFG(max_shard_bytes), MML_DEFAULT_MAX_SHARD_BYTES, 1, I64,
     NULL, 0,
     "Refuse a .gz/.zst or remote shard whose text passes this many bytes (compression bombs). "
     "mmloader.SampleError names the shard and the limit: a .gz/.zst shard whose decompressed "
     "text, or a remote shard whose streamed text, passes it (the decompressed copy lives in "
     "$TMPDIR; the default is 8 GiB)."},
    {"max_shard_records", MML_OPT_INT, CFG(max_shard_records), MML_DEFAULT_MAX_SHARD_RECORDS, 1,
     I64, NULL, 0,
     "Refuse a shard of more JSONL lines (blank ones too), array elements or tar members. The "
     "default 2**24 = 16,777,216 is 128 MiB of index."},
    {"allow_paths_outside_root", MML_OPT_BOOL, CFG(allow_paths_outside_root), 1, 0, 1, NULL, FP,
     "False confines image paths to the image root (for untrusted data). True (default, as in "
     "earlier releases): image paths may be absolute, use ``..`` or follow symlinks anywhere.  "
     "False: relative references must stay inside the image root; others are skipped (reason "
     "\"path_refused\") before anything is opened."},
    {"allow_remote_images_in_local_data", MML_OPT_BOOL, CFG(allow_remote_images), 1, 0, 1, NULL, FP,
     "False refuses URLs in the records of local shards. True (default): records of local "
     "shards may name http(s)/s3 images, which are fetched; False skips them (reason "
     "\"path_refused\")."},
    /* ---- remote data; deadlines: every remote read and every next() is bounded */
    {"s3_endpoint", MML_OPT_STR, CFG(fetch.endpoint), 0, 0, 0, NULL, NONE,
     "S3 endpoint URL (None: AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, else AWS)."},
    {"s3_region", MML_OPT_STR, CFG(fetch.region), 0, 0, 0, NULL, NONE,
     "S3 region (None: AWS_REGION / AWS_DEFAULT_REGION, else us-east-1)."},
    {"aws_access_key_id", MML_OPT_STR, CFG(fetch.access_key), 0, 0, 0, NULL, NONE | SECRET,
     "S3 access key (None: AWS_ACCESS_KEY_ID)."},
    {"aws_secret_access_key", MML_OPT_STR, CFG(fetch.secret_key), 0, 0, 0, NULL, NONE | SECRET,
     "S3 secret key (None: AWS_SECRET_ACCESS_KEY)."},
    {"aws_session_token", MML_OPT_STR, CFG(fetch.session_token), 0, 0, 0, NULL, NONE | SECRET,
     "S3 session token (None: AWS_SESSION_TOKEN)."},
    {"max_inflight", MML_OPT_INT, CFG(fetch.max_inflight), 0, 1, 100000, NULL, NONE,
     "Remote requests in flight (None: 64)."},
    {"fetch_timeout_s", MML_OPT_FLOAT, CFG(fetch.timeout_s), 60, 0.001, 1e6, NULL, 0,
     "One remote request attempt's deadline in seconds."},
    {"fetch_stall_s", MML_OPT_FLOAT, CFG(fetch.stall_s), 10, 0.001, 1e6, NULL, 0,
     "Abandon an attempt that received nothing this long."},
    {"fetch_min_rate", MML_OPT_FLOAT, CFG(fetch.min_rate), 1024, 1, 1e12, NULL, 0,
     "Abandon an attempt slower than this many bytes/s over ``fetch_stall_s``. The default is "
     "a server dripping bytes."},
    {"fetch_max_retries", MML_OPT_INT, CFG(fetch.max_retries), 8, 1, 1000, NULL, 0,
     "Retries of a transient fetch failure ..."},
    {"fetch_retry_budget_s", MML_OPT_FLOAT, CFG(fetch.retry_budget_s), 60, 0.001, 1e6, NULL, 0,
     "... within this many seconds of the request's first attempt. So a sample's fetches are "
     "over within about twice that.  Identical requests in flight are fetched once."},
    {"next_timeout_s", MML_OPT_FLOAT, CFG(next_timeout_s), MML_DEFAULT_NEXT_TIMEOUT_S, 0.001, 1e9,
     NULL, 0,
     "next() raises after this long without a batch. The error (mmloader.Error) names the "
     "sample, stage and URL it waits on."},
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

int mml_pixels_emitted(int pixels) {
  switch (pixels) {
    case MML_PIXELS_BFLOAT16:
    case MML_PIXELS_BFLOAT16_DECODE:
      return MML_PIXEL_BFLOAT16;
    case MML_PIXELS_UINT8:
    case MML_PIXELS_FLOAT32_CONSUMER:
    case MML_PIXELS_BFLOAT16_CONSUMER:
      return MML_PIXEL_UINT8;
    default:
      return MML_PIXEL_FLOAT32;
  }
}

int mml_pixels_compact(int pixels) {
  return pixels == MML_PIXELS_FLOAT32 || pixels == MML_PIXELS_BFLOAT16;
}

const char *mml_pixels_name(int pixels) {
  return pixels >= 0 && pixels <= MML_PIXELS_BFLOAT16_CONSUMER ? k_pixel_format[pixels] : "?";
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
    if (o->flags & MML_OPT_PYTHON) continue;
    if (o->type == MML_OPT_FLOAT)
      *(double *)field(c, o) = o->def;
    else if (o->type != MML_OPT_STR)
      store_int(c, o, (int64_t)o->def);
  }
}

void mml_loader_cfg_fill_zeros(mml_loader_cfg *c) {
  for (int i = 0; i < NOPT; i++) {
    const mml_option *o = &k_options[i];
    if (o->type == MML_OPT_STR || o->flags & (MML_OPT_PYTHON | MML_OPT_INTERNAL | MML_OPT_NONE))
      continue;
    if (o->type == MML_OPT_FLOAT) {
      if (*(double *)field(c, o) == 0 && o->lo > 0) *(double *)field(c, o) = o->def;
    } else if (o->type == MML_OPT_INT && mml_option_get_int(c, o) == 0 && o->lo > 0) {
      store_int(c, o, (int64_t)o->def);
    }
  }
}

static int count_choices(const mml_option *o);

mml_status mml_loader_cfg_check(const mml_loader_cfg *c, mml_err *err) {
  for (int i = 0; i < NOPT; i++) { /* a cfg built in C (not through the setters) */
    const mml_option *o = &k_options[i];
    if (o->type == MML_OPT_STR || o->flags & (MML_OPT_INTERNAL | MML_OPT_PYTHON)) continue;
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
  if (c->collate.flatten) {
    const char *bad = c->collate.pack                    ? "packing=True"
                      : c->collate.seq_length > 0        ? "seq_length"
                      : c->max_tokens_per_batch > 0      ? "max_tokens_per_batch"
                      : c->collate.shift_labels          ? "shift_labels=True"
                      : c->collate.keys != MML_KEYS_QWEN ? "keys=\"megatron\""
                      : !c->collate.attention_mask       ? "attention_mask=False"
                                                         : NULL;
    if (bad)
      return mml_err_set(err, MML_ECONFIG,
                         "data_flatten=True makes Qwen's flattened batches (one row of whole "
                         "samples, cu_seqlens as attention_mask, qwen keys): not with %s",
                         bad);
  }
  if (c->data_packing && !c->collate.flatten)
    return mml_err_set(err, MML_ECONFIG,
                       "data_packing=True makes Qwen's flattened batches of packs: it needs "
                       "data_flatten (the Loader implies it)");
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

static mml_status python_row(const mml_option *o, mml_err *err) {
  return mml_err_set(err, MML_ECONFIG, "%s is resolved by mmloader.Loader, not the engine",
                     o->name);
}

mml_status mml_option_set_int(mml_loader_cfg *c, const mml_option *o, int64_t v, mml_err *err) {
  if (o->flags & MML_OPT_PYTHON) return python_row(o, err);
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
  if (o->flags & MML_OPT_PYTHON) return python_row(o, err);
  if (o->type != MML_OPT_FLOAT)
    return mml_err_set(err, MML_ECONFIG, "%s is not a number option", o->name);
  if (!(v >= o->lo && v <= o->hi)) /* NaN fails too */
    return mml_err_set(err, MML_ECONFIG, "%s must be a number in [%g, %g], got %g", o->name, o->lo,
                       o->hi, v);
  *(double *)field(c, o) = v;
  return MML_OK;
}

mml_status mml_option_set_str(mml_loader_cfg *c, const mml_option *o, const char *v, mml_err *err) {
  if (o->flags & MML_OPT_PYTHON) return python_row(o, err);
  if (o->type != MML_OPT_STR)
    return mml_err_set(err, MML_ECONFIG, "%s is not a string option", o->name);
  *(const char **)field(c, o) = v;
  return MML_OK;
}

mml_status mml_option_set_enum(mml_loader_cfg *c, const mml_option *o, const char *name,
                               mml_err *err) {
  if (o->flags & MML_OPT_PYTHON) return python_row(o, err);
  if (o->type != MML_OPT_ENUM)
    return mml_err_set(err, MML_ECONFIG, "%s is not a choice option", o->name);
  int n = count_choices(o);
  for (int i = 0; name && i < n; i++)
    if (!strcmp(o->choices[i], name)) return mml_option_set_int(c, o, i, err);
  char list[256];
  mml_option_choice_list(o, list, sizeof list);
  return mml_err_set(err, MML_ECONFIG, "%s must be one of (%s), got '%.200s'", o->name, list,
                     name ? name : "(null)");
}

void mml_option_choice_list(const mml_option *o, char *buf, size_t n) {
  size_t used = 0;
  if (n) buf[0] = 0;
  for (int i = 0; i < count_choices(o) && used < n; i++)
    used += (size_t)snprintf(buf + used, n - used, "%s'%s'", i ? ", " : "", o->choices[i]);
}

int64_t mml_option_get_int(const mml_loader_cfg *c, const mml_option *o) {
  if (o->flags & MML_OPT_PYTHON) return (int64_t)o->def;
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
  return o->type == MML_OPT_FLOAT && !(o->flags & MML_OPT_PYTHON) ? *(const double *)cfield(c, o)
                                                                  : 0.0;
}

const char *mml_option_get_str(const mml_loader_cfg *c, const mml_option *o) {
  return o->type == MML_OPT_STR && !(o->flags & MML_OPT_PYTHON) ? *(const char *const *)cfield(c, o)
                                                                : NULL;
}

const char *mml_option_enum_name(const mml_option *o, int64_t v) {
  return o->type == MML_OPT_ENUM && v >= 0 && v < count_choices(o) ? o->choices[v] : NULL;
}
