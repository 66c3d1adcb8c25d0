"""No silent wrong training with Hugging Face models (issue 28): packed batches of
mmloader.torch.Loader attend per sample with the model's default config (use_cache=True),
key sets that would not are refused; the defaults that would train on other data
(no tokenizer, ranks not told apart) are errors.  Tiny random-weight Qwen2-VL / Qwen2.5-VL
/ Qwen3-VL models built from transformers configs, with the real vocabulary and special
ids, and the real Qwen tokenizer."""

import json
import os
from typing import Dict

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import mmloader  # noqa: E402
import mmloader.torch as mt  # noqa: E402
from mmloader.datagen import make_dataset  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
QWEN_TOK = os.environ.get("MML_QWEN_TOKENIZER") or next(
    (
        p
        for p in (
            os.path.join(REPO_ROOT, *up, "shared", "data", "qwen3-tokenizer", "tokenizer.json")
            for up in ((".."), ("..", ".."))
        )
        if os.path.exists(p)
    ),
    os.path.join(REPO_ROOT, "..", "shared", "data", "qwen3-tokenizer", "tokenizer.json"),
)
TINY_TOK = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")
needs_qwen = pytest.mark.skipif(
    not os.path.exists(QWEN_TOK), reason=f"the real Qwen tokenizer is absent ({QWEN_TOK})"
)
SMALL = dict(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16)
FAMILIES = ("qwen2-vl", "qwen2.5-vl", "qwen3-vl")


def tiny_model(family, attn="sdpa", seed=0, tokenizer=None):
    """A tiny random-weight Qwen-VL ForConditionalGeneration, default config otherwise
    (use_cache=True), the real vocabulary and special ids.  ``tokenizer``: a tokenizer.json
    (mmloader's bundled tiny one) whose vocabulary and special ids the model takes instead,
    so that its logits are ~50x smaller than with Qwen's 151,936 ids."""
    text = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=151936,
        rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0},
    )
    ids = {}
    if tokenizer is not None:
        import json

        with open(tokenizer, encoding="utf-8") as f:
            tok = json.load(f)
        special = {t["content"]: t["id"] for t in tok["added_tokens"]}
        text["vocab_size"] = 1 + max([*tok["model"]["vocab"].values(), *special.values()])
        ids = dict(
            image_token_id=special["<|image_pad|>"],
            video_token_id=special["<|video_pad|>"],
            vision_start_token_id=special["<|vision_start|>"],
            vision_end_token_id=special["<|vision_end|>"],
        )
        text.update(
            bos_token_id=special["<|endoftext|>"],
            eos_token_id=special["<|im_end|>"],
            pad_token_id=special["<|endoftext|>"],
        )
    if family == "qwen2-vl":
        from transformers import Qwen2VLConfig as Config
        from transformers import Qwen2VLForConditionalGeneration as Model

        vision = dict(depth=1, embed_dim=32, hidden_size=32, num_heads=2, spatial_merge_size=2)
    elif family == "qwen3-vl":
        from transformers import Qwen3VLConfig as Config
        from transformers import Qwen3VLForConditionalGeneration as Model

        text = dict(text, head_dim=16)
        text["rope_parameters"] = dict(text["rope_parameters"], mrope_interleaved=True)
        vision = dict(
            depth=1,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=32,
            spatial_merge_size=2,
            deepstack_visual_indexes=[0],
        )
    else:
        from transformers import Qwen2_5_VLConfig as Config
        from transformers import Qwen2_5_VLForConditionalGeneration as Model

        vision = dict(
            depth=1,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=32,
            spatial_merge_size=2,
            fullatt_block_indexes=[0],
        )
    torch.manual_seed(seed)
    cfg = Config(text_config=text, vision_config=vision, attn_implementation=attn, **ids)
    return Model(cfg)


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("hfds"))
    return make_dataset(
        root, n_samples=24, seed=3, n_shards=1, n_images=8, min_size=32, max_size=96
    )


def _segments(batch):
    """[(start, end)] of each sample of a packed [1, L] row: its text positions
    (position_ids[0]) count up from 0 and restart at the next sample."""
    p = batch["position_ids"][0, 0].tolist()
    starts = [i for i, v in enumerate(p) if v == 0] + [len(p)]
    return [(a, b) for a, b in zip(starts, starts[1:])]


