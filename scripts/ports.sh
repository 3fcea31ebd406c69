# Sourced by scripts/demo.sh and scripts/cluster.sh: port_taken PORT succeeds when PORT cannot be
# bound on 127.0.0.1 (another process listens there), so a banner never promises a taken port.
port_taken() {
  /usr/bin/python3 - "$1" <<'PY'
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(0)
sys.exit(1)
PY
}
