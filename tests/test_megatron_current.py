"""mmloader.megatron against the current Megatron stack, installed from PyPI: megatron-core
0.19 (which ships megatron.training, i.e. Megatron-LM), Megatron-Bridge 0.6 and Energon 7.4,
on CPU with gloo process groups.  scripts/test-megatron-current.sh makes the Python 3.12
venv these need and runs this file; elsewhere (megatron-core < 0.18, no megatron.training)
it is skipped.

What runs for real: Megatron-LM's parse_and_validate_args with mmloader.megatron's extra
arguments, pretrain_cfg_container_from_args, build_train_valid_test_data_iterators (its
RerunDataIterator), maybe_save_dataloader_state and a resume in fresh processes; Bridge's
get_dataset_provider, its provider binding, build_train_valid_test_data_iterators,
vlm_step.forward_step and qwen3_vl_step.forward_step (their whole data handling, up to the
model call), maybe_save_dataloader_state / maybe_load_dataloader_state.

Stand-ins, all for the lack of a GPU and Transformer Engine (which has no CPU build):
- megatron.bridge.peft.lora_layers is replaced by a module whose four LoRA classes raise if
  constructed: it imports transformer_engine at the top, and Bridge's package imports it on
  the way to its data modules (LoRA is not on the data path).  Nothing else is stubbed.
- Megatron-LM's and Bridge's data-loader builders each make one flags tensor with
  device="cuda" (then broadcast it): inside those calls torch.tensor places it on the CPU
  (gloo broadcasts it).
- Bridge's forward steps move every batch tensor with .cuda(non_blocking=True): inside the
  forward-step call Tensor.cuda returns the tensor itself.
- The model is a recorder with the signature of Bridge's Qwen2.5-VL / Qwen3-VL model
  forward (Bridge filters the visual arguments by it): it stores the model-facing batch.
- megatron.training.pretrain itself asserts CUDA: mmloader.megatron.pretrain runs up to it
  and calls a function with its signature.
"""

import contextlib
import inspect
import os
import socket
import sys
import types
from unittest import mock

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip(
    "megatron.training",
    reason="megatron-core >= 0.18 (megatron.training) "
    "not installed: run scripts/test-megatron-current.sh",
)

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from megatron.core import parallel_state  # noqa: E402
from megatron.core.enums import ModelType  # noqa: E402
from megatron.core.packed_seq_params import PackedSeqParams  # noqa: E402

import mmloader  # noqa: E402
from mmloader import megatron as mml  # noqa: E402
from conftest import same  # noqa: E402

TINY = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")
SMALL = dict(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16)
LOADER = dict(tokenizer=TINY, num_threads=1, prefetch=2, **SMALL)


@pytest.fixture(scope="module")
def text_ds(tmp_path_factory):
    from mmloader.datagen import make_dataset

    return make_dataset(
        str(tmp_path_factory.mktemp("text")),
        n_samples=8,
        seed=4,
        n_shards=1,
        n_images=8,
        text_only_fraction=1.0,
    )


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    from mmloader.datagen import make_dataset

    root = str(tmp_path_factory.mktemp("mds"))
    # text-only samples too: micro-batches of 2 with no image must carry the same keys
    return make_dataset(
        root,
        n_samples=40,
        seed=3,
        n_shards=2,
        n_images=10,
        min_size=32,
        max_size=128,
        text_only_fraction=0.4,
    )


@pytest.fixture(scope="module")
def video_ds(tmp_path_factory):
    """Mixed records with frame-list videos (as qwen-vl-utils accepts them): image + video,
    video only, image only and text only, repeated."""
    import json

    from PIL import Image

    root = tmp_path_factory.mktemp("vds")
    paths = []
    for i in range(6):
        im = Image.new("RGB", (64, 48), (40 * i, 255 - 30 * i, 90))
        im.paste((250 - 40 * i, 20 * i, 200), (8 * i, 4 * i, 8 * i + 20, 4 * i + 16))
        paths.append(str(root / f"f{i}.png"))
        im.save(paths[-1])
    a = {"from": "gpt", "value": "An answer."}
    recs = [
        {
            "conversations": [{"from": "human", "value": "<image> and <video>?"}, a],
            "images": [paths[0]],
            "videos": [paths[1:5]],
        },
        {
            "conversations": [{"from": "human", "value": "<video>What moves?"}, a],
            "videos": [paths[2:]],
        },
        {
            "conversations": [{"from": "human", "value": "<image>What is it?"}, a],
            "images": [paths[5]],
        },
        {"conversations": [{"from": "human", "value": "Just text."}, a]},
    ] * 4
    shard = root / "mixed.jsonl"
    shard.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return {"shards": [str(shard)]}


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init(rank, world, port):
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
    )
    dist.init_process_group("gloo", rank=rank, world_size=world)


