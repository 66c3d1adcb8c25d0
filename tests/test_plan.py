"""The global plan (max_tokens_per_batch, balance, group_by_length): token budgets are never
exceeded, batches are deterministic, DP ranks are disjoint, complete and in step, balance
brings the most loaded rank near the mean on a skewed mixture, and a checkpoint resumes
on another dp_size / micro_batch_size / token budget with no sample repeated or lost."""

import os

import pytest

import mmloader
from mmloader import ConfigError, Source, StateError
from mmloader.datagen import make_dataset
from mmloader._dpstate import restore_state_global
from conftest import as_np, same, take  # noqa: E402

TINY = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")
SMALL = dict(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 64)


@pytest.fixture(scope="module")
def srcs(tmp_path_factory):
    """A skewed mixture: many short text-only samples, fewer with images of varied size."""
    root = tmp_path_factory.mktemp("plan")
    text = make_dataset(
        str(root / "text"),
        n_samples=96,
        seed=21,
        n_shards=1,
        text_only_fraction=1.0,
        two_image_fraction=0.0,
    )
    img = make_dataset(
        str(root / "img"),
        n_samples=48,
        seed=22,
        n_shards=1,
        n_images=10,
        min_size=32,
        max_size=220,
        text_only_fraction=0.0,
        two_image_fraction=0.3,
    )
    return {"text": text["shards"], "img": img["shards"]}


def mix(srcs):
    return [Source(srcs["text"], name="text"), Source(srcs["img"], name="img")]


def make(data, **kw):
    args = dict(tokenizer=TINY, num_threads=1, prefetch=2, seed=7, **SMALL)
    args.update(kw)
    return mmloader.Loader(data, **args)


def rows(b):
    """One key per sample of a batch: its token ids."""
    ids = b["input_ids"]
    if "cu_seqlens" in b:
        cu = b["cu_seqlens"]
        return [tuple(ids[0, cu[i] : cu[i + 1]].tolist()) for i in range(len(cu) - 1)]
    lens = b["attention_mask"].sum(axis=1)
    return [tuple(ids[r, : int(lens[r])].tolist()) for r in range(ids.shape[0])]


def vision_tokens(b):
    g = b.get("image_grid_thw")
    return 0 if g is None else int((g[:, 0] * g[:, 1] * g[:, 2]).sum()) // 4


def everything(srcs):
    """Every sample of the mixture, once."""
    with make(mix(srcs), shuffle=False, micro_batch_size=1) as L:
        return [r for b in L for r in rows(as_np(b))]


def epoch(loader, limit=None):
    out = []
    for b in loader:
        out.append(as_np(b))
        if limit is not None and len(out) == limit:
            break
    return out


# ------------------------------------------------------------------------ token budgets


def test_budget_never_exceeded_dynamic_rows_deterministic(srcs):
    budget = 1024
    with make(mix(srcs), max_tokens_per_batch=budget) as L:
        ref = epoch(L)
        info = L._core().plan_info(0)
        assert len(ref) == info["steps"]
    shapes = {b["input_ids"].shape[0] for b in ref}
    assert len(shapes) > 2  # rows follow the lengths
    for b in ref:
        r, n = b["input_ids"].shape
        assert r * n <= budget
        assert n == b["attention_mask"].sum(axis=1).max()  # padded to the longest only
    keys = [k for b in ref for k in rows(b)]
    assert len(set(keys)) == len(keys) == info["end"]
    assert set(keys) <= set(everything(srcs))
    with make(mix(srcs), max_tokens_per_batch=budget, num_threads=3, prefetch=5) as L:
        same(ref, epoch(L))
    with make(mix(srcs), max_tokens_per_batch=budget, seed=8) as L:
        assert [k for b in epoch(L) for k in rows(b)] != keys  # a pure function of the seed


def test_sample_over_budget_is_skipped_with_reason(srcs):
    lengths = sorted(len(k) for k in everything(srcs))
    budget = lengths[-4]  # the three longest (if distinct) exceed it
    over = sum(n > budget for n in lengths)
    assert over >= 1
    with pytest.warns(UserWarning, match="left out of the plan, too long"):
        with make(mix(srcs), max_tokens_per_batch=budget) as L:
            got = epoch(L)
            st = L.stats()
    assert st["skipped_by_reason"].get("too_long") == over, st["skipped_by_reason"]
    assert got and all(b["input_ids"].size <= budget for b in got)


