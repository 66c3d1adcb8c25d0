/*
 * mml/record.h — one JSONL line (LLaVA conversations, messages + images, HF content
 * parts, LLaMA-Factory sharegpt / alpaca; see ../shared/SPEC-QWEN.md) parsed into a neutral conversation: messages made of
 * text and image parts, and the list of image references in the order they appear.
 * `<image>` tags in text become image parts matched to the listed images in order; a
 * count mismatch is MML_EMISMATCH, anything else malformed is MML_ERECORD.
 *
 * Details:
 *   - "messages"/"conversations", "role"/"from", "content"/"value", "images"/"image" are
 *     synonyms; other fields are ignored.  Roles human/user -> MML_ROLE_USER ("user"),
 *     gpt/assistant -> MML_ROLE_ASSISTANT ("assistant"), system, LLaMA-Factory's
 *     function_call (content: the call's JSON text, no images) and observation; anything
 *     else is MML_ROLE_OTHER with its own name (e.g. "tool").
 *   - LLaMA-Factory sharegpt fields: a top-level "system" string and "tools" (a JSON
 *     string, or a list) are kept as rec->system / rec->tools for the template.  Alpaca
 *     layout (no conversation, an "instruction"): "history" [[query, answer], ...] pairs,
 *     then "instruction" + "\n" + "input" (the non-empty ones) as the user turn and
 *     "output" as the assistant turn.
 *   - "image"/"images" that are absent, null, "" or [] mean no image.
 *   - Videos (rec->videos, MML_PART_VIDEO parts) come the same way: a top-level
 *     "videos" list (or one "video" entry), taken in order by `<video>` tags or by video
 *     parts without their own reference; a video part {"type": "video", "video": ...}
 *     (untyped: by its "video" key; "video_url" too).  A video value is a file reference
 *     (string, or {"url": s}) or a frame list (a list of image references).  A list entry
 *     may be an object with "video"/"path"/"url"/"video_url" and the element keys of
 *     mml_video_keys; a part's own keys win over its entry's.  Every listed video must
 *     be used exactly once (MML_EMISMATCH).  Frames count towards max_images.
 *   - content is a string, a list of parts, or null/absent (empty message).  Parts:
 *     {"type": "text", "text": s}; {"type": "image"|"image_url", "image"|"url"|"path"|
 *     "image_url": s | {"url": s}}; untyped parts are typed by their keys.  Other part
 *     types (audio, ...) are MML_ERECORD.
 *   - rec->images is in order of appearance.  An `<image>` tag (in any text, string or
 *     part) or an image part without its own reference takes the next entry of the
 *     top-level image list (a string, a list of strings, or objects with "path"/"url");
 *     every listed image must be used exactly once.
 *   - Text must be valid UTF-8; an empty conversation, a non-object line, trailing data
 *     after the object, or invalid JSON is MML_ERECORD.  err->msg names the message and
 *     reason; the caller adds shard and line.
 *   - Text parts point into the arena (no copies); empty text pieces are omitted, so
 *     "<image>" alone yields a single image part.
 *
 * Threads: a record is owned by one thread; parsing is reentrant.
 */
#ifndef MML_RECORD_H
#define MML_RECORD_H

#include "mml/common.h"

typedef enum {
  MML_ROLE_SYSTEM = 0,
  MML_ROLE_USER,
  MML_ROLE_ASSISTANT,
  MML_ROLE_OTHER,
  MML_ROLE_FUNCTION_CALL, /* LLaMA-Factory "function_call": the assistant's tool call (JSON) */
  MML_ROLE_OBSERVATION,   /* LLaMA-Factory "observation": a tool's result */
} mml_role;
typedef enum { MML_PART_TEXT = 0, MML_PART_IMAGE, MML_PART_VIDEO } mml_part_kind;

typedef struct mml_part {
  mml_part_kind kind;
  const char *text; /* MML_PART_TEXT: UTF-8, not NUL-terminated */
  size_t len;
  int image; /* MML_PART_IMAGE: index into mml_record.images;
         MML_PART_VIDEO: index into mml_record.videos */
} mml_part;

typedef struct mml_message {
  mml_role role;
  const char *role_name; /* "system", "user", "assistant", or the record's own role */
  mml_part *parts;
  int nparts;
} mml_message;

/* A per-image pixel budget, as qwen-vl-utils reads it from an image entry (an image
 * content part, or an object in the top-level image list): 0 where the key is absent. */
typedef struct mml_image_budget {
  int64_t min_pixels, max_pixels;
  int64_t resized_height, resized_width;
} mml_image_budget;

/* The keys qwen-vl-utils 0.0.14 reads from a video element (a video content part, or an
 * object in the top-level video list), 0 where absent (has_start / has_end tell whether
 * video_start / video_end were given, since 0.0 is a valid time).  fps and nframes are
 * mutually exclusive (qwen-vl-utils asserts; here a bad record).  Integers must be
 * positive; fps, sample_fps, raw_fps and total_pixels positive numbers; video_start /
 * video_end numbers (seconds; qwen-vl-utils clamps them to the video). */
