/* The loader's option table (mml/options.h): rows, defaults, checked setters, cross-checks. */
#include <string.h>

#include "mml/options.h"
#include "mml_test.h"

TEST(rows_and_defaults) {
  int n;
  const mml_option *t = mml_loader_options(&n);
  CHECK(n > 20);
  for (int i = 0; i < n; i++) {
    CHECK(mml_loader_option(t[i].name) == &t[i]); /* names are unique */
    CHECK(t[i].doc && t[i].doc[0]);
    CHECK(t[i].offset + (size_t)t[i].size <= sizeof(mml_loader_cfg));
  }
  CHECK(mml_loader_option("no_such_option") == NULL);
  mml_loader_cfg c;
  mml_loader_cfg_defaults(&c);
  CHECK_EQ_INT(c.collate.micro_batch_size, 0); /* None: 8 unless max_tokens_per_batch */
  CHECK_EQ_INT(c.shuffle, 1);
  CHECK_EQ_INT(c.prefetch, 4);
  CHECK_EQ_INT(c.collate.attention_mask, 1);
  CHECK_EQ_INT(c.collate.pad_id, -1);
  CHECK_EQ_INT(c.device, -1);
  CHECK_EQ_INT(c.min_error_samples, 100);
  CHECK(c.max_error_rate == 0.1);
  CHECK_EQ_INT(c.collate.keys, MML_KEYS_QWEN);
  CHECK(c.image_root == NULL);
}

TEST(setters_check_rows) {
  mml_loader_cfg c;
  mml_loader_cfg_defaults(&c);
  mml_err err = {0};
  const mml_option *mbs = mml_loader_option("micro_batch_size");
  CHECK_OK(mml_option_set_int(&c, mbs, 3, &err), err);
  CHECK_EQ_INT(c.collate.micro_batch_size, 3);
  CHECK_EQ_INT(mml_option_get_int(&c, mbs), 3);
  CHECK(mml_option_set_int(&c, mbs, 0, &err) == MML_ECONFIG);
  CHECK(strstr(err.msg, "micro_batch_size must be >= 1, got 0"));
  const mml_option *seq = mml_loader_option("seq_length"); /* an int64_t field */
  CHECK_OK(mml_option_set_int(&c, seq, (int64_t)1 << 40, &err), err);
  CHECK_EQ_INT(c.collate.seq_length, (int64_t)1 << 40);
  const mml_option *seed = mml_loader_option("seed"); /* a uint64_t field */
  CHECK_OK(mml_option_set_int(&c, seed, -1, &err), err);
  CHECK(c.seed == UINT64_MAX);
  const mml_option *keys = mml_loader_option("keys");
  CHECK_OK(mml_option_set_enum(&c, keys, "megatron", &err), err);
  CHECK_EQ_INT(c.collate.keys, MML_KEYS_MEGATRON);
  CHECK_EQ_STR(mml_option_enum_name(keys, mml_option_get_int(&c, keys)), "megatron");
  CHECK(mml_option_set_enum(&c, keys, "hf", &err) == MML_ECONFIG);
  CHECK(strstr(err.msg, "keys must be one of ('qwen', 'megatron'), got 'hf'"));
  CHECK(mml_option_set_int(&c, keys, 2, &err) == MML_ECONFIG);
  const mml_option *shuffle = mml_loader_option("shuffle");
  CHECK(mml_option_set_int(&c, shuffle, 2, &err) == MML_ECONFIG);
  const mml_option *rate = mml_loader_option("max_error_rate");
  CHECK_OK(mml_option_set_float(&c, rate, 0.5, &err), err);
  CHECK(c.max_error_rate == 0.5);
  CHECK(mml_option_set_float(&c, rate, 1.5, &err) == MML_ECONFIG);
  CHECK(mml_option_set_int(&c, rate, 1, &err) == MML_ECONFIG); /* wrong kind */
  const mml_option *root = mml_loader_option("image_root");
  CHECK_OK(mml_option_set_str(&c, root, "/data", &err), err);
  CHECK_EQ_STR(mml_option_get_str(&c, root), "/data");
}

