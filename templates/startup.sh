#!/bin/bash
# tpuctl host start-up script, rendered by `tpuctl up` into the TPU VM's (every worker's) or the legacy node VM's
# metadata. It installs the tpuctl agent of the CLI's version from the cluster's store and keeps it running under
# systemd. Safe to run on every boot: what is already in place is kept.
#
# It runs while the TPU is still being created (GCP_FACTS §6), so every download is retried with backoff for up
# to TPUCTL_BOOT_RETRY_SECONDS (20 minutes): the object may be missing for a moment, and the bucket answers 403
# until the host's grant has propagated (minutes). Each step and each failed attempt goes to the boot log, which is
# copied into the store whenever the bucket lets us write (`tpuctl status` shows its last line).
# (Rendered by string.Template with the at-sign as delimiter: a literal at-sign is doubled in this file.)
set -uo pipefail

STORE="@{store}"
CLUSTER="@{cluster}"
VERSION="@{version}"
ROLE="@{role}"                 # tpu-vm: the TPU host itself; node-vm: the VM beside a legacy TPU Node;
                               # watcher-vm: the recovery watcher's VM (runs tpuctl.watcher, not the agent)
ACCELERATOR="@{accelerator}"
TPU_ADDRESS="@{tpu_address}"   # "local" on a TPU VM; empty on a node VM: the agent reads it from the store
TF_VERSION="@{tf_version}"     # node-vm only: must match the TPU Node's TensorFlow exactly
AGENT_PACKAGE="@{agent_package}"
STORAGE_REQ="@{storage_req}"   # google-cloud-storage as the agent package requires it
BOOT_PREFIX="@{boot_prefix}"
# Overridable for custom images (and for the tests' simulated hosts).
AGENT_DIR="${TPUCTL_AGENT_DIR:-/opt/tpuctl}"
BOOT_LOG="${TPUCTL_BOOT_LOG:-/var/log/tpuctl-boot.log}"
UNIT_DIR="${TPUCTL_UNIT_DIR:-/etc/systemd/system}"
RETRY_SECONDS="${TPUCTL_BOOT_RETRY_SECONDS:-1200}"
MDS="http://${GCE_METADATA_HOST:-metadata.google.internal}/computeMetadata/v1"
GCS="${STORAGE_EMULATOR_HOST:-https://storage.googleapis.com}"
BUCKET="${STORE#gs://}"
VENV="$AGENT_DIR/venv"
PY="$VENV/bin/python"

meta() { curl -sf -H 'Metadata-Flavor: Google' "$MDS/$1" 2>/dev/null; }
TPU_ENV="$(meta instance/attributes/tpu-env || true)"
# The worker: the TPU API's `agent-worker-number`; on a Compute Engine TPU VM, which may lack it, tpu-env's
# `TPU_WORKER_ID: 'N'` (cluster-toolkit PR #6351 shows it on TPU7x MIG VMs; GCE_TPU_FACTS §5).
WORKER="$(meta instance/attributes/agent-worker-number || true)"
[ -n "$WORKER" ] || WORKER="$(echo "$TPU_ENV" | grep '^TPU_WORKER_ID' | cut -d "'" -f 2 || true)"
WORKER="${WORKER:-0}"
# A Multislice node's slice: `MEGASCALE_SLICE_ID: 'K'` in the tpu-env attribute (MaxText multihost_job.py reads it
# with grep '^MEGASCALE_SLICE_ID' | cut -d "'" -f 2); absent on one slice. A Multislice of Compute Engine MIGs is
# tpuctl's own: each slice's instance template says its number in the `tpuctl-slice` metadata attribute.
SLICE="$(echo "$TPU_ENV" | grep '^MEGASCALE_SLICE_ID' | cut -d "'" -f 2 || true)"
[ -n "$SLICE" ] || SLICE="$(meta instance/attributes/tpuctl-slice || true)"
SLICE="${SLICE:-0}"
HOST="$(hostname)"
mkdir -p "$AGENT_DIR" "$(dirname "$BOOT_LOG")"

