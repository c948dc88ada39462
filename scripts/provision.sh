#!/usr/bin/env bash
# Provision a Debian 12 / Ubuntu 22.04 / 24.04 host (or the Vagrant VM) for netai-testbed.
# Idempotent: a second run installs nothing and restarts nothing that already runs.
# Run as root (it installs OS packages and starts Open vSwitch and Docker).
#   NETAI_SKIP_DOCKER=1   do not install or start the Docker daemon
#   NETAI_SKIP_IMAGE=1    do not build the worker image
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${VENV:-$ROOT/.venv}
log() { printf '[provision] %s\n' "$*"; }

if [ "$(id -u)" != 0 ]; then
    if [ -x "$VENV/bin/python" ]; then
        log "not root: OS packages and daemons left as they are (tests that need root will be skipped)"
        NETAI_NO_SYSTEM=1
    else
        echo "provision.sh: run as root once (sudo make setup): it installs OS packages and starts daemons" >&2
        exit 2
    fi
fi

pip_quiet() { "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }; }

if [ -z "${NETAI_NO_SYSTEM:-}" ]; then
# 1. OS packages --------------------------------------------------------------------------------
# (chromium and chromium-driver: the browser the dashboard's tests drive, headless; curl: the
# tutorial's look at the dashboard's API, docs/tutorial.md)
PKGS="mininet openvswitch-switch iperf3 ethtool iproute2 net-tools iputils-ping python3-venv python3-dev
      python3-pip debootstrap procps psmisc chromium chromium-driver python3-simgrid openssh-server curl"
if [ -z "${NETAI_SKIP_DOCKER:-}" ]; then PKGS="$PKGS docker.io"; fi
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    log "installing OS packages:$missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # shellcheck disable=SC2086
    apt-get install -y -qq --no-install-recommends $missing >/dev/null
    # openssh-server is here for its sshd binary only (the remote-server tests run their own sshd on
    # 127.0.0.1): a system sshd the package may have started, listening on every interface, is
    # stopped and disabled again, as the machine had none before.
    case " $missing " in
        *" openssh-server "*)
            if [ -d /run/systemd/system ]; then
                systemctl disable --now ssh.service ssh.socket >/dev/null 2>&1 || true
            elif [ -x /etc/init.d/ssh ]; then
                /etc/init.d/ssh stop >/dev/null 2>&1 || true
            fi ;;
    esac
else
    log "OS packages present"
fi

# 2. Open vSwitch daemons (systemd where it runs, else the packaged ovs-ctl script) ----------------
# ovs_daemons start|restart: act, then wait until ovsdb answers.
# ovs-ctl raises the open-file limit to 65535 before it starts ovs-vswitchd and gives up when that
# is refused (a container without CAP_SYS_RESOURCE whose hard limit is lower). There, ovs-ctl starts
# ovsdb-server only, and ovs-vswitchd is started with the arguments ovs-ctl gives it, under the
# limit the machine has (it needs a few descriptors per bridge and port, far below that).
OVS_CTL=/usr/share/openvswitch/scripts/ovs-ctl
ovs_daemons() {
    if [ -d /run/systemd/system ] && systemctl "$1" openvswitch-switch 2>/dev/null; then :
    elif sh -c 'ulimit -n 65535' 2>/dev/null; then
        "$OVS_CTL" "$1" --system-id=random >/dev/null
    else
        if [ "$1" = restart ]; then "$OVS_CTL" stop >/dev/null; fi
        "$OVS_CTL" start --no-ovs-vswitchd --system-id=random >/dev/null
        mkdir -p /var/log/openvswitch /var/run/openvswitch
        log "ovs-ctl may not raise the open-file limit here; starting ovs-vswitchd under $(ulimit -Hn)"
        ovs-vswitchd unix:/var/run/openvswitch/db.sock -vconsole:emer -vsyslog:err -vfile:info \
            --mlockall --no-chdir --log-file=/var/log/openvswitch/ovs-vswitchd.log \
            --pidfile=/var/run/openvswitch/ovs-vswitchd.pid --detach --monitor
    fi
    for _ in $(seq 1 50); do ovs-vsctl --timeout=3 show >/dev/null 2>&1 && break; sleep 0.2; done
    ovs-vsctl --timeout=3 show >/dev/null || { echo "provision.sh: Open vSwitch did not $1" >&2; exit 1; }
}

