/* test-template.c — chat template rendering, encoding and labels.
 *
 * Rendering is checked against literal expected text.  Encoding is checked against the
 * tokenizer applied to the whole rendered text (the definition of parity), with the real
 * Qwen tokenizer (../../../shared/data/qwen3-tokenizer, skipped when absent) and the
 * project's tiny tokenizer; labels by decoding the supervised tokens.  Many threads encode
 * with one shared template under TSan. */
#include <pthread.h>
#include <unistd.h>

#include "mml/record.h"
#include "mml/template.h"
#include "mml_test.h"

/* shared/ beside the repository (CI), or beside the folder of worktrees. */
static const char *k_qwen_paths[] = {"../../../shared/data/qwen3-tokenizer/tokenizer.json",
                                     "../../../../shared/data/qwen3-tokenizer/tokenizer.json"};

static mml_tokenizer *load_tok(int which) {
  const char *p = getenv(which == 0 ? "MML_QWEN_TOKENIZER" : "MML_TINY_TOKENIZER");
  if (!p && which == 0) p = access(k_qwen_paths[0], R_OK) ? k_qwen_paths[1] : k_qwen_paths[0];
  if (!p) p = "../../mmloader/data/tiny-tokenizer.json";
  if (access(p, R_OK)) {
    fprintf(stderr, "  skip: %s not found\n", p);
    return NULL;
  }
  mml_tokenizer *t = NULL;
  mml_err e = {0};
  if (mml_tokenizer_load(p, &t, &e)) {
    fprintf(stderr, "  cannot load %s: %s\n", p, e.msg);
    mml_test_failures++;
    return NULL;
  }
  return t;
}

static const char *render(mml_template_style style, const char *line, const int64_t *n) {
  static char buf[8192];
  mml_record r = {0};
  mml_template *t = NULL;
  mml_bytes out = {0};
  mml_err e = {0};
  buf[0] = 0;
  if (mml_record_parse(line, strlen(line), &r, &e) ||
      mml_template_new(style, MML_LABELS_ALL_ASSISTANT, NULL, &t, &e) ||
      mml_template_render(t, &r, n, &out, &e))
    snprintf(buf, sizeof buf, "ERROR %s", e.msg);
  else
    snprintf(buf, sizeof buf, "%.*s", (int)out.len, (const char *)out.data);
  mml_bytes_free(&out);
  mml_template_free(t);
  mml_record_free(&r);
  return buf;
}

static const char k_llava[] =
    "{\"image\": \"a.jpg\", \"conversations\": [{\"from\": \"human\", \"value\": "
    "\"<image>\\nWhat?\"},"
    "{\"from\": \"gpt\", \"value\": \"A cat.\"}, {\"from\": \"human\", \"value\": \"More\"},"
    "{\"from\": \"gpt\", \"value\": \"\\n\\nTabby.\"}]}";

TEST(render_qwen2_and_qwen3) {
  int64_t n[] = {2};
  CHECK_EQ_STR(render(MML_TEMPLATE_QWEN2_VL, k_llava, n),
               "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
               "<|im_start|>user\n<|vision_start|><|image_pad|><|image_pad|><|vision_end|>\nWhat?<|"
               "im_end|>\n"
               "<|im_start|>assistant\nA cat.<|im_end|>\n"
               "<|im_start|>user\nMore<|im_end|>\n"
               "<|im_start|>assistant\n\n\nTabby.<|im_end|>\n");
  CHECK_EQ_STR(render(MML_TEMPLATE_QWEN3_VL, k_llava, n),
               "<|im_start|>user\n<|vision_start|><|image_pad|><|image_pad|><|vision_end|>\nWhat?<|"
               "im_end|>\n"
               "<|im_start|>assistant\nA cat.<|im_end|>\n"
               "<|im_start|>user\nMore<|im_end|>\n"
               "<|im_start|>assistant\n\n\nTabby.<|im_end|>\n");
  const char *sys =
      "{\"messages\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", "
      "\"content\": \"u\"},"
      "{\"role\": \"system\", \"content\": \"late\"}, {\"role\": \"tool\", \"content\": \"t1\"},"
      "{\"role\": \"tool\", \"content\": \"t2\"}, {\"role\": \"critic\", \"content\": \"c\"}]}";
  CHECK_EQ_STR(render(MML_TEMPLATE_QWEN2_VL, sys, NULL),
               "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nu<|im_end|>\n"
               "<|im_start|>system\nlate<|im_end|>\n<|im_start|>tool\nt1<|im_end|>\n"
               "<|im_start|>tool\nt2<|im_end|>\n<|im_start|>critic\nc<|im_end|>\n");
  CHECK_EQ_STR(render(MML_TEMPLATE_QWEN3_VL, sys, NULL),
               "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nu<|im_end|>\n"
               "<|im_start|>user\n<tool_response>\nt1\n</tool_response>\n<tool_response>\nt2\n"
               "</tool_response><|im_end|>\n");
}

