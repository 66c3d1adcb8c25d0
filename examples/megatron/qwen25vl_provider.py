"""Qwen2.5-VL supervised fine-tuning with Megatron-LM, mmloader as the external data loader.

This file is what a Megatron training script for Qwen2.5-VL needs from mmloader: a dataset
provider, the command-line arguments, and a forward step that turns mmloader batches into
the model call.  The model itself comes from your Qwen2.5-VL implementation for Megatron
(Megatron-Bridge, Pai-Megatron-Patch, or your own): plug its ``model_provider`` in below.

    torchrun --nproc-per-node 8 examples/megatron/qwen25vl_provider.py \\
        --dataloader-type external --dataloader-save $CKPT/dataloader \\
        --save $CKPT --load $CKPT --micro-batch-size 1 --seq-length 8192 \\
        --mmloader-data 's3://bucket/sft/*.jsonl' \\
        --mmloader-model-dir /models/Qwen2.5-VL-7B-Instruct --mmloader-packing \\
        ...  # model, optimizer and parallelism arguments as usual

Only tensor-parallel rank 0 of the first and last pipeline stages runs a loader; the other
tensor-parallel ranks receive each batch by broadcast (``mmloader.megatron.get_batch``).
With ``--dataloader-save`` Megatron stores each data-parallel rank's loader state next to
the checkpoint and the provider restores it on resume: the run continues with exactly the
batch that would have come next.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Dict, Optional

import torch

from mmloader.megatron import get_batch, make_provider


def add_mmloader_args(parser):
    """Megatron ``extra_args_provider``: the mmloader options."""
    g = parser.add_argument_group("mmloader")
    g.add_argument("--mmloader-data", nargs="+", required=True,
                   help="JSONL shards: paths, globs, folders, http(s):// or s3:// URLs")
    g.add_argument("--mmloader-valid-data", nargs="+", default=None)
    g.add_argument("--mmloader-model-dir", default=None,
                   help="checkpoint folder with tokenizer.json and preprocessor_config.json")
    g.add_argument("--mmloader-image-root", default=None)
    g.add_argument("--mmloader-packing", action="store_true",
                   help="pack samples into [1, seq_length] rows with cu_seqlens")
    g.add_argument("--mmloader-pad-to-multiple", type=int, default=None,
                   help="pad each packed sample to a multiple (2 * context parallel size)")
    g.add_argument("--mmloader-threads", type=int, default=None)
    g.add_argument("--mmloader-max-pixels", type=int, default=None)
    return parser


def mmloader_kwargs(args: Any) -> Dict[str, Any]:
    """mmloader.Loader arguments from Megatron's args."""
    kw: Dict[str, Any] = dict(
        data=args.mmloader_data, model_dir=args.mmloader_model_dir, preset="qwen2.5-vl",
        image_root=args.mmloader_image_root, packing=bool(args.mmloader_packing),
        mrope=True, keys="megatron", shift_labels=True, attention_mask=False)
    if args.mmloader_packing:
        kw["pack_length"] = args.seq_length
        kw["pad_to_multiple"] = args.mmloader_pad_to_multiple
    if args.mmloader_threads:
        kw["num_threads"] = args.mmloader_threads
    if args.mmloader_max_pixels:
        kw["max_pixels"] = args.mmloader_max_pixels
    return kw


def train_valid_test_datasets_provider(train_val_test_num_samples, vp_stage=None):
    """Megatron calls this on every rank (is_distributed); see mmloader.megatron."""
    from megatron.training import get_args

    args = get_args()
    valid = {"data": args.mmloader_valid_data} if args.mmloader_valid_data else None
    provider = make_provider(valid=valid, **mmloader_kwargs(args))
    return provider(train_val_test_num_samples, vp_stage)


train_valid_test_datasets_provider.is_distributed = True


def loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor):
    """Sum of the per-token losses where loss_mask is 1, and the token count (Megatron
    averages over the tokens of the global batch)."""
    losses = output_tensor.float().view(-1)
    mask = loss_mask.view(-1).float()
    loss = torch.sum(losses * mask)
    tokens = mask.sum().to(torch.int)
    return loss, tokens, {"lm loss": torch.stack([loss.detach(), tokens.detach().float()])}


def forward_step(data_iterator, model, vp_stage: Optional[int] = None):
    """One micro-batch: mmloader batch -> Qwen2.5-VL forward (argument names as in the
    Megatron-Bridge Qwen2.5-VL model; adapt them to your implementation)."""
    batch = get_batch(data_iterator, vp_stage=vp_stage)
    if batch is None:  # a middle pipeline stage: activations come from the previous stage
        return model(None, None, None), partial(loss_func, None)
    output = model(
        input_ids=batch["tokens"],
        position_ids=batch["position_ids"],         # M-RoPE [3, B, L]
        attention_mask=batch["attention_mask"],     # None: causal (or per-sample when packed)
        labels=batch["labels"],                     # shifted, -100 where loss_mask == 0
        pixel_values=batch["pixel_values"],         # None for a text-only batch
        image_grid_thw=batch["image_grid_thw"],
        packed_seq_params=batch["packed_seq_params"],  # None unless --mmloader-packing
    )
    return output, partial(loss_func, batch["loss_mask"])


def model_provider(pre_process=True, post_process=True, vp_stage=None, **kwargs):
    """Replace with your Qwen2.5-VL model provider."""
    raise NotImplementedError("plug in the model_provider of your Megatron Qwen2.5-VL "
                              "implementation (Megatron-Bridge, Pai-Megatron-Patch, ...)")


if __name__ == "__main__":
    from megatron.core.enums import ModelType
    from megatron.training import pretrain

    pretrain(train_valid_test_datasets_provider, model_provider,
             ModelType.encoder_or_decoder, forward_step,
             extra_args_provider=add_mmloader_args,
             args_defaults={"dataloader_type": "external"})
