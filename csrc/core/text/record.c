/*
 * record.c — one JSONL line parsed into the neutral conversation of mml/record.h.
 *
 * Accepted shapes (see ../shared/SPEC-QWEN.md):
 *   LLaVA      {"image": str|[str], "conversations": [{"from": "human", "value": "<image>\n..."}]}
 *   messages   {"messages": [{"role": "user", "content": "<image>..."}], "images": [...]}
 *   HF parts   "content": [{"type": "image", "image"|"url"|"path"|"image_url": ...},
 *                          {"type": "text", "text": ...}]  ("value" for "text": LLaMA-Factory
 *              v1; its "loss_weight" is accepted only where it equals the labels' 1/0)
 * The three mix freely: "messages"/"conversations", "role"/"from", "content"/"value" and
 * "images"/"image" are synonyms.  Images are numbered in the order they appear in the
 * conversation: an `<image>` tag in any text, or an image part without a reference of its
 * own, takes the next entry of the record's top-level image list; an image part that names
 * its own reference uses that.  Every top-level image must be used exactly once
 * (MML_EMISMATCH otherwise).  Unknown top-level and per-message fields are ignored.
 *
 * Packs (mml_record_opts.packs: Qwen's data_packing): a line that is a list of record
 * objects is one record whose rec->subs mark where each object's messages begin; each
 * object is read exactly as a line of its own (its own image and video lists, matched in
 * its own messages), and images / videos are numbered across the pack in order.
 *
 * Memory: the record's arena keeps the cJSON tree (text parts point into its strings, so
 * text is never copied) and the message/part/image arrays, whose capacity is kept when a
 * record is parsed again, so a worker that reuses one mml_record allocates only cJSON's
 * nodes per line.
 *
 * Threads: reentrant.  cJSON 1.7 writes a process-wide "last error" variable when a parse
 * fails; nothing here reads it (the failure position comes from return_parse_end), so the
 * race is confined to a value nobody uses.
 */
#include "mml/record.h"

#include "mml/message.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#define IMAGE_TAG "<image>"
#define IMAGE_TAG_LEN 7
#define VIDEO_TAG "<video>"
#define VIDEO_TAG_LEN 7

typedef struct rec_arena {
  cJSON *root;
  mml_message *msgs;
  size_t msgs_cap;
  mml_part *parts;
  size_t parts_cap, nparts;
  const char **images;
  size_t images_cap;
  mml_image_budget *budgets;
  size_t budgets_cap;
  mml_video_ref *videos;
  size_t videos_cap;
  const char **frames; /* every frame list's references, one array (see fix_frames) */
  size_t nframes, frames_cap;
  int *msg_first_part; /* index into parts of each message's first part */
  size_t first_cap;
  char **owned; /* strings made while parsing (joined alpaca text, printed JSON) */
  size_t nowned, owned_cap;
  int *subs; /* a pack: each record's first message, then the total (nsubs + 1) */
  size_t subs_cap;
} rec_arena;

/* State of one parse. */
typedef struct parse_ctx {
  rec_arena *a;
  mml_record *rec;
  const cJSON *vlist; /* top-level video list (array, or a single entry), or NULL */
  const cJSON *vlist_at;
  int vlist_len, vlist_next;
  const char *const *implicit_videos; /* stand for vlist when the record has none */
  int nimplicit_videos;
  int media;                   /* images + frames so far (max_images bounds both) */
  const cJSON *list;           /* top-level image list (array or single string), or NULL */
  const cJSON *list_at;        /* its entry list_next (a cursor: parsing stays linear) */
  const char *const *implicit; /* stands for the list when the record has none */
  int nimplicit;
  int list_len, list_next;
  int max_images;
  int mbase; /* a pack: messages of the records before this one */
  mml_err *err;
} parse_ctx;

static mml_status grow(void **p, size_t *cap, size_t want, size_t elem);

/* A string the arena owns from now on (freed when the record is parsed again). */
static char *own(rec_arena *a, char *s) {
  if (!s) return NULL;
  if (a->nowned == a->owned_cap) {
    size_t nc = a->owned_cap ? a->owned_cap * 2 : 4;
    char **p = realloc(a->owned, nc * sizeof *p);
    if (!p) {
      free(s);
      return NULL;
    }
    a->owned = p;
    a->owned_cap = nc;
  }
  return a->owned[a->nowned++] = s;
}

static void free_owned(rec_arena *a) {
  for (size_t i = 0; i < a->nowned; i++) free(a->owned[i]);
  a->nowned = 0;
}

static mml_status grow(void **p, size_t *cap, size_t want, size_t elem) {
  if (want <= *cap) return MML_OK;
  size_t n = *cap ? *cap * 2 : 8;
  while (n < want) n *= 2;
  void *q = realloc(*p, n * elem);
  if (!q) return MML_ENOMEM;
  *p = q;
  *cap = n;
  return MML_OK;
}

/* Every top-level key read below (mml/record.h). */
const char *const mml_record_keys[] = {
    "messages", "conversations", "images",      "image",    "videos", "video",
    "system",   "tools",         "instruction", "input",    "output", "history",
    "audios",   "audio",         "chosen",      "rejected", NULL};

static const cJSON *get(const cJSON *obj, const char *k1, const char *k2) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, k1);
  if ((!v || cJSON_IsNull(v)) && k2) v = cJSON_GetObjectItemCaseSensitive(obj, k2);
  return v && !cJSON_IsNull(v) ? v : NULL;
}

/* Reads the qwen-vl-utils budget keys of an image entry (an object, or NULL) into *b;
 * keys it does not hold leave *b as it is. */
