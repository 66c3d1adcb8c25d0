"""mmloader.Loader end to end: ordering and determinism, epochs and sharding, exact resume,
zero copy and buffer lifetime, per-sample errors, bad configuration, stats.
(Shutdown, signals and fork are in test_loader_lifecycle.py.)"""

import gc
import json
import os
import re
import warnings

import numpy as np
import pytest

import mmloader
from mmloader.datagen import make_dataset
from conftest import as_np, same, take  # noqa: E402

TINY = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")
SMALL = dict(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16)


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("ds"))
    return make_dataset(
        root, n_samples=40, seed=1, n_shards=2, n_images=12, min_size=32, max_size=160
    )


def make(data, **kw):
    args = dict(tokenizer=TINY, micro_batch_size=4, num_threads=2, prefetch=2, **SMALL)
    args.update(kw)
    return mmloader.Loader(data, **args)


def run_epoch(loader):
    return [as_np(b) for b in loader]


def row_keys(batches):
    """A key per sample: its token ids up to its length."""
    out = []
    for b in batches:
        ids, mask = b["input_ids"], b["attention_mask"]
        for r in range(ids.shape[0]):
            out.append(tuple(ids[r, : int(mask[r].sum())].tolist()))
    return out


def test_one_epoch_shapes_and_stop(ds):
    with make(ds["shards"], shuffle=False) as L:
        assert len(L) == 10
        batches = run_epoch(L)
        assert len(batches) == 10
        b = batches[0]
        for k in ("input_ids", "labels", "attention_mask", "pixel_values", "image_grid_thw"):
            assert k in b, sorted(b)
        assert b["input_ids"].dtype == np.int64 and b["input_ids"].shape[0] == 4
        assert b["labels"].shape == b["input_ids"].shape
        assert b["pixel_values"].dtype == np.float32 and b["pixel_values"].shape[1] == 1176
        # StopIteration once, then the next epoch
        second = run_epoch(L)
        assert len(second) == 10
        same(batches, second)  # shuffle=False: every epoch is the same


def test_same_batches_whatever_threads_and_prefetch(ds):
    ref = None
    for threads, prefetch, window in ((1, 1, None), (2, 4, None), (3, 2, 5), (8, 1, None)):
        with make(ds["shards"], num_threads=threads, prefetch=prefetch, window=window, seed=7) as L:
            got = run_epoch(L) + run_epoch(L)
            assert len(L) > 0 and len(got) == 2 * len(L), (len(got), len(L))  # two full epochs
        if ref is None:
            ref = got
        else:
            same(ref, got)


def test_epochs_reshuffle_and_seed(ds):
    with make(ds["shards"], seed=3) as L:
        e0, e1 = row_keys(run_epoch(L)), row_keys(run_epoch(L))
    with make(ds["shards"], seed=4) as L:
        other = row_keys(run_epoch(L))
    assert sorted(e0) == sorted(e1)  # same samples (40 = 10 full batches)
    assert e0 != e1
    assert e0 != other


def test_dp_ranks_disjoint_equal_and_cover(ds):
    keys = []
    for r in range(3):
        with make(ds["shards"], dp_rank=r, dp_size=3, micro_batch_size=2, seed=5) as L:
            assert len(L) == 40 // 3 // 2
            keys.append(row_keys(run_epoch(L)))
    assert len({len(k) for k in keys}) == 1
    flat = [k for ks in keys for k in ks]
    assert len(set(flat)) == len(flat)  # disjoint
    with make(ds["shards"], shuffle=False, micro_batch_size=1) as L:
        everything = set(row_keys(run_epoch(L)))
    assert set(flat) <= everything


@pytest.mark.parametrize("cut", [0, 1, 4, 9, 10, 11, 15])
def test_exact_resume(ds, cut, tmp_path):
    torch = pytest.importorskip("torch")
    with make(ds["shards"], seed=11) as L:
        ref = run_epoch(L) + run_epoch(L)  # 20 batches over 2 epochs
    with make(ds["shards"], seed=11) as L:
        got = take(L, cut)
        state = L.state_dict()
    torch.save(state, tmp_path / "s.pt")
    state = torch.load(tmp_path / "s.pt", weights_only=True)
    with make(ds["shards"], seed=11, num_threads=1) as R:
        R.load_state_dict(state)
        rest = take(R, 20 - cut)
        assert R.state_dict()["epoch"] == 1
    same(ref, got + rest)


