# Shared by scripts/test and scripts/container-image: a Docker engine and the action's image, built
# from the project's Dockerfile. Sourced, not run (needs $root). docs/container.md explains the test bed.
#
# Nothing here needs a bridge network: the engine runs with --bridge=none and every build and
# container uses --network host, so traffic stays on 127.0.0.1 or goes to the package registries.

tools="${FRO_BOT_TOOLS_DIR:-$root/.tools}"
docker_dir="$tools/docker"
mkdir -p "$docker_dir"

# The image the suite runs; scripts/test exports it as FRO_BOT_TEST_IMAGE.
FRO_BOT_IMAGE_TAG="${FRO_BOT_IMAGE_TAG:-fro-bot:test}"

docker_answers() { docker info >/dev/null 2>&1; }

# Makes sure a Docker engine answers. Installs docker.io (and debootstrap, for the stand-in base
# images) on a machine without them; starts dockerd in the background when no engine answers and
# records its pid in $docker_dir/dockerd.pid so stop_docker stops only what this started.
ensure_docker() {
  if ! command -v dockerd >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1; then
    echo "installing docker.io and debootstrap" >&2
    apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io debootstrap >&2
  fi
  if docker_answers; then
    return 0
  fi
  echo "starting dockerd (log: $docker_dir/dockerd.log)" >&2
  dockerd --bridge=none --iptables=false >"$docker_dir/dockerd.log" 2>&1 &
  DOCKERD_PID=$!
  echo "$DOCKERD_PID" > "$docker_dir/dockerd.pid"
  local i
  for i in $(seq 1 120); do
    if docker_answers; then
      echo "dockerd ready (pid $DOCKERD_PID)" >&2
      return 0
    fi
    if ! kill -0 "$DOCKERD_PID" 2>/dev/null; then break; fi
    sleep 0.5
  done
  echo "error: the Docker engine did not start; its log:" >&2
  tail -30 "$docker_dir/dockerd.log" >&2
  return 1
}

# Stops the dockerd that ensure_docker started in this shell (DOCKERD_PID), if any.
stop_docker() {
  local pid=${DOCKERD_PID:-}
  [ -n "$pid" ] || return 0
  DOCKERD_PID=
  rm -f "$docker_dir/dockerd.pid"
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.25; done
  kill -9 "$pid" 2>/dev/null || true
}

# Stops the dockerd an earlier `scripts/container-image` started, by its recorded pid (checked to
# still be a dockerd, not a process that reused the pid).
stop_recorded_docker() {
  local pid
  pid=$(cat "$docker_dir/dockerd.pid" 2>/dev/null) || return 0
  if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = dockerd ]; then
    DOCKERD_PID=$pid
    stop_docker
  else
    rm -f "$docker_dir/dockerd.pid"
  fi
}

# The Dockerfile uses `RUN --mount=type=cache`, a BuildKit feature. A client with the buildx plugin
# builds with BuildKit by default; without it, Debian's docker.io client (/usr/bin/docker) still has
# BuildKit built in behind DOCKER_BUILDKIT=1, while newer clients without buildx refuse.
docker_build() {
  if docker buildx version >/dev/null 2>&1; then
    docker build "$@"
  elif [ -x /usr/bin/docker ]; then
    DOCKER_BUILDKIT=1 /usr/bin/docker build "$@"
  else
    DOCKER_BUILDKIT=1 docker build "$@"
  fi
}

# Proxy settings of this environment, handed to builds (Docker's predefined proxy build args).
proxy_build_args() {
  local name
  for name in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY; do
    if [ -n "${!name:-}" ]; then printf -- '--build-arg\n%s\n' "$name"; fi
  done
}

image_present() { docker image inspect "$1" >/dev/null 2>&1; }

# The Debian mirror apt on this machine uses (deb822 or one-line sources), else Debian's default.
debian_mirror() {
  local uri
  uri=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null \
        | awk '/^URIs:/ { for (i = 2; i <= NF; i++) print $i }' | grep -v -- '-security' | head -n 1)
  if [ -z "$uri" ]; then
    uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
          | awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; break } }' \
          | grep -v -- '-security' | head -n 1)
  fi
  echo "${FRO_BOT_DEBIAN_MIRROR:-${uri:-http://deb.debian.org/debian}}"
}

