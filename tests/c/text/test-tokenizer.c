/* test-tokenizer.c — byte-level BPE core: loading (both merge forms), BPE order, added
 * tokens, NFC, invalid UTF-8, decode, errors, and concurrent encoding on one shared
 * tokenizer.  The tokenizer is built here as JSON: the 256 byte symbols (id = byte) plus a
 * few merges.  The real Qwen3 tokenizer.json (MML_QWEN_TOKENIZER, or shared/ beside the
 * repository) adds checks on the real file when present. */
#include <pthread.h>

#include "mml/tokenizer.h"
#include "mml_test.h"

/* GPT-2 byte -> code point of its symbol. */
static int32_t b2c(int b) {
  if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return b;
  int extra = 0;
  for (int x = 0; x < b; x++)
    if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174)) extra++;
  return 256 + extra;
}

static void put_json_str(mml_bytes *o, const char *s) {
  mml_bytes_append(o, "\"", 1);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') mml_bytes_append(o, "\\", 1);
    mml_bytes_append(o, s, 1);
  }
  mml_bytes_append(o, "\"", 1);
}

static void sym(int b, char *out) { /* UTF-8 of byte b's symbol */
  int32_t c = b2c(b);
  if (c < 0x80) {
    out[0] = (char)c, out[1] = 0;
  } else {
    out[0] = (char)(0xC0 | (c >> 6)), out[1] = (char)(0x80 | (c & 0x3F)), out[2] = 0;
  }
}

/* merges: pairs of symbol strings written with 'G' standing for the space symbol. */
static const char *k_merges[][2] = {{"h", "e"}, {"l", "l"},  {"he", "ll"},  {"hell", "o"},
                                    {"G", "w"}, {"a", "a"},  {"aa", "aa"},  {"Gw", "o"},
                                    {"r", "l"}, {"rl", "d"}, {"Gwo", "rld"}};

static void expand(const char *in, char *out) {
  for (; *in; in++) {
    if (*in == 'G') {
      sym(' ', out);
      out += strlen(out);
    } else {
      *out++ = *in;
    }
  }
  *out = 0;
}

/* Builds the test tokenizer.json; pairs=1 writes merges as ["a","b"], else "a b". */
static char *make_json(int pairs, const char *normalizer, size_t *len) {
  mml_bytes o = {0};
  char buf[64], a[32], b[32];
#define S(str) mml_bytes_append(&o, str, strlen(str))
  S("{\"version\":\"1.0\",\"added_tokens\":[");
  S("{\"id\":300,\"content\":\"<|im_start|>\",\"special\":true,\"normalized\":false},");
  S("{\"id\":301,\"content\":\"<|im_end|>\",\"special\":true,\"normalized\":false},");
  S("{\"id\":302,\"content\":\"<tool>\",\"special\":false,\"normalized\":false},");
  S("{\"id\":303,\"content\":\"cafe\\u0301\",\"special\":false,\"normalized\":true}],");
  S("\"normalizer\":");
  S(normalizer);
  S(",\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\","
    "\"pattern\":{\"Regex\":\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?"
    "\\\\p{L}+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|"
    "\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":\"Isolated\",\"invert\":false},"
    "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":false,"
    "\"use_regex\":false}]},");
  S("\"post_processor\":null,\"decoder\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false},");
  S("\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,\"vocab\":{");
  for (int i = 0; i < 256; i++) {
    sym(i, buf);
    put_json_str(&o, buf);
    snprintf(buf, sizeof buf, ":%d,", i);
    S(buf);
  }
  size_t nm = sizeof k_merges / sizeof *k_merges;
  for (size_t i = 0; i < nm; i++) {
    expand(k_merges[i][0], a);
    expand(k_merges[i][1], b);
    snprintf(buf, sizeof buf, "%s%s", a, b);
    put_json_str(&o, buf);
    snprintf(buf, sizeof buf, ":%zu%s", 256 + i, i + 1 < nm ? "," : "");
    S(buf);
  }
  S("},\"merges\":[");
  for (size_t i = 0; i < nm; i++) {
    expand(k_merges[i][0], a);
    expand(k_merges[i][1], b);
    if (pairs) {
      S("[");
      put_json_str(&o, a);
      S(",");
      put_json_str(&o, b);
      S("]");
    } else {
      snprintf(buf, sizeof buf, "%s %s", a, b);
      put_json_str(&o, buf);
    }
    if (i + 1 < nm) S(",");
  }
  S("]}}");
#undef S
  mml_bytes_append(&o, "", 1);
  *len = o.len - 1;
  return (char *)o.data;
}

