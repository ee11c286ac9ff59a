#!/usr/bin/env bash
# A real single-node Kubernetes on this machine, without Docker or internet:
# containerd + runc from Debian, Kubernetes, etcd, CoreDNS and crictl built
# from the Go module proxy by hack/build-k8s.sh, all run as host processes.
#
#   hack/local-cluster.sh up             start (or resume) the cluster
#   hack/local-cluster.sh build          only build (or find) its binaries
#   hack/local-cluster.sh status         show what runs; non-zero if unhealthy
#   hack/local-cluster.sh down [--wipe]  stop it; --wipe also removes all state
#
# `up` prints `export KUBECONFIG=...` on stdout (progress goes to stderr), so
#   eval "$(hack/local-cluster.sh up)"
# works. It is idempotent: on a healthy cluster it only says so.
#
# Environment:
#   SHARDKV_LOCAL_CLUSTER_DIR  state (PKI, etcd data, kubelet root, containerd
#                              root, logs/, pids/); default /var/lib/shardkv-local
#   SHARDKV_CONTAINERD_SOCK    containerd's socket; default
#                              /run/shardkv-local/containerd.sock
#
# Layout: node "shardkv-local" whose IP is the pod bridge's gateway
# 10.244.0.1 (bridge shardkv0, created here so the node IP and CoreDNS exist
# before the first pod); pods get 10.244.0.0/24 with a route only to the
# service CIDR 10.96.0.0/12 (no default route, no masquerade: nothing leaves
# the machine); CoreDNS answers cluster.local on 10.244.0.1:53 and nothing
# else; the apiserver listens on :6443 (kubeconfigs use 127.0.0.1), etcd on
# 127.0.0.1:12379. PersistentVolumes come from the controller-manager's
# host-path provisioner, under /tmp/hostpath_pv/ (its fixed location). That
# provisioner makes each volume's directory root-owned 0750, and hostPath
# volumes ignore fsGroup, so a non-root pod (shardkv runs as 65532) could
# not write its volume: the hostpath-perms process opens each new volume
# directory to everyone (0777), as kind's local-path provisioner does. It
# is a shim for this throwaway single-node cluster only.
#
# NetworkPolicies are enforced by kube-network-policies (the Kubernetes
# network SIG's enforcer, built by hack/build-k8s.sh), a host process with
# its own identity: the first packet of each connection to or from a pod
# that a policy selects goes through nfqueue to it, and it accepts or drops
# it. Host processes running as root (the kubelet's probes, the apiserver's
# proxy) are not subject to policies, as with upstream's deployment.
set -euo pipefail
shopt -s inherit_errexit

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STATE=${SHARDKV_LOCAL_CLUSTER_DIR:-/var/lib/shardkv-local}
RUN=/run/shardkv-local
SOCK=${SHARDKV_CONTAINERD_SOCK:-$RUN/containerd.sock}
KUBECONFIG_ADMIN=$STATE/admin.kubeconfig

NODE=shardkv-local
BRIDGE=shardkv0
POD_CIDR=10.244.0.0/24
NODE_IP=10.244.0.1 # the bridge's gateway address: node IP, CoreDNS, apiserver endpoint
SERVICE_CIDR=10.96.0.0/12
KUBERNETES_SVC_IP=10.96.0.1
CLUSTER_DOMAIN=cluster.local
CNI_NET=shardkv-local
ETCD_PORT=12379
APISERVER_PORT=6443
COREDNS_READY=127.0.0.1:18181
# kube-network-policies' /metrics and /readyz (ready once its nftables
# table, inet kube-network-policies, is in).
NETPOL_ADDR=127.0.0.1:19080
# CRI normalizes this short name; hack/build-images.sh builds it.
PAUSE_IMAGE=shardkv-pause:1
HOSTPATH_PV_DIR=/tmp/hostpath_pv

# Start order; `down` stops them in reverse.
COMPONENTS=(containerd etcd kube-apiserver kube-controller-manager hostpath-perms kube-scheduler coredns kubelet kube-proxy kube-network-policies)

PKI=$STATE/pki
CONF=$STATE/config
PIDS=$STATE/pids
LOGS=$STATE/logs

