"""recipe="llama-factory" against LLaMA-Factory itself, sample by sample.

The reference is LLaMA-Factory 0.9.5 from PyPI, run in its own venv
(scripts/setup-llamafactory.sh: it pins transformers 5.6) by tests/llamafactory_reference.py:
its dataset converters, SupervisedDatasetProcessor._encode_data_example (template,
mm_plugin, infer_seqlen truncation, labels) and mm_plugin.get_mm_inputs, on its own demo
files (data/ of its source distribution: mllm_demo, alpaca en/zh, glaive tool calls en/zh,
identity).  mmloader reads the same files through Loader(recipe="llama-factory").  Compared:
input_ids, labels, image_grid_thw and pixel_values (bitwise).

Skips (with the reason) when the venv is not there or the Qwen tokenizer is absent.  The
default run takes the first samples of each file; the whole 2,696 are @slow.
"""

import hashlib
import json
import os
import subprocess
from typing import List

import numpy as np
import pytest

import mmloader
from conftest import as_np
from refchild import RefChild

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
VENV = os.environ.get("MMLOADER_LLAMAFACTORY_VENV", "/work/venvs/llamafactory")
DATA = os.path.join(VENV, "llamafactory-data")
TOKDIR = os.path.join(ROOT, "..", "shared", "data", "qwen3-tokenizer")
if not os.path.isdir(TOKDIR):
    TOKDIR = "/work/shared/data/qwen3-tokenizer"
TOKENIZER = os.path.join(TOKDIR, "tokenizer.json")
FILES = {  # dataset_info.json name -> file
    "mllm_demo": "mllm_demo.json",
    "alpaca_en_demo": "alpaca_en_demo.json",
    "alpaca_zh_demo": "alpaca_zh_demo.json",
    "glaive_toolcall_en_demo": "glaive_toolcall_en_demo.json",
    "glaive_toolcall_zh_demo": "glaive_toolcall_zh_demo.json",
    "identity": "identity.json",
}
TEXT = [k for k in FILES if k != "mllm_demo"]
PRESET = {"qwen2_vl": "qwen2.5-vl", "qwen3_vl_nothink": "qwen3-vl", "qwen3_vl": "qwen3-vl"}


def _ready():
    stamp = os.path.join(VENV, ".mmloader-requirements")
    if not os.path.isfile(stamp) or not os.path.isfile(os.path.join(DATA, "dataset_info.json")):
        return "no LLaMA-Factory venv: run scripts/setup-llamafactory.sh (makes " + VENV + ")"
    if not os.path.isfile(TOKENIZER):
        return "the Qwen tokenizer (shared/data/qwen3-tokenizer) is absent"
    return None


pytestmark = pytest.mark.skipif(_ready() is not None, reason=str(_ready()))


def reference(tmp, jobs):
    """Runs LLaMA-Factory on the jobs in one process; the npz of each (cached by content)."""
    outs, todo = [], []
    for job in jobs:
        key = hashlib.sha256(json.dumps(job, sort_keys=True).encode()).hexdigest()[:16]
        out = os.path.join(str(tmp), f"lf-{key}.npz")
        outs.append(out)
        if not os.path.exists(out):
            todo.append(
                dict(
                    dict(dataset_dir=DATA),
                    **job,
                    out=out,
                    tokenizer=TOKDIR,
                    preset=PRESET[job["template"]],
                )
            )
    if todo:
        _child(tmp).run(todo, timeout=1800)
    return [dict(np.load(o)) for o in outs]


_CHILD: List[RefChild] = []


def _child(tmp) -> RefChild:
    """The module's one LLaMA-Factory child (tests/refchild.py), started by the first
    reference it must make (in the module's cache folder, outside the repository), stopped
    at the module's end: LLaMA-Factory, torch and transformers imported once for the module,
    not once per reference.  Jobs share nothing but imports (the one-shot mode ran several
    in one start already)."""
    if not _CHILD:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [os.path.join(HERE, "lfshim"), os.path.join(HERE, "tvshim")]
        )
        env.pop("PYTHONHOME", None)
        argv = [
            os.path.join(VENV, "bin", "python"),
            os.path.join(HERE, "llamafactory_reference.py"),
        ]
        _CHILD.append(RefChild(argv, env, str(tmp)))
    return _CHILD[0]


