package resp

import (
	"fmt"
	"net"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/shardkv/shardkv/pkg/shardkv"
)

// infoSection is one INFO section: a title and key:value lines.
type infoSection struct {
	name  string
	lines []string
}

// cmdInfo: INFO [section ...]. Sections: server, clients, memory, stats,
// replication, cpu, commandstats, cluster, keyspace and raft. No argument
// or "default" gives all but commandstats (as Redis); "all" and
// "everything" give all.
func cmdInfo(c *conn, p *pipeline, args [][]byte, _ int) {
	p.barrier()
	want := map[string]bool{}
	all, def := false, len(args) == 1
	for _, a := range args[1:] {
		switch s := strings.ToLower(string(a)); s {
		case "all", "everything":
			all = true
		case "default":
			def = true
		default:
			want[s] = true
		}
	}
	var b strings.Builder
	include := func(name string) bool { return all || want[name] || (def && name != "commandstats") }
	for _, sec := range c.s.infoSections(include, c.tls) {
		if b.Len() > 0 {
			b.WriteString("\r\n")
		}
		b.WriteString("# " + sec.name + "\r\n")
		for _, l := range sec.lines {
			b.WriteString(l + "\r\n")
		}
	}
	p.reply(c.appendVerbatim(nil, b.String()))
}

// infoSections builds the sections include asks for.
func (s *Server) infoSections(include func(string) bool, tls bool) []infoSection {
	var out []infoSection
	add := func(name string, lines func() []string) {
		if include(strings.ToLower(name)) {
			out = append(out, infoSection{name, lines()})
		}
	}
	view := s.view(tls)
	add("Server", func() []string {
		up := time.Since(s.started)
		_, port, _ := net.SplitHostPort(view.Self.Addr)
		return []string{
			"redis_version:" + redisVersion,
			"shardkv_version:" + s.cfg.Version,
			"redis_mode:cluster",
			"os:" + runtime.GOOS + " " + runtime.GOARCH,
			"arch_bits:" + strconv.Itoa(strconv.IntSize),
			"process_id:" + strconv.Itoa(os.Getpid()),
			"run_id:" + view.Self.ID,
			"tcp_port:" + port,
			"uptime_in_seconds:" + strconv.Itoa(int(up.Seconds())),
			"uptime_in_days:" + strconv.Itoa(int(up.Hours()/24)),
		}
	})
	add("Clients", func() []string {
		return []string{
			fmt.Sprintf("connected_clients:%d", s.stats.connected.Load()),
			"cluster_connections:0",
			fmt.Sprintf("maxclients:%d", s.cfg.MaxClients),
			fmt.Sprintf("blocked_clients:%d", s.stats.blocked.Load()),
		}
	})
	add("Memory", memoryInfo)
	add("Stats", func() []string {
		st := s.Stats()
		return []string{
			fmt.Sprintf("total_connections_received:%d", st.TotalConnections),
			fmt.Sprintf("total_commands_processed:%d", st.TotalCommands),
			fmt.Sprintf("total_net_input_bytes:%d", st.NetInputBytes),
			fmt.Sprintf("total_net_output_bytes:%d", st.NetOutputBytes),
			fmt.Sprintf("rejected_connections:%d", st.RejectedConnections),
			fmt.Sprintf("acl_access_denied_auth:%d", st.AuthFailures),
			fmt.Sprintf("refused_commands:%d", st.Refused),
			fmt.Sprintf("outcome_unknown_writes:%d", st.OutcomeUnknown),
			fmt.Sprintf("protocol_errors:%d", st.ProtocolErrors),
		}
	})
	add("Replication", func() []string {
		// The replication offset is the replica's applied index.
		return append(replicationInfo(view), fmt.Sprintf("master_repl_offset:%d", s.b.RaftStatus().GetApplied()))
	})
	add("CPU", cpuInfo)
	add("Commandstats", func() []string { return commandStats(s.sortedCommands()) })
	add("Cluster", func() []string { return []string{"cluster_enabled:1"} })
	var kc shardkv.KeyCounts
	var kcErr error
	if include("keyspace") || include("raft") {
		kc, kcErr = s.b.KeyCounts()
		if kcErr != nil {
			s.log.Warn("INFO: counting keys", "err", kcErr)
		}
	}
	add("Keyspace", func() []string {
		if kcErr != nil || kc.Total == 0 {
			return nil // as Redis: only databases with keys
		}
		return []string{fmt.Sprintf("db0:keys=%d,expires=%d,avg_ttl=0", kc.Total, kc.Expires)}
	})
	add("Raft", func() []string {
		st := s.b.RaftStatus()
		lines := []string{
			fmt.Sprintf("raft_group_id:%d", st.GetGroupId()),
			fmt.Sprintf("raft_replica_id:%d", st.GetId()),
			"raft_role:" + st.GetRole(),
			fmt.Sprintf("raft_term:%d", st.GetTerm()),
			fmt.Sprintf("raft_leader:%d", st.GetLeader()),
			fmt.Sprintf("raft_commit_index:%d", st.GetCommit()),
			fmt.Sprintf("raft_applied_index:%d", st.GetApplied()),
			fmt.Sprintf("raft_snapshot_index:%d", st.GetSnapshotIndex()),
			fmt.Sprintf("raft_first_index:%d", st.GetFirstIndex()),
			fmt.Sprintf("raft_last_index:%d", st.GetLastIndex()),
			fmt.Sprintf("config_num:%d", view.AppliedNum),
		}
		if kcErr == nil {
			for _, state := range shardStates(kc) {
				lines = append(lines, fmt.Sprintf("keys_%s:%d", strings.ToLower(string(state)), kc.ByState[state]))
			}
			for _, state := range shardStates(kc) {
				lines = append(lines, fmt.Sprintf("shards_%s:%d", strings.ToLower(string(state)), kc.Shards[state]))
			}
		}
		return lines
	})
	return out
}