# The machine's extra CA certificates (package downloads here may go through a TLS-intercepting
# proxy): copied into a stand-in image so its apt, npm and cargo trust what the host trusts.
copy_host_cas() {
  local dest=$1
  mkdir -p "$dest"
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$dest/"
  fi
}

# debian:bookworm-slim stand-in: a minbase debootstrap of bookworm, imported as an image.
build_debian_stand_in() {
  local tag=$1 work mirror security
  work=$(mktemp -d "$docker_dir/debootstrap.XXXXXX")
  mirror=$(debian_mirror)
  security="${mirror%/debian}/debian-security"
  echo "building stand-in $tag: debootstrap --variant=minbase bookworm from $mirror" >&2
  debootstrap --variant=minbase --include=ca-certificates bookworm "$work/rootfs" "$mirror" \
    >"$work/debootstrap.log" 2>&1 || { tail -30 "$work/debootstrap.log" >&2; rm -rf "$work"; return 1; }
  rm -f "$work/rootfs/etc/apt/sources.list"
  cat > "$work/rootfs/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  copy_host_cas "$work/rootfs/usr/local/share/ca-certificates"
  chroot "$work/rootfs" update-ca-certificates >/dev/null
  chroot "$work/rootfs" apt-get clean
  rm -rf "$work/rootfs/var/lib/apt/lists/"* "$work/rootfs/var/cache/apt/"*.bin
  tar -C "$work/rootfs" --numeric-owner -c . \
    | docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["bash"]' - "$tag" >/dev/null
  rm -rf "$work"
}