@pytest.fixture(scope="module")
def lfcache(tmp_path_factory):
    yield tmp_path_factory.mktemp("llamafactory")
    while _CHILD:
        _CHILD.pop().close()


def _jobs():
    """The default run's reference jobs, run in one LLaMA-Factory start."""
    jobs = [dict(template=t, datasets=list(FILES), limit=N) for t in PRESET]
    for t in ("qwen2_vl", "qwen3_vl"):
        for st in SETTINGS:
            jobs.append(_settings_job(t, st))
    return jobs


def _settings_job(template, settings):
    names = ["glaive_toolcall_en_demo", "alpaca_zh_demo", "mllm_demo"]
    if settings.get("cutoff_len", 2048) < 400:
        names.remove("mllm_demo")  # its images alone exceed the cut (refused: see below)
    data_args = dict(settings)
    if template == "qwen3_vl":
        data_args["enable_thinking"] = True
    return dict(template=template, datasets=names, limit=N, data_args=data_args)


@pytest.fixture(scope="module")
def refs(lfcache):
    jobs = _jobs()
    got = reference(lfcache, jobs)
    return {json.dumps(j, sort_keys=True): r for j, r in zip(jobs, got)}


def ours(name, template, limit=None, path=None, **kw):
    """(input_ids, labels, grid, pixels) per sample of one demo file (or the file at
    path), in file order."""
    preset = PRESET[template]
    if template == "qwen3_vl":
        kw.setdefault("enable_thinking", True)
    loader = mmloader.Loader(
        path or os.path.join(DATA, FILES[name]),
        data_format="json",
        preset=preset,
        tokenizer=TOKENIZER,
        recipe="llama-factory",
        shuffle=False,
        micro_batch_size=1,
        text_only_vision="omit",
        on_error="raise",
        num_threads=2,
        **kw,
    )
    out = []
    for b in loader:
        b = as_np(b)
        out.append(
            (b["input_ids"][0], b["labels"][0], b.get("image_grid_thw"), b.get("pixel_values"))
        )
        if limit and len(out) == limit:
            break
    return out


def compare(name, ref, mine):
    names = [str(x) for x in ref["names"]]
    idx = [i for i, n in enumerate(names) if n.startswith(name + "/")]
    assert idx, f"LLaMA-Factory produced no {name} sample"
    assert len(ref["dropped"]) == 0
    assert len(mine) == len(idx), (name, len(mine), len(idx))
    for (ids, labels, grid, pixels), i in zip(mine, idx):
        assert ids.tolist() == ref[f"ids_{i}"].tolist(), names[i]
        assert labels.tolist() == ref[f"labels_{i}"].tolist(), names[i]
        if f"grid_{i}" in ref:
            assert grid is not None and grid.tolist() == ref[f"grid_{i}"].tolist(), names[i]
            assert pixels.dtype == ref[f"pixels_{i}"].dtype, names[i]
            assert np.array_equal(pixels, ref[f"pixels_{i}"]), names[i]
        else:
            assert grid is None, names[i]
    return len(idx)


N = 12  # samples per file in the default run


@pytest.mark.parametrize("template", ["qwen2_vl", "qwen3_vl_nothink", "qwen3_vl"])
def test_demo_files(refs, template):
    """LLaMA-Factory's defaults (cutoff_len 2048): the demo files' first samples, images
    and text; qwen3_vl = enable_thinking=True."""
    ref = refs[json.dumps(dict(template=template, datasets=list(FILES), limit=N), sort_keys=True)]
    total = sum(compare(n, ref, ours(n, template, limit=N)) for n in FILES)
    assert total == N * (len(FILES) - 1) + 6  # mllm_demo holds 6


SETTINGS = [
    dict(cutoff_len=64),  # cuts most glaive/alpaca samples: source and target shares
    dict(cutoff_len=40, mask_history=True),  # last turns first
    dict(mask_history=True),
    dict(train_on_prompt=True, cutoff_len=400),
]


