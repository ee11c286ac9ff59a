#!/usr/bin/env bash
# Regenerates the wire API (pkg/shardkvpb) from its .proto files.
# protoc comes from Debian (protobuf-compiler); the Go plugins are pinned Go modules.
set -euo pipefail
cd "$(dirname "$0")/.."
PROTOC_GEN_GO=google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
PROTOC_GEN_GO_GRPC=google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
# The protoc the committed code was generated with (Debian bookworm's
# protobuf-compiler). Its version is stamped into every .pb.go header, so a
# different protoc would show up as a diff in CI's generate check.
PROTOC_VERSION=3.21.12
if ! command -v protoc >/dev/null; then
  echo "protoc not found: apt-get install -y protobuf-compiler (version $PROTOC_VERSION)" >&2
  exit 1
fi
have=$(protoc --version | awk '{print $2}')
if [ "$have" != "$PROTOC_VERSION" ]; then
  echo "protoc $have found, $PROTOC_VERSION pinned (Debian bookworm's protobuf-compiler)" >&2
  exit 1
fi
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
GOBIN="$bin" go install "$PROTOC_GEN_GO"
GOBIN="$bin" go install "$PROTOC_GEN_GO_GRPC"
PATH="$bin:$PATH" protoc -I pkg/shardkvpb \
  --go_out=pkg/shardkvpb --go_opt=paths=source_relative \
  --go-grpc_out=pkg/shardkvpb --go-grpc_opt=paths=source_relative \
  pkg/shardkvpb/*.proto