static mml_tokenizer *load_test(int pairs) {
  size_t len;
  char *j = make_json(pairs, "{\"type\":\"NFC\"}", &len);
  mml_tokenizer *t = NULL;
  mml_err e = {0};
  mml_status st = mml_tokenizer_load_json(j, len, &t, &e);
  free(j);
  if (st) fprintf(stderr, "  load: %s\n", e.msg);
  return t;
}

/* Encodes s and compares with the expected ids (terminated by -1). */
static int enc_is(const mml_tokenizer *t, mml_tok_scratch *sc, const char *s, size_t len,
                  const int32_t *want) {
  mml_ids ids = {0};
  mml_err e = {0};
  int ok = mml_tokenizer_encode(t, sc, s, len, &ids, &e) == MML_OK;
  size_t n = 0;
  while (want[n] >= 0) n++;
  ok = ok && ids.len == n && (n == 0 || memcmp(ids.data, want, n * 4) == 0);
  if (!ok) {
    fprintf(stderr, "  encode(\"%.40s\") ->", s);
    for (size_t i = 0; i < ids.len && i < 24; i++) fprintf(stderr, " %d", ids.data[i]);
    fprintf(stderr, " (%s)\n", e.msg);
  }
  mml_ids_free(&ids);
  return ok;
}
#define ENC(t, sc, s, ...) enc_is(t, sc, s, strlen(s), (const int32_t[]){__VA_ARGS__, -1})

TEST(bpe_merges_both_forms) {
  for (int pairs = 0; pairs < 2; pairs++) {
    mml_tokenizer *t = load_test(pairs);
    CHECK(t != NULL);
    CHECK_EQ_INT(mml_tokenizer_vocab_size(t), 256 + 11 + 4);
    CHECK(ENC(t, NULL, "hello", 259));
    CHECK(ENC(t, NULL, "hello world", 259, 266));
    CHECK(ENC(t, NULL, "hellos", 259, 's'));
    /* aa (rank 5) merges leftmost first, then aa+aa */
    CHECK(ENC(t, NULL, "aaaaa", 262, 'a'));
    CHECK(ENC(t, NULL, "aaa", 261, 'a'));
    CHECK(enc_is(t, NULL, "", 0, (const int32_t[]){-1}));
    mml_tokenizer_free(t);
  }
}

TEST(long_words_use_the_same_order) {
  mml_tokenizer *t = load_test(1);
  CHECK(t != NULL);
  for (size_t n = 1; n < 700; n += 37) {
    char *s = malloc(n);
    memset(s, 'a', n);
    mml_ids ids = {0};
    mml_err e = {0};
    CHECK_OK(mml_tokenizer_encode(t, NULL, s, n, &ids, &e), e);
    CHECK_EQ_INT(ids.len, n / 4 + (n % 4 >= 2) + (n % 2));
    for (size_t i = 0; i < n / 4; i++) CHECK_EQ_INT(ids.data[i], 262);
    free(s);
    mml_ids_free(&ids);
  }
  mml_tokenizer_free(t);
}

