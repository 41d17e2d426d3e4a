# The grid binary as an image: a static build (no cgo), on a distroless base
# with no shell, running as a non-root user. The chart's image
# (deploy/helm/grid: ghcr.io/grid-inference/grid, tag = its appVersion) is
# this one, built with VERSION set to that tag:
#
#   docker build --build-arg VERSION=0.1.0 -t ghcr.io/grid-inference/grid:0.1.0 .
#
# Go 1.27.3, as CI and the README ask (go.mod's toolchain line).
FROM golang:1.27.3-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=devel
RUN CGO_ENABLED=0 GOFLAGS=-trimpath go build \
      -ldflags "-s -w -X github.com/grid-inference/grid/internal/buildinfo.Version=${VERSION}" \
      -o /out/grid ./cmd/grid

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/grid /usr/local/bin/grid
# distroless's nonroot user; the chart's securityContext runs as it too.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/grid"]
CMD ["--help"]
