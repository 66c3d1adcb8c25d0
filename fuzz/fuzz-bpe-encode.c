/* fuzz-bpe-encode.c — BPE encode of arbitrary bytes (invalid UTF-8 repair, NFC, the
 * pre-split regex, added tokens, merges) with the bundled tokenizer; decoding the ids of
 * valid UTF-8 text must give the text back. */
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static mml_tok_scratch *sc;
  if (!sc && mml_tok_scratch_new(&sc)) abort();
  const mml_tokenizer *t = fuzz_tokenizer();
  mml_ids ids = {0};
  mml_bytes back = {0};
  mml_err e = {0};
  if (mml_tokenizer_encode(t, sc, (const char *)data, size, &ids, &e)) {
    fuzz_check_msg(&e);
  } else if (mml_tokenizer_decode(t, ids.data, ids.len, &back, &e) == MML_OK) {
    /* NFC may change valid text, so only the ASCII case is compared exactly */
    int ascii = 1;
    for (size_t i = 0; i < size && ascii; i++) ascii = data[i] && data[i] < 0x80;
    if (ascii && (back.len != size || (size && memcmp(back.data, data, size)))) {
      fprintf(stderr, "fuzz: decode(encode(x)) != x for ASCII input\n");
      abort();
    }
  }
  mml_ids_free(&ids);
  mml_bytes_free(&back);
  return 0;
}
