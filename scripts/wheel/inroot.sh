# inroot ROOT CMD...: runs CMD chrooted in ROOT (a Debian root made by scripts/wheel/root.sh)
# with /proc and /dev mounted, in a private mount namespace of its own, so that the mounts
# vanish with it; MML_BIND="PATH..." bind-mounts those host paths at the same place inside.
# pip inside trusts what pip here trusts: the CA bundle of PIP_CERT (or pip's global.cert),
# copied into the root (a machine behind a TLS-inspecting proxy needs it).
# Sourced by the scripts of scripts/wheel/; needs root.
inroot() {
  local r=$1 cert
  shift
  cert=${PIP_CERT:-$(python3 -m pip config get global.cert 2> /dev/null || true)}
  rm -f "$r/etc/mml-pip-ca.crt"
  [ -z "$cert" ] || [ ! -f "$cert" ] || cp "$cert" "$r/etc/mml-pip-ca.crt"
  unshare -m --propagation private sh -c '
    r=$1; shift
    mount -t proc proc "$r/proc" && mount --rbind /dev "$r/dev" || exit 97
    for p in $MML_BIND; do
      mkdir -p "$r$p" && mount --bind "$p" "$r$p" || exit 98
    done
    ca=""; [ -f "$r/etc/mml-pip-ca.crt" ] && ca=PIP_CERT=/etc/mml-pip-ca.crt
    exec chroot "$r" env -i PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin HOME=/root \
      LANG=C.UTF-8 $ca "$@"' sh "$r" "$@"
}
