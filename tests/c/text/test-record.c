/* test-record.c — JSONL record parsing: the three formats, tag matching, bad records,
 * reuse of one record across lines, and concurrent parsing. */
#include <pthread.h>

#include "mml/record.h"
#include "mml_test.h"

static mml_status parse(const char *line, mml_record *rec, mml_err *err) {
  return mml_record_parse(line, strlen(line), rec, err);
}

/* Part i of message m as "T:text" or "I:<ref>" for compact assertions. */
static const char *part_str(const mml_record *r, int m, int i) {
  static char buf[512];
  const mml_part *p = &r->messages[m].parts[i];
  if (p->kind == MML_PART_TEXT)
    snprintf(buf, sizeof buf, "T:%.*s", (int)p->len, p->text);
  else
    snprintf(buf, sizeof buf, "I:%s", r->images[p->image]);
  return buf;
}

TEST(llava_single_image_string) {
  mml_record r = {0};
  mml_err e = {0};
  CHECK_OK(parse("{\"id\": 7, \"image\": \"a.jpg\", \"conversations\": ["
                 "{\"from\": \"human\", \"value\": \"<image>\\nWhat is this?\"},"
                 "{\"from\": \"gpt\", \"value\": \"A cat.\"}]}",
                 &r, &e),
           e);
  CHECK_EQ_INT(r.nmessages, 2);
  CHECK_EQ_INT(r.nimages, 1);
  CHECK_EQ_STR(r.images[0], "a.jpg");
  CHECK_EQ_INT(r.messages[0].role, MML_ROLE_USER);
  CHECK_EQ_STR(r.messages[0].role_name, "user");
  CHECK_EQ_INT(r.messages[0].nparts, 2);
  CHECK_EQ_STR(part_str(&r, 0, 0), "I:a.jpg");
  CHECK_EQ_STR(part_str(&r, 0, 1), "T:\nWhat is this?");
  CHECK_EQ_INT(r.messages[1].role, MML_ROLE_ASSISTANT);
  CHECK_EQ_STR(r.messages[1].role_name, "assistant");
  CHECK_EQ_STR(part_str(&r, 1, 0), "T:A cat.");
  mml_record_free(&r);
}

TEST(messages_many_images_in_order) {
  mml_record r = {0};
  mml_err e = {0};
  CHECK_OK(parse("{\"messages\": [{\"role\": \"system\", \"content\": \"sys <image>\"},"
                 "{\"role\": \"user\", \"content\": \"x<image>y<image><image>\"},"
                 "{\"role\": \"assistant\", \"content\": \"see <image>\"}],"
                 " \"images\": [\"0.png\", \"1.png\", \"2.png\", \"3.png\", \"4.png\"]}",
                 &r, &e),
           e);
  CHECK_EQ_INT(r.nimages, 5);
  CHECK_EQ_INT(r.messages[0].role, MML_ROLE_SYSTEM);
  CHECK_EQ_STR(part_str(&r, 0, 1), "I:0.png");
  CHECK_EQ_INT(r.messages[1].nparts, 5);
  CHECK_EQ_STR(part_str(&r, 1, 0), "T:x");
  CHECK_EQ_STR(part_str(&r, 1, 1), "I:1.png");
  CHECK_EQ_STR(part_str(&r, 1, 2), "T:y");
  CHECK_EQ_STR(part_str(&r, 1, 3), "I:2.png");
  CHECK_EQ_STR(part_str(&r, 1, 4), "I:3.png");
  CHECK_EQ_STR(part_str(&r, 2, 1), "I:4.png");
  for (int i = 0; i < 5; i++) {
    char want[16];
    snprintf(want, sizeof want, "%d.png", i);
    CHECK_EQ_STR(r.images[i], want);
  }
  mml_record_free(&r);
}

