"""Collation: M-RoPE position ids against transformers' Qwen2-VL / Qwen2.5-VL / Qwen3-VL
get_rope_index; padded and packed batches checked against transformers (loss, model outputs)
and against plain numpy references."""

import inspect
import random

import numpy as np
import pytest

from mmloader import _core

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

IMAGE_PAD, VISION_START, VISION_END = 151655, 151652, 151653


def _tiny_model(family):
    """A real (tiny) Qwen2-VL / Qwen2.5-VL / Qwen3-VL model: get_rope_index is the
    reference."""
    text = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=151936,
        rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0},
    )
    if family == "qwen2-vl":
        from transformers import Qwen2VLConfig as Config
        from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel as Model

        vision = dict(depth=1, embed_dim=32, hidden_size=32, num_heads=2, spatial_merge_size=2)
    elif family == "qwen3-vl":
        from transformers import Qwen3VLConfig as Config
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel as Model

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
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel as Model

        vision = dict(
            depth=1,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=32,
            spatial_merge_size=2,
            fullatt_block_indexes=[0],
        )
    cfg = Config(text_config=text, vision_config=vision)
    return Model(cfg).eval()


@pytest.fixture(scope="module", params=["qwen2-vl", "qwen2.5-vl", "qwen3-vl"])
def model(request):
    return _tiny_model(request.param)


def reference_rope(model, ids, grids, attention_mask=None):
    """transformers' positions [3, B, L] and deltas [B, 1] (handles the 4.x and 5.x signatures)."""
    params = inspect.signature(model.get_rope_index).parameters
    kw = dict(
        image_grid_thw=torch.tensor(grids, dtype=torch.long) if grids else None,
        attention_mask=attention_mask,
    )
    if "mm_token_type_ids" in params:
        kw["mm_token_type_ids"] = (ids == IMAGE_PAD).to(torch.int)
    with torch.no_grad():
        return model.get_rope_index(ids, **kw)