@contextlib.contextmanager
def _cuda_flags_on_cpu():
    """The one device="cuda" flags tensor of the loader builders, made on the CPU."""
    real = torch.tensor

    def tensor(*a, device=None, **k):
        return real(*a, device="cpu" if str(device).startswith("cuda") else device, **k)

    with mock.patch.object(torch, "tensor", tensor):
        yield


def _clone(b):
    return {
        k: (v.clone() if isinstance(v, torch.Tensor) else v)
        for k, v in b.items()
        if isinstance(v, torch.Tensor) or v is None
    }


# ---- Megatron-LM (megatron.training of megatron-core 0.19) --------------------------------


def _argv(ds, save, extra=()):
    return [
        "train.py",
        "--num-layers",
        "3",
        "--hidden-size",
        "64",
        "--num-attention-heads",
        "4",
        "--seq-length",
        "512",
        "--max-position-embeddings",
        "512",
        "--micro-batch-size",
        "2",
        "--global-batch-size",
        "8",
        "--train-iters",
        "10",
        "--tokenizer-type",
        "NullTokenizer",
        "--vocab-size",
        "1000",
        "--seed",
        "7",
        "--eval-iters",
        "0",
        "--eval-interval",
        "1000",
        "--transformer-impl",
        "local",
        "--no-gradient-accumulation-fusion",
        "--dataloader-save",
        save,
        "--mmloader-data",
        *ds["shards"],
        *extra,
    ]


def _megatron_lm_setup(argv, provider):
    """What a training script does up to pretrain: mmloader.megatron.pretrain parses the
    arguments with Megatron-LM (plus mmloader's) and builds the config container; the
    function it then calls has megatron.training.pretrain's signature."""
    from megatron.training import pretrain as real_pretrain
    from megatron.training.config.container import PretrainConfigContainer

    seen = {}

    def pretrain(*a, **k):
        seen["bound"] = inspect.signature(real_pretrain).bind(*a, **k).arguments

    pretrain.__signature__ = inspect.signature(real_pretrain)
    sys.argv = argv
    mml._call_pretrain(
        pretrain, provider, None, ModelType.encoder_or_decoder, lambda: None, None, None, None, {}
    )
    bound = seen["bound"]
    assert isinstance(bound["cfg_container"], PretrainConfigContainer)
    assert bound["train_valid_test_dataset_provider"] is provider
    assert bound["model_type"] == ModelType.encoder_or_decoder
    from megatron.training import get_args

    return get_args()


def _iterators(args, provider, iteration):
    """Megatron-LM's setup: the checkpoint sets iteration / consumed samples, then
    build_train_valid_test_data_iterators calls the provider on every rank."""
    from megatron.training.training import build_train_valid_test_data_iterators

    args.iteration = iteration
    args.consumed_train_samples = iteration * args.global_batch_size
    args.consumed_valid_samples = 0
    with _cuda_flags_on_cpu():
        return build_train_valid_test_data_iterators(provider)