TEST(hf_content_parts) {
  mml_record r = {0};
  mml_err e = {0};
  CHECK_OK(
      parse("{\"messages\": [{\"role\": \"user\", \"content\": ["
            "{\"type\": \"image\", \"image\": \"s3://b/k.jpg\"},"
            "{\"type\": \"image\", \"url\": \"https://h/x.png\", \"text\": null},"
            "{\"type\": \"image_url\", \"image_url\": {\"url\": \"u.jpg\"}},"
            "{\"type\": \"image\", \"path\": \"/p.jpg\"},"
            "{\"type\": \"text\", \"text\": \"Compare.\", \"image\": null},"
            "{\"text\": \"untyped\"}, {\"image\": \"untyped.jpg\"}]},"
            "{\"role\": \"assistant\", \"content\": [{\"type\": \"text\", \"text\": \"Same.\"}]}]}",
            &r, &e),
      e);
  CHECK_EQ_INT(r.nimages, 5);
  CHECK_EQ_STR(r.images[0], "s3://b/k.jpg");
  CHECK_EQ_STR(r.images[1], "https://h/x.png");
  CHECK_EQ_STR(r.images[2], "u.jpg");
  CHECK_EQ_STR(r.images[3], "/p.jpg");
  CHECK_EQ_STR(r.images[4], "untyped.jpg");
  CHECK_EQ_INT(r.messages[0].nparts, 7);
  CHECK_EQ_STR(part_str(&r, 0, 4), "T:Compare.");
  CHECK_EQ_STR(part_str(&r, 0, 5), "T:untyped");
  CHECK_EQ_STR(part_str(&r, 1, 0), "T:Same.");
  mml_record_free(&r);
}

TEST(image_parts_take_listed_images) {
  /* TRL / datasets style: {"type": "image"} without data, images listed at top level. */
  mml_record r = {0};
  mml_err e = {0};
  CHECK_OK(parse("{\"images\": [\"a.jpg\", \"b.jpg\"], \"messages\": [{\"role\": \"user\", "
                 "\"content\": [{\"type\": \"image\", \"image\": null}, {\"type\": \"text\", "
                 "\"text\": \"and <image>\"}]}]}",
                 &r, &e),
           e);
  CHECK_EQ_INT(r.nimages, 2);
  CHECK_EQ_STR(part_str(&r, 0, 0), "I:a.jpg");
  CHECK_EQ_STR(part_str(&r, 0, 1), "T:and ");
  CHECK_EQ_STR(part_str(&r, 0, 2), "I:b.jpg");
  mml_record_free(&r);
}

TEST(text_only_roles_unicode_escapes) {
  mml_record r = {0};
  mml_err e = {0};
  CHECK_OK(
      parse("{\"conversations\": [{\"from\": \"system\", \"value\": \"S\"},"
            "{\"from\": \"user\", \"value\": \"caf\\u00e9 \\\"q\\\" \\\\ \\n\\t "
            "\xe4\xbd\xa0\xe5\xa5\xbd \\ud83d\\ude00\"},"
            "{\"from\": \"assistant\", \"value\": \"\"},"
            "{\"from\": \"tool\", \"value\": null},"
            "{\"role\": \"observation\", \"content\": \"o\"}], \"extra\": {\"x\": [1, 2]}}\r\n",
            &r, &e),
      e);
  CHECK_EQ_INT(r.nimages, 0);
  CHECK_EQ_INT(r.nmessages, 5);
  CHECK_EQ_STR(part_str(&r, 1, 0),
               "T:caf\xc3\xa9 \"q\" \\ \n\t \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80");
  CHECK_EQ_INT(r.messages[2].nparts, 0);
  CHECK_EQ_INT(r.messages[3].role, MML_ROLE_OTHER);
  CHECK_EQ_STR(r.messages[3].role_name, "tool");
  CHECK_EQ_INT(r.messages[3].nparts, 0);
  CHECK_EQ_STR(r.messages[4].role_name, "observation");
  mml_record_free(&r);
}

TEST(image_list_forms) {
  mml_record r = {0};
  mml_err e = {0};
  CHECK_OK(parse("{\"image\": [\"a\"], \"conversations\": [{\"from\": \"human\", \"value\": "
                 "\"<image>\"}]}",
                 &r, &e),
           e);
  CHECK_EQ_INT(r.nimages, 1);
  CHECK_EQ_INT(r.messages[0].nparts, 1);
  CHECK_EQ_STR(part_str(&r, 0, 0), "I:a");
  CHECK_OK(parse("{\"images\": [{\"path\": \"p.jpg\"}], \"messages\": [{\"role\": \"user\", "
                 "\"content\": \"<image>hi\"}]}",
                 &r, &e),
           e);
  CHECK_EQ_STR(r.images[0], "p.jpg");
  CHECK_OK(parse("{\"images\": [], \"image\": null, \"messages\": [{\"role\": \"user\", "
                 "\"content\": \"hi\"}]}",
                 &r, &e),
           e);
  CHECK_EQ_INT(r.nimages, 0);
  mml_record_free(&r);
}

