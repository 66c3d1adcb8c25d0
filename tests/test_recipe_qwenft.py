"""recipe="qwen-vl-finetune" against Qwen's own fine-tuning code, sample by sample.

The reference is QwenLM/Qwen3-VL's qwen-vl-finetune data path at 96588727
(qwenvl/data/data_processor.py: _build_messages, preprocess_qwen_visual,
update_processor_pixels with its DataArguments defaults, and its collator's
model_max_length cut).  That code is not on PyPI, so tests/qwenft_reference.py vendors those
functions unchanged as a TEST FIXTURE (Apache-2.0, licence and commit noted there) and
runs them in a subprocess of this interpreter (transformers 5.25, PIL image backend; the
torchvision stand-in tests/tvshim only lets the processors import).  Inputs: its own demo
records (tests/data/qwenft: demo/single_images.json and its two images) and records over
real photos (scikit-image's and matplotlib's) re-encoded at test time: JPEG and PNG, gray,
RGBA, an EXIF-rotated JPEG, several images per turn, multi-turn, a user turn holding the
token "assistant".  Compared bitwise: input_ids, labels, image_grid_thw, pixel_values.
data_flatten / data_packing: its flattened collator's batches, every key; packs made by
its own tools/pack_data.py (binpacking) where it can count them (images and text).

Skips when the Qwen tokenizer is absent.  Qwen2.5-VL runs by default, Qwen3-VL's photos
and given pixel limits under @slow (its demo records by default).
"""

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from typing import List

import numpy as np
import pytest
from PIL import Image

import mmloader
import photos
from conftest import as_np, same
from refchild import RefChild
from test_template import QWEN2_VL_TEMPLATE, QWEN3_VL_TEMPLATE

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEMO = os.path.join(HERE, "data", "qwenft")
TOKDIR = os.path.join(ROOT, "..", "shared", "data", "qwen3-tokenizer")
if not os.path.isdir(TOKDIR):
    TOKDIR = "/work/shared/data/qwen3-tokenizer"
TOKENIZER = os.path.join(TOKDIR, "tokenizer.json")
TEMPLATE = {"qwen2.5-vl": QWEN2_VL_TEMPLATE, "qwen3-vl": QWEN3_VL_TEMPLATE}

pytestmark = pytest.mark.skipif(
    not os.path.isfile(TOKENIZER),
    reason="the Qwen tokenizer (shared/data/qwen3-tokenizer) is absent",
)


def _skip_without_qwens_packages():
    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:  # scripts/test-py.sh's second Python has neither
        pytest.skip(f"Qwen's fine-tuning code needs {' and '.join(missing)}, not installed here")


def reference(tmp, file, data_path, preset, **job):
    """Qwen's data path over file (cached by content): the npz as a dict."""
    _skip_without_qwens_packages()
    job = dict(job, file=file, data_path=data_path, preset=preset, tokenizer=TOKDIR)
    with open(file, "rb") as f:
        key = hashlib.sha256(f.read() + json.dumps(job, sort_keys=True).encode()).hexdigest()[:16]
    out = os.path.join(str(tmp), f"qft-{key}.npz")
    if not os.path.exists(out):
        _child(tmp).run([dict(job, out=out, chat_template=TEMPLATE[preset])], timeout=900)
    return dict(np.load(out))


_CHILD: List[RefChild] = []


def _child(tmp) -> RefChild:
    """The module's one reference child (tests/refchild.py), started by the first reference
    it must make (in the module's cache folder, outside the repository), stopped at the
    module's end: one torch + transformers import for the module, not one per reference.
    The one-shot mode ran several jobs in one start already; jobs share nothing but imports."""
    if not _CHILD:
        # torchvision 0.25's read_video for videos (tests/qwenft_reference.py says why)
        env = dict(
            os.environ, PYTHONPATH=os.path.join(HERE, "tvshim"), MMLOADER_TVSHIM_VERSION="0.25.0"
        )
        _CHILD.append(
            RefChild([sys.executable, os.path.join(HERE, "qwenft_reference.py")], env, str(tmp))
        )
    return _CHILD[0]


@pytest.fixture(scope="module", autouse=True)
def _stop_the_reference_child():
    yield
    while _CHILD:
        _CHILD.pop().close()


