# The shardkv image: the operator (/manager), the replica (/node) and the CLI
# (/kvctl), static binaries on distroless (no shell, no package manager),
# running as the unprivileged user 65532 ("nonroot").
#
# There is no ENTRYPOINT: every container names its binary.
#   - The operator's Deployment (config/manager) runs command ["/manager"].
#   - The pods the operator creates run command ["/node"] with args
#     ["serve", ...] (docs/operator.md).
#   - kubectl exec POD -- /kvctl --ctrler=... status
# The default CMD runs the operator: `docker run shardkv:dev` is the manager
# (out of a cluster it needs a kubeconfig); `docker run shardkv:dev /node
# serve ...` a replica.
#
#   docker build -t shardkv:dev .

FROM golang:1.26 AS build
WORKDIR /src
# Modules first: this layer is reused while go.mod/go.sum do not change.
COPY go.mod go.sum ./
RUN go mod download
COPY api/ api/
COPY cmd/ cmd/
COPY controllers/ controllers/
COPY pkg/ pkg/
ARG TARGETOS=linux
ARG TARGETARCH
RUN CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags="-s -w" -o /out/ ./cmd/manager ./cmd/node ./cmd/kvctl

FROM gcr.io/distroless/static:nonroot
COPY --from=build /out/manager /out/node /out/kvctl /
USER 65532:65532
CMD ["/manager"]
