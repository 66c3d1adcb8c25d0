"""Build of mmloader._core: the C engine (csrc/core) plus its thin CPython binding (csrc/py).

    pip install .            (or pip install -e .; scripts/build.sh builds in place)

The system libraries are declared once, in csrc/system-libs.txt.  Before anything is
compiled every one of them is checked (pkg-config where it has a .pc file, then a test
compile and link of its header); when some are missing the build stops with one message
naming each, its Debian package and the apt-get command.  Environment:
  MML_SANITIZE=address|thread   build with AddressSanitizer+UBSan or ThreadSanitizer
  MML_DEBUG=1                   -O0 -g
"""
import glob
import os
import shlex
import shutil
import subprocess
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

here = os.path.dirname(os.path.abspath(__file__))


def rel(pattern):
    return sorted(os.path.relpath(p, here) for p in glob.glob(os.path.join(here, pattern)))


def system_libs():
    """The libraries the extension links, from csrc/system-libs.txt, as dicts: name, pc,
    header, link, deb (rows marked `tests` are for tests/c only)."""
    out = []
    with open(os.path.join(here, "csrc", "system-libs.txt")) as f:
        for line in f:
            cols = line.split("#", 1)[0].split()
            if cols and cols[5:] != ["tests"]:
                out.append(dict(zip(("name", "pc", "header", "link", "deb"), cols)))
    return out


def pkg_config(module):
    """(include dirs, library dirs, other flags) from pkg-config, or None."""
    if module == "-" or not shutil.which("pkg-config"):
        return None
    try:
        r = subprocess.run(["pkg-config", "--cflags", "--libs", module], capture_output=True,
                           text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    inc, libdirs, other = [], [], []
    for flag in shlex.split(r.stdout):
        if flag.startswith("-I"):
            inc.append(flag[2:])
        elif flag.startswith("-L"):
            libdirs.append(flag[2:])
        elif not flag.startswith("-l"):
            other.append(flag)
    return inc, libdirs, other


def probe(cc, source, args):
    """True when `source` compiles (and links, unless args has -fsyntax-only)."""
    try:
        r = subprocess.run(cc + ["-x", "c", "-", "-o", os.devnull] + args, input=source,
                           capture_output=True, text=True)
    except OSError:
        return False
    return r.returncode == 0


class BuildExt(build_ext):
    """Checks the C compiler, the Python headers and every system library before
    compiling; fills the extension's include/library dirs from pkg-config."""

    def build_extensions(self):
        cc = shlex.split(os.environ.get("CC", "")) or self.compiler.compiler_so[:1]
        missing = []  # (what, detail, debian package)
        if not shutil.which(cc[0]):
            missing.append(("a C compiler", cc[0], "build-essential"))
        else:
            py_inc = sysconfig.get_paths()["include"]
            if not probe(cc, "#include <Python.h>\n", ["-fsyntax-only", "-I" + py_inc]):
                ver = sysconfig.get_python_version()
                missing.append(("the Python headers", os.path.join(py_inc, "Python.h"),
                                f"python{ver}-dev"))
            for lib in system_libs():
                found = pkg_config(lib["pc"])
                inc, libdirs, other = found or ([], [], [])
                src = f"#include <stddef.h>\n#include <stdio.h>\n#include <{lib['header']}>\n" \
                      "int main(void) { return 0; }\n"
                args = ["-I" + d for d in inc] + other + ["-L" + d for d in libdirs]
                if not probe(cc, src, args + ["-l" + lib["link"]]):
                    via = f"pkg-config {lib['pc']}: " + ("found" if found else "not found")
                    missing.append((lib["name"], f"<{lib['header']}>, -l{lib['link']}; {via}",
                                    lib["deb"]))
                    continue
                for ext in self.extensions:
                    ext.include_dirs += [d for d in inc if d not in ext.include_dirs]
                    ext.library_dirs += [d for d in libdirs if d not in ext.library_dirs]
        if missing:
            width = max(len(m[0]) for m in missing)
            lines = [f"  {m[0]:<{width}}  Debian package {m[2]:<22} ({m[1]})" for m in missing]
            pkgs = " ".join(dict.fromkeys(m[2] for m in missing))
            sudo = "sudo " if os.geteuid() else ""
            raise SystemExit(
                f"mmloader: cannot build mmloader._core, {len(missing)} build "
                f"requirement(s) missing:\n" + "\n".join(lines) +
                f"\nInstall them with:\n  {sudo}apt-get install -y {pkgs}\n"
                "(or run scripts/install-deps.sh from the source tree), then build again.")
        super().build_extensions()


cflags = ["-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Wno-unused-parameter",
          "-Wno-missing-field-initializers", "-fvisibility=hidden",
          "-Werror=implicit-function-declaration"]  # e.g. a newer Python's API on an old one
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
    sources=rel("csrc/core/*/*.c") + rel("csrc/py/*.c"),
    depends=rel("csrc/include/mml/*.h") + rel("csrc/core/*/*.h") + rel("csrc/py/*.h"),
    include_dirs=["csrc/include", "csrc/py"],
    libraries=[lib["link"] for lib in system_libs()] + ["m", "dl", "pthread"],
    extra_compile_args=cflags,
    extra_link_args=ldflags,
)

setup(ext_modules=[core], cmdclass={"build_ext": BuildExt})
