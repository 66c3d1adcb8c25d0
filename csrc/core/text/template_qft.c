/*
 * template_qft.c — Qwen's own fine-tuning data path (recipe="qwen-vl-finetune"): the
 * records it reads, its labels and its model_max_length cut (contract:
 * mml_template_set_qwen_finetune in mml/template.h).
 *
 * Mirrors QwenLM/Qwen3-VL qwen-vl-finetune/qwenvl/data/data_processor.py (96588727):
 *   1. mml_qft_check_record: only user and assistant turns, images only in user turns,
 *      no top-level system/tools, videos as files only (the message names why);
 *   2. labels come from the ids alone, as preprocess_qwen_visual's scan: at each
 *      assistant_id (pos), the tokens [pos + 2, end + 2) are labelled, end being the next
 *      im_end_id; the scan resumes after end (its `pos = ans_end; pos += 1`); no im_end
 *      after pos: nothing labelled and the scan moves one token on;
 *   3. the cut keeps the first model_max_length tokens (DataCollatorForSupervisedDataset's
 *      input_ids[:, :model_max_length]); a cut that drops any media token is
 *      MML_ETOOLONG and leaves ids/labels unchanged.
 * Pure functions of their arguments; reentrant.
 */
#include <stdbool.h>

#include "mml/template.h"

mml_status mml_qft_check_record(const mml_record *rec, mml_err *err) {
  for (int i = 0; i < rec->nvideos; i++)
    if (!rec->videos[i].ref)
      return mml_err_set(err, MML_EUNSUPPORTED,
                         "recipe=\"qwen-vl-finetune\": video %d is a frame list; Qwen's code "
                         "reads video files (its path for frame lists is not reproduced)",
                         i);
  if (rec->system || rec->tools)
    return mml_err_set(err, MML_ERECORD,
                       "bad record: recipe=\"qwen-vl-finetune\" reads no top-level \"%s\" (Qwen's "
                       "code ignores it)",
                       rec->system ? "system" : "tools");
  for (int k = 0; k < rec->nmessages; k++) { /* 1. */
    const mml_message *m = &rec->messages[k];
    if (m->role != MML_ROLE_USER && m->role != MML_ROLE_ASSISTANT)
      return mml_err_set(err, MML_ERECORD,
                         "bad record: message %d has role \"%s\"; recipe=\"qwen-vl-finetune\" "
                         "takes human/gpt turns only (Qwen's code reads any turn but "
                         "\"human\" as the assistant's)",
                         k, m->role_name);
    if (m->role == MML_ROLE_USER) continue;
    for (int i = 0; i < m->nparts; i++)
      if (m->parts[i].kind != MML_PART_TEXT)
        return mml_err_set(err, MML_ERECORD,
                           "bad record: message %d (assistant) holds an image; "
                           "recipe=\"qwen-vl-finetune\" takes images in user turns only "
                           "(Qwen's code keeps <image> in an answer as text)",
                           k);
  }
  return MML_OK;
}

static bool is_media(int32_t id, const int32_t *media, int n) {
  for (int i = 0; i < n; i++)
    if (media[i] >= 0 && id == media[i]) return true;
  return false;
}

mml_status mml_qft_finish(int32_t assistant_id, int32_t im_end_id, int64_t model_max_length,
                          const int32_t *media_ids, int n_media, size_t from, mml_ids *ids,
                          mml_ids *labels, mml_err *err) {
  if (!ids || !labels || ids->len != labels->len || from > ids->len || model_max_length < 0)
    return mml_err_set(err, MML_EINVAL, "qwen-vl-finetune: bad arguments");
  const size_t n = ids->len;
  size_t keep = n;
  if (model_max_length > 0 && n - from > (size_t)model_max_length) { /* 3. */
    keep = from + (size_t)model_max_length;
    for (size_t i = keep; i < n; i++)
      if (is_media(ids->data[i], media_ids, n_media))
        return mml_err_set(err, MML_ETOOLONG,
                           "too long: %zu tokens; model_max_length=%lld would cut an image's "
                           "or video's tokens (token %zu)",
                           n - from, (long long)model_max_length, i - from);
  }
  const int32_t *id = ids->data;
  int32_t *lab = labels->data;
  for (size_t i = from; i < n; i++) lab[i] = MML_IGNORE_INDEX;
  for (size_t pos = from; pos < n; pos++) { /* 2. */
    if (id[pos] != assistant_id) continue;
    size_t end = pos + 2;
    while (end < n && id[end] != im_end_id) end++;
    if (end >= n) continue;
    for (size_t i = pos + 2; i < end + 2 && i < n; i++) lab[i] = id[i];
    pos = end;
  }
  ids->len = labels->len = keep;
  return MML_OK;
}