def _lm_worker(rank, world, port, ds, out_dir, phase):
    from megatron.core.num_microbatches_calculator import get_num_microbatches
    from megatron.core.rerun_state_machine import RerunDataIterator
    from megatron.training.checkpointing import maybe_save_dataloader_state

    _init(rank, world, port)
    try:
        parallel_state.initialize_model_parallel(create_gloo_process_groups=False)
        provider = mml.make_provider(**LOADER)  # data from --mmloader-data
        args = _megatron_lm_setup(_argv(ds, os.path.join(out_dir, "dl")), provider)
        assert args.dataloader_type == "external" and args.mmloader_data == ds["shards"]
        assert args.data_parallel_size == 2 and get_num_microbatches() == 2
        train, valid, test = _iterators(args, provider, 3 if phase == "resume" else 0)
        assert isinstance(train, RerunDataIterator) and valid is None and test is None
        loader = train.iterable
        assert isinstance(loader, mmloader.torch.Loader) and loader.dp_group is not None
        fp = loader.loader._fingerprint  # Megatron's DP rank / size, --micro-batch-size, --seed
        assert (fp["dp_rank"], fp["dp_size"], fp["micro_batch_size"], fp["seed"]) == (rank, 2, 2, 7)

        def iteration():
            got = []
            for _ in range(get_num_microbatches()):
                b = mml.get_batch(train, device="cpu")
                raw = {k: v for k, v in b.items() if isinstance(v, torch.Tensor)}
                assert b["packed_seq_params"] is None and b["attention_mask"] is None
                assert b["tokens"].shape == (2, 512) and b["tokens"].dtype == torch.int64
                got.append(_clone(raw))
            return got

        if phase == "fresh":
            for _ in range(3):
                iteration()
            maybe_save_dataloader_state(train, 3, args.dataloader_save)
            path = mml.state_path(args.dataloader_save, 3, rank)
            assert path is not None and path.endswith(f"train_dataloader_dprank{rank:03d}.pt")
            torch.save([iteration() for _ in range(2)], os.path.join(out_dir, f"next{rank}.pt"))
        else:
            expected = torch.load(os.path.join(out_dir, f"next{rank}.pt"), weights_only=True)
            assert len(expected) == 2
            for want in expected:
                same(iteration(), want)
            open(os.path.join(out_dir, f"resumed{rank}"), "w").close()
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


@pytest.mark.timeout(1500)  # processes importing Megatron on a busy 2-core machine
def test_megatron_lm_data_path_save_and_exact_resume(ds, tmp_path):
    """Two data-parallel ranks: Megatron-LM parses mmloader's flags (--dataloader-save
    included), builds the iterators through the provider, saves each rank's state at
    iteration 3; new processes resuming at iteration 3 get exactly the batches that came
    next."""
    for phase in ("fresh", "resume"):
        mp.spawn(_lm_worker, args=(2, _free_port(), ds, str(tmp_path), phase), nprocs=2, join=True)
    assert (tmp_path / "resumed0").exists() and (tmp_path / "resumed1").exists()


def _pp_worker(rank, world, port, ds, out_dir):
    _init(rank, world, port)
    try:
        parallel_state.initialize_model_parallel(
            pipeline_model_parallel_size=3, create_gloo_process_groups=False
        )
        provider = mml.make_provider(**LOADER, resume=False)
        args = _megatron_lm_setup(
            _argv(
                ds,
                os.path.join(out_dir, "dl"),
                ["--mmloader-packing", "--mmloader-mrope", "--pipeline-model-parallel-size", "3"],
            ),
            provider,
        )
        train, _, _ = _iterators(args, provider, 0)
        assert train is not None  # every stage reads when packed
        got = []
        for _ in range(3):
            b = mml.get_batch(train, device="cpu")
            p = b["packed_seq_params"]
            assert isinstance(p, PackedSeqParams) and p.qkv_format == "thd"
            assert p.cu_seqlens_q.dtype == p.cu_seqlens_q_padded.dtype == torch.int32
            assert int(p.cu_seqlens_q_padded[-1]) == 512
            if rank == 1:  # the middle stage: only the packed-sequence boundaries
                assert b["tokens"] is None and b["pixel_values"] is None
            else:
                assert b["tokens"].shape == (1, 512) and b["position_ids"].shape == (3, 1, 512)
            got.append(
                {k: getattr(p, k) for k in ("cu_seqlens_q", "cu_seqlens_q_padded", "max_seqlen_q")}
            )
        torch.save(got, os.path.join(out_dir, f"pp{rank}.pt"))
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


@pytest.mark.timeout(1500)  # processes importing Megatron on a busy 2-core machine
def test_megatron_lm_packed_params_reach_every_pipeline_stage(ds, tmp_path):
    """Pipeline parallel 3, packed: the first, middle and last stages all get the same
    PackedSeqParams (the middle stage's attention needs them too)."""
    mp.spawn(_pp_worker, args=(3, _free_port(), ds, str(tmp_path)), nprocs=3, join=True)
    got = [torch.load(tmp_path / f"pp{r}.pt", weights_only=True) for r in range(3)]
    for other in got[1:]:
        assert len(other) == len(got[0]) > 0
        for a, b in zip(got[0], other):
            for k in a:
                assert torch.equal(torch.as_tensor(a[k]), torch.as_tensor(b[k])), k