static mml_status read_budget(parse_ctx *c, const cJSON *entry, mml_image_budget *b) {
  static const char *const keys[] = {"min_pixels", "max_pixels", "resized_height", "resized_width"};
  if (!cJSON_IsObject(entry)) return MML_OK;
  for (int i = 0; i < 4; i++) {
    const cJSON *v = get(entry, keys[i], NULL);
    if (!v) continue;
    double d = cJSON_IsNumber(v) ? v->valuedouble : -1;
    if (!(d >= 1 && d <= 1e15 && d == (double)(int64_t)d))
      return mml_err_set(c->err, MML_ERECORD,
                         "bad record: image %d: \"%s\" must be a positive integer", c->rec->nimages,
                         keys[i]);
    int64_t x = (int64_t)d;
    if (i == 0)
      b->min_pixels = x;
    else if (i == 1)
      b->max_pixels = x;
    else if (x > (1 << 30))
      return mml_err_set(c->err, MML_ERECORD, "bad record: image %d: \"%s\" is too large",
                         c->rec->nimages, keys[i]);
    else if (i == 2)
      b->resized_height = x;
    else
      b->resized_width = x;
  }
  return MML_OK;
}

/* Appends an image reference; `entry` and then `part` (objects or NULL) may carry its
 * budget (the part's keys win). */
static mml_status add_image(parse_ctx *c, const char *ref, const cJSON *entry, const cJSON *part,
                            int *index) {
  rec_arena *a = c->a;
  if (!mml_utf8_valid(ref, strlen(ref)))
    return mml_err_set(c->err, MML_ERECORD, "bad record: image reference is not valid UTF-8");
  if (!*ref) return mml_err_set(c->err, MML_ERECORD, "bad record: empty image reference");
  if (c->media >= c->max_images)
    return mml_err_set(c->err, MML_ETOOMANYIMAGES,
                       "more than %d images in one sample, above max_images_per_sample=%d",
                       c->max_images, c->max_images);
  size_t want = (size_t)c->rec->nimages + 1;
  if (grow((void **)&a->images, &a->images_cap, want, sizeof *a->images) ||
      grow((void **)&a->budgets, &a->budgets_cap, want, sizeof *a->budgets))
    return mml_err_set(c->err, MML_ENOMEM, "record: out of memory");
  mml_image_budget *b = &a->budgets[c->rec->nimages];
  memset(b, 0, sizeof *b);
  mml_status st = read_budget(c, entry, b);
  if (!st) st = read_budget(c, part, b);
  if (st) return st;
  a->images[c->rec->nimages] = ref;
  c->media++;
  *index = c->rec->nimages++;
  return MML_OK;
}

/* The reference of the top-level list's entry i (a string, or an object with a path/url). */
static const char *list_ref(const cJSON *v) {
  if (cJSON_IsString(v)) return v->valuestring;
  if (cJSON_IsObject(v)) {
    static const char *const keys[] = {"path", "url", "image", "image_url"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
      const cJSON *r = cJSON_GetObjectItemCaseSensitive(v, keys[i]);
      if (cJSON_IsString(r)) return r->valuestring;
      if (cJSON_IsObject(r)) {
        r = cJSON_GetObjectItemCaseSensitive(r, "url");
        if (cJSON_IsString(r)) return r->valuestring;
      }
    }
  }
  return NULL;
}

static mml_status take_listed_image(parse_ctx *c, int msg, const cJSON *part, int *index) {
  if (c->list_next >= c->list_len)
    return mml_err_set(c->err, MML_EMISMATCH,
                       "image count mismatch: message %d refers to image %d but the record "
                       "lists %d",
                       msg, c->list_next + 1, c->list_len);
  const char *ref;
  const cJSON *v = NULL;
  if (!c->list) {
    ref = c->implicit[c->list_next];
  } else {
    v = c->list;
    if (cJSON_IsArray(c->list)) {
      v = c->list_at;
      c->list_at = v ? v->next : NULL;
    }
    ref = list_ref(v);
  }
  if (!ref)
    return mml_err_set(c->err, MML_ERECORD,
                       "bad record: image %d of the record's image list is not a string",
                       c->list_next);
  c->list_next++;
  return add_image(c, ref, v, part, index);
}

static mml_status push_part(parse_ctx *c, mml_part_kind kind, const char *text, size_t len,
                            int image) {
  rec_arena *a = c->a;
  if (kind == MML_PART_TEXT && len == 0) return MML_OK;
  if (grow((void **)&a->parts, &a->parts_cap, a->nparts + 1, sizeof *a->parts))
    return mml_err_set(c->err, MML_ENOMEM, "record: out of memory");
  a->parts[a->nparts++] = (mml_part){.kind = kind, .text = text, .len = len, .image = image};
  return MML_OK;
}

static mml_status take_listed_video(parse_ctx *c, int msg, const cJSON *part, int *index);

/* Text with `<image>` / `<video>` tags: tags become image / video parts taken from the
 * top-level lists, in order. */
static mml_status add_text(parse_ctx *c, int msg, const char *s) {
  size_t n = strlen(s);
  if (!mml_utf8_valid(s, n))
    return mml_err_set(c->err, MML_ERECORD, "bad record: message %d text is not valid UTF-8", msg);
  if (memmem(s, n, "<audio>", 7)) /* LLaMA-Factory's audio placeholder: never trained as text */
    return mml_err_set(c->err, MML_EAUDIO,
                       "audio record: message %d holds an <audio> tag (audio input is not "
                       "supported; the sample is skipped rather than trained as text)",
                       msg);
  const char *p = s, *end = s + n;
  const char *img = memmem(p, n, IMAGE_TAG, IMAGE_TAG_LEN);
  const char *vid = memmem(p, n, VIDEO_TAG, VIDEO_TAG_LEN);
  while (img || vid) {
    int is_video = !img || (vid && vid < img);
    const char *tag = is_video ? vid : img;
    mml_status st = push_part(c, MML_PART_TEXT, p, (size_t)(tag - p), 0);
    int idx = 0;
    if (!st)
      st = is_video ? take_listed_video(c, msg, NULL, &idx) : take_listed_image(c, msg, NULL, &idx);
    if (!st) st = push_part(c, is_video ? MML_PART_VIDEO : MML_PART_IMAGE, NULL, 0, idx);
    if (st) return st;
    p = tag + IMAGE_TAG_LEN; /* both tags are 7 bytes */
    if (is_video)
      vid = memmem(p, (size_t)(end - p), VIDEO_TAG, VIDEO_TAG_LEN);
    else
      img = memmem(p, (size_t)(end - p), IMAGE_TAG, IMAGE_TAG_LEN);
  }
  return push_part(c, MML_PART_TEXT, p, (size_t)(end - p), 0);
}

