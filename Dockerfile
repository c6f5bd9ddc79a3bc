# fro-bot container action. Built by .github/workflows/release.yml for linux/amd64 and linux/arm64
# and pinned by digest in action.yaml, so workflow runs pull it instead of compiling Rust.

ARG RUST_VERSION=1.95
ARG OPENCODE_VERSION=1.18.33

FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
# rusqlite is `bundled` and TLS is rustls: no system SQLite or OpenSSL in the runtime image.
# COPY keeps the context's mtimes, and cargo judges freshness by mtime: a cached target built after
# an edit that an older build did not see would pass for fresh. This step runs only when the sources
# changed, so marking them new costs nothing and always compiles what was copied.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    find src -type f -exec touch {} + \
 && cargo build --release --locked --bin fro-bot \
 && install -D -m 0755 target/release/fro-bot /out/fro-bot

FROM node:20-bookworm-slim AS opencode
ARG OPENCODE_VERSION
RUN npm install -g --no-audit --no-fund "opencode-ai@${OPENCODE_VERSION}" \
 && arch="$(dpkg --print-architecture | sed 's/amd64/x64/')" \
 && bin="$(find "$(npm root -g)" -path "*/opencode-linux-${arch}/bin/opencode" | head -n 1)" \
 && install -D -m 0711 "$bin" /out/opencode \
 && /out/opencode --version

# What both images share: everything but fro-bot.
FROM debian:bookworm-slim AS runtime
ARG OPENCODE_VERSION
# gh, curl and jq for the agent's repository work on schedule/dispatch runs (GH_TOKEN); ripgrep
# on PATH, which OpenCode's search tools use instead of downloading their own on every run.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates git zstd tar gh curl jq ripgrep \
 && rm -rf /var/lib/apt/lists/*
COPY --from=opencode /out/opencode /usr/local/bin/opencode
# The main and post steps get the same args, so each runs through its own path (argv[0] dispatch).
RUN ln -s fro-bot /usr/local/bin/fro-bot-run && ln -s fro-bot /usr/local/bin/fro-bot-post
ENV FRO_BOT_OPENCODE_VERSION=${OPENCODE_VERSION}
# No USER: the runner requires container actions to run as root.
ENTRYPOINT ["/usr/local/bin/fro-bot-run"]

# The test suite's image (`scripts/test`, docs/container.md): the same runtime with the fro-bot the
# suite already built, from a build context that holds only that binary. Never published; the
# `build` stage is not run for it.
FROM runtime AS test
COPY fro-bot /usr/local/bin/fro-bot

# The action's image (the default target, what the release workflow publishes).
FROM runtime
COPY --from=build /out/fro-bot /usr/local/bin/fro-bot