@pytest.mark.parametrize(
    "settings", SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items())
)
@pytest.mark.parametrize("template", ["qwen2_vl", "qwen3_vl"])
def test_settings(refs, template, settings):
    """cutoff_len, mask_history and train_on_prompt under LLaMA-Factory's names."""
    job = _settings_job(template, settings)
    ref = refs[json.dumps(job, sort_keys=True)]
    for n in job["datasets"]:
        compare(n, ref, ours(n, template, limit=N, **settings))


def test_cut_through_an_image_is_refused():
    """A cutoff_len that would cut an image's tokens skips the sample (too_long): LLaMA-Factory
    would hand the model fewer image tokens than features, which it refuses."""
    loader = mmloader.Loader(
        os.path.join(DATA, "mllm_demo.json"),
        data_format="json",
        preset="qwen2.5-vl",
        tokenizer=TOKENIZER,
        recipe="llama-factory",
        cutoff_len=32,
        shuffle=False,
        micro_batch_size=1,
        on_error="raise",
    )
    with pytest.raises(mmloader.Error, match="cutoff_len=32 would cut"):
        next(iter(loader))


@pytest.mark.slow
@pytest.mark.parametrize("template", ["qwen2_vl", "qwen3_vl_nothink"])
def test_all_demo_samples(lfcache, template):
    """All 2,696 image and text samples of the six demo files (0.9.5's copies)."""
    (ref,) = reference(lfcache, [dict(template=template, datasets=list(FILES))])
    assert sum(compare(n, ref, ours(n, template)) for n in FILES) == 2696


def test_v1_text_parts_read_as_strings(tmp_path):
    """LLaMA-Factory's newer layout ({"type": "text", "value": ...} parts, its v1 demo file)
    gives the same ids and labels as the same messages written as strings."""
    v1 = os.path.join(DATA, "v1_sft_demo.jsonl")
    rows = [json.loads(x) for x in open(v1, encoding="utf-8")][:40]
    flat = tmp_path / "flat.jsonl"
    with open(flat, "w", encoding="utf-8") as f:
        for r in rows:
            msgs = [
                {"role": m["role"], "content": "".join(p["value"] for p in m["content"])}
                for m in r["messages"]
            ]
            f.write(json.dumps({"messages": msgs}, ensure_ascii=False) + "\n")
    small = tmp_path / "v1.jsonl"
    small.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))

    def run(path):
        kw = dict(preset="qwen3-vl", tokenizer=TOKENIZER, shuffle=False, micro_batch_size=1)
        return [as_np(b) for b in mmloader.Loader(str(path), on_error="raise", **kw)]

    a, b = run(small), run(flat)
    assert len(a) == len(b) == 40
    for x, y in zip(a, b):
        assert x["input_ids"].tolist() == y["input_ids"].tolist()
        assert x["labels"].tolist() == y["labels"].tolist()


def test_v1_loss_weight_other_than_the_labels_is_refused(tmp_path):
    p = tmp_path / "w.jsonl"
    rec = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "value": "hi"}], "loss_weight": 1.0},
            {"role": "assistant", "content": [{"type": "text", "value": "yo"}]},
        ]
    }
    p.write_text(json.dumps(rec) + "\n")
    loader = mmloader.Loader(
        str(p), preset="qwen3-vl", tokenizer=TOKENIZER, on_error="raise", micro_batch_size=1
    )
    with pytest.raises(mmloader.Error, match="loss_weight"):
        next(iter(loader))