def test_contradictory_settings_raise(srcs):
    with pytest.raises(ConfigError, match="not both"):
        make(mix(srcs), micro_batch_size=4, max_tokens_per_batch=2048)
    with pytest.raises(ConfigError, match="pack_length"):
        make(mix(srcs), max_tokens_per_batch=2048, packing=True, pack_length=2048)


def test_group_by_length_sorts_windows(srcs):
    with make(mix(srcs), max_tokens_per_batch=2048, group_by_length=48) as L:
        got = epoch(L)
        assert len(L) == len(got)
    lens = [b["input_ids"].shape[1] for b in got]
    # within each window batches come longest first: few rises over the epoch
    rises = sum(b > a for a, b in zip(lens, lens[1:]))
    assert rises <= 3, lens
    with make(mix(srcs), max_tokens_per_batch=2048) as L:
        plain = epoch(L)
    pad = lambda bs: sum(b["input_ids"].size - b["attention_mask"].sum() for b in bs)  # noqa
    assert pad(got) < pad(plain)


# ----------------------------------------------------------------------------- DP ranks

CASES = {
    "budget": dict(max_tokens_per_batch=1024),
    "budget-balanced": dict(max_tokens_per_batch=1024, balance="vision_tokens", group_by_length=64),
    "rows-balanced": dict(micro_batch_size=3, balance="tokens"),
    "packed-balanced": dict(packing=True, pack_length=1024, balance="vision_tokens"),
}


def ranks(srcs, size, limit=None, **kw):
    loaders = [make(mix(srcs), dp_rank=r, dp_size=size, **kw) for r in range(size)]
    return loaders, [epoch(L, limit) for L in loaders]


@pytest.mark.parametrize("case", sorted(CASES))
def test_ranks_disjoint_complete_and_in_step(srcs, case):
    loaders, got = ranks(srcs, 3, **CASES[case])
    info = loaders[0]._core().plan_info(0)
    for L in loaders:
        L.close()
    assert {len(g) for g in got} == {info["steps"]}  # every rank one batch per step
    keys = [k for g in got for b in g for k in rows(b)]
    assert len(set(keys)) == len(keys) == info["end"]  # disjoint; the plan, complete
    assert info["usable"] - info["end"] < 3 * 3  # only a tail shorter than one step
    assert set(keys) <= set(everything(srcs))


def load_ratio(per_rank):
    """sum over steps of the most loaded rank's vision tokens / sum of the mean rank's;
    the epoch's last step (what is left, often one large image) is left out."""
    steps = list(zip(*per_rank))[:-1]
    mx = sum(max(vision_tokens(b) for b in s) for s in steps)
    mean = sum(sum(vision_tokens(b) for b in s) / len(s) for s in steps)
    return mx / mean


def test_balance_brings_the_max_rank_near_the_mean(srcs):
    kw = dict(packing=True, pack_length=2048)
    before = load_ratio(ranks(srcs, 4, **kw)[1])
    after = load_ratio(ranks(srcs, 4, balance="vision_tokens", **kw)[1])
    assert before > 1.2 and after < 1.1, (before, after)


# ------------------------------------------------------------------------------ resume


def test_exact_resume_same_config(srcs):
    kw = dict(max_tokens_per_batch=1024, balance="tokens", dp_rank=1, dp_size=2)
    with make(mix(srcs), **kw) as L:
        n = len(L)
        ref = take(L, 2 * n)
    pos = {}
    for cut in (0, 3, n - 1, n, n + 2):
        with make(mix(srcs), **kw) as L:
            take(L, cut)
            state = L.state_dict()
        assert state["plan_start"] == 0
        pos[cut] = state["plan_pos"]
        with make(mix(srcs), **kw) as L:
            L.load_state_dict(state)
            same(ref[cut:], take(L, 2 * n - cut))
    assert 0 == pos[0] < pos[3] < pos[n - 1]  # the global count grows with the batches taken


def delivered(per_rank):
    return [k for g in per_rank for b in g for k in rows(b)]


