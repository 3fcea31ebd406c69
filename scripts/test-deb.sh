#!/usr/bin/env bash
# Smoke test of the Debian package (a stage of scripts/test.sh; needs root, as the CI has): installs
# build/mtserve_<version>_<arch>.deb with dpkg -i, checks the installed files, the system user,
# `mtserve --version`, the man page and the systemd unit (systemd-analyze verify, when installed),
# starts the installed server (a plain background process: no systemd here) on a temporary
# repository holding models/out/tiny.onnx and on the packaged /etc/mtserve/config.yaml, sends one
# KServe v2 inference over HTTP with curl, stops it, then removes and purges the package and checks
# that everything it created is gone. The machine is left as it was found: the test refuses to run
# where mtserve is already installed or a user or group named mtserve already exists, and cleans up
# on any exit.
#
#   scripts/test-deb.sh [PACKAGE.deb]      (default: the package in build/)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
VERSION=$(sed -nE 's/^project\(mtserve VERSION ([0-9][0-9.]*).*/\1/p' CMakeLists.txt)
DEB=${1:-build/mtserve_${VERSION}_$(dpkg --print-architecture).deb}
MODEL=models/out/tiny.onnx

fail() { echo "test-deb: FAIL: $*" >&2; exit 1; }
note() { echo "test-deb: $*"; }

if [ "$(id -u)" -ne 0 ]; then note "skipped: needs root (dpkg -i)"; exit 0; fi
[ -f "$DEB" ] || fail "$DEB is missing (make deb)"
[ -f "$MODEL" ] || fail "$MODEL is missing (make models)"
if dpkg-query -W -f='${Status}' mtserve 2> /dev/null | grep -q 'installed\|config-files'; then
  fail "a mtserve package is already on this machine; not touching it"
fi
getent passwd mtserve > /dev/null && fail "a user mtserve already exists; not touching it"
getent group mtserve > /dev/null && fail "a group mtserve already exists; not touching it"
for p in /usr/bin/mtserve /etc/mtserve /var/lib/mtserve; do
  [ -e "$p" ] && fail "$p already exists; not touching it"
done

