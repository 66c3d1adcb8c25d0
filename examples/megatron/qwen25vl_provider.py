"""Qwen2.5-VL supervised fine-tuning with Megatron-LM, mmloader as the external data loader.

This file is what a Megatron-LM training script for Qwen2.5-VL needs from mmloader: the
dataset provider, a forward step that turns mmloader batches into the model call, and the
``pretrain`` call.  The model comes from your Qwen2.5-VL implementation for Megatron-LM:
plug its ``model_provider`` in below.

    torchrun --nproc-per-node 8 examples/megatron/qwen25vl_provider.py \\
        --dataloader-save $CKPT/dataloader \\
        --save $CKPT --load $CKPT --micro-batch-size 1 --seq-length 8192 \\
        --mmloader-data 's3://bucket/sft/*.jsonl' \\
        --mmloader-model-dir /models/Qwen2.5-VL-7B-Instruct --mmloader-packing --mmloader-mrope \\
        ...  # model, optimizer and parallelism arguments as usual

``mmloader.megatron.pretrain`` registers the ``--mmloader-*`` flags and ``--dataloader-save``
(Megatron-LM's checkpointing reads it but defines no such flag), defaults
``--dataloader-type`` to ``external`` and calls the installed Megatron-LM's ``pretrain`` in
the form it has (megatron-core 0.18 / 0.19 or earlier).  With ``--dataloader-save``
Megatron stores each data-parallel rank's loader state next to the checkpoint and the
provider restores it on resume: the run continues with exactly the batch that would have
come next.
"""
from __future__ import annotations

from functools import partial
from typing import Optional

import torch

from mmloader import megatron as mml

# Reads the --mmloader-* flags when Megatron calls it (on every rank: is_distributed).
train_valid_test_datasets_provider = mml.make_provider()


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
    batch = mml.get_batch(data_iterator, vp_stage=vp_stage)
    if batch is None:  # a middle pipeline stage without packing
        return model(None, None, None), partial(loss_func, None)
    output = model(
        input_ids=batch["tokens"],                  # None on middle stages
        position_ids=batch["position_ids"],         # M-RoPE [3, B, L] with --mmloader-mrope
        attention_mask=batch["attention_mask"],     # None: causal (per sample when packed)
        labels=batch["labels"],                     # shifted, -100 where loss_mask == 0
        pixel_values=batch["pixel_values"],         # None for a text-only batch
        image_grid_thw=batch["image_grid_thw"],
        packed_seq_params=batch["packed_seq_params"],  # None unless --mmloader-packing
    )
    return output, partial(loss_func, batch["loss_mask"])


def model_provider(pre_process=True, post_process=True, vp_stage=None, **kwargs):
    """Replace with your Qwen2.5-VL model provider."""
    raise NotImplementedError("plug in the model_provider of your Megatron Qwen2.5-VL "
                              "implementation")


if __name__ == "__main__":
    from megatron.core.enums import ModelType

    mml.pretrain(train_valid_test_datasets_provider, model_provider,
                 ModelType.encoder_or_decoder, forward_step)