/* pixel_format: each choice is one mml_pixels value, which says the dtype the engine emits
 * and whether it expands uint8 rows at emission (mml/loader.h). */
TEST(pixel_format_choices) {
  static const struct {
    const char *name;
    int pixels, emitted, compact;
  } want[] = {
      {"float32", MML_PIXELS_FLOAT32, MML_PIXEL_FLOAT32, 1},
      {"bfloat16", MML_PIXELS_BFLOAT16, MML_PIXEL_BFLOAT16, 1},
      {"uint8", MML_PIXELS_UINT8, MML_PIXEL_UINT8, 0},
      {"float32-decode", MML_PIXELS_FLOAT32_DECODE, MML_PIXEL_FLOAT32, 0},
      {"bfloat16-decode", MML_PIXELS_BFLOAT16_DECODE, MML_PIXEL_BFLOAT16, 0},
      {"float32-consumer", MML_PIXELS_FLOAT32_CONSUMER, MML_PIXEL_UINT8, 0},
      {"bfloat16-consumer", MML_PIXELS_BFLOAT16_CONSUMER, MML_PIXEL_UINT8, 0},
  };
  mml_loader_cfg c;
  mml_loader_cfg_defaults(&c);
  CHECK_EQ_INT(c.pixels, MML_PIXELS_FLOAT32); /* the default */
  mml_err err = {0};
  const mml_option *o = mml_loader_option("pixel_format");
  for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
    CHECK_OK(mml_option_set_enum(&c, o, want[i].name, &err), err);
    CHECK_EQ_INT(c.pixels, want[i].pixels);
    CHECK_EQ_INT(mml_pixels_emitted(c.pixels), want[i].emitted);
    CHECK_EQ_INT(mml_pixels_compact(c.pixels), want[i].compact);
    CHECK_EQ_STR(mml_pixels_name(c.pixels), want[i].name);
  }
  CHECK(mml_option_set_enum(&c, o, "uint8-consumer", &err) == MML_ECONFIG);
  CHECK_EQ_STR(mml_pixels_name(99), "?");
}

TEST(cross_checks) {
  mml_loader_cfg c;
  mml_loader_cfg_defaults(&c);
  mml_err err = {0};
  c.num_threads = 1;
  CHECK_OK(mml_loader_cfg_check(&c, &err), err);
  c.dp_rank = 2, c.dp_size = 2;
  CHECK(mml_loader_cfg_check(&c, &err) == MML_ECONFIG);
  CHECK(strstr(err.msg, "dp_rank must be < dp_size (2), got 2"));
  c.dp_rank = 0;
  c.collate.pack = 1;
  CHECK(mml_loader_cfg_check(&c, &err) == MML_ECONFIG);
  CHECK(strstr(err.msg, "packing=True needs pack_length"));
  c.collate.pack_length = 128;
  CHECK_OK(mml_loader_cfg_check(&c, &err), err);
  c.collate.pack = 0;
  CHECK(mml_loader_cfg_check(&c, &err) == MML_ECONFIG);
  c.collate.pack_length = 0;
  c.max_tokens_per_batch = 4096; /* a token budget contradicts fixed rows, packs, seq_length */
  CHECK_OK(mml_loader_cfg_check(&c, &err), err);
  c.collate.micro_batch_size = 4;
  CHECK(mml_loader_cfg_check(&c, &err) == MML_ECONFIG);
  CHECK(strstr(err.msg, "not both"));
  c.collate.micro_batch_size = 0;
  c.collate.seq_length = 1024;
  CHECK(mml_loader_cfg_check(&c, &err) == MML_ECONFIG);
  CHECK(strstr(err.msg, "use micro_batch_size=4 instead"));
  c.collate.seq_length = 0;
  c.max_tokens_per_batch = 0;
  c.prefetch = 0; /* a cfg filled in C is held to the rows' bounds too */
  CHECK(mml_loader_cfg_check(&c, &err) == MML_ECONFIG);
  CHECK(strstr(err.msg, "prefetch"));
}
