/* fuzz-tokenizer-load.c — tokenizer.json loading (vocab, merges in both forms, added
 * tokens, normalizer and pre-tokenizer checks); a tokenizer that loads must encode and
 * decode a fixed text. */
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  mml_tokenizer *t = NULL;
  mml_err e = {0};
  if (mml_tokenizer_load_json((const char *)data, size, &t, &e)) {
    fuzz_check_msg(&e);
    return 0;
  }
  mml_ids ids = {0};
  mml_bytes text = {0};
  static const char probe[] = "Hello <|im_start|>world\n caf\xc3\xa9 123 \xf0\x9f\x98\x80";
  if (mml_tokenizer_encode(t, NULL, probe, sizeof probe - 1, &ids, &e) == MML_OK)
    mml_tokenizer_decode(t, ids.data, ids.len, &text, &e);
  mml_ids_free(&ids);
  mml_bytes_free(&text);
  mml_tokenizer_free(t);
  return 0;
}