def ours(file, image_root, preset, **kw):
    """Per record: (ids, labels, grid, pixels), or the error's text, in file order."""
    loader = mmloader.Loader(
        file,
        preset=preset,
        tokenizer=TOKENIZER,
        recipe="qwen-vl-finetune",
        image_root=image_root,
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
    return out


def compare(ref, mine):
    n = int(ref["n"])
    assert not [k for k in ref if k.startswith("err_")], [str(ref[k]) for k in ref if "err" in k]
    assert len(mine) == n
    for i, (ids, labels, grid, pixels) in enumerate(mine):
        assert ids.tolist() == ref[f"ids_{i}"].tolist(), i
        assert labels.tolist() == ref[f"labels_{i}"].tolist(), i
        if f"grid_{i}" in ref:
            assert grid is not None and grid.tolist() == ref[f"grid_{i}"].tolist(), i
            assert pixels.dtype == ref[f"pixels_{i}"].dtype, i
            assert np.array_equal(pixels, ref[f"pixels_{i}"]), i
        else:
            assert grid is None, i
    return n


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("qwenft")


@pytest.mark.parametrize("preset", ["qwen2.5-vl", "qwen3-vl"])
def test_demo_records(cache, preset):
    """Its own demo/single_images.json under its defaults (max_pixels 28*28*576,
    min_pixels 28*28*16, model_max_length 512)."""
    f = os.path.join(DEMO, "demo", "single_images.json")
    assert compare(reference(cache, f, DEMO, preset), ours(f, DEMO, preset)) == 3


def _exif_rotated(im):
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 CW to display
    return photos.encode(photos.rgb(im), "JPEG", quality=90, exif=exif.tobytes())


def _photo_records(folder):
    """Records over re-encoded photos (folder/img/*), as Qwen's LLaVA layout writes them."""
    os.makedirs(os.path.join(folder, "img"), exist_ok=True)
    ph = photos.photos(max_side=1024)
    files = {}

    def put(name, data):
        with open(os.path.join(folder, "img", name), "wb") as f:
            f.write(data)
        files[name] = f"img/{name}"
        return files[name]

    for k, (name, im) in enumerate(sorted(ph.items())):
        if k % 2:
            put(f"{name}.jpg", photos.encode(im, "JPEG", quality=88))
        else:
            put(f"{name}.png", photos.encode(im, "PNG"))
    put("astronaut_rgba.png", photos.encode(photos.with_alpha(ph["astronaut"]), "PNG"))
    put("chelsea_exif.jpg", _exif_rotated(ph["chelsea"]))
    names = sorted(files.values())
    recs = []
    for k, img in enumerate(names):
        recs.append(
            {
                "image": img,
                "conversations": [
                    {
                        "from": "human",
                        "value": [
                            "<image>\nDescribe the photo.",
                            "What is in this picture?\n<image>",
                            "  Look: <image>  what colours? ",
                        ][k % 3],
                    },
                    {"from": "gpt", "value": f"A photo ({k}).\n"},
                ],
            }
        )
    recs += [
        {
            "image": [names[0], names[1]],
            "conversations": [
                {"from": "human", "value": "Compare <image> and <image> please."},
                {"from": "gpt", "value": "The first is brighter."},
            ],
        },
        {
            "image": names[2],
            "conversations": [
                {"from": "human", "value": "<image>What is it?"},
                {"from": "gpt", "value": "A photo."},
                {"from": "human", "value": "\n And the colour?\n"},
                {"from": "gpt", "value": "  Mostly grey.  \n"},
            ],
        },
        {
            "conversations": [  # text only
                {"from": "human", "value": "  Say hi.  "},
                {"from": "gpt", "value": "hi"},
            ]
        },
        {
            "conversations": [  # "assistant" in a user turn: its label scan starts there too
                {"from": "human", "value": "assistant\nsays hello, then asks <image> what?"},
                {"from": "gpt", "value": "Nothing."},
            ],
            "image": names[3],
        },
    ]
    path = os.path.join(folder, "photos.jsonl")
    with open(path, "w") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")
    return path


def test_quirk_record_is_labelled_from_the_user_turn(tmp_path):
    """The "assistant" token in a user turn starts a labelled span, as its scan does."""
    path = _photo_records(str(tmp_path))
    ids, labels, _, _ = ours(path, str(tmp_path), "qwen2.5-vl", model_max_length=4096)[-1]
    first = int(np.argmax(labels != -100))
    user = list(ids).index(77091)  # the first "assistant": inside the user turn
    assert first == user + 2


@pytest.mark.parametrize("preset", ["qwen2.5-vl", pytest.param("qwen3-vl", marks=pytest.mark.slow)])
def test_photos(cache, tmp_path, preset):
    """Real photos, over and under its max_pixels, gray, RGBA, EXIF-rotated, several per
    turn, multi-turn; model_max_length large enough to keep them."""
    path = _photo_records(str(tmp_path))
    kw = dict(model_max_length=8192)
    n = compare(
        reference(cache, path, str(tmp_path), preset, **kw), ours(path, str(tmp_path), preset, **kw)
    )
    assert n == 16


@pytest.mark.slow
def test_pixel_limits_under_its_names(cache, tmp_path):
    """min_pixels / max_pixels given: Qwen's DataArguments of the same names."""
    path = _photo_records(str(tmp_path))
    args = dict(min_pixels=200 * 28 * 28, max_pixels=300 * 28 * 28)
    ref = reference(cache, path, str(tmp_path), "qwen2.5-vl", data_args=args, model_max_length=8192)
    compare(ref, ours(path, str(tmp_path), "qwen2.5-vl", model_max_length=8192, **args))


def test_transformers_5_pixel_limits(cache, tmp_path):
    """Under transformers 5 its update_processor_pixels changes nothing (the reference
    checks it): the checkpoint's limits, which min_pixels / max_pixels given reproduce."""
    path = _photo_records(str(tmp_path))
    ref = reference(cache, path, str(tmp_path), "qwen2.5-vl", pixels="5", model_max_length=8192)
    kw = dict(min_pixels=3136, max_pixels=12845056, model_max_length=8192)
    compare(ref, ours(path, str(tmp_path), "qwen2.5-vl", **kw))


def test_model_max_length_cuts_text(cache, tmp_path):
    """Its collator's cut of each row to model_max_length, on text-only samples."""
    path = os.path.join(str(tmp_path), "text.jsonl")
    with open(path, "w") as f:
        for k in range(4):
            conv = [
                {"from": "human", "value": f"Count to {10 + k}."},
                {"from": "gpt", "value": " ".join(str(i) for i in range(10 + 7 * k))},
            ]
            f.write(json.dumps({"conversations": conv}) + "\n")
    ref = reference(cache, path, str(tmp_path), "qwen2.5-vl", model_max_length=40)
    assert int(ref["full_3"]) > 40  # the cut happens
    compare(ref, ours(path, str(tmp_path), "qwen2.5-vl", model_max_length=40))


def test_the_default_cut_is_the_checkpoint_tokenizers(cache, tmp_path):
    """Its padded collator is built on processor.tokenizer, whose model_max_length is the
    tokenizer folder's (131072 in this Qwen tokenizer's tokenizer_config.json), not its
    TrainingArguments' 512 (train_qwen.py gives that only to the Trainer's own tokenizer):
    a 600-token sample is not cut by default, as in its code; a folder that says 40 cuts at
    40 by default; a Tokenizer object with no folder must say which."""
    path = os.path.join(str(tmp_path), "long.jsonl")
    with open(path, "w") as f:
        conv = [
            {"from": "human", "value": "Count."},
            {"from": "gpt", "value": " ".join(str(i) for i in range(300))},
        ]
        f.write(json.dumps({"conversations": conv}) + "\n")
    ref = reference(cache, path, str(tmp_path), "qwen2.5-vl")  # its own default
    assert int(ref["full_0"]) > 512 and len(ref["ids_0"]) == int(ref["full_0"])  # uncut
    compare(ref, ours(path, str(tmp_path), "qwen2.5-vl"))
    folder = os.path.join(str(tmp_path), "tok40")
    os.makedirs(folder)
    shutil.copy(TOKENIZER, folder)
    with open(os.path.join(TOKDIR, "tokenizer_config.json")) as f:
        conf = json.load(f)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(dict(conf, model_max_length=40), f)
    kw = dict(preset="qwen2.5-vl", recipe="qwen-vl-finetune", shuffle=False, micro_batch_size=1)
    with mmloader.Loader(path, tokenizer=folder, **kw) as a:
        with mmloader.Loader(path, tokenizer=TOKENIZER, model_max_length=40, **kw) as b:
            assert np.array_equal(as_np(next(a))["input_ids"], as_np(next(b))["input_ids"])
    with pytest.raises(mmloader.ConfigError, match="pass model_dir= or model_max_length="):
        mmloader.Loader(path, tokenizer=mmloader.Tokenizer.from_file(TOKENIZER), **kw)


def test_a_cut_through_an_image_is_refused():
    """model_max_length that would cut an image's tokens: skipped as too_long (Qwen's
    collator would hand the model fewer image tokens than features, which it refuses)."""
    f = os.path.join(DEMO, "demo", "single_images.json")
    loader = mmloader.Loader(
        f,
        preset="qwen2.5-vl",
        tokenizer=TOKENIZER,
        recipe="qwen-vl-finetune",
        image_root=DEMO,
        model_max_length=64,
        shuffle=False,
        micro_batch_size=1,
        on_error="raise",
    )
    with pytest.raises(mmloader.Error, match="model_max_length=64 would cut"):
        next(iter(loader))


@pytest.mark.parametrize(
    "rec, match",
    [
        (
            {
                "conversations": [
                    {"from": "system", "value": "Be brief."},
                    {"from": "human", "value": "hi"},
                    {"from": "gpt", "value": "hi"},
                ]
            },
            "role \"system\"",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "video", "video": ["f1.jpg", "f2.jpg"]},
                            {"type": "text", "text": "what?"},
                        ],
                    },
                    {"role": "assistant", "content": "x"},
                ]
            },
            "video 0 is a frame list",
        ),
        (
            {
                "system": "Be brief.",
                "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hi"}],
            },
            "top-level \"system\"",
        ),
    ],
)
def test_what_it_cannot_reproduce_is_refused(tmp_path, rec, match):
    path = os.path.join(str(tmp_path), "r.jsonl")
    with open(path, "w") as f:
        f.write(json.dumps(rec) + "\n")
    loader = mmloader.Loader(
        path,
        preset="qwen2.5-vl",
        tokenizer=TOKENIZER,
        recipe="qwen-vl-finetune",
        micro_batch_size=1,
        on_error="raise",
    )
    with pytest.raises(mmloader.Error, match=match):
        next(iter(loader))


