# The shardkv image: the operator (/manager), the replica (/node) and the CLI
# (/kvctl), static binaries on an empty base (FROM scratch: no shell, no
# package manager, no /etc/passwd, no CA certificates), running as the
# unprivileged user 65532. Besides the binaries the image holds only /tmp
# (mode 1777); a replica's data dir is its PVC, mounted at a path of its own.
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
#
# hack/build-images.sh builds the same image (same binaries, user, CMD,
# working dir, PATH and /tmp; one layer, reproducible) without Docker.

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
# scratch has no /tmp, and no shell to make one in the final stage.
RUN mkdir -m 1777 /out/tmp

FROM scratch
COPY --from=build /out/ /
USER 65532:65532
WORKDIR /
CMD ["/manager"]
