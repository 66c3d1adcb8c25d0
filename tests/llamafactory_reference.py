"""LLaMA-Factory's own data path, run inside its venv (scripts/setup-llamafactory.sh) as a
subprocess of tests/test_recipe_llamafactory.py: nothing here re-implements it.

Reads one JSON request on stdin ({"jobs": [requests]} runs several in one start; with
--serve, one request a line, for tests/refchild.py):
  {"dataset_dir": LLaMA-Factory's data/ folder (its dataset_info.json),
   "datasets": [names in dataset_info.json], "template": "qwen2_vl" | "qwen3_vl_nothink" |
   "qwen3_vl", "tokenizer": folder, "preset": "qwen2.5-vl" | "qwen3-vl",
   "data_args": {cutoff_len, mask_history, train_on_prompt, enable_thinking, ...},
   "model_args": {image_max_pixels, image_min_pixels, ...}, "limit": n per dataset,
   "out": path.npz}
and for each example: its dataset converter (data/converter.py), then
SupervisedDatasetProcessor._encode_data_example (template, mm_plugin.process_messages,
infer_seqlen truncation, labels), then mm_plugin.get_mm_inputs for the pixels and grids.
Writes per example i: ids_i, labels_i, and (with images) pixels_i, grid_i; plus "names"
(dataset/index per example) and "dropped" (examples LLaMA-Factory drops).  The processor
is the checkpoints' (PIL image backend, as the suite's other references), built from
the tokenizer folder without a model download.
"""

import json
import sys

import numpy as np


def processor(preset, tok):
    from transformers import Qwen2_5_VLProcessor, Qwen3VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    if preset == "qwen3-vl":
        ip = Qwen2VLImageProcessorPil(
            patch_size=16,
            min_pixels=65536,
            max_pixels=16777216,
            image_mean=[0.5] * 3,
            image_std=[0.5] * 3,
        )
        vp = Qwen3VLVideoProcessor(size={"shortest_edge": 4096, "longest_edge": 25165824})
        return Qwen3VLProcessor(image_processor=ip, tokenizer=tok, video_processor=vp)
    ip = Qwen2VLImageProcessorPil(min_pixels=3136, max_pixels=12845056)
    vp = Qwen2VLVideoProcessor(min_pixels=3136, max_pixels=12845056)
    return Qwen2_5_VLProcessor(image_processor=ip, tokenizer=tok, video_processor=vp)


def serve():
    """--serve (tests/refchild.py): one request a line, one reply a line on the stdout this
    started with; LLaMA-Factory's own prints go to stderr."""
    import os
    import traceback

    reply = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    for line in sys.stdin:
        try:
            req = json.loads(line)
            answer = {"ok": True, "result": [run(job) for job in req.get("jobs", [req])]}
        except Exception:
            answer = {"ok": False, "error": traceback.format_exc()}
        reply.write(json.dumps(answer) + "\n")
        reply.flush()


def main():
    if sys.argv[1:] == ["--serve"]:
        serve()
        return
    req = json.load(sys.stdin)
    print(json.dumps([run(job) for job in req.get("jobs", [req])]))


def run(req):
    from transformers import AutoTokenizer

    from llamafactory.data.converter import get_dataset_converter
    from llamafactory.data.parser import get_dataset_list
    from llamafactory.data.processor.supervised import SupervisedDatasetProcessor
    from llamafactory.data.template import get_template_and_fix_tokenizer
    from llamafactory.hparams import DataArguments, ModelArguments
    from llamafactory.model.patcher import patch_processor

    tok = AutoTokenizer.from_pretrained(req["tokenizer"])
    data_args = DataArguments(
        template=req["template"], dataset_dir=req["dataset_dir"], **req.get("data_args", {})
    )
    model_args = ModelArguments(model_name_or_path="unused", **req.get("model_args", {}))
    template = get_template_and_fix_tokenizer(tok, data_args)
    proc = processor(req["preset"], tok)
    patch_processor(proc, tok, model_args)
    sp = SupervisedDatasetProcessor(
        template=template, tokenizer=tok, processor=proc, data_args=data_args
    )
    out, names, dropped = {}, [], []
    attrs = get_dataset_list(req["datasets"], req["dataset_dir"])
    for dname, attr in zip(req["datasets"], attrs):
        conv = get_dataset_converter(attr.formatting, attr, data_args)
        with open(f"{req['dataset_dir']}/{attr.dataset_name}", encoding="utf-8") as f:
            rows = json.load(f)
        cols = [
            getattr(attr, k)
            for k in ("prompt", "query", "response", "history", "messages", "system", "tools")
            + ("images", "videos", "audios")
            if getattr(attr, k, None)
        ]
        for j, row in enumerate(rows[: req.get("limit") or None]):
            ex = conv({c: row.get(c) for c in cols} | row)
            name = f"{dname}/{j}"
            if len(ex["_prompt"]) % 2 != 1 or len(ex["_response"]) != 1:
                dropped.append(name)  # supervised.py drops these
                continue
            images = ex["_images"] or []
            videos = ex["_videos"] or []
            ids, labels = sp._encode_data_example(
                prompt=ex["_prompt"],
                response=ex["_response"],
                system=ex["_system"],
                tools=ex["_tools"],
                images=images,
                videos=videos,
                audios=[],
            )
            i = len(names)
            names.append(name)
            out[f"ids_{i}"] = np.asarray(ids, np.int64)
            out[f"labels_{i}"] = np.asarray(labels, np.int64)
            if images or videos:
                mm = template.mm_plugin.get_mm_inputs(
                    images, videos, [], [len(images)], [len(videos)], [0], [ids], proc
                )
                if images:
                    out[f"pixels_{i}"] = mm["pixel_values"].numpy()
                    out[f"grid_{i}"] = mm["image_grid_thw"].numpy()
                if videos:
                    out[f"vpixels_{i}"] = mm["pixel_values_videos"].numpy()
                    out[f"vgrid_{i}"] = mm["video_grid_thw"].numpy()
    out["names"] = np.asarray(names)
    out["dropped"] = np.asarray(dropped)
    np.savez(req["out"], **out)
    return {"samples": len(names), "dropped": len(dropped)}


if __name__ == "__main__":
    main()