def test_settings_are_checked():
    f = os.path.join(DEMO, "demo", "single_images.json")
    kw = dict(preset="qwen2.5-vl", tokenizer=TOKENIZER, micro_batch_size=1)
    with pytest.raises(mmloader.ConfigError, match="model_max_length is a qwen-vl-finetune"):
        mmloader.Loader(f, model_max_length=100, **kw)
    with pytest.raises(mmloader.ConfigError, match="cutoff_len is a LLaMA-Factory"):
        mmloader.Loader(f, recipe="qwen-vl-finetune", cutoff_len=100, **kw)
    with pytest.raises(mmloader.ConfigError, match="video_maxlen is a LLaMA-Factory"):
        mmloader.Loader(f, recipe="qwen-vl-finetune", video_maxlen=10, **kw)
    with pytest.raises(mmloader.ConfigError, match="video_max_frames is a qwen-vl-finetune"):
        mmloader.Loader(f, recipe="llama-factory", video_max_frames=10, **kw)
    with pytest.raises(mmloader.ConfigError, match="video_fps is a LLaMA-Factory or qwen-vl"):
        mmloader.Loader(f, video_fps=1.0, **kw)
    with pytest.raises(mmloader.ConfigError, match="video_max_frames cannot be smaller"):
        mmloader.Loader(f, recipe="qwen-vl-finetune", video_min_frames=9, **kw)
    with pytest.raises(mmloader.ConfigError, match="qwen3_video_prompt"):
        mmloader.Loader(f, recipe="qwen-vl-finetune", qwen3_video_prompt="blocks-in-pair", **kw)
    with pytest.raises(mmloader.ConfigError, match="label_mode"):
        mmloader.Loader(f, recipe="qwen-vl-finetune", label_mode="last_assistant", **kw)
    with pytest.raises(mmloader.ConfigError, match="image_route"):
        mmloader.Loader(f, recipe="qwen-vl-finetune", image_route="qwen-vl-utils", **kw)
    with pytest.raises(mmloader.ConfigError, match="77091"):
        mmloader.Loader(
            f, recipe="qwen-vl-finetune", preset="qwen2.5-vl", tokenizer="tiny", micro_batch_size=1
        )
    L = mmloader.Loader(f, recipe="qwen-vl-finetune", **kw)
    assert (L.vision_config["min_pixels"], L.vision_config["max_pixels"]) == (12544, 451584)
    assert L.vision_config["image_route"] == "load_image"


def test_per_source(cache):
    """recipe= per source: a qwen-vl-finetune source beside a default one."""
    f = os.path.join(DEMO, "demo", "single_images.json")
    src = [
        mmloader.Source(f, name="qft", recipe="qwen-vl-finetune", image_root=DEMO),
        mmloader.Source(f, name="hf", image_root=DEMO),
    ]
    loader = mmloader.Loader(
        src,
        preset="qwen2.5-vl",
        tokenizer=TOKENIZER,
        shuffle=False,
        micro_batch_size=1,
        on_error="raise",
        num_threads=1,
    )
    got = [as_np(b) for b in loader]
    ref = reference(cache, f, DEMO, "qwen2.5-vl")
    qft = [
        b for b in got if b["input_ids"][0].tolist() in [ref[f"ids_{i}"].tolist() for i in range(3)]
    ]
    assert len(qft) == 3 and len(got) == 6


# Clips made at test time with Debian's ffmpeg from real photos (tests/photos.py), a pan
# across the photo so that every frame differs: (file, photo, size, rate, frames, encoder
# arguments).  Several rates (24000/1001, 15, 6, 10), durations (0.6 to 3.8 s), frame
# counts odd and even (the processor repeats the last frame of an odd count), codecs (h264
# in MP4, MPEG-4 part 2 in AVI, H.264 in MKV, Motion JPEG in MOV: full-range YUV).
CLIPS = [
    ("pan_h264.mp4", "astronaut", (320, 240), "24000/1001", 14, ["-c:v", "libx264"]),
    ("pan_mpeg4.avi", "coffee", (240, 320), "15", 9, ["-c:v", "mpeg4", "-q:v", "3"]),
    ("pan_h264_6fps.mkv", "chelsea", (256, 192), "6", 23, ["-c:v", "libx264"]),
    ("pan_mjpeg.mov", "rocket", (224, 160), "10", 38, ["-c:v", "mjpeg", "-q:v", "4"]),
]