/* ---------------------------------------------------------------- videos */

/* Reads the qwen-vl-utils keys of a video element (an object, or NULL) into *k; keys it
 * does not hold leave *k as it is. */
static mml_status read_video_keys(parse_ctx *c, const cJSON *obj, mml_video_keys *k) {
  static const char *const ints[] = {"nframes",    "min_frames",     "max_frames",   "min_pixels",
                                     "max_pixels", "resized_height", "resized_width"};
  static const char *const reals[] = {"fps", "total_pixels", "sample_fps", "raw_fps"};
  if (!cJSON_IsObject(obj)) return MML_OK;
  int64_t *iv[] = {&k->nframes,    &k->min_frames,     &k->max_frames,   &k->min_pixels,
                   &k->max_pixels, &k->resized_height, &k->resized_width};
  double *rv[] = {&k->fps, &k->total_pixels, &k->sample_fps, &k->raw_fps};
  for (int i = 0; i < 7; i++) {
    const cJSON *v = get(obj, ints[i], NULL);
    if (!v) continue;
    double d = cJSON_IsNumber(v) ? v->valuedouble : -1;
    int64_t cap = i >= 5 ? (1 << 30) : (int64_t)1e15;
    if (!(d >= 1 && d <= (double)cap && d == (double)(int64_t)d))
      return mml_err_set(c->err, MML_ERECORD,
                         "bad record: video %d: \"%s\" must be a positive integer (at most %lld)",
                         c->rec->nvideos, ints[i], (long long)cap);
    *iv[i] = (int64_t)d;
  }
  for (int i = 0; i < 4; i++) {
    const cJSON *v = get(obj, reals[i], NULL);
    if (!v) continue;
    double d = cJSON_IsNumber(v) ? v->valuedouble : -1;
    if (!(d > 0 && d <= 1e15))
      return mml_err_set(c->err, MML_ERECORD,
                         "bad record: video %d: \"%s\" must be a positive number", c->rec->nvideos,
                         reals[i]);
    *rv[i] = d;
  }
  static const char *const times[] = {"video_start", "video_end"};
  for (int i = 0; i < 2; i++) {
    const cJSON *v = get(obj, times[i], NULL);
    if (!v) continue;
    if (!cJSON_IsNumber(v) || !(v->valuedouble > -1e15 && v->valuedouble < 1e15))
      return mml_err_set(c->err, MML_ERECORD,
                         "bad record: video %d: \"%s\" must be a number (seconds)", c->rec->nvideos,
                         times[i]);
    if (i == 0)
      k->video_start = v->valuedouble, k->has_start = 1;
    else
      k->video_end = v->valuedouble, k->has_end = 1;
  }
  return MML_OK;
}

/* The reference of a video element's value: a string (a file), or a list of strings (a
 * frame list, *list set); NULL with *list unset when it is neither. */
static const char *video_value(const cJSON *v, const cJSON **list) {
  *list = NULL;
  if (cJSON_IsObject(v)) v = get(v, "url", NULL); /* OpenAI style {"url": ...} */
  if (cJSON_IsString(v)) return v->valuestring;
  if (cJSON_IsArray(v)) *list = v;
  return NULL;
}

/* The video value of a top-level list entry: the entry itself, or an object's
 * "video"/"path"/"url"/"video_url" (then the object also carries keys). */
static const cJSON *entry_value(const cJSON *e) {
  if (!cJSON_IsObject(e)) return e;
  static const char *const keys[] = {"video", "path", "url", "video_url"};
  for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
    const cJSON *r = get(e, keys[i], NULL);
    if (r) return r;
  }
  return NULL;
}

/* Appends a video: a file `ref`, or the frame list `list`; `entry` then `part` (objects or
 * NULL) carry its keys (the part's win). */
