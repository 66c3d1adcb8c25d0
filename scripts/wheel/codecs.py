"""The codec check of scripts/wheel/prove.sh: the wheel's bundled FFmpeg decodes each codec
the README lists, bit for bit as PyAV's FFmpeg does.

    python codecs.py make DIR    (with PyAV: encodes the files, writes PyAV's decode as .npy)
    python codecs.py check DIR   (with the installed wheel only: decodes every frame through
                                  mmloader._core.video_decode and compares)

The files are tests/test_video.py's moving pattern (even sizes, 4:2:0: the conversion to RGB
is bit-exact between FFmpeg versions there), one per codec and container.
"""

from __future__ import annotations

import fractions
import os
import sys

import numpy as np

W, H, N = 64, 48, 24
# name -> (PyAV encoder, file, size, pixel format, options)
CASES = {
    "H.264": ("libx264", "h264.mp4", (W, H), "yuv420p", {}),
    "HEVC": ("libx265", "hevc.mkv", (W, H), "yuv420p", {"x265-params": "log-level=none"}),
    "VP9": ("libvpx-vp9", "vp9.webm", (W, H), "yuv420p", {}),
    "AV1": ("libsvtav1", "av1.mp4", (64, 64), "yuv420p", {}),
    "MPEG-4": ("mpeg4", "mpeg4.avi", (W, H), "yuv420p", {}),
    "MJPEG": ("mjpeg", "mjpeg.avi", (W, H), "yuvj420p", {}),
}
# name -> the FFmpeg decoder and demuxer that read its file: scripts/wheel/libs.sh must
# enable both (tests/test_wheel_scripts.py checks, with the README's list of codecs)
FFMPEG = {
    "H.264": ("h264", "mov"),
    "HEVC": ("hevc", "matroska"),
    "VP9": ("vp9", "matroska"),
    "AV1": ("libdav1d", "mov"),
    "MPEG-4": ("mpeg4", "avi"),
    "MJPEG": ("mjpeg", "avi"),
}


def _pattern(i: int, w: int, h: int) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    return np.stack(
        [(x * 4 + i * 5) % 256, (y * 4 + i * 3) % 256, ((x + y) * 2 + i * 7) % 256], -1
    ).astype(np.uint8)


def make(out: str) -> None:
    import av

    os.makedirs(out, exist_ok=True)
    for name, (codec, fname, (w, h), pix, opts) in CASES.items():
        path = os.path.join(out, fname)
        with av.open(path, "w") as c:
            s = c.add_stream(codec, rate=24)
            s.width, s.height, s.pix_fmt = w, h, pix
            s.codec_context.gop_size = 12
            s.codec_context.time_base = fractions.Fraction(1, 24)
            if opts:
                s.options = opts
            for i in range(N):
                for p in s.encode(av.VideoFrame.from_ndarray(_pattern(i, w, h), "rgb24")):
                    c.mux(p)
            for p in s.encode():
                c.mux(p)
        with av.open(path) as c:
            frames = [f.to_ndarray(format="rgb24") for f in c.decode(c.streams.video[0])]
        np.save(path + ".npy", np.stack(frames))


def check(src: str) -> int:
    from mmloader import _core

    bad = 0
    for name, (_, fname, _, _, _) in CASES.items():
        path = os.path.join(src, fname)
        ref = np.load(path + ".npy")
        try:
            r = _core.video_decode(path, list(range(len(ref))))
        except Exception as e:  # the decoder or demuxer missing from the bundled FFmpeg
            print(f"  {name:7} {fname:11} FAILED: {type(e).__name__}: {e}")
            bad += 1
            continue
        got = [
            np.frombuffer(b, np.uint8).reshape(h, w, 3)
            for b, (h, w) in zip(r["frames"], r["shapes"])
        ]
        same = len(got) == len(ref) and all(np.array_equal(a, b) for a, b in zip(got, ref))
        print(
            f"  {name:7} {fname:11} {len(got)}/{len(ref)} frames, "
            f"{'equal to PyAV' if same else 'DIFFERENT from PyAV'}"
        )
        bad += not same
    return bad


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("make", "check"):
        sys.exit("usage: codecs.py make|check DIR")
    if sys.argv[1] == "make":
        make(sys.argv[2])
    else:
        sys.exit(1 if check(sys.argv[2]) else 0)