TEST(added_tokens_and_nfc) {
  mml_tokenizer *t = load_test(0);
  CHECK(t != NULL);
  CHECK(ENC(t, NULL, "<|im_start|>hello<|im_end|>", 300, 259, 301));
  CHECK(ENC(t, NULL, "x<tool>y", 'x', 302, 'y'));
  CHECK(ENC(t, NULL, "<|im_start|<tool>", '<', '|', 'i', 'm', '_', 's', 't', 'a', 'r', 't', '|',
            302));
  /* the normalized added token matches after NFC, whichever form the input takes */
  CHECK(ENC(t, NULL, "cafe\xCC\x81", 303));
  CHECK(ENC(t, NULL, "caf\xC3\xA9!", 303, '!'));
  /* NFC composes e + U+0301 into U+00E9 (bytes C3 A9) */
  CHECK(ENC(t, NULL, "e\xCC\x81", 0xC3, 0xA9));
  CHECK_EQ_INT(mml_tokenizer_token_to_id(t, "<tool>", 6), 302);
  CHECK_EQ_INT(mml_tokenizer_token_to_id(t, "hello", 5), 259);
  CHECK_EQ_INT(mml_tokenizer_token_to_id(t, "nope", 4), -1);
  size_t len = 0;
  const char *s = mml_tokenizer_id_to_token(t, 301, &len);
  CHECK(s && len == 10 && memcmp(s, "<|im_end|>", 10) == 0);
  CHECK(mml_tokenizer_id_to_token(t, 5000, &len) == NULL);
  CHECK(mml_tokenizer_id_to_token(t, -1, &len) == NULL);
  CHECK(mml_tokenizer_is_special(t, 300) && !mml_tokenizer_is_special(t, 302));
  mml_tokenizer_free(t);
}

TEST(invalid_utf8_becomes_replacement_char) {
  mml_tokenizer *t = load_test(0);
  CHECK(t != NULL);
  /* lone 0xFF, then a truncated 3-byte sequence (one U+FFFD for both bytes) */
  CHECK(ENC(t, NULL,
            "a\xFF"
            "b\xE2\x82",
            'a', 0xEF, 0xBF, 0xBD, 'b', 0xEF, 0xBF, 0xBD));
  mml_tokenizer_free(t);
}

TEST(decode) {
  mml_tokenizer *t = load_test(0);
  CHECK(t != NULL);
  mml_bytes out = {0};
  mml_err e = {0};
  int32_t ids[] = {300, 259, 266, 301};
  CHECK_OK(mml_tokenizer_decode(t, ids, 4, &out, &e), e);
  CHECK(out.len == 33 && memcmp(out.data, "<|im_start|>hello world<|im_end|>", 33) == 0);
  mml_bytes_clear(&out);
  CHECK_OK(mml_tokenizer_decode_ex(t, ids, 4, MML_TOK_SKIP_SPECIAL, &out, &e), e);
  CHECK(out.len == 11 && memcmp(out.data, "hello world", 11) == 0);
  mml_bytes_clear(&out);
  int32_t bad_utf8[] = {'a', 0xC3, 'b'};
  CHECK_OK(mml_tokenizer_decode(t, bad_utf8, 3, &out, &e), e);
  CHECK(out.len == 5 && memcmp(out.data,
                               "a\xEF\xBF\xBD"
                               "b",
                               5) == 0);
  mml_bytes_clear(&out);
  int32_t unknown[] = {'a', 4000};
  CHECK_EQ_INT(mml_tokenizer_decode(t, unknown, 2, &out, &e), MML_EINVAL);
  CHECK_EQ_INT(out.len, 0);
  mml_bytes_free(&out);
  mml_tokenizer_free(t);
}

TEST(load_errors) {
  mml_tokenizer *t = NULL;
  mml_err e = {0};
  CHECK_EQ_INT(mml_tokenizer_load_json("{", 1, &t, &e), MML_ECONFIG);
  CHECK(t == NULL);
  CHECK_EQ_INT(mml_tokenizer_load_json("[]", 2, &t, &e), MML_ECONFIG);
  size_t len;
  char *j = make_json(0, "{\"type\":\"NFKC\"}", &len);
  CHECK_EQ_INT(mml_tokenizer_load_json(j, len, &t, &e), MML_ECONFIG);
  CHECK(strstr(e.msg, "NFKC") != NULL);
  free(j);
  j = make_json(0, "null", &len);
  char *m = strstr(j, "\"h e\"");
  CHECK(m != NULL);
  m[1] = 'q'; /* "q e": q + e = "qe" is not in the vocabulary */
  CHECK_EQ_INT(mml_tokenizer_load_json(j, len, &t, &e), MML_ECONFIG);
  CHECK(strstr(e.msg, "merges[0]") != NULL);
  free(j);
  CHECK_EQ_INT(mml_tokenizer_load("/nonexistent/tokenizer.json", &t, &e), MML_ENOENT);
}