static mml_status add_video(parse_ctx *c, const char *ref, const cJSON *list, const cJSON *entry,
                            const cJSON *part, int *index) {
  rec_arena *a = c->a;
  int v = c->rec->nvideos;
  if (grow((void **)&a->videos, &a->videos_cap, (size_t)v + 1, sizeof *a->videos))
    return mml_err_set(c->err, MML_ENOMEM, "record: out of memory");
  mml_video_ref *vr = &a->videos[v];
  memset(vr, 0, sizeof *vr);
  if (ref) {
    if (!*ref || !mml_utf8_valid(ref, strlen(ref)))
      return mml_err_set(c->err, MML_ERECORD,
                         "bad record: video %d reference is empty or not valid UTF-8", v);
    vr->ref = ref;
  } else {
    int n = cJSON_GetArraySize(list);
    if (n < 1)
      return mml_err_set(c->err, MML_ERECORD, "bad record: video %d is an empty frame list", v);
    if (n > c->max_images - c->media)
      return mml_err_set(c->err, MML_ETOOMANYIMAGES,
                         "more than %d images and frames in one sample, above "
                         "max_images_per_sample=%d",
                         c->max_images, c->max_images);
    if (grow((void **)&a->frames, &a->frames_cap, a->nframes + (size_t)n, sizeof *a->frames))
      return mml_err_set(c->err, MML_ENOMEM, "record: out of memory");
    /* frames point into a->frames by offset until the parse ends (it may move) */
    vr->frames = (const char **)(uintptr_t)a->nframes;
    int j = 0;
    for (const cJSON *f = list->child; f; f = f->next, j++) {
      const char *fr = cJSON_IsString(f) ? f->valuestring : NULL;
      if (!fr || !*fr || !mml_utf8_valid(fr, strlen(fr)))
        return mml_err_set(c->err, MML_ERECORD,
                           "bad record: video %d frame %d is not a non-empty string", v, j);
      a->frames[a->nframes++] = fr;
    }
    vr->nframes = n;
    c->media += n;
  }
  mml_status st = read_video_keys(c, entry, &vr->keys);
  if (!st) st = read_video_keys(c, part, &vr->keys);
  if (st) return st;
  if (vr->keys.fps > 0 && vr->keys.nframes > 0)
    return mml_err_set(c->err, MML_ERECORD,
                       "bad record: video %d gives both \"fps\" and \"nframes\" (qwen-vl-utils "
                       "accepts only one)",
                       v);
  *index = c->rec->nvideos++;
  return MML_OK;
}

static mml_status take_listed_video(parse_ctx *c, int msg, const cJSON *part, int *index) {
  if (c->vlist_next >= c->vlist_len)
    return mml_err_set(c->err, MML_EMISMATCH,
                       "video count mismatch: message %d refers to video %d but the record "
                       "lists %d",
                       msg, c->vlist_next + 1, c->vlist_len);
  const cJSON *e = c->vlist, *list = NULL;
  if (cJSON_IsArray(c->vlist)) {
    e = c->vlist_at;
    c->vlist_at = e ? e->next : NULL;
  }
  const char *ref =
      c->vlist ? video_value(entry_value(e), &list) : c->implicit_videos[c->vlist_next];
  if (!ref && !list)
    return mml_err_set(c->err, MML_ERECORD,
                       "bad record: video %d of the record's video list is neither a path nor "
                       "a list of frames",
                       c->vlist_next);
  c->vlist_next++;
  return add_video(c, ref, list, cJSON_IsObject(e) ? e : NULL, part, index);
}

static mml_status add_video_part(parse_ctx *c, int msg, int k, const cJSON *part) {
  const cJSON *v = get(part, "video", "video_url");
  const cJSON *list = NULL;
  const char *ref = v ? video_value(v, &list) : NULL;
  if (v && !ref && !list)
    return mml_err_set(c->err, MML_ERECORD,
                       "bad record: message %d video part %d: \"video\" is neither a path nor a "
                       "list of frames",
                       msg, k);
  int idx;
  mml_status st =
      v ? add_video(c, ref, list, NULL, part, &idx) : take_listed_video(c, msg, part, &idx);
  return st ? st : push_part(c, MML_PART_VIDEO, NULL, 0, idx);
}

static mml_status add_content_part(parse_ctx *c, int msg, int k, const cJSON *part) {
  if (!cJSON_IsObject(part))
    return mml_err_set(c->err, MML_ERECORD,
                       "bad record: message %d content part %d is not an object", msg, k);
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
  const char *t = cJSON_IsString(type) ? type->valuestring : NULL;
  if (type && !t && !cJSON_IsNull(type))
    return mml_err_set(c->err, MML_ERECORD,
                       "bad record: message %d content part %d has a non-string type", msg, k);
  if (!t) { /* untyped parts, as the HF templates accept them: by the keys present */
    if (get(part, "video", "video_url"))
      t = "video";
    else if (get(part, "image", "image_url"))
      t = "image";
    else if (get(part, "text", NULL))
      t = "text";
    else
      return mml_err_set(c->err, MML_ERECORD,
                         "bad record: message %d content part %d has no type, text or image", msg,
                         k);
  }
  if (!strcmp(t, "text")) { /* "value": LLaMA-Factory's newer (v1) layout */
    const cJSON *text = get(part, "text", "value");
    if (!cJSON_IsString(text))
      return mml_err_set(c->err, MML_ERECORD,
                         "bad record: message %d text part %d has no string \"text\" (or "
                         "\"value\")",
                         msg, k);
    return add_text(c, msg, text->valuestring);
  }
  if (!strcmp(t, "image") || !strcmp(t, "image_url")) {
    static const char *const keys[] = {"image", "url", "path", "image_url"};
    const char *ref = NULL;
    for (size_t i = 0; i < sizeof keys / sizeof *keys && !ref; i++) {
      const cJSON *r = get(part, keys[i], NULL);
      if (!r) continue;
      if (cJSON_IsObject(r)) r = get(r, "url", NULL); /* OpenAI style {"url": ...} */
      if (!cJSON_IsString(r))
        return mml_err_set(c->err, MML_ERECORD,
                           "bad record: message %d image part %d: \"%s\" is not a string", msg, k,
                           keys[i]);
      ref = r->valuestring;
    }
    int idx;
    mml_status st =
        ref ? add_image(c, ref, NULL, part, &idx) : take_listed_image(c, msg, part, &idx);
    return st ? st : push_part(c, MML_PART_IMAGE, NULL, 0, idx);
  }
  if (!strcmp(t, "video") || !strcmp(t, "video_url")) return add_video_part(c, msg, k, part);
  if (!strcmp(t, "audio") || !strcmp(t, "input_audio") || !strcmp(t, "audio_url"))
    return mml_err_set(c->err, MML_EAUDIO,
                       "audio record: message %d content part %d is audio (not supported)", msg, k);
  char shown[MML_SHORT_CAP(64)];
  return mml_err_set(c->err, MML_ERECORD,
                     "bad record: message %d content part %d has unsupported type \"%s\"", msg, k,
                     mml_text_short(t, strlen(t), 64, shown, sizeof shown));
}