WORK=$(mktemp -d)
chmod 0755 "$WORK"
SRV_PID=""
installed=0
cleanup() {
  if [ -n "$SRV_PID" ]; then kill "$SRV_PID" 2> /dev/null; wait "$SRV_PID" 2> /dev/null; fi
  if [ $installed -eq 1 ]; then dpkg --purge mtserve > /dev/null 2>&1; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap "exit 143" TERM INT   # a timeout still runs the cleanup

# start_server LOG CMD...: starts CMD in the background and waits (at most 15 s) for its HTTP
# serving line; sets SRV_PID and PORT.
start_server() {
  local log=$1; shift
  "$@" > "$log" 2>&1 &
  SRV_PID=$!
  PORT=""
  for _ in $(seq 150); do
    PORT=$(sed -nE 's#^mtserve: serving [0-9]+ models? on http://[^:]+:([0-9]+).*#\1#p' "$log" | head -1)
    [ -n "$PORT" ] && return 0
    kill -0 "$SRV_PID" 2> /dev/null || break
    sleep 0.1
  done
  sed 's/^/  | /' "$log" >&2
  return 1
}
stop_server() {
  kill -TERM "$SRV_PID"
  for _ in $(seq 100); do kill -0 "$SRV_PID" 2> /dev/null || break; sleep 0.1; done
  kill -0 "$SRV_PID" 2> /dev/null && fail "server did not stop within 10 s of SIGTERM"
  wait "$SRV_PID"; local rc=$?
  SRV_PID=""
  [ $rc -eq 0 ] || fail "server exited with status $rc after SIGTERM"
}

# Install.
dpkg -i "$DEB" > "$WORK/dpkg.log" 2>&1 || { cat "$WORK/dpkg.log" >&2; dpkg --purge mtserve > /dev/null 2>&1; fail "dpkg -i $DEB"; }
installed=1
note "installed $DEB"

out=$(/usr/bin/mtserve --version) || fail "mtserve --version failed"
[[ $out == "mtserve $VERSION"* ]] || fail "mtserve --version printed '$out', expected 'mtserve $VERSION...'"
note "version: $out"
if command -v man > /dev/null && dpkg-query -W -f='${Status}' man-db 2> /dev/null | grep -q 'ok installed'; then
  page=$(man -w mtserve 2> /dev/null) || fail "man -w mtserve finds no page"
  note "man page: $page"
else
  [ -f /usr/share/man/man1/mtserve.1.gz ] || fail "/usr/share/man/man1/mtserve.1.gz missing"
fi
for f in /usr/share/bash-completion/completions/mtserve /lib/systemd/system/mtserve.service /etc/mtserve/config.yaml; do
  [ -f "$f" ] || fail "$f missing"
done
bash -c 'source /usr/share/bash-completion/completions/mtserve && complete -p mtserve' > /dev/null ||
  fail "the bash completion does not define a completion for mtserve"
getent passwd mtserve > /dev/null || fail "postinst created no user mtserve"
[ "$(stat -c %U /var/lib/mtserve/models)" = mtserve ] || fail "/var/lib/mtserve/models is not owned by mtserve"
dpkg-query -W -f='${Conffiles}' mtserve | grep -q /etc/mtserve/config.yaml || fail "config.yaml is not a conffile"
# The installed unit passes systemd's own checks (directives, the ExecStart binary, the man page
# its Documentation= names when man-db is there); no running systemd is needed for that.
if command -v systemd-analyze > /dev/null; then
  man_opt=--man=no
  [ -n "${page:-}" ] && man_opt=--man=yes
  out=$(systemd-analyze verify "$man_opt" /lib/systemd/system/mtserve.service 2>&1) ||
    fail "systemd-analyze verify /lib/systemd/system/mtserve.service: $out"
  echo "$out" | grep -q 'mtserve' && fail "systemd-analyze verify warns about the unit: $out"
  note "systemd-analyze verify $man_opt: the unit is valid"
else
  note "systemd-analyze verify: SKIPPED, not counted as passed (systemd-analyze is missing: apt-get install systemd)"
fi

# The packaged configuration parses and serves (as the unit would run it, minus systemd; ports 0
# so that a server already on 8000/50051 does not matter; setpriv execs, so SRV_PID is the server).
start_server "$WORK/cfg.log" setpriv --reuid=mtserve --regid=mtserve --init-groups /usr/bin/mtserve serve --config /etc/mtserve/config.yaml \
  --http-port 0 --grpc-port 0 || fail "the installed server did not start with /etc/mtserve/config.yaml"
curl -fsS "http://127.0.0.1:$PORT/v2/health/ready" > /dev/null || fail "health/ready on the packaged config"
stop_server
note "packaged config: served and stopped"

# One inference on a repository holding the tiny model.
mkdir -p "$WORK/repo/tiny"
cp "$MODEL" "$WORK/repo/tiny/model.onnx"
start_server "$WORK/srv.log" /usr/bin/mtserve serve --model-repository "$WORK/repo" --http-port 0 --grpc-port 0 ||
  fail "the installed server did not start on $WORK/repo"
req='{"inputs":[{"name":"x","shape":[1,16],"datatype":"FP32","data":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]}]}'
resp=$(curl -fsS --max-time 20 -H 'Content-Type: application/json' -d "$req" "http://127.0.0.1:$PORT/v2/models/tiny/infer") ||
  fail "infer on tiny failed"
echo "$resp" | grep -q '"name":"y"' || fail "infer reply has no output y: $resp"
stop_server
note "served tiny on port $PORT: one inference answered, stopped by SIGTERM"

# Remove (the conffile stays), then purge (everything goes).
dpkg -r mtserve > "$WORK/dpkg.log" 2>&1 || { cat "$WORK/dpkg.log" >&2; fail "dpkg -r mtserve"; }
for f in /usr/bin/mtserve /usr/share/man/man1/mtserve.1.gz /usr/share/bash-completion/completions/mtserve \
         /lib/systemd/system/mtserve.service; do
  [ -e "$f" ] && fail "$f still there after dpkg -r"
done
[ -f /etc/mtserve/config.yaml ] || fail "dpkg -r removed the conffile /etc/mtserve/config.yaml"
dpkg --purge mtserve > "$WORK/dpkg.log" 2>&1 || { cat "$WORK/dpkg.log" >&2; fail "dpkg --purge mtserve"; }
installed=0
for p in /etc/mtserve /var/lib/mtserve /usr/share/doc/mtserve; do
  [ -e "$p" ] && fail "$p still there after purge"
done
getent passwd mtserve > /dev/null && fail "user mtserve still there after purge"
getent group mtserve > /dev/null && fail "group mtserve still there after purge"
dpkg-query -W mtserve > /dev/null 2>&1 && fail "dpkg still knows mtserve after purge"
note "removed and purged: no files, user or group left"
note "ok"
