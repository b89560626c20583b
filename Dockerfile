# syntax=docker/dockerfile:1
#
# The volume-health agent image.
#
#   docker build -t volume-health-agent:0.1.0 .
#
# The builder runs `cargo xtask build` as on a developer machine: the
# release agent with the committed kernel object embedded
# (health-ebpf/object/, no eBPF toolchain needed) and the controller. Only
# when the kernel sources no longer match that object does it apt-install
# Debian's Rust compiler, LLVM and bpf-linker to build it
# (xtask/src/ebpf/; it needs apt and root, which a Debian image has). The
# runtime image holds those two binaries (the controller, the CSI sidecar's
# command, carries no kernel programs).
#
# Without an engine, `cargo xtask image` writes the agent's image as an OCI
# archive (docs/install.md, "The image"); tests/tests/image.rs checks that its config
# has this file's ENTRYPOINT and CMD (those of the last stage).

ARG RUST_VERSION=1.95
FROM rust:${RUST_VERSION}-bookworm AS builder
WORKDIR /src
COPY . .
# Caches: crates, the tools cache (bpf-linker, when the kernel object must
# be built) and the target dir; the binaries are copied out of the cache
# mount.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/root/.cache/volume-health \
    --mount=type=cache,target=/src/target \
    cargo xtask build \
    && mkdir -p /out \
    && cp target/release/health-agent target/release/health-controller /out/

# The fault disk server for `cargo xtask kind` (not part of the agent image);
# plain cargo, no eBPF toolchain. Built on Debian bookworm, whose glibc is no
# newer than kind's node image's, so the binary runs on a kind node:
#   docker build --target faultdisk --output type=local,dest=DIR .
FROM rust:${RUST_VERSION}-bookworm AS faultdisk-builder
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target,id=faultdisk-target \
    cargo build --release --locked -p health-tests --bin faultdisk \
    && mkdir -p /out \
    && cp target/release/faultdisk /out/faultdisk

FROM scratch AS faultdisk
COPY --from=faultdisk-builder /out/faultdisk /faultdisk

# Runtime: glibc and libgcc (what the binary links), no shell, no package
# manager. The DaemonSet runs it as uid 0 with a few capabilities
# (deploy/daemonset.yaml says which and why).
FROM gcr.io/distroless/cc-debian12 AS runtime
COPY --from=builder /out/health-agent /usr/local/bin/health-agent
COPY --from=builder /out/health-controller /usr/local/bin/health-controller
ENTRYPOINT ["/usr/local/bin/health-agent"]
CMD ["run"]
