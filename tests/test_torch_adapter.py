"""mmloader.torch.Loader: a DataLoader replacement yielding dict[str, torch.Tensor] through
DLPack (zero copy), len(), and StatefulDataLoader-style state saved with torch.save and read
back with torch.load(weights_only=True): bitwise resume mid-epoch, mid-pack and across an
epoch boundary."""

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import mmloader  # noqa: E402
import mmloader.torch as mt  # noqa: E402
from conftest import same  # noqa: E402

TINY = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")
SMALL = dict(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16)


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    from mmloader.datagen import make_dataset

    root = str(tmp_path_factory.mktemp("tds"))
    return make_dataset(
        root, n_samples=36, seed=2, n_shards=2, n_images=10, min_size=32, max_size=128
    )


def make(ds, cls=mt.Loader, **kw):
    args = dict(
        tokenizer=TINY, micro_batch_size=3, num_threads=2, prefetch=2, seq_length=384, **SMALL
    )
    args.update(kw)
    return cls(ds["shards"], **args)


def copy(batch):
    return {k: v.clone() for k, v in batch.items()}


def test_batches_are_torch_tensors_viewing_the_loader_buffers(ds):
    with (
        make(ds, shuffle=False) as L,
        make(
            ds,
            cls=mmloader.Loader,
            shuffle=False,
            text_only_vision="omit",
            mrope=True,
            mm_token_type_ids=True,
        ) as R,
    ):
        n = 0
        for b in L:
            raw = next(R)
            assert isinstance(b, dict) and all(isinstance(v, torch.Tensor) for v in b.values())
            assert sorted(b) == sorted(raw)
            for k, v in b.items():
                assert np.array_equal(v.numpy(), raw[k].numpy()), k
            view = mt.to_torch(raw)
            for k, v in view.items():  # zero copy: same memory as the mmloader.Tensor
                assert v.data_ptr() == raw[k].data_ptr, k
            n += 1
        assert n == len(L) == 36 // 3
        assert b["input_ids"].dtype == torch.int64 and b["labels"].dtype == torch.int64


def test_text_only_batches_omit_vision_keys_by_default(ds):
    with make(ds, micro_batch_size=1, shuffle=False) as L:
        keys = [set(b) for b in L]
    assert any("pixel_values" not in k for k in keys)  # the dataset has text-only records
    assert any("pixel_values" in k for k in keys)
    with make(ds, micro_batch_size=1, shuffle=False, text_only_vision="placeholder") as L:
        placed = [set(b) for b in L]
    assert len(placed) == len(keys) > 0
    assert all({"pixel_values", "image_grid_thw"} <= k for k in placed)


def test_len(ds):
    with make(ds) as L:
        assert len(L) == 12
    with make(ds, micro_batch_size=5) as L:
        assert len(L) == 36 // 5
    with make(ds, packing=True, pack_length=512, seq_length=None) as L:
        with pytest.raises(TypeError):
            len(L)


def test_epochs_like_a_dataloader(ds):
    with make(ds, seed=1) as L:
        e0 = [copy(b) for b in L]
        e1 = [copy(b) for b in L]
    assert len(e0) == len(e1) == 12
    assert any(not torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(e0, e1))


def _roundtrip(state, tmp_path):
    path = tmp_path / "state.pt"
    torch.save({"data": state}, path)
    return torch.load(path, weights_only=True)["data"]


@pytest.mark.parametrize("packing", [False, True])
@pytest.mark.parametrize("cut", [1, 5, 13])
def test_bitwise_resume(ds, tmp_path, packing, cut):
    """State taken after `cut` batches (for packing: mid-pack boundaries, where the sample
    that did not fit is carried into the next pack; cut 13 crosses the epoch end)."""
    kw = (
        dict(packing=True, pack_length=448, seq_length=None, cycle=True)
        if packing
        else dict(cycle=True)
    )
    with make(ds, **kw) as L:
        for _ in range(cut):
            next(L)
        state = _roundtrip(L.state_dict(), tmp_path)
        want = [copy(next(L)) for _ in range(20)]
    with make(ds, **kw) as R:
        R.load_state_dict(state)
        for w in want:
            same(next(R), w)


def test_resume_across_epoch_boundary_without_cycle(ds, tmp_path):
    with make(ds) as L:
        list(L)  # epoch 0
        state = _roundtrip(L.state_dict(), tmp_path)
        want = [copy(b) for b in L]  # epoch 1
    with make(ds) as R:
        R.load_state_dict(state)
        got = [copy(b) for b in R]
    assert len(got) == len(want) == 12
    for g, w in zip(got, want):
        same(g, w)


def test_state_mismatch_raises(ds):
    with make(ds) as L:
        state = L.state_dict()
    with make(ds, micro_batch_size=2) as R:
        with pytest.raises(mmloader.StateError):
            R.load_state_dict(state)


def test_packing_efficiency_in_stats(ds):
    # the packing tensors: Megatron keys (a Qwen-keys loader refuses packing_keys=True)
    with make(ds, packing=True, pack_length=512, seq_length=None, keys="megatron") as L:
        real = slots = 0
        for b in L:
            ids = b["tokens"] if "tokens" in b else b["input_ids"]
            cu = b["cu_seqlens"]
            real += int(cu[-1])
            slots += ids.numel()
        st = L.stats()
    assert 0 < st["packing_efficiency"] <= 1
    assert st["packing_efficiency"] == pytest.approx(real / slots)


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# shared/ lies beside the repository (CI) or further up (a worktree checkout)
QWEN_TOKENIZER = os.environ.get("MML_QWEN_TOKENIZER_DIR") or next(
    (
        p
        for p in (
            os.path.join(REPO_ROOT, *up, "shared", "data", "qwen3-tokenizer")
            for up in (("..",), ("..", ".."))
        )
        if os.path.exists(os.path.join(p, "tokenizer.json"))
    ),
    os.path.join(REPO_ROOT, "..", "shared", "data", "qwen3-tokenizer"),
)


@pytest.mark.parametrize("packing", [False, True])
def test_training_loop_with_a_real_qwen25_vl_model(ds, packing):
    """The loader replaces a DataLoader in a plain PyTorch loop: model(**batch) on a (tiny,
    random) Qwen2.5-VL with the real Qwen tokenizer, loss and gradients."""
    if not os.path.exists(os.path.join(QWEN_TOKENIZER, "tokenizer.json")):
        pytest.skip(f"the Qwen tokenizer is not at {QWEN_TOKENIZER}")
    transformers = pytest.importorskip("transformers")
    text = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=151936,
        rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0},
    )
    vision = dict(
        depth=1,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        out_hidden_size=32,
        spatial_merge_size=2,
        fullatt_block_indexes=[0],
    )
    model = transformers.Qwen2_5_VLForConditionalGeneration(
        transformers.Qwen2_5_VLConfig(text_config=text, vision_config=vision)
    )
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    kw = dict(packing=True, pack_length=384) if packing else {}
    with make(
        ds, tokenizer=QWEN_TOKENIZER, preset="qwen2.5-vl", micro_batch_size=2, seq_length=None, **kw
    ) as L:
        steps = 0
        for batch in L:
            if packing:
                assert batch["position_ids"].shape[0] == 4 and "attention_mask" not in batch
                assert "cu_seqlens" not in batch
            else:
                assert batch["position_ids"].shape[0] == 3
            out = model(**batch)  # the README loop: packed batches carry use_cache=False
            assert torch.isfinite(out.loss)
            out.loss.backward()
            opt.step()
            opt.zero_grad()
            steps += 1
            if steps == 2:
                break
