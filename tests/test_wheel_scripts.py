"""The pieces of scripts/build-wheel.sh that can be checked in seconds (the whole build and
its proof run in CI: .ci/run, docs/wheel.md).

scripts/wheel/hide.py hides libraries in one process through mount(2): the old proof bound
/dev/null over them with one mount(8) call each, and mount(8) itself loads libmount and
libblkid, so hiding libblkid broke every later mount ("libblkid.so.1: file too short")."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HIDE = os.path.join(ROOT, "scripts", "wheel", "hide.py")


def _namespaces_ok() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True)
    return r.returncode == 0


needs_root = pytest.mark.skipif(
    not _namespaces_ok(), reason="needs root and a private mount namespace (unshare -m)"
)


def _lib(name: str) -> str:
    out = subprocess.run(
        ["ldd", shutil.which("mount") or "/bin/mount"], capture_output=True, text=True
    ).stdout
    for line in out.splitlines():
        if line.split()[:1] == [name] and "=>" in line:
            return os.path.realpath(line.split()[2])
    pytest.skip(f"mount(8) here does not load {name}")


@needs_root
def test_hide_mount_libraries_then_mount_fails_on_them(tmp_path):
    # both of mount(8)'s own libraries hidden in one go, then mount(8) run: it must fail on
    # an empty file (hidden), while hide.py itself got through every mount
    blkid, libmount = _lib("libblkid.so.1"), _lib("libmount.so.1")
    r = subprocess.run(
        [
            "unshare",
            "-m",
            "--propagation",
            "private",
            sys.executable,
            HIDE,
            blkid,
            libmount,
            "--",
            "mount",
            "--version",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0, r.stdout
    assert "file too short" in r.stderr, r.stderr
    # and the hiding stays inside that namespace
    assert os.path.getsize(blkid) > 0
    assert subprocess.run(["mount", "--version"], capture_output=True).returncode == 0


@needs_root
def test_hide_files_are_empty_for_the_command(tmp_path):
    files = []
    for i in range(3):
        p = tmp_path / f"f{i}"
        p.write_bytes(b"x" * 100)
        files.append(str(p))
    r = subprocess.run(
        [
            "unshare",
            "-m",
            "--propagation",
            "private",
            sys.executable,
            HIDE,
            *files,
            "--",
            "wc",
            "-c",
            *files,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    sizes = [int(line.split()[0]) for line in r.stdout.splitlines()[:3]]
    assert sizes == [0, 0, 0]
    assert all(os.path.getsize(f) == 100 for f in files)


@needs_root
def test_hide_names_the_file_it_cannot_hide(tmp_path):
    missing = str(tmp_path / "nope.so")
    r = subprocess.run(
        ["unshare", "-m", "--propagation", "private", sys.executable, HIDE, missing, "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0
    assert missing in r.stderr and "No such file" in r.stderr


def _enabled(script: str, what: str) -> set:
    m = re.search(rf"--enable-{what}=([\w,]+)", script)
    assert m, f"scripts/wheel/libs.sh: no --enable-{what}="
    return set(m.group(1).split(","))


def test_wheel_ffmpeg_enables_every_codec_the_readme_lists():
    # the wheel's FFmpeg is built with --disable-everything: a decoder or demuxer left out of
    # libs.sh would only show in the full build's proof (CI, ~20 min); this catches it here
    spec = importlib.util.spec_from_file_location(
        "wheel_codecs", os.path.join(ROOT, "scripts", "wheel", "codecs.py")
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with open(os.path.join(ROOT, "scripts", "wheel", "libs.sh")) as f:
        libs = f.read()
    decoders, demuxers = _enabled(libs, "decoder"), _enabled(libs, "demuxer")
    assert set(mod.FFMPEG) == set(mod.CASES)
    for name, (decoder, demuxer) in mod.FFMPEG.items():
        assert decoder in decoders, f"{name}: decoder {decoder} not enabled in libs.sh"
        assert demuxer in demuxers, f"{name}: demuxer {demuxer} not enabled in libs.sh"
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = " ".join(f.read().split())
    m = re.search(r"videos \(([^)]*)\)", readme)
    assert m, "README.md: no 'videos (...)' list of codecs"
    assert [c.strip() for c in m.group(1).split(",")] == list(mod.CASES)
