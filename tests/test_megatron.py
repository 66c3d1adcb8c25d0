"""mmloader.megatron with megatron-core installed from PyPI: the dataset provider (ranks,
sharding, resume from the state Megatron saves), RerunDataIterator, PackedSeqParams, and the
tensor-parallel broadcast of a batch between two processes (gloo)."""

import os
import socket
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from megatron.core import parallel_state  # noqa: E402
from megatron.core.packed_seq_params import PackedSeqParams  # noqa: E402
from megatron.core.rerun_state_machine import (  # noqa: E402
    RerunDataIterator,
    RerunMode,
    destroy_rerun_state_machine,
    initialize_rerun_state_machine,
)

import mmloader  # noqa: E402
from mmloader import _core  # noqa: E402
from mmloader.megatron import (  # noqa: E402
    add_arguments,
    get_batch,
    loader_kwargs_from_args,
    make_provider,
    packed_seq_params,
    state_path,
)
from conftest import same  # noqa: E402

TINY = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")
SMALL = dict(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16)


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    from mmloader.datagen import make_dataset

    root = str(tmp_path_factory.mktemp("mds"))
    return make_dataset(
        root, n_samples=48, seed=3, n_shards=2, n_images=10, min_size=32, max_size=128
    )


def kwargs(ds, **kw):
    args = dict(
        data=ds["shards"],
        tokenizer=TINY,
        num_threads=2,
        prefetch=2,
        micro_batch_size=2,
        seq_length=512,
        **SMALL,
    )
    args.update(kw)
    return args


def copy(batch):
    return {k: v.clone() for k, v in batch.items()}


# ---- the provider ---------------------------------------------------------------------


