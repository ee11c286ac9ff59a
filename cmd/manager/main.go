// Command manager runs the shardkv operator: the ShardMap and ReplicaGroup
// reconcilers in a controller-runtime manager (docs/operator.md).
package main

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
	"github.com/shardkv/shardkv/controllers"
)

const usage = `usage: manager [flags]

Runs the shardkv operator (docs/operator.md). In a cluster it is deployed by
"make deploy" (config/default); from a workstation "make run-manager" runs it
against the current kubeconfig with --dial-pod-ips.

Flags:
`

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	// flag.CommandLine also has controller-runtime's --kubeconfig.
	fs := flag.CommandLine
	fs.Init("manager", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	var (
		metricsAddr    = fs.String("metrics-bind-address", ":8443", `address of the Prometheus /metrics endpoint ("0" disables it); e.g. :8443 with --metrics-secure, :8080 without`)
		metricsSecure  = fs.Bool("metrics-secure", true, "serve /metrics over HTTPS to callers the API server authenticates and authorizes (get on the non-resource URL /metrics); false: plain HTTP, open to anyone who reaches the port")
		metricsCerts   = fs.String("metrics-cert-path", "", "directory with tls.crt and tls.key for the metrics endpoint, reloaded when they change (default: a self-signed certificate made at start)")
		enableHTTP2    = fs.Bool("enable-http2", false, "allow HTTP/2 on the metrics endpoint (off: CVE-2023-44487, CVE-2023-39325)")
		probeAddr      = fs.String("health-probe-bind-address", ":8081", `address of /healthz and /readyz ("0" disables them)`)
		leaderElect    = fs.Bool("leader-elect", false, "elect a leader (Lease shardkv-operator) so only one manager replica reconciles")
		leaderNS       = fs.String("leader-election-namespace", "", "namespace of the leader election Lease (default: the pod's namespace; required with --leader-elect outside a cluster)")
		defaultImage   = fs.String("default-image", envOr("SHARDKV_IMAGE", "shardkv:dev"), "node image for pods whose spec sets none (env SHARDKV_IMAGE)")
		maxRolls       = fs.Int("max-concurrent-rolls", 2, "at most this many data groups, across every cluster the operator manages, restart their pods for a template change at once (each cluster rolls one group at a time, after its controller group)")
		dialPodIPs     = fs.Bool("dial-pod-ips", false, "reach replicas at their pod IPs instead of cluster DNS names (an operator running outside the cluster, e.g. make run-manager)")
		tlsPropagation = fs.Duration("tls-propagation", controllers.DefaultTLSPropagation, "how long a CA rotation lets each Secret change reach every pod (kubelet refreshes mounted Secrets on its sync period, 1m by default) before relying on it")
		watchNS        = fs.String("watch-namespace", "", "watch and manage only this namespace (default: all namespaces); the manager then needs only a Role there (config/namespaced)")
		nsAlias        = fs.String("namespace", "", "the same as --watch-namespace (the older name)")
		logLevel       = fs.String("log-level", "info", "log level: debug, info, warn or error")
		logFormat      = fs.String("log-format", "text", "log format: text or json")
	)
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "manager: unexpected arguments %q\n", fs.Args())
		return 2
	}

	if *watchNS == "" {
		*watchNS = *nsAlias
	} else if *nsAlias != "" && *nsAlias != *watchNS {
		fmt.Fprintf(os.Stderr, "manager: --watch-namespace=%q and --namespace=%q differ\n", *watchNS, *nsAlias)
		return 2
	}

	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(os.Stderr, "manager: --log-level=%q: %v\n", *logLevel, err)
		return 2
	}
	hopts := &slog.HandlerOptions{Level: level}
	var handler slog.Handler
	switch strings.ToLower(*logFormat) {
	case "text":
		handler = slog.NewTextHandler(os.Stderr, hopts)
	case "json":
		handler = slog.NewJSONHandler(os.Stderr, hopts)
	default:
		fmt.Fprintf(os.Stderr, "manager: --log-format=%q: want text or json\n", *logFormat)
		return 2
	}
	ctrl.SetLogger(logr.FromSlogHandler(handler))
	setupLog := ctrl.Log.WithName("setup")

	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(shardkvv1.AddToScheme(scheme))

	cacheOpts := cache.Options{
		// Only the operator's own pods and Secrets are cached.
		ByObject: controllers.CacheByObject(),
	}
	if *watchNS != "" {
		// Every informer (ShardMaps, ReplicaGroups, StatefulSets, Services,
		// PodDisruptionBudgets, pods, claims) lists and watches only this
		// namespace, so a Role there is all the operator needs.
		cacheOpts.DefaultNamespaces = map[string]cache.Config{*watchNS: {}}
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		setupLog.Error(err, "no Kubernetes config (in-cluster or kubeconfig)")
		return 1
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  scheme,
		Cache:                   cacheOpts,
		Metrics:                 controllers.MetricsServerOptions(*metricsAddr, *metricsSecure, *metricsCerts, *enableHTTP2),
		HealthProbeBindAddress:  *probeAddr,
		LeaderElection:          *leaderElect,
		LeaderElectionID:        controllers.LeaderElectionID,
		LeaderElectionNamespace: *leaderNS,
		// Step down quickly on SIGTERM so a new replica takes over.
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		setupLog.Error(err, "unable to create the manager")
		return 1
	}

	dp := controllers.NewGRPCDataPlane()
	defer dp.Close()
	creds := &controllers.TLSCredentials{Reader: mgr.GetClient()}

	if err := (&controllers.ShardMapReconciler{
		Client:         mgr.GetClient(),
		Scheme:         mgr.GetScheme(),
		Recorder:       mgr.GetEventRecorder("shardmap-controller"),
		DataPlane:      dp,
		Credentials:    creds,
		TLSPropagation: *tlsPropagation,
		DefaultImage:   *defaultImage,
		DialPodIPs:     *dialPodIPs,
	}).SetupWithManager(mgr); err != nil {
		setupLog.Error(err, "unable to set up the ShardMap reconciler")
		return 1
	}
	if err := (&controllers.ReplicaGroupReconciler{
		Client:             mgr.GetClient(),
		APIReader:          mgr.GetAPIReader(),
		Scheme:             mgr.GetScheme(),
		Recorder:           mgr.GetEventRecorder("replicagroup-controller"),
		DataPlane:          dp,
		Credentials:        creds,
		DefaultImage:       *defaultImage,
		DialPodIPs:         *dialPodIPs,
		MaxConcurrentRolls: *maxRolls,
	}).SetupWithManager(mgr); err != nil {
		setupLog.Error(err, "unable to set up the ReplicaGroup reconciler")
		return 1
	}

	// Status as Prometheus gauges on the metrics endpoint, next to
	// controller-runtime's reconcile and work-queue metrics.
	crmetrics.Registry.MustRegister(controllers.StatusCollector{Reader: mgr.GetClient(), Namespace: *watchNS})

	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		setupLog.Error(err, "unable to set up the health check")
		return 1
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		setupLog.Error(err, "unable to set up the ready check")
		return 1
	}

	setupLog.Info("starting the manager", "defaultImage", *defaultImage, "dialPodIPs", *dialPodIPs,
		"leaderElect", *leaderElect, "watchNamespace", *watchNS, "metrics", *metricsAddr, "metricsSecure", *metricsSecure)
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		setupLog.Error(err, "manager stopped")
		return 1
	}
	return 0
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
