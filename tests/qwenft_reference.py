"""Qwen's own fine-tuning data path (the reference of recipe="qwen-vl-finetune"): a TEST
FIXTURE, not mmloader code.

Vendored from QwenLM/Qwen3-VL, qwen-vl-finetune/qwenvl/data/data_processor.py,
qwenvl/data/rope2d.py, qwenvl/train/argument.py and tools/pack_data.py at commit
96588727e44c78b25ba03ea03b8e12f7e64fd0da (Apache License 2.0, Copyright the Qwen team,
Alibaba Group; full text: https://www.apache.org/licenses/LICENSE-2.0).  That code is not on
PyPI and CI has no network but PyPI, so the functions the data path runs are copied here
unchanged (reformatted by the suite's formatter) except:
- the rank0_print logging of update_processor_pixels is left out;
- the padded collator's row cut (DataCollatorForSupervisedDataset.__call__:
  input_ids[:, :model_max_length]) is also `cut`, for one record at a time, at the
  model_max_length of the processor's tokenizer that collator is built on (the tokenizer
  folder's, not argument.py's TrainingArguments.model_max_length: see run());
- rope2d.py: get_rope_index_3 and get_rope_index_25 (Qwen3-VL, Qwen2.5-VL); its
  get_rope_index_2 (Qwen2-VL, which the recipe does not cover) is left out;
- LazySupervisedDataset: only _get_item (what data_flatten batches are made of); its
  __init__ (which reads its data_list registry and the annotation files) is left out and
  run() sets the attributes _get_item reads, as __init__ sets them; its __getitem__
  retries are left out (a record that fails is reported, not replaced);
- pad_and_cat, DataCollatorForSupervisedDataset and FlattenedDataCollatorForSupervisedDataset
  (make_supervised_data_module's collator with data_flatten=True) unchanged.
- data_packing: LazySupervisedDataset._get_packed_item unchanged (a `# noqa` on the name its
  dict branch leaves undefined); what its __init__ does with a packed file (each record of
  a list entry gets data_path) and its __getitem__'s wrapping of a dict entry in a list are
  in packed(), as run() sets the other attributes.
- tools/pack_data.py: DataArguments (renamed PackDataArguments beside argument.py's),
  MultimodalProcessor (its process_video left out: it needs torchcodec, which cannot load
  here, so videos cannot be counted and the tool is run on image and text records only),
  calculate_tokens and pack_data unchanged; its script (which reads a model folder and its
  own dataset table at import) is pack_tool(), step for step, over one file; binpacking
  is imported where it is there.
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

import itertools
import os
import re
from copy import deepcopy
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch
import transformers
from PIL import Image
from torch.utils.data import Dataset

try:  # tools/pack_data.py's (pack_tool only)
    import binpacking
except ImportError:
    binpacking = None

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


# ---- qwenvl/data/rope2d.py: get_rope_index_3, get_rope_index_25 (unchanged) ----------------


def get_rope_index_3(
    spatial_merge_size: Optional[int] = 2,
    input_ids: Optional[torch.LongTensor] = None,
    image_grid_thw: Optional[torch.LongTensor] = None,
    video_grid_thw: Optional[torch.LongTensor] = None,
    second_per_grid_ts: Optional[torch.Tensor] = None,
    attention_mask: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Different from the original implementation, Qwen3VL use timestamps rather than absolute time position ids."""
    # Since we use timestamps to seperate videos, like <t1> <vision_start> <frame1> <vision_end> <t2> <vision_start> <frame2> <vision_end>, the video_grid_thw should also be split
    if video_grid_thw is not None:
        video_grid_thw = torch.repeat_interleave(video_grid_thw, video_grid_thw[:, 0], dim=0)
        video_grid_thw[:, 0] = 1

    image_token_id = 151655
    video_token_id = 151656
    vision_start_token_id = 151652
    mrope_position_deltas = []
    if input_ids is not None and (image_grid_thw is not None or video_grid_thw is not None):
        total_input_ids = input_ids
        if attention_mask is None:
            attention_mask = torch.ones_like(total_input_ids)
        position_ids = torch.ones(
            3,
            input_ids.shape[0],
            input_ids.shape[1],
            dtype=input_ids.dtype,
            device=input_ids.device,
        )
        image_index, video_index = 0, 0
        attention_mask = attention_mask.to(total_input_ids.device)
        for i, input_ids in enumerate(total_input_ids):
            input_ids = input_ids[attention_mask[i] == 1]
            image_nums, video_nums = 0, 0
            vision_start_indices = torch.argwhere(input_ids == vision_start_token_id).squeeze(1)
            vision_tokens = input_ids[vision_start_indices + 1]
            image_nums = (vision_tokens == image_token_id).sum()
            video_nums = (vision_tokens == video_token_id).sum()
            input_tokens = input_ids.tolist()
            llm_pos_ids_list: list = []
            st = 0
            remain_images, remain_videos = image_nums, video_nums
            for _ in range(image_nums + video_nums):
                if image_token_id in input_tokens and remain_images > 0:
                    ed_image = input_tokens.index(image_token_id, st)
                else:
                    ed_image = len(input_tokens) + 1
                if video_token_id in input_tokens and remain_videos > 0:
                    ed_video = input_tokens.index(video_token_id, st)
                else:
                    ed_video = len(input_tokens) + 1
                if ed_image < ed_video:
                    t, h, w = (
                        image_grid_thw[image_index][0],
                        image_grid_thw[image_index][1],
                        image_grid_thw[image_index][2],
                    )
                    image_index += 1
                    remain_images -= 1
                    ed = ed_image

                else:
                    t, h, w = (
                        video_grid_thw[video_index][0],
                        video_grid_thw[video_index][1],
                        video_grid_thw[video_index][2],
                    )
                    video_index += 1
                    remain_videos -= 1
                    ed = ed_video
                llm_grid_t, llm_grid_h, llm_grid_w = (
                    t.item(),
                    h.item() // spatial_merge_size,
                    w.item() // spatial_merge_size,
                )
                text_len = ed - st

                st_idx = llm_pos_ids_list[-1].max() + 1 if len(llm_pos_ids_list) > 0 else 0
                llm_pos_ids_list.append(torch.arange(text_len).view(1, -1).expand(3, -1) + st_idx)

                # t_index is always 0 because llm_grid_t is always 1 (we use timestamps to encode the temporal information for videos)
                t_index = (
                    torch.arange(llm_grid_t)
                    .view(-1, 1)
                    .expand(-1, llm_grid_h * llm_grid_w)
                    .flatten()
                )
                h_index = (
                    torch.arange(llm_grid_h)
                    .view(1, -1, 1)
                    .expand(llm_grid_t, -1, llm_grid_w)
                    .flatten()
                )
                w_index = (
                    torch.arange(llm_grid_w)
                    .view(1, 1, -1)
                    .expand(llm_grid_t, llm_grid_h, -1)
                    .flatten()
                )
                llm_pos_ids_list.append(
                    torch.stack([t_index, h_index, w_index]) + text_len + st_idx
                )
                st = ed + llm_grid_t * llm_grid_h * llm_grid_w

            if st < len(input_tokens):
                st_idx = llm_pos_ids_list[-1].max() + 1 if len(llm_pos_ids_list) > 0 else 0
                text_len = len(input_tokens) - st
                llm_pos_ids_list.append(torch.arange(text_len).view(1, -1).expand(3, -1) + st_idx)

            llm_positions = torch.cat(llm_pos_ids_list, dim=1).reshape(3, -1)
            position_ids[..., i, attention_mask[i] == 1] = llm_positions.to(position_ids.device)
            mrope_position_deltas.append(llm_positions.max() + 1 - len(total_input_ids[i]))
        mrope_position_deltas = torch.tensor(
            mrope_position_deltas, device=input_ids.device
        ).unsqueeze(1)
        return position_ids, mrope_position_deltas
    else:
        if attention_mask is not None:
            position_ids = attention_mask.long().cumsum(-1) - 1
            position_ids.masked_fill_(attention_mask == 0, 1)
            position_ids = position_ids.unsqueeze(0).expand(3, -1, -1).to(attention_mask.device)
            max_position_ids = position_ids.max(0, keepdim=False)[0].max(-1, keepdim=True)[0]
            mrope_position_deltas = max_position_ids + 1 - attention_mask.shape[-1]
        else:
            position_ids = (
                torch.arange(input_ids.shape[1], device=input_ids.device)
                .view(1, 1, -1)
                .expand(3, input_ids.shape[0], -1)
            )
            mrope_position_deltas = torch.zeros(
                [input_ids.shape[0], 1],
                device=input_ids.device,
                dtype=input_ids.dtype,
            )

        return position_ids, mrope_position_deltas