def test_settings_need_the_recipe():
    with pytest.raises(mmloader.ConfigError, match="needs recipe='llama-factory'"):
        mmloader.Loader(os.path.join(DATA, "identity.json"), tokenizer=TOKENIZER, cutoff_len=10)
    with pytest.raises(mmloader.ConfigError, match="label_mode"):
        mmloader.Loader(
            os.path.join(DATA, "identity.json"),
            tokenizer=TOKENIZER,
            recipe="llama-factory",
            label_mode="last_assistant",
        )
    with pytest.raises(mmloader.ConfigError, match="incompatible"):
        mmloader.Loader(
            os.path.join(DATA, "identity.json"),
            tokenizer=TOKENIZER,
            recipe="llama-factory",
            mask_history=True,
            train_on_prompt=True,
        )
    with pytest.raises(mmloader.ConfigError, match="Qwen3-VL"):
        mmloader.Loader(
            os.path.join(DATA, "identity.json"),
            tokenizer=TOKENIZER,
            recipe="llama-factory",
            enable_thinking=True,
        )


def test_per_source_recipe():
    """A mixture: one source under LLaMA-Factory's recipe (cutoff_len 64), one under the
    processor's; each sample as its own source's recipe makes it."""
    path = os.path.join(DATA, "glaive_toolcall_en_demo.json")
    src = [
        mmloader.Source(path, name="lf", choose=6, recipe="llama-factory", cutoff_len=64),
        mmloader.Source(path, name="hf", choose=6),
    ]
    loader = mmloader.Loader(
        src, data_format="json", tokenizer=TOKENIZER, shuffle=False, micro_batch_size=1
    )
    lens = [len(as_np(b)["input_ids"][0]) for b in loader]
    assert len(lens) == 12
    assert sum(n <= 64 for n in lens) >= 6 and max(lens) > 64


def _photo_records(folder):
    """Real photos (scikit-image's and matplotlib's, tests/photos.py) re-encoded as JPEG and
    PNG, RGB and L, sized across LLaMA-Factory's image caps: over image_max_pixels (768^2;
    retina 1411^2 lands on 768 exactly, hubble 1000x872, enlarged ones up to 1700x1300), under
    image_min_pixels (32^2) and a side under 28, a strip wider than 200:1, RGBA and P
    (alpha / palette dropped by its convert("RGB")) under the cap; one LLaMA-Factory
    sharegpt record each, with the folder's dataset_info.json."""
    from PIL import Image

    import photos as ph

    full = {n: Image.open(ph.data_file(*ph._PHOTOS[n])) for n in ("retina", "hubble", "camera")}
    small = ph.photos(640)
    ast = small["astronaut"]
    cases = [
        ("retina.jpg", full["retina"], "JPEG"),
        ("hubble.png", full["hubble"], "PNG"),
        ("astronaut_big.jpg", ast.resize((1700, 1300), Image.BICUBIC), "JPEG"),
        ("camera_big.jpg", full["camera"].resize((1000, 900), Image.BICUBIC), "JPEG"),  # L
        ("moon_big.png", small["moon"].resize((900, 800), Image.BICUBIC), "PNG"),  # L
        ("coffee_wide.jpg", small["coffee"].resize((1600, 500), Image.BICUBIC), "JPEG"),
        ("chelsea_tiny.png", small["chelsea"].crop((100, 100, 125, 130)), "PNG"),
        ("rocket_thin.png", small["rocket"].crop((0, 200, 300, 203)), "PNG"),
        ("coffee_strip.png", small["coffee"].resize((6100, 400)).crop((0, 100, 6100, 130)), "PNG"),
        ("grace_rgba.png", ph.with_alpha(small["grace_hopper"]), "PNG"),
        ("chelsea_p.png", small["chelsea"].convert("P", palette=Image.ADAPTIVE), "PNG"),
        ("motorcycle.jpg", small["motorcycle"], "JPEG"),  # under the caps: untouched
    ]
    recs = []
    for fname, im, fmt in cases:
        im.save(os.path.join(folder, fname), fmt, **({"quality": 90} if fmt == "JPEG" else {}))
        recs.append(
            {
                "messages": [
                    {"role": "user", "content": "<image>What is in the picture?"},
                    {"role": "assistant", "content": f"A photo ({fname})."},
                ],
                "images": [os.path.join(folder, fname)],
            }
        )
    with open(os.path.join(folder, "photos.json"), "w") as f:
        json.dump(recs, f)
    with open(os.path.join(DATA, "dataset_info.json")) as f:
        info = json.load(f)["mllm_demo"]
    with open(os.path.join(folder, "dataset_info.json"), "w") as f:
        json.dump({"photos": dict(info, file_name="photos.json")}, f)
    return len(recs)