static void set_role(mml_message *msg, const char *r) {
  if (!strcmp(r, "user") || !strcmp(r, "human"))
    msg->role = MML_ROLE_USER, msg->role_name = "user";
  else if (!strcmp(r, "assistant") || !strcmp(r, "gpt"))
    msg->role = MML_ROLE_ASSISTANT, msg->role_name = "assistant";
  else if (!strcmp(r, "system"))
    msg->role = MML_ROLE_SYSTEM, msg->role_name = "system";
  else if (!strcmp(r, "function_call"))
    msg->role = MML_ROLE_FUNCTION_CALL, msg->role_name = "function_call";
  else if (!strcmp(r, "observation"))
    msg->role = MML_ROLE_OBSERVATION, msg->role_name = "observation";
  else
    msg->role = MML_ROLE_OTHER, msg->role_name = r;
}

static mml_status add_message(parse_ctx *c, int i, const cJSON *m) {
  rec_arena *a = c->a;
  if (!cJSON_IsObject(m))
    return mml_err_set(c->err, MML_ERECORD, "bad record: message %d is not an object", i);
  const cJSON *role = get(m, "role", "from");
  if (!cJSON_IsString(role) || !role->valuestring[0])
    return mml_err_set(c->err, MML_ERECORD,
                       "bad record: message %d has no role (\"role\" or "
                       "\"from\")",
                       i);
  const char *r = role->valuestring;
  if (!mml_utf8_valid(r, strlen(r)))
    return mml_err_set(c->err, MML_ERECORD, "bad record: message %d role is not valid UTF-8", i);
  mml_message *msg = &a->msgs[c->mbase + i];
  set_role(msg, r);
  a->msg_first_part[c->mbase + i] = (int)a->nparts;
  /* LLaMA-Factory v1's per-message "loss_weight": only the weights the labels already give
   * (1 on assistant turns, 0 elsewhere) can be honoured; others would train on other data. */
  const cJSON *lw = cJSON_GetObjectItemCaseSensitive(m, "loss_weight");
  if (lw && !cJSON_IsNull(lw)) {
    const mml_role role = msg->role;
    const double want = role == MML_ROLE_ASSISTANT || role == MML_ROLE_FUNCTION_CALL ? 1.0 : 0.0;
    if (!cJSON_IsNumber(lw) || lw->valuedouble != want)
      return mml_err_set(c->err, MML_ERECORD,
                         "bad record: message %d (role \"%s\") has loss_weight other than %g "
                         "(only the label_mode's weights are supported)",
                         i, msg->role_name, want);
  }

  const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
  if (!content) content = cJSON_GetObjectItemCaseSensitive(m, "value");
  if (!content || cJSON_IsNull(content)) return MML_OK; /* empty message */
  if (cJSON_IsString(content)) {
    mml_status st = add_text(c, i, content->valuestring);
    if (!st && msg->role == MML_ROLE_FUNCTION_CALL &&
        (int)a->nparts > a->msg_first_part[c->mbase + i] + 1)
      st = mml_err_set(c->err, MML_ERECORD, "bad record: function_call message %d holds an image",
                       i);
    return st;
  }
  if (msg->role == MML_ROLE_FUNCTION_CALL)
    return mml_err_set(c->err, MML_ERECORD,
                       "bad record: function_call message %d content is not a string", i);
  if (cJSON_IsArray(content)) {
    int k = 0;
    for (const cJSON *p = content->child; p; p = p->next, k++) {
      mml_status st = add_content_part(c, i, k, p);
      if (st) return st;
    }
    return MML_OK;
  }
  return mml_err_set(c->err, MML_ERECORD,
                     "bad record: message %d content is neither a string nor a list", i);
}

/* A top-level value that names no media: absent, null, "" or []. */
static int no_media(const cJSON *v) {
  return !v || cJSON_IsNull(v) || (cJSON_IsString(v) && !v->valuestring[0]) ||
         (cJSON_IsArray(v) && !v->child);
}

/* The top-level "system" and "tools" of LLaMA-Factory's formats. */
static mml_status take_system_and_tools(parse_ctx *c, const cJSON *root) {
  mml_record *rec = c->rec;
  const cJSON *sys = get(root, "system", NULL);
  if (sys && !cJSON_IsString(sys))
    return mml_err_set(c->err, MML_ERECORD, "bad record: \"system\" is not a string");
  if (sys && sys->valuestring[0]) {
    if (!mml_utf8_valid(sys->valuestring, strlen(sys->valuestring)))
      return mml_err_set(c->err, MML_ERECORD, "bad record: \"system\" is not valid UTF-8");
    rec->system = sys->valuestring;
  }
  const cJSON *tools = get(root, "tools", NULL);
  if (!tools || (cJSON_IsString(tools) && !tools->valuestring[0]) ||
      (cJSON_IsArray(tools) && !tools->child))
    return MML_OK;
  const char *text;
  if (cJSON_IsString(tools))
    text = tools->valuestring; /* LLaMA-Factory: a JSON string */
  else if (cJSON_IsArray(tools))
    text = own(c->a, cJSON_PrintUnformatted(tools));
  else
    return mml_err_set(c->err, MML_ERECORD,
                       "bad record: \"tools\" is neither a JSON string nor a list");
  if (!text) return mml_err_set(c->err, MML_ENOMEM, "record: out of memory");
  rec->tools = text;
  return MML_OK;
}

static mml_status add_text_message(parse_ctx *c, int i, const char *role, const char *text) {
  set_role(&c->a->msgs[c->mbase + i], role);
  c->a->msg_first_part[c->mbase + i] = (int)c->a->nparts;
  return add_text(c, i, text);
}