def random_sequence(rng, max_images=3):
    """Qwen-style text with image placeholders: text <vs> pads <ve> text ..."""
    ids, grids = [], []
    for _ in range(rng.randint(0, max_images)):
        ids += [rng.randint(0, 150000) for _ in range(rng.randint(0, 6))]
        t = rng.choice([1, 1, 1, 2])
        h, w = 2 * rng.randint(1, 8), 2 * rng.randint(1, 8)
        grids.append((t, h, w))
        ids += [VISION_START] + [IMAGE_PAD] * (t * h * w // 4) + [VISION_END]
    ids += [rng.randint(0, 150000) for _ in range(rng.randint(1, 8))]
    return ids, grids


def ours(ids, grids):
    raw, delta = _core._mrope_positions(ids, grids, 2, IMAGE_PAD)
    return np.frombuffer(raw, dtype=np.int64).reshape(3, len(ids)), delta


def test_mrope_matches_transformers(model):
    rng = random.Random(1234)
    for _ in range(40):
        ids, grids = random_sequence(rng)
        pos, delta = ours(ids, grids)
        ref, ref_delta = reference_rope(model, torch.tensor([ids]), grids)
        np.testing.assert_array_equal(pos, ref[:, 0].numpy())
        assert delta == int(ref_delta[0, 0])


def test_mrope_padded_batch_matches_transformers(model):
    """Right-padded rows with an attention mask: the real tokens' positions agree."""
    rng = random.Random(7)
    seqs = [random_sequence(rng) for _ in range(4)]
    L = max(len(s[0]) for s in seqs) + 3
    ids = torch.full((4, L), 151643, dtype=torch.long)
    mask = torch.zeros((4, L), dtype=torch.long)
    for r, (s, _) in enumerate(seqs):
        ids[r, : len(s)] = torch.tensor(s)
        mask[r, : len(s)] = 1
    grids = [g for _, gs in seqs for g in gs]
    ref, ref_delta = reference_rope(model, ids, grids, attention_mask=mask)
    for r, (s, g) in enumerate(seqs):
        pos, delta = ours(s, g)
        np.testing.assert_array_equal(pos, ref[:, r, : len(s)].numpy())
        assert delta == int(ref_delta[r, 0])


def test_mrope_rejects_inconsistent_grids():
    ids = [1, VISION_START] + [IMAGE_PAD] * 3 + [VISION_END]
    with pytest.raises(ValueError, match="image 0 needs 4"):
        _core._mrope_positions(ids, [(1, 4, 4)], 2, IMAGE_PAD)
    with pytest.raises(ValueError, match="grid"):
        _core._mrope_positions([1, 2], [(1, 2, 2)], 2, IMAGE_PAD)


# ---- batches built by the collator (the engine's fits/add/full/emit loop) ----------------

PAD_ID = 151643


def collate(samples, **cfg):
    """[(dict name -> numpy array, stats)] for the given samples."""
    cfg.setdefault("pixel_cols", 12)
    out = []
    for batch, stats in _core._collate(samples, cfg):
        out.append(({k: np.from_dlpack(v) for k, v in batch.items()}, stats))
    return out


def make_samples(rng, n, max_images=2, cols=12, supervised=0.5):
    samples = []
    for _ in range(n):
        ids, grids = random_sequence(rng, max_images)
        labels = [t if (rng.random() < supervised and t != IMAGE_PAD) else -100 for t in ids]
        s = dict(input_ids=ids, labels=labels, grids=grids)
        rows = sum(t * h * w for t, h, w in grids)
        if rows:
            s["pixel_values"] = np.arange(rows * cols, dtype=np.float32).reshape(
                rows, cols
            ) + 1000.0 * len(samples)
        samples.append(s)
    return samples


def test_padded_mrope_batch_matches_transformers(model):
    rng = random.Random(11)
    samples = make_samples(rng, 6)
    L = max(len(s["input_ids"]) for s in samples) + 5
    batches = collate(
        samples, micro_batch_size=3, seq_length=L, mrope=1, attention_mask=1, mm_token_type_ids=1
    )
    assert len(batches) == 2
    for batch, stats in batches:
        ids = torch.from_numpy(batch["input_ids"])
        mask = torch.from_numpy(batch["attention_mask"])
        grids = batch["image_grid_thw"]
        grids = [tuple(g) for g in grids.tolist() if g[0] > 0]
        ref, ref_delta = reference_rope(model, ids, grids, attention_mask=mask)
        pos = batch["position_ids"]
        assert pos.shape == (3, 3, L) and pos.dtype == np.int64
        m = batch["attention_mask"].astype(bool)
        np.testing.assert_array_equal(pos[:, m], ref.numpy()[:, m])
        np.testing.assert_array_equal(batch["rope_deltas"], ref_delta.numpy())
        np.testing.assert_array_equal(
            batch["mm_token_type_ids"], (batch["input_ids"] == IMAGE_PAD).astype(np.int64)
        )
        assert (pos[:, ~m] == 0).all()
        assert stats["real_tokens"] == int(m.sum()) and stats["token_slots"] == 3 * L


def _per_token_ce(logits, labels):
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(),
        labels.reshape(-1),
        ignore_index=-100,
        reduction="none",
    ).reshape(labels.shape)