@pytest.fixture(scope="module")
def photo_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("lfphotos")
    _photo_records(str(d))
    return str(d)


@pytest.mark.parametrize(
    "template", ["qwen2_vl", pytest.param("qwen3_vl_nothink", marks=pytest.mark.slow)]
)
def test_image_pre_resize(lfcache, photo_dir, template):
    """LLaMA-Factory's Pillow pre-resize (image_max_pixels 768^2, image_min_pixels 32^2,
    Qwen2VLPlugin's 28-pixel sides and 200:1 ratio) before the processor: ids, grids and
    pixels equal, bitwise, on photos across the caps."""
    (ref,) = reference(
        lfcache, [dict(template=template, datasets=["photos"], dataset_dir=photo_dir)]
    )
    mine = ours("photos", template, path=os.path.join(photo_dir, "photos.json"))
    assert compare("photos", ref, mine) == 12
    grids = [ref[f"grid_{i}"].tolist()[0] for i in range(12)]
    assert grids[0][1:] != [102, 102]  # the retina photo was shrunk (1411^2 would be 102^2)


def test_image_pre_resize_settings(lfcache, photo_dir):
    """image_max_pixels / image_min_pixels under LLaMA-Factory's names, per source too."""
    settings = dict(image_max_pixels=320000, image_min_pixels=64 * 64)  # RGBA/P 512x600 stay
    job = dict(template="qwen2_vl", datasets=["photos"], dataset_dir=photo_dir, model_args=settings)
    (ref,) = reference(lfcache, [job])
    path = os.path.join(photo_dir, "photos.json")
    assert compare("photos", ref, ours("photos", "qwen2_vl", path=path, **settings)) == 12
    src = mmloader.Source(path, recipe="llama-factory", **settings)
    (b,) = [
        as_np(x)
        for x in mmloader.Loader(
            src,
            data_format="json",
            preset="qwen2.5-vl",
            tokenizer=TOKENIZER,
            shuffle=False,
            micro_batch_size=12,
            text_only_vision="omit",
            on_error="raise",
        )
    ]
    assert b["image_grid_thw"].tolist() == [ref[f"grid_{i}"].tolist()[0] for i in range(12)]


def test_image_pre_resize_refuses_other_modes(tmp_path):
    """An RGBA image over the cap: Pillow would resize it premultiplied, which is not
    reproduced; the sample is refused naming the mode, never approximated."""
    from PIL import Image

    import photos as ph

    big = ph.with_alpha(ph.photos(640)["astronaut"].resize((1000, 1000), Image.BICUBIC))
    big.save(tmp_path / "big.png")
    rec = {
        "messages": [
            {"role": "user", "content": "<image>What?"},
            {"role": "assistant", "content": "A photo."},
        ],
        "images": ["big.png"],
    }
    (tmp_path / "d.json").write_text(json.dumps([rec]))
    loader = mmloader.Loader(
        str(tmp_path / "d.json"),
        preset="qwen2.5-vl",
        tokenizer=TOKENIZER,
        recipe="llama-factory",
        on_error="raise",
        micro_batch_size=1,
    )
    with pytest.raises(mmloader.Error, match="mode RGBA"):
        next(iter(loader))
    with pytest.raises(mmloader.ConfigError, match="image_route"):
        mmloader.Loader(
            str(tmp_path / "d.json"),
            tokenizer=TOKENIZER,
            recipe="llama-factory",
            image_route="load_image",
        )


def _ours_videos(template, path, **kw):
    if template == "qwen3_vl":
        kw.setdefault("enable_thinking", True)
    loader = mmloader.Loader(
        path,
        data_format="json",
        preset=PRESET[template],
        tokenizer=TOKENIZER,
        recipe="llama-factory",
        shuffle=False,
        micro_batch_size=1,
        on_error="raise",
        num_threads=2,
        **kw,
    )
    return [as_np(b) for b in loader]