def _clip_records(folder):
    """The CLIPS, one record each in Qwen's layout ("video": path, "<video>" in the turn),
    and one with an image and a video; the records' path."""

    ffmpeg = shutil.which("ffmpeg")
    if not ffmpeg:
        pytest.skip("Debian's ffmpeg CLI is not installed (apt-get install ffmpeg)")
    if importlib.util.find_spec("av") is None:  # the reference's read_video (tests/tvshim)
        pytest.skip("PyAV is not installed: the reference reads videos with torchvision's PyAV")
    os.makedirs(os.path.join(folder, "clips"), exist_ok=True)
    ph = photos.photos(640)
    recs = []
    for k, (fname, photo, (w, h), rate, n, enc) in enumerate(CLIPS):
        im = np.asarray(photos.rgb(ph[photo]).resize((w + n * 2, h + n)))
        frames = b"".join(im[j : j + h, 2 * j : 2 * j + w].tobytes() for j in range(n))
        pix = "yuvj420p" if "mjpeg" in enc else "yuv420p"
        cmd = [ffmpeg, "-v", "error", "-y", "-f", "rawvideo", "-pix_fmt", "rgb24"]
        cmd += ["-s", f"{w}x{h}", "-r", rate, "-i", "-", *enc, "-pix_fmt", pix]
        subprocess.run(
            cmd + [os.path.join(folder, "clips", fname)], input=frames, check=True, timeout=120
        )
        turn = ["<video>\nWhat moves in this clip?", "What moves here? <video>"][k % 2]
        recs.append(
            {
                "video": f"clips/{fname}",
                "conversations": [
                    {"from": "human", "value": turn},
                    {"from": "gpt", "value": f"The camera pans ({fname})."},
                ],
            }
        )
    photo = os.path.join(folder, "clips", "chelsea.jpg")
    with open(photo, "wb") as f:
        f.write(photos.encode(photos.rgb(ph["chelsea"]), "JPEG", quality=90))
    recs.append(
        {
            "image": "clips/chelsea.jpg",
            "video": "clips/pan_h264.mp4",
            "conversations": [
                {"from": "human", "value": "<image> is a still; <video> a clip. Same cat?"},
                {"from": "gpt", "value": "No."},
            ],
        }
    )
    path = os.path.join(folder, "clips.jsonl")
    with open(path, "w") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")
    return path


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("qftclips"))
    return d, _clip_records(d)


def _ours_videos(path, root, preset, **kw):
    loader = mmloader.Loader(
        path,
        preset=preset,
        tokenizer=TOKENIZER,
        recipe="qwen-vl-finetune",
        image_root=root,
        shuffle=False,
        micro_batch_size=1,
        text_only_vision="omit",
        on_error="raise",
        num_threads=2,
        **kw,
    )
    return [as_np(b) for b in loader]


def _compare_videos(ref, mine):
    """ids, labels, image and video grids, pixel_values and pixel_values_videos, bitwise."""
    assert not [k for k in ref if k.startswith("err_")], [str(ref[k]) for k in ref if "err" in k]
    assert len(mine) == int(ref["n"])
    for i, b in enumerate(mine):
        assert b["input_ids"][0].tolist() == ref[f"ids_{i}"].tolist(), i
        assert b["labels"][0].tolist() == ref[f"labels_{i}"].tolist(), i
        assert b["video_grid_thw"].tolist() == ref[f"vgrid_{i}"].tolist(), i
        want = ref[f"vpixels_{i}"]
        assert b["pixel_values_videos"].shape == want.shape, i
        assert np.array_equal(b["pixel_values_videos"], want), i
        if "second_per_grid_ts" in b:  # Qwen2.5-VL: its own, temporal_patch_size / fps
            assert b["second_per_grid_ts"].tolist() == ref[f"spg_{i}"].tolist(), i
        if f"grid_{i}" in ref:
            assert b["image_grid_thw"].tolist() == ref[f"grid_{i}"].tolist(), i
            assert np.array_equal(b["pixel_values"], ref[f"pixels_{i}"]), i
    return len(mine)