# ---- Megatron-Bridge 0.6 ------------------------------------------------------------------


def _stub_te_lora():
    """megatron.bridge.peft.lora_layers imports transformer_engine (no CPU build): its
    four classes raise if constructed."""
    try:
        import transformer_engine  # noqa: F401

        return
    except ImportError:
        pass
    m = types.ModuleType("megatron.bridge.peft.lora_layers")

    def make(name):
        def init(self, *a, **k):
            raise RuntimeError(f"{name} needs Transformer Engine (stubbed in this test)")

        return type(name, (), {"__init__": init})

    for n in ("LinearAdapter", "LoRALinear", "LoRATopKRouter", "TEFusedLoRALinear"):
        setattr(m, n, make(n))
    sys.modules[m.__name__] = m


class _Recorder(torch.nn.Module):
    """Stands for the Qwen-VL model: its forward has the real model's signature (Bridge
    filters the visual keyword arguments by it) and records what it is given."""

    def __init__(self, forward_of, seq_length):
        super().__init__()
        self.config = types.SimpleNamespace(
            mtp_num_layers=None, seq_length=seq_length, overlap_moe_expert_parallel_comm=False
        )
        self.calls = []

        def forward(*a, **k):
            self.calls.append(inspect.signature(forward_of).bind(None, *a, **k).arguments)
            return torch.zeros(k["labels"].shape if k.get("labels") is not None else (1,))

        forward.__signature__ = inspect.signature(forward_of).replace(
            parameters=list(inspect.signature(forward_of).parameters.values())[1:]
        )
        self.forward = forward


def _bridge_cfg(dataset, save):
    from megatron.bridge.training.config import (
        CheckpointConfig,
        ConfigContainer,
        LoggerConfig,
        OptimizerConfig,
        SchedulerConfig,
        TokenizerConfig,
        TrainingConfig,
    )

    return ConfigContainer(
        train=TrainingConfig(micro_batch_size=2, global_batch_size=2, train_iters=10),
        model=None,
        optimizer=OptimizerConfig(),
        scheduler=SchedulerConfig(),
        dataset=dataset,
        logger=LoggerConfig(),
        tokenizer=TokenizerConfig(),
        checkpoint=CheckpointConfig(save=save),
    )


def _bridge_iterators(cfg, pgs):
    """Bridge's setup: the provider from get_dataset_provider, bound to the process groups,
    then build_train_valid_test_data_iterators."""
    from megatron.bridge.data.loaders import build_train_valid_test_data_iterators
    from megatron.bridge.data.utils import get_dataset_provider
    from megatron.bridge.training.setup import _bind_dataset_provider_context
    from megatron.bridge.training.state import TrainState

    provider = _bind_dataset_provider_context(
        get_dataset_provider(cfg.dataset), tokenizer=None, pg_collection=pgs
    )
    with _cuda_flags_on_cpu():
        return build_train_valid_test_data_iterators(
            cfg=cfg,
            train_state=TrainState(),
            build_train_valid_test_datasets_provider=provider,
            dp_group=pgs.dp,
        )


def _bridge_steps(step, cfg, it, model, n):
    from megatron.bridge.training.state import GlobalState

    state = GlobalState()
    state.cfg = cfg
    out = []
    with mock.patch.object(torch.Tensor, "cuda", lambda self, *a, **k: self):
        for _ in range(n):
            step.forward_step(state, it, model)
            out.append(model.calls[-1])
    return out


