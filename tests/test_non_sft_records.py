"""Records that are not supervised fine-tuning data are skipped with their own reasons,
counted, and named in one warning each (issue 28), never trained as text: audio
(LLaMA-Factory's mllm_audio_demo shape: `<audio>` tags and an "audios" list; audio content
parts), preference pairs (its dpo_en_demo shape: "conversations" plus "chosen" /
"rejected"; the alpaca one: "instruction" plus "chosen" / "rejected") and samples with no
trainable token (no assistant turn).  Before, the audio records were trained with the tag
as literal text and the DPO records as their prompt alone, with no warning."""

import json
import warnings

import pytest

import mmloader

SFT = {
    "messages": [
        {"role": "user", "content": "Who are you?"},
        {"role": "assistant", "content": "I am a helpful assistant."},
    ]
}
AUDIO_TAG = {
    "messages": [
        {"role": "user", "content": "<audio>What's that sound?"},
        {"role": "assistant", "content": "It is the sound of glass shattering."},
    ],
    "audios": ["mllm_demo_data/1.mp3"],
}
AUDIO_LIST_ONLY = {"messages": SFT["messages"], "audios": ["a.wav"]}
AUDIO_TAG_ONLY = {
    "messages": [
        {"role": "user", "content": "<audio>Transcribe it."},
        {"role": "assistant", "content": "Hello."},
    ]
}
AUDIO_PART = {
    "messages": [
        {
            "role": "user",
            "content": [{"type": "audio", "audio": "a.wav"}, {"type": "text", "text": "?"}],
        },
        {"role": "assistant", "content": "A bell."},
    ]
}
DPO_SHAREGPT = {
    "conversations": [{"from": "human", "value": "Which is larger, 9.11 or 9.9?"}],
    "chosen": {"from": "gpt", "value": "9.9 is larger."},
    "rejected": {"from": "gpt", "value": "9.11 is larger."},
}
DPO_ALPACA = {"instruction": "Name a colour.", "input": "", "chosen": "Blue.", "rejected": "42"}
NO_ASSISTANT = {"messages": [{"role": "user", "content": "Hello?"}]}

CASES = [
    (AUDIO_TAG, "audio_record"),
    (AUDIO_LIST_ONLY, "audio_record"),
    (AUDIO_TAG_ONLY, "audio_record"),
    (AUDIO_PART, "audio_record"),
    (DPO_SHAREGPT, "preference_record"),
    (DPO_ALPACA, "preference_record"),
    (NO_ASSISTANT, "no_trainable_turn"),
]


def _shard(tmp_path, records):
    p = tmp_path / "d.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(p)


@pytest.mark.parametrize("rec, reason", CASES, ids=[c[1] + str(i) for i, c in enumerate(CASES)])
def test_non_sft_record_is_skipped_with_its_reason(tmp_path, rec, reason):
    data = _shard(tmp_path, [SFT, rec, SFT, rec])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with mmloader.Loader(
            data, tokenizer="tiny", micro_batch_size=1, shuffle=False, num_threads=1
        ) as L:
            batches = [b for b in L]
            st = L.stats()
    assert len(batches) == 4  # the epoch keeps its length (skips refilled from its start)
    assert st["skipped_by_reason"] == {reason: 2}
    mine = [str(w.message) for w in caught if reason in str(w.message)]
    assert len(mine) == 1, mine  # named once, whatever the count


def test_on_error_raise_names_the_reason(tmp_path):
    data = _shard(tmp_path, [DPO_SHAREGPT, SFT])
    with mmloader.Loader(
        data, tokenizer="tiny", micro_batch_size=1, shuffle=False, num_threads=1, on_error="raise"
    ) as L:
        with pytest.raises(mmloader.SampleError, match="chosen"):
            next(L)