def _special_ids(tokenizer: str) -> Dict[str, int]:
    with open(tokenizer, encoding="utf-8") as f:
        return {t["content"]: t["id"] for t in json.load(f)["added_tokens"]}


@pytest.mark.parametrize(
    "vocab", ["tiny", pytest.param("qwen", marks=[pytest.mark.slow, needs_qwen])]
)
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("family", FAMILIES)
def test_packed_batches_attend_per_sample_with_the_default_config(ds, family, attn, vocab):
    """model(**batch) of a packed batch, the model as configured by default (use_cache
    True), gives every sample the logits and loss it has alone (each sample run by itself
    with a plain attention mask).  Before issue 28 the cache made transformers skip the
    packed-sequence mask: logits off by ~0.3.

    By default the Loader and the model take mmloader's bundled tiny tokenizer (3,265 ids):
    what is checked is the attention between packed samples, which the vocabulary does not
    touch (the LM head maps each position alone), and Qwen's 151,936 ids made the logits
    and their comparison ~97% of the test's time (1024 x 151,936 floats a forward; ~30 s
    a case).  vocab="qwen" (@slow) runs the same with the real Qwen tokenizer and ids."""
    tok = TINY_TOK if vocab == "tiny" else QWEN_TOK
    special = _special_ids(tok)
    image_pad, text_pad = special["<|image_pad|>"], special["<|endoftext|>"]
    model = tiny_model(family, attn, tokenizer=tok if vocab == "tiny" else None).eval()
    preset = family
    with mt.Loader(
        ds["shards"],
        tokenizer=tok,
        preset=preset,
        packing=True,
        pack_length=1024,
        shuffle=False,
        num_threads=2,
        **SMALL,
    ) as L:
        batch = next(L)
        batch2 = next(L)
    for b in (batch, batch2):
        segs = _segments(b)
        assert len(segs) >= 2, "the test needs packs of several samples"
        with torch.no_grad():
            packed = model(**b)
        logits = packed.logits[0]
        ids = b["input_ids"][0]
        grids = b["image_grid_thw"].tolist() if "image_grid_thw" in b else []
        gi = row = 0
        loss_sum, n_lab = 0.0, 0
        for a, e in segs:
            n_img = int((ids[a:e] == image_pad).sum())
            kw = {}
            if n_img:
                mine = []
                while n_img > 0:
                    t, h, w = grids[gi]
                    mine.append(grids[gi])
                    n_img -= t * h * w // 4
                    gi += 1
                rows = sum(t * h * w for t, h, w in mine)
                kw = dict(
                    pixel_values=b["pixel_values"][row : row + rows],
                    image_grid_thw=torch.tensor(mine),
                )
                row += rows
            if (ids[a:e] != text_pad).sum() == 0:  # the pack's padding
                continue
            with torch.no_grad():
                alone = model(
                    input_ids=ids[None, a:e],
                    attention_mask=torch.ones((1, e - a), dtype=torch.long),
                    position_ids=b["position_ids"][1:, :, a:e],
                    mm_token_type_ids=b["mm_token_type_ids"][:, a:e],
                    use_cache=False,
                    **kw,
                ).logits[0]
            torch.testing.assert_close(logits[a:e], alone, atol=2e-5, rtol=1e-4)
            lab = b["labels"][0, a + 1 : e]
            ok = lab != -100
            loss_sum += float(
                torch.nn.functional.cross_entropy(alone[:-1][ok].double(), lab[ok], reduction="sum")
            )
            n_lab += int(ok.sum())
        assert row == b["pixel_values"].shape[0] if grids else True
        assert n_lab > 0
        assert abs(float(packed.loss) - loss_sum / n_lab) < 1e-5


@pytest.mark.parametrize(
    "kw, why",
    [
        (dict(packing_keys=True), "vision tower"),
        (dict(mrope=False), "mrope=False"),
        (dict(attention_mask=True), "attention_mask=True"),
    ],
)
def test_packed_key_sets_a_model_misreads_are_refused(ds, kw, why):
    with pytest.raises(mmloader.ConfigError, match=why):
        mt.Loader(ds["shards"], tokenizer="tiny", packing=True, pack_length=1024, **kw)
    # the same keys for Megatron (keys="megatron") are its normal packed batches
    if "packing_keys" in kw:
        mt.Loader(
            ds["shards"], tokenizer="tiny", packing=True, pack_length=1024, keys="megatron", **kw
        ).close()