static void expect_fail(const char *line, mml_status want, const char *needle) {
  mml_record r = {0};
  mml_err e = {0};
  mml_status st = parse(line, &r, &e);
  if (st != want)
    FAIL_AT("%s: got %s (%s), want %s", line, mml_status_name(st), e.msg, mml_status_name(want));
  if (!strstr(e.msg, needle)) FAIL_AT("%s: message \"%s\" lacks \"%s\"", line, e.msg, needle);
  CHECK_EQ_INT(r.nmessages, 0);
  mml_record_free(&r);
}

/* Packs (mml_record_opts.packs): a list of records is one record with subs; each object
 * keeps its own image list; images are numbered across the pack; views of each record. */
TEST(record_packs) {
  const char *line =
      "[{\"image\": \"a.jpg\", \"conversations\": [{\"from\": \"human\", \"value\": "
      "\"<image>hi\"}, {\"from\": \"gpt\", \"value\": \"yo\"}]},"
      " {\"images\": [\"b.jpg\", \"c.jpg\"], \"messages\": [{\"role\": \"user\", "
      "\"content\": \"<image><image>two\"}, {\"role\": \"assistant\", \"content\": "
      "\"ok\"}, {\"role\": \"user\", \"content\": \"more\"}, {\"role\": "
      "\"assistant\", \"content\": \"done\"}]}]";
  mml_record_opts o = {.packs = 1};
  mml_record r = {0};
  mml_err e = {0};
  CHECK_OK(mml_record_parse_opts(line, strlen(line), &o, &r, &e), e);
  CHECK_EQ_INT(r.nsubs, 2);
  CHECK_EQ_INT(mml_record_count(&r), 2);
  CHECK_EQ_INT(r.nmessages, 6);
  CHECK_EQ_INT(r.subs[0], 0);
  CHECK_EQ_INT(r.subs[1], 2);
  CHECK_EQ_INT(r.subs[2], 6);
  CHECK_EQ_INT(r.nimages, 3);
  CHECK_EQ_STR(part_str(&r, 0, 0), "I:a.jpg");
  CHECK_EQ_STR(part_str(&r, 2, 1), "I:c.jpg");
  mml_record one = mml_record_sub(&r, 1);
  CHECK_EQ_INT(one.nmessages, 4);
  CHECK_EQ_INT(one.nsubs, 0);
  CHECK_EQ_INT(one.messages[0].parts[0].image, 1); /* indices run across the pack */
  CHECK_EQ_STR(part_str(&one, 3, 0), "T:done");
  /* parsed again as a plain record: no subs left */
  const char *plain = "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}";
  CHECK_OK(mml_record_parse_opts(plain, strlen(plain), &o, &r, &e), e);
  CHECK_EQ_INT(r.nsubs, 0);
  CHECK(r.subs == NULL);
  CHECK_EQ_INT(mml_record_count(&r), 1);
  CHECK_EQ_INT(mml_record_sub(&r, 0).nmessages, 1);
  /* a record of the pack whose images do not match: named */
  const char *bad =
      "[{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}, "
      "{\"image\": \"a.jpg\", \"messages\": [{\"role\": \"user\", "
      "\"content\": \"x\"}]}]";
  CHECK_EQ_INT(mml_record_parse_opts(bad, strlen(bad), &o, &r, &e), MML_EMISMATCH);
  CHECK(strstr(e.msg, "record 1 of the pack") != NULL);
  CHECK_EQ_INT(r.nmessages, 0);
  CHECK_EQ_INT(mml_record_parse_opts("[]", 2, &o, &r, &e), MML_ERECORD);
  CHECK(strstr(e.msg, "empty pack") != NULL);
  CHECK_EQ_INT(mml_record_parse_opts("[[]]", 4, &o, &r, &e), MML_ERECORD);
  CHECK(strstr(e.msg, "record 0 of the pack") != NULL);
  /* max_images bounds the whole pack */
  o.max_images = 2;
  CHECK_EQ_INT(mml_record_parse_opts(line, strlen(line), &o, &r, &e), MML_ETOOMANYIMAGES);
  mml_record_free(&r);
  /* without packs a list is refused, naming data_packing */
  expect_fail("[{\"messages\": []}]", MML_ERECORD, "data_packing=True");
}