@pytest.mark.parametrize("settings", [{}, dict(video_fps=1.0, video_max_pixels=128 * 128)])
def test_video_demo(lfcache, settings):
    """LLaMA-Factory's video path on its demo videos (mllm_video_demo: 1.mp4 640x360 25 fps,
    2.avi 320x240, 3.mp4 at 30000/1001 fps): floor(duration * video_fps) frames at
    np.linspace indices, the last repeated to an even count, each shrunk with Pillow to
    video_max_pixels, then the processor's resize of the uint8 video (torch's native uint8
    antialiased bicubic): ids, labels, grids and pixel_values_videos bitwise equal."""
    job = dict(template="qwen2_vl", datasets=["mllm_video_demo"], model_args=settings)
    (ref,) = reference(lfcache, [job])
    mine = _ours_videos("qwen2_vl", os.path.join(DATA, "mllm_video_demo.json"), **settings)
    assert _compare_videos(ref, mine) == 3
    if not settings:  # 1.mp4: 9.72 s -> 19 frames + 1, 640x360 -> 341x192 -> 336x196
        assert ref["vgrid_0"].tolist() == [[10, 14, 24]]


def _compare_videos(ref, mine):
    """ids, labels, video grids and pixel_values_videos of each sample, bitwise."""
    assert len(mine) == len(ref["names"]) and len(ref["dropped"]) == 0
    for i, b in enumerate(mine):
        assert b["input_ids"][0].tolist() == ref[f"ids_{i}"].tolist(), i
        assert b["labels"][0].tolist() == ref[f"labels_{i}"].tolist(), i
        assert b["video_grid_thw"].tolist() == ref[f"vgrid_{i}"].tolist(), i
        want = ref[f"vpixels_{i}"]
        assert b["pixel_values_videos"].shape == want.shape, i
        assert np.array_equal(b["pixel_values_videos"], want), i
    return len(mine)


# Clips made at test time with Debian's ffmpeg from real photos (tests/photos.py): a pan
# across a photo, so that every kept frame differs.  (file, photo, size, rate, frames,
# encoder arguments): h264 in MP4 at 24000/1001 fps, 720x480 (shrunk by the 256^2 cap);
# MPEG-4 part 2 in AVI at 15 fps, portrait 240x320, 41 frames (5 kept: the last repeated).
CLIPS = [
    ("pan_h264.mp4", "astronaut", (720, 480), "24000/1001", 100, ["-c:v", "libx264"]),
    ("pan_mpeg4.avi", "coffee", (240, 320), "15", 41, ["-c:v", "mpeg4", "-q:v", "3"]),
]


def _video_clips(folder):
    """The CLIPS as LLaMA-Factory sharegpt records with the folder's dataset_info.json."""
    import shutil

    import photos as ph

    ffmpeg = shutil.which("ffmpeg")
    if not ffmpeg:
        pytest.skip("Debian's ffmpeg CLI is not installed (apt-get install ffmpeg)")
    recs = []
    for fname, photo, (w, h), rate, n, enc in CLIPS:
        im = np.asarray(ph.rgb(ph.photos(640)[photo]).resize((w + n * 2, h + n)))
        frames = b"".join(im[k : k + h, 2 * k : 2 * k + w].tobytes() for k in range(n))
        path = os.path.join(folder, fname)
        cmd = [ffmpeg, "-v", "error", "-y", "-f", "rawvideo", "-pix_fmt", "rgb24"]
        cmd += ["-s", f"{w}x{h}", "-r", rate, "-i", "-", *enc, "-pix_fmt", "yuv420p", path]
        subprocess.run(cmd, input=frames, check=True, timeout=120)
        msgs = [
            {"role": "user", "content": "<video>What moves in this clip?"},
            {"role": "assistant", "content": f"The camera pans ({fname})."},
        ]
        recs.append({"messages": msgs, "videos": [path]})
    with open(os.path.join(folder, "clips.json"), "w") as f:
        json.dump(recs, f)
    with open(os.path.join(DATA, "dataset_info.json")) as f:
        info = json.load(f)["mllm_video_demo"]
    with open(os.path.join(folder, "dataset_info.json"), "w") as f:
        json.dump({"clips": dict(info, file_name="clips.json")}, f)


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("lfclips")
    _video_clips(str(d))
    return str(d)


