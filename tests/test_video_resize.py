"""torch's antialiased bicubic on float32 planes, reproduced in C (csrc/core/video/video_resize.c),
bitwise equal to torch.nn.functional.interpolate(mode="bicubic", antialias=True) — what
torchvision's resize of a video tensor calls (torchvision itself cannot be installed beside
the CPU torch here)."""

import random

import numpy as np
import pytest

from mmloader import _core

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("seed", range(3))
def test_resize_aa_bicubic_equals_torch(seed):
    rng = random.Random(seed)
    for _ in range(20):
        w, h = rng.randint(1, 300), rng.randint(1, 300)
        ow, oh = rng.randint(1, 400), rng.randint(1, 400)
        x = np.random.RandomState(rng.randrange(1 << 30)).randint(0, 256, (3, h, w))
        x = x.astype(np.float32)
        ref = torch.nn.functional.interpolate(
            torch.from_numpy(x)[None],
            size=[oh, ow],
            mode="bicubic",
            antialias=True,
            align_corners=False,
        )[0].numpy()
        got = np.frombuffer(
            _core.resize_aa_bicubic(x.tobytes(), 3, w, h, ow, oh), np.float32
        ).reshape(3, oh, ow)
        assert np.array_equal(ref, got), (w, h, ow, oh, float(np.abs(ref - got).max()))


@pytest.mark.parametrize("seed", range(2))
def test_resize_aa_bicubic_rounded_equals_torch(seed):
    """round=True: torchvision's resize of a uint8 video (float resize, then clamped to
    [0, 255] and rounded half to even), fused into the last pass."""
    rng = random.Random(100 + seed)
    for _ in range(20):
        w, h = rng.randint(1, 300), rng.randint(1, 300)
        ow, oh = rng.choice([w, rng.randint(1, 400)]), rng.choice([h, rng.randint(1, 400)])
        x = np.random.RandomState(rng.randrange(1 << 30)).randint(0, 256, (3, h, w))
        x = x.astype(np.float32)
        ref = torch.nn.functional.interpolate(
            torch.from_numpy(x)[None],
            size=[oh, ow],
            mode="bicubic",
            antialias=True,
            align_corners=False,
        )[0]
        ref = ref.clamp(0, 255).round().numpy()
        got = np.frombuffer(
            _core.resize_aa_bicubic(x.tobytes(), 3, w, h, ow, oh, True), np.float32
        ).reshape(3, oh, ow)
        assert np.array_equal(ref.view(np.int32), got.view(np.int32)), (w, h, ow, oh)


def test_resize_aa_bicubic_u8_equals_torch():
    """Native uint8 (int16 fixed-point weights at each axis's precision, video_resize_u8.c):
    what torchvision v2 runs on a uint8 video, i.e. on the PIL frames LLaMA-Factory hands
    transformers' video processors.  Real photos (tests/photos.py), shrunk, enlarged and
    stretched one axis at a time, and random sizes on noise."""
    import photos

    cases = []
    for im in photos.photos(320).values():
        a = np.ascontiguousarray(np.asarray(photos.rgb(im)).transpose(2, 0, 1))
        _, h, w = a.shape
        for oh, ow in [
            (h // 2 + 3, w // 3 + 1),
            (h + 17, w - 5),
            (h, w // 2),
            (h // 5, w),
            (28, 56),
        ]:
            cases.append((a, oh, ow))
    rng = random.Random(7)
    for _ in range(10):
        w, h = rng.randint(1, 200), rng.randint(1, 200)
        a = np.random.RandomState(rng.randrange(1 << 30)).randint(0, 256, (3, h, w), np.uint8)
        cases.append((a, rng.randint(1, 300), rng.randint(1, 300)))
    for a, oh, ow in cases:
        _, h, w = a.shape
        ref = torch.nn.functional.interpolate(
            torch.from_numpy(a)[None],
            size=[oh, ow],
            mode="bicubic",
            antialias=True,
            align_corners=False,
        )[0].numpy()
        got = np.frombuffer(_core.resize_aa_bicubic_u8(a.tobytes(), 3, w, h, ow, oh), np.uint8)
        assert np.array_equal(ref, got.reshape(3, oh, ow)), (w, h, ow, oh)