TEST(bad_records) {
  expect_fail("", MML_ERECORD, "invalid JSON");
  expect_fail("{\"messages\": [", MML_ERECORD, "invalid JSON");
  expect_fail("[1, 2]", MML_ERECORD, "not a JSON object");
  expect_fail("{\"messages\": []}", MML_ERECORD, "empty conversation");
  expect_fail("{\"conversations\": {}}", MML_ERECORD, "not a list");
  expect_fail("{\"foo\": 1}", MML_ERECORD, "no \"messages\"");
  expect_fail("{\"messages\": [{\"content\": \"x\"}]}", MML_ERECORD, "no role");
  expect_fail("{\"messages\": [{\"role\": 3, \"content\": \"x\"}]}", MML_ERECORD, "no role");
  expect_fail("{\"messages\": [\"hi\"]}", MML_ERECORD, "not an object");
  expect_fail("{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", MML_ERECORD, "neither");
  expect_fail(
      "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"video\", \"video\": []}]}]}",
      MML_ERECORD, "empty frame list");
  expect_fail("{\"videos\": [\"v.mp4\"], \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}",
              MML_EMISMATCH, "video count mismatch");
  expect_fail("{\"messages\": [{\"role\": \"user\", \"content\": \"<video>x\"}]}", MML_EMISMATCH,
              "refers to video 1");
  expect_fail("{\"instruction\": \"x\"}", MML_ERECORD, "no \"output\"");
  expect_fail("{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\"}]}]}",
              MML_ERECORD, "no string \"text\"");
  expect_fail(
      "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image\", \"image\": 4}]}]}",
      MML_ERECORD, "not a string");
  expect_fail("{\"messages\": [{\"role\": \"user\", \"content\": [7]}]}", MML_ERECORD,
              "not an object");
  expect_fail("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]} trailing", MML_ERECORD,
              "trailing");
  expect_fail("{\"images\": 3, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}",
              MML_ERECORD, "neither");
  expect_fail(
      "{\"images\": [\"a\"], \"image\": \"b\", \"messages\": [{\"role\": \"user\", \"content\": "
      "\"x\"}]}",
      MML_ERECORD, "both");
  expect_fail("{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\"}]}", MML_ERECORD,
              "UTF-8");
  expect_fail("{\"messages\": [{\"role\": \"user\", \"content\": \"\xc0\xaf\"}]}", MML_ERECORD,
              "UTF-8");
  expect_fail(
      "{\"images\": [\"\"], \"messages\": [{\"role\": \"user\", \"content\": \"<image>\"}]}",
      MML_ERECORD, "empty image");
  expect_fail(
      "{\"images\": [null], \"messages\": [{\"role\": \"user\", \"content\": \"<image>\"}]}",
      MML_ERECORD, "not a string");
}

TEST(count_mismatch) {
  expect_fail(
      "{\"image\": \"a.jpg\", \"conversations\": [{\"from\": \"human\", \"value\": \"no tag\"}]}",
      MML_EMISMATCH, "lists 1 image(s) but its messages refer to 0");
  expect_fail(
      "{\"images\": [\"a\"], \"messages\": [{\"role\": \"user\", \"content\": "
      "\"<image><image>\"}]}",
      MML_EMISMATCH, "refers to image 2");
  expect_fail("{\"messages\": [{\"role\": \"user\", \"content\": \"<image>\"}]}", MML_EMISMATCH,
              "lists 0");
  expect_fail("{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image\"}]}]}",
              MML_EMISMATCH, "lists 0");
}

/* A WebDataset sample's members stand for the lists a record leaves out: images for
 * `<image>` tags / image parts, videos (files) for `<video>` tags / video parts (in order,
 * the part's keys kept); a list the record has wins; a member no tag takes mismatches. */