/* ---- concurrency: one tokenizer, many threads -------------------------------------- */

static const char *k_texts[] = {
    "<|im_start|>user\nhello world<|im_end|>\n",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa hello",
    "cafe\xCC\x81 and caf\xC3\xA9",
    "don't STOP 'LL 12345 \t\t\n\n  x",
    "\xE6\x97\xA5\xE6\x9C\xAC hello",
};
#define N_TEXTS (sizeof k_texts / sizeof *k_texts)

typedef struct {
  const mml_tokenizer *t;
  mml_ids *want;
  int use_scratch, bad;
} thread_arg;

static void *encode_many(void *p) {
  thread_arg *a = p;
  mml_tok_scratch *sc = NULL;
  if (a->use_scratch && mml_tok_scratch_new(&sc) != MML_OK) {
    a->bad++;
    return NULL;
  }
  mml_ids ids = {0};
  for (int round = 0; round < 200; round++) {
    for (size_t i = 0; i < N_TEXTS; i++) {
      mml_ids_clear(&ids);
      if (mml_tokenizer_encode(a->t, sc, k_texts[i], strlen(k_texts[i]), &ids, NULL) != MML_OK ||
          ids.len != a->want[i].len || memcmp(ids.data, a->want[i].data, ids.len * 4) != 0)
        a->bad++;
    }
  }
  mml_ids_free(&ids);
  mml_tok_scratch_free(sc);
  return NULL;
}

TEST(shared_tokenizer_many_threads) {
  mml_tokenizer *t = load_test(1);
  CHECK(t != NULL);
  mml_ids want[N_TEXTS] = {{0}};
  for (size_t i = 0; i < N_TEXTS; i++)
    CHECK_EQ_INT(mml_tokenizer_encode(t, NULL, k_texts[i], strlen(k_texts[i]), &want[i], NULL),
                 MML_OK);
  pthread_t th[6];
  thread_arg args[6];
  for (int i = 0; i < 6; i++) {
    args[i] = (thread_arg){t, want, i % 2, 0};
    CHECK_EQ_INT(pthread_create(&th[i], NULL, encode_many, &args[i]), 0);
  }
  int bad = 0;
  for (int i = 0; i < 6; i++) {
    pthread_join(th[i], NULL);
    bad += args[i].bad;
  }
  CHECK_EQ_INT(bad, 0);
  for (size_t i = 0; i < N_TEXTS; i++) mml_ids_free(&want[i]);
  mml_tokenizer_free(t);
}

/* mml_tokenizer_encode_batch: the ids of every text, in input order, whatever the number
 * of threads; slots go back to the pool; the pool is shared with concurrent batches. */
#define BATCH_N 300
static int batch_matches(const mml_tokenizer *t, mml_tok_pool *pool, size_t nthreads,
                         const char **texts, const size_t *lens, mml_ids *want) {
  mml_tok_batch *b = NULL;
  mml_err e = {0};
  if (mml_tokenizer_encode_batch(t, pool, texts, lens, BATCH_N, nthreads, &b, &e) != MML_OK)
    return 0;
  int ok = mml_tok_batch_size(b) == BATCH_N;
  for (size_t i = 0; ok && i < BATCH_N; i++) {
    size_t len;
    const int32_t *ids = mml_tok_batch_ids(b, i, &len);
    ok = len == want[i].len && (!len || memcmp(ids, want[i].data, len * 4) == 0);
  }
  mml_tok_batch_free(b);
  return ok;
}

typedef struct {
  const mml_tokenizer *t;
  mml_tok_pool *pool;
  const char **texts;
  const size_t *lens;
  mml_ids *want;
  int bad;
} batch_thread_arg;

static void *batch_many(void *p) {
  batch_thread_arg *a = p;
  for (int round = 0; round < 5; round++)
    if (!batch_matches(a->t, a->pool, 3, a->texts, a->lens, a->want)) a->bad++;
  return NULL;
}

