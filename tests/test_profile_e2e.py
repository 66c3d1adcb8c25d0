"""benchmarks/profile_e2e.py's grouping of perf's rows (on a given report: perf itself is
not needed): every sample counted from the sample column, resize's passes in resize, and
the decoders' bare addresses grouped by their shared object."""

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

import profile_e2e  # noqa: E402

REPORT = """# Samples: 1K of event 'cpu-clock'
# Overhead       Samples  Shared Object         Symbol
# ........  ............  ....................  ......
#
    30.00%           300  libjpeg.so.62.3.0     [.] 0x000000000000b318
    20.00%           200  libjpeg.so.62.3.0     [.] 0x00000000000231e3
     0.04%             1  libjpeg.so.62.3.0     [.] 0x00000000000231e4
    15.00%           150  _core.cpython-311-x86_64-linux-gnu.so  [.] rows_v2_avx2
    10.00%           100  _core.cpython-311-x86_64-linux-gnu.so  [.] rows_h_avx2
    10.00%           100  _core.cpython-311-x86_64-linux-gnu.so  [.] write_u8
     9.90%            99  [kernel.kallsyms]     [k] clear_page_erms
     5.00%            50  libz.so.1.2.13        [.] 0x0000000000004a10
"""


def test_parse_groups_every_sample():
    groups, kernel = profile_e2e.parse(REPORT)
    share = {g["group"]: g["share"] for g in groups}
    assert abs(sum(share.values()) - 1.0) < 1e-9
    dec = "image decoders (libjpeg-turbo, libpng, zlib, ...)"
    assert abs(share[dec] - 551 / 1000) < 1e-9
    assert abs(share["mmloader: resize"] - 250 / 1000) < 1e-9
    assert abs(share["mmloader: normalise, patchify, collate"] - 100 / 1000) < 1e-9
    assert abs(kernel - 99 / 1000) < 1e-9
    top = next(g["top"] for g in groups if g["group"] == dec)
    assert top[0] == "libjpeg.so.62.3.0 (no symbols) 50.1%"
    assert top[1] == "libz.so.1.2.13 (no symbols) 5.0%"