def test_packed_hf_loss_equals_separate_samples():
    """transformers' causal-LM loss (which shifts inside) over a packed row equals the sum of
    the per-sample losses: no label crosses a sample boundary."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    rng = random.Random(5)
    samples = make_samples(rng, 12, max_images=1, supervised=0.8)
    for s in samples:
        s["labels"] = list(s["input_ids"])  # fully supervised: crossings would show
    V = 151936
    g = torch.Generator().manual_seed(0)
    batches = collate(samples, packing=True, pack_length=160, pad_to_multiple=8)
    assert len(batches) > 1
    k = 0
    for batch, stats in batches:
        ids, labels = batch["input_ids"], torch.from_numpy(batch["labels"])
        cu = batch["cu_seqlens"]
        assert ids.shape == (1, 160)
        logits = torch.randn(1, 160, 64, generator=g)
        logits_full = torch.zeros(1, 160, V)
        logits_full[..., :64] = logits
        packed = ForCausalLMLoss(logits_full, labels, V, num_items_in_batch=1)
        separate = 0.0
        for i in range(len(cu) - 1):
            s = samples[k]
            n = len(s["input_ids"])
            lo = int(cu[i])
            np.testing.assert_array_equal(ids[0, lo : lo + n], s["input_ids"])
            sl = torch.tensor(s["labels"])[None]
            separate = separate + ForCausalLMLoss(
                logits_full[:, lo : lo + n], sl, V, num_items_in_batch=1
            )
            k += 1
        torch.testing.assert_close(packed, separate)
    assert k == len(samples)


def test_packed_megatron_shifted_labels_and_masks():
    rng = random.Random(9)
    samples = make_samples(rng, 10, max_images=1, supervised=0.7)
    total_real = 0
    k = 0
    for batch, stats in collate(
        samples,
        packing=True,
        pack_length=128,
        pad_to_multiple=4,
        keys="megatron",
        shift_labels=1,
        attention_mask=1,
    ):
        assert set(batch) >= {
            "tokens",
            "labels",
            "loss_mask",
            "position_ids",
            "attention_mask",
            "cu_seqlens",
            "cu_seqlens_padded",
            "max_seqlen",
            "pixel_values",
            "image_grid_thw",
        }
        assert "input_ids" not in batch and "cu_seqlens_unpadded" not in batch
        tok, lab, lm = batch["tokens"][0], batch["labels"][0], batch["loss_mask"][0]
        # Megatron's names: cu_seqlens real, cu_seqlens_padded slots covering the row
        cuu, cup = batch["cu_seqlens"], batch["cu_seqlens_padded"]
        assert cuu.dtype == cup.dtype == batch["max_seqlen"].dtype == np.int32
        assert cup[-1] == 128 and batch["max_seqlen"][0] == np.diff(cup).max()
        assert (np.diff(cup)[:-1] % 4 == 0).all()
        # the slots without the tail padding after the last one
        cu = cup.copy()
        cu[-1] = cup[-2] + -(-(cuu[-1] - cuu[-2]) // 4) * 4
        np.testing.assert_array_equal(lm, (lab != -100).astype(np.float32))
        want_mask = np.ones((128, 128), dtype=bool)
        bounds = list(cu) + ([128] if cu[-1] < 128 else [])
        for i in range(len(bounds) - 1):
            s = samples[k] if i < len(cu) - 1 else None
            lo, hi = int(bounds[i]), int(bounds[i + 1])
            want_mask[lo:hi, lo:hi] = np.triu(np.ones((hi - lo, hi - lo), dtype=bool), 1)
            np.testing.assert_array_equal(batch["position_ids"][0, lo:hi], np.arange(hi - lo))
            if s is None:
                continue
            n = len(s["input_ids"])
            assert cuu[i + 1] - cuu[i] == n
            np.testing.assert_array_equal(tok[lo : lo + n], s["input_ids"])
            np.testing.assert_array_equal(lab[lo : lo + n - 1], s["labels"][1:])
            assert (lab[lo + n - 1 : hi] == -100).all()
            assert (tok[lo + n : hi] == PAD_ID).all()
            k += 1
        np.testing.assert_array_equal(batch["attention_mask"][0, 0], want_mask)
        total_real += stats["real_tokens"]
        assert stats["token_slots"] == 128
    assert k == len(samples)
    assert total_real == sum(len(s["input_ids"]) for s in samples)


def test_vision_tensors_concatenate_in_order():
    rng = random.Random(3)
    samples = make_samples(rng, 8, max_images=3)
    k = 0
    for batch, _ in collate(samples, micro_batch_size=4, text_only_vision="empty"):
        group = samples[k : k + 4]
        k += 4
        grids = [g for s in group for g in s["grids"]]
        assert batch["image_grid_thw"].dtype == np.int64
        np.testing.assert_array_equal(
            batch["image_grid_thw"].reshape(-1, 3), np.array(grids, dtype=np.int64).reshape(-1, 3)
        )
        px = [s["pixel_values"] for s in group if "pixel_values" in s]
        want = np.concatenate(px) if px else np.zeros((0, 12), np.float32)
        np.testing.assert_array_equal(batch["pixel_values"], want)
    assert k == len(samples)


@pytest.mark.parametrize("keys", ["qwen", "megatron"])
@pytest.mark.parametrize("pack", [0, 1])
def test_text_only_batches_have_no_zero_length_dimension(keys, pack):
    samples = [dict(input_ids=[1, 2, 3], labels=[1, 2, 3]), dict(input_ids=[4], labels=[4])]
    for mode in ("placeholder", "omit", "empty"):
        ((batch, _),) = collate(
            samples,
            micro_batch_size=2,
            seq_length=8,
            packing=pack,
            keys=keys,
            text_only_vision=mode,
            mrope=1,
            attention_mask=1,
        )
        if mode == "placeholder":
            assert batch["pixel_values"].shape == (1, 12)
            assert not batch["pixel_values"].any()
            np.testing.assert_array_equal(batch["image_grid_thw"], [[0, 0, 0]])
        elif mode == "omit":
            assert "pixel_values" not in batch and "image_grid_thw" not in batch
        else:
            assert batch["pixel_values"].shape == (0, 12)
            assert batch["image_grid_thw"].shape == (0, 3)
        for name, a in batch.items():
            if mode != "empty" or name not in ("pixel_values", "image_grid_thw"):
                assert 0 not in a.shape, (name, a.shape)
            assert a.ndim <= 4


def test_collate_errors():
    too_long = [dict(input_ids=list(range(9)), labels=list(range(9)))]
    with pytest.raises(mmloader_errors().SampleError, match="9 tokens exceeds seq_length 8"):
        collate(too_long, micro_batch_size=1, seq_length=8)
    with pytest.raises(
        mmloader_errors().SampleError,
        match=r"9 tokens \(16 padded to a multiple of 8\) exceeds pack_length 8",
    ):
        collate(
            [dict(input_ids=[1] * 9, labels=[1] * 9)],
            packing=True,
            pack_length=8,
            pad_to_multiple=8,
        )
    with pytest.raises(ValueError, match="ids but"):
        collate([dict(input_ids=[1, 2], labels=[1])])
    with pytest.raises(ValueError, match="pixel columns"):
        collate(
            [
                dict(
                    input_ids=[VISION_START, IMAGE_PAD, VISION_END],
                    labels=[-100] * 3,
                    grids=[(1, 2, 2)],
                    pixel_values=np.zeros((4, 5), np.float32),
                )
            ]
        )
    with pytest.raises(ValueError, match="not a multiple of pad_to_multiple"):
        collate([dict(input_ids=[1], labels=[1])], packing=True, pack_length=10, pad_to_multiple=4)


def mmloader_errors():
    import mmloader

    return mmloader


def test_packed_batch_runs_like_separate_samples_in_transformers():
    """A packed qwen-keys batch (position_ids [4, 1, L]: a text row that restarts per sample,
    then M-RoPE; no attention_mask) gives a real Qwen2.5-VL model the same hidden states for every
    sample as running each sample alone."""
    model = _tiny_model("qwen2.5-vl")
    rng = random.Random(4)
    samples = make_samples(rng, 5, max_images=2, cols=1176)
    assert any("pixel_values" in s for s in samples)
    L = sum(len(s["input_ids"]) for s in samples) + 7
    ((batch, _),) = _core._collate(
        samples, dict(packing=True, pack_length=L, mrope=1, mm_token_type_ids=1, pixel_cols=1176)
    )
    b = {k: torch.from_dlpack(v) for k, v in batch.items()}
    assert b["position_ids"].shape == (4, 1, L)
    cu = b["cu_seqlens"]
    with torch.no_grad():
        packed = model(
            input_ids=b["input_ids"],
            position_ids=b["position_ids"],
            pixel_values=b["pixel_values"],
            image_grid_thw=b["image_grid_thw"],
            mm_token_type_ids=b["mm_token_type_ids"],
            use_cache=False,
        ).last_hidden_state
        for i, s in enumerate(samples):
            ids = torch.tensor([s["input_ids"]])
            kw = {}
            if "pixel_values" in s:
                kw = dict(
                    pixel_values=torch.from_numpy(s["pixel_values"]),
                    image_grid_thw=torch.tensor(s["grids"]),
                )
            alone = model(
                input_ids=ids, mm_token_type_ids=(ids == IMAGE_PAD).int(), use_cache=False, **kw
            ).last_hidden_state
            lo = int(cu[i])
            torch.testing.assert_close(
                packed[:, lo : lo + ids.shape[1]], alone, rtol=1e-5, atol=1e-5
            )