def test_provider_builds_megatron_style_loaders(ds):
    provider = make_provider(**kwargs(ds), valid={"shuffle": False}, resume=False)
    assert provider.is_distributed is True
    train, valid, test = provider([100, 10, 0], None)
    try:
        assert valid is not None and test is None
        b = next(train)
        assert isinstance(b["tokens"], torch.Tensor)
        assert {
            "tokens",
            "labels",
            "loss_mask",
            "position_ids",
            "pixel_values",
            "image_grid_thw",
        } <= set(b)
        assert "attention_mask" not in b  # off by default for Megatron
        assert b["tokens"].shape == (2, 512) and b["tokens"].dtype == torch.int64
        assert b["loss_mask"].dtype == torch.float32
        # shifted labels: label i is the target of token i, i.e. token i+1 where trained
        lab, tok = b["labels"], b["tokens"]
        trained = lab[:, :-1] != -100
        assert trained.any()
        assert torch.equal(lab[:, :-1][trained], tok[:, 1:][trained])
        # cycle: the train loader never stops at an epoch end
        for _ in range(2 * train.samples_per_rank // 2 + 3):
            next(train)
    finally:
        train.close()
        valid.close()


def _epoch_rows(ds, rank, size):
    """Each sample of one epoch of rank `rank` of `size`, as its token ids."""
    provider = make_provider(
        **kwargs(
            ds,
            cycle=False,
            micro_batch_size=1,
            seed=5,
            keys="qwen",
            shift_labels=False,
            attention_mask=True,
        ),
        dp_rank=rank,
        dp_size=size,
        resume=False,
    )
    train, _, _ = provider([0, 0, 0])
    with train:
        return [
            tuple(b["input_ids"][0, : int(b["attention_mask"][0].sum())].tolist()) for b in train
        ]


@pytest.mark.parametrize("size", [2, 4])
def test_dp_sharding(ds, size):
    """Ranks see disjoint samples whose union is the epoch, and the same number of batches."""
    per_rank = [_epoch_rows(ds, r, size) for r in range(size)]
    assert {len(rows) for rows in per_rank} == {48 // size}
    flat = [r for rows in per_rank for r in rows]
    assert len(set(flat)) == len(flat) == 48
    assert sorted(flat) == sorted(_epoch_rows(ds, 0, 1))


def _save_like_megatron(loader, save_dir, iteration, dp_rank):
    """What megatron.training.checkpointing.maybe_save_dataloader_state writes."""
    path = os.path.join(
        save_dir, f"iter_{iteration:07d}", "mp_rank_00", f"train_dataloader_dprank{dp_rank:03d}.pt"
    )
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save({"dataloader_state_dict": loader.save_state()}, path)
    return path


@pytest.mark.parametrize("packing", [False, True])
def test_resume_from_the_state_megatron_saved(ds, tmp_path, packing):
    kw = kwargs(
        ds,
        packing=packing,
        pack_length=512 if packing else None,
        seq_length=None if packing else 512,
        micro_batch_size=2,
    )
    provider = make_provider(**kw, dp_rank=1, dp_size=2, resume=False)
    train, _, _ = provider([0, 0, 0])
    with train:
        for _ in range(5):  # well past an epoch boundary when packed: cycle=True
            next(train)
        path = _save_like_megatron(train, str(tmp_path), 7, 1)
        expected = [copy(next(train)) for _ in range(30)]
    assert state_path(str(tmp_path), 7, 1) == path
    # torch.load(weights_only=True) accepts the file
    torch.load(path, weights_only=True)
    resumed, _, _ = make_provider(
        **kw, dp_rank=1, dp_size=2, dataloader_save=str(tmp_path), iteration=7
    )([0, 0, 0])
    with resumed:
        for e in expected:
            same(next(resumed), e)


def test_resume_without_state(ds, tmp_path):
    provider = make_provider(**kwargs(ds), dataloader_save=str(tmp_path), iteration=3)
    with pytest.raises(FileNotFoundError, match="train_dataloader_dprank000.pt"):
        provider([0, 0, 0])
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        train, _, _ = make_provider(**kwargs(ds), iteration=3)([0, 0, 0])
        train.close()
    assert any("--dataloader-save" in str(x.message) for x in w)
    train, _, _ = make_provider(**kwargs(ds), dataloader_save=str(tmp_path), iteration=0)(
        [0, 0, 0]
    )  # a fresh run
    train.close()


def test_rerun_data_iterator_replays_valid_batches(ds):
    """Megatron's RerunDataIterator keeps the batches of an iteration and replays them; they
    must stay intact while the loader moves on (buffers are reused only once released)."""
    destroy_rerun_state_machine()
    initialize_rerun_state_machine(mode=RerunMode.VALIDATE_RESULTS)
    try:
        train, _, _ = make_provider(**kwargs(ds), resume=False)([0, 0, 0])
        with train:
            it = RerunDataIterator(train)
            held = [next(it) for _ in range(3)]
            snap = [copy(b) for b in held]
            it.rewind()
            for b, s in zip(held, snap):
                replay = next(it)  # the batch itself, or (megatron-core >= 0.19) a copy.copy
                assert replay.keys() == b.keys() and all(replay[k] is b[k] for k in b)
            it.advance()
            for _ in range(12):  # the loader recycles released buffers meanwhile
                next(it)
            for b, s in zip(held, snap):
                same(b, s)
            assert it.iterable.save_state() == train.state_dict()
    finally:
        destroy_rerun_state_machine()


# ---- batches for the model --------------------------------------------------------------


def _collated(samples, **cfg):
    cfg.setdefault("pixel_cols", 12)
    return [
        {k: torch.from_dlpack(v) for k, v in b.items()} for b, _ in _core._collate(samples, cfg)
    ]


def _samples(n, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        L = int(rng.integers(3, 40))
        ids = rng.integers(0, 1000, L).tolist()
        out.append(dict(input_ids=ids, labels=ids))
    out[1]["input_ids"][2:6] = [151652, 151655, 151655, 151653]
    out[1]["labels"] = list(out[1]["input_ids"])
    out[1]["grids"] = [(1, 4, 2)]
    out[1]["pixel_values"] = np.ones((8, 12), np.float32)
    return out


def test_packed_seq_params_from_a_packed_batch():
    """Megatron's names (cu_seqlens real, cu_seqlens_padded padded, int32) map one to one
    onto PackedSeqParams; the padded boundaries cover the row."""
    for multiple in (1, 4):
        packs = _collated(
            _samples(12),
            packing=True,
            pack_length=96,
            pad_to_multiple=multiple,
            keys="megatron",
            shift_labels=1,
        )
        assert len(packs) > 1
        for b in packs:
            assert "cu_seqlens_unpadded" not in b
            real, padded = b["cu_seqlens"], b["cu_seqlens_padded"]
            assert real.dtype == padded.dtype == b["max_seqlen"].dtype == torch.int32
            p = packed_seq_params(b)
            assert isinstance(p, PackedSeqParams) and p.qkv_format == "thd"
            assert torch.equal(p.cu_seqlens_q, real) and torch.equal(p.cu_seqlens_kv, real)
            assert torch.equal(p.cu_seqlens_q_padded, padded)
            assert int(padded[-1]) == 96
            seg = padded[1:] - padded[:-1]
            assert (seg[:-1] % multiple == 0).all() and (seg >= real[1:] - real[:-1]).all()
            assert p.max_seqlen_q == p.max_seqlen_kv == int(seg.max()) == int(b["max_seqlen"])
            # every sample's tokens lie at its padded start, its real length long
            assert (b["loss_mask"][0, padded[-2] + real[-1] - real[-2] :] == 0).all()


def test_get_batch_single_rank():
    batches = _collated(
        _samples(6),
        packing=True,
        pack_length=64,
        keys="megatron",
        shift_labels=1,
        attention_mask=False,  # as mmloader.megatron's loader (the table's default is True)
    )
    text_only = [i for i, b in enumerate(batches) if int(b["image_grid_thw"][0, 0]) == 0]
    with_image = [i for i, b in enumerate(batches) if int(b["image_grid_thw"][0, 0]) > 0]
    assert text_only and with_image
    assert len({tuple(sorted(b)) for b in batches}) == 1  # the same keys in every batch
    it = iter(batches)
    for i in range(len(batches)):
        out = get_batch(it, device="cpu")
        assert isinstance(out["packed_seq_params"], PackedSeqParams)
        assert out["attention_mask"] is None
        if i in text_only:
            assert out["pixel_values"] is None and out["image_grid_thw"] is None
        else:
            assert out["pixel_values"].shape == (8, 12)
        assert torch.equal(out["tokens"], batches[i]["tokens"])


# ---- two processes: tensor-parallel broadcast ---------------------------------------------


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tp_worker(rank, world, port, ds, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=2,
            pipeline_model_parallel_size=world // 2,
            create_gloo_process_groups=False,
        )
        assert parallel_state.get_data_parallel_world_size() == 1
        # the provider builds a loader on tensor-parallel rank 0 of each pipeline stage
        # (first and last here) only
        kw = kwargs(
            ds, packing=True, pack_length=512, seq_length=None, mrope=True, attention_mask=True
        )
        train, _, _ = make_provider(**kw, resume=False)([0, 0, 0])
        assert (train is None) == (parallel_state.get_tensor_model_parallel_rank() == 1)
        # and get_batch broadcasts each batch from rank 0 to rank 1
        got = []
        for _ in range(4):
            b = get_batch(train, device="cpu", drop_placeholder=False)
            got.append({k: v.clone() for k, v in b.items() if isinstance(v, torch.Tensor)})
        if train is not None:
            train.close()
        torch.save(got, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_tp_broadcast_between_processes(ds, tmp_path, world):
    """Tensor parallel 2 (x pipeline parallel 2 with 4 processes): every rank of a
    data-parallel rank ends up with the same batches, read once per pipeline stage."""
    mp.spawn(_tp_worker, args=(world, _free_port(), ds, str(tmp_path)), nprocs=world, join=True)
    got = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(world)]
    a = got[0]
    assert all(len(b) == 4 for b in got)
    for b in got[1:]:
        for x, y in zip(a, b):
            same(x, y)
    for x in a:
        assert x["attention_mask"].dtype == torch.bool
        assert x["position_ids"].shape[0] == 3
        for k, v in x.items():
            assert 0 not in v.shape and v.dim() < 5, k


# ---- Energon's state API ----------------------------------------------------------------


def test_adapter_state_names_are_the_adapters(ds):
    """Megatron-LM's and Energon's state names are on mmloader.megatron.Loader (what
    make_provider returns), not on the core or torch Loader, whose old attributes say where
    they went."""
    train, _, _ = make_provider(**kwargs(ds), resume=False)([0, 0, 0])
    with train:
        assert isinstance(train, mmloader.megatron.Loader)
        assert train.save_state() == train.save_state_rank() == train.state_dict()
    for make in (mmloader.Loader, mmloader.torch.Loader):
        with make(**kwargs(ds)) as L:
            for name in ("save_state", "restore_state_rank", "save_state_global", "dp_group"):
                with pytest.raises(AttributeError, match="mmloader.megatron.Loader"):
                    getattr(L, name)


def test_energon_state_api_single_rank(ds):
    """save_state_rank / restore_state_rank (None = initial state) and the global pair,
    which without a process group is the one-element list, as in Energon: the Megatron
    adapter's loader has them (make_provider builds one)."""
    kw = kwargs(ds)
    with mmloader.megatron.Loader(**kw) as a:
        for _ in range(3):
            next(a)
        rank_state, global_state = a.save_state_rank(), a.save_state_global(0)
        assert global_state == [rank_state] == [a.state_dict()]
        expected = [copy(next(a)) for _ in range(4)]
    with mmloader.megatron.Loader(**kw) as b:
        b.restore_state_rank(None)  # nothing to restore: the first batch comes next
        first = copy(next(b))
    with mmloader.megatron.Loader(**kw) as c:
        same(first, copy(next(c)))
    for restore in (
        lambda L: L.restore_state_rank(rank_state),
        lambda L: L.restore_state_global(global_state),
        lambda L: L.restore_state_global(global_state, src_rank=0),
    ):
        with mmloader.megatron.Loader(**kw) as d:
            restore(d)
            for e in expected:
                same(next(d), e)
    with mmloader.megatron.Loader(**kw) as d, pytest.raises(mmloader.StateError):
        d.restore_state_global(rank_state)


def _energon_worker(rank, world, port, ds, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        kw = kwargs(ds, dp_rank=rank, dp_size=world)
        with mmloader.megatron.Loader(**kw) as a:
            for _ in range(2 + rank):
                next(a)
            gathered = a.save_state_global(0)
            expected = [copy(next(a)) for _ in range(3)]
        assert (gathered is None) == (rank != 0)
        if rank == 0:
            assert [s["fingerprint"]["dp_rank"] for s in gathered] == [0, 1]
            torch.save(gathered, os.path.join(out_dir, "state.pt"))
        dist.barrier()
        # rank 0 alone loads the file and scatters it; then every rank loads the whole list
        for src in (0, None):
            state = (
                torch.load(os.path.join(out_dir, "state.pt"), weights_only=True)
                if src is None or rank == 0
                else None
            )
            with mmloader.megatron.Loader(**kw) as b:
                b.restore_state_global(state, src_rank=src)
                for e in expected:
                    same(next(b), e)
        wrong_kw = kwargs(ds, dp_rank=0, dp_size=1)  # given: they win over the group
        with mmloader.megatron.Loader(**wrong_kw) as wrong, pytest.raises(mmloader.StateError):
            wrong.save_state_global(0)  # dp_size 1 but a group of 2: refused
        open(os.path.join(out_dir, f"ok{rank}"), "w").close()
    finally:
        dist.destroy_process_group()


def test_energon_state_api_across_data_parallel_ranks(ds, tmp_path):
    """Two data-parallel processes (gloo): save_state_global gathers both states on rank 0,
    restore_state_global scatters them back (src_rank=0) or picks this rank's
    (src_rank=None); each rank continues exactly where it stood."""
    mp.spawn(_energon_worker, args=(2, _free_port(), ds, str(tmp_path)), nprocs=2, join=True)
    assert (tmp_path / "ok0").exists() and (tmp_path / "ok1").exists()


def _example():
    import importlib.util

    path = os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        "examples",
        "megatron",
        "qwen25vl_provider.py",
    )
    spec = importlib.util.spec_from_file_location("qwen25vl_provider", path)
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    return ex


def test_the_qwen25vl_example_provider(ds):
    """examples/megatron/qwen25vl_provider.py: the flags mmloader.megatron.add_arguments
    registers become the loader's arguments."""
    import argparse

    ex = _example()
    assert ex.train_valid_test_datasets_provider.is_distributed is True
    parser = add_arguments(argparse.ArgumentParser())
    args = parser.parse_args(
        [
            "--mmloader-data",
            *ds["shards"],
            "--mmloader-packing",
            "--mmloader-mrope",
            "--mmloader-pad-to-multiple",
            "4",
            "--dataloader-save",
            "/ckpt/dl",
        ]
    )
    assert args.dataloader_save == "/ckpt/dl"
    args.seq_length = 512
    kw = loader_kwargs_from_args(args)
    assert kw["pack_length"] == 512 and kw["pad_to_multiple"] == 4 and "valid" not in kw
    kw.update(tokenizer=TINY, num_threads=2, prefetch=2, **SMALL)
    train, valid, test = make_provider(**kw, resume=False)([0, 0, 0])
    with train:
        b = get_batch(train, device="cpu")
    assert b["tokens"].shape == (1, 512) and b["position_ids"].shape == (3, 1, 512)
    assert b["packed_seq_params"].cu_seqlens_q_padded is not None
    assert valid is None and test is None
    # a parser that already has --dataloader-save keeps its own
    p = argparse.ArgumentParser()
    p.add_argument("--dataloader-save", default="mine")
    assert add_arguments(p).parse_args([]).dataloader_save == "mine"


def test_pretrain_calls_the_old_signature():
    """megatron-core <= 0.17 (Megatron-LM's pretrain(provider, model_provider, model_type,
    forward_step, extra_args_provider=, args_defaults=)): the extra-args hook adds
    mmloader's flags before the user's, and --dataloader-type defaults to external."""
    import argparse

    from mmloader.megatron import _call_pretrain

    seen = {}

    def old_pretrain(
        train_valid_test_dataset_provider,
        model_provider,
        model_type,
        forward_step_func,
        process_non_loss_data_func=None,
        extra_args_provider=None,
        args_defaults={},
        **kw,
    ):
        seen.update(
            provider=train_valid_test_dataset_provider,
            model=model_provider,
            type=model_type,
            step=forward_step_func,
            defaults=args_defaults,
            kw=kw,
        )
        seen["args"] = extra_args_provider(argparse.ArgumentParser()).parse_args(
            ["--mmloader-data", "x.jsonl", "--mine", "1"]
        )

    def user_args(parser):
        parser.add_argument("--mine")
        return parser

    _call_pretrain(old_pretrain, "P", "M", "T", "F", user_args, {"seed": 3}, None, {"store": None})
    assert (seen["provider"], seen["model"], seen["type"], seen["step"]) == ("P", "M", "T", "F")
    assert seen["defaults"] == {"dataloader_type": "external", "seed": 3}
    assert seen["kw"] == {"store": None}
    assert seen["args"].mmloader_data == ["x.jsonl"] and seen["args"].mine == "1"
    assert seen["args"].dataloader_save is None


def test_megatron_loss_over_a_packed_batch_equals_per_sample_next_token_loss():
    """megatron-core's vocab_parallel_cross_entropy on our shifted labels, masked with
    loss_mask, is the next-token loss of each sample on its own (nothing crosses samples)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        from megatron.core import tensor_parallel

        parallel_state.initialize_model_parallel(create_gloo_process_groups=False)
        samples = _samples(10, seed=4)
        for s in samples:  # supervise everything but the first quarter
            s["labels"] = [
                -100 if j < len(s["input_ids"]) // 4 else t for j, t in enumerate(s["input_ids"])
            ]
        g = torch.Generator().manual_seed(1)
        k = 0
        for b in _collated(
            samples,
            packing=True,
            pack_length=128,
            pad_to_multiple=4,
            keys="megatron",
            shift_labels=1,
        ):
            V = 151936
            logits = torch.randn(1, 128, V, generator=g)
            loss = tensor_parallel.vocab_parallel_cross_entropy(
                logits.transpose(0, 1).clone(), b["labels"].t().contiguous()
            ).t()  # works in place
            ours = (loss * b["loss_mask"]).sum()
            want = torch.zeros(())
            cu = b["cu_seqlens_padded"]
            for i in range(len(cu) - 1):
                s = samples[k]
                n, lo = len(s["input_ids"]), int(cu[i])
                tgt = torch.tensor(s["labels"][1:])
                want = want + torch.nn.functional.cross_entropy(
                    logits[0, lo : lo + n - 1], tgt, ignore_index=-100, reduction="sum"
                )
                k += 1
            torch.testing.assert_close(ours, want)
        assert k == len(samples)
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
