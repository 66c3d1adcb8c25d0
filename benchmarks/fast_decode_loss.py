"""fast_decode's effect on training: the tiny random-weight Qwen2.5-VL of
tests/test_hf_training.py trained by transformers' Trainer (CPU, same seeds) on the photos
of bench_recipe_caps.py (3-12 MP JPEGs, capped at 200,704 pixels), once with the exact
path and once with fast_decode=True; prints both loss curves and their largest difference.

    python3 benchmarks/fast_decode_loss.py      # ~3-6 min on 2 cores; needs the Qwen tokenizer
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), os.path.join(os.path.dirname(HERE), "tests"), HERE]

import numpy as np  # noqa: E402

QUESTIONS = ["What is in the photo?", "Describe the image.", "What colour dominates?"]
ANSWERS = ["A photo of something.", "An object in a scene.", "Mostly grey."]


def losses(shard: str, fast: bool, out: str) -> list:
    import mmloader.torch as mt
    import test_hf_training as th
    from transformers import Trainer, TrainingArguments

    model = th.tiny_model("qwen2.5-vl", "sdpa", seed=0)
    loader = mt.Loader(
        shard,
        tokenizer=th.QWEN_TOK,
        micro_batch_size=2,
        seed=5,
        num_threads=2,
        max_pixels=200704,
        fast_decode=fast,
    )
    got: list = []
    model.register_forward_hook(lambda m, i, o: got.append(float(o.loss)))
    args = TrainingArguments(
        output_dir=out,
        per_device_train_batch_size=2,
        num_train_epochs=3,
        learning_rate=1e-3,
        save_strategy="no",
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, callbacks=[mt.TrainerCallback(loader)])
    trainer.get_train_dataloader = lambda: loader  # type: ignore[method-assign]
    trainer.train()
    loader.close()
    return got


def main() -> None:
    import torch
    import test_hf_training as th
    from bench_recipe_caps import make_photos

    if not os.path.exists(th.QWEN_TOK):
        sys.exit(f"the real Qwen tokenizer is absent ({th.QWEN_TOK})")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as root:
        shard = os.path.join(root, "train.jsonl")
        with open(shard, "w") as f:
            for i, data in enumerate(make_photos()):
                path = os.path.join(root, f"photo-{i:02d}.jpg")
                with open(path, "wb") as g:
                    g.write(data)
                msg = [
                    {"role": "user", "content": "<image>" + QUESTIONS[i % 3]},
                    {"role": "assistant", "content": ANSWERS[i % 3]},
                ]
                f.write(json.dumps({"messages": msg, "images": [path]}) + "\n")
        a = np.array(losses(shard, False, os.path.join(root, "exact")))
        b = np.array(losses(shard, True, os.path.join(root, "fast")))
    d = np.abs(a - b)
    print("exact:", np.round(a, 4).tolist())
    print("fast: ", np.round(b, 4).tolist())
    print(
        f"{len(a)} steps: max |loss difference| {d.max():.5f} (relative {(d / a).max():.1e}), "
        f"mean {d.mean():.5f}; mean loss exact {a.mean():.4f}, fast {b.mean():.4f}"
    )


if __name__ == "__main__":
    main()