TEST(encode_batch_in_order_any_threads) {
  mml_tokenizer *t = load_test(1);
  mml_tok_pool *pool = NULL;
  CHECK(t != NULL);
  CHECK_EQ_INT(mml_tok_pool_new(4, &pool), MML_OK);
  const char *texts[BATCH_N];
  size_t lens[BATCH_N];
  mml_ids want[BATCH_N] = {{0}};
  for (size_t i = 0; i < BATCH_N; i++) { /* texts of different lengths, some empty */
    texts[i] = k_texts[i % N_TEXTS] + (i / N_TEXTS) % 7;
    lens[i] = i % 11 == 0 ? 0 : strlen(texts[i]);
    CHECK_EQ_INT(mml_tokenizer_encode(t, NULL, texts[i], lens[i], &want[i], NULL), MML_OK);
  }
  size_t threads[] = {1, 2, 3, 8, 0, 1000};
  for (size_t k = 0; k < sizeof threads / sizeof *threads; k++)
    CHECK(batch_matches(t, pool, threads[k], texts, lens, want));
  /* the error is the lowest failing index's, whatever the threads (NULL text: EINVAL) */
  for (size_t k = 0; k < sizeof threads / sizeof *threads; k++) {
    const char *saved[2] = {texts[7], texts[200]};
    texts[7] = texts[200] = NULL;
    lens[7] = lens[200] = 3;
    mml_tok_batch *bad_b = NULL;
    mml_err e = {0};
    CHECK_EQ_INT(mml_tokenizer_encode_batch(t, pool, texts, lens, BATCH_N, threads[k], &bad_b, &e),
                 MML_EINVAL);
    CHECK(bad_b == NULL);
    CHECK(strncmp(e.msg, "texts[7]: ", 10) == 0);
    texts[7] = saved[0], texts[200] = saved[1];
    lens[7] = strlen(texts[7]), lens[200] = strlen(texts[200]);
  }
  /* an empty batch */
  mml_tok_batch *b = NULL;
  CHECK_EQ_INT(mml_tokenizer_encode_batch(t, pool, texts, lens, 0, 4, &b, NULL), MML_OK);
  CHECK_EQ_INT(mml_tok_batch_size(b), 0);
  mml_tok_batch_free(b);
  /* batches on several threads at once, sharing the pool */
  pthread_t th[3];
  batch_thread_arg args[3];
  for (int i = 0; i < 3; i++) {
    args[i] = (batch_thread_arg){t, pool, texts, lens, want, 0};
    CHECK_EQ_INT(pthread_create(&th[i], NULL, batch_many, &args[i]), 0);
  }
  int bad = 0;
  for (int i = 0; i < 3; i++) {
    pthread_join(th[i], NULL);
    bad += args[i].bad;
  }
  CHECK_EQ_INT(bad, 0);
  /* a slot put back is clean and reused */
  mml_tok_slot *s = mml_tok_pool_get(pool);
  CHECK(s != NULL);
  CHECK_EQ_INT(s->ids.len, 0);
  CHECK_EQ_INT(mml_tokenizer_encode(t, s->scratch, "hello", 5, &s->ids, NULL), MML_OK);
  mml_tok_pool_put(pool, s);
  mml_tok_slot *s2 = mml_tok_pool_get(pool);
  CHECK(s2 == s);
  CHECK_EQ_INT(s2->ids.len, 0);
  mml_tok_pool_put(pool, s2);
  for (size_t i = 0; i < BATCH_N; i++) mml_ids_free(&want[i]);
  mml_tok_pool_free(pool);
  mml_tokenizer_free(t);
}

TEST(scratch_moves_between_tokenizers) {
  mml_tokenizer *a = load_test(0), *b = NULL;
  size_t len;
  char *j = make_json(0, "null", &len);
  char *m = strstr(j, "\"hell o\"");
  CHECK(a != NULL && m != NULL);
  memcpy(m, "\"h e\"   ", 8); /* drop the hell+o merge: "hello" -> hell, o */
  mml_err e = {0};
  CHECK_OK(mml_tokenizer_load_json(j, len, &b, &e), e);
  free(j);
  mml_tok_scratch *sc = NULL;
  CHECK_EQ_INT(mml_tok_scratch_new(&sc), MML_OK);
  for (int round = 0; round < 2; round++) {
    CHECK(ENC(a, sc, "hello", 259));
    CHECK(ENC(b, sc, "hello", 258, 'o'));
  }
  mml_tok_scratch_free(sc);
  mml_tokenizer_free(a);
  mml_tokenizer_free(b);
}

