"""Video elements in every record layout the loader reads: LLaVA / sharegpt "videos" lists
with `<video>` tags (LLaMA-Factory), messages with HF video content parts (qwen-vl-utils'
element keys), frame lists, list entries as objects; counts checked like images."""

from __future__ import annotations

import json
import os

import pytest

import mmloader
from mmloader import _core

TINY = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")
CONV = [{"from": "human", "value": "<video>What happens?"}, {"from": "gpt", "value": "x"}]


def parse(rec):
    return _core.parse_record(json.dumps(rec))


def test_llamafactory_videos_and_tags():
    r = parse(
        {
            "conversations": [
                {"from": "human", "value": "<image>then<video>and<video>"},
                {"from": "gpt", "value": "x"},
            ],
            "images": ["a.jpg"],
            "videos": ["v1.mp4", ["f0.jpg", "f1.jpg"]],
        }
    )
    assert r["images"] == ["a.jpg"]
    assert [v["video"] for v in r["videos"]] == ["v1.mp4", ["f0.jpg", "f1.jpg"]]
    kinds = [p["type"] for p in r["messages"][0]["parts"]]
    assert kinds == ["image", "text", "video", "text", "video"]


def test_content_parts_with_qwen_vl_utils_keys():
    part = {
        "type": "video",
        "video": "clip.mp4",
        "fps": 1.5,
        "video_start": 0.0,
        "video_end": 7.25,
        "min_pixels": 3136,
        "max_pixels": 200704,
        "total_pixels": 2e7,
        "min_frames": 6,
        "max_frames": 40,
    }
    r = parse(
        {
            "messages": [
                {"role": "user", "content": [part, {"type": "text", "text": "?"}]},
                {"role": "assistant", "content": "x"},
            ]
        }
    )
    v = r["videos"][0]
    assert v["video"] == "clip.mp4" and v["fps"] == 1.5 and v["video_start"] == 0.0
    assert v["video_end"] == 7.25 and v["min_pixels"] == 3136 and v["max_pixels"] == 200704
    assert v["total_pixels"] == 2e7 and v["min_frames"] == 6 and v["max_frames"] == 40
    assert v["nframes"] == 0 and v["resized_height"] == 0


def test_frame_list_part_and_list_entry_objects():
    r = parse(
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"video": ["a.jpg", "b.jpg", "c.jpg"], "sample_fps": 1, "raw_fps": 25},
                        {"type": "video"},
                    ],
                },
                {"role": "assistant", "content": "x"},
            ],
            "videos": [
                {"path": "clip.mkv", "nframes": 8, "resized_height": 224, "resized_width": 336}
            ],
        }
    )
    a, b = r["videos"]
    assert a["video"] == ["a.jpg", "b.jpg", "c.jpg"] and a["sample_fps"] == 1 and a["raw_fps"] == 25
    assert b["video"] == "clip.mkv" and b["nframes"] == 8 and b["resized_height"] == 224


def test_video_url_part():
    r = parse(
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "video_url", "video_url": {"url": "https://x/v.mp4"}}],
                },
                {"role": "assistant", "content": "x"},
            ]
        }
    )
    assert r["videos"][0]["video"] == "https://x/v.mp4"


@pytest.mark.parametrize(
    "rec, err, needle",
    [
        ({"conversations": CONV}, mmloader.SampleError, "video count mismatch"),
        (
            {"conversations": CONV, "videos": ["a.mp4", "b.mp4"]},
            mmloader.SampleError,
            "video count mismatch",
        ),
        ({"conversations": CONV, "videos": [[]]}, mmloader.SampleError, "empty frame list"),
        (
            {"conversations": CONV, "videos": [{"path": "a.mp4", "fps": 2, "nframes": 4}]},
            mmloader.SampleError,
            "both \"fps\" and \"nframes\"",
        ),
        (
            {"conversations": CONV, "videos": [{"path": "a.mp4", "nframes": 2.5}]},
            mmloader.SampleError,
            "positive integer",
        ),
        (
            {"conversations": CONV, "videos": [{"path": "a.mp4", "video_end": "3"}]},
            mmloader.SampleError,
            "must be a number",
        ),
        ({"conversations": CONV, "videos": [[1, 2]]}, mmloader.SampleError, "frame 0 is not"),
        (
            {"conversations": CONV, "videos": ["a.mp4"], "video": "b.mp4"},
            mmloader.SampleError,
            "both",
        ),
    ],
)
def test_bad_video_records(rec, err, needle):
    with pytest.raises(err, match=needle):
        parse(rec)


def test_frames_count_towards_max_images_per_sample():
    rec = {"conversations": CONV, "videos": [[f"{i}.jpg" for i in range(10)]]}
    assert len(parse(rec)["videos"][0]["video"]) == 10
    with pytest.raises(mmloader.SampleError, match="max_images_per_sample"):
        _core.parse_record(json.dumps(rec), max_images_per_sample=9)


def test_render_qwen2_and_qwen3_placeholders():
    rec = json.dumps({"conversations": CONV, "videos": [["a.jpg", "b.jpg"]]})
    text = _core.render_record(rec, "qwen2-vl", video_tokens=[(2, 3)])
    assert "<|vision_start|>" + "<|video_pad|>" * 6 + "<|vision_end|>What happens?" in text
    text = _core.render_record(rec, "qwen3-vl", video_tokens=[(2, 2, [0.25, 1.25])])
    pads = "<|video_pad|>" * 2
    # the default form (qwen3_video_prompt="blocks", transformers 5.25): the blocks alone,
    # in place of the template's whole <|vision_start|><|video_pad|><|vision_end|>
    assert (
        "user\n<0.2 seconds><|vision_start|>" + pads + "<|vision_end|>"
        "<1.2 seconds><|vision_start|>" + pads + "<|vision_end|>What"
    ) in text


def test_video_text_tokens_are_refused_in_text():
    rec = {
        "conversations": [
            {"from": "human", "value": "<|video_pad|>"},
            {"from": "gpt", "value": "x"},
        ]
    }
    tok = mmloader.Tokenizer.tiny()
    with pytest.raises(mmloader.SampleError, match="video_pad"):
        mmloader.encode_chat(rec, tok)


def test_records_with_bad_videos_are_skipped_with_their_reason(tmp_path):
    lines = [
        {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "x"}]},
        {"conversations": CONV, "videos": [["missing0.jpg", "missing1.jpg"]]},
    ]
    p = tmp_path / "v.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in lines))
    with mmloader.Loader(
        str(p), tokenizer=TINY, micro_batch_size=1, shuffle=False, num_threads=1
    ) as L:
        with pytest.warns(UserWarning, match=r"v\.jsonl:2: .*missing0\.jpg"):
            n = sum(1 for _ in L)
        assert list(L.stats()["skipped_by_reason"]) == ["missing_file"]
    assert n == 2