def test_packed_len_is_the_planned_pack_count(ds):
    """len() of a packed loader: the planning pass's count with global_plan=True (what a
    Trainer needs without max_steps); without a plan a TypeError that says so."""
    with mt.Loader(ds["shards"], tokenizer="tiny", packing=True, pack_length=512) as L:
        with pytest.raises(TypeError, match="global_plan=True"):
            len(L)
    with mt.Loader(
        ds["shards"], tokenizer="tiny", packing=True, pack_length=512, global_plan=True, **SMALL
    ) as L:
        n = len(L)
        assert n >= 2 and sum(1 for _ in L) == n
        assert len(L) == sum(1 for _ in L)  # the next epoch's


def test_no_tokenizer_is_a_config_error(ds, tmp_path):
    with pytest.raises(mmloader.ConfigError, match="no tokenizer"):
        mmloader.Loader(ds["shards"])
    with pytest.raises(mmloader.ConfigError, match="no tokenizer"):
        mt.Loader(ds["shards"])
    (tmp_path / "preprocessor_config.json").write_text("{}")
    with pytest.raises(mmloader.ConfigError, match="holds no tokenizer.json"):
        mmloader.Loader(ds["shards"], model_dir=str(tmp_path))
    # the bundled test tokenizer only by name
    with mmloader.Loader(ds["shards"], tokenizer="tiny", micro_batch_size=2) as L:
        assert L.tokenizer.vocab_size == mmloader.Tokenizer.tiny().vocab_size


def test_dp_rank_and_size_come_from_the_launcher(ds, monkeypatch):
    """RANK / WORLD_SIZE (torchrun, accelerate launch) set the data-parallel rank and size
    unless given; a dp_size that does not divide the world, or one of the two alone, is an
    error.  Before issue 28 every rank defaulted to 0 of 1: the same samples everywhere."""
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    kw = dict(tokenizer="tiny", micro_batch_size=2, shuffle=False, **SMALL)
    with mmloader.Loader(ds["shards"], **kw) as L1:
        assert (L1.dp_rank, L1.dp_size) == (1, 2)
        assert L1.samples_per_rank == ds["n_samples"] // 2
    with mmloader.Loader(ds["shards"], dp_rank=0, dp_size=1, **kw) as L:
        assert (L.dp_rank, L.dp_size) == (0, 1)  # given: as given (1 divides 2)
    with pytest.raises(mmloader.ConfigError, match="does not divide"):
        mmloader.Loader(ds["shards"], dp_rank=0, dp_size=3, **kw)
    with pytest.raises(mmloader.ConfigError, match="give both"):
        mmloader.Loader(ds["shards"], dp_rank=0, **kw)
    monkeypatch.setenv("RANK", "0")
    with mmloader.Loader(ds["shards"], **kw) as L0, mmloader.Loader(ds["shards"], **kw) as L0b:
        assert (L0.dp_rank, L0.dp_size) == (0, 2)
        assert L0b.state_dict() == L0.state_dict()


def _worker(rank, world, init, shards, out):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        with mmloader.Loader(
            shards, tokenizer="tiny", micro_batch_size=2, shuffle=False, num_threads=1, **SMALL
        ) as L:
            ids = [tuple(torch.from_dlpack(b["input_ids"])[0, :64].tolist()) for b in L]
            torch.save({"rank": (L.dp_rank, L.dp_size), "ids": ids}, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def test_dp_rank_and_size_come_from_torch_distributed(ds, tmp_path, monkeypatch):
    """Two processes of an initialised torch.distributed (gloo): each loader takes its rank
    and the world size, and the two read different samples."""
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    init = f"file://{tmp_path}/pg"
    out = str(tmp_path / "res")
    torch.multiprocessing.spawn(_worker, args=(2, init, ds["shards"], out), nprocs=2)
    r = [torch.load(f"{out}.{i}") for i in range(2)]
    assert [x["rank"] for x in r] == [(0, 2), (1, 2)]
    assert r[0]["ids"] and not set(r[0]["ids"]) & set(r[1]["ids"])


# ---- transformers.Trainer: exact resume with one line (mmloader.torch.TrainerCallback) ----


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("hfsmall"))
    return make_dataset(root, n_samples=8, seed=4, n_shards=1, n_images=4, min_size=32, max_size=64)