log() { printf 'local-cluster: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# since T0: seconds elapsed since the $EPOCHREALTIME value T0, e.g. "2.3s".
since() {
  local us=$((${EPOCHREALTIME//[.,]/} - ${1//[.,]/}))
  printf '%d.%ds' $((us / 1000000)) $((us / 100000 % 10))
}

# step LABEL CMD...: run CMD with progress and timing.
step() {
  local label=$1 t0=$EPOCHREALTIME
  shift
  log "$label ..."
  "$@"
  log "$label: done in $(since "$t0")"
}

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}

# ---------------------------------------------------------------------------
# Processes: each is started under setsid, so it outlives this script, and
# recorded in $PIDS/NAME.pid as two lines: PID and the binary's path. It is
# only ever stopped through that record, and only if /proc/PID/exe is still
# that binary (so a reused PID is never hit).

# pid_of NAME: prints the recorded PID of NAME if that process still runs
# its binary; fails otherwise.
pid_of() {
  local f=$PIDS/$1.pid pid="" exe="" cur
  [ -f "$f" ] || return 1
  { read -r pid && read -r exe; } <"$f" || true
  [[ $pid =~ ^[0-9]+$ ]] && [ -n "$exe" ] || return 1
  cur=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
  [ "$cur" = "$exe" ] || [ "$cur" = "$exe (deleted)" ] || return 1
  echo "$pid"
}

running() { pid_of "$1" >/dev/null; }

# start_proc NAME BINARY ARG...: start NAME detached, logging to $LOGS/NAME.log.
start_proc() {
  local name=$1 bin pf=$PIDS/$1.pid lf=$LOGS/$1.log i
  bin=$(readlink -f "$2") || die "$2: not found"
  shift 2
  rm -f "$pf"
  printf '\n=== %s local-cluster: starting %s %s\n' "$(date -u +%FT%TZ)" "$bin" "$*" >>"$lf"
  # The wrapper closes every inherited descriptor above 2 (our lock, and any
  # pipe of the caller's that would otherwise never see EOF), records its own
  # PID, then execs the binary in its place.
  # shellcheck disable=SC2016 # expanded by the inner shell
  setsid bash -c '
    for fd in /proc/self/fd/*; do
      fd=${fd##*/}
      case $fd in 0 | 1 | 2) ;; *) eval "exec $fd>&-" 2>/dev/null || true ;; esac
    done
    printf "%s\n%s\n" "$$" "$2" >"$1.tmp" && mv -f "$1.tmp" "$1" && shift && exec "$@"' \
    _ "$pf" "$bin" "$@" </dev/null >>"$lf" 2>&1 &
  for ((i = 0; i < 100; i++)); do
    running "$name" && return 0
    sleep 0.05
  done
  tail -n 20 "$lf" >&2 || true
  die "$name did not start (log: $lf)"
}

# stop_proc NAME: SIGTERM the recorded process, SIGKILL after 30 s.
stop_proc() {
  local name=$1 pid i t0=$EPOCHREALTIME
  if ! pid=$(pid_of "$name"); then
    rm -f "$PIDS/$name.pid"
    return 0
  fi
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 300; i++)); do
    running "$name" || break
    sleep 0.1
  done
  if running "$name"; then
    log "$name (pid $pid) ignored SIGTERM for 30s; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
      running "$name" || break
      sleep 0.1
    done
    running "$name" && die "$name (pid $pid) does not exit"
  fi
  rm -f "$PIDS/$name.pid"
  log "stopped $name (pid $pid) in $(since "$t0")"
}

# wait_for NAME TIMEOUT_S CMD...: poll CMD until it succeeds; fail early,
# with the log's tail, if NAME's process exits.
wait_for() {
  local name=$1 timeout=$2 deadline
  shift 2
  deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    if ! running "$name"; then
      tail -n 30 "$LOGS/$name.log" >&2 || true
      die "$name exited (log: $LOGS/$name.log)"
    fi
    if ((SECONDS >= deadline)); then
      tail -n 30 "$LOGS/$name.log" >&2 || true
      die "$name: not ready after ${timeout}s: $* (log: $LOGS/$name.log)"
    fi
    sleep 0.2
  done
}

http_ok() { curl -fsS --max-time 2 -o /dev/null "$@"; }

kubectl_() { "$BIN/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" "$@"; }

# crictl reads its endpoints from $CONF/crictl.yaml (for people too:
# crictl -c /var/lib/shardkv-local/config/crictl.yaml ps).
crictl_() {
  if [ ! -f "$CONF/crictl.yaml" ]; then
    mkdir -p "$CONF"
    printf 'runtime-endpoint: unix://%s\nimage-endpoint: unix://%s\ntimeout: 60\n' "$SOCK" "$SOCK" >"$CONF/crictl.yaml"
  fi
  "$BIN/crictl" --config "$CONF/crictl.yaml" "$@"
}

# lock: one `up`/`down` at a time (per checkout: the lock is this script).
lock() {
  exec 8<"${BASH_SOURCE[0]}"
  if ! flock -n 8; then
    log "another hack/local-cluster.sh up/down is running; waiting for it"
    flock -w 900 8 || die "still locked after 15 minutes"
  fi
}

# ---------------------------------------------------------------------------
# Prerequisites

need_root() {
  [ "$(id -u)" = 0 ] || die "must run as root (it runs containerd, the kubelet and kube-proxy, and changes iptables)"
}

ensure_packages() {
  local missing=0 c
  for c in containerd containerd-shim-runc-v2 ctr runc iptables ip6tables conntrack openssl curl; do
    command -v "$c" >/dev/null || missing=1
  done
  for c in bridge host-local portmap loopback; do
    [ -x "/usr/lib/cni/$c" ] || missing=1
  done
  if [ "$missing" = 0 ]; then
    log "Debian packages present"
    return 0
  fi
  log "installing Debian packages (containerd runc containernetworking-plugins iptables conntrack openssl curl)"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    containerd runc containernetworking-plugins iptables conntrack openssl curl >&2
}

