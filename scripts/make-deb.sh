#!/usr/bin/env bash
# Builds the Debian package BUILD/mtserve_<version>_<arch>.deb from an already built binary
# (default build/mtserve): a staging tree packed with `dpkg-deb --build` (no debhelper). It holds
# /usr/bin/mtserve, the man page, the bash completion, the systemd unit and the example
# /etc/mtserve/config.yaml (a conffile). Depends comes from dpkg-shlibdeps when it is installed,
# else from ldd + dpkg -S. The maintainer scripts create the system user `mtserve` and
# /var/lib/mtserve, stop the service before removal and delete the user and state on purge.
# The version is the CMake project version (project(mtserve VERSION x.y.z) in CMakeLists.txt).
#
#   scripts/make-deb.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
BIN=$BUILD/mtserve
[ -x "$BIN" ] || { echo "make-deb: $BIN is missing (build first)" >&2; exit 1; }

VERSION=$(sed -nE 's/^project\(mtserve VERSION ([0-9][0-9.]*).*/\1/p' CMakeLists.txt)
[ -n "$VERSION" ] || { echo "make-deb: no project VERSION in CMakeLists.txt" >&2; exit 1; }
ARCH=$(dpkg --print-architecture)
OUT=$BUILD/mtserve_${VERSION}_${ARCH}.deb
STAGE=$BUILD/deb-staging
rm -rf "$STAGE"
trap 'rm -rf "$STAGE"' EXIT

install -d "$STAGE/DEBIAN" "$STAGE/usr/bin" "$STAGE/usr/share/man/man1" \
  "$STAGE/usr/share/bash-completion/completions" "$STAGE/lib/systemd/system" "$STAGE/etc/mtserve" \
  "$STAGE/usr/share/doc/mtserve"
install -m 0755 "$BIN" "$STAGE/usr/bin/mtserve"
strip --strip-unneeded "$STAGE/usr/bin/mtserve" 2>/dev/null || true
sed "s/\"mtserve [0-9][0-9.]*\"/\"mtserve $VERSION\"/" packaging/mtserve.1 | gzip -9n > "$STAGE/usr/share/man/man1/mtserve.1.gz"
chmod 0644 "$STAGE/usr/share/man/man1/mtserve.1.gz"
install -m 0644 packaging/mtserve.bash-completion "$STAGE/usr/share/bash-completion/completions/mtserve"
install -m 0644 packaging/mtserve.service "$STAGE/lib/systemd/system/mtserve.service"
install -m 0644 packaging/config.yaml "$STAGE/etc/mtserve/config.yaml"
install -m 0644 README.md "$STAGE/usr/share/doc/mtserve/README.md"

# Depends: the packages owning the binary's shared libraries.
depends=""
if command -v dpkg-shlibdeps > /dev/null; then
  tmp=$(mktemp -d)
  mkdir -p "$tmp/debian"
  printf 'Source: mtserve\n\nPackage: mtserve\nArchitecture: any\n' > "$tmp/debian/control"
  if (cd "$tmp" && dpkg-shlibdeps -O "$OLDPWD/$STAGE/usr/bin/mtserve" 2> shlibdeps.err) > "$tmp/out"; then
    depends=$(sed -n 's/^shlibs:Depends=//p' "$tmp/out")
  else
    echo "make-deb: dpkg-shlibdeps failed, falling back to ldd + dpkg -S:" >&2
    sed 's/^/  /' "$tmp/shlibdeps.err" >&2
  fi
  rm -rf "$tmp"
fi
if [ -z "$depends" ]; then
  depends=$(ldd "$STAGE/usr/bin/mtserve" | awk '/=> \//{print $3}' | while read -r lib; do
      real=$(readlink -f "$lib")
      dpkg -S "$lib" 2>/dev/null || dpkg -S "$real" 2>/dev/null || true
    done | cut -d: -f1 | sort -u | paste -sd, | sed 's/,/, /g')