# An object name URL-encoded, and the access token out of the metadata server's JSON ({"access_token": "...",
# "expires_in": N, "token_type": "Bearer"}, Compute Engine's "Authenticate workloads" page), in bash: a python3 start
# for each, two for every boot-log line, cost more than the request. Bytes, not characters (LC_ALL=C), and only
# letters, digits and ._~- kept: what urllib.parse.quote(name, safe="") gives.
enc() {
  local LC_ALL=C s="$1" out="" c i
  for (( i = 0; i < ${#s}; i++ )); do
    c="${s:i:1}"
    case "$c" in
      [a-zA-Z0-9._~-]) out+="$c" ;;
      *) printf -v c '%%%02X' "'$c"; out+="$c" ;;
    esac
  done
  printf '%s\n' "$out"
}
token() {
  local json
  json=$(meta instance/service-accounts/default/token) || return 1
  [[ $json =~ \"access_token\"[[:space:]]*:[[:space:]]*\"([^\"]+)\" ]] && printf '%s\n' "${BASH_REMATCH[1]}"
}
# Cloud Storage JSON API: objects.get with alt=media, objects.insert with uploadType=media.
fetch() { curl -sSf -H "Authorization: Bearer $(token)" -o "$2" "$GCS/storage/v1/b/$BUCKET/o/$(enc "$1")?alt=media"; }
put() {
  curl -sf -X POST -H "Authorization: Bearer $(token)" -H "Content-Type: text/plain" --data-binary "@@$1" \
    "$GCS/upload/storage/v1/b/$BUCKET/o?uploadType=media&name=$(enc "$2")" >/dev/null 2>&1
}
log() {
  echo "$(date -u +%Y-%m-%dT%H:%M:%SZ) [$ROLE worker $WORKER] $*" >>"$BOOT_LOG"
  put "$BOOT_LOG" "$BOOT_PREFIX$HOST.log" || true   # 403 until the grant propagates: the local log keeps it all
}
fail() { log "FAILED: $*"; exit 1; }

# retry WHAT CMD...: run CMD until it succeeds, backing off 2 s, 4 s, ... 60 s, for RETRY_SECONDS at most.
retry() {
  local what="$1" start=$SECONDS delay=2 out
  shift
  while true; do
    if out=$("$@@" 2>&1); then return 0; fi
    if (( SECONDS - start >= RETRY_SECONDS )); then
      log "giving up on $what after $((SECONDS - start))s: $(echo "$out" | tail -c 300)"
      return 1
    fi
    log "waiting for $what (retry in ${delay}s): $(echo "$out" | tail -c 200)"
    sleep "$delay"
    delay=$(( delay * 2 > 60 ? 60 : delay * 2 ))
  done
}

log "boot: cluster $CLUSTER, tpuctl $VERSION, host $HOST"

# --- a Python environment beside the image's packages (its TensorFlow stays the image's) -----------------------
# Every later step installs with "$PY -m pip", so the environment counts as made only once its pip runs. A TPU VM's
# Ubuntu ships pip but not python3-venv's ensurepip: `--without-pip` makes the venv and the image's pip serves it
# through --system-site-packages. Debian 12's cloud image (the watcher's and the legacy node's VM) ships neither pip
# nor python3-venv (Debian's cloud-image FAI package lists, GCP_FACTS §10): `--without-pip` succeeds there too but
# leaves no pip at all, so python3-venv comes from apt and the venv is made again with its own pip (Debian's
# README.venv: a venv made with python3-venv holds a copy of pip).
venv() { python3 -m venv --system-site-packages "$@@" "$VENV"; }
# pip importable: `-m pip --version` would load pip's whole command line (a third of a CPU-second) at every boot
has_pip() { "$PY" -c 'import pip' >/dev/null 2>&1; }
# --no-compile: pip byte-compiles every module it installs, most of which the agent never imports (a second or more
# of CPU at each boot for the agent alone, far more for TensorFlow); Python compiles what is imported at its first
# import and keeps it in the venv, which is the agent's own
pip_install() { "$PY" -m pip install -q --no-compile "$@@"; }
apt_venv() {   # waits on the dpkg lock (unattended-upgrades takes it at boot) instead of failing on it
  apt-get -o DPkg::Lock::Timeout=600 update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq python3-venv
}
if [ -x "$PY" ] && has_pip; then
  log "python environment $VENV already there"
elif venv --clear 2>/dev/null && has_pip; then
  log "python environment $VENV created"
elif venv --clear --without-pip && has_pip; then
  log "python3-venv missing: $VENV created without its own pip (the image's pip serves it)"
elif retry "apt-get install python3-venv" apt_venv && venv --clear && has_pip; then
  log "installed python3-venv; python environment $VENV created with its own pip"
else
  fail "cannot create a python environment with pip (python3 -m venv; apt-get install python3-venv)"
fi

# The image's own packages, wherever its python3 finds them, and a login user's ~/.local (where an image puts its
# TensorFlow is not documented): the agent, a systemd service with no PYTHONPATH, sees them through this file
# whatever --system-site-packages covers.
{ python3 -c 'import os, sys
print("\n".join(p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages") and os.path.isdir(p)))'
  ls -d /home/*/.local/lib/python3*/site-packages 2>/dev/null || true
} >"$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_tpuctl_image.pth" \
  || log "could not list the image's site directories"

# Versions come from package metadata: importing TensorFlow to ask would cost seconds at every boot.
dist_version() {
  "$PY" -c 'import sys
from importlib.metadata import version, PackageNotFoundError
for name in sys.argv[1:]:
    try:
        print(version(name)); break
    except PackageNotFoundError:
        pass
else:
    sys.exit(1)' "$@@"
}

# satisfied REQUIREMENT: an installed distribution meets it, its version printed (gcs_store.SATISFIED)
satisfied() {
  "$PY" -c '@{satisfied}' "$1" 2>/dev/null
}

if [ "$ROLE" = "node-vm" ] && [ -n "$TF_VERSION" ] && ! dist_version tensorflow tensorflow-cpu >/dev/null; then
  log "installing tensorflow-cpu==$TF_VERSION to match the TPU Node"
  retry "pip install tensorflow-cpu==$TF_VERSION" pip_install "tensorflow-cpu==$TF_VERSION" \
    || fail "pip install tensorflow-cpu==$TF_VERSION"
fi

# tf.keras with TF_USE_LEGACY_KERAS=1 needs tf-keras; the agent sets that variable only where tf-keras imports.
# --no-deps: tf-keras requires `tensorflow` by that name, and beside an image TensorFlow installed under another
# name (tensorflow-tpu) pip would fetch PyPI's tensorflow as a second copy; Google's TPU harness installs it so
# (ml-auto-solutions dags/solutions_team/configs/tensorflow/common.py, set_up_tensorflow_models). On a base runtime
# there is no TensorFlow here: the agent installs the one each job asks for (host/jobenv.py).
if TFV=$(dist_version tensorflow tensorflow-tpu tensorflow-cpu tf-nightly); then
  if dist_version tf-keras tf_keras >/dev/null; then
    log "TensorFlow $TFV with tf-keras"
  elif pip_install --no-deps "tf-keras~=${TFV%.*}.0" >/dev/null 2>&1; then
    log "TensorFlow $TFV: installed tf-keras ${TFV%.*}"
  else
    log "TensorFlow $TFV: no tf-keras to be had; tf.keras stays Keras 3 (TF_USE_LEGACY_KERAS unset)"
  fi
fi

# --- the agent, from the store --------------------------------------------------------------------------------
WHEEL="$AGENT_DIR/$(basename "$AGENT_PACKAGE")"
if [ "$("$PY" -c 'import tpuctl; print(tpuctl.__version__)' 2>/dev/null)" = "$VERSION" ] \
    && "$PY" -c 'import tpuctl, sys; sys.exit(not tpuctl.__file__.startswith(sys.prefix))' 2>/dev/null; then
  log "agent $VERSION already installed"
else
  log "fetching the agent from $STORE/$AGENT_PACKAGE"
  retry "the agent package in the store" fetch "$AGENT_PACKAGE" "$WHEEL.part" || fail "agent package not in the store"
  mv "$WHEEL.part" "$WHEEL"
  retry "pip install of the agent" pip_install --force-reinstall --no-deps "$WHEEL" \
    || fail "pip install agent"
  if [ "$ROLE" = "watcher-vm" ]; then   # its dependencies (the TPU, Compute and Storage clients) from PyPI
    retry "pip install of the watcher's dependencies" pip_install "$WHEEL" \
      || fail "pip install the watcher's dependencies"
  fi
  # the store client in the range the agent relies on (its retries of conditional uploads): a copy the image or the
  # venv already has is kept when it satisfies it (pip would keep it too, after a second or two of resolving at
  # every boot); else pip installs one into the venv, over an older one
  if have=$(satisfied "$STORAGE_REQ"); then
    log "$STORAGE_REQ: google-cloud-storage $have already there"
  else
    retry "pip install $STORAGE_REQ" pip_install "$STORAGE_REQ" || fail "pip install $STORAGE_REQ"
  fi
fi

# service NAME DESCRIPTION RESTART EXEC [ENV=VALUE...]: a systemd unit, (re)started now and at every boot.
# KillMode=mixed: stopping it (the host shutting down, a preemption) sends SIGTERM to the agent alone, which passes it
# to the job once and gives it TPUCTL_STOP_GRACE (20 s) to checkpoint before SIGKILL; systemd's SIGKILL to what is
# left comes only after TimeoutStopSec (man systemd.kill: "If set to mixed, the SIGTERM signal is sent to the main
# process while the subsequent SIGKILL signal is sent to all remaining processes of the unit's control group").
service() {
  local name="$1" description="$2" restart="$3" exec="$4"
  shift 4
  {
    printf '[Unit]\nDescription=%s\nAfter=network-online.target\nWants=network-online.target\n\n[Service]\n' \
      "$description"
    for env in "$@@"; do printf 'Environment=%s\n' "$env"; done
    printf 'ExecStart=%s\nRestart=%s\nRestartSec=5\nKillMode=mixed\nTimeoutStopSec=60\n' "$exec" "$restart"
    printf '\n[Install]\nWantedBy=multi-user.target\n'
  } >"$UNIT_DIR/$name.service"
  systemctl daemon-reload && systemctl enable "$name.service" && systemctl restart "$name.service" || fail "systemctl"
}

if [ "$ROLE" = "watcher-vm" ]; then   # on-failure: a watch that ended stays ended
  service tpuctl-watcher "tpuctl recovery watcher for cluster $CLUSTER" on-failure \
    "$PY -m tpuctl.watcher --store $STORE --cluster $CLUSTER" "TPUCTL_HOME=$AGENT_DIR/home" "TPUCTL_HOST=$HOST"
  log "watcher running"
  exit 0
fi

service tpuctl-agent "tpuctl agent for cluster $CLUSTER" always "$PY -m tpuctl.agent --store $STORE --slice $SLICE --worker $WORKER" \
  "TPUCTL_ACCELERATOR=$ACCELERATOR" "TPUCTL_TPU=$TPU_ADDRESS" "TPUCTL_HOST=$HOST"
log "agent running"