/* LLaMA-Factory's alpaca layout: "history" pairs, then "instruction" + "\n" + "input" as
 * the user turn and "output" as the answer. */
static mml_status parse_alpaca(parse_ctx *c, const cJSON *root, int *n) {
  rec_arena *a = c->a;
  const cJSON *ins = get(root, "instruction", NULL), *in = get(root, "input", NULL),
              *out = get(root, "output", NULL), *hist = get(root, "history", NULL);
  if (!cJSON_IsString(ins) || (in && !cJSON_IsString(in)))
    return mml_err_set(c->err, MML_ERECORD,
                       "bad record: alpaca \"instruction\" / \"input\" are not strings");
  if (!cJSON_IsString(out))
    return mml_err_set(c->err, MML_ERECORD, "bad record: alpaca record has no \"output\" string");
  if (hist && !cJSON_IsArray(hist))
    return mml_err_set(c->err, MML_ERECORD, "bad record: alpaca \"history\" is not a list");
  int nh = hist ? cJSON_GetArraySize(hist) : 0;
  *n = 2 * nh + 2;
  if (grow((void **)&a->msgs, &a->msgs_cap, (size_t)(c->mbase + *n), sizeof *a->msgs) ||
      grow((void **)&a->msg_first_part, &a->first_cap, (size_t)(c->mbase + *n) + 1, sizeof(int)))
    return mml_err_set(c->err, MML_ENOMEM, "record: out of memory");
  int i = 0;
  for (const cJSON *h = hist ? hist->child : NULL; h; h = h->next) {
    const cJSON *q = cJSON_GetArrayItem(h, 0), *r = cJSON_GetArrayItem(h, 1);
    if (!cJSON_IsArray(h) || cJSON_GetArraySize(h) != 2 || !cJSON_IsString(q) || !cJSON_IsString(r))
      return mml_err_set(c->err, MML_ERECORD,
                         "bad record: alpaca history entry %d is not a [query, answer] pair",
                         i / 2);
    mml_status st = add_text_message(c, i, "user", q->valuestring);
    if (!st) st = add_text_message(c, i + 1, "assistant", r->valuestring);
    if (st) return st;
    i += 2;
  }
  const char *query = ins->valuestring;
  if (in && in->valuestring[0]) { /* "\n".join of the non-empty parts */
    size_t a1 = strlen(query), a2 = strlen(in->valuestring);
    char *j = own(a, malloc(a1 + a2 + 2));
    if (!j) return mml_err_set(c->err, MML_ENOMEM, "record: out of memory");
    memcpy(j, query, a1);
    j[a1] = a1 ? '\n' : 0;
    memcpy(j + a1 + (a1 ? 1 : 0), in->valuestring, a2 + 1);
    query = j;
  }
  mml_status st = add_text_message(c, i, "user", query);
  return st ? st : add_text_message(c, i + 1, "assistant", out->valuestring);
}

/* The record's video list: "videos" (a list of entries) or "video" (one entry, a frame
 * list being one entry too); without either, the implicit videos (WebDataset members). */
static mml_status take_videos(parse_ctx *c, const cJSON *root) {
  const cJSON *videos = get(root, "videos", NULL), *video = get(root, "video", NULL);
  if (no_media(videos)) videos = NULL;
  if (no_media(video)) video = NULL;
  if (videos && video)
    return mml_err_set(c->err, MML_ERECORD, "bad record: has both \"videos\" and \"video\"");
  c->vlist = videos ? videos : video;
  if (videos && cJSON_IsArray(videos)) {
    c->vlist_len = cJSON_GetArraySize(videos);
    c->vlist_at = videos->child;
  } else if (c->vlist) {
    c->vlist_len = 1;
  } else {
    c->vlist_len = c->nimplicit_videos;
  }
  return MML_OK;
}

/* The record's image list: "images" (a list, or one string / object) or "image"; without
 * either, the implicit images (WebDataset members). */
static mml_status take_images(parse_ctx *c, const cJSON *root) {
  const cJSON *images = get(root, "images", NULL), *image = get(root, "image", NULL);
  if (no_media(images)) images = NULL;
  if (no_media(image)) image = NULL;
  if (images && image)
    return mml_err_set(c->err, MML_ERECORD, "bad record: has both \"images\" and \"image\"");
  c->list = images ? images : image;
  if (c->list && cJSON_IsArray(c->list)) {
    c->list_len = cJSON_GetArraySize(c->list);
    c->list_at = c->list->child;
    if (c->list_len > c->max_images)
      return mml_err_set(c->err, MML_ETOOMANYIMAGES,
                         "%d images in one sample, above max_images_per_sample=%d", c->list_len,
                         c->max_images);
  } else if (c->list && (cJSON_IsString(c->list) || cJSON_IsObject(c->list)))
    c->list_len = 1;
  else if (c->list)
    return mml_err_set(c->err, MML_ERECORD, "bad record: \"%s\" is neither a string nor a list",
                       images ? "images" : "image");
  else
    c->list_len = c->nimplicit;
  return MML_OK;
}

/* After a record's messages: every listed image and video referred to. */
static mml_status check_media_used(parse_ctx *c) {
  if (c->vlist_next != c->vlist_len)
    return mml_err_set(c->err, MML_EMISMATCH,
                       "video count mismatch: the record lists %d video(s) but its messages "
                       "refer to %d",
                       c->vlist_len, c->vlist_next);
  if (c->list_next != c->list_len)
    return mml_err_set(c->err, MML_EMISMATCH,
                       "image count mismatch: the record lists %d image(s) but its messages "
                       "refer to %d",
                       c->list_len, c->list_next);
  return MML_OK;
}

/* After all n messages (a pack's too): the arena's parts, images and videos become the
 * record's. */