def _bridge_worker(rank, world, port, ds, text_ds, video_ds, out_dir):
    _stub_te_lora()
    from megatron.bridge.models.qwen_vl.modeling_qwen25_vl import Qwen25VLModel
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.model import Qwen3VLModel
    from megatron.bridge.models.qwen_vl import qwen3_vl_step
    from megatron.bridge.training import vlm_step
    from megatron.bridge.training.checkpointing import (
        maybe_load_dataloader_state,
        maybe_save_dataloader_state,
    )
    from megatron.bridge.training.utils.packed_seq_utils import (
        unpack_mcore_thd_tensor_for_position_ids,
    )
    from megatron.core.num_microbatches_calculator import (
        destroy_num_microbatches_calculator,
        init_num_microbatches_calculator,
    )
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.rerun_state_machine import RerunDataIterator

    from mmloader.megatron.bridge import BridgeBatches, MMLoaderDataset

    _init(rank, world, port)
    try:
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=2, create_gloo_process_groups=False
        )
        pgs = ProcessGroupCollection.use_mpu_process_groups()
        # what Bridge's initialize does with cfg.train (micro-batch size 2, DP 1)
        init_num_microbatches_calculator(rank, None, 2, 2, 1)
        save = os.path.join(out_dir, "ckpt")
        results = {}
        seen = {"images": 0, "text-only": 0, "videos": 0}
        for name, step, forward_of, packing, data, preset in (
            ("vlm_step", vlm_step, Qwen25VLModel.forward, False, ds, "qwen2.5-vl"),
            ("vlm_step-packed", vlm_step, Qwen25VLModel.forward, True, ds, "qwen2.5-vl"),
            ("vlm_step-text-only", vlm_step, Qwen25VLModel.forward, False, text_ds, "qwen2.5-vl"),
            ("qwen3_vl_step", qwen3_vl_step, Qwen3VLModel.forward, False, ds, "qwen2.5-vl"),
            ("vlm_step-video", vlm_step, Qwen25VLModel.forward, False, video_ds, "qwen2.5-vl"),
            (
                "vlm_step-video-packed",
                vlm_step,
                Qwen25VLModel.forward,
                True,
                video_ds,
                "qwen2.5-vl",
            ),
            (
                "qwen3_vl_step-video",
                qwen3_vl_step,
                Qwen3VLModel.forward,
                False,
                video_ds,
                "qwen3-vl",
            ),
        ):
            dataset = MMLoaderDataset(
                data=data["shards"],
                seq_length=512,
                packing=packing,
                seed=5,
                preset=preset,
                loader_kwargs=dict(LOADER),
            )
            cfg = _bridge_cfg(dataset, save)
            cfg.dataset.finalize()
            train, valid, test = _bridge_iterators(cfg, pgs)
            assert isinstance(train, RerunDataIterator) and isinstance(
                train.iterable, BridgeBatches
            )
            assert valid is None and test is None
            model = _Recorder(forward_of, 512)
            calls = _bridge_steps(step, cfg, train, model, 4)
            # the raw batches behind the model calls, read again from a fresh loader
            raws = []
            with mmloader.torch.Loader(
                data["shards"], **dataset._loader_kwargs(types.SimpleNamespace(pg_collection=pgs))
            ) as ref:
                for _ in range(4):
                    raws.append(_clone(next(ref)))
            for call, raw in zip(calls, raws):
                assert torch.equal(call["input_ids"], raw["tokens"])
                assert torch.equal(call["labels"], raw["labels"])
                images = int(raw["image_grid_thw"][0, 0]) > 0
                seen["images" if images else "text-only"] += 1
                if images:  # every image reaches the model, in order
                    assert torch.equal(call["pixel_values"], raw["pixel_values"])
                    assert torch.equal(call["image_grid_thw"], raw["image_grid_thw"])
                    rows = int(raw["image_grid_thw"].prod(-1).sum())
                    assert call["pixel_values"].shape[0] == rows
                else:  # the zero-patch placeholder: no visual inputs for the model
                    assert call.get("pixel_values") is None and call.get("image_grid_thw") is None
                if "pixel_values_videos" in raw:  # every video too, beside the images
                    seen["videos"] += 1
                    for k in ("pixel_values_videos", "video_grid_thw"):
                        assert torch.equal(call[k], raw[k]), k
                    rows = int(raw["video_grid_thw"].prod(-1).sum())
                    assert call["pixel_values_videos"].shape[0] == rows
                    if "second_per_grid_ts" in raw:  # Qwen2.5-VL
                        assert torch.equal(call["second_per_grid_ts"], raw["second_per_grid_ts"])
                else:
                    assert call.get("pixel_values_videos") is None
                p = call.get("packed_seq_params")
                if packing:
                    assert isinstance(p, PackedSeqParams) and p.qkv_format == "thd"
                    assert torch.equal(p.cu_seqlens_q, raw["cu_seqlens"])
                    assert torch.equal(p.cu_seqlens_kv_padded, raw["cu_seqlens_padded"])
                    assert p.max_seqlen_q == int(raw["max_seqlen"])
                    # Bridge's own THD unpacking finds each sample where it lies
                    rows, mask, starts, lengths = unpack_mcore_thd_tensor_for_position_ids(
                        call["input_ids"], p
                    )
                    real = raw["cu_seqlens"]
                    assert lengths == (real[1:] - real[:-1]).tolist()
                    assert starts == raw["cu_seqlens_padded"][:-1].tolist()
                elif name == "vlm_step":
                    assert p is None and call["input_ids"].shape == (2, 512)
            kept = ("input_ids", "labels", "pixel_values", "pixel_values_videos", "video_grid_thw")
            results[name] = [
                _clone({k: v for k, v in c.items() if k in kept and v is not None}) for c in calls
            ]
            if name == "vlm_step":
                # Bridge's dataloader checkpointing: save at step 4, resume in new iterators
                maybe_save_dataloader_state(
                    model, train, 4, os.path.join(save, "energon"), pg_collection=pgs
                )
                want = [next(train)["tokens"].clone() for _ in range(3)]
                again, _, _ = _bridge_iterators(cfg, pgs)
                maybe_load_dataloader_state(
                    again, 4, os.path.join(save, "energon"), pg_collection=pgs
                )
                for w in want:
                    assert torch.equal(next(again)["tokens"], w)
                again.iterable.close()
            train.iterable.close()
        assert seen["images"] >= 8 and seen["text-only"] >= 4 and seen["videos"] >= 8, seen
        # Megatron-LM's get_batch under tensor parallelism 2: rank 0 reads, the other gets the
        # image and video tensors by broadcast
        with mmloader.torch.Loader(
            video_ds["shards"],
            keys="megatron",
            shift_labels=True,
            micro_batch_size=2,
            shuffle=False,
            **LOADER,
        ) as L:
            it = iter(L) if parallel_state.get_tensor_model_parallel_rank() == 0 else None
            got = [mml.get_batch(it, device="cpu") for _ in range(4)]
        # records: image + video, video, image, text (x4) -> videos in batches 0 and 2
        assert [b["pixel_values_videos"] is not None for b in got] == [True, False] * 2
        assert all(b["pixel_values"] is not None for b in got)
        for b in got[::2]:
            assert b["video_grid_thw"].shape == (2, 3) and b["second_per_grid_ts"].shape == (2,)
            rows = int(b["video_grid_thw"].prod(-1).sum())
            assert b["pixel_values_videos"].shape[0] == rows
        results["get_batch-video"] = [
            _clone({k: v for k, v in b.items() if isinstance(v, torch.Tensor)}) for b in got
        ]
        # qwen3_vl_step packs in the step: it refuses collate-time packing, as documented
        dataset = MMLoaderDataset(
            data=ds["shards"], seq_length=512, packing=True, loader_kwargs=dict(LOADER)
        )
        cfg = _bridge_cfg(dataset, save)
        train, _, _ = _bridge_iterators(cfg, pgs)
        with pytest.raises(ValueError, match="collate-time in-batch packing"):
            _bridge_steps(qwen3_vl_step, cfg, train, _Recorder(Qwen3VLModel.forward, 512), 1)
        train.iterable.close()
        torch.save(results, os.path.join(out_dir, f"bridge{rank}.pt"))
        destroy_num_microbatches_calculator()
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