fi
[ -n "$depends" ] || { echo "make-deb: could not derive Depends" >&2; exit 1; }

size=$(du -sk --exclude=DEBIAN "$STAGE" | cut -f1)
cat > "$STAGE/DEBIAN/control" <<CONTROL
Package: mtserve
Version: $VERSION
Architecture: $ARCH
Maintainer: mtserve maintainers <mtserve@localhost>
Installed-Size: $size
Depends: adduser, $depends
Section: net
Priority: optional
Homepage: https://kserve.github.io/website/
Description: multi-tenant ONNX inference server (KServe v2 HTTP and gRPC)
 mtserve serves many ONNX models from one process over the KServe v2
 inference protocol (HTTP and gRPC), with its own ONNX executor, on-demand
 loading, eviction and dynamic batching. The binary also holds client tools
 (infer, models, bench) and local inspect/run/tune commands.
 .
 The package installs a systemd unit (mtserve.service, user mtserve) reading
 /etc/mtserve/config.yaml and serving /var/lib/mtserve/models.
CONTROL
echo "/etc/mtserve/config.yaml" > "$STAGE/DEBIAN/conffiles"

cat > "$STAGE/DEBIAN/postinst" <<'SCRIPT'
#!/bin/sh
# Creates the system user and group mtserve and the state directory /var/lib/mtserve; enables
# and (re)starts the unit when systemd runs.
set -e
if [ "$1" = configure ]; then
  if ! getent group mtserve > /dev/null; then
    addgroup --system --quiet mtserve
  fi
  if ! getent passwd mtserve > /dev/null; then
    adduser --system --quiet --ingroup mtserve --home /var/lib/mtserve --no-create-home \
      --shell /usr/sbin/nologin --gecos "mtserve inference server" mtserve
  fi
  install -d -o mtserve -g mtserve -m 0750 /var/lib/mtserve /var/lib/mtserve/models
  chgrp mtserve /etc/mtserve/config.yaml 2> /dev/null || true
  chmod 0640 /etc/mtserve/config.yaml 2> /dev/null || true
  if [ -d /run/systemd/system ]; then
    systemctl daemon-reload > /dev/null || true
    systemctl enable mtserve.service > /dev/null || true
    systemctl restart mtserve.service > /dev/null || true
  fi
fi
exit 0
SCRIPT

cat > "$STAGE/DEBIAN/prerm" <<'SCRIPT'
#!/bin/sh
# Stops the service before the files go (remove, upgrade, deconfigure).
set -e
if [ -d /run/systemd/system ]; then
  systemctl stop mtserve.service > /dev/null 2>&1 || true
fi
if [ "$1" = remove ] && [ -x /usr/bin/systemctl ]; then
  systemctl disable mtserve.service > /dev/null 2>&1 || true
fi
exit 0
SCRIPT

cat > "$STAGE/DEBIAN/postrm" <<'SCRIPT'
#!/bin/sh
# On remove: reloads systemd. On purge: also deletes /var/lib/mtserve (models included),
# /etc/mtserve and the user and group mtserve.
set -e
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload > /dev/null 2>&1 || true
fi
if [ "$1" = purge ]; then
  rm -rf /var/lib/mtserve
  rm -rf /etc/mtserve
  if getent passwd mtserve > /dev/null; then
    deluser --system --quiet mtserve > /dev/null 2>&1 || userdel mtserve 2> /dev/null || true
  fi
  if getent group mtserve > /dev/null; then
    delgroup --system --quiet mtserve > /dev/null 2>&1 || groupdel mtserve 2> /dev/null || true
  fi
fi
exit 0
SCRIPT
chmod 0755 "$STAGE/DEBIAN/postinst" "$STAGE/DEBIAN/prerm" "$STAGE/DEBIAN/postrm"

# --root-owner-group: files owned by root:root in the package without building as root.
dpkg-deb --build --root-owner-group "$STAGE" "$OUT" > /dev/null
echo "make-deb: $OUT ($VERSION, $ARCH; Depends: adduser, $depends)"