def test_resume_right_after_restore_and_on_a_running_loader(ds):
    with make(ds["shards"], seed=2) as L:
        ref = run_epoch(L)
    with make(ds["shards"], seed=2) as L:
        for _ in range(3):
            next(L)
        s3 = L.state_dict()
        for _ in range(4):
            next(L)  # prefetching runs ahead; restore must drop it
        L.load_state_dict(s3)
        again = L.state_dict()
        assert again == s3  # state straight after a restore
        L.load_state_dict(again)
        same(ref[3:], [as_np(b) for b in L])


def test_state_mismatch_raises(ds, tmp_path):
    with make(ds["shards"], seed=1) as L:
        next(L)
        state = L.state_dict()
    assert json.loads(json.dumps(state)) == state  # plain ints and strings
    for kw, field in (
        (dict(seed=2), "seed"),
        (dict(micro_batch_size=2), "micro_batch_size"),
        (dict(dp_size=2), "dp_size"),
        (dict(data=ds["shards"][:1]), "data"),
    ):
        data = kw.pop("data", ds["shards"])
        with make(data, seed=kw.pop("seed", 1), **kw) as R:
            with pytest.raises(mmloader.StateError, match=field):
                R.load_state_dict(state)
    with make(ds["shards"], seed=1, tokenizer=mmloader.Tokenizer.tiny()) as R:
        R.load_state_dict(state)  # the same tokenizer given as an object
    with make(ds["shards"], seed=1) as R:
        with pytest.raises(mmloader.StateError):
            R.load_state_dict({"version": 99})
        bad = dict(state, pos=10**9)
        R.load_state_dict(dict(state))  # fine
        with pytest.raises(mmloader.StateError):
            R.load_state_dict(dict(bad, batch_in_epoch=10**6))


def test_zero_copy_and_lifetime(ds):
    torch = pytest.importorskip("torch")
    L = make(ds["shards"], seed=9)
    batch = next(L)
    t = batch["pixel_values"]
    tt = torch.from_dlpack(t)
    assert tt.data_ptr() == t.data_ptr
    ids = torch.from_dlpack(batch["input_ids"])
    assert ids.data_ptr() == batch["input_ids"].data_ptr
    arr = t.numpy()
    assert arr.__array_interface__["data"][0] == t.data_ptr
    v = np.from_dlpack(batch["labels"])
    assert v.__array_interface__["data"][0] == batch["labels"].data_ptr
    snap = tt.clone(), ids.clone()
    versioned = t.__dlpack__(max_version=(1, 0))
    assert "dltensor_versioned" in repr(versioned)
    del versioned  # unconsumed capsule: its destructor frees it
    for _ in range(12):  # beyond prefetch: buffers must not be reused under our views
        next(L, None)
    del batch, t
    assert torch.equal(tt, snap[0]) and torch.equal(ids, snap[1])
    L.close()
    assert torch.equal(tt, snap[0])
    del L
    gc.collect()
    assert torch.equal(tt, snap[0]) and torch.equal(ids, snap[1])
    assert float(arr.sum()) == float(snap[0].numpy().sum())


def test_tensor_api(ds):
    with make(ds["shards"]) as L:
        b = next(L)
    t = b["input_ids"]
    assert isinstance(t, mmloader.Tensor)
    assert t.dtype == "int64" and t.ndim == 2 and len(t) == 4
    assert t.nbytes == t.shape[0] * t.shape[1] * 8
    assert t.__dlpack_device__() == (1, 0)
    assert "mmloader.Tensor" in repr(t)
    with pytest.raises(BufferError):
        t.__dlpack__(dl_device=(2, 0))
    with pytest.raises(TypeError):
        mmloader.Tensor()