static void finish_record(parse_ctx *c, int n) {
  rec_arena *a = c->a;
  a->msg_first_part[n] = (int)a->nparts;
  for (int i = 0; i < n; i++) {
    a->msgs[i].parts = a->parts ? a->parts + a->msg_first_part[i] : NULL; /* none at all */
    a->msgs[i].nparts = a->msg_first_part[i + 1] - a->msg_first_part[i];
  }
  c->rec->messages = a->msgs;
  c->rec->nmessages = n;
  c->rec->images = a->images;
  c->rec->budgets = a->budgets;
  for (int v = 0; v < c->rec->nvideos; v++) /* frame offsets become pointers */
    if (!a->videos[v].ref) a->videos[v].frames = a->frames + (uintptr_t)a->videos[v].frames;
  c->rec->videos = a->videos;
}

/* Records that are not supervised fine-tuning data (LLaMA-Factory's refuses them too):
 * audio (a top-level "audios"/"audio" list) and preference pairs ("chosen"/"rejected"),
 * each with its own skip reason.  <audio> tags and audio parts: add_text and
 * add_content_part. */
static mml_status refuse_non_sft(parse_ctx *c, const cJSON *root) {
  if (!no_media(get(root, "audios", "audio")))
    return mml_err_set(c->err, MML_EAUDIO,
                       "audio record: it lists \"audios\" (audio input is not supported; the "
                       "sample is skipped rather than trained as text)");
  if (get(root, "chosen", "rejected"))
    return mml_err_set(c->err, MML_EPREFERENCE,
                       "preference record: it has \"chosen\"/\"rejected\" (a pair for DPO-style "
                       "training; supervised fine-tuning would train on the prompt alone)");
  return MML_OK;
}

/* One record object, its messages written from c->mbase on; *n: how many. */
static mml_status parse_object(parse_ctx *c, const cJSON *root, int *n_out) {
  rec_arena *a = c->a;
  if (!cJSON_IsObject(root))
    return mml_err_set(c->err, MML_ERECORD, "bad record: the line is not a JSON object");
  mml_status st = refuse_non_sft(c, root);
  if (st) return st;
  st = take_videos(c, root);
  if (st) return st;
  const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
  const cJSON *conv = cJSON_GetObjectItemCaseSensitive(root, "conversations");
  if (msgs && conv)
    return mml_err_set(c->err, MML_ERECORD,
                       "bad record: has both \"messages\" and \"conversations\"");
  if (!msgs) msgs = conv;
  int alpaca = !msgs && get(root, "instruction", NULL);
  if (!msgs && !alpaca)
    return mml_err_set(c->err, MML_ERECORD,
                       "bad record: no \"messages\", \"conversations\" or \"instruction\"");
  if (msgs && !cJSON_IsArray(msgs))
    return mml_err_set(c->err, MML_ERECORD, "bad record: the conversation is not a list");
  int n = msgs ? cJSON_GetArraySize(msgs) : 0;
  if (msgs && n == 0) return mml_err_set(c->err, MML_ERECORD, "bad record: empty conversation");
  if ((st = take_images(c, root)) || (st = take_system_and_tools(c, root))) return st;

  if (alpaca) {
    if ((st = parse_alpaca(c, root, &n))) return st;
  } else {
    if (grow((void **)&a->msgs, &a->msgs_cap, (size_t)(c->mbase + n), sizeof *a->msgs) ||
        grow((void **)&a->msg_first_part, &a->first_cap, (size_t)(c->mbase + n) + 1, sizeof(int)))
      return mml_err_set(c->err, MML_ENOMEM, "record: out of memory");
    int i = 0;
    for (const cJSON *m = msgs->child; m; m = m->next, i++)
      if ((st = add_message(c, i, m))) return st;
  }
  *n_out = n;
  return check_media_used(c);
}

/* A pack (mml_record_opts.packs): a list of record objects, parsed in order into one
 * record whose rec->subs mark where each begins.  Each keeps its own image and video
 * lists; images and videos are numbered across the pack in order. */
static mml_status parse_pack(parse_ctx *c, const cJSON *root) {
  rec_arena *a = c->a;
  int nsubs = cJSON_GetArraySize(root), total = 0, k = 0;
  if (nsubs == 0) return mml_err_set(c->err, MML_ERECORD, "bad record: an empty pack (list)");
  if (grow((void **)&a->subs, &a->subs_cap, (size_t)nsubs + 1, sizeof(int)))
    return mml_err_set(c->err, MML_ENOMEM, "record: out of memory");
  for (const cJSON *r = root->child; r; r = r->next, k++) {
    /* each record's own image / video lists and cursors (no member files: those name one
     * record's media); the media count goes on across the pack */
    parse_ctx one = {
        .a = a, .rec = c->rec, .err = c->err, .max_images = c->max_images, .media = c->media};
    one.mbase = a->subs[k] = total;
    int n = 0;
    mml_status st = parse_object(&one, r, &n);
    if (st) {
      mml_err_prefix(c->err, "record %d of the pack", k);
      return st;
    }
    c->media = one.media;
    total += n;
  }
  a->subs[nsubs] = total;
  c->rec->subs = a->subs;
  c->rec->nsubs = nsubs;
  finish_record(c, total);
  return MML_OK;
}

static mml_status parse_root(parse_ctx *c, const cJSON *root, int packs) {
  if (cJSON_IsArray(root)) {
    if (packs) return parse_pack(c, root);
    return mml_err_set(c->err, MML_ERECORD,
                       "bad record: the line is a list, not a JSON object (a list of records "
                       "is a pack: data_packing=True reads it as one)");
  }
  int n = 0;
  mml_status st = parse_object(c, root, &n);
  if (!st) finish_record(c, n);
  return st;
}