# The userspace datapath sends every port's packets through one packet socket, whose send buffer
# (net.core.wmem_default when ovs-vswitchd makes it) every queued packet of every shaped link counts
# against: 212992 bytes by default, and packets beyond it are lost. Raise it (a machine-wide default
# for new sockets, as Mininet raises other socket limits) before the daemons start, and restart
# ovs-vswitchd if its socket was made with less, unless bridges exist (a run may be live).
# orchestrator/emulation/ovs_socket.py
OVS_SEND_BYTES=4194304
if [ "$(sysctl -n net.core.wmem_default)" -lt "$OVS_SEND_BYTES" ]; then
    sysctl -qw net.core.wmem_default="$OVS_SEND_BYTES"
    log "net.core.wmem_default raised to $OVS_SEND_BYTES (Open vSwitch's packet socket)"
fi

if ovs-vsctl --timeout=3 show >/dev/null 2>&1; then
    log "Open vSwitch running"
else
    log "starting Open vSwitch"
    ovs_daemons start
fi

# No packet socket yet (no bridge has had a port since ovs-vswitchd started): it will be made with
# the raised default.
ovs_tb=$(ss -0 -e -m -p 2>/dev/null | grep -A1 '\[0\]:\*.*"ovs-vswitchd"' | grep -o 'tb[0-9]*' | head -n 1 | tr -d tb || true)
if [ -n "$ovs_tb" ] && [ "$ovs_tb" -lt "$OVS_SEND_BYTES" ]; then
    if [ -n "$(ovs-vsctl --timeout=3 list-br)" ]; then
        log "WARNING: ovs-vswitchd's packet socket has a $ovs_tb-byte send buffer; bridges exist, so it is not restarted now (run make setup again when no run is live)"
    else
        log "restarting ovs-vswitchd so that its packet socket gets $OVS_SEND_BYTES bytes (it has $ovs_tb)"
        ovs_daemons restart
    fi
fi

