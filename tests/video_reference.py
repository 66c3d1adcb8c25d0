"""Reference computations for tests/test_video*.py, run as a subprocess with the torchvision
stand-in (tests/tvshim) on PYTHONPATH, because PyPI's torchvision does not work beside the
CPU torch of the test environment (see tests/tvshim/torchvision/__init__.py).

Reads one JSON request on stdin, writes the result with numpy arrays to the .npz path the
request names (and small results as JSON on stdout).  Requests:
  {"op": "sample", "cases": [[ele, total_frames, fps], ...]}
      qwen-vl-utils 0.0.14's decord/torchcodec rule: calculate_video_frame_range,
      smart_nframes, torch.linspace(...).round(), sample_fps -> [{first, last, count, n,
      sample_fps, indices} | {"error": str}]
  {"op": "shape", "cases": [[ele_without_video, nframes, height, width, patch], ...]}
      fetch_video on a frame list of nframes synthetic frames of that size -> [[t, h, w]]
  {"op": "process", "preset": ..., "messages": [...], "text": ..., "tokenizer": path,
   "out": path.npz}
      qwen-vl-utils process_vision_info(return_video_metadata=True) + the transformers
      processor (do_sample_frames=False) on the chat text given, + get_rope_index -> npz;
      with "raw_images": true the images go to the processor as files decoded by PIL
      (convert("RGB")), not through fetch_image: the processor's resize alone, as mmloader
  {"op": "process_many", "items": [process requests]} (one interpreter start for all)
Video files are read by qwen-vl-utils' torchcodec reader logic with PyAV decoding the
frames (_read_video_pyav): neither torchcodec nor a working torchvision installs here.
With "reader": "torchvision" in a process request, qwen-vl-utils' own torchvision backend
(_read_video_torchvision) reads them instead, through the shim's torchvision.io.read_video
(torchvision's PyAV backend reproduced: tests/tvshim/torchvision/io.py).
"""

import json
import sys

import numpy as np
import torch


def sample(cases):
    from qwen_vl_utils import vision_process as q

    out = []
    for ele, total, fps in cases:
        try:
            first, last, count = q.calculate_video_frame_range(ele, total, fps)
            n = q.smart_nframes(ele, total_frames=count, video_fps=fps)
            idx = torch.linspace(first, last, n).round().long().tolist()
            out.append(
                dict(
                    first=first,
                    last=last,
                    count=count,
                    n=n,
                    indices=idx,
                    sample_fps=n / max(count, 1e-6) * fps,
                )
            )
        except (ValueError, AssertionError) as e:
            out.append(dict(error=str(e)))
    return out


def shape(cases):
    from PIL import Image
    from qwen_vl_utils import vision_process as q

    # only the size matters here: the video resize is replaced by an allocation (fetch_image's
    # per-frame Pillow resize still runs)
    q.transforms.functional.resize = lambda v, size, **k: torch.empty(*v.shape[:2], *size)
    Image.Image.resize = lambda im, size, *a, **k: Image.new("RGB", size)
    out = []
    for ele, n, h, w, patch in cases:
        im = Image.new("RGB", (w, h), (120, 30, 200))
        try:
            v = q.fetch_video(dict(ele, video=[im] * n), image_patch_size=patch)
            out.append(list(v.shape[:1]) + list(v.shape[2:]))
        except (ValueError, AssertionError) as e:
            out.append(dict(error=str(e)))
    return out


def _tokenizer(path):
    import os
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if os.path.isdir(path):
        return AutoTokenizer.from_pretrained(path)
    return PreTrainedTokenizerFast(
        tokenizer_file=path, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )


def _processor(preset, tok):
    from transformers import Qwen2_5_VLProcessor, Qwen3VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    if preset == "qwen3-vl":  # the checkpoint's processor configs
        ip = Qwen2VLImageProcessorPil(
            patch_size=16,
            min_pixels=65536,
            max_pixels=16777216,
            image_mean=[0.5] * 3,
            image_std=[0.5] * 3,
        )
        vp = Qwen3VLVideoProcessor(
            size={"shortest_edge": 4096, "longest_edge": 25165824}, cap_pixels_per_frame=False
        )
        return Qwen3VLProcessor(image_processor=ip, tokenizer=tok, video_processor=vp), 16
    ip = Qwen2VLImageProcessorPil(min_pixels=3136, max_pixels=12845056)
    vp = Qwen2VLVideoProcessor(min_pixels=3136, max_pixels=12845056, cap_pixels_per_frame=False)
    return Qwen2_5_VLProcessor(image_processor=ip, tokenizer=tok, video_processor=vp), 14