# node:20-bookworm-slim stand-in: the Debian stand-in plus Debian's nodejs and npm.
build_node_stand_in() {
  local tag=$1 base=$2
  echo "building stand-in $tag: $base + Debian's nodejs and npm" >&2
  local args
  mapfile -t args < <(proxy_build_args)
  docker_build --network host --progress plain "${args[@]}" -t "$tag" - >>"$docker_dir/base.log" 2>&1 <<EOF || { tail -30 "$docker_dir/base.log" >&2; return 1; }
FROM $base
RUN apt-get update \\
 && apt-get install -y --no-install-recommends nodejs npm \\
 && rm -rf /var/lib/apt/lists/*
# Node keeps its own CA list; the system one carries the machine's CAs.
ENV NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt
CMD ["node"]
EOF
}

# rust:<version>-bookworm stand-in: the Debian stand-in, a C toolchain (bundled SQLite, ring and
# aws-lc build C) and this machine's Rust toolchain, laid out like the official image.
build_rust_stand_in() {
  local tag=$1 base=$2 want=${3#rust:} sysroot version toolchain
  want=${want%-bookworm}
  sysroot=$(rustc --print sysroot)
  version=$(rustc --version | awk '{ print $2 }')
  case "$version" in
    "$want" | "$want".*) ;;
    *) echo "error: $tag needs Rust $want, this machine has $version" >&2; return 1 ;;
  esac
  toolchain="$version-$(rustc -vV | awk '/^host:/ { print $2 }')"
  echo "building stand-in $tag: $base + Rust $version from $sysroot" >&2
  local args
  mapfile -t args < <(proxy_build_args)
  # The sysroot is the build context; its share/ (docs) is left out.
  docker_build --network host --progress plain "${args[@]}" -t "$tag" -f - "$sysroot" \
    >>"$docker_dir/base.log" 2>&1 <<EOF || { tail -30 "$docker_dir/base.log" >&2; return 1; }
FROM $base
RUN apt-get update \\
 && apt-get install -y --no-install-recommends gcc g++ libc6-dev make pkg-config git curl \\
 && rm -rf /var/lib/apt/lists/*
ENV RUSTUP_HOME=/usr/local/rustup CARGO_HOME=/usr/local/cargo RUST_VERSION=$version \\
    PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
COPY bin /usr/local/rustup/toolchains/$toolchain/bin
COPY lib /usr/local/rustup/toolchains/$toolchain/lib
COPY libexec /usr/local/rustup/toolchains/$toolchain/libexec
COPY etc /usr/local/rustup/toolchains/$toolchain/etc
RUN mkdir -p /usr/local/cargo/bin \\
 && for t in /usr/local/rustup/toolchains/$toolchain/bin/*; do ln -s "\$t" /usr/local/cargo/bin/; done \\
 && cargo --version && rustc --version
EOF
}

# The Dockerfile's base images, as named there. Each is used when present locally; otherwise it is
# pulled when FRO_BOT_PULL_BASE_IMAGES=1, else (or when the pull fails) built as a stand-in.
# `ensure_base_images test`: only the bases of the test image's stages (no Rust image).
ensure_base_images() {
  local dockerfile=$root/Dockerfile rust_version debian=debian:bookworm-slim node=node:20-bookworm-slim rust
  rust_version=$(awk -F= '/^ARG RUST_VERSION=/ { print $2; exit }' "$dockerfile")
  rust="rust:${rust_version}-bookworm"
  local image
  for image in "$debian" "$node" "$rust"; do
    grep -q "FROM ${image%%:*}:" "$dockerfile" || { echo "error: Dockerfile no longer uses $image" >&2; return 1; }
  done
  local needed=("$debian" "$node" "$rust")
  [ "${1:-}" = test ] && needed=("$debian" "$node")
  for image in "${needed[@]}"; do
    if image_present "$image"; then continue; fi
    if [ "${FRO_BOT_PULL_BASE_IMAGES:-0}" = 1 ] && docker pull -q "$image" >/dev/null 2>&1; then continue; fi
    case "$image" in
      "$debian") build_debian_stand_in "$image" ;;
      "$node") build_node_stand_in "$image" "$debian" ;;
      "$rust") build_rust_stand_in "$image" "$debian" "$image" ;;
    esac || return 1
  done
}

# Builds the project's Dockerfile as it is. The cargo registry and target directory are BuildKit
# cache mounts (see the Dockerfile), so a rebuild compiles only what changed.
build_image() {
  local tag=${1:-$FRO_BOT_IMAGE_TAG} args start
  ensure_base_images || return 1
  mapfile -t args < <(proxy_build_args)
  start=$(date +%s)
  echo "building $tag from $root/Dockerfile (log: $docker_dir/build.log)" >&2
  if ! docker_build --network host --progress plain "${args[@]}" -t "$tag" "$root" \
      >"$docker_dir/build.log" 2>&1; then
    echo "error: building $tag failed; the end of its log:" >&2
    tail -40 "$docker_dir/build.log" >&2
    return 1
  fi
  echo "built $tag in $(( $(date +%s) - start ))s ($(docker image inspect -f '{{.Size}}' "$tag" | awk '{ printf "%.0f MB", $1 / 1e6 }'))" >&2
}

# The suite's image: the Dockerfile's `test` target, the runtime stage with `bin` (the fro-bot the
# suite builds anyway, debug info stripped) instead of a release build of its own, which on 2 cores
# costs minutes after every source change and many more cold. The release image is built and
# published from the default target (build_image, the release workflow).
build_test_image() {
  local tag=$1 bin=$2 args start ctx old
  ensure_base_images test || return 1
  mapfile -t args < <(proxy_build_args)
  ctx=$(mktemp -d)
  objcopy --strip-debug "$bin" "$ctx/fro-bot" 2>/dev/null || cp "$bin" "$ctx/fro-bot" || { rm -rf "$ctx"; return 1; }
  chmod 0755 "$ctx/fro-bot"
  # The image the tag names now: replaced, it would stay behind untagged (621 MB a build).
  old=$(docker image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
  start=$(date +%s)
  echo "building $tag (the test target, with $bin) (log: $docker_dir/build.log)" >&2
  if ! docker_build --network host --progress plain "${args[@]}" --target test \
      -f "$root/Dockerfile" -t "$tag" "$ctx" >"$docker_dir/build.log" 2>&1; then
    echo "error: building $tag failed; the end of its log:" >&2
    tail -40 "$docker_dir/build.log" >&2
    rm -rf "$ctx"
    return 1
  fi
  rm -rf "$ctx"
  echo "built $tag in $(( $(date +%s) - start ))s" >&2
  if [ -n "$old" ] && [ "$old" != "$(docker image inspect --format '{{.Id}}' "$tag" 2>/dev/null)" ]; then
    # Only that one image, never another dangling image of the user's; one still in use stays.
    docker rmi "$old" >/dev/null 2>&1 || true
  fi
}
