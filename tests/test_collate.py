"""Collation: M-RoPE position ids against transformers' Qwen2-VL / Qwen2.5-VL get_rope_index."""
import inspect
import random

import numpy as np
import pytest

from mmloader import _core

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

IMAGE_PAD, VISION_START, VISION_END = 151655, 151652, 151653


def _tiny_model(family):
    """A real (tiny) Qwen2-VL / Qwen2.5-VL model: get_rope_index is the reference."""
    text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1, vocab_size=151936,
                rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3],
                                 "rope_theta": 10000.0})
    if family == "qwen2-vl":
        from transformers import Qwen2VLConfig as Config
        from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel as Model
        vision = dict(depth=1, embed_dim=32, hidden_size=32, num_heads=2, spatial_merge_size=2)
    else:
        from transformers import Qwen2_5_VLConfig as Config
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel as Model
        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=32,
                      spatial_merge_size=2, fullatt_block_indexes=[0])
    try:
        cfg = Config(text_config=text, vision_config=vision)
        return Model(cfg).eval()
    except Exception as e:  # pragma: no cover - depends on the installed transformers
        pytest.skip(f"cannot build a tiny {family} model with transformers "
                    f"{transformers.__version__}: {e}")


@pytest.fixture(scope="module", params=["qwen2-vl", "qwen2.5-vl"])
def model(request):
    return _tiny_model(request.param)


def reference_rope(model, ids, grids, attention_mask=None):
    """transformers' positions [3, B, L] and deltas [B, 1] (handles the 4.x and 5.x signatures)."""
    params = inspect.signature(model.get_rope_index).parameters
    kw = dict(image_grid_thw=torch.tensor(grids, dtype=torch.long) if grids else None,
              attention_mask=attention_mask)
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
        ids[r, :len(s)] = torch.tensor(s)
        mask[r, :len(s)] = 1
    grids = [g for _, gs in seqs for g in gs]
    ref, ref_delta = reference_rope(model, ids, grids, attention_mask=mask)
    for r, (s, g) in enumerate(seqs):
        pos, delta = ours(s, g)
        np.testing.assert_array_equal(pos, ref[:, r, :len(s)].numpy())
        assert delta == int(ref_delta[r, 0])


def test_mrope_rejects_inconsistent_grids():
    ids = [1, VISION_START] + [IMAGE_PAD] * 3 + [VISION_END]
    with pytest.raises(ValueError, match="image 0 needs 4"):
        _core._mrope_positions(ids, [(1, 4, 4)], 2, IMAGE_PAD)
    with pytest.raises(ValueError, match="grid"):
        _core._mrope_positions([1, 2], [(1, 2, 2)], 2, IMAGE_PAD)