@pytest.mark.timeout(1500)  # processes importing Megatron on a busy 2-core machine
def test_megatron_bridge_dataset_provider_steps_and_checkpointing(ds, text_ds, video_ds, tmp_path):
    """Tensor parallel 2 under Bridge: each rank reads its own iterator and both give the
    model the same batches; vlm_step (padded and packed) and qwen3_vl_step hand the model
    every image and video (mixed image + video batches), the tokens and labels, and the
    packed params in Bridge's layout; Bridge's dataloader checkpoint save/load resumes
    exactly; Megatron-LM's get_batch broadcasts image and video tensors to the other
    tensor-parallel rank."""
    mp.spawn(
        _bridge_worker,
        args=(2, _free_port(), ds, text_ds, video_ds, str(tmp_path)),
        nprocs=2,
        join=True,
    )
    a, b = (torch.load(tmp_path / f"bridge{r}.pt", weights_only=True) for r in range(2))
    assert (
        sorted(a)
        == sorted(b)
        == [
            "get_batch-video",
            "qwen3_vl_step",
            "qwen3_vl_step-video",
            "vlm_step",
            "vlm_step-packed",
            "vlm_step-text-only",
            "vlm_step-video",
            "vlm_step-video-packed",
        ]
    )
    for name in a:
        same(a[name], b[name])