# build_binaries: sets BIN (hack/build-k8s.sh's bin dir; builds what is
# missing) and records it for `down`.
build_binaries() {
  BIN=$("$REPO/hack/build-k8s.sh" etcd kube-apiserver kube-controller-manager kube-scheduler \
    kubelet kube-proxy kubectl coredns crictl kube-network-policies | tail -n 1)
  [ -x "$BIN/kubelet" ] || die "hack/build-k8s.sh gave no usable bin dir ($BIN)"
  mkdir -p "$STATE"
  echo "$BIN" >"$STATE/bin-dir"
}

# find_bin_dir: BIN for `down`/`status`, without building if possible.
find_bin_dir() {
  BIN=""
  [ -f "$STATE/bin-dir" ] && BIN=$(<"$STATE/bin-dir")
  # (kube-network-policies is not built for this: if it ever ran, its
  # binary is in BIN, for `-cleanup`.)
  if [ -z "$BIN" ] || [ ! -x "$BIN/crictl" ] || [ ! -x "$BIN/kube-proxy" ] || [ ! -x "$BIN/kubectl" ]; then
    BIN=$("$REPO/hack/build-k8s.sh" crictl kube-proxy kubectl | tail -n 1)
  fi
}

# Host sysctls we change; their previous values are kept in the state dir
# and restored by `down --wipe`.
HOST_SYSCTLS=(net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables net.ipv4.conf.all.route_localnet)

host_setup() {
  local k
  mkdir -p "$STATE" "$RUN"
  if [ ! -f "$STATE/host-sysctls.orig" ]; then
    for k in "${HOST_SYSCTLS[@]}"; do
      echo "$k=$(sysctl -n "$k" 2>/dev/null || echo)"
    done >"$STATE/host-sysctls.orig"
  fi
  # Routing between the bridge and service IPs; bridged pod-to-pod traffic
  # through iptables so ClusterIP DNAT is undone on replies.
  sysctl -qw net.ipv4.ip_forward=1
  [ -e /proc/sys/net/bridge/bridge-nf-call-iptables ] || modprobe br_netfilter 2>/dev/null || true
  sysctl -qw net.bridge.bridge-nf-call-iptables=1 ||
    die "cannot enable net.bridge.bridge-nf-call-iptables (br_netfilter)"
  # The pod bridge with the gateway address, created now (the CNI bridge
  # plugin adopts it) so the node IP exists before any pod.
  ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
  ip -4 addr show dev "$BRIDGE" | grep -qF "inet $NODE_IP/24" || ip addr add "$NODE_IP/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
}

# ---------------------------------------------------------------------------
# PKI (openssl; ECDSA P-256 keys, 10 years) and kubeconfigs

# sign NAME SUBJECT EKU [SAN]: key + certificate signed by the cluster CA;
# kept if it exists.
sign() {
  local name=$1 subj=$2 eku=$3 san=${4:-}
  [ -s "$PKI/$name.crt" ] && [ -s "$PKI/$name.key" ] && return 0
  {
    echo "basicConstraints = critical, CA:FALSE"
    echo "keyUsage = critical, digitalSignature, keyEncipherment"
    echo "extendedKeyUsage = $eku"
    [ -z "$san" ] || echo "subjectAltName = $san"
  } >"$PKI/$name.ext"
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" \
    -CAcreateserial -CAserial "$PKI/ca.srl" -days 3650 -sha256 \
    -extfile "$PKI/$name.ext" -out "$PKI/$name.crt" 2>/dev/null
  rm -f "$PKI/$name.csr" "$PKI/$name.ext"
}

# kubeconfig FILE CERT: a kubeconfig for the client certificate CERT.
kubeconfig() {
  local tmp
  tmp=$(mktemp "$1.XXXXXX")
  cat >"$tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: shardkv-local
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
- name: $2
  user:
    client-certificate-data: $(base64 -w0 "$PKI/$2.crt")
    client-key-data: $(base64 -w0 "$PKI/$2.key")
contexts:
- name: shardkv-local
  context:
    cluster: shardkv-local
    user: $2
current-context: shardkv-local
EOF
  chmod 600 "$tmp"
  mv -f "$tmp" "$1"
}

