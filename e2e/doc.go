// Package e2e holds the end-to-end tests: the operator and real shardkv pods
// on a real Kubernetes cluster (the one $KUBECONFIG names), with a
// linearizability-checked client workload running inside the cluster.
//
// The tests are behind the e2e build tag, so `go test ./...` skips them:
//
//	hack/local-cluster.sh up                 # or any cluster: kind, ...
//	hack/build-images.sh --load shardkv      # shardkv:dev
//	hack/build-images.sh --load --tag dev2 shardkv
//	KUBECONFIG=... go test -tags e2e -v -timeout 60m ./e2e/
//
// `make test-e2e` does all of that, and tears the local cluster down.
package e2e
