#!/usr/bin/env bash
# One proof of an installed wheel, run by scripts/wheel/prove.sh where the wheel is to run
# (the clean bullseye root, or this machine):
#   1. ldd (LD_LIBRARY_PATH empty): every non-glibc library of mmloader._core and of the
#      bundled ones resolves inside mmloader.libs/
#   2. the demo writes its dataset (Pillow), then WRAP (empty, or scripts/wheel/hide.py with
#      the system's copies to hide) runs: import mmloader, the demo over that dataset, and
#      scripts/wheel/codecs.py check over CODECS_DIR (the six codecs, bit for bit)
# Usage: check.sh VENV CODECS_DIR WORK_DIR [WRAP...]
set -euo pipefail
venv=$1 codecs=$(realpath "$2") run=$(realpath -m "$3")
shift 3
here=$(cd "$(dirname "$0")" && pwd)
vpy=$venv/bin/python
say() { echo "[check] $*"; }
GLIBC='^(linux-vdso\.so\.1|ld-linux-x86-64\.so\.2|lib(c|m|dl|pthread|rt|resolv|util|nsl|anl)\.so\.[0-9]+)$'
mkdir -p "$run"
cd "$run"  # away from any checkout: the installed package is imported
site=$($vpy -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
so=$(ls "$site"/mmloader/_core*.so)
libs=$site/mmloader.libs
bad=0
for f in "$so" "$libs"/*; do
  while read -r name path; do
    [[ "$name" =~ $GLIBC ]] && continue
    case "$(realpath -m "$path")" in
      "$(realpath "$libs")"/*) ;;
      *) echo "    NOT BUNDLED: $(basename "$f") needs $name => $path"; bad=1 ;;
    esac
  done < <(LD_LIBRARY_PATH= ldd "$f" | awk '/=>/ { print $1, $3 }')
done
[ $bad = 0 ] || { say "FAILED: libraries resolve outside mmloader.libs/"; exit 1; }
say "ldd: every non-glibc library of _core and of the $(ls "$libs" | wc -l) bundled ones" \
  "resolves in mmloader.libs/"
$vpy -m mmloader demo --samples 64 --out "$run/demo-data" > /dev/null
LD_LIBRARY_PATH= "$@" $vpy -c 'import mmloader; print("[check] import mmloader: ok,", mmloader.__file__)'
LD_LIBRARY_PATH= "$@" $vpy -m mmloader demo --samples 64 --out "$run/demo-data"
say "codecs, decoded by the bundled FFmpeg and compared with PyAV's decode:"
LD_LIBRARY_PATH= "$@" $vpy "$here/codecs.py" check "$codecs"
