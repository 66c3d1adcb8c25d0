"""hide.py FILE... -- CMD...: bind-mounts /dev/null over each FILE, then execs CMD.

Run it in a private mount namespace (`unshare -m --propagation private python3 hide.py
...`): the mounts are made by this one process through libc's mount(2), so hiding a library
that a mount(8) would load (libblkid, libmount, ...) cannot break the hiding itself; CMD then
starts with those files empty ("file too short" for a library loaded from one of them).
"""

import ctypes
import os
import sys

MS_BIND = 4096

if __name__ == "__main__":
    if "--" not in sys.argv[2:]:
        sys.exit("usage: hide.py FILE... -- CMD...")
    i = sys.argv.index("--")
    files, cmd = sys.argv[1:i], sys.argv[i + 1 :]
    libc = ctypes.CDLL(None, use_errno=True)
    for f in files:
        if libc.mount(b"/dev/null", os.fsencode(f), None, MS_BIND, None) != 0:
            e = ctypes.get_errno()
            sys.exit(f"hide.py: mount --bind /dev/null {f}: {os.strerror(e)}")
    os.execvp(cmd[0], cmd)