def _rope(preset, out):
    """transformers' get_rope_index on the processor's output (a stand-in self holding the
    config values it reads)."""
    import types
    from functools import partial

    if preset == "qwen3-vl":
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel as M
    else:
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel as M
    me = types.SimpleNamespace(
        config=types.SimpleNamespace(
            vision_config=types.SimpleNamespace(spatial_merge_size=2, tokens_per_second=2)
        )
    )
    me.get_vision_position_ids = partial(M.get_vision_position_ids, me)
    kw = {
        k: torch.as_tensor(out[k])
        for k in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts")
        if k in out
    }
    if preset == "qwen3-vl":
        kw.pop("second_per_grid_ts", None)
    pos, delta = M.get_rope_index(
        me, torch.as_tensor(out["input_ids"]), torch.as_tensor(out["mm_token_type_ids"]), **kw
    )
    return pos.numpy(), delta.numpy()


def _read_video_pyav(ele):
    """qwen-vl-utils' torchcodec reader (metadata.num_frames / average_fps, the frame range,
    smart_nframes, the linspace indices) with PyAV as the decoder: every frame decoded,
    to_ndarray(format="rgb24"), the indexed ones kept."""
    import av
    from qwen_vl_utils import vision_process as q

    path = ele["video"][7:] if ele["video"].startswith("file://") else ele["video"]
    with av.open(path) as c:
        s = c.streams.video[0]
        fps = float(s.average_rate)
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(s)]
    first, last, count = q.calculate_video_frame_range(ele, len(frames), fps)
    n = q.smart_nframes(ele, total_frames=count, video_fps=fps)
    idx = torch.linspace(first, last, n).round().long().tolist()
    video = torch.from_numpy(np.stack([frames[i] for i in idx])).permute(0, 3, 1, 2)
    meta = dict(fps=fps, frames_indices=idx, total_num_frames=count, video_backend="pyav")
    return video, meta, n / max(count, 1e-6) * fps


def process(req):
    from qwen_vl_utils import process_vision_info
    from qwen_vl_utils import vision_process as q

    q.VIDEO_READER_BACKENDS["pyav"] = _read_video_pyav  # video files: decoded by PyAV
    reader = req.get("reader", "pyav")  # or qwen-vl-utils' own "torchvision" backend
    q.get_video_reader_backend = lambda: reader

    preset = req["preset"]
    proc, patch = _processor(preset, _tokenizer(req["tokenizer"]))
    images, videos, kw = process_vision_info(
        req["messages"],
        return_video_kwargs=True,
        return_video_metadata=True,
        image_patch_size=patch,
    )
    if req.get("raw_images"):  # images as the processor alone takes them (mmloader's rule)
        from PIL import Image

        paths = [e["image"] for e in q.extract_vision_info(req["messages"]) if "image" in e]
        images = [Image.open(p).convert("RGB") for p in paths] or None
    vids, metas = (list(x) for x in zip(*videos)) if videos else (None, None)  # images only
    out = dict(
        proc(
            text=[req["text"]],
            images=images,
            videos=vids,
            video_metadata=metas,
            return_tensors="np",
            **kw,
        )
    )
    out["position_ids"], out["rope_deltas"] = _rope(preset, out)
    if vids and len({tuple(v.shape) for v in vids}) == 1:  # stackable
        out["frames_after_qwen_vl_utils"] = np.stack([v.numpy() for v in vids])
    np.savez(req["out"], **{k: np.asarray(v) for k, v in out.items()})
    return sorted(out)


def main():
    req = json.load(sys.stdin)
    op = req["op"]
    if op == "sample":
        res = sample(req["cases"])
    elif op == "shape":
        res = shape(req["cases"])
    elif op == "process":
        res = process(req)
    elif op == "process_many":
        res = [process(r) for r in req["items"]]
    else:
        raise SystemExit(f"unknown op {op}")
    json.dump(res, sys.stdout)


if __name__ == "__main__":
    main()