/* Random bytes and random code points (sanitizers watch): encode never fails, and for
 * valid text decode(encode(s)) == NFC(s); for ASCII that is s itself. */
TEST(random_input_round_trips) {
  mml_tokenizer *t = load_test(1);
  CHECK(t != NULL);
  mml_tok_scratch *sc = NULL;
  CHECK_EQ_INT(mml_tok_scratch_new(&sc), MML_OK);
  uint64_t r = 88172645463325252ull;
  mml_ids ids = {0};
  mml_bytes out = {0};
  mml_err e = {0};
  char buf[600];
  for (int it = 0; it < 3000; it++) {
    size_t n = 0, want = (size_t)(it % 7 == 0 ? 590 : it % 40);
    int ascii = it % 3 == 0;
    while (n < want) {
      r ^= r << 13, r ^= r >> 7, r ^= r << 17;
      if (ascii) {
        buf[n++] = (char)(r % 96 + 32 - (r % 11 == 0 ? 22 : 0)); /* some \n and \t */
      } else if (it % 3 == 1) {
        buf[n++] = (char)(r & 0xFF);
      } else { /* a random scalar value, UTF-8 encoded */
        uint32_t c = (uint32_t)(r >> 8) % 0x30000;
        if (c >= 0xD800 && c < 0xE000) c = 'x';
        if (n + 4 > want) break;
        if (c < 0x80)
          buf[n++] = (char)c;
        else if (c < 0x800)
          buf[n++] = (char)(0xC0 | (c >> 6)), buf[n++] = (char)(0x80 | (c & 0x3F));
        else if (c < 0x10000)
          buf[n++] = (char)(0xE0 | (c >> 12)), buf[n++] = (char)(0x80 | ((c >> 6) & 0x3F)),
          buf[n++] = (char)(0x80 | (c & 0x3F));
        else
          buf[n++] = (char)(0xF0 | (c >> 18)), buf[n++] = (char)(0x80 | ((c >> 12) & 0x3F)),
          buf[n++] = (char)(0x80 | ((c >> 6) & 0x3F)), buf[n++] = (char)(0x80 | (c & 0x3F));
      }
    }
    mml_ids_clear(&ids);
    mml_bytes_clear(&out);
    CHECK_OK(mml_tokenizer_encode(t, it % 2 ? sc : NULL, buf, n, &ids, &e), e);
    CHECK_OK(mml_tokenizer_decode(t, ids.data, ids.len, &out, &e), e);
    if (ascii) CHECK(out.len == n && memcmp(out.data, buf, n) == 0);
  }
  mml_ids_free(&ids);
  mml_bytes_free(&out);
  mml_tok_scratch_free(sc);
  mml_tokenizer_free(t);
}

TEST(real_qwen_tokenizer) {
  /* default: shared/ beside the repository, seen from tests/c (where make runs us) */
  const char *p = getenv("MML_QWEN_TOKENIZER");
  if (!p || !*p) p = "../../../shared/data/qwen3-tokenizer/tokenizer.json";
  FILE *f = fopen(p, "rb");
  if (!f) {
    fprintf(stderr, "  (skipped: no Qwen tokenizer at %s; set MML_QWEN_TOKENIZER)\n", p);
    return;
  }
  fclose(f);
  mml_tokenizer *t = NULL;
  mml_err e = {0};
  CHECK_OK(mml_tokenizer_load(p, &t, &e), e);
  CHECK_EQ_INT(mml_tokenizer_vocab_size(t), 151669);
  CHECK(ENC(t, NULL, "Hello world", 9707, 1879));
  CHECK(ENC(t, NULL, "<|im_start|>user\n", 151644, 872, 198));
  CHECK_EQ_INT(mml_tokenizer_token_to_id(t, "<|image_pad|>", 13), 151655);
  mml_tokenizer_free(t);
}
