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
  {"op": "process", "preset": ..., "messages": [...], "tokenizer": dir, "out": path.npz}
      qwen-vl-utils process_vision_info + the transformers processor on the chat text the
      caller renders (text given) -> npz of the processor's tensors + the text
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
            out.append(dict(first=first, last=last, count=count, n=n, indices=idx,
                            sample_fps=n / max(count, 1e-6) * fps))
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


def main():
    req = json.load(sys.stdin)
    op = req["op"]
    if op == "sample":
        res = sample(req["cases"])
    elif op == "shape":
        res = shape(req["cases"])
    else:
        raise SystemExit(f"unknown op {op}")
    json.dump(res, sys.stdout)


if __name__ == "__main__":
    main()
