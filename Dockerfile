# The grid binary as an image: a static build (no cgo), on a distroless base
# with no shell, running as a non-root user. The chart's image
# (deploy/helm/grid: ghcr.io/grid-inference/grid, tag = its appVersion) is
# this one, built with VERSION set to that tag and REVISION to the commit:
#
#   docker build --build-arg VERSION=0.1.0 --build-arg REVISION=$(git rev-parse HEAD) \
#     -t ghcr.io/grid-inference/grid:0.1.0 .
#
# Base images: pass digests for a reproducible build (the tags below are the
# defaults; resolve each with `docker buildx imagetools inspect IMAGE`):
#
#   --build-arg GO_IMAGE=golang:1.27.3-bookworm@sha256:<digest>
#   --build-arg BASE_IMAGE=gcr.io/distroless/static-debian12:nonroot@sha256:<digest>
#
# Go 1.27.3, as CI and the README ask (go.mod's toolchain line).
ARG GO_IMAGE=golang:1.27.3-bookworm
ARG BASE_IMAGE=gcr.io/distroless/static-debian12:nonroot

FROM ${GO_IMAGE} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=devel
ARG REVISION=""
RUN CGO_ENABLED=0 GOFLAGS=-trimpath go build \
      -ldflags "-s -w -X github.com/grid-inference/grid/internal/buildinfo.Version=${VERSION} -X github.com/grid-inference/grid/internal/buildinfo.Revision=${REVISION}" \
      -o /out/grid ./cmd/grid

FROM ${BASE_IMAGE}
ARG VERSION=devel
ARG REVISION=""
# The project has no license file yet: NOASSERTION (SPDX) until it does.
ARG LICENSES=NOASSERTION
LABEL org.opencontainers.image.title="grid" \
      org.opencontainers.image.description="Cross-site router for LLM inference: operator, gateway and simulator in one binary" \
      org.opencontainers.image.source="https://github.com/grid-inference/grid" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="${LICENSES}"
COPY --from=build /out/grid /usr/local/bin/grid
# distroless's nonroot user; the chart's securityContext runs as it too.
USER 65532:65532
# No default command: the image runs what it is given (`grid operator ...`,
# `grid gateway ...`, as the chart does); with nothing it prints the usage
# and exits 2, rather than succeeding at printing help.
ENTRYPOINT ["/usr/local/bin/grid"]
