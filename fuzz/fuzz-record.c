/* fuzz-record.c — one JSONL line: the depth/NUL pre-scan, cJSON, the record parser, then
 * the chat template and the tokenizer over what parsed (the path every record takes).
 * Messages of failures must be valid UTF-8. */
#include "fuzz.h"
#include "mml/record.h"
#include "mml/template.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static mml_template *tmpl;
  static mml_tok_scratch *sc;
  if (!tmpl) {
    mml_err e = {0};
    if (mml_template_new(MML_TEMPLATE_QWEN2_VL, MML_LABELS_ALL_ASSISTANT, fuzz_tokenizer(), &tmpl,
                         &e) ||
        mml_tok_scratch_new(&sc))
      abort();
  }
  mml_record rec = {0};
  mml_err e = {0};
  mml_record_opts o = {.max_images = 64, .max_json_depth = 32};
  mml_status st = mml_record_parse_opts((const char *)data, size, &o, &rec, &e);
  if (st) {
    fuzz_check_msg(&e);
  } else {
    int64_t tokens[64];
    for (int i = 0; i < rec.nimages; i++) tokens[i] = 1 + i % 4;
    mml_ids ids = {0}, labels = {0};
    if (mml_template_encode(tmpl, sc, &rec, tokens, &ids, &labels, &e))
      fuzz_check_msg(&e);
    else if (ids.len != labels.len)
      abort();
    mml_ids_free(&ids);
    mml_ids_free(&labels);
  }
  mml_record_free(&rec);
  return 0;
}