TEST(render_errors_leave_output) {
  mml_record r = {0};
  mml_template *t = NULL;
  mml_bytes out = {0};
  mml_err e = {0};
  const char *line =
      "{\"images\": [\"a\", \"b\"], \"messages\": [{\"role\": \"user\", \"content\": "
      "\"<image>x<image>\"}]}";
  CHECK_OK(mml_record_parse(line, strlen(line), &r, &e), e);
  CHECK_OK(mml_template_new(MML_TEMPLATE_QWEN2_VL, MML_LABELS_ALL_ASSISTANT, NULL, &t, &e), e);
  mml_bytes_append(&out, "keep", 4);
  int64_t bad[] = {3, 0};
  CHECK_EQ_INT(mml_template_render(t, &r, bad, &out, &e), MML_EINVAL);
  CHECK_EQ_INT(mml_template_render(t, &r, NULL, &out, &e), MML_EINVAL);
  CHECK_EQ_INT(out.len, 4);
  mml_ids ids = {0}, labels = {0};
  CHECK_EQ_INT(mml_template_encode(t, NULL, &r, bad, &ids, &labels, &e),
               MML_EINVAL); /* render-only */
  mml_template_free(t);
  CHECK_EQ_INT(mml_template_new((mml_template_style)7, MML_LABELS_ALL_ASSISTANT, NULL, &t, &e),
               MML_ECONFIG);
  CHECK(t == NULL);
  CHECK_EQ_INT(mml_template_new(MML_TEMPLATE_QWEN3_VL, (mml_label_mode)9, NULL, &t, &e),
               MML_ECONFIG);
  mml_bytes_free(&out);
  mml_record_free(&r);
}

/* ---- encoding (needs a tokenizer) ---- */

/* Encodes `line` and checks ids == tokenizer(rendered text).  Returns the decoded text of
 * the supervised tokens, with "|" between maximal runs, in `sup` (caller's buffer). */
static int encode_check(const mml_tokenizer *tok, mml_template_style style, mml_label_mode mode,
                        const char *line, const int64_t *n, char *sup, size_t supcap) {
  mml_record r = {0};
  mml_template *t = NULL, *rt = NULL;
  mml_ids ids = {0}, labels = {0}, want = {0};
  mml_bytes text = {0}, dec = {0};
  mml_err e = {0};
  int ok = 0;
  sup[0] = 0;
  if (mml_record_parse(line, strlen(line), &r, &e) || mml_template_new(style, mode, tok, &t, &e) ||
      mml_template_new(style, mode, NULL, &rt, &e) ||
      mml_template_encode(t, NULL, &r, n, &ids, &labels, &e) ||
      mml_template_render(rt, &r, n, &text, &e) ||
      mml_tokenizer_encode(tok, NULL, (const char *)text.data, text.len, &want, &e)) {
    fprintf(stderr, "  error: %s\n", e.msg);
    goto done;
  }
  if (ids.len != labels.len || ids.len != want.len) {
    fprintf(stderr, "  lengths: ids %zu labels %zu whole-string %zu\n", ids.len, labels.len,
            want.len);
    goto done;
  }
  for (size_t i = 0; i < ids.len; i++) {
    if (ids.data[i] != want.data[i]) {
      fprintf(stderr, "  token %zu: %d != whole-string %d\n", i, ids.data[i], want.data[i]);
      goto done;
    }
    if (labels.data[i] != MML_IGNORE_INDEX && labels.data[i] != ids.data[i]) goto done;
  }
  size_t used = 0;
  for (size_t i = 0; i < ids.len; i++) {
    if (labels.data[i] == MML_IGNORE_INDEX) continue;
    size_t j = i;
    while (j < ids.len && labels.data[j] != MML_IGNORE_INDEX) j++;
    mml_bytes_clear(&dec);
    if (mml_tokenizer_decode(tok, ids.data + i, j - i, &dec, &e)) goto done;
    used += (size_t)snprintf(sup + used, supcap - used, "%s%.*s", used ? "|" : "", (int)dec.len,
                             (const char *)dec.data);
    if (used >= supcap) goto done;
    i = j;
  }
  ok = 1;
done:
  mml_ids_free(&ids);
  mml_ids_free(&labels);
  mml_ids_free(&want);
  mml_bytes_free(&text);
  mml_bytes_free(&dec);
  mml_template_free(t);
  mml_template_free(rt);
  mml_record_free(&r);
  return ok;
}