def write_bad_dataset(root, good_image):
    """Seven records: 3 good, then one of each failure, in a known order."""
    os.makedirs(root, exist_ok=True)
    with open(good_image, "rb") as f:
        jpeg = f.read()
    with open(os.path.join(root, "good.jpg"), "wb") as f:
        f.write(jpeg)
    with open(os.path.join(root, "truncated.jpg"), "wb") as f:
        f.write(jpeg[: len(jpeg) // 3])
    with open(os.path.join(root, "garbage.png"), "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)

    def rec(img, text="<image>\nWhat is this?"):
        r = {
            "messages": [
                {"role": "user", "content": text},
                {"role": "assistant", "content": "A test image."},
            ]
        }
        if img is not None:
            r["images"] = img if isinstance(img, list) else [img]
        return json.dumps(r)

    lines = [
        rec("good.jpg"),
        "{not json",
        rec("missing.jpg"),
        rec("truncated.jpg"),
        rec(["good.jpg", "good.jpg"]),
        rec("garbage.png"),
        rec("good.jpg"),
        "",
        rec(None, "no image here"),
        rec("good.jpg"),
    ]
    path = os.path.join(root, "bad.jsonl")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def first_jpeg(ds):
    return next(p for p in ds["images"] if p.endswith(".jpg"))


def test_errors_skipped_counted_and_warned(ds, tmp_path):
    path = write_bad_dataset(str(tmp_path), first_jpeg(ds))
    with pytest.warns(UserWarning) as rec:
        with make(path, micro_batch_size=1, shuffle=False, max_error_rate=1.0) as L:
            good = run_epoch(L)
            st = L.stats()
    # 9 samples; 4 good -> the padded epoch of 9 batches wraps to fill with good ones
    assert len(good) == 9
    # each bad record counted once: not again when filling the epoch wraps over it, and not
    # for the next epoch's prefetched samples (counts follow what the consumer received)
    want = {"bad_record": 1, "missing_file": 1, "corrupt_image": 2, "image_count_mismatch": 1}
    assert st["skipped_by_reason"] == want
    msgs = [str(w.message) for w in rec]
    assert any("bad.jsonl:2" in m and "bad_record" in m for m in msgs), msgs
    assert any("bad.jsonl:3" in m and "missing.jpg" in m and "missing_file" in m for m in msgs)
    assert any("bad.jsonl:4" in m and "truncated.jpg" in m and "corrupt_image" in m for m in msgs)
    assert any("bad.jsonl:5" in m and "image_count_mismatch" in m for m in msgs)


def test_errors_raise_in_order(ds, tmp_path):
    path = write_bad_dataset(str(tmp_path), first_jpeg(ds))
    with make(path, micro_batch_size=1, shuffle=False, on_error="raise") as L:
        next(L)  # line 1 is good
        with pytest.raises(mmloader.SampleError, match=r"bad\.jsonl:2"):
            next(L)
        with pytest.raises(mmloader.SampleError, match=r"bad\.jsonl:3.*missing\.jpg"):
            next(L)


def test_max_error_rate(tmp_path):
    lines = []
    for i in range(150):
        if i % 3 == 0:
            lines.append("{broken")
        else:
            lines.append(
                json.dumps(
                    {
                        "messages": [
                            {"role": "user", "content": f"q{i}"},
                            {"role": "assistant", "content": "a"},
                        ]
                    }
                )
            )
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with make(str(path), max_error_rate=0.1) as L:
            with pytest.raises(mmloader.Error, match="max_error_rate"):
                for _ in range(100):
                    next(L)
        with make(str(path), max_error_rate=0.5) as L:
            assert len(run_epoch(L)) == len(L)


@pytest.mark.parametrize(
    "kw",
    [
        dict(micro_batch_size=0),
        dict(on_error="ignore"),
        dict(dp_rank=2, dp_size=2),
        dict(preset="qwen9"),
        dict(packing=True),
        dict(max_error_rate=2.0),
        dict(keys="hf"),
        dict(num_threads=0),
        dict(prefetch=0),
        dict(min_pixels=10**9),
        dict(label_mode="x"),
        dict(micro_batch_size=1000),
        dict(tokenizer="/nonexistent/tokenizer.json"),
        dict(seq_length=0),
        dict(device="tpu"),
    ],
)
def test_bad_config(ds, kw):
    with pytest.raises(mmloader.ConfigError):
        make(ds["shards"], **kw)


def test_bad_data_paths(tmp_path):
    for data in (str(tmp_path / "none.jsonl"), str(tmp_path / "*.jsonl"), [], str(tmp_path)):
        with pytest.raises(mmloader.ConfigError):
            make(data)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(mmloader.ConfigError, match="no samples"):
        make(str(empty))


def test_data_forms(ds):
    root = ds["root"]
    with (
        make(os.path.join(root, "*.jsonl"), shuffle=False) as a,
        make(root, shuffle=False) as b,
        make(ds["shards"], shuffle=False) as c,
    ):
        same(run_epoch(a), run_epoch(b))
        assert a.state_dict()["fingerprint"] == c.state_dict()["fingerprint"]


def test_stats(ds):
    with make(ds["shards"]) as L:
        run_epoch(L)
        st = L.stats()
    assert 0.0 <= st["wait_time_ratio"] <= 1.0
    for k in (
        "read_s",
        "vision_s",
        "tokenize_s",
        "collate_s",
        "bytes_read",
        "images",
        "queue_depth",
        "samples",
        "skipped_by_reason",
        "packing_efficiency",
    ):
        assert k in st
    assert st["batches"] == 10 and st["samples"] >= 40 and st["images"] > 0
    assert st["bytes_read"] > 0 and st["vision_s"] > 0
    assert 0 < st["decode_s"] <= st["vision_s"]  # the decoder's part of the vision stage
    assert 0 < st["packing_efficiency"] <= 1
    # every key is documented where users look (help(Loader.stats)); a new one without a
    # line there fails here
    doc = " ".join((mmloader.Loader.stats.__doc__ or "").split())
    assert [k for k in st if not re.search(rf"\b{k}\b", doc)] == []


def test_packing(ds):
    with make(ds["shards"], packing=True, pack_length=2048, seed=3) as L:
        with pytest.raises(TypeError):
            len(L)
        a = run_epoch(L)
        assert a and all("cu_seqlens" in b for b in a)
        assert all(b["input_ids"].shape == (1, 2048) for b in a)
        total = sum(len(b["cu_seqlens"]) - 1 for b in a)
        assert total == 40
        st = L.stats()
        assert 0 < st["packing_efficiency"] <= 1
    with make(ds["shards"], packing=True, pack_length=2048, seed=3, num_threads=1) as L:
        same(a, run_epoch(L))


def test_cycle_never_stops(ds):
    with make(ds["shards"], cycle=True) as L:
        n = sum(1 for _, _ in zip(range(25), L))
        assert n == 25
        assert L.state_dict()["epoch"] == 2


def test_set_epoch(ds):
    with make(ds["shards"], seed=8) as L:
        run_epoch(L)
        e1 = run_epoch(L)
    with make(ds["shards"], seed=8) as L:
        L.set_epoch(1)
        same(e1, run_epoch(L))


def test_cli_help_names_every_command(capsys):
    from mmloader.__main__ import main

    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    # the description is the docstring's whole first sentence (it ended at "``python -m")
    assert "python -m mmloader index DATA..." in text and "python -m mmloader profile" in text


def test_demo_cli(tmp_path, capsys):
    from mmloader.__main__ import main

    out = str(tmp_path / "demo")
    assert (
        main(
            [
                "demo",
                "--samples",
                "16",
                "--out",
                out,
                "--num-threads",
                "2",
                "--max-pixels",
                str(28 * 28 * 16),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "wrote 16 samples" in text and "samples/s" in text and "busy seconds" in text
    assert "wait-time ratio" not in text  # with no trainer step a ratio says nothing
    assert (
        main(
            [
                "demo",
                "--samples",
                "16",
                "--out",
                out,
                "--num-threads",
                "1",
                "--max-pixels",
                str(28 * 28 * 16),
            ]
        )
        == 0
    )
    assert "using the dataset" in capsys.readouterr().out


def test_datagen_is_deterministic(tmp_path):
    a = make_dataset(str(tmp_path / "a"), n_samples=12, seed=5, n_images=8, max_size=96)
    b = make_dataset(str(tmp_path / "b"), n_samples=12, seed=5, n_images=8, max_size=96)
    for x, y in zip(a["shards"] + a["images"], b["shards"] + b["images"]):
        with open(x, "rb") as f, open(y, "rb") as g:
            assert f.read() == g.read()
    kinds = {os.path.splitext(p)[1] for p in a["images"]}
    assert kinds == {".jpg", ".png"}


def test_pin_memory_and_device_config(ds):
    with make(ds["shards"], pin_memory=True, seed=6) as L:
        a = run_epoch(L)
        assert L.stats()["pinned"] == mmloader._core.cuda_available()
    with make(ds["shards"], seed=6) as L:
        same(a, run_epoch(L))
    if not mmloader._core.cuda_available():
        with pytest.raises(mmloader.ConfigError, match="CUDA"):
            make(ds["shards"], device="cuda")


@pytest.mark.gpu
def test_device_batches_match_host(ds):
    torch = pytest.importorskip("torch")
    if not mmloader._core.cuda_available() or not torch.cuda.is_available():
        pytest.skip("needs CUDA (runtime and a GPU visible to torch)")
    with make(ds["shards"], seed=6) as L:
        ref = run_epoch(L)
    got = []
    with make(ds["shards"], seed=6, device="cuda:0", pin_memory=True) as L:
        for b in L:
            assert all(t.device == "cuda:0" for t in b.values())
            tt = {k: torch.from_dlpack(v) for k, v in b.items()}
            assert all(x.device.type == "cuda" for x in tt.values())
            assert tt["input_ids"].data_ptr() == b["input_ids"].data_ptr
            got.append({k: x.cpu().numpy() for k, x in tt.items()})
        assert L.stats()["device"] == "cuda:0"
    same(ref, got)


def test_text_only_vision(tmp_path):
    lines = [
        json.dumps(
            {
                "messages": [
                    {"role": "user", "content": f"question {i}"},
                    {"role": "assistant", "content": "answer"},
                ]
            }
        )
        for i in range(4)
    ]
    path = tmp_path / "text.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with make(str(path), text_only_vision="omit") as L:
        b = next(L)
        assert "pixel_values" not in b and "image_grid_thw" not in b
    with make(str(path)) as L:
        b = next(L)
        assert b["image_grid_thw"].numpy().tolist() == [[0, 0, 0]]
    with pytest.raises(mmloader.ConfigError):
        make(str(path), text_only_vision="none")


def test_image_root(ds, tmp_path):
    import shutil

    moved = []
    for s in ds["shards"]:
        moved.append(str(tmp_path / os.path.basename(s)))
        shutil.copy(s, moved[-1])
    with make(ds["shards"], seed=12) as L:
        ref = run_epoch(L)
    with make(moved, seed=12, image_root=ds["root"]) as L:
        same(ref, run_epoch(L))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with make(moved, seed=12) as L:  # images are not beside the shards
            with pytest.raises(mmloader.Error, match="max_error_rate"):
                run_epoch(L)


def test_max_length_skips_too_long(ds):
    with make(ds["shards"], shuffle=False, micro_batch_size=1) as L:
        lengths = sorted(int(b["attention_mask"].sum()) for b in run_epoch(L))
    limit = lengths[len(lengths) // 2]
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        with make(
            ds["shards"], shuffle=False, micro_batch_size=1, max_length=limit, max_error_rate=1.0
        ) as L:
            got = run_epoch(L)
            st = L.stats()
    assert len(got) == 40  # the epoch is filled with the samples that fit
    assert all(int(b["attention_mask"].sum()) <= limit for b in got)
    assert st["skipped_by_reason"].get("too_long", 0) >= sum(n > limit for n in lengths)
    assert any("too_long" in str(w.message) for w in rec)