@pytest.mark.parametrize(
    "n, m, before, after",
    [
        (4, 2, dict(max_tokens_per_batch=1024), dict(max_tokens_per_batch=1024)),
        (2, 3, dict(max_tokens_per_batch=1024), dict(micro_batch_size=2, balance="tokens")),
        (
            8,
            1,
            dict(max_tokens_per_batch=768),
            dict(max_tokens_per_batch=2048, balance="vision_tokens"),
        ),
        (
            4,
            2,
            dict(packing=True, pack_length=1024, balance="tokens"),
            dict(packing=True, pack_length=1024, global_plan=True),
        ),
        (
            2,
            3,
            dict(packing=True, pack_length=1024, global_plan=True),
            dict(packing=True, pack_length=1024, balance="vision_tokens"),
        ),
        (
            3,
            2,
            dict(micro_batch_size=4, global_plan=True),
            dict(micro_batch_size=3, global_plan=True),
        ),
    ],
)
def test_elastic_resume_no_sample_repeated_or_lost(srcs, n, m, before, after):
    loaders, first = ranks(srcs, n, limit=2, **before)
    states = [L.state_dict() for L in loaders]
    for L in loaders:
        L.close()
    assert len({s["plan_pos"] for s in states}) == 1  # one global count on every rank
    new, rest = [], []
    for r in range(m):
        L = make(mix(srcs), dp_rank=r, dp_size=m, **after)
        restore_state_global(L, states)  # a list of n states on m ranks (Energon's way)
        new.append(L)
        rest.append(epoch(L))
    info = new[0]._core().plan_info(0)
    for L in new:
        L.close()
    assert info["q0"] == states[0]["plan_pos"] > 0
    keys = delivered(first) + delivered(rest)
    assert len(set(keys)) == len(keys)  # nothing repeated
    assert len(keys) == info["end"]  # nothing lost: all but the resumed plan's short tail
    assert info["usable"] - info["end"] < m * 2


def test_plan_state_checks(srcs):
    with make(mix(srcs), max_tokens_per_batch=1024, group_by_length=32) as L:
        next(iter(L))
        state = L.state_dict()
    with make(mix(srcs)) as L:  # no global plan
        with pytest.raises(StateError, match="with a global plan"):
            L.load_state_dict(state)
    with make(mix(srcs), max_tokens_per_batch=1024) as L:  # another length grouping
        with pytest.raises(StateError, match="group_by_length"):
            L.load_state_dict(state)
    with make(mix(srcs), max_tokens_per_batch=1024, group_by_length=32) as L:
        with pytest.raises(StateError, match="plan_start"):
            L.load_state_dict(dict(state, plan_start=10**6))


def test_late_decode_failure_keeps_ranks_in_step(srcs, tmp_path):
    """A sample whose image header is fine but whose data is corrupt passes planning and
    fails at decode: its planned batch goes out one sample short, the ranks stay in step."""
    import shutil

    img = tmp_path / "img"
    shutil.copytree(os.path.dirname(srcs["img"][0]), img)
    jpgs = sorted(p for p in (img / "images").iterdir() if p.suffix == ".jpg")
    bad = jpgs[0]
    data = bad.read_bytes()
    bad.write_bytes(data[: len(data) // 2])  # SOF intact, scan data cut
    shard = str(img / os.path.basename(srcs["img"][0]))
    users = sum(f"images/{bad.name}" in line for line in open(shard))
    assert users >= 1
    data = [Source(srcs["text"], name="text"), Source(shard, name="img")]
    got, skipped = [], 0
    for r in range(2):
        with make(data, dp_rank=r, dp_size=2, max_tokens_per_batch=1024) as L:
            info = L._core().plan_info(0)
            with pytest.warns(UserWarning, match="corrupt_image"):
                got.append(epoch(L))
            skipped += L.stats()["skipped_by_reason"].get("corrupt_image", 0)
    assert info["unusable"] == 0  # the headers planned fine
    assert len(got[0]) == len(got[1]) == info["steps"]
    keys = [k for g in got for b in g for k in rows(b)]
    assert len(set(keys)) == len(keys) == info["end"] - skipped
    assert skipped == users


def test_counts_from_the_index_skip_the_planning_pass(srcs, tmp_path):
    import shutil
    from mmloader import dsindex

    text, img = str(tmp_path / "text.jsonl"), str(tmp_path / "img.jsonl")  # distinct names
    shutil.copy(srcs["text"][0], text)
    shutil.copy(srcs["img"][0], img)
    data = [
        Source(text, name="text"),
        Source(img, name="img", image_root=os.path.dirname(srcs["img"][0])),
    ]
    out = str(tmp_path / "idx")
    dsindex.build(data, out=out, tokenizer=TINY, threads=2, **SMALL)
    kw = dict(max_tokens_per_batch=1024, balance="vision_tokens", dp_rank=1, dp_size=2)
    with make(data, index=out, **kw) as L:
        info = L._core().plan_info(0)
        got = epoch(L)
    assert info["measured"] == 0 and info["indexed"] == 144  # no planning pass
    with make(data, index=False, **kw) as L:
        assert L._core().plan_info(0)["measured"] == 144
        same(epoch(L), got)