gen_pki() {
  mkdir -p "$PKI"
  chmod 700 "$PKI"
  if [ ! -s "$PKI/ca.crt" ] || [ ! -s "$PKI/ca.key" ]; then
    # The CA signs everything, so a new CA means new certificates.
    rm -f "$PKI"/*.crt "$PKI"/*.key "$PKI"/*.kubeconfig "$KUBECONFIG_ADMIN"
    printf '[req]\ndistinguished_name = dn\n[dn]\n[ca]\nbasicConstraints = critical, CA:TRUE\nkeyUsage = critical, keyCertSign, cRLSign, digitalSignature\nsubjectKeyIdentifier = hash\n' >"$PKI/ca.cnf"
    openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
      -keyout "$PKI/ca.key" -subj "/CN=shardkv-local-ca" -days 3650 -sha256 \
      -config "$PKI/ca.cnf" -extensions ca -out "$PKI/ca.crt" 2>/dev/null
    rm -f "$PKI/ca.cnf"
  fi
  sign kube-apiserver "/CN=kube-apiserver" serverAuth \
    "DNS:kubernetes, DNS:kubernetes.default, DNS:kubernetes.default.svc, DNS:kubernetes.default.svc.$CLUSTER_DOMAIN, DNS:localhost, DNS:$NODE, IP:127.0.0.1, IP:$NODE_IP, IP:$KUBERNETES_SVC_IP"
  # The apiserver's client certificate for kubelet (logs, exec, port-forward, proxy).
  sign kube-apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
  sign admin "/O=system:masters/CN=shardkv-local-admin" clientAuth
  # The aggregation layer's client identity. With the request-header flags
  # set, the controller-manager and scheduler find the CA bundle they look up
  # (otherwise they log errors about it).
  sign front-proxy-client "/CN=front-proxy-client" clientAuth
  sign kube-controller-manager "/CN=system:kube-controller-manager" clientAuth
  sign kube-scheduler "/CN=system:kube-scheduler" clientAuth
  sign kube-proxy "/CN=system:kube-proxy" clientAuth
  sign coredns "/CN=system:coredns" clientAuth
  sign kube-network-policies "/CN=system:kube-network-policies" clientAuth
  sign kubelet "/O=system:nodes/CN=system:node:$NODE" clientAuth
  sign kubelet-serving "/CN=$NODE" serverAuth "DNS:$NODE, DNS:localhost, IP:$NODE_IP, IP:127.0.0.1"
  # ServiceAccount token signing key pair.
  if [ ! -s "$PKI/sa.key" ] || [ ! -s "$PKI/sa.pub" ]; then
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$PKI/sa.key" 2>/dev/null
    openssl pkey -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
  fi
  local c
  for c in kube-controller-manager kube-scheduler kube-proxy coredns kubelet kube-network-policies; do
    [ -s "$PKI/$c.kubeconfig" ] || kubeconfig "$PKI/$c.kubeconfig" "$c"
  done
  [ -s "$KUBECONFIG_ADMIN" ] || kubeconfig "$KUBECONFIG_ADMIN" admin
}

# ---------------------------------------------------------------------------
# Config files (rewritten on every `up`; all derived from the constants above)

write_configs() {
  mkdir -p "$CONF" "$STATE/cni/net.d" "$STATE/containerd" "$STATE/kubelet" "$STATE/pod-logs" "$RUN"

  # containerd 1.6: its own root, state and socket, so it clashes with no
  # other containerd.
  cat >"$CONF/containerd.toml" <<EOF
version = 2
root = "$STATE/containerd"
state = "$RUN/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "$SOCK"

[ttrpc]
  address = "$SOCK.ttrpc"

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "$STATE/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # The VM lacks CAP_SYS_RESOURCE: runc cannot set the -998 oom_score_adj the
  # kubelet asks for ("can't get final child's PID from pipe: EOF").
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  SystemdCgroup = false
  Root = "$RUN/runc"

[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = "$STATE/cni/net.d"
EOF

  # Pods: a private subnet behind the bridge, a route only to the service
  # CIDR (no default route, no masquerade), hostPorts via portmap.
  cat >"$STATE/cni/net.d/10-$CNI_NET.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "$CNI_NET",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$STATE/cni/ipam",
        "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$NODE_IP"}]],
        "routes": [{"dst": "$SERVICE_CIDR"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF

  # CoreDNS: only the cluster's zones (others are refused); no upstream.
  # No cache plugin: the kubernetes plugin answers from its informers, and a
  # cache would keep a recreated Service's old IP, or a pod's NXDOMAIN from
  # before it existed, for the cache's TTL.
  cat >"$CONF/Corefile" <<EOF
$CLUSTER_DOMAIN:53 in-addr.arpa:53 ip6.arpa:53 {
    bind $NODE_IP
    errors
    ready $COREDNS_READY
    kubernetes $CLUSTER_DOMAIN in-addr.arpa ip6.arpa {
        kubeconfig $PKI/coredns.kubeconfig
        pods insecure
        ttl 5
    }
}
EOF

  cat >"$CONF/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine runs cgroup v1, which 1.37 refuses by default.
failCgroupV1: false
cgroupDriver: cgroupfs
failSwapOn: false
containerRuntimeEndpoint: unix://$SOCK
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: $PKI/kubelet-serving.crt
tlsPrivateKeyFile: $PKI/kubelet-serving.key
# The apiserver (logs, exec, port-forward, proxy) authenticates with its
# client certificate and is authorized by SubjectAccessReview.
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: $PKI/ca.crt
authorization:
  mode: Webhook
clusterDNS: [$NODE_IP]
clusterDomain: $CLUSTER_DOMAIN
resolvConf: /etc/resolv.conf
podLogsDir: $STATE/pod-logs
# Low thresholds, so a busy shared disk does not evict pods, and no image GC:
# the images are imported locally and cannot be pulled again.
evictionHard:
  nodefs.available: "2%"
  nodefs.inodesFree: "2%"
  imagefs.available: "2%"
  memory.available: "100Mi"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
rotateCertificates: false
# Pods are synced, and changed Secrets and ConfigMaps reach their volumes,
# within about 10 s (default 1m): a certificate rotation's propagation wait
# can then be short (the e2e runs the operator with --tls-propagation=45s).
syncFrequency: 10s
EOF

  cat >"$CONF/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
hostnameOverride: $NODE
clusterCIDR: $POD_CIDR
clientConnection:
  kubeconfig: $PKI/kube-proxy.kubeconfig
# Leave the host's conntrack table size and timeouts alone.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
# Apply Service/endpoint changes at once (default: at most once a second),
# so a test that just saw its pods Ready finds their Service working.
iptables:
  minSyncPeriod: 0s
# NodePorts on the node IP only (not on eth0 or 127.0.0.1, which would need
# route_localnet).
nodePortAddresses: [primary]
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
EOF

  # Applied once the apiserver is ready.
  cat >"$CONF/bootstrap.yaml" <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: system:coredns
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: system:coredns
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:coredns
subjects:
- apiGroup: rbac.authorization.k8s.io
  kind: User
  name: system:coredns
---
# kube-network-policies: what upstream's install.yaml grants its DaemonSet.
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: system:kube-network-policies
rules:
- apiGroups: [""]
  resources: [pods, namespaces, nodes]
  verbs: [list, watch]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [list, watch]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch, update]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: system:kube-network-policies
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:kube-network-policies
subjects:
- apiGroup: rbac.authorization.k8s.io
  kind: User
  name: system:kube-network-policies
---
# The controller-manager's host-path provisioner (dirs under $HOSTPATH_PV_DIR).
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: standard
  annotations:
    storageclass.kubernetes.io/is-default-class: "true"
provisioner: kubernetes.io/host-path
reclaimPolicy: Delete
volumeBindingMode: Immediate
EOF
}

# ---------------------------------------------------------------------------
# up

start_containerd() {
  if ! running containerd; then
    start_proc containerd "$(command -v containerd)" --config "$CONF/containerd.toml"
  fi
  wait_for containerd 60 ctr -a "$SOCK" version
}

load_pause_image() {
  if crictl_ inspecti "$PAUSE_IMAGE" >/dev/null 2>&1; then
    log "$PAUSE_IMAGE already in containerd"
    return 0
  fi
  SHARDKV_CONTAINERD_SOCK=$SOCK "$REPO/hack/build-images.sh" --load pause >/dev/null
  crictl_ inspecti "$PAUSE_IMAGE" >/dev/null || die "the CRI does not see $PAUSE_IMAGE after hack/build-images.sh --load pause"
}

start_etcd() {
  running etcd || start_proc etcd "$BIN/etcd" \
    --name "$NODE" --data-dir "$STATE/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
    --initial-cluster "$NODE=http://127.0.0.1:$((ETCD_PORT + 1))" \
    --listen-metrics-urls "" \
    --unsafe-no-fsync # a throwaway test cluster: speed over crash safety
  wait_for etcd 60 http_ok "http://127.0.0.1:$ETCD_PORT/health"
}

start_apiserver() {
  running kube-apiserver || start_proc kube-apiserver "$BIN/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --secure-port "$APISERVER_PORT" --advertise-address "$NODE_IP" \
    --tls-cert-file "$PKI/kube-apiserver.crt" --tls-private-key-file "$PKI/kube-apiserver.key" \
    --client-ca-file "$PKI/ca.crt" \
    --kubelet-client-certificate "$PKI/kube-apiserver-kubelet-client.crt" \
    --kubelet-client-key "$PKI/kube-apiserver-kubelet-client.key" \
    --kubelet-certificate-authority "$PKI/ca.crt" \
    --kubelet-preferred-address-types InternalIP \
    --requestheader-client-ca-file "$PKI/ca.crt" \
    --requestheader-allowed-names front-proxy-client \
    --requestheader-username-headers X-Remote-User \
    --requestheader-group-headers X-Remote-Group \
    --requestheader-extra-headers-prefix X-Remote-Extra- \
    --proxy-client-cert-file "$PKI/front-proxy-client.crt" \
    --proxy-client-key-file "$PKI/front-proxy-client.key" \
    --service-account-issuer "https://kubernetes.default.svc.$CLUSTER_DOMAIN" \
    --service-account-key-file "$PKI/sa.pub" \
    --service-account-signing-key-file "$PKI/sa.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --authorization-mode Node,RBAC \
    --enable-admission-plugins NodeRestriction \
    --allow-privileged=true \
    --profiling=false
  wait_for kube-apiserver 120 kubectl_ get --raw /readyz
}

bootstrap_objects() {
  kubectl_ apply -f "$CONF/bootstrap.yaml" >/dev/null
}

start_controllers() {
  running kube-controller-manager || start_proc kube-controller-manager "$BIN/kube-controller-manager" \
    --kubeconfig "$PKI/kube-controller-manager.kubeconfig" \
    --authentication-kubeconfig "$PKI/kube-controller-manager.kubeconfig" \
    --authorization-kubeconfig "$PKI/kube-controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --leader-elect=false \
    --use-service-account-credentials=true \
    --service-account-private-key-file "$PKI/sa.key" \
    --root-ca-file "$PKI/ca.crt" \
    --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --enable-hostpath-provisioner=true \
    --profiling=false
  # See the header: volume directories appear when a PVC is provisioned,
  # before any pod can mount them; a 0.2 s poll opens them well before that.
  mkdir -p "$HOSTPATH_PV_DIR"
  # shellcheck disable=SC2016 # expanded by the inner shell
  running hostpath-perms || start_proc hostpath-perms "$(command -v bash)" -c '
    trap "exit 0" TERM INT
    while :; do
      find "$0" -mindepth 1 -maxdepth 1 -type d ! -perm 0777 -exec chmod 0777 {} + 2>/dev/null || true
      sleep 0.2
    done' "$HOSTPATH_PV_DIR"
  running kube-scheduler || start_proc kube-scheduler "$BIN/kube-scheduler" \
    --kubeconfig "$PKI/kube-scheduler.kubeconfig" \
    --authentication-kubeconfig "$PKI/kube-scheduler.kubeconfig" \
    --authorization-kubeconfig "$PKI/kube-scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --leader-elect=false \
    --profiling=false
  wait_for kube-controller-manager 60 http_ok -k https://127.0.0.1:10257/healthz
  wait_for kube-scheduler 60 http_ok -k https://127.0.0.1:10259/healthz
}

start_coredns() {
  running coredns || start_proc coredns "$BIN/coredns" -conf "$CONF/Corefile"
  wait_for coredns 60 http_ok "http://$COREDNS_READY/ready"
}

# node_ready SINCE: the node is Ready, by a heartbeat at or after the Unix
# time SINCE unless 0 (after a restart the Node still shows the old kubelet's
# Ready until the controller-manager notices, ~40s later).
node_ready() {
  local out status hb
  out=$(kubectl_ get node "$NODE" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status} {.status.conditions[?(@.type=="Ready")].lastHeartbeatTime}' 2>/dev/null) || return 1
  read -r status hb <<<"$out"
  [ "$status" = True ] || return 1
  [ "${1:-0}" = 0 ] || [ "$(date -d "$hb" +%s 2>/dev/null || echo 0)" -ge "$1" ]
}

start_kubelet() {
  local since=0
  running kubelet || since=$(date +%s)
  [ "$since" = 0 ] || start_proc kubelet "$BIN/kubelet" \
    --config "$CONF/kubelet.yaml" \
    --kubeconfig "$PKI/kubelet.kubeconfig" \
    --root-dir "$STATE/kubelet" \
    --hostname-override "$NODE" --node-ip "$NODE_IP"
  wait_for kubelet 60 http_ok http://127.0.0.1:10248/healthz
  wait_for kubelet 120 node_ready "$since"
}

start_kube_proxy() {
  running kube-proxy || start_proc kube-proxy "$BIN/kube-proxy" --config "$CONF/kube-proxy.yaml"
  wait_for kube-proxy 60 http_ok http://127.0.0.1:10256/healthz
}

start_network_policies() {
  running kube-network-policies || start_proc kube-network-policies "$BIN/kube-network-policies" \
    --kubeconfig "$PKI/kube-network-policies.kubeconfig" \
    --hostname-override "$NODE" \
    --metrics-bind-address "$NETPOL_ADDR"
  wait_for kube-network-policies 60 http_ok "http://$NETPOL_ADDR/readyz"
}

wait_default_sa() {
  # Pods are rejected until the namespace's default ServiceAccount exists.
  wait_for kube-controller-manager 60 kubectl_ -n default get serviceaccount default
}

all_healthy() {
  local c
  for c in "${COMPONENTS[@]}"; do running "$c" || return 1; done
  [ -n "${BIN:-}" ] || return 1
  kubectl_ get --raw /readyz >/dev/null 2>&1 && node_ready 0
}

cmd_up() {
  local t0=$EPOCHREALTIME
  need_root
  lock
  step "Debian packages" ensure_packages
  step "binaries (hack/build-k8s.sh)" build_binaries
  if all_healthy; then
    log "already up and healthy"
    echo "export KUBECONFIG=$KUBECONFIG_ADMIN"
    return 0
  fi
  mkdir -p "$STATE" "$PIDS" "$LOGS"
  step "host network (bridge $BRIDGE $NODE_IP/24, sysctls)" host_setup
  step "PKI and kubeconfigs" gen_pki
  write_configs
  step "containerd ($SOCK)" start_containerd
  step "pause image $PAUSE_IMAGE" load_pause_image
  step "etcd" start_etcd
  step "kube-apiserver" start_apiserver
  step "RBAC for CoreDNS, default StorageClass" bootstrap_objects
  step "kube-controller-manager, kube-scheduler" start_controllers
  step "CoreDNS ($NODE_IP:53)" start_coredns
  step "kubelet (node $NODE Ready)" start_kubelet
  step "kube-proxy" start_kube_proxy
  step "kube-network-policies (NetworkPolicy enforcer)" start_network_policies
  step "default ServiceAccount" wait_default_sa
  log "cluster up in $(since "$t0"); logs in $LOGS/"
  echo "export KUBECONFIG=$KUBECONFIG_ADMIN"
}

# ---------------------------------------------------------------------------
# status

cmd_status() {
  local c ok=0 pid
  [ "$(id -u)" = 0 ] || die "must run as root"
  for c in "${COMPONENTS[@]}"; do
    if pid=$(pid_of "$c"); then
      printf '%-24s running (pid %s)\n' "$c" "$pid"
    else
      printf '%-24s not running\n' "$c"
      ok=1
    fi
  done
  BIN=""
  [ -f "$STATE/bin-dir" ] && BIN=$(<"$STATE/bin-dir")
  if [ -n "$BIN" ] && [ -x "$BIN/kubectl" ] && [ -s "$KUBECONFIG_ADMIN" ]; then
    if kubectl_ --request-timeout=5s get --raw /readyz >/dev/null 2>&1; then
      printf '%-24s ready\n' apiserver
    else
      printf '%-24s not ready\n' apiserver
      ok=1
    fi
    if node_ready 0; then
      printf '%-24s Ready\n' "node $NODE"
    else
      printf '%-24s not Ready\n' "node $NODE"
      ok=1
    fi
  else
    printf '%-24s no cluster state in %s\n' apiserver "$STATE"
    ok=1
  fi
  printf 'KUBECONFIG=%s\n' "$KUBECONFIG_ADMIN"
  return "$ok"
}

# ---------------------------------------------------------------------------
# down

# remove_pods: stop and remove every pod sandbox through the CRI, so CNI DEL
# releases its IPs, veths, netns and hostPort rules.
remove_pods() {
  local ids id n=0
  ids=$(crictl_ pods -q) || die "crictl pods failed"
  for id in $ids; do
    crictl_ stopp "$id" >/dev/null || log "crictl stopp $id failed"
    crictl_ rmp -f "$id" >/dev/null || log "crictl rmp $id failed"
    n=$((n + 1))
  done
  log "removed $n pod(s)"
}

# kill_shims: with --wipe, any shim or container left after containerd
# stopped (pods that could not be removed), by the PIDs containerd recorded.
kill_shims() {
  local f pid
  for f in "$RUN"/containerd/io.containerd.runtime.v2.task/*/*/init.pid \
    "$RUN"/containerd/io.containerd.runtime.v2.task/*/*/shim.pid; do
    [ -f "$f" ] || continue
    pid=$(<"$f")
    if ! [[ $pid =~ ^[0-9]+$ ]] || [ ! -d "/proc/$pid" ]; then continue; fi
    log "killing leftover process $pid ($f)"
    kill -KILL "$pid" 2>/dev/null || true
  done
}