@pytest.mark.parametrize(
    "template,settings",
    [
        ("qwen3_vl_nothink", {}),
        pytest.param("qwen3_vl", {}, marks=pytest.mark.slow),
        pytest.param(
            "qwen3_vl_nothink",
            dict(video_fps=1.0, video_max_pixels=128 * 128, video_maxlen=6),
            marks=pytest.mark.slow,
        ),
    ],
)
def test_video_qwen3(lfcache, clip_dir, template, settings):
    """LLaMA-Factory's Qwen3-VL video path (Qwen3VLPlugin): its frame sampling and Pillow
    shrink, the Qwen3-VL video processor's resize (frame count in the budget), and its
    prompt: per temporal patch "<t seconds>" from idx / average_rate (the pair's mean) and
    the pads between <|vision_start|> and <|vision_end|>, in place of the whole <video> (no
    outer pair).  Its demo videos and the photo clips: ids, labels, grids and
    pixel_values_videos bitwise equal."""
    jobs = [
        dict(template=template, datasets=["mllm_video_demo"], model_args=settings),
        dict(template=template, datasets=["clips"], dataset_dir=clip_dir, model_args=settings),
    ]
    demo, clips = reference(lfcache, jobs)
    assert _compare_videos(demo, _ours_videos(template, VIDEO_DEMO, **settings)) == 3
    mine = _ours_videos(template, os.path.join(clip_dir, "clips.json"), **settings)
    assert _compare_videos(clips, mine) == len(CLIPS)
    if not settings:  # 1.mp4 (9.72 s, 25 fps): 20 frames, timestamps at idx / 25
        assert demo["vgrid_0"].tolist() == [[10, 12, 22]]
        assert demo["ids_0"].tolist().count(_tok_id("<|vision_start|>")) == 10


def _tok_id(token):
    with open(TOKENIZER, encoding="utf-8") as f:
        added = json.load(f)["added_tokens"]
    return next(t["id"] for t in added if t["content"] == token)


VIDEO_DEMO = os.path.join(DATA, "mllm_video_demo.json")


def test_video_qwen3_one_video_in_the_first_message(tmp_path):
    """LLaMA-Factory 0.9.5 takes a Qwen3-VL video's timestamps by message index and every
    video's frame count from the first video: a record with two videos, or its video in a
    later turn, is a bad record under the recipe, not a guess."""
    demo = os.path.join(DATA, "mllm_demo_data")
    two = {
        "messages": [
            {"role": "user", "content": "<video><video>Which is longer?"},
            {"role": "assistant", "content": "The first."},
        ],
        "videos": [os.path.join(demo, "1.mp4"), os.path.join(demo, "3.mp4")],
    }
    later = {
        "messages": [
            {"role": "user", "content": "Hi."},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "<video>What is in it?"},
            {"role": "assistant", "content": "A baby."},
        ],
        "videos": [os.path.join(demo, "3.mp4")],
    }
    for rec in (two, later):
        (tmp_path / "v.json").write_text(json.dumps([rec]))
        with pytest.raises(mmloader.Error, match="takes one video, in the first user message"):
            _ours_videos("qwen3_vl_nothink", str(tmp_path / "v.json"))


# Frame lists (a video given as a list of image files): photos re-encoded at test time,
# panned so that every frame differs.  (name, photo, frame size, frames, format, mode):
# 320x240 JPEG over video_max_pixels (256^2: shrunk with Pillow), odd count (the last
# repeated); 200x150 PNG under it; 240x320 gray JPEG (Pillow mode L), even count.
FRAME_LISTS = [
    ("astro", "astronaut", (320, 240), 5, "JPEG", "RGB"),
    ("coffee", "coffee", (200, 150), 4, "PNG", "RGB"),
    ("cam", "camera", (240, 320), 6, "JPEG", "L"),
]