def _trainer(ds, out, callback=True, stop_at=None, seed=0):
    pytest.importorskip("accelerate")
    from transformers import Trainer, TrainerCallback, TrainingArguments

    model = tiny_model("qwen2.5-vl", "sdpa", seed=seed)
    # transformers 5.24's save_pretrained writes the legacy key names ("visual.*") that its
    # Trainer's resume then loads without the mapping (strict=False: weights silently not
    # restored); without a conversion the checkpoint keeps the model's own names
    model._weight_conversions = []
    loader = mt.Loader(
        ds["shards"], tokenizer=QWEN_TOK, micro_batch_size=2, seed=5, num_threads=2, **SMALL
    )
    losses = []
    model.register_forward_hook(lambda m, i, o: losses.append(o.loss.detach().clone()))

    class Stop(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == stop_at:
                control.should_training_stop = True

    args = TrainingArguments(
        output_dir=out,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        num_train_epochs=2,
        learning_rate=1e-3,
        save_strategy="steps" if stop_at else "no",
        save_steps=1,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        seed=seed,
        disable_tqdm=True,
    )
    cbs = ([mt.TrainerCallback(loader)] if callback else []) + [Stop()]
    trainer = Trainer(model=model, args=args, callbacks=cbs)
    trainer.get_train_dataloader = lambda: loader
    return trainer, losses, loader


@pytest.mark.slow
@needs_qwen
def test_trainer_resume_from_checkpoint_is_bitwise_exact(small, tmp_path):
    """A stock transformers.Trainer (gradient accumulation 2, two epochs of 2 steps) over
    mmloader.torch.Loader, stopped at step 3 and resumed from checkpoint-1 (in the middle
    of epoch 0) and from checkpoint-3 (in the middle of epoch 1) with other initial
    weights: the losses of the remaining steps and the final weights are bitwise those of
    the run never interrupted.  Before issue 28: AttributeError ('Loader' object has no
    attribute 'dataset') in accelerate's skip_first_batches."""
    ref, ref_losses, L = _trainer(small, str(tmp_path / "ref"))
    assert len(L) == 4
    ref.train()
    assert ref.state.global_step == 4 and len(ref_losses) == 8
    want = {k: v.clone() for k, v in ref.model.state_dict().items()}

    first, _, _ = _trainer(small, str(tmp_path / "run"), stop_at=3)
    first.train()
    assert first.state.global_step == 3
    for step in (1, 3):
        again, losses, _ = _trainer(small, str(tmp_path / f"again{step}"), seed=1)
        again.train(resume_from_checkpoint=str(tmp_path / "run" / f"checkpoint-{step}"))
        assert again.state.global_step == 4
        assert len(losses) == 8 - 2 * step  # two micro-batches a step
        for got, exp in zip(losses, ref_losses[2 * step :]):
            assert torch.equal(got, exp)
        for k, v in again.model.state_dict().items():
            assert torch.equal(v, want[k]), k


@pytest.mark.slow
@needs_qwen
def test_trainer_resume_without_the_callback_says_what_is_missing(small, tmp_path):
    first, _, _ = _trainer(small, str(tmp_path / "run"), stop_at=1, callback=False)
    first.train()
    ck = str(tmp_path / "run" / "checkpoint-1")
    again, _, _ = _trainer(small, str(tmp_path / "again"), callback=False)
    with pytest.raises(mmloader.StateError, match="TrainerCallback"):
        again.train(resume_from_checkpoint=ck)
    # with the callback but a checkpoint saved without it: refused, never a silent restart
    again, _, _ = _trainer(small, str(tmp_path / "again2"))
    with pytest.raises(mmloader.StateError, match="holds no mmloader state"):
        again.train(resume_from_checkpoint=ck)


def test_set_epoch_never_rewinds_a_restored_loader(ds):
    kw = dict(tokenizer="tiny", micro_batch_size=2, seed=1, num_threads=2, **SMALL)
    with mt.Loader(ds["shards"], **kw) as A:
        next(A), next(A)
        state = A.state_dict()
        want = next(A)["input_ids"].clone()
    with mt.Loader(ds["shards"], **kw) as B:
        B.load_state_dict(state)
        B.set_epoch(0)  # what Trainer does at the start of the resumed epoch
        assert torch.equal(next(B)["input_ids"], want)
        B.set_epoch(1)
        assert B.state_dict()["epoch"] == 1 and B.state_dict()["batch_in_epoch"] == 0
