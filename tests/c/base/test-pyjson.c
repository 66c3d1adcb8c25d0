/* test-pyjson.c — JSON re-serialised as Python's json.dumps writes it: separators,
 * repeated keys, numbers, escapes, errors; accessors on spans. */
#include "mml/pyjson.h"
#include "mml_test.h"

static void dumps_is(const char *in, const char *want) {
  mml_bytes out = {0};
  mml_err err = {0};
  mml_status st = mml_pyjson_dumps((mml_span){in, strlen(in)}, &out, &err);
  if (st) FAIL_AT("%s -> %s", in, err.msg);
  mml_bytes_append(&out, "", 1);
  if (strcmp((const char *)out.data, want)) FAIL_AT("%s -> %s, want %s", in, out.data, want);
  mml_bytes_free(&out);
}

static void refused(const char *in, const char *needle) {
  mml_bytes out = {0};
  mml_err err = {0};
  if (mml_pyjson_dumps((mml_span){in, strlen(in)}, &out, &err) != MML_ERECORD)
    FAIL_AT("%s accepted", in);
  if (!strstr(err.msg, needle)) FAIL_AT("%s: %s lacks %s", in, err.msg, needle);
  if (out.len) FAIL_AT("%s: output left behind", in);
  mml_bytes_free(&out);
}

TEST(test_dumps) {
  dumps_is("{\"a\":1,\"b\":[true,false,null],\"c\":{}}",
           "{\"a\": 1, \"b\": [true, false, null], \"c\": {}}");
  dumps_is("{\"a\":1,\"b\":2,\"a\":3}", "{\"a\": 3, \"b\": 2}");
  dumps_is("[1.0, 100.0, 1e16, 1e-5, 0.0001, -0, -0.0, 2.5E+3, 1e400, 123456789012345678901]",
           "[1.0, 100.0, 1e+16, 1e-05, 0.0001, 0, -0.0, 2500.0, Infinity, 123456789012345678901]");
  dumps_is("\"\\u00e9\\ud83d\\ude00\\u0001\\/\\\"\\\\\\n\"",
           "\"\xc3\xa9\xf0\x9f\x98\x80\\u0001/\\\"\\\\\\n\"");
  dumps_is(" [ NaN , -Infinity ] ", "[NaN, -Infinity]");
}

TEST(test_refused) {
  refused("{\"a\" 1}", "byte 5: expected ':'");
  refused("\"\\ud800\"", "lone UTF-16 surrogate");
  refused("\"a\x01\"", "control character");
  refused("\"\xff\"", "invalid UTF-8");
  refused("[1] x", "extra data");
  refused("", "expected a value");
  char deep[1100];
  memset(deep, '[', sizeof deep - 1);
  deep[sizeof deep - 1] = 0;
  refused(deep, "nested too deeply");
}

TEST(test_accessors) {
  const char *t = "[{\"type\": \"function\", \"name\": \"x\", \"name\": \"y\"}, 2, \"s\"]";
  mml_span all = {t, strlen(t)}, v, name;
  CHECK_EQ_INT(mml_pyjson_kind(all), '[');
  CHECK_EQ_INT(mml_pyjson_len(all), 3);
  CHECK(mml_pyjson_item(all, 0, &v));
  CHECK(mml_pyjson_member(v, "name", &name));
  CHECK(mml_pyjson_string_is(name, "y"));
  CHECK(mml_pyjson_member(v, "type", &name) && mml_pyjson_string_is(name, "function"));
  CHECK(!mml_pyjson_member(v, "absent", &name));
  CHECK(mml_pyjson_item(all, 2, &v) && mml_pyjson_string_is(v, "s"));
  CHECK(!mml_pyjson_item(all, 3, &v));
}