def _frame_list_records(folder):
    """FRAME_LISTS as LLaMA-Factory sharegpt records ("videos": [[frame, ...]]) with the
    folder's dataset_info.json."""
    import photos as ph

    recs = []
    for name, photo, (w, h), n, fmt, mode in FRAME_LISTS:
        im = ph.photos(640)[photo]
        im = (ph.rgb(im) if mode == "RGB" else im.convert("L")).resize((w + 3 * n, h + 2 * n))
        paths = []
        for k in range(n):
            path = os.path.join(folder, f"{name}_{k}.{fmt.lower()}")
            with open(path, "wb") as f:
                f.write(ph.encode(im.crop((3 * k, 2 * k, 3 * k + w, 2 * k + h)), fmt))
            paths.append(path)
        msgs = [
            {"role": "user", "content": "<video>What moves in these frames?"},
            {"role": "assistant", "content": f"The camera pans ({name})."},
        ]
        recs.append({"messages": msgs, "videos": [paths]})
    with open(os.path.join(folder, "frames.json"), "w") as f:
        json.dump(recs, f)
    with open(os.path.join(DATA, "dataset_info.json")) as f:
        info = json.load(f)["mllm_video_demo"]
    with open(os.path.join(folder, "dataset_info.json"), "w") as f:
        json.dump({"frames": dict(info, file_name="frames.json")}, f)


@pytest.fixture(scope="module")
def frame_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("lfframes")
    _frame_list_records(str(d))
    return str(d)


@pytest.mark.parametrize(
    "template,settings",
    [
        ("qwen2_vl", {}),
        ("qwen3_vl_nothink", {}),
        pytest.param(
            "qwen2_vl", dict(video_fps=1.0, video_max_pixels=128 * 128), marks=pytest.mark.slow
        ),
        pytest.param(
            "qwen3_vl_nothink",
            dict(video_fps=4.0, video_max_pixels=300 * 300, video_min_pixels=200 * 200),
            marks=pytest.mark.slow,
        ),
    ],
)
def test_video_frame_lists(lfcache, frame_dir, template, settings):
    """A video given as a list of image files (its _regularize_videos of nested images):
    every frame kept (no video_fps sampling, no video_maxlen), the last repeated to an even
    count, each read and pre-resized as its images are within video_max_pixels /
    video_min_pixels, then the processor's uint8 resize; its fps is video_fps
    (second_per_grid_ts, Qwen3-VL's timestamps at frame k / video_fps).  ids, labels, grids
    and pixel_values_videos bitwise equal."""
    job = dict(template=template, datasets=["frames"], dataset_dir=frame_dir, model_args=settings)
    (ref,) = reference(lfcache, [job])
    mine = _ours_videos(template, os.path.join(frame_dir, "frames.json"), **settings)
    assert _compare_videos(ref, mine) == len(FRAME_LISTS)
    assert [int(ref[f"vgrid_{i}"][0][0]) for i in range(3)] == [3, 2, 3]  # every frame


def test_video_frame_list_modes_refused(tmp_path):
    """A frame Pillow opens in a mode whose pre-resize is not reproduced (RGBA PNG over
    video_max_pixels) is refused, naming the mode; frames of different sizes too."""
    import photos as ph

    im = ph.rgb(ph.photos(640)["astronaut"]).resize((320, 240))
    rgba, small = tmp_path / "a.png", tmp_path / "b.jpg"
    rgba.write_bytes(ph.encode(ph.with_alpha(im), "PNG"))
    small.write_bytes(ph.encode(im.resize((160, 120)), "JPEG"))
    big = tmp_path / "c.jpg"
    big.write_bytes(ph.encode(im, "JPEG"))
    for frames, match in (([rgba, rgba], "mode RGBA"), ([big, small], "one size")):
        rec = {
            "messages": [
                {"role": "user", "content": "<video>What happens?"},
                {"role": "assistant", "content": "Nothing."},
            ],
            "videos": [[str(f) for f in frames]],
        }
        (tmp_path / "v.json").write_text(json.dumps([rec]))
        with pytest.raises(mmloader.Error, match=match):
            _ours_videos("qwen2_vl", str(tmp_path / "v.json"))