typedef struct mml_video_keys {
  double fps;                     /* frames per second to sample (default 2.0) */
  int64_t nframes;                /* frames to sample (rounded to an even count) */
  int64_t min_frames, max_frames; /* bounds of the fps rule (defaults 4 and 768) */
  double video_start, video_end;  /* seconds */
  int has_start, has_end;
  int64_t min_pixels, max_pixels; /* per-frame pixel budget */
  double total_pixels;            /* the whole video's pixel budget */
  int64_t resized_height, resized_width;
  double sample_fps, raw_fps; /* frame lists: the frames' rate, the source's rate */
} mml_video_keys;

/* One video of a record: a file (ref) or a frame list (frames, nframes image references in
 * order, as qwen-vl-utils accepts a list of images for "video"). */
typedef struct mml_video_ref {
  const char *ref;     /* the video file (path, URL, s3://); NULL for a frame list */
  const char **frames; /* frame list: nframes references */
  int nframes;
  mml_video_keys keys;
} mml_video_ref;

typedef struct mml_record {
  mml_message *messages;
  int nmessages;
  const char **images;       /* references as written in the record (path, URL, s3://) */
  mml_image_budget *budgets; /* nimages entries: "min_pixels", "max_pixels",
                                "resized_height", "resized_width" (positive integers; an
                                image part's keys win over its list entry's) */
  int nimages;
  mml_video_ref *videos; /* nvideos, in order of appearance */
  int nvideos;
  const char *system; /* top-level "system" (LLaMA-Factory), NULL when absent or empty */
  const char *tools;  /* top-level "tools" as JSON text, NULL when absent or empty */
  /* A pack (mml_record_opts.packs; Qwen's data_packing): nsubs records, record k's
   * messages [subs[k], subs[k + 1]); its images and videos are those its parts name, in
   * order (indices run across the pack).  nsubs 0 and subs NULL: one plain record. */
  const int *subs;
  int nsubs;
  void *arena; /* owns every string and array above */
} mml_record;

/* A view of record k of a pack (k = 0 of a plain record: the record itself): its
 * messages; images, videos and their indices those of the whole pack.  Owns nothing. */
mml_record mml_record_sub(const mml_record *rec, int k);
/* Records in rec: nsubs of a pack, else 1. */
static inline int mml_record_count(const mml_record *rec) { return rec->nsubs ? rec->nsubs : 1; }

/* Parses one line (len bytes, need not be NUL-terminated).  rec must be zero-initialised
 * or previously used; parsing again into the same rec reuses its capacity.  On failure rec
 * holds an empty record (nmessages = 0).  mml_record_free releases everything and is
 * always safe to call. */
mml_status mml_record_parse(const char *line, size_t len, mml_record *rec, mml_err *err);
/* As mml_record_parse; when the record lists no images, `implicit` (n references, which
 * must outlive rec) stands for its image list (a WebDataset sample's image members). */
mml_status mml_record_parse_ex(const char *line, size_t len, const char *const *implicit, int n,
                               mml_record *rec, mml_err *err);

/* The top-level keys a record's parse reads, NULL-terminated: a reader of a columnar
 * shard (Parquet) reads these columns only. */
extern const char *const mml_record_keys[];

/* Limits of one parse (0: the default).  A line nested deeper than max_json_depth, or
 * holding a "\u0000" escape (text is NUL-terminated), is MML_ERECORD, checked in one pass
 * before any JSON tree is built; more than max_images images is MML_ETOOMANYIMAGES, found
 * as soon as the image list or the count of image parts passes it.  Parsing is linear in
 * the line's length. */
#define MML_DEFAULT_MAX_JSON_DEPTH 64
#define MML_DEFAULT_MAX_IMAGES_PER_SAMPLE 256
typedef struct mml_record_opts {
  int max_json_depth;
  int max_images;
  const char *const *implicit; /* as in mml_record_parse_ex (NULL: none) */
  int nimplicit;
  /* likewise for a record without "videos" / "video": its video list (a WebDataset
   * sample's video members: `<video>` tags and {"type": "video"} parts take them) */
  const char *const *implicit_videos;
  int nimplicit_videos;
  /* 1: a line that is a JSON list is a pack of records (Qwen's data_packing: each entry
   * of its packed annotation files is a list of records), parsed into one record with
   * rec->subs; each object's layout, image and video lists as a record's (the member
   * files above are not used); an empty list or an entry that is not an object is
   * MML_ERECORD naming the entry; max_images bounds the whole pack.  0: a list is
   * MML_ERECORD. */
  int packs;
} mml_record_opts;
mml_status mml_record_parse_opts(const char *line, size_t len, const mml_record_opts *opts,
                                 mml_record *rec, mml_err *err);
void mml_record_free(mml_record *rec);

/* Frames of all frame-list videos of rec (the loader reads them after the images). */
int mml_record_frames(const mml_record *rec);
/* The reference of media item i: images[i] for i < nimages, then the frames of the
 * frame-list videos in order (i < nimages + mml_record_frames(rec)). */
const char *mml_record_media_ref(const mml_record *rec, int i);

#endif
