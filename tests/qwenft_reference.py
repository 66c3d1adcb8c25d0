"""Qwen's own fine-tuning data path (the reference of recipe="qwen-vl-finetune"): a TEST
FIXTURE, not mmloader code.

Vendored from QwenLM/Qwen3-VL, qwen-vl-finetune/qwenvl/data/data_processor.py and
qwenvl/train/argument.py at commit 96588727e44c78b25ba03ea03b8e12f7e64fd0da (Apache License
2.0, Copyright the Qwen team, Alibaba Group; full text:
https://www.apache.org/licenses/LICENSE-2.0).  That code is not on PyPI and CI has no
network but PyPI, so the functions the data path runs are copied here unchanged except:
the rank0_print logging of update_processor_pixels is left out, and the collator's row cut
(DataCollatorForSupervisedDataset.__call__: input_ids[:, :model_max_length]) is `cut`.
tests/data/qwenft/demo/ holds its demo/single_images.json and the two images it names.

Pixel limits: under transformers 5 its update_processor_pixels is a no-op (the image
processor's size is a SizeDict, not a dict, and the PIL processor has no min_pixels
attribute); under transformers 4.57.0.dev0, its README's pin, it set the processor's
size to DataArguments' min_pixels / max_pixels.  run() checks the no-op and then, unless
the job says "pixels": "5", writes the limits as 4.57 did (what recipe="qwen-vl-finetune"
reproduces by default).

Videos: the same, and the video processor's limits: its update_processor_pixels sets
their fps / min_frames / max_frames attributes under transformers 5 too, but not the
size (a SizeDict); "pixels": "4.57" writes video_min_pixels / video_max_pixels into it as
4.57 did.  apply_chat_template reads a video file with torchcodec when it loads, else
with torchvision's read_video.  PyPI's torchcodec needs the CUDA build of torch
(libtorch_cuda, libnvrtc), so beside the suite's CPU torch it never loads; the test runs
this with the torchvision stand-in (tests/tvshim) reporting 0.25
(MMLOADER_TVSHIM_VERSION), so that transformers takes its torchvision path: read_video's
PyAV backend, reproduced there call for call.

Runs in the suite's own interpreter (transformers 5.24): its code builds the messages,
calls processor.apply_chat_template(tokenize=True) (images read by transformers'
load_image), and labels the ids.
"""

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List

import torch

IGNORE_INDEX = -100


@dataclass
class DataArguments:  # argument.py (the fields the data path reads)
    max_pixels: int = 28 * 28 * 576
    min_pixels: int = 28 * 28 * 16
    video_max_frames: int = 8
    video_min_frames: int = 4
    video_max_pixels: int = 1024 * 28 * 28
    video_min_pixels: int = 256 * 28 * 28
    video_fps: float = 2


MODEL_MAX_LENGTH = 512  # argument.py TrainingArguments.model_max_length


def _make_abs_paths(base: Path, files: str) -> str:
    return f"{(base / files).resolve()}"


def update_processor_pixels(processor, data_args):
    ip = processor.image_processor
    if hasattr(ip, "min_pixels") and hasattr(ip, "max_pixels"):
        ip.min_pixels = data_args.min_pixels
        ip.max_pixels = data_args.max_pixels
    if hasattr(ip, "size") and isinstance(ip.size, dict):
        ip.size["shortest_edge"] = data_args.min_pixels
        ip.size["longest_edge"] = data_args.max_pixels
    if hasattr(processor, "video_processor") and processor.video_processor is not None:
        vp = processor.video_processor
        if hasattr(vp, "min_pixels") and hasattr(vp, "max_pixels"):
            vp.min_pixels = data_args.video_min_pixels
            vp.max_pixels = data_args.video_max_pixels
        if hasattr(vp, "min_frames") and hasattr(vp, "max_frames"):
            vp.min_frames = data_args.video_min_frames
            vp.max_frames = data_args.video_max_frames
        if hasattr(vp, "fps"):
            vp.fps = data_args.video_fps
        if hasattr(vp, "size") and isinstance(vp.size, dict):
            vp.size["shortest_edge"] = data_args.video_min_pixels
            vp.size["longest_edge"] = data_args.video_max_pixels
    return processor


def _build_messages(item: Dict[str, Any], base_path: Path) -> List[Dict[str, Any]]:
    # Extract and normalize images and videos
    images = item.get("image") or []
    if isinstance(images, str):
        images = [images]

    videos = item.get("video") or []
    if isinstance(videos, str):
        videos = [videos]

    # Build media pools with absolute paths
    image_pool = [{"type": "image", "image": _make_abs_paths(base_path, img)} for img in images]
    video_pool = [{"type": "video", "video": _make_abs_paths(base_path, vid)} for vid in videos]

    messages = []
    for turn in item["conversations"]:
        role = "user" if turn["from"] == "human" else "assistant"
        text: str = turn["value"]

        if role == "user":
            content = []
            # Split text by <image> or <video> placeholders while keeping delimiters
            text_parts = re.split(r"(<image>|<video>)", text)

            for seg in text_parts:
                if seg == "<image>":
                    if not image_pool:
                        raise ValueError(
                            "Number of <image> placeholders exceeds the number of provided images"
                        )
                    content.append(image_pool.pop(0))
                elif seg == "<video>":
                    if not video_pool:
                        raise ValueError(
                            "Number of <video> placeholders exceeds the number of provided videos"
                        )
                    content.append(video_pool.pop(0))
                elif seg.strip():
                    content.append({"type": "text", "text": seg.strip()})

            messages.append({"role": role, "content": content})
        else:
            # Assistant messages contain only text
            messages.append({"role": role, "content": [{"type": "text", "text": text}]})

    # Check for unused media files
    if image_pool:
        raise ValueError(f"{len(image_pool)} image(s) remain unused (not consumed by placeholders)")
    if video_pool:
        raise ValueError(f"{len(video_pool)} video(s) remain unused (not consumed by placeholders)")

    return messages