/* A run that starts the content with a newline may also carry the header's "\n" when the
 * tokenizer merges them into one token (the straddling token is labelled). */
#define CHECK_SUP(got, plain, straddled)                                                      \
  do {                                                                                        \
    if (strcmp(got, plain) && strcmp(got, straddled)) FAIL_AT("supervised text \"%s\"", got); \
  } while (0)

static void encode_and_labels_with(int which) {
  mml_tokenizer *tok = load_tok(which);
  if (!tok) return;
  char sup[4096];
  int64_t n[] = {5};
  CHECK(encode_check(tok, MML_TEMPLATE_QWEN2_VL, MML_LABELS_ALL_ASSISTANT, k_llava, n, sup,
                     sizeof sup));
  CHECK_SUP(sup, "A cat.<|im_end|>\n|\n\nTabby.<|im_end|>\n",
            "A cat.<|im_end|>\n|\n\n\nTabby.<|im_end|>\n");
  CHECK(encode_check(tok, MML_TEMPLATE_QWEN3_VL, MML_LABELS_LAST_ASSISTANT, k_llava, n, sup,
                     sizeof sup));
  CHECK_SUP(sup, "\n\nTabby.<|im_end|>\n", "\n\n\nTabby.<|im_end|>\n");
  CHECK(encode_check(tok, MML_TEMPLATE_QWEN2_VL, MML_LABELS_NO_NONFINAL_END, k_llava, n, sup,
                     sizeof sup));
  CHECK_SUP(sup, "A cat.|\n\nTabby.<|im_end|>\n", "A cat.|\n\n\nTabby.<|im_end|>\n");

  /* Image in the assistant turn: its tokens stay -100; non-ASCII text; NFC-changing text. */
  const char *mixed =
      "{\"images\": [\"a\", \"b\"], \"messages\": [{\"role\": \"user\", \"content\": \"cafe\\u0301 "
      "\\u4f60\\u597d <image>\"},"
      "{\"role\": \"assistant\", \"content\": \"Voil\\u00e0 <image> \\ud83d\\ude00 "
      "e\\u0301t\\u00e9\"}]}";
  int64_t n2[] = {3, 4};
  CHECK(encode_check(tok, MML_TEMPLATE_QWEN2_VL, MML_LABELS_ALL_ASSISTANT, mixed, n2, sup,
                     sizeof sup));
  CHECK_EQ_STR(sup, "Voil\xc3\xa0 | \xf0\x9f\x98\x80 \xc3\xa9t\xc3\xa9<|im_end|>\n");

  /* Leading spaces and newlines in assistant content (a straddling token is labelled). */
  const char *ws =
      "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", "
      "\"content\": \"  two\"},"
      "{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": "
      "\"\\n\\r\\n x\"},"
      "{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"\"}]}";
  CHECK(encode_check(tok, MML_TEMPLATE_QWEN3_VL, MML_LABELS_ALL_ASSISTANT, ws, NULL, sup,
                     sizeof sup));
  CHECK_SUP(sup, "  two<|im_end|>\n|\n\r\n x<|im_end|>\n|<|im_end|>\n",
            "  two<|im_end|>\n|\n\n\r\n x<|im_end|>\n|<|im_end|>\n");
  mml_tokenizer_free(tok);
}

TEST(encode_and_labels_qwen) { encode_and_labels_with(0); }
TEST(encode_and_labels_tiny) { encode_and_labels_with(1); }