# 3. Docker daemon -------------------------------------------------------------------------------
# A daemon killed without its shutdown (a machine's processes ended at once) leaves its pid files.
# dockerd takes the pid in /var/run/docker/containerd/containerd.pid for its containerd if any
# process has that pid, and once the pid is another program's, it waits for a containerd that never
# answers and exits ("timeout waiting for containerd to start"). With no dockerd running, a pid file
# whose process is not the program it names is removed before the start.
clear_stale_docker_pids() {
    local file name pid
    for file in /var/run/docker/containerd/containerd.pid:containerd /var/run/docker.pid:dockerd; do
        name=${file##*:}; file=${file%:*}
        [ -f "$file" ] || continue
        pid=$(tr -dc '0-9' <"$file")
        if [ -z "$pid" ] || [ "$(cat "/proc/$pid/comm" 2>/dev/null)" != "$name" ]; then
            log "removing $file, left by a $name that no longer runs"
            rm -f "$file"
        fi
    done
}
if [ -z "${NETAI_SKIP_DOCKER:-}" ]; then
    if docker info >/dev/null 2>&1; then
        log "Docker daemon running"
    else
        log "starting the Docker daemon"
        if [ -d /run/systemd/system ] && systemctl start docker 2>/dev/null; then :; else
            mkdir -p /var/log/netai
            if ! pgrep -x dockerd >/dev/null; then clear_stale_docker_pids; fi
            # Not on any TCP socket: the daemon listens on its unix socket only.
            nohup dockerd -H unix:///var/run/docker.sock >/var/log/netai/dockerd.log 2>&1 &
        fi
        for _ in $(seq 1 150); do docker info >/dev/null 2>&1 && break; sleep 0.2; done
        if ! docker info >/dev/null 2>&1; then
            log "WARNING: the Docker daemon did not start; the docker backend will be unavailable"
            if [ -f /var/log/netai/dockerd.log ]; then
                log "the end of /var/log/netai/dockerd.log:"
                tail -n 3 /var/log/netai/dockerd.log | sed 's/^/    /'
            fi
        fi
    fi
fi

fi  # NETAI_NO_SYSTEM

# 4. The venv: system Python (sees Debian's mininet module), torch pinned to the CPU wheel --------
# Installing it takes about a minute of CPU, most of it pip byte-compiling torch. A copy of the venv
# as first installed is kept per (setup.py, extras, Python) under NETAI_VENV_CACHE (default
# /var/cache/netai-venv, where it can be written; "" for none): the next fresh checkout on this
# machine copies it and points its scripts and the project's editable install at itself instead
# (docs/testing.md, "The set-up").
PY=/usr/bin/python3
EXTRAS="net,fl,experiment,test,docs"
stamp="$VENV/.netai-installed"
want=$(cat setup.py | sha256sum | cut -d' ' -f1)
VENV_CACHE=${NETAI_VENV_CACHE-/var/cache/netai-venv}
cached=""
if [ -n "$VENV_CACHE" ]; then
    cached="$VENV_CACHE/$( { echo "venv-cache 1 $want $EXTRAS"; "$PY" -VV; uname -m; } | sha256sum | cut -c1-16)"
fi
venv_here() { echo "$(cd "$(dirname "$VENV")" && pwd)/$(basename "$VENV")"; }
venv_restore() {  # copy the cached venv to $VENV; its scripts and the project's install then point here
    local tmp
    tmp=$(mktemp -d "$(dirname "$VENV")/.venv-copy.XXXXXX")
    cp -a "$cached/venv" "$tmp/venv"
    rm -f "$tmp/venv/.netai-installed"  # written once the project's install points here
    "$PY" - "$(cat "$cached/origin")" "$(venv_here)" "$tmp/venv" <<'PYEOF'
import sys
from pathlib import Path

old, new = (a.encode() for a in sys.argv[1:3])
venv = Path(sys.argv[3])
for path in [venv / "pyvenv.cfg", *(venv / "bin").iterdir()]:
    if path.is_symlink() or not path.is_file():
        continue
    data = path.read_bytes()
    if old in data and b"\0" not in data:  # a script's shebang, the activate scripts; not a binary
        path.write_bytes(data.replace(old, new))  # rewritten in place: its mode is kept
PYEOF
    mv -T "$tmp/venv" "$VENV"
    rmdir "$tmp"
    pip_quiet "$VENV/bin/pip" install -q --no-deps --no-build-isolation -e .
    echo "$want" >"$stamp"
}
venv_save() {  # keep a copy of the venv just installed (the newest two kept); best effort
    local tmp
    mkdir -p "$VENV_CACHE" 2>/dev/null && [ -w "$VENV_CACHE" ] || return 0
    tmp=$(mktemp -d "$VENV_CACHE/.new.XXXXXX") || return 0
    if cp -a "$VENV" "$tmp/venv" && venv_here >"$tmp/origin" && touch "$tmp/complete" && [ ! -e "$cached" ] \
            && mv -T "$tmp" "$cached"; then
        log "kept a copy of the venv for the next checkout on this machine ($cached)"
    fi
    rm -rf "$tmp"
    # shellcheck disable=SC2012 # the names are hex keys
    ls -1dt "$VENV_CACHE"/*/ 2>/dev/null | tail -n +3 | xargs -r rm -rf
}
created=0
if [ ! -x "$VENV/bin/python" ]; then
    if [ -n "$cached" ] && [ -f "$cached/complete" ]; then
        log "copying the venv installed before on this machine ($cached)"
        venv_restore
    else
        log "creating the venv at $VENV"
        "$PY" -m venv --system-site-packages "$VENV"
        created=1
    fi
fi
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    log "installing the project into the venv (torch CPU wheel, os-ken, test and docs tools)"
    pip_quiet "$VENV/bin/pip" install -q --upgrade pip setuptools wheel
    pip_quiet "$VENV/bin/pip" install -q -e ".[$EXTRAS]"
    echo "$want" > "$stamp"
    if [ "$created" = 1 ] && [ -n "$cached" ]; then venv_save; fi
else
    log "venv up to date"
fi
# The project's own byte code, for the processes every run starts (scripts/compile_sources.sh)
bash scripts/compile_sources.sh "$VENV/bin/python"

# 5. The worker image and the test machines' image (when a Docker daemon runs) ------------------
if [ -z "${NETAI_NO_SYSTEM:-}" ] && [ -z "${NETAI_SKIP_DOCKER:-}" ] && [ -z "${NETAI_SKIP_IMAGE:-}" ] && docker info >/dev/null 2>&1 \
        && [ -x scripts/build_worker_image.sh ]; then
    bash scripts/build_worker_image.sh --if-stale
    # what the cluster tests start as a lab's servers (tests/integration/machines.py)
    bash scripts/build_machine_image.sh --if-stale
elif [ -z "${NETAI_NO_SYSTEM:-}" ]; then
    log "the worker and machine images are not built (no Docker daemon, or NETAI_SKIP_DOCKER/NETAI_SKIP_IMAGE): the docker tests skip"
fi
log "done"