@pytest.mark.parametrize("preset", ["qwen2.5-vl", "qwen3-vl"])
def test_videos(cache, clip_dir, preset):
    """Its video path on ffmpeg clips: the processor's apply_chat_template reads each file
    (torchvision's read_video: every frame), the Qwen2-VL video processor keeps every frame
    (its do_sample_frames is False), the Qwen3-VL one samples int(frames / fps * 2) within
    [4, 8] at np.linspace(...).round(); the last frame repeated to an even count; the
    processor's uint8 resize within video_min_pixels / video_max_pixels (its DataArguments'
    256*28*28 and 1024*28*28, as transformers 4.57 applied them); Qwen3-VL's timestamped
    blocks in place of the whole placeholder."""
    folder, path = clip_dir
    kw = dict(model_max_length=16384)
    ref = reference(cache, path, folder, preset, **kw)
    assert _compare_videos(ref, _ours_videos(path, folder, preset, **kw)) == len(CLIPS) + 1
    grids = [ref[f"vgrid_{i}"].tolist()[0][0] for i in range(len(CLIPS))]
    if preset == "qwen2.5-vl":  # every frame, odd counts rounded up
        assert grids == [(c[4] + 1) // 2 for c in CLIPS]
    else:  # 14, 9 frames: 4; 23 at 6 fps: 7 (padded to 8); 38 at 10 fps: 7 (8)
        assert grids == [2, 2, 4, 4]


@pytest.mark.parametrize(
    "preset,settings",
    [
        # transformers 5's limits: the checkpoint's (update_processor_pixels changes nothing)
        ("qwen2.5-vl", dict(pixels="5", video_min_pixels=3136, video_max_pixels=12845056)),
        pytest.param(
            "qwen3-vl",
            dict(video_fps=4, video_min_frames=2, video_max_frames=6, video_max_pixels=300000),
            marks=pytest.mark.slow,
        ),
    ],
)
def test_video_settings_under_its_names(cache, clip_dir, preset, settings):
    """video_fps, video_min_frames, video_max_frames, video_min_pixels, video_max_pixels:
    its DataArguments of the same names."""
    folder, path = clip_dir
    settings = dict(settings)
    pixels = settings.pop("pixels", "4.57")
    ref = reference(
        cache, path, folder, preset, data_args=settings, pixels=pixels, model_max_length=16384
    )
    if pixels == "5":  # the image limits too
        settings.update(min_pixels=3136, max_pixels=12845056)
    mine = _ours_videos(path, folder, preset, model_max_length=16384, **settings)
    assert _compare_videos(ref, mine) == len(CLIPS) + 1


def test_video_settings_per_source(cache, clip_dir):
    """The video settings per source (mmloader.Source overrides): a qwen-vl-finetune
    source with video_max_frames=4 and video_fps=1 beside the loader's default recipe,
    against its code with those DataArguments."""
    folder, path = clip_dir
    args = dict(video_max_frames=4, video_fps=1)
    ref = reference(cache, path, folder, "qwen3-vl", data_args=args, model_max_length=16384)
    src = mmloader.Source(
        path,
        name="qft",
        recipe="qwen-vl-finetune",
        image_root=folder,
        model_max_length=16384,
        **args,
    )
    loader = mmloader.Loader(
        [src],
        preset="qwen3-vl",
        tokenizer=TOKENIZER,
        shuffle=False,
        micro_batch_size=1,
        text_only_vision="omit",
        on_error="raise",
        num_threads=2,
    )
    assert _compare_videos(ref, [as_np(b) for b in loader]) == len(CLIPS) + 1


# ---- data_flatten: its FlattenedDataCollatorForSupervisedDataset ---------------------------


def _ours_flat(path, root, preset, mbs, **kw):
    kw.setdefault("data_flatten", True)
    loader = mmloader.Loader(
        path,
        preset=preset,
        tokenizer=TOKENIZER,
        recipe="qwen-vl-finetune",
        image_root=root,
        shuffle=False,
        micro_batch_size=mbs,
        text_only_vision="omit",
        on_error="raise",
        num_threads=2,
        **kw,
    )
    return [as_np(b) for b in loader]


def _compare_flat(ref, mine):
    """Each batch key by key against its flattened collator's: the same keys (those it sets
    to None absent here; second_per_grid_ts, which its collator leaves out, the only one
    added), dtypes, shapes and bytes: input_ids, labels [1, L], position_ids [3, 1, L],
    attention_mask int32 cumulative lengths, pixel_values, image_grid_thw,
    pixel_values_videos, video_grid_thw.  Returns the batches' keys."""
    nb = int(ref["batches"])
    assert nb > 0 and len(mine) == nb, (nb, len(mine))
    keys = set()
    for b, got in enumerate(mine):
        want = {k.split("_", 1)[1]: v for k, v in ref.items() if k.startswith(f"b{b}_")}
        assert set(want) <= set(got), (b, sorted(set(want) - set(got)))
        assert set(got) - set(want) <= {"second_per_grid_ts"}, (b, sorted(set(got) - set(want)))
        for k, v in want.items():
            assert got[k].dtype == v.dtype and got[k].shape == v.shape, (
                b,
                k,
                got[k].shape,
                v.shape,
            )
            assert np.array_equal(got[k], v), (b, k)
        cu = got["attention_mask"]
        assert cu[0] == 0 and cu[-1] == got["input_ids"].shape[1]
        keys |= set(want)
    return keys


@pytest.mark.parametrize("preset", ["qwen2.5-vl", "qwen3-vl"])
def test_flatten_demo_records(cache, preset):
    """Its demo/single_images.json with data_flatten=True: its three records in one
    flattened batch, as its collator makes it."""
    f = os.path.join(DEMO, "demo", "single_images.json")
    ref = reference(cache, f, DEMO, preset, flatten=3)
    keys = _compare_flat(ref, _ours_flat(f, DEMO, preset, 3))
    assert {"input_ids", "labels", "position_ids", "attention_mask", "pixel_values"} <= keys
    assert ref["b0_attention_mask"].tolist()[0] == 0 and len(ref["b0_attention_mask"]) == 4
    if importlib.util.find_spec("torch") is not None:  # the adapter a Trainer takes
        import mmloader.torch

        tl = mmloader.torch.Loader(
            f, preset=preset, tokenizer=TOKENIZER, recipe="qwen-vl-finetune", data_flatten=True,
            image_root=DEMO, shuffle=False, micro_batch_size=3, mm_token_type_ids=False,
        )  # fmt: skip
        _compare_flat(ref, [{k: v.numpy() for k, v in b.items()} for b in tl])


def _mixed_records(folder):
    """Photos (one and two images per turn, gray, RGBA, EXIF-rotated), text-only and
    "assistant"-in-a-user-turn records, the ffmpeg clips and a record with an image and a
    video, interleaved so that every batch of 3 mixes them: 12 records."""
    clips = [json.loads(x) for x in open(_clip_records(folder))]
    photos_ = [json.loads(x) for x in open(_photo_records(folder))]
    # photos_[-4:]: two images, multi-turn, text only, "assistant" in a user turn
    recs = [
        photos_[0],
        clips[0],
        photos_[-2],
        clips[1],
        photos_[-4],
        photos_[5],
        photos_[-1],
        clips[4],
        clips[2],
        photos_[-3],
        clips[3],
        photos_[8],
    ]
    path = os.path.join(folder, "mixed.jsonl")
    with open(path, "w") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")
    return path


@pytest.fixture(scope="module")
def mixed_dir(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("qftmixed"))
    return d, _mixed_records(d)


@pytest.mark.parametrize("preset", ["qwen2.5-vl", "qwen3-vl"])
def test_flatten_mixed_records(cache, mixed_dir, preset):
    """Images, videos and text in the same flattened batches (4 of 3 records): M-RoPE rows
    of images and videos (Qwen2.5-VL's time scaled by its second_per_grid_ts, Qwen3-VL's
    one block per temporal patch), text-only samples' plain positions, each sample's from
    0; no model_max_length cut (its flattened collator cuts nothing)."""
    folder, path = mixed_dir
    ref = reference(cache, path, folder, preset, flatten=3)
    mine = _ours_flat(path, folder, preset, 3)
    keys = _compare_flat(ref, mine)
    assert {"pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw"} <= keys
    pos = np.concatenate([b["position_ids"][:, 0] for b in mine], axis=1)
    assert (pos[1] != pos[0]).any() and (pos[2] != pos[1]).any()  # real M-RoPE rows
    assert max(int(b["input_ids"].shape[1]) for b in mine) > 512  # past its default cut


def test_flatten_resumes_exactly(mixed_dir):
    """A state saved after k batches resumes to the same next batches (shuffled order)."""
    folder, path = mixed_dir
    kw = dict(
        preset="qwen2.5-vl",
        tokenizer=TOKENIZER,
        recipe="qwen-vl-finetune",
        data_flatten=True,
        image_root=folder,
        micro_batch_size=2,
        shuffle=True,
        seed=7,
        text_only_vision="omit",
        on_error="raise",
        num_threads=2,
    )
    first = mmloader.Loader(path, **kw)
    whole = [as_np(b) for b in first]
    assert len(whole) == 6
    again = mmloader.Loader(path, **kw)
    it = iter(again)
    for _ in range(2):
        next(it)
    state = again.state_dict()
    again.close()
    resumed = mmloader.Loader(path, **kw)
    resumed.load_state_dict(state)
    same(whole[2:], [as_np(b) for b in resumed])
    # the padded batches' state is another configuration's
    padded = mmloader.Loader(path, **dict(kw, data_flatten=False, model_max_length=16384))
    with pytest.raises(mmloader.StateError, match="data_flatten"):
        padded.load_state_dict(state)
    # and data_flatten off is left out of the fingerprint: states saved before it existed load
    fp = padded.state_dict()["fingerprint"]
    assert "data_flatten" not in fp and fp["recipe"] == "qwen-vl-finetune"


def test_flatten_settings_are_checked(tmp_path):
    f = os.path.join(DEMO, "demo", "single_images.json")
    kw = dict(preset="qwen2.5-vl", tokenizer=TOKENIZER, micro_batch_size=1)
    qft = dict(kw, recipe="qwen-vl-finetune", data_flatten=True)
    with pytest.raises(mmloader.ConfigError, match="data_flatten is a qwen-vl-finetune"):
        mmloader.Loader(f, data_flatten=True, **kw)
    with pytest.raises(mmloader.ConfigError, match="data_flatten is a qwen-vl-finetune"):
        mmloader.Loader(f, recipe="llama-factory", data_flatten=True, **kw)
    with pytest.raises(mmloader.ConfigError, match="flattened collator cuts nothing"):
        mmloader.Loader(f, model_max_length=4096, **qft)
    for bad, match in [
        (dict(packing=True, pack_length=4096), "not with packing=True"),
        (dict(seq_length=4096), "not with seq_length"),
        (dict(shift_labels=True), "not with shift_labels=True"),
        (dict(keys="megatron"), "not with keys=\"megatron\""),
        (dict(attention_mask=False), "not with attention_mask=False"),
    ]:
        with pytest.raises(mmloader.ConfigError, match=match):
            mmloader.Loader(f, **qft, **bad)
    with pytest.raises(mmloader.ConfigError, match="not with max_tokens_per_batch"):
        mmloader.Loader(
            f, preset="qwen2.5-vl", tokenizer=TOKENIZER, recipe="qwen-vl-finetune",
            data_flatten=True, max_tokens_per_batch=4096,
        )  # fmt: skip
    src = [
        mmloader.Source(f, name="qft", recipe="qwen-vl-finetune", image_root=DEMO),
        mmloader.Source(f, name="hf", image_root=DEMO),
    ]
    with pytest.raises(mmloader.ConfigError, match="source 'hf': data_flatten is a qwen-vl"):
        mmloader.Loader(src, data_flatten=True, **kw)
    src[1] = mmloader.Source(f, name="qft2", recipe="qwen-vl-finetune", model_max_length=64)
    with pytest.raises(mmloader.ConfigError, match="source 'qft2': model_max_length cuts"):
        mmloader.Loader(src, data_flatten=True, **kw)
    L = mmloader.Loader(f, **qft)
    opts = L._core().options()
    assert opts["mrope"] is True and opts["data_flatten"] is True and not opts["model_max_length"]


# ---- data_packing: its packed annotation files (tools/pack_data.py), _get_packed_item ------


def _pack_tool(cache, records, data_path, pack_length):
    """tools/pack_data.py's token count and binpacking over a .json list of records (run by
    the fixture, as its script does): the packed file's path."""
    _skip_without_qwens_packages()
    if importlib.util.find_spec("binpacking") is None:
        pytest.skip("tools/pack_data.py needs binpacking (requirements-test.txt), not installed")
    with open(records, "rb") as f:
        key = hashlib.sha256(f.read() + f"{data_path}:{pack_length}".encode()).hexdigest()[:16]
    out = os.path.join(str(cache), f"packed-{key}.json")
    if not os.path.exists(out):
        job = dict(
            pack_tool=True, file=records, data_path=data_path, tokenizer=TOKDIR,
            pack_length=pack_length, out=out,
        )  # fmt: skip
        _child(cache).run([job], timeout=900)
    return out


def _ours_packed(path, root, preset, mbs, **kw):
    return _ours_flat(path, root, preset, mbs, data_packing=True, **kw)


def _records_per_batch(ref):
    return [len(ref[f"b{b}_attention_mask"]) - 1 for b in range(int(ref["batches"]))]


@pytest.mark.parametrize("preset", ["qwen2.5-vl", "qwen3-vl"])
def test_packing_demo_packed_by_its_tool(cache, preset):
    """Its demo/single_images.json packed by its own tools/pack_data.py (pack_length 450:
    two packs, one of one record and one of two), read with data_packing=True: each batch
    of packs equals what its dataset (_get_packed_item) and flattened collator make, key
    by key, one pack per batch and both packs in one batch."""
    packs = _pack_tool(cache, os.path.join(DEMO, "demo", "single_images.json"), DEMO, 450)
    entries = json.load(open(packs))
    assert sorted(len(e) for e in entries) == [1, 2]  # the tool packed two records together
    for mbs in (1, 2):
        ref = reference(cache, packs, DEMO, preset, packed=mbs)
        keys = _compare_flat(ref, _ours_packed(packs, DEMO, preset, mbs))
        assert {"input_ids", "labels", "position_ids", "attention_mask", "pixel_values"} <= keys
    ref = reference(cache, packs, DEMO, preset, packed=1)
    assert sorted(_records_per_batch(ref)) == [1, 2]
    # the global plan (its planning pass measures packs) and the adapter a Trainer takes
    _compare_flat(ref, _ours_packed(packs, DEMO, preset, 1, global_plan=True))
    if importlib.util.find_spec("torch") is not None:
        import mmloader.torch

        tl = mmloader.torch.Loader(
            packs, preset=preset, tokenizer=TOKENIZER, recipe="qwen-vl-finetune",
            data_packing=True, image_root=DEMO, shuffle=False, micro_batch_size=1,
            mm_token_type_ids=False,
        )  # fmt: skip
        _compare_flat(ref, [{k: v.numpy() for k, v in b.items()} for b in tl])


@pytest.mark.parametrize("preset", ["qwen2.5-vl", pytest.param("qwen3-vl", marks=pytest.mark.slow)])
def test_packing_photos_packed_by_its_tool(cache, tmp_path, preset):
    """The photo records (JPEG, PNG, gray, RGBA, EXIF-rotated, two images per turn,
    multi-turn, text only, the "assistant"-token quirk) packed by its tool (pack_length
    2048: its 4096 makes two packs of these), two packs per batch."""
    folder = str(tmp_path)
    recs = [json.loads(x) for x in open(_photo_records(folder))]
    listed = os.path.join(folder, "photos.json")  # its tool reads .json lists
    with open(listed, "w") as f:
        json.dump(recs, f)
    packs = _pack_tool(cache, listed, folder, 2048)
    entries = json.load(open(packs))
    assert len(entries) >= 4 and max(len(e) for e in entries) > 2
    ref = reference(cache, packs, folder, preset, packed=2)
    keys = _compare_flat(ref, _ours_packed(packs, folder, preset, 2, dataloader_drop_last=True))
    assert {"pixel_values", "image_grid_thw"} <= keys
    assert max(_records_per_batch(ref)) > 3


def _mixed_packs(folder, path):
    """The 12 mixed records (photos, text, the ffmpeg clips, an image with a video) as 7
    entries: packs of 2, 1, 3, 2, 1 and 2 records and a plain record (a record that is not
    in a list is a pack of one, as its __getitem__ wraps it)."""
    recs = [json.loads(x) for x in open(path)]
    entries = [recs[0:2], recs[2:3], recs[3:6], recs[6], recs[7:9], recs[9:10], recs[10:12]]
    assert sum(len(e) if isinstance(e, list) else 1 for e in entries) == 12
    out = os.path.join(folder, "mixed_packs.json")
    with open(out, "w") as f:
        json.dump(entries, f)
    return out, entries


@pytest.mark.parametrize("preset", ["qwen2.5-vl", "qwen3-vl"])
def test_packing_mixed_packs(cache, mixed_dir, preset):
    """Packs mixing images, videos and text-only records, and plain records among them:
    batches of 2 entries (3 batches; the 7th entry is the epoch's partial tail, left out
    with dataloader_drop_last=True on both sides): ids,
    labels, every M-RoPE row restarting at each record, attention_mask with one entry per
    record, pixels and grids of images and videos."""
    folder, path = mixed_dir
    packs, _ = _mixed_packs(folder, path)
    ref = reference(cache, packs, folder, preset, packed=2)
    mine = _ours_packed(packs, folder, preset, 2, dataloader_drop_last=True)
    keys = _compare_flat(ref, mine)
    assert {"pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw"} <= keys
    assert _records_per_batch(ref) == [3, 4, 3]
    # each record's positions restart at 0 (the text row's first position of each record)
    for b in mine:
        cu = b["attention_mask"].tolist()
        assert all(b["position_ids"][0, 0, s] == 0 for s in cu[:-1])


def test_packing_samples_and_resumes_packs_as_units(mixed_dir):
    """A pack is one item: shuffled, sharded over ranks, counted (len), skipped and
    resumed whole.  A state saved mid-epoch resumes to the same next batches."""
    folder, path = mixed_dir
    packs, entries = _mixed_packs(folder, path)
    kw = dict(
        preset="qwen2.5-vl", tokenizer=TOKENIZER, recipe="qwen-vl-finetune", data_packing=True,
        image_root=folder, micro_batch_size=1, shuffle=True, seed=3, text_only_vision="omit",
        on_error="raise", num_threads=2,
    )  # fmt: skip
    first = mmloader.Loader(packs, **kw)
    assert len(first) == 7
    whole = [as_np(b) for b in first]
    sizes = sorted(len(b["attention_mask"]) - 1 for b in whole)
    assert sizes == sorted(len(e) if isinstance(e, list) else 1 for e in entries)
    again = mmloader.Loader(packs, **kw)
    it = iter(again)
    for _ in range(3):
        next(it)
    state = again.state_dict()
    again.close()
    resumed = mmloader.Loader(packs, **kw)
    resumed.load_state_dict(state)
    same(whole[3:], [as_np(b) for b in resumed])
    # two ranks: disjoint packs, each whole, together the epoch (one pack left over)
    ranks = [
        [as_np(b) for b in mmloader.Loader(packs, **dict(kw, dp_rank=r, dp_size=2))]
        for r in range(2)
    ]
    assert len(ranks[0]) == len(ranks[1]) == 3
    ids = [b["input_ids"].tobytes() for r in ranks for b in r]
    assert len(set(ids)) == 6 and set(ids) <= {b["input_ids"].tobytes() for b in whole}
    # the flattened batches' state is another configuration's
    flat = mmloader.Loader(packs, **dict(kw, data_packing=False, data_flatten=True))
    with pytest.raises(mmloader.StateError, match="data_packing"):
        flat.load_state_dict(state)
    fp = mmloader.Loader(path, **dict(kw, data_packing=False)).state_dict()["fingerprint"]
    assert "data_packing" not in fp  # off: states saved before it existed load


def test_packing_skips_a_pack_whole(mixed_dir, tmp_path):
    """A pack one of whose records fails (an image that does not exist) is skipped as one
    sample, the message naming the pack (file and entry) and the image; the other packs
    come through (and, as every epoch short of samples, the first again to fill it)."""
    folder, path = mixed_dir
    recs = [json.loads(x) for x in open(path)]
    bad = dict(recs[0], image="img/missing.png")
    entries = [[recs[2], recs[4]], [recs[5], bad], [recs[6]], recs[8]]
    f = str(tmp_path / "packs.json")
    with open(f, "w") as out:
        json.dump(entries, out)
    kw = dict(
        preset="qwen2.5-vl", tokenizer=TOKENIZER, recipe="qwen-vl-finetune", data_packing=True,
        image_root=folder, micro_batch_size=1, shuffle=False, num_threads=2,
    )  # fmt: skip
    loader = mmloader.Loader(f, on_error="skip", **kw)
    with pytest.warns(Warning, match=r"missing_file\): \S*packs.json\[1\].*img/missing.png"):
        got = [as_np(b) for b in loader]
    assert [len(b["attention_mask"]) - 1 for b in got] == [2, 1, 1, 2]
    same(got[3:], got[:1])
    assert loader.stats()["skipped"] == 1
    with pytest.raises(mmloader.Error, match=r"packs.json\[1\].*img/missing.png"):
        list(mmloader.Loader(f, on_error="raise", **kw))


def test_packing_settings_are_checked(tmp_path):
    f = os.path.join(DEMO, "demo", "single_images.json")
    kw = dict(preset="qwen2.5-vl", tokenizer=TOKENIZER, micro_batch_size=1, image_root=DEMO)
    qft = dict(kw, recipe="qwen-vl-finetune", data_packing=True)
    with pytest.raises(mmloader.ConfigError, match="data_packing is a qwen-vl-finetune"):
        mmloader.Loader(f, data_packing=True, **kw)
    with pytest.raises(mmloader.ConfigError, match="data_packing is a qwen-vl-finetune"):
        mmloader.Loader(f, recipe="llama-factory", data_packing=True, **kw)
    with pytest.raises(mmloader.ConfigError, match="flattened collator cuts nothing"):
        mmloader.Loader(f, model_max_length=4096, **qft)
    for bad, match in [
        (dict(packing=True, pack_length=4096), "not with packing=True"),
        (dict(seq_length=4096), "not with seq_length"),
        (dict(keys="megatron"), "not with keys=\"megatron\""),
    ]:
        with pytest.raises(mmloader.ConfigError, match=match):
            mmloader.Loader(f, **qft, **bad)
    L = mmloader.Loader(f, **qft)
    opts = L._core().options()
    assert opts["data_packing"] is True and opts["data_flatten"] is True and opts["mrope"] is True
    # a list entry without data_packing, an empty pack, a pack holding a list
    recs = json.load(open(f))
    for entries, match, packing in [
        ([recs[0:2]], "a list of records is a pack: data_packing=True", False),
        ([[]], "an empty pack", True),
        ([[recs[0], [recs[1]]]], "record 1 of the pack: bad record: the line is not", True),
    ]:
        p = str(tmp_path / "bad.json")
        with open(p, "w") as out:
            json.dump(entries + [recs[2]], out)
        opts = dict(kw, recipe="qwen-vl-finetune", on_error="raise", data_packing=packing)
        with pytest.raises(mmloader.Error, match=match):
            list(mmloader.Loader(p, **opts))


# ---- padded batches: its DataCollatorForSupervisedDataset (position_ids padded with 1) ---


@pytest.mark.parametrize("preset", ["qwen2.5-vl", "qwen3-vl"])
def test_padded_batches_with_its_positions(cache, mixed_dir, preset):
    """Padded batches of 3 of the 12 mixed records (photos, text, the ffmpeg clips, an image
    with a video) against its padded collator: ids (padded with <|endoftext|>), labels,
    position_ids [3, B, L] by its rope2d.py with padding positions 1 (mrope=True),
    pixels and grids bitwise; attention_mask its values (its collator's is bool, mmloader's
    int64: the same mask to the model).  Its collator cuts at processor.tokenizer's
    model_max_length, which its train_qwen.py never sets (the tokenizer folder's 131072):
    model_max_length=131072 here."""
    folder, path = mixed_dir
    ref = reference(cache, path, folder, preset, padded=3)
    assert int(ref["model_max_length"]) == 131072
    mine = _ours_flat(
        path, folder, preset, 3, data_flatten=False, mrope=True, model_max_length=131072
    )
    nb = int(ref["batches"])
    assert nb == 4 and len(mine) == nb
    padding_seen = False
    for b, got in enumerate(mine):
        want = {k.split("_", 1)[1]: v for k, v in ref.items() if k.startswith(f"b{b}_")}
        assert set(want) <= set(got), (b, sorted(set(want) - set(got)))
        assert set(got) - set(want) <= {"second_per_grid_ts", "rope_deltas"}, b
        for k, v in want.items():
            if k == "attention_mask":
                assert v.dtype == np.bool_ and np.array_equal(got[k].astype(bool), v), b
                continue
            assert got[k].dtype == v.dtype and got[k].shape == v.shape, (b, k, got[k].shape)
            assert np.array_equal(got[k], v), (b, k)
        pad = ~want["attention_mask"]
        padding_seen |= bool(pad.any())
        assert (got["position_ids"][:, pad] == 1).all()  # its pad_and_cat's 1, not 0
    assert padding_seen


def test_padded_positions_one_rule_per_loader():
    """mrope=True in padded batches: a mixture of qwen-vl-finetune and other sources would
    mix its rope2d.py positions with transformers': refused."""
    f = os.path.join(DEMO, "demo", "single_images.json")
    src = [
        mmloader.Source(f, name="qft", recipe="qwen-vl-finetune", image_root=DEMO),
        mmloader.Source(f, name="hf", image_root=DEMO),
    ]
    kw = dict(preset="qwen2.5-vl", tokenizer=TOKENIZER, micro_batch_size=1)
    with pytest.raises(mmloader.ConfigError, match="would mix the two rules"):
        mmloader.Loader(src, mrope=True, **kw)
    mmloader.Loader(src, mrope=False, **kw).close()


def test_last_partial_batch_is_refused_or_dropped_as_asked(cache):
    """Its Trainer keeps an epoch's last partial batch (dataloader_drop_last=False, the
    Hugging Face default): its padded collator over its 3 demo records in batches of 2
    gives a second batch of one row.  mmloader's epochs end at the last full batch, so
    under the recipe such an epoch is a ConfigError naming the samples left; with
    dataloader_drop_last=True its first batch is the only one, equal to Qwen's first."""
    f = os.path.join(DEMO, "demo", "single_images.json")
    ref = reference(cache, f, DEMO, "qwen2.5-vl", padded=2, keep_last=True)
    assert int(ref["batches"]) == 2 and ref["b1_input_ids"].shape[0] == 1  # its partial batch
    kw = dict(
        preset="qwen2.5-vl", tokenizer=TOKENIZER, recipe="qwen-vl-finetune", image_root=DEMO,
        micro_batch_size=2, shuffle=False, mrope=True, model_max_length=131072,
        text_only_vision="omit", num_threads=2,
    )  # fmt: skip
    with pytest.raises(mmloader.ConfigError, match=r"3 samples leaves 1 after its last full"):
        mmloader.Loader(f, **kw)
    with pytest.raises(mmloader.ConfigError, match=r"dataloader_drop_last=True"):
        mmloader.Loader(f, **kw)
    got = [as_np(b) for b in mmloader.Loader(f, dataloader_drop_last=True, **kw)]
    assert len(got) == 1
    for k in ("input_ids", "labels", "position_ids", "pixel_values", "image_grid_thw"):
        assert np.array_equal(got[0][k], ref[f"b0_{k}"]), k
    # the tail is per rank: 3 samples over 2 ranks are 1 each, in batches of 1: none left
    mmloader.Loader(f, **dict(kw, micro_batch_size=1, dp_rank=0, dp_size=2)).close()
    # a setting of the recipe only
    with pytest.raises(mmloader.ConfigError, match="dataloader_drop_last is a qwen-vl-finetune"):
        mmloader.Loader(
            f, dataloader_drop_last=True, preset="qwen2.5-vl", tokenizer=TOKENIZER,
            micro_batch_size=1,
        )  # fmt: skip
