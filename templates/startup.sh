#!/bin/bash
# tpuctl host startup script, rendered by `tpuctl up` into the TPU VM's (every worker's) or the legacy node
# VM's metadata. It installs the tpuctl agent of the CLI's version from the cluster's store and keeps it running
# under systemd. Every step is logged into the store, so a failed boot shows in `tpuctl status`.
set -uo pipefail

STORE="@{store}"
CLUSTER="@{cluster}"
VERSION="@{version}"
ROLE="@{role}"                 # tpu-vm: the TPU host itself; node-vm: the VM beside a legacy TPU Node
ACCELERATOR="@{accelerator}"
TPU_ADDRESS="@{tpu_address}"   # "local" on a TPU VM; empty on a node VM: the agent reads it from the store
TF_VERSION="@{tf_version}"     # node-vm only: must match the TPU Node's TensorFlow exactly
# Overridable for custom images (and for the test that runs this script against a local store).
AGENT_DIR="${TPUCTL_AGENT_DIR:-/opt/tpuctl}"
BOOT_LOG="${TPUCTL_BOOT_LOG:-/var/log/tpuctl-boot.log}"
UNIT_DIR="${TPUCTL_UNIT_DIR:-/etc/systemd/system}"
PY="${TPUCTL_PYTHON:-}"

meta() {
  curl -sf -H 'Metadata-Flavor: Google' \
    "http://metadata.google.internal/computeMetadata/v1/instance/attributes/$1" 2>/dev/null
}
WORKER="$(meta agent-worker-number || true)"
WORKER="${WORKER:-0}"
HOST="$(hostname)"

log() {
  echo "$(date -u +%Y-%m-%dT%H:%M:%SZ) [$ROLE worker $WORKER] $*" >>"$BOOT_LOG"
  gsutil -q cp "$BOOT_LOG" "$STORE/@{boot_prefix}$HOST.log" >/dev/null 2>&1 || true
}
fail() { log "FAILED: $*"; exit 1; }

log "boot: cluster $CLUSTER, tpuctl $VERSION"
mkdir -p "$AGENT_DIR"

if [ -n "$PY" ]; then
  log "using the given interpreter $PY"
elif [ "$ROLE" = "node-vm" ] && [ -n "$TF_VERSION" ]; then
  log "installing tensorflow-cpu==$TF_VERSION to match the TPU Node"
  apt-get update -qq >/dev/null && apt-get install -y -qq python3-pip python3-venv >/dev/null || fail "apt-get"
  python3 -m venv "$AGENT_DIR/venv" || fail "venv"
  "$AGENT_DIR/venv/bin/pip" install -q "tensorflow-cpu==$TF_VERSION" || fail "pip tensorflow-cpu==$TF_VERSION"
  PY="$AGENT_DIR/venv/bin/python"
else
  # The TPU VM image ships TensorFlow matched to libtpu: never reinstall it, only add the agent beside it.
  python3 -m venv --system-site-packages "$AGENT_DIR/venv" || fail "venv"
  PY="$AGENT_DIR/venv/bin/python"
fi

AGENT_PACKAGE="@{agent_package}"
log "installing the agent from $STORE/$AGENT_PACKAGE"
gsutil -q cp "$STORE/$AGENT_PACKAGE" "$AGENT_DIR/" || fail "agent package not in the store"
"$PY" -m pip install -q "$AGENT_DIR/$(basename "$AGENT_PACKAGE")" || fail "pip install agent"

cat >"$UNIT_DIR/tpuctl-agent.service" <<UNIT
[Unit]
Description=tpuctl agent for cluster $CLUSTER
After=network-online.target
Wants=network-online.target

[Service]
Environment=TPUCTL_ACCELERATOR=$ACCELERATOR
Environment=TPUCTL_TPU=$TPU_ADDRESS
Environment=TF_USE_LEGACY_KERAS=1
ExecStart=$PY -m tpuctl.agent --store $STORE --worker $WORKER
Restart=always
RestartSec=5

[Install]
WantedBy=multi-user.target
UNIT
systemctl daemon-reload && systemctl enable --now tpuctl-agent.service || fail "systemctl"
log "agent running"