TEST(encode_rejects_vision_tokens_in_text_and_rolls_back) {
  mml_tokenizer *tok = load_tok(0);
  if (!tok) tok = load_tok(1);
  if (!tok) return;
  mml_template *t = NULL;
  mml_record r = {0};
  mml_err e = {0};
  mml_ids ids = {0}, labels = {0};
  CHECK_OK(mml_template_new(MML_TEMPLATE_QWEN2_VL, MML_LABELS_ALL_ASSISTANT, tok, &t, &e), e);
  mml_ids_push(&ids, 42);
  mml_ids_push(&labels, -100);
  const char *line = "{\"messages\": [{\"role\": \"user\", \"content\": \"x <|image_pad|> y\"}]}";
  CHECK_OK(mml_record_parse(line, strlen(line), &r, &e), e);
  CHECK_EQ_INT(mml_template_encode(t, NULL, &r, NULL, &ids, &labels, &e), MML_ERECORD);
  CHECK(strstr(e.msg, "<|image_pad|>") != NULL);
  CHECK_EQ_INT(ids.len, 1);
  CHECK_EQ_INT(labels.len, 1);
  line = "{\"messages\": [{\"role\": \"user\", \"content\": \"ok <|im_end|> literal\"}]}";
  CHECK_OK(mml_record_parse(line, strlen(line), &r, &e), e);
  CHECK_OK(mml_template_encode(t, NULL, &r, NULL, &ids, &labels, &e), e);
  CHECK(ids.len > 1 && ids.len == labels.len);
  mml_ids_free(&ids);
  mml_ids_free(&labels);
  mml_record_free(&r);
  mml_template_free(t);
  mml_tokenizer_free(tok);
}

/* Threads share one tokenizer and template; each has its own record and scratch. */
typedef struct {
  const mml_tokenizer *tok;
  const mml_template *t;
  const mml_ids *want_ids, *want_labels;
  int bad;
} thread_arg;

static void *encode_many(void *p) {
  thread_arg *a = p;
  mml_record r = {0};
  mml_tok_scratch *s = NULL;
  mml_ids ids = {0}, labels = {0};
  mml_err e = {0};
  int64_t n[] = {7};
  if (mml_tok_scratch_new(&s)) {
    a->bad++;
    return NULL;
  }
  for (int i = 0; i < 200; i++) {
    mml_ids_clear(&ids);
    mml_ids_clear(&labels);
    if (mml_record_parse(k_llava, strlen(k_llava), &r, &e) ||
        mml_template_encode(a->t, s, &r, n, &ids, &labels, &e) || ids.len != a->want_ids->len ||
        memcmp(ids.data, a->want_ids->data, ids.len * 4) ||
        memcmp(labels.data, a->want_labels->data, ids.len * 4))
      a->bad++;
  }
  mml_ids_free(&ids);
  mml_ids_free(&labels);
  mml_tok_scratch_free(s);
  mml_record_free(&r);
  return NULL;
}

TEST(concurrent_encode) {
  mml_tokenizer *tok = load_tok(0);
  if (!tok) tok = load_tok(1);
  if (!tok) return;
  mml_template *t = NULL;
  mml_record r = {0};
  mml_err e = {0};
  mml_ids ids = {0}, labels = {0};
  int64_t n[] = {7};
  CHECK_OK(mml_template_new(MML_TEMPLATE_QWEN2_VL, MML_LABELS_ALL_ASSISTANT, tok, &t, &e), e);
  CHECK_OK(mml_record_parse(k_llava, strlen(k_llava), &r, &e), e);
  CHECK_OK(mml_template_encode(t, NULL, &r, n, &ids, &labels, &e), e);
  thread_arg a[4];
  pthread_t th[4];
  for (int i = 0; i < 4; i++) {
    a[i] = (thread_arg){tok, t, &ids, &labels, 0};
    pthread_create(&th[i], NULL, encode_many, &a[i]);
  }
  for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < 4; i++) CHECK_EQ_INT(a[i].bad, 0);
  mml_ids_free(&ids);
  mml_ids_free(&labels);
  mml_record_free(&r);
  mml_template_free(t);
  mml_tokenizer_free(tok);
}
