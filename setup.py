"""Build of mmloader._core: the C engine (csrc/core) plus its thin CPython binding (csrc/py).

System libraries come from Debian packages (see scripts/install-deps.sh).  Environment:
  MML_SANITIZE=address|thread   build with AddressSanitizer+UBSan or ThreadSanitizer
  MML_DEBUG=1                   -O0 -g
"""
import glob
import os

from setuptools import Extension, setup

here = os.path.dirname(os.path.abspath(__file__))


def rel(pattern):
    return sorted(os.path.relpath(p, here) for p in glob.glob(os.path.join(here, pattern)))


cflags = ["-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Wno-unused-parameter",
          "-Wno-missing-field-initializers", "-fvisibility=hidden"]
ldflags = []
san = os.environ.get("MML_SANITIZE", "")
if os.environ.get("MML_DEBUG") or san:
    cflags += ["-O1" if san else "-O0", "-g", "-fno-omit-frame-pointer"]
else:
    cflags += ["-O3"]
if san == "address":
    cflags += ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"]
    ldflags += ["-fsanitize=address,undefined"]
elif san == "thread":
    cflags += ["-fsanitize=thread"]
    ldflags += ["-fsanitize=thread"]

core = Extension(
    "mmloader._core",
    sources=rel("csrc/core/*.c") + rel("csrc/py/*.c"),
    include_dirs=["csrc/include", "csrc/py"],
    libraries=["turbojpeg", "jpeg", "png16", "cjson", "utf8proc", "curl", "z", "zstd", "m", "dl", "pthread"],
    extra_compile_args=cflags,
    extra_link_args=ldflags,
)

setup(ext_modules=[core])
