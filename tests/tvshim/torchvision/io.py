"""torchvision.io.read_video with its PyAV backend (torchvision's default video backend),
reproduced from torchvision 0.21-0.25's torchvision/io/video.py (read_video,
_read_from_stream, _align_audio_frames; removed in 0.26): what qwen-vl-utils'
_read_video_torchvision calls.  The same PyAV calls in the same order: open with
metadata_errors="ignore", seek to the keyframe before start (minus the 1 + 5 frames of
slack), decode the video stream into a dict keyed by pts until end_pts (+ 5 frames of
buffer), keep start <= pts <= end sorted by pts (plus the frame before start when none
lands on it), every kept frame to_rgb().to_ndarray(), np.stack; the audio stream the
same way (concatenated and trimmed to the range).  So it decodes and holds EVERY frame of
the range: a whole video when no end is given.  Image decoding is not reproduced."""

import math
import re

import numpy as np
import torch

try:
    import av

    av.logging.set_level(av.logging.ERROR)
    FFmpegError = getattr(av, "FFmpegError", None) or av.AVError
except ImportError:  # pragma: no cover - the shim's users have PyAV
    av = None

_CALLED_TIMES = 0
_GC_COLLECTION_INTERVAL = 10
_DEFAULT_TIMEBASE = None  # torchvision: Fraction(0, 1) from _video_opt; only used for audio


def _read_from_stream(container, start_offset, end_offset, pts_unit, stream, stream_name):
    global _CALLED_TIMES
    _CALLED_TIMES += 1
    if _CALLED_TIMES % _GC_COLLECTION_INTERVAL == _GC_COLLECTION_INTERVAL - 1:
        import gc

        gc.collect()

    if pts_unit == "sec":
        start_offset = int(math.floor(start_offset * (1 / stream.time_base)))
        if end_offset != float("inf"):
            end_offset = int(math.ceil(end_offset * (1 / stream.time_base)))

    frames = {}
    should_buffer = True
    max_buffer_size = 5
    if stream.type == "video":
        # DivX-style packed B-frames can have out-of-order pts (2 frames in a single packet)
        extradata = stream.codec_context.extradata
        if extradata and b"DivX" in extradata:
            pos = extradata.find(b"DivX")
            d = extradata[pos:]
            o = re.search(rb"DivX(\d+)Build(\d+)(\w)", d)
            if o is None:
                o = re.search(rb"DivX(\d+)b(\d+)(\w)", d)
            if o is not None:
                should_buffer = o.group(3) == b"p"
    seek_offset = start_offset
    seek_offset = max(seek_offset - 1, 0)  # some files don't seek to the right location
    if should_buffer:
        seek_offset = max(seek_offset - max_buffer_size, 0)
    try:
        container.seek(seek_offset, any_frame=False, backward=True, stream=stream)
    except FFmpegError:
        return []
    buffer_count = 0
    try:
        for _idx, frame in enumerate(container.decode(**stream_name)):
            frames[frame.pts] = frame
            if frame.pts >= end_offset:
                if should_buffer and buffer_count < max_buffer_size:
                    buffer_count += 1
                    continue
                break
    except FFmpegError:
        pass
    result = [frames[i] for i in sorted(frames) if start_offset <= frames[i].pts <= end_offset]
    if len(frames) > 0 and start_offset > 0 and start_offset not in frames:
        preceding_frames = [i for i in frames if i < start_offset]
        if len(preceding_frames) > 0:
            first_frame_pts = max(preceding_frames)
            result.insert(0, frames[first_frame_pts])
    return result


def _align_audio_frames(aframes, audio_frames, ref_start, ref_end):
    start, end = audio_frames[0].pts, audio_frames[-1].pts
    total_aframes = aframes.shape[1]
    step_per_aframe = (end - start + 1) / total_aframes
    s_idx = 0
    e_idx = total_aframes
    if start < ref_start:
        s_idx = int((ref_start - start) / step_per_aframe)
    if end > ref_end:
        e_idx = int((ref_end - end) / step_per_aframe)  # negative: from the end, as torchvision
    return aframes[:, s_idx:e_idx]


def read_video(filename, start_pts=0, end_pts=None, pts_unit="pts", output_format="THWC"):
    """torchvision.io.read_video, PyAV backend: (video uint8 [T,H,W,C] or [T,C,H,W], audio,
    info with video_fps / audio_fps)."""
    output_format = output_format.upper()
    if output_format not in ("THWC", "TCHW"):
        raise ValueError(f"output_format should be either 'THWC' or 'TCHW', got {output_format}.")
    if av is None:
        raise ImportError("PyAV is not installed")
    if end_pts is None:
        end_pts = float("inf")
    if end_pts < start_pts:
        raise ValueError(
            f"end_pts should be larger than start_pts, got start_pts={start_pts} and end_pts={end_pts}"
        )

    info = {}
    video_frames = []
    audio_frames = []
    audio_timebase = _DEFAULT_TIMEBASE
    try:
        with av.open(filename, metadata_errors="ignore") as container:
            if container.streams.audio:
                audio_timebase = container.streams.audio[0].time_base
            if container.streams.video:
                video_frames = _read_from_stream(
                    container,
                    start_pts,
                    end_pts,
                    pts_unit,
                    container.streams.video[0],
                    {"video": 0},
                )
                video_fps = container.streams.video[0].average_rate
                if video_fps is not None:  # guard against potentially corrupted files
                    info["video_fps"] = float(video_fps)
            if container.streams.audio:
                audio_frames = _read_from_stream(
                    container,
                    start_pts,
                    end_pts,
                    pts_unit,
                    container.streams.audio[0],
                    {"audio": 0},
                )
                info["audio_fps"] = container.streams.audio[0].rate
    except FFmpegError:
        pass

    vframes_list = [frame.to_rgb().to_ndarray() for frame in video_frames]
    aframes_list = [frame.to_ndarray() for frame in audio_frames]
    if vframes_list:
        vframes = torch.as_tensor(np.stack(vframes_list))
    else:
        vframes = torch.empty((0, 1, 1, 3), dtype=torch.uint8)
    if aframes_list:
        aframes = torch.as_tensor(np.concatenate(aframes_list, 1))
        if pts_unit == "sec":
            start_pts = int(math.floor(start_pts * (1 / audio_timebase)))
            if end_pts != float("inf"):
                end_pts = int(math.ceil(end_pts * (1 / audio_timebase)))
        aframes = _align_audio_frames(aframes, audio_frames, start_pts, end_pts)
    else:
        aframes = torch.empty((1, 0), dtype=torch.float32)
    if output_format == "TCHW":
        vframes = vframes.permute(0, 3, 1, 2)  # [T,H,W,C] -> [T,C,H,W]
    return vframes, aframes, info


def decode_image(*a, **k):
    raise NotImplementedError("torchvision shim: decode_image")


class ImageReadMode:
    UNCHANGED = 0
    RGB = 3