// shardStates lists the shard states to report: the known ones in their
// lifecycle order, then any other the backend reports.
func shardStates(kc shardkv.KeyCounts) []shardkv.ShardState {
	out := []shardkv.ShardState{shardkv.Serving, shardkv.Pulling, shardkv.Acking, shardkv.BePulling, shardkv.GCing}
	var extra []shardkv.ShardState
	for _, m := range []map[shardkv.ShardState]int{kc.ByState, kc.Shards} {
		for st := range m {
			if st != shardkv.NotOwned && !slices.Contains(out, st) && !slices.Contains(extra, st) {
				extra = append(extra, st)
			}
		}
	}
	slices.Sort(extra)
	return append(out, extra...)
}

// replicationInfo is INFO replication: the group leader is the master.
func replicationInfo(view clusterView) []string {
	g := view.group(view.Self.GID)
	if view.Self.Leader {
		lines := []string{"role:master"}
		var replicas []string
		if g != nil {
			for _, n := range g.Nodes {
				if n.Self || n.Leader {
					continue
				}
				host, port, _ := net.SplitHostPort(n.Addr)
				replicas = append(replicas, fmt.Sprintf("slave%d:ip=%s,port=%s,state=online,offset=0,lag=0", len(replicas), host, port))
			}
		}
		lines = append(lines, fmt.Sprintf("connected_slaves:%d", len(replicas)))
		return append(lines, replicas...)
	}
	lines := []string{"role:slave"}
	var leader *node
	if g != nil {
		for i := range g.Nodes {
			if g.Nodes[i].Leader {
				leader = &g.Nodes[i]
			}
		}
	}
	if leader == nil {
		return append(lines, "master_host:", "master_port:0", "master_link_status:down", "connected_slaves:0")
	}
	host, port, _ := net.SplitHostPort(leader.Addr)
	return append(lines, "master_host:"+host, "master_port:"+port, "master_link_status:up", "connected_slaves:0")
}

// memoryInfo is INFO memory: the Go heap as used_memory (what the process
// holds for data and buffers; badger's memtables and caches are in it),
// the resident set as used_memory_rss. There is no maxmemory: writes are
// bounded per command and per connection instead (docs/limits.md).
func memoryInfo() []string {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	rss := residentBytes()
	ratio := 0.0
	if ms.HeapAlloc > 0 {
		ratio = float64(rss) / float64(ms.HeapAlloc)
	}
	return []string{
		fmt.Sprintf("used_memory:%d", ms.HeapAlloc),
		"used_memory_human:" + humanBytes(ms.HeapAlloc),
		fmt.Sprintf("used_memory_rss:%d", rss),
		"used_memory_rss_human:" + humanBytes(rss),
		fmt.Sprintf("used_memory_go_sys:%d", ms.Sys),
		fmt.Sprintf("mem_fragmentation_ratio:%.2f", ratio),
		"mem_allocator:" + runtime.Version(),
		fmt.Sprintf("go_gc_cycles:%d", ms.NumGC),
		"maxmemory:0",
		"maxmemory_human:0B",
		"maxmemory_policy:noeviction",
	}
}

// residentBytes is the process's resident set (0 if /proc is not there).
func residentBytes() uint64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	pages, _ := strconv.ParseUint(f[1], 10, 64)
	return pages * uint64(os.Getpagesize())
}

// humanBytes is Redis's bytesToHuman: B, K, M, G with two decimals.
func humanBytes(n uint64) string {
	switch f := float64(n); {
	case n < 1024:
		return fmt.Sprintf("%dB", n)
	case n < 1<<20:
		return fmt.Sprintf("%.2fK", f/(1<<10))
	case n < 1<<30:
		return fmt.Sprintf("%.2fM", f/(1<<20))
	default:
		return fmt.Sprintf("%.2fG", f/(1<<30))
	}
}

// cpuInfo is INFO cpu: the process's and its children's CPU time, in
// seconds, from getrusage (as Redis).
func cpuInfo() []string {
	var self, children syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &self)
	_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &children)
	sec := func(t syscall.Timeval) string {
		return fmt.Sprintf("%.6f", time.Duration(t.Nano()).Seconds())
	}
	return []string{
		"used_cpu_sys:" + sec(self.Stime),
		"used_cpu_user:" + sec(self.Utime),
		"used_cpu_sys_children:" + sec(children.Stime),
		"used_cpu_user_children:" + sec(children.Utime),
	}
}

// commandStats is INFO commandstats: a line per command or subcommand
// called (or refused) since the server started, in Redis's format. usec
// counts from dispatch to reply, which for a write includes its
// replication to a quorum.
func commandStats(cmds []*command) []string {
	var lines []string
	var walk func(cmd *command)
	walk = func(cmd *command) {
		st := &cmd.stats
		calls, usec, failed, rejected := st.calls.Load(), st.usec.Load(), st.failed.Load(), st.rejected.Load()
		if calls+failed+rejected > 0 {
			per := 0.0
			if calls > 0 {
				per = float64(usec) / float64(calls)
			}
			lines = append(lines, fmt.Sprintf("cmdstat_%s:calls=%d,usec=%d,usec_per_call=%.2f,rejected_calls=%d,failed_calls=%d",
				cmd.name, calls, usec, per, rejected, failed))
		}
		for _, sub := range cmd.subs {
			walk(sub)
		}
	}
	for _, cmd := range cmds {
		walk(cmd)
	}
	return lines
}
