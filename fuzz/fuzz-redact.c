/* fuzz-redact.c — the one redaction rule (mml/message.h) against planted secrets: the
 * input supplies everything around a credential (the text before the URL, its user, host
 * and path, the parameters before and after the secret one, the text after the URL, and
 * which name and separator carry it), the target plants SECRET as a user-info password,
 * a query value or a fragment value, and sends the message down every path a message
 * takes: mml_url_redact, mml_text_redact (_core.redact), mml_err_set, mml_text_short
 * (a long quoted reference, cut in the middle) under mml_err_prefix, mml_text_clean.
 * A finding is SECRET in any output (abort), or output that is not valid UTF-8.
 *
 * The URL's own parts hold no whitespace or control bytes (a URL cannot: the rule ends a
 * URL there), and the user holds none of "/?#@\" (they end the user-info); everything
 * else, quotes, brackets, backticks, '%', nested "scheme://", is the fuzzer's. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "mml/message.h"

#define CORE "PLANTED"
#define SECRET "Zk3q" CORE "q9Vw"
#define DECOY "Zk3qXXXXXXXq9Vw"

static const char *const k_names[] = {"X-Amz-Signature",
                                      "X-Amz-Credential",
                                      "X-Amz-Security-Token",
                                      "token",
                                      "access_token",
                                      "sig",
                                      "password",
                                      "pw",
                                      "api_key",
                                      "Secret",
                                      "X-Amz-%53ignature",
                                      "AUTH",
                                      "client_secret",
                                      "passwd",
                                      "id_token"};
static const char k_seps[] = "?&;#\\"; /* what may come before the secret's name */

/* Field i of the input (fields separated by 0xFF) into out (cap bytes), without NULs,
 * the bytes in `drop`, and (url) whitespace and control bytes. */
static void field(const uint8_t *d, size_t n, int i, char *out, size_t cap, const char *drop,
                  int url) {
  size_t o = 0;
  int cur = 0;
  for (size_t k = 0; k < n && cur <= i && o + 1 < cap; k++) {
    if (d[k] == 0xFF) {
      cur++;
      continue;
    }
    if (cur != i || !d[k] || (url && (d[k] <= ' ' || d[k] == 0x7F)) || (drop && strchr(drop, d[k])))
      continue;
    out[o++] = (char)d[k];
  }
  out[o] = 0;
}

/* Any output showing the secret's core is a leak (inputs that spell it are skipped). */
static void no_secret(const char *s, size_t n) {
  if (memmem(s, n, CORE, sizeof CORE - 1)) abort();
}
/* ... and a message (not the raw redaction) is valid UTF-8 too. */
static void check(const char *s, size_t n) {
  no_secret(s, n);
  if (!mml_utf8_valid(s, n)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2 || size > 8192) return 0;
  uint8_t shape = data[0], pick = data[1];
  data += 2, size -= 2;
  char pre[1024], user[256], host[256], path[2048], before[1024], after[1024], post[1024];
  field(data, size, 0, pre, sizeof pre, NULL, 0);
  field(data, size, 1, user, sizeof user, "/?#@\\", 1);
  field(data, size, 2, host, sizeof host, "/?#@\\", 1);
  field(data, size, 3, path, sizeof path, NULL, 1);
  field(data, size, 4, before, sizeof before, NULL, 1);
  field(data, size, 5, after, sizeof after, NULL, 1);
  field(data, size, 6, post, sizeof post, NULL, 0);
  const char *name = k_names[pick % (sizeof k_names / sizeof *k_names)];
  char sep = k_seps[(pick >> 4) % (sizeof k_seps - 1)];
  /* the URL (what a record or a caller could name), first with a decoy in the secret's
   * place: an input whose own bytes spell the secret's core anywhere is skipped */
  static char url[8192], msg[12288];
  for (int pass = 0; pass < 2; pass++) {
    const char *v = pass ? SECRET : DECOY;
    const char *h = host[0] ? host : "h";
    switch (shape % 3) {
      case 0: /* user-info */
        snprintf(url, sizeof url, "https://%s:%s@%s/%s", user, v, h, path);
        break;
      case 1: /* query: ?before<sep>name=SECRET after */
        snprintf(url, sizeof url, "https://%s/%s?%s%c%s=%s%s", h, path, before, sep, name, v,
                 after);
        break;
      default: /* fragment */
        snprintf(url, sizeof url, "s3://%s/%s#%s%c%s=%s%s", h, path, before, sep, name, v, after);
        break;
    }
    if (!pass) {
      int dl = snprintf(msg, sizeof msg, "%s %s %s", pre, url, post);
      if (dl < 0 || memmem(msg, (size_t)dl, CORE, sizeof CORE - 1)) return 0;
    }
  }
  /* the URL alone */
  char *r = mml_url_redact(url);
  if (r) no_secret(r, strlen(r)), free(r);
  /* in free text, after a delimiter the fuzzer picks */
  static const char delims[] = " \"<`('=\n[";
  char d = delims[(shape >> 2) % (sizeof delims - 1)];
  int ml = snprintf(msg, sizeof msg, "%s%c%s%s", pre, d, url, post);
  if (ml < 0 || (size_t)ml >= sizeof msg) return 0;
  mml_bytes b = {0};
  if (mml_text_redact(msg, (size_t)ml, &b) == MML_OK) no_secret((const char *)b.data, b.len);
  mml_bytes_free(&b);
  /* every error message */
  mml_err e = {0};
  mml_err_set(&e, MML_EFETCH, "GET %s: %s", url, post);
  check(e.msg, strlen(e.msg));
  mml_err_set(&e, MML_EFETCH, "%s", msg);
  check(e.msg, strlen(e.msg));
  /* the sample-level path: a reference quoted short (cut in the middle), then prefixed */
  char shown[MML_SHORT_CAP(200)];
  mml_err_set(&e, MML_EFETCH, "HTTP 404");
  mml_err_prefix(&e, "image %s", mml_text_short(url, strlen(url), 200, shown, sizeof shown));
  check(shown, strlen(shown));
  check(e.msg, strlen(e.msg));
  mml_err_prefix(&e, "shard %s:%d", pre, 7);
  check(e.msg, strlen(e.msg));
  char clean[512];
  mml_text_clean(clean, sizeof clean, msg, (size_t)ml);
  check(clean, strlen(clean));
  return 0;
}