TEST(implicit_members_stand_for_absent_lists) {
  const char *imgs[] = {"k.jpg"}, *vids[] = {"k.0.mp4", "k.1.mkv"};
  mml_record_opts o = {
      .implicit = imgs, .nimplicit = 1, .implicit_videos = vids, .nimplicit_videos = 2};
  mml_record r = {0};
  mml_err e = {0};
  const char *line =
      "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": "
      "\"video\", \"nframes\": 6}, {\"type\": \"text\", \"text\": "
      "\"<image><video>?\"}]}]}";
  CHECK_OK(mml_record_parse_opts(line, strlen(line), &o, &r, &e), e);
  CHECK_EQ_INT(r.nimages, 1);
  CHECK_EQ_STR(r.images[0], "k.jpg");
  CHECK_EQ_INT(r.nvideos, 2);
  CHECK_EQ_STR(r.videos[0].ref, "k.0.mp4");
  CHECK_EQ_INT(r.videos[0].keys.nframes, 6);
  CHECK_EQ_STR(r.videos[1].ref, "k.1.mkv");
  CHECK_EQ_INT(r.videos[1].keys.nframes, 0);
  line =
      "{\"videos\": [\"x.mp4\"], \"messages\": [{\"role\": \"user\", \"content\": "
      "\"<image><video>\"}]}";
  CHECK_OK(mml_record_parse_opts(line, strlen(line), &o, &r, &e), e);
  CHECK_EQ_INT(r.nvideos, 1);
  CHECK_EQ_STR(r.videos[0].ref, "x.mp4");
  line = "{\"messages\": [{\"role\": \"user\", \"content\": \"<image><video>\"}]}";
  CHECK(mml_record_parse_opts(line, strlen(line), &o, &r, &e) == MML_EMISMATCH);
  CHECK(strstr(e.msg, "lists 2 video(s) but its messages refer to 1") != NULL);
  mml_record_free(&r);
}

TEST(reuse_and_length_bound) {
  /* One record reused across lines, some failing; the line is read only up to len. */
  mml_record r = {0};
  mml_err e = {0};
  const char *good =
      "{\"images\": [\"a\", \"b\"], \"messages\": [{\"role\": \"user\", \"content\": "
      "\"<image><image>q\"},"
      "{\"role\": \"assistant\", \"content\": \"r\"}]}GARBAGE";
  size_t good_len = strlen(good) - strlen("GARBAGE");
  for (int i = 0; i < 50; i++) {
    CHECK_OK(mml_record_parse(good, good_len, &r, &e), e);
    CHECK_EQ_INT(r.nimages, 2);
    CHECK_EQ_STR(r.images[1], "b");
    CHECK_EQ_STR(part_str(&r, 1, 0), "T:r");
    CHECK_EQ_INT(mml_record_parse("{\"messages\": []}", 16, &r, &e), MML_ERECORD);
    CHECK_EQ_INT(r.nmessages, 0);
  }
  CHECK_EQ_INT(mml_record_parse(good, strlen(good), &r, &e), MML_ERECORD);
  mml_record_free(&r);
  mml_record_free(&r); /* idempotent */
}

TEST(truncated_prefixes_never_crash) {
  const char *line =
      "{\"images\": [\"a\"], \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": "
      "\"image\"},"
      " {\"type\": \"text\", \"text\": \"caf\\u00e9 <image>\"}]}, {\"role\": \"assistant\", "
      "\"content\": \"ok\"}]}";
  mml_record r = {0};
  mml_err e = {0};
  size_t n = strlen(line);
  for (size_t k = 0; k < n; k++) {
    mml_status st = mml_record_parse(line, k, &r, &e);
    CHECK(st == MML_ERECORD || st == MML_EMISMATCH);
  }
  /* the full line: 1 listed image, 2 references */
  CHECK_EQ_INT(mml_record_parse(line, n, &r, &e), MML_EMISMATCH);
  mml_record_free(&r);
}

static void *parse_many(void *arg) {
  int *bad = arg;
  mml_record r = {0};
  mml_err e = {0};
  char line[256];
  for (int i = 0; i < 2000; i++) {
    int n = snprintf(line, sizeof line,
                     "{\"image\": \"img%d.jpg\", \"conversations\": [{\"from\": \"human\", "
                     "\"value\": \"<image>\\nq%d\"}, {\"from\": \"gpt\", \"value\": \"a\"}]}%s",
                     i, i, i % 3 == 0 ? "x" : "");
    mml_status st = mml_record_parse(line, (size_t)n, &r, &e);
    char want[32];
    snprintf(want, sizeof want, "img%d.jpg", i);
    if (i % 3 == 0 ? st != MML_ERECORD : (st != MML_OK || strcmp(r.images[0], want))) (*bad)++;
  }
  mml_record_free(&r);
  return NULL;
}

TEST(concurrent_parsing) {
  pthread_t th[4];
  int bad[4] = {0};
  for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, parse_many, &bad[i]);
  for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < 4; i++) CHECK_EQ_INT(bad[i], 0);
}