# drop_chains IPTABLES: remove every KUBE-* and CNI-* chain (kube-proxy's,
# the kubelet's, portmap's) and the rules that jump to them, in one
# iptables-restore transaction per table.
drop_chains() {
  local ipt=$1 t save script
  command -v "$ipt-save" >/dev/null || return 0
  for t in filter nat mangle raw; do
    save=$("$ipt-save" -t "$t" 2>/dev/null) || continue
    script=$(awk '
      /^:(KUBE|CNI)-/ { chains[++n] = substr($1, 2); next }
      /^-A / && $2 !~ /^(KUBE|CNI)-/ && / -[jg] (KUBE|CNI)-/ { sub(/^-A /, "-D "); print }
      END { for (i = 1; i <= n; i++) print "-F " chains[i]; for (i = 1; i <= n; i++) print "-X " chains[i] }
    ' <<<"$save")
    [ -n "$script" ] || continue
    printf '*%s\n%s\nCOMMIT\n' "$t" "$script" | "$ipt-restore" --noflush ||
      log "WARNING: could not drop all KUBE-*/CNI-* chains from $ipt table $t"
  done
}

# mounts_under DIR...: mount points under DIR, deepest first.
mounts_under() {
  findmnt -rn -o TARGET | awk -v a="$1" -v b="${2:-/nonexistent}" \
    'index($0, a "/") == 1 || $0 == a || index($0, b "/") == 1 || $0 == b' | sort -ru
}

wipe() {
  local m ns c k v t0
  # kube-proxy's own clean-up (iptables, ipvs and nftables rules).
  if [ -x "${BIN:-}/kube-proxy" ]; then
    "$BIN/kube-proxy" --cleanup >>"$LOGS/kube-proxy.log" 2>&1 || true
  fi
  # The enforcer removes its nftables table when it stops; this removes it
  # if it was killed.
  if [ -x "${BIN:-}/kube-network-policies" ]; then
    "$BIN/kube-network-policies" -cleanup >>"$LOGS/kube-network-policies.log" 2>&1 ||
      log "WARNING: kube-network-policies -cleanup failed (log: $LOGS/kube-network-policies.log)"
  fi
  drop_chains iptables
  drop_chains ip6tables
  for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^cni-/ { print $1 }'); do
    ip netns delete "$ns" || log "WARNING: cannot delete netns $ns"
  done
  ip link show "$BRIDGE" >/dev/null 2>&1 && ip link delete "$BRIDGE"
  # The kubelet's mounts (secrets, projected tokens) and containerd's
  # (rootfs, shm), deepest first.
  while read -r m; do
    [ -n "$m" ] || continue
    umount "$m" 2>/dev/null || umount -l "$m" || log "WARNING: cannot unmount $m"
  done < <(mounts_under "$STATE" "$RUN")
  [ -z "$(mounts_under "$STATE" "$RUN")" ] || die "mounts remain under $STATE or $RUN: $(mounts_under "$STATE" "$RUN" | tr '\n' ' ')"
  # The kubelet's cgroups (cgroupfs driver): empty once the pods are gone.
  for c in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
    if [ -d "$c" ]; then find "$c" -depth -type d -exec rmdir {} + 2>/dev/null || true; fi
  done
  # The kubelet's log symlinks into our pod-logs dir, CNI's result cache.
  for m in /var/log/containers/*; do
    [ -L "$m" ] && [[ $(readlink "$m") == "$STATE"/* ]] && rm -f "$m"
  done
  rmdir /var/log/containers 2>/dev/null || true
  rm -f /var/lib/cni/results/"$CNI_NET"-*
  rm -rf "$HOSTPATH_PV_DIR"
  # Host sysctls as they were before the first `up`.
  if [ -f "$STATE/host-sysctls.orig" ]; then
    while IFS='=' read -r k v; do
      if [ -n "$v" ]; then sysctl -qw "$k=$v" 2>/dev/null || true; fi
    done <"$STATE/host-sysctls.orig"
  fi
  t0=$EPOCHREALTIME
  rm -rf --one-file-system "$STATE" "$RUN"
  log "removed $STATE and $RUN in $(since "$t0")"
}

cmd_down() {
  local wipe=0 t0=$EPOCHREALTIME i
  for a in "$@"; do
    case $a in
      --wipe) wipe=1 ;;
      *) usage ;;
    esac
  done
  need_root
  lock
  # Refuse to wipe anything that does not look like a state dir.
  case $STATE in /?*) ;; *) die "SHARDKV_LOCAL_CLUSTER_DIR must be an absolute path, not '$STATE'" ;; esac
  [ "$STATE" != / ] || die "refusing to use / as the state dir"
  if [ ! -d "$STATE" ] && [ ! -d "$RUN" ]; then
    log "nothing to stop: no $STATE"
    ip link show "$BRIDGE" >/dev/null 2>&1 && [ "$wipe" = 1 ] && ip link delete "$BRIDGE"
    return 0
  fi
  mkdir -p "$PIDS" "$LOGS"
  find_bin_dir
  # 1. The kubelet first, so it restarts no pod.
  step "stop kubelet" stop_proc kubelet
  # 2. Every pod through the CRI, so CNI DEL runs. If containerd is down but
  # has state (e.g. after a reboot), start it for this.
  if ! running containerd && [ -f "$CONF/containerd.toml" ] && [ -d "$STATE/containerd" ]; then
    if [ "$wipe" = 1 ] || [ -n "$(ls -A "$RUN/containerd/io.containerd.runtime.v2.task/k8s.io" 2>/dev/null)" ]; then
      step "start containerd to remove pods" start_containerd
    fi
  fi
  if running containerd; then
    step "remove pods (crictl stopp/rmp)" remove_pods
  fi
  # 3. The rest, by recorded PID, in reverse start order.
  for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do
    [ "${COMPONENTS[i]}" = kubelet ] && continue
    stop_proc "${COMPONENTS[i]}"
  done
  if [ "$wipe" = 1 ]; then
    kill_shims
    step "wipe (iptables, netns, bridge, mounts, state)" wipe
  fi
  log "down$([ "$wipe" = 1 ] && echo " --wipe") in $(since "$t0")"
}

# ---------------------------------------------------------------------------

[ $# -ge 1 ] || usage
cmd=$1
shift
case $cmd in
  up) [ $# -eq 0 ] || usage; cmd_up ;;
  build) [ $# -eq 0 ] || usage; build_binaries; log "binaries in $BIN" ;;
  down) cmd_down "$@" ;;
  status) [ $# -eq 0 ] || usage; cmd_status ;;
  -h | --help | help) usage ;;
  *) usage ;;
esac