/* One linear pass over the raw JSON before cJSON sees it: the nesting depth (cJSON
 * recurses per level) and "\u0000" escapes (cJSON's strings are NUL-terminated, so text
 * after one would silently vanish, image tags included). */
static mml_status prescan(const char *s, size_t n, int max_depth, mml_err *err) {
  int depth = 0, in_str = 0;
  for (size_t i = 0; i < n; i++) {
    char ch = s[i];
    if (in_str) {
      if (ch == '"')
        in_str = 0;
      else if (ch == '\\' && i + 1 < n) {
        if (s[i + 1] == 'u' && i + 5 < n && !memcmp(s + i + 2, "0000", 4))
          return mml_err_set(err, MML_ERECORD,
                             "bad record: a string holds \"\\u0000\" (U+0000) at byte %zu, "
                             "which mmloader does not accept in text",
                             i);
        i++;
      }
    } else if (ch == '"') {
      in_str = 1;
    } else if (ch == '{' || ch == '[') {
      if (++depth > max_depth)
        return mml_err_set(err, MML_ERECORD,
                           "bad record: JSON nested deeper than max_json_depth=%d (at byte %zu)",
                           max_depth, i);
    } else if (ch == '}' || ch == ']') {
      depth--;
    }
  }
  return MML_OK;
}

mml_status mml_record_parse(const char *line, size_t len, mml_record *rec, mml_err *err) {
  return mml_record_parse_opts(line, len, NULL, rec, err);
}

mml_status mml_record_parse_ex(const char *line, size_t len, const char *const *implicit, int n,
                               mml_record *rec, mml_err *err) {
  mml_record_opts o = {.implicit = implicit, .nimplicit = n};
  return mml_record_parse_opts(line, len, &o, rec, err);
}

mml_status mml_record_parse_opts(const char *line, size_t len, const mml_record_opts *opts,
                                 mml_record *rec, mml_err *err) {
  const char *const *implicit = opts ? opts->implicit : NULL;
  int n = opts ? opts->nimplicit : 0;
  if (!rec || (!line && len)) return mml_err_set(err, MML_EINVAL, "record: NULL argument");
  int max_depth =
      opts && opts->max_json_depth > 0 ? opts->max_json_depth : MML_DEFAULT_MAX_JSON_DEPTH;
  int max_images =
      opts && opts->max_images > 0 ? opts->max_images : MML_DEFAULT_MAX_IMAGES_PER_SAMPLE;
  rec_arena *a = rec->arena;
  int fresh = 0;
  if (!a) {
    if (!(a = calloc(1, sizeof *a))) return mml_err_set(err, MML_ENOMEM, "record: out of memory");
    fresh = 1;
  }
  cJSON_Delete(a->root);
  a->root = NULL;
  a->nparts = 0;
  a->nframes = 0;
  free_owned(a);
  *rec = (mml_record){.arena = a};

  /* Trailing whitespace (the line's newline, "\r\n") is fine; anything else after the
   * object is not. */
  const char *end = NULL;
  mml_status st;
  if ((st = prescan(line ? line : "", len, max_depth, err))) goto fail;
  a->root = cJSON_ParseWithLengthOpts(line ? line : "", len, &end, 0);
  if (!a->root) {
    size_t at = end && end >= line ? (size_t)(end - line) : 0;
    st = mml_err_set(err, MML_ERECORD, "bad record: invalid JSON at byte %zu of %zu", at, len);
    goto fail;
  }
  for (const char *p = end; p && p < line + len; p++) {
    if (*p != ' ' && *p != '\t' && *p != '\r' && *p != '\n' && *p != 0) {
      st = mml_err_set(err, MML_ERECORD, "bad record: trailing data at byte %zu",
                       (size_t)(p - line));
      goto fail;
    }
  }
  parse_ctx c = {.a = a,
                 .rec = rec,
                 .err = err,
                 .implicit = implicit,
                 .nimplicit = implicit ? n : 0,
                 .implicit_videos = opts ? opts->implicit_videos : NULL,
                 .nimplicit_videos = opts && opts->implicit_videos ? opts->nimplicit_videos : 0,
                 .max_images = max_images};
  if ((st = parse_root(&c, a->root, opts && opts->packs))) goto fail;
  return MML_OK;

fail:
  cJSON_Delete(a->root);
  a->root = NULL;
  *rec = (mml_record){.arena = a};
  if (fresh) mml_record_free(rec);
  return st;
}

void mml_record_free(mml_record *rec) {
  if (!rec) return;
  rec_arena *a = rec->arena;
  if (a) {
    cJSON_Delete(a->root);
    free(a->msgs);
    free(a->parts);
    free(a->images);
    free(a->budgets);
    free(a->videos);
    free(a->frames);
    free(a->msg_first_part);
    free(a->subs);
    free_owned(a);
    free(a->owned);
    free(a);
  }
  *rec = (mml_record){0};
}

mml_record mml_record_sub(const mml_record *rec, int k) {
  mml_record v = *rec;
  if (rec->nsubs) {
    v.messages = rec->messages + rec->subs[k];
    v.nmessages = rec->subs[k + 1] - rec->subs[k];
  }
  v.subs = NULL;
  v.nsubs = 0;
  v.arena = NULL;
  return v;
}

int mml_record_frames(const mml_record *rec) {
  int n = 0;
  for (int v = 0; v < rec->nvideos; v++) n += rec->videos[v].ref ? 0 : rec->videos[v].nframes;
  return n;
}

const char *mml_record_media_ref(const mml_record *rec, int i) {
  if (i < rec->nimages) return rec->images[i];
  i -= rec->nimages;
  for (int v = 0; v < rec->nvideos; v++) {
    const mml_video_ref *vr = &rec->videos[v];
    if (vr->ref) continue;
    if (i < vr->nframes) return vr->frames[i];
    i -= vr->nframes;
  }
  return NULL;
}
