package node_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/shardkv/shardkv/pkg/client"
	"github.com/shardkv/shardkv/pkg/grpcdial"
	"github.com/shardkv/shardkv/pkg/kvcheck"
	"github.com/shardkv/shardkv/pkg/mtls"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"github.com/shardkv/shardkv/pkg/workload"
)

// tlsCluster is a `node local --tls` cluster and certificates for test
// identities from its CA.
type tlsCluster struct {
	*localCluster
	ca *mtls.CA
}

func startTLSLocal(t *testing.T, procs int, args ...string) *tlsCluster {
	t.Helper()
	c := startLocal(t, procs, append([]string{"--tls"}, args...)...)
	caDir := filepath.Join(c.dataDir, "tls", "ca")
	cert, err1 := os.ReadFile(filepath.Join(caDir, "ca.crt"))
	key, err2 := os.ReadFile(filepath.Join(caDir, "ca.key"))
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	ca, err := mtls.ParseCA(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	return &tlsCluster{localCluster: c, ca: ca}
}

// files issues a certificate for id into a fresh dir.
func (c *tlsCluster) files(t *testing.T, id string, req mtls.Request) mtls.Files {
	t.Helper()
	var err error
	if req.Identity, err = mtls.ParseIdentity(id); err != nil {
		t.Fatal(err)
	}
	if req.Validity == 0 {
		req.Validity = time.Hour
	}
	crt, key, err := c.ca.Issue(req)
	if err != nil {
		t.Fatal(err)
	}
	f := mtls.FilesIn(t.TempDir())
	if err := mtls.WriteFiles(f, crt, key, c.ca.CertPEM()); err != nil {
		t.Fatal(err)
	}
	return f
}

// dial returns a connection to addr as identity id.
func (c *tlsCluster) dial(t *testing.T, id, addr string) *grpc.ClientConn {
	t.Helper()
	src, err := mtls.Load(c.files(t, id, mtls.Request{}), nil)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient(grpcdial.Target(addr), grpcdial.OptionsWith(src.ClientCredentials(mtls.AnyNode))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// call is one RPC with a request that would change membership, ownership
// or data, or read what the caller may not.
type call func(ctx context.Context, cc *grpc.ClientConn) error

func raftSend(ctx context.Context, cc *grpc.ClientConn) error {
	s, err := shardkvpb.NewRaftClient(cc).Send(ctx)
	if err != nil {
		return err
	}
	_, err = s.CloseAndRecv()
	return err
}

func raftSnapshot(ctx context.Context, cc *grpc.ClientConn) error {
	s, err := shardkvpb.NewRaftClient(cc).Snapshot(ctx)
	if err != nil {
		return err
	}
	_, err = s.CloseAndRecv()
	return err
}

func admin(f func(context.Context, shardkvpb.AdminClient) error) call {
	return func(ctx context.Context, cc *grpc.ClientConn) error { return f(ctx, shardkvpb.NewAdminClient(cc)) }
}

func ctrlAPI(f func(context.Context, shardkvpb.ControllerClient) error) call {
	return func(ctx context.Context, cc *grpc.ClientConn) error { return f(ctx, shardkvpb.NewControllerClient(cc)) }
}

func kvAPI(f func(context.Context, shardkvpb.KVClient) error) call {
	return func(ctx context.Context, cc *grpc.ClientConn) error { return f(ctx, shardkvpb.NewKVClient(cc)) }
}

func discard[T any](_ T, err error) error { return err }

// TestTLSRefusesUnauthorizedCalls: with TLS on, every path that changes
// membership, ownership or data, or exchanges Raft traffic, refuses the
// identities that may not use it, and nothing changes. Then the handshake
// refusals (plain text, another CA, an expired certificate) and the HTTP
// endpoints.
func TestTLSRefusesUnauthorizedCalls(t *testing.T) {
	needProcesses(t)
	c := startTLSLocal(t, 3, "--groups=2", "--replicas=1", "--ctrler-replicas=1", "--spare-groups=0", "--shards=16")
	ctrl, g1, g2 := c.eps["ctrler-1"].grpc, c.eps["group-1-1"].grpc, c.eps["group-2-1"].grpc

	adminCC := c.dial(t, "admin", ctrl)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	before, err := shardkvpb.NewControllerClient(adminCC).Query(ctx, &shardkvpb.QueryRequest{Num: -1})
	if err != nil {
		t.Fatal(err)
	}
	var shard1 uint32 // a shard group 1 owns
	for s, g := range before.Shards {
		if g == 1 {
			shard1 = uint32(s)
		}
	}
	membersBefore, err := shardkvpb.NewAdminClient(c.dial(t, "admin", g1)).Status(ctx, &shardkvpb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name    string
		target  string
		call    call
		refused []string
	}{
		{"Raft.Send to group 1", g1, raftSend, []string{"client", "admin", "group/2", "ctrler"}},
		{"Raft.Snapshot to group 1", g1, raftSnapshot, []string{"client", "admin", "group/2", "ctrler"}},
		{"Raft.Send to the controller", ctrl, raftSend, []string{"client", "admin", "group/1"}},
		{"Admin.RemoveMember", g1, admin(func(ctx context.Context, a shardkvpb.AdminClient) error {
			return discard(a.RemoveMember(ctx, &shardkvpb.RemoveMemberRequest{Id: membersBefore.Id}))
		}), []string{"client", "group/1", "group/2", "ctrler"}},
		{"Admin.AddLearner", ctrl, admin(func(ctx context.Context, a shardkvpb.AdminClient) error {
			return discard(a.AddLearner(ctx, &shardkvpb.AddLearnerRequest{Id: 99, Addr: "127.0.0.1:1"}))
		}), []string{"client", "group/1", "ctrler"}},
		{"Admin.Promote", ctrl, admin(func(ctx context.Context, a shardkvpb.AdminClient) error {
			return discard(a.Promote(ctx, &shardkvpb.PromoteRequest{Id: 99}))
		}), []string{"client", "group/1"}},
		{"Admin.TransferLeader", ctrl, admin(func(ctx context.Context, a shardkvpb.AdminClient) error {
			return discard(a.TransferLeader(ctx, &shardkvpb.TransferLeaderRequest{To: 1}))
		}), []string{"client", "group/1"}},
		{"Admin.Status", g1, admin(func(ctx context.Context, a shardkvpb.AdminClient) error {
			return discard(a.Status(ctx, &shardkvpb.StatusRequest{}))
		}), []string{"client"}},
		{"Controller.Join", ctrl, ctrlAPI(func(ctx context.Context, a shardkvpb.ControllerClient) error {
			return discard(a.Join(ctx, &shardkvpb.JoinRequest{Groups: []*shardkvpb.Group{{Gid: 9, Servers: []*shardkvpb.Server{{Id: 1, Addr: "127.0.0.1:1"}}}}}))
		}), []string{"client", "group/1", "ctrler"}},
		{"Controller.Leave", ctrl, ctrlAPI(func(ctx context.Context, a shardkvpb.ControllerClient) error {
			return discard(a.Leave(ctx, &shardkvpb.LeaveRequest{Gids: []uint64{2}}))
		}), []string{"client", "group/1", "group/2"}},
		{"Controller.Move", ctrl, ctrlAPI(func(ctx context.Context, a shardkvpb.ControllerClient) error {
			return discard(a.Move(ctx, &shardkvpb.MoveRequest{Shard: shard1, Gid: 2}))
		}), []string{"client", "group/1", "group/2"}},
		{"Controller.Unpin", ctrl, ctrlAPI(func(ctx context.Context, a shardkvpb.ControllerClient) error {
			return discard(a.Unpin(ctx, &shardkvpb.UnpinRequest{Shard: shard1}))
		}), []string{"client", "group/2"}},
		{"Controller.Report for another group", ctrl, ctrlAPI(func(ctx context.Context, a shardkvpb.ControllerClient) error {
			return discard(a.Report(ctx, &shardkvpb.GroupReport{Gid: 2, ConfigNum: before.Num}))
		}), []string{"client", "admin", "group/1"}},
		{"Controller.Status", ctrl, ctrlAPI(func(ctx context.Context, a shardkvpb.ControllerClient) error {
			return discard(a.Status(ctx, &shardkvpb.ClusterStatusRequest{}))
		}), []string{"client"}},
		{"KV.Write", g1, kvAPI(func(ctx context.Context, a shardkvpb.KVClient) error {
			return discard(a.Write(ctx, &shardkvpb.WriteRequest{Op: &shardkvpb.WriteOp{Key: []byte("evil"), Value: []byte("x")}}))
		}), []string{"group/1", "group/2", "ctrler"}},
		{"KV.MultiWrite", g1, kvAPI(func(ctx context.Context, a shardkvpb.KVClient) error {
			return discard(a.MultiWrite(ctx, &shardkvpb.MultiWriteRequest{}))
		}), []string{"group/2", "ctrler"}},
		{"KV.Get", g1, kvAPI(func(ctx context.Context, a shardkvpb.KVClient) error {
			return discard(a.Get(ctx, &shardkvpb.GetRequest{Key: []byte("k")}))
		}), []string{"group/2", "ctrler"}},
		{"KV.MultiGet", g1, kvAPI(func(ctx context.Context, a shardkvpb.KVClient) error {
			return discard(a.MultiGet(ctx, &shardkvpb.MultiGetRequest{}))
		}), []string{"group/2"}},
		{"KV.GetElems", g1, kvAPI(func(ctx context.Context, a shardkvpb.KVClient) error {
			return discard(a.GetElems(ctx, &shardkvpb.ReadElemsRequest{Key: []byte("k")}))
		}), []string{"group/2"}},
		{"KV.FetchShard for another group", g1, kvAPI(func(ctx context.Context, a shardkvpb.KVClient) error {
			s, err := a.FetchShard(ctx, &shardkvpb.FetchShardRequest{Shard: shard1, ConfigNum: before.Num, Gid: 2, Precopy: true})
			if err != nil {
				return err
			}
			_, err = s.Recv()
			return err
		}), []string{"client", "admin", "group/1", "ctrler"}},
		{"KV.ShardInstalled for another group", g1, kvAPI(func(ctx context.Context, a shardkvpb.KVClient) error {
			return discard(a.ShardInstalled(ctx, &shardkvpb.ShardInstalledRequest{Shard: shard1, ConfigNum: before.Num, Gid: 2}))
		}), []string{"client", "admin", "group/1"}},
		{"KV.GroupInfo", g1, kvAPI(func(ctx context.Context, a shardkvpb.KVClient) error {
			return discard(a.GroupInfo(ctx, &shardkvpb.GroupInfoRequest{}))
		}), []string{"client", "ctrler"}},
	}
	conns := map[string]*grpc.ClientConn{}
	conn := func(id, addr string) *grpc.ClientConn {
		if cc := conns[id+" "+addr]; cc != nil {
			return cc
		}
		cc := c.dial(t, id, addr)
		conns[id+" "+addr] = cc
		return cc
	}
	for _, tc := range cases {
		for _, id := range tc.refused {
			for range 3 { // refused every time, logged once
				err := tc.call(ctx, conn(id, tc.target))
				if !shardkvpb.Unauthorized(err) {
					t.Fatalf("%s as %s: err = %v; want a NOT_AUTHORIZED refusal", tc.name, id, err)
				}
			}
		}
	}

	// Nothing changed: the config, group 1's members, no "evil" key.
	after, err := shardkvpb.NewControllerClient(adminCC).Query(ctx, &shardkvpb.QueryRequest{Num: -1})
	if err != nil {
		t.Fatal(err)
	}
	if after.Num != before.Num {
		t.Fatalf("config %d became %d after refused calls", before.Num, after.Num)
	}
	membersAfter, err := shardkvpb.NewAdminClient(c.dial(t, "admin", g1)).Status(ctx, &shardkvpb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(membersAfter.Members) != len(membersBefore.Members) {
		t.Fatalf("group 1 members %v became %v", membersBefore.Members, membersAfter.Members)
	}
	adminFiles := c.files(t, "admin", mtls.Request{})
	adminSrc, err := mtls.Load(adminFiles, nil)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := client.New(c.ctrl, grpcdial.OptionsWith(adminSrc.ClientCredentials(mtls.AnyNode))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, found, err := cl.Get(ctx, "evil"); err != nil || found {
		t.Fatalf("Get(evil) = found %v, %v after a refused write", found, err)
	}
	// The identities allowed a path use it: a client reads and writes, a
	// replica of another group reads a member's status.
	clientSrc, _ := mtls.Load(c.files(t, "client/app", mtls.Request{}), nil)
	app, err := client.New(c.ctrl, grpcdial.OptionsWith(clientSrc.ClientCredentials(mtls.AnyNode))...)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	if err := app.Put(ctx, "k", "v"); err != nil {
		t.Fatalf("client put: %v", err)
	}
	if _, err := shardkvpb.NewAdminClient(conn("group/2", g1)).Status(ctx, &shardkvpb.StatusRequest{}); err != nil {
		t.Fatalf("group 2 reading group 1's member status: %v", err)
	}

	// Refused handshakes: plain text, another CA, an expired certificate.
	plain, _ := grpc.NewClient(grpcdial.Target(g2), grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer plain.Close()
	other, _ := mtls.NewCA("another CA", time.Hour)
	otherCert, otherKey, _ := other.Issue(mtls.Request{Identity: mtls.Identity{Role: mtls.RoleAdmin}, Validity: time.Hour})
	otherFiles := mtls.FilesIn(t.TempDir())
	mtls.WriteFiles(otherFiles, otherCert, otherKey, append(other.CertPEM(), c.ca.CertPEM()...))
	otherSrc, err := mtls.Load(otherFiles, nil)
	if err != nil {
		t.Fatal(err)
	}
	foreign, _ := grpc.NewClient(grpcdial.Target(g2), grpcdial.OptionsWith(otherSrc.ClientCredentials(mtls.AnyNode))...)
	defer foreign.Close()
	expired := c.files(t, "admin", mtls.Request{Now: time.Now().Add(-2 * time.Hour), Validity: time.Hour})
	expiredPair, err := tls.LoadX509KeyPair(expired.Cert, expired.Key)
	if err != nil {
		t.Fatal(err)
	}
	expiredCfg := adminSrc.ClientConfig(mtls.AnyNode)
	expiredCfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &expiredPair, nil }
	stale, _ := grpc.NewClient(grpcdial.Target(g2), grpc.WithTransportCredentials(credentialsNewTLS(expiredCfg)))
	defer stale.Close()
	for range 5 {
		for name, cc := range map[string]*grpc.ClientConn{"plain text": plain, "another CA": foreign, "an expired certificate": stale} {
			cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := shardkvpb.NewAdminClient(cc).Status(cctx, &shardkvpb.StatusRequest{})
			ccancel()
			if err == nil {
				t.Fatalf("%s was served", name)
			}
		}
	}
	// The server logs a refusal after its side of the handshake fails,
	// which under TLS 1.3 can be after the client has seen the alert.
	reasons := []string{"first record does not look like a TLS handshake", "unknown authority", "expired"}
	logs := waitForLog(t, filepath.Join(c.dataDir, "logs", "group-2-1.log"), reasons...)
	for _, reason := range reasons {
		if n := strings.Count(logs, reason); n != 1 {
			t.Errorf("handshake refusal %q logged %d times, want once", reason, n)
		}
	}
	// Each refused call was logged once, though made three times.
	ctrlerLog, _ := os.ReadFile(filepath.Join(c.dataDir, "logs", "ctrler-1.log"))
	if n := strings.Count(string(ctrlerLog), "method=/shardkv.v1.Controller/Leave err=\"only admins may, and this is client\""); n != 1 {
		t.Errorf("a refused Leave by client logged %d times, want once", n)
	}

	// HTTP: /readyz is open (--http-open), /metrics needs an admin
	// certificate.
	h := c.eps["group-1-1"].http
	get := func(path string, cert *tls.Certificate) int {
		cfg := &tls.Config{InsecureSkipVerify: true} //nolint:gosec // the status code is what is checked
		if cert != nil {
			cfg.Certificates = []tls.Certificate{*cert}
		}
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 10 * time.Second}
		resp, err := hc.Get("https://" + h + path)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	adminPair, _ := tls.LoadX509KeyPair(adminFiles.Cert, adminFiles.Key)
	clientFiles := c.files(t, "client", mtls.Request{})
	clientPair, _ := tls.LoadX509KeyPair(clientFiles.Cert, clientFiles.Key)
	for _, x := range []struct {
		path string
		cert *tls.Certificate
		want int
	}{{"/readyz", nil, 200}, {"/healthz", nil, 200}, {"/metrics", nil, 401}, {"/metrics", &clientPair, 401}, {"/metrics", &adminPair, 200}} {
		if got := get(x.path, x.cert); got != x.want {
			name := "no certificate"
			if x.cert != nil {
				name = fmt.Sprint(x.cert.Leaf.URIs)
			}
			t.Errorf("GET %s with %s: %d, want %d", x.path, name, got, x.want)
		}
	}
}

func credentialsNewTLS(cfg *tls.Config) credentials.TransportCredentials {
	return credentials.NewTLS(cfg)
}

// rewriteTLS rewrites every TLS dir of the cluster (each process's, the
// admin's) and extra: the CA bundle becomes bundle and, if issuer is set,
// each certificate is reissued by it for the same identity.
func (c *tlsCluster) rewriteTLS(t *testing.T, bundle []byte, issuer *mtls.CA, extra ...mtls.Files) {
	t.Helper()
	dirs, err := filepath.Glob(filepath.Join(c.dataDir, "tls", "*", "tls.crt"))
	if err != nil {
		t.Fatal(err)
	}
	var all []mtls.Files
	for _, d := range dirs {
		all = append(all, mtls.FilesIn(filepath.Dir(d)))
	}
	for _, f := range append(all, extra...) {
		crt, err1 := os.ReadFile(f.Cert)
		key, err2 := os.ReadFile(f.Key)
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		if issuer != nil {
			pair, err := tls.X509KeyPair(crt, key)
			if err != nil {
				t.Fatal(err)
			}
			leaf, err := x509.ParseCertificate(pair.Certificate[0])
			if err != nil {
				t.Fatal(err)
			}
			id, err := mtls.IdentityOf(leaf)
			if err != nil {
				t.Fatal(err)
			}
			if crt, key, err = issuer.Issue(mtls.Request{Identity: id, Hosts: []string{"127.0.0.1", "localhost"}, Validity: time.Hour}); err != nil {
				t.Fatal(err)
			}
		}
		if err := mtls.WriteFiles(f, crt, key, bundle); err != nil {
			t.Fatal(err)
		}
	}
}

// servedIssuer is the issuer of the certificate the replica at addr
// presents to a new connection now.
func servedIssuer(t *testing.T, addr string, as mtls.Files) string {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(as.Cert, as.Key)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr,
		&tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{pair}, NextProtos: []string{"h2"}}) //nolint:gosec // only the issuer is read
	if err != nil {
		t.Fatalf("TLS dial %s: %v", addr, err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].Issuer.CommonName
}

// TestTLSRotationUnderLoad rotates the cluster's CA and every certificate
// while a porcupine-checked workload runs, through the documented steps:
// trust both CAs, reissue every certificate from the new one, drop the
// old. No process restarts for it: each presents the new certificate to
// new connections and refuses the old CA once it is dropped. Then the
// leader of a group and a controller replica are killed and restarted, so
// that connections are made afresh under the new CA alone. Zero failed
// operations are allowed.
func TestTLSRotationUnderLoad(t *testing.T) {
	needProcesses(t)
	c := startTLSLocal(t, 9, "--groups=2", "--replicas=3", "--ctrler-replicas=3", "--spare-groups=0", "--shards=16", "--resp")
	var seeds []string
	for _, addrs := range c.respAddrs() {
		seeds = append(seeds, addrs...)
	}
	clientFiles := c.files(t, "client/app", mtls.Request{})
	clientSrc, err := mtls.Load(clientFiles, nil)
	if err != nil {
		t.Fatal(err)
	}
	oldAdmin := c.files(t, "admin/old", mtls.Request{})
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	logs := newLineBuf()
	type outcome struct {
		res *kvcheck.Result
		err error
	}
	// The Go client over mutual TLS, and a Redis Cluster client over TLS
	// with the same certificate, each on keys of its own.
	done := make(chan outcome, 1)
	go func() {
		res, err := workload.Run(ctx, workload.Config{Ctrler: c.ctrl, Dial: grpcdial.OptionsWith(clientSrc.ClientCredentials(mtls.AnyNode)),
			Clients: 4, Keys: 8, Prefix: "rotate", OpTimeout: 30 * time.Second, Rate: 25},
			workload.RunOptions{Check: true, CheckTimeout: 3 * time.Minute}, logs)
		done <- outcome{res, err}
	}()
	redisLogs := newLineBuf()
	rw, err := workload.New(workload.Config{Redis: seeds, RedisTLS: clientSrc.ClientConfig(mtls.AnyGroup),
		Clients: 4, Keys: 8, Prefix: "rotate-redis", OpTimeout: 20 * time.Second, Rate: 25}, redisLogs)
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Close()
	rw.Start()
	select {
	case <-rw.Running():
	case err := <-rw.Failed():
		t.Fatalf("Redis workload: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatalf("Redis workload did not start\n%s", redisLogs.String())
	}
	time.Sleep(3 * time.Second)

	const reloaded = 7 * time.Second // the processes re-read their files every 5s
	newCA, err := mtls.NewCA("rotated CA", 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	oldPEM := c.ca.CertPEM()
	t.Log("step 1: every process trusts both CAs")
	c.rewriteTLS(t, append(append([]byte{}, oldPEM...), newCA.CertPEM()...), nil, clientFiles)
	time.Sleep(reloaded)
	t.Log("step 2: every certificate reissued by the new CA")
	c.rewriteTLS(t, append(append([]byte{}, oldPEM...), newCA.CertPEM()...), newCA, clientFiles)
	time.Sleep(reloaded)
	newAdmin := mtls.FilesIn(t.TempDir())
	crt, key, _ := newCA.Issue(mtls.Request{Identity: mtls.Identity{Role: mtls.RoleAdmin}, Validity: time.Hour})
	mtls.WriteFiles(newAdmin, crt, key, newCA.CertPEM())
	for name, ep := range c.eps {
		if got := servedIssuer(t, ep.grpc, newAdmin); got != "rotated CA" {
			t.Fatalf("%s still presents a certificate from %q", name, got)
		}
	}
	t.Log("step 3: the old CA dropped")
	c.rewriteTLS(t, newCA.CertPEM(), nil, clientFiles)
	time.Sleep(reloaded)
	oldSrc, _ := mtls.Load(oldAdmin, nil)
	newSrc, err := mtls.Load(newAdmin, nil)
	if err != nil {
		t.Fatal(err)
	}
	status := func(src *mtls.Source, addr string) error {
		cc, err := grpc.NewClient(grpcdial.Target(addr), grpcdial.OptionsWith(src.ClientCredentials(mtls.AnyNode))...)
		if err != nil {
			return err
		}
		defer cc.Close()
		sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		_, err = shardkvpb.NewAdminClient(cc).Status(sctx, &shardkvpb.StatusRequest{})
		return err
	}
	for name, ep := range c.eps {
		if err := status(oldSrc, ep.grpc); err == nil {
			t.Fatalf("%s still accepts a certificate from the dropped CA", name)
		}
	}

	// Redis commands carry no request id: one in flight when its replica
	// is killed below ends with an unknown outcome, by design. Until then
	// not one may fail.
	if st := rw.Status(); st.Unknown != 0 || st.FailedGets != 0 || st.OK < 200 {
		t.Errorf("Redis over TLS during the rotation: %d ok, %d unknown, %d failed gets (last error: %s)\n%s",
			st.OK, st.Unknown, st.FailedGets, st.LastError, tail(redisLogs.String(), 3000))
	}

	// Fresh connections everywhere a restarted process talks: its peers,
	// the controller, the clients.
	newDial := grpcdial.OptionsWith(newSrc.ClientCredentials(mtls.AnyNode))
	gAddr, _ := groupLeader(t, c.ctrl, 1, 20*time.Second, newDial...)
	cAddr := c.ctrl[0]
	for _, addr := range []string{gAddr, cAddr} {
		pid := pidListening(t, addr, 5*time.Second)
		t.Logf("kill -9 %s (pid %d)", c.nameOf(addr), pid)
		syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(60 * time.Second)
	for _, addr := range []string{gAddr, cAddr} {
		for {
			if err := status(newSrc, addr); err == nil {
				break
			} else if time.Now().After(deadline) {
				t.Fatalf("%s did not come back under the new CA: %v", c.nameOf(addr), err)
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	// The restarted group-1 replica caught up through new connections.
	if _, term := groupLeader(t, c.ctrl, 1, 30*time.Second, newDial...); term == 0 {
		t.Fatal("group 1 has no leader")
	}
	time.Sleep(5 * time.Second)
	stop()
	o := <-done
	if o.err != nil {
		t.Fatalf("workload: %v\n%s", o.err, tail(logs.String(), 3000))
	}
	r := o.res
	t.Logf("workload: %d ok, %d outcome unknown, %d failed reads; linearizable %v", r.OK, r.Unknown, r.FailedGets, r.Linearizable)
	if !r.Linearizable || r.Unknown != 0 || r.FailedGets != 0 || r.OK < 200 {
		t.Errorf("rotation under load: %s\n%s", r, tail(logs.String(), 3000))
	}
	res, err := kvcheck.Check(rw.Stop().Ops, 3*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Redis workload: %s", res)
	if !res.Linearizable {
		t.Errorf("Redis over TLS: the history is not linearizable: %s", res)
	}
}