def preprocess_qwen_visual(
    sources,
    processor,
) -> Dict:
    if len(sources) != 1:
        raise ValueError(f"Expected 1 source, got {len(sources)}")

    source = sources[0]
    base_path = Path(source.get("data_path", ""))
    messages = _build_messages(source, base_path)

    full_result = processor.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_tensors="pt"
    )

    input_ids = full_result["input_ids"]
    if isinstance(input_ids, list):
        input_ids = torch.tensor(input_ids).unsqueeze(0)

    labels = torch.full_like(input_ids, IGNORE_INDEX)

    input_ids_flat = input_ids[0].tolist()
    L = len(input_ids_flat)
    pos = 0
    while pos < L:
        if input_ids_flat[pos] == 77091:
            ans_start = pos + 2
            ans_end = ans_start
            while ans_end < L and input_ids_flat[ans_end] != 151645:
                ans_end += 1
            if ans_end < L:
                labels[0, ans_start : ans_end + 2] = input_ids[0, ans_start : ans_end + 2]
                pos = ans_end
        pos += 1

    full_result["labels"] = labels
    full_result["input_ids"] = input_ids
    return full_result


def cut(data_dict, model_max_length):
    """DataCollatorForSupervisedDataset's row cut (one instance: no padding)."""
    return (
        data_dict["input_ids"][0][:model_max_length],
        data_dict["labels"][0][:model_max_length],
    )


def processor(preset, tokenizer_dir, chat_template):
    """The checkpoints' processor (PIL image backend, as the suite's other references),
    built from the tokenizer folder without a model download."""
    from transformers import AutoTokenizer, Qwen2_5_VLProcessor, Qwen3VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    if preset == "qwen3-vl":
        ip = Qwen2VLImageProcessorPil(
            patch_size=16,
            min_pixels=65536,
            max_pixels=16777216,
            image_mean=[0.5] * 3,
            image_std=[0.5] * 3,
        )
        vp = Qwen3VLVideoProcessor(size={"shortest_edge": 4096, "longest_edge": 25165824})
        cls = Qwen3VLProcessor
    else:
        ip = Qwen2VLImageProcessorPil(min_pixels=3136, max_pixels=12845056)
        vp = Qwen2VLVideoProcessor(min_pixels=3136, max_pixels=12845056)
        cls = Qwen2_5_VLProcessor
    return cls(image_processor=ip, tokenizer=tok, video_processor=vp, chat_template=chat_template)


def run(job):
    """One file through Qwen's data path: per record ids_i, labels_i (cut), grid_i,
    pixels_i, vgrid_i, vpixels_i, spg_i (second_per_grid_ts), or err_i (the exception its
    code raises)."""
    import json

    import numpy as np

    proc = processor(job["preset"], job["tokenizer"], job["chat_template"])
    args = DataArguments(**job.get("data_args", {}))
    size = proc.image_processor.size
    before = (size.shortest_edge, size.longest_edge)
    vsize = proc.video_processor.size
    vbefore = (vsize.shortest_edge, vsize.longest_edge)
    update_processor_pixels(proc, args)
    # transformers 5 holds the limits in a SizeDict (not a dict) and the PIL processor has
    # no min_pixels attribute: update_processor_pixels changes nothing (checked here).
    # Under transformers 4.57 (its README's pin) size was a dict and it set the limits:
    # "pixels": "4.57" writes them as it did then, "5" keeps the checkpoint's.
    assert (size.shortest_edge, size.longest_edge) == before
    assert (vsize.shortest_edge, vsize.longest_edge) == vbefore  # the same for videos
    if job.get("pixels", "4.57") == "4.57":
        proc.image_processor.size.shortest_edge = args.min_pixels
        proc.image_processor.size.longest_edge = args.max_pixels
        vsize.shortest_edge = args.video_min_pixels
        vsize.longest_edge = args.video_max_pixels
    n_max = job.get("model_max_length", MODEL_MAX_LENGTH)
    with open(job["file"]) as f:
        recs = json.load(f) if job["file"].endswith(".json") else [json.loads(x) for x in f]
    out = {}
    for i, rec in enumerate(recs):
        rec["data_path"] = job["data_path"]  # LazySupervisedDataset.__init__
        try:
            r = preprocess_qwen_visual([rec], proc)
        except Exception as e:  # its __getitem__ would retry, then take another sample
            out[f"err_{i}"] = np.array(f"{type(e).__name__}: {e}")
            continue
        ids, labels = cut(r, n_max)
        out[f"ids_{i}"] = ids.numpy()
        out[f"labels_{i}"] = labels.numpy()
        out[f"full_{i}"] = np.array(r["input_ids"].shape[1])
        if "image_grid_thw" in r:
            out[f"grid_{i}"] = r["image_grid_thw"].numpy()
            out[f"pixels_{i}"] = r["pixel_values"].numpy()
        if "video_grid_thw" in r:
            out[f"vgrid_{i}"] = r["video_grid_thw"].numpy()
            out[f"vpixels_{i}"] = r["pixel_values_videos"].numpy()
            # LazySupervisedDataset._get_item's second_per_grid_ts (its rope's)
            vp = proc.video_processor
            out[f"spg_{i}"] = np.array([vp.temporal_patch_size / vp.fps] * len(r["video_grid_thw"]))
    out["n"] = np.array(len(recs))
    np.savez(job["out"], **out)


def main():
    import json
    import sys

    req = json.load(sys.stdin)
    for job in req["jobs"]:
        run(job)


if __name__ == "__main__":
    main()
