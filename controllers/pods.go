package controllers

import (
	"context"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
)

// Pieces shared by the pods of both kinds (controller and data groups):
// they run the same binary from the same image.

// NodeUID is the user the image runs as (distroless "nonroot"); the pods'
// fsGroup makes their volumes writable to it. The image is built from
// static binaries without /etc/passwd, so the pods name it by number
// (runAsNonRoot needs a numeric user to check).
const NodeUID = 65532

// defaultCallTimeout bounds one data-plane call of a reconcile pass.
const defaultCallTimeout = 5 * time.Second

// The pods of both kinds pass Pod Security "restricted" (docs/security.md):
// the pod's context below and nodeContainerSecurityContext on the
// container; TestPodSecurityRestricted checks the templates with the
// admission controller's own checks.

// nodePodSecurityContext runs node as NodeUID, owning /data.
func nodePodSecurityContext() *corev1.PodSecurityContext {
	return &corev1.PodSecurityContext{
		RunAsNonRoot:   ptr.To(true),
		RunAsUser:      ptr.To[int64](NodeUID),
		RunAsGroup:     ptr.To[int64](NodeUID),
		FSGroup:        ptr.To[int64](NodeUID),
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

// nodeContainerSecurityContext is the node container's: no privilege
// escalation, no capabilities, and a read-only root filesystem (node
// writes only under --data-dir, the /data volume).
func nodeContainerSecurityContext() *corev1.SecurityContext {
	return &corev1.SecurityContext{
		AllowPrivilegeEscalation: ptr.To(false),
		ReadOnlyRootFilesystem:   ptr.To(true),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
	}
}

// podNameEnv is POD_NAME from the downward API; kubelet expands $(POD_NAME)
// in the args (--advertise, --resp-advertise).
func podNameEnv() corev1.EnvVar {
	return corev1.EnvVar{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{
		FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"}}}
}

// httpProbe probes /healthz, which answers while the process runs and needs
// no leader: a group without quorum keeps its pods in the Service's DNS.
func httpProbe(path string, initialDelay, period, timeout, failures int32) *corev1.Probe {
	return &corev1.Probe{
		ProbeHandler:        corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromString("http")}},
		InitialDelaySeconds: initialDelay,
		PeriodSeconds:       period,
		TimeoutSeconds:      timeout,
		FailureThreshold:    failures,
	}
}

// tlsVolume is the pod volume of its certificate Secret.
const tlsVolume = "tls"

// HTTPTokenMountPath is where the pods mount spec.http.tokenSecret's key,
// as the file "token".
const HTTPTokenMountPath = "/etc/shardkv/http"

// addSecurity adds what the ShardMap's spec.tls and spec.http ask of a node
// pod whose certificate is in Secret tlsSecret. With neither, the pod is
// left exactly as it was (a template hash that does not change).
func addSecurity(spec *corev1.PodSpec, sm *shardkvv1.ShardMap, tlsSecret string) {
	if sm.Spec.TLSEnabled() {
		addTLS(spec, tlsSecret)
	}
	c := &spec.Containers[0]
	if sel := sm.Spec.HTTP.TokenSecret; sel != nil {
		c.Args = append(c.Args, "--http-token-file="+HTTPTokenMountPath+"/token")
		spec.Volumes = append(spec.Volumes, corev1.Volume{Name: "http-token", VolumeSource: corev1.VolumeSource{
			Secret: &corev1.SecretVolumeSource{SecretName: sel.Name, DefaultMode: ptr.To[int32](0o440),
				Items: []corev1.KeyToPath{{Key: sel.Key, Path: "token"}}}}})
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "http-token", MountPath: HTTPTokenMountPath, ReadOnly: true})
	}
	if sm.Spec.TLSEnabled() || sm.Spec.HTTP.TokenSecret != nil {
		// The probes' paths, and what the spec opens; node serves every
		// other path only to the token or an admin certificate.
		var open []string
		for _, p := range append([]string{"/healthz", "/readyz"}, sm.Spec.HTTP.OpenPaths...) {
			if !slices.Contains(open, p) {
				open = append(open, p)
			}
		}
		c.Args = append(c.Args, "--http-open="+strings.Join(open, ","))
	}
}

// addTLS makes a node pod speak TLS: its certificate Secret mounted at
// TLSMountPath (readable by the node user through fsGroup, by no one
// else), node's --tls-* flags naming the files, and HTTPS probes.
func addTLS(spec *corev1.PodSpec, secret string) {
	c := &spec.Containers[0]
	c.Args = append(c.Args,
		"--tls-cert="+TLSMountPath+"/"+corev1.TLSCertKey,
		"--tls-key="+TLSMountPath+"/"+corev1.TLSPrivateKeyKey,
		"--tls-ca="+TLSMountPath+"/"+corev1.ServiceAccountRootCAKey)
	spec.Volumes = append(spec.Volumes, corev1.Volume{Name: tlsVolume, VolumeSource: corev1.VolumeSource{
		Secret: &corev1.SecretVolumeSource{SecretName: secret, DefaultMode: ptr.To[int32](0o440)}}})
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: tlsVolume, MountPath: TLSMountPath, ReadOnly: true})
	for _, p := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe} {
		if p != nil && p.HTTPGet != nil {
			p.HTTPGet.Scheme = corev1.URISchemeHTTPS
		}
	}
}

// orDefault is d, or def when d is not set (<= 0).
func orDefault(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// callCtx bounds one data-plane call: timeout, or defaultCallTimeout when
// it is not set.
func callCtx(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, orDefault(timeout, defaultCallTimeout))
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podDialAddr is where the operator dials pod <set>-<ordinal> (p, nil if
// not known): its advertised DNS name, or with dialPodIPs (an operator
// outside the cluster network) its IP; "" when it has none yet.
func podDialAddr(dialPodIPs bool, set string, ordinal int, namespace string, p *corev1.Pod) string {
	if !dialPodIPs {
		return podGRPCAddr(set, ordinal, namespace)
	}
	if p == nil || p.Status.PodIP == "" {
		return ""
	}
	return net.JoinHostPort(p.Status.PodIP, strconv.Itoa(GRPCPort))
}

// ctrlerPodAddrs are the gRPC addresses, at the pods' IPs, of ShardMap
// sm's controller pods among pods, by ordinal; pods without an IP or being
// deleted are left out.
func ctrlerPodAddrs(sm string, pods []corev1.Pod) []string {
	type ip struct {
		ord  int
		addr string
	}
	var ips []ip
	for _, p := range pods {
		if ord := podOrdinal(CtrlerName(sm), p.Name); ord >= 0 && p.Status.PodIP != "" && p.DeletionTimestamp.IsZero() {
			ips = append(ips, ip{ord, podDialAddr(true, CtrlerName(sm), ord, "", &p)})
		}
	}
	slices.SortFunc(ips, func(a, b ip) int { return a.ord - b.ord })
	out := make([]string, len(ips))
	for i, x := range ips {
		out[i] = x.addr
	}
	return out
}