def get_rope_index_25(
    spatial_merge_size: Optional[int] = 2,
    input_ids: Optional[torch.LongTensor] = None,
    image_grid_thw: Optional[torch.LongTensor] = None,
    video_grid_thw: Optional[torch.LongTensor] = None,
    second_per_grid_ts: Optional[torch.Tensor] = None,
    attention_mask: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """
    Calculate the 3D rope index based on image and video's temporal, height and width in LLM.

    Explanation:
        Each embedding sequence contains vision embedding and text embedding or just contains text embedding.

        For pure text embedding sequence, the rotary position embedding has no difference with modern LLMs.
        Examples:
            input_ids: [T T T T T], here T is for text.
            temporal position_ids: [0, 1, 2, 3, 4]
            height position_ids: [0, 1, 2, 3, 4]
            width position_ids: [0, 1, 2, 3, 4]

        For vision and text embedding sequence, we calculate 3D rotary position embedding for vision part
        and 1D rotary position embedding for text part.
        Examples:
            Temporal (Time): 3 patches, representing different segments of the video in time.
            Height: 2 patches, dividing each frame vertically.
            Width: 2 patches, dividing each frame horizontally.
            We also have some important parameters:
            fps (Frames Per Second): The video's frame rate, set to 1. This means one frame is processed each second.
            tokens_per_second: This is a crucial parameter. It dictates how many "time-steps" or "temporal tokens" are conceptually packed into a one-second interval of the video. In this case, we have 25 tokens per second. So each second of the video will be represented with 25 separate time points. It essentially defines the temporal granularity.
            temporal_patch_size: The number of frames that compose one temporal patch. Here, it's 2 frames.
            interval: The step size for the temporal position IDs, calculated as tokens_per_second * temporal_patch_size / fps. In this case, 25 * 2 / 1 = 50. This means that each temporal patch will be have a difference of 50 in the temporal position IDs.
            input_ids: [V V V V V V V V V V V V T T T T T], here V is for vision.
            vision temporal position_ids: [0, 0, 0, 0, 50, 50, 50, 50, 100, 100, 100, 100]
            vision height position_ids: [0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1]
            vision width position_ids: [0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1]
            text temporal position_ids: [101, 102, 103, 104, 105]
            text height position_ids: [101, 102, 103, 104, 105]
            text width position_ids: [101, 102, 103, 104, 105]
            Here we calculate the text start position_ids as the max vision position_ids plus 1.

    Args:
        input_ids (`torch.LongTensor` of shape `(batch_size, sequence_length)`):
            Indices of input sequence tokens in the vocabulary. Padding will be ignored by default should you provide
            it.
        image_grid_thw (`torch.LongTensor` of shape `(num_images, 3)`, *optional*):
            The temporal, height and width of feature shape of each image in LLM.
        video_grid_thw (`torch.LongTensor` of shape `(num_videos, 3)`, *optional*):
            The temporal, height and width of feature shape of each video in LLM.
        second_per_grid_ts (`torch.Tensor` of shape `(num_videos)`, *optional*):
            The time interval (in seconds) for each grid along the temporal dimension in the 3D position IDs.
        attention_mask (`torch.Tensor` of shape `(batch_size, sequence_length)`, *optional*):
            Mask to avoid performing attention on padding token indices. Mask values selected in `[0, 1]`:

            - 1 for tokens that are **not masked**,
            - 0 for tokens that are **masked**.

    Returns:
        position_ids (`torch.LongTensor` of shape `(3, batch_size, sequence_length)`)
        mrope_position_deltas (`torch.Tensor` of shape `(batch_size)`)
    """
    image_token_id = 151655
    video_token_id = 151656
    vision_start_token_id = 151652
    mrope_position_deltas = []
    if input_ids is not None and (image_grid_thw is not None or video_grid_thw is not None):
        total_input_ids = input_ids
        if attention_mask is None:
            attention_mask = torch.ones_like(total_input_ids)
        position_ids = torch.ones(
            3,
            input_ids.shape[0],
            input_ids.shape[1],
            dtype=input_ids.dtype,
            device=input_ids.device,
        )
        image_index, video_index = 0, 0
        attention_mask = attention_mask.to(total_input_ids.device)
        for i, input_ids in enumerate(total_input_ids):
            input_ids = input_ids[attention_mask[i] == 1]
            image_nums, video_nums = 0, 0
            vision_start_indices = torch.argwhere(input_ids == vision_start_token_id).squeeze(1)
            vision_tokens = input_ids[vision_start_indices + 1]
            image_nums = (vision_tokens == image_token_id).sum()
            video_nums = (vision_tokens == video_token_id).sum()
            input_tokens = input_ids.tolist()
            llm_pos_ids_list: list = []
            st = 0
            remain_images, remain_videos = image_nums, video_nums
            for _ in range(image_nums + video_nums):
                if image_token_id in input_tokens and remain_images > 0:
                    ed_image = input_tokens.index(image_token_id, st)
                else:
                    ed_image = len(input_tokens) + 1
                if video_token_id in input_tokens and remain_videos > 0:
                    ed_video = input_tokens.index(video_token_id, st)
                else:
                    ed_video = len(input_tokens) + 1
                if ed_image < ed_video:
                    t, h, w = (
                        image_grid_thw[image_index][0],
                        image_grid_thw[image_index][1],
                        image_grid_thw[image_index][2],
                    )
                    second_per_grid_t = 0
                    image_index += 1
                    remain_images -= 1
                    ed = ed_image

                else:
                    t, h, w = (
                        video_grid_thw[video_index][0],
                        video_grid_thw[video_index][1],
                        video_grid_thw[video_index][2],
                    )
                    if second_per_grid_ts is not None:
                        second_per_grid_t = second_per_grid_ts[video_index]
                    else:
                        second_per_grid_t = 1.0
                    video_index += 1
                    remain_videos -= 1
                    ed = ed_video
                llm_grid_t, llm_grid_h, llm_grid_w = (
                    t.item(),
                    h.item() // spatial_merge_size,
                    w.item() // spatial_merge_size,
                )
                text_len = ed - st

                st_idx = llm_pos_ids_list[-1].max() + 1 if len(llm_pos_ids_list) > 0 else 0
                llm_pos_ids_list.append(torch.arange(text_len).view(1, -1).expand(3, -1) + st_idx)

                range_tensor = torch.arange(llm_grid_t).view(-1, 1)
                expanded_range = range_tensor.expand(-1, llm_grid_h * llm_grid_w)

                time_tensor = expanded_range * second_per_grid_t * 2

                time_tensor_long = time_tensor.long()
                t_index = time_tensor_long.flatten()

                h_index = (
                    torch.arange(llm_grid_h)
                    .view(1, -1, 1)
                    .expand(llm_grid_t, -1, llm_grid_w)
                    .flatten()
                )
                w_index = (
                    torch.arange(llm_grid_w)
                    .view(1, 1, -1)
                    .expand(llm_grid_t, llm_grid_h, -1)
                    .flatten()
                )
                llm_pos_ids_list.append(
                    torch.stack([t_index, h_index, w_index]) + text_len + st_idx
                )
                st = ed + llm_grid_t * llm_grid_h * llm_grid_w

            if st < len(input_tokens):
                st_idx = llm_pos_ids_list[-1].max() + 1 if len(llm_pos_ids_list) > 0 else 0
                text_len = len(input_tokens) - st
                llm_pos_ids_list.append(torch.arange(text_len).view(1, -1).expand(3, -1) + st_idx)

            llm_positions = torch.cat(llm_pos_ids_list, dim=1).reshape(3, -1)
            position_ids[..., i, attention_mask[i] == 1] = llm_positions.to(position_ids.device)
            mrope_position_deltas.append(llm_positions.max() + 1 - len(total_input_ids[i]))
        mrope_position_deltas = torch.tensor(
            mrope_position_deltas, device=input_ids.device
        ).unsqueeze(1)
        return position_ids, mrope_position_deltas
    else:
        if attention_mask is not None:
            position_ids = attention_mask.long().cumsum(-1) - 1
            position_ids.masked_fill_(attention_mask == 0, 1)
            position_ids = position_ids.unsqueeze(0).expand(3, -1, -1).to(attention_mask.device)
            max_position_ids = position_ids.max(0, keepdim=False)[0].max(-1, keepdim=True)[0]
            mrope_position_deltas = max_position_ids + 1 - attention_mask.shape[-1]
        else:
            position_ids = (
                torch.arange(input_ids.shape[1], device=input_ids.device)
                .view(1, 1, -1)
                .expand(3, input_ids.shape[0], -1)
            )
            mrope_position_deltas = torch.zeros(
                [input_ids.shape[0], 1],
                device=input_ids.device,
                dtype=input_ids.dtype,
            )

        return position_ids, mrope_position_deltas


# ---- data_processor.py: LazySupervisedDataset._get_item (its __init__ left out: run() ---------
# ---- sets the attributes _get_item reads), pad_and_cat and both collators (unchanged) ----


class LazySupervisedDataset(Dataset):
    """Dataset for supervised fine-tuning."""

    def _get_item(self, sources) -> Dict[str, torch.Tensor]:
        data_dict = preprocess_qwen_visual(
            sources,
            self.processor,
        )

        seq_len = data_dict["input_ids"][0].size(0)

        if "image_grid_thw" in data_dict:
            grid_thw = data_dict.get("image_grid_thw")
            if not isinstance(grid_thw, Sequence):
                grid_thw = [grid_thw]
        else:
            grid_thw = None

        if "video_grid_thw" in data_dict:
            video_grid_thw = data_dict.get("video_grid_thw")
            if not isinstance(video_grid_thw, Sequence):
                video_grid_thw = [video_grid_thw]
            second_per_grid_ts = [
                self.processor.video_processor.temporal_patch_size
                / self.processor.video_processor.fps
            ] * len(video_grid_thw)
        else:
            video_grid_thw = None
            second_per_grid_ts = None

        position_ids, _ = self.get_rope_index(
            self.merge_size,
            data_dict["input_ids"],
            image_grid_thw=torch.cat(grid_thw, dim=0) if grid_thw else None,
            video_grid_thw=(torch.cat(video_grid_thw, dim=0) if video_grid_thw else None),
            second_per_grid_ts=second_per_grid_ts if second_per_grid_ts else None,
        )

        data_dict["position_ids"] = position_ids
        data_dict["attention_mask"] = [seq_len]

        text = self.processor.tokenizer.decode(  # noqa: F841 (unused there too)
            data_dict["input_ids"][0], skip_special_tokens=False
        )

        labels = data_dict["labels"][0]
        labels = [tid if tid != -100 else self.processor.tokenizer.pad_token_id for tid in labels]
        label = self.processor.tokenizer.decode(labels, skip_special_tokens=False)  # noqa: F841

        return data_dict

    def _get_packed_item(self, sources) -> Dict[str, torch.Tensor]:

        if isinstance(sources, dict):
            if isinstance(source, dict):  # noqa: F821 (undefined there too: __getitem__ never passes a dict)
                sources = [sources]
            assert len(sources) == 1, "Don't know why it is wrapped to a list"  # FIXME
            return self._get_item(sources)

        if isinstance(sources, list):
            data_list = []
            new_data_dict = {}
            for source in sources:
                if isinstance(source, dict):
                    source = [source]
                assert len(source) == 1, (
                    f"Don't know why it is wrapped to a list.\n {source}"
                )  # FIXME
                data_list.append(self._get_item(source))

            input_ids = torch.cat([d["input_ids"] for d in data_list], dim=1)
            labels = torch.cat([d["labels"] for d in data_list], dim=1)
            position_ids = torch.cat([d["position_ids"] for d in data_list], dim=2)
            attention_mask = [d["attention_mask"][0] for d in data_list if "attention_mask" in d]
            new_data_dict = {
                "input_ids": input_ids,
                "labels": labels,
                "position_ids": position_ids,
                "attention_mask": attention_mask if attention_mask else None,
            }

            if any("pixel_values" in d for d in data_list):
                new_data_dict.update(
                    {
                        "pixel_values": torch.cat(
                            [d["pixel_values"] for d in data_list if "pixel_values" in d],
                            dim=0,
                        ),
                        "image_grid_thw": torch.cat(
                            [d["image_grid_thw"] for d in data_list if "image_grid_thw" in d],
                            dim=0,
                        ),
                    }
                )

            if any("pixel_values_videos" in d for d in data_list):
                new_data_dict.update(
                    {
                        "pixel_values_videos": torch.cat(
                            [
                                d["pixel_values_videos"]
                                for d in data_list
                                if "pixel_values_videos" in d
                            ],
                            dim=0,
                        ),
                        "video_grid_thw": torch.cat(
                            [d["video_grid_thw"] for d in data_list if "video_grid_thw" in d],
                            dim=0,
                        ),
                    }
                )
            return new_data_dict


def pad_and_cat(tensor_list):
    max_length = max(tensor.shape[2] for tensor in tensor_list)

    padded_tensors = []
    for tensor in tensor_list:
        pad_length = max_length - tensor.shape[2]
        padded_tensor = torch.nn.functional.pad(tensor, (0, pad_length), "constant", 1)
        padded_tensors.append(padded_tensor)

    stacked_tensor = torch.cat(padded_tensors, dim=1)

    return stacked_tensor


@dataclass
class DataCollatorForSupervisedDataset(object):
    """Collate examples for supervised fine-tuning."""

    tokenizer: transformers.PreTrainedTokenizer

    def __call__(self, instances: Sequence[Dict]) -> Dict[str, torch.Tensor]:
        input_ids, labels, position_ids = tuple(
            [instance[key] for instance in instances]
            for key in ("input_ids", "labels", "position_ids")
        )
        input_ids = [ids.squeeze(0) for ids in input_ids]
        labels = [ids.squeeze(0) for ids in labels]
        input_ids = torch.nn.utils.rnn.pad_sequence(
            input_ids, batch_first=True, padding_value=self.tokenizer.pad_token_id
        )
        labels = torch.nn.utils.rnn.pad_sequence(
            labels, batch_first=True, padding_value=IGNORE_INDEX
        )
        position_ids = pad_and_cat(position_ids)
        input_ids = input_ids[:, : self.tokenizer.model_max_length]
        labels = labels[:, : self.tokenizer.model_max_length]
        position_ids = position_ids[:, :, : self.tokenizer.model_max_length]
        batch = dict(
            input_ids=input_ids,
            labels=labels,
            attention_mask=input_ids.ne(self.tokenizer.pad_token_id),
        )
        images = list(
            instance["pixel_values"] for instance in instances if "pixel_values" in instance
        )
        videos = list(
            instance["pixel_values_videos"]
            for instance in instances
            if "pixel_values_videos" in instance
        )
        if len(images) != 0:
            concat_images = torch.cat([image for image in images], dim=0)
            grid_thw = [
                instance["image_grid_thw"] for instance in instances if "image_grid_thw" in instance
            ]
            grid_thw = torch.cat(grid_thw, dim=0)
        else:
            concat_images = None
            grid_thw = None

        if len(videos) != 0:
            concat_videos = torch.cat([video for video in videos], dim=0)
            video_grid_thw = [
                instance["video_grid_thw"] for instance in instances if "video_grid_thw" in instance
            ]
            video_grid_thw = torch.cat(video_grid_thw, dim=0)
        else:
            concat_videos = None
            video_grid_thw = None

        batch["pixel_values"] = concat_images
        batch["image_grid_thw"] = grid_thw
        batch["pixel_values_videos"] = concat_videos
        batch["video_grid_thw"] = video_grid_thw
        batch["position_ids"] = position_ids
        return batch


@dataclass
class FlattenedDataCollatorForSupervisedDataset(DataCollatorForSupervisedDataset):
    """Collate examples into packed sequence with multi-modal support."""

    tokenizer: transformers.PreTrainedTokenizer

    def __call__(self, instances: Sequence[Dict]) -> Dict[str, torch.Tensor]:
        input_ids, labels, position_ids, attention_mask = tuple(
            [instance[key] for instance in instances]
            for key in ("input_ids", "labels", "position_ids", "attention_mask")
        )
        attention_mask = list(
            itertools.chain(
                *(
                    instance["attention_mask"]
                    for instance in instances
                    if "attention_mask" in instance
                )
            )
        )
        seq_lens = torch.tensor([0] + attention_mask, dtype=torch.int32)
        cumsum_seq_lens = torch.cumsum(seq_lens, dim=0, dtype=torch.int32)
        input_ids = torch.cat(input_ids, dim=1)
        labels = torch.cat(labels, dim=1)
        position_ids = torch.cat(position_ids, dim=2)

        batch = dict(
            input_ids=input_ids,
            labels=labels,
            attention_mask=cumsum_seq_lens,
            position_ids=position_ids,
        )
        images = list(
            instance["pixel_values"] for instance in instances if "pixel_values" in instance
        )
        videos = list(
            instance["pixel_values_videos"]
            for instance in instances
            if "pixel_values_videos" in instance
        )
        if len(images) != 0:
            concat_images = torch.cat([image for image in images], dim=0)
            grid_thw = [
                instance["image_grid_thw"] for instance in instances if "image_grid_thw" in instance
            ]
            grid_thw = torch.cat(grid_thw, dim=0)
        else:
            concat_images = None
            grid_thw = None

        if len(videos) != 0:
            concat_videos = torch.cat([video for video in videos], dim=0)
            video_grid_thw = [
                instance["video_grid_thw"] for instance in instances if "video_grid_thw" in instance
            ]
            video_grid_thw = torch.cat(video_grid_thw, dim=0)
        else:
            concat_videos = None
            video_grid_thw = None

        batch["pixel_values"] = concat_images
        batch["image_grid_thw"] = grid_thw
        batch["pixel_values_videos"] = concat_videos
        batch["video_grid_thw"] = video_grid_thw

        return batch


# ---- tools/pack_data.py: its token count and binpacking of records into packs -------------
# (its DataArguments renamed PackDataArguments; MultimodalProcessor without process_video,
# which needs torchcodec; the script part at its end is pack_tool() below)


class PackDataArguments:  # its DataArguments (renamed: argument.py's is above)
    def __init__(self):
        self.max_pixels = 2048 * 28 * 28
        self.min_pixels = 32 * 28 * 28
        self.video_max_frame_pixels = 576 * 28 * 28
        self.video_min_frame_pixels = 144 * 28 * 28
        self.base_interval = 4
        self.video_min_frames = 4
        self.video_max_frames = 8
        self.data_path = ''


class MultimodalProcessor:
    def __init__(self, data_args, base_processor, device='cpu'):
        self.data_args = data_args
        self.base_processor = base_processor
        self.device = device

    def _configure_processor(self, max_val, min_val):
        processor = deepcopy(self.base_processor)
        processor.max_pixels = max_val
        processor.min_pixels = min_val
        processor.size = {'longest_edge': max_val, 'shortest_edge': min_val}
        return processor

    def process_image(self, image_file):
        image_path = os.path.join(self.data_args.data_path, image_file)
        if not os.path.exists(image_path):
            print(f'Image file does not exist: {image_path}')
            return 0
        processor = self._configure_processor(self.data_args.max_pixels, self.data_args.min_pixels)
        image = Image.open(image_path).convert('RGB')
        visual_processed = processor.preprocess(images=image, return_tensors='pt')
        return visual_processed['image_grid_thw'].prod() // 4


def calculate_tokens(conversation, processor, tokenizer):
    total_tokens = 21
    roles = {'human': 'user', 'gpt': 'assistant'}
    for message in conversation['conversations']:
        role = message['from']
        text = message['value']
        conv = [{'role': roles[role], 'content': text}]
        encode_id = tokenizer.apply_chat_template(
            conv, return_tensors='pt', add_generation_prompt=False
        )[0]
        total_tokens += len(encode_id)
    if 'image' in conversation:
        images = (
            conversation['image']
            if isinstance(conversation['image'], list)
            else [conversation['image']]
        )
        for image_file in images:
            total_tokens += processor.process_image(image_file)
    elif 'video' in conversation:
        videos = (
            conversation['video']
            if isinstance(conversation['video'], list)
            else [conversation['video']]
        )
        for video_file in videos:
            total_tokens += processor.process_video(video_file)
    return total_tokens


def pack_data(data_list, pack_length):
    # Extract the length of each data item
    lengths = [data["num_tokens"] for data in data_list]
    grouped_indices = binpacking.to_constant_volume(
        list(enumerate(lengths)),  # Explicitly convert to list
        pack_length,
        weight_pos=1,
    )
    packed_data = []
    for group in grouped_indices:
        group_data = []
        for index, _ in group:
            new_data = data_list[index].copy()
            new_data.pop("num_tokens", None)
            group_data.append(new_data)
        packed_data.append(group_data)
    return packed_data


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


def _dataset(job, proc, args):
    """A LazySupervisedDataset with the attributes its __init__ sets (not run: it reads its
    data_list registry and the annotation files)."""
    ds = LazySupervisedDataset.__new__(LazySupervisedDataset)
    ds.processor = proc
    ds.tokenizer = proc.tokenizer
    ds.data_args = args
    ds.merge_size = getattr(proc.image_processor, "merge_size", 2)
    ds.get_rope_index = get_rope_index_3 if job["preset"] == "qwen3-vl" else get_rope_index_25
    return ds


def _batches(collator, item, n, mbs, keep_last, out):
    """item(i) for i < n, every mbs of them through collator, in order: batch b's tensors as
    b{b}_{key} (keys whose value is None left out); a last partial batch only if keep_last."""
    import numpy as np

    nb = (n + (mbs - 1 if keep_last else 0)) // mbs
    for b in range(nb):
        batch = collator([item(i) for i in range(b * mbs, min((b + 1) * mbs, n))])
        for k, v in batch.items():
            if v is not None:
                out[f"b{b}_{k}"] = v.numpy()
    out["batches"] = np.array(nb)


def flattened(job, proc, args, recs, out):
    """data_flatten=True: _get_item per record (the whole sample: its flattened collator cuts
    nothing), in file order (its Trainer's sequential sampler), every job["flatten"] of them
    through FlattenedDataCollatorForSupervisedDataset: batch b's tensors as b{b}_{key} (keys
    whose value is None left out).  A last partial batch is left out (mmloader's padded and
    flattened epochs end at the last full batch)."""
    ds = _dataset(job, proc, args)
    collator = FlattenedDataCollatorForSupervisedDataset(proc.tokenizer)
    for rec in recs:
        rec["data_path"] = job["data_path"]  # LazySupervisedDataset.__init__
    _batches(collator, lambda i: ds._get_item([recs[i]]), len(recs), job["flatten"], False, out)


def padded(job, proc, args, recs, out):
    """The padded batches its Trainer gets without data_flatten / data_packing: _get_item per
    record, in file order, every job["padded"] of them through DataCollatorForSupervisedDataset
    built as make_supervised_data_module builds it, on processor.tokenizer (whose
    model_max_length is the tokenizer folder's, as its AutoProcessor.from_pretrained leaves
    it: train_qwen.py gives training_args.model_max_length only to the Trainer's own
    tokenizer): batch b's tensors as b{b}_{key}.  The last partial batch is kept when
    job["keep_last"] (its Trainer's dataloader_drop_last=False)."""
    import numpy as np

    ds = _dataset(job, proc, args)
    collator = DataCollatorForSupervisedDataset(proc.tokenizer)
    for rec in recs:
        rec["data_path"] = job["data_path"]  # LazySupervisedDataset.__init__
    item = lambda i: ds._get_item([recs[i]])  # noqa: E731
    _batches(collator, item, len(recs), job["padded"], job.get("keep_last"), out)
    out["model_max_length"] = np.array(proc.tokenizer.model_max_length)


def packed(job, proc, args, entries, out):
    """data_packing=True: each entry of its packed annotation file (a list of records, or
    one record) as LazySupervisedDataset reads it (__init__ sets each record's data_path,
    __getitem__ wraps a dict in a list, item_fn is _get_packed_item), in file order, every
    job["packed"] of them through FlattenedDataCollatorForSupervisedDataset (the collator
    make_supervised_data_module picks for data_packing): batch b's tensors as b{b}_{key}.
    A last partial batch is left out unless job["keep_last"] (its Trainer keeps it)."""
    ds = _dataset(job, proc, args)
    ds.item_fn = ds._get_packed_item  # data_args.data_packing
    collator = FlattenedDataCollatorForSupervisedDataset(proc.tokenizer)
    for ann in entries:  # LazySupervisedDataset.__init__
        if isinstance(ann, list):
            for sub_ann in ann:
                sub_ann["data_path"] = job["data_path"]
        else:
            ann["data_path"] = job["data_path"]

    def item(i):
        sources = entries[i]
        if isinstance(sources, dict):  # __getitem__
            sources = [sources]
        return ds.item_fn(sources)

    _batches(collator, item, len(entries), job["packed"], job.get("keep_last"), out)


def pack_tool(job):
    """tools/pack_data.py's script over job["file"] (records with images or text only: its
    video count needs torchcodec): each record's num_tokens by calculate_tokens (its
    tokenizer with the chat template it sets, Qwen2VLImageProcessor with the tokenizer
    folder's defaults: the folder holds no preprocessor config), then pack_data over
    batches of 256 records with job["pack_length"]; the packs written to job["out"] as its
    json.dump does."""
    import json

    from transformers import AutoTokenizer, Qwen2VLImageProcessor

    data_args = PackDataArguments()
    data_args.data_path = job["data_path"]
    tokenizer = AutoTokenizer.from_pretrained(job["tokenizer"])
    tokenizer.chat_template = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"  # noqa: E501
    base_image_processor = Qwen2VLImageProcessor()
    processor = MultimodalProcessor(data_args, base_image_processor, device="cpu")
    with open(job["file"]) as f:
        data = json.load(f)
    data_with_tokens = []
    for item in data:
        item["num_tokens"] = calculate_tokens(item, processor, tokenizer)
        data_with_tokens.append(item)
    pack_length = job["pack_length"]
    batch_size = 256
    all_packed_results = []
    for i in range(0, len(data_with_tokens), batch_size):
        batch_data = data_with_tokens[i : i + batch_size]
        batch_packed_result = pack_data(batch_data, pack_length)
        all_packed_results.extend(batch_packed_result)
    with open(job["out"], "w", encoding="utf-8") as file:
        json.dump(all_packed_results, file, indent=2)


def run(job):
    """One file through Qwen's data path: per record ids_i, labels_i (cut), grid_i,
    pixels_i, vgrid_i, vpixels_i, spg_i (second_per_grid_ts), or err_i (the exception its
    code raises); with "flatten": N, its flattened batches of N records (flattened())."""
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
    # its collator is built on processor.tokenizer (make_supervised_data_module), whose
    # model_max_length is the tokenizer folder's: train_qwen.py gives
    # TrainingArguments.model_max_length only to the Trainer's own tokenizer
    n_max = job.get("model_max_length", proc.tokenizer.model_max_length)
    with open(job["file"]) as f:
        recs = json.load(f) if job["file"].endswith(".json") else [json.loads(x) for x in f]
    out = {}
    if job.get("flatten"):
        flattened(job, proc, args, recs, out)
        np.savez(job["out"], **out)
        return
    if job.get("padded"):
        padded(job, proc, args, recs, out)
        np.savez(job["out"], **out)
        return
    if job.get("packed"):
        packed(job, proc, args, recs, out)
        np.savez(job["out"], **out)
        return
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


def one(job):
    if job.get("pack_tool"):
        pack_tool(job)
    else:
        run(job)


def serve():
    """--serve (tests/refchild.py): one request a line, one reply a line on the stdout this
    started with; the reference's own prints go to stderr."""
    import json
    import os
    import sys
    import traceback

    reply = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    for line in sys.stdin:
        try:
            for job in json.loads(line)["jobs"]:
                one(job)
            answer = {"ok": True}
        except Exception:
            answer = {"ok": False, "error": traceback.format_exc()}
        reply.write(json.dumps(answer) + "\n")
        reply.flush()


def main():
    import json
    import sys

    if sys.argv[1:] == ["--serve"]:
        serve()
        return
    req = json.load(sys.stdin)
    for job in req["jobs"]:
        one(job)


if __name__ == "__main__":
    main()
