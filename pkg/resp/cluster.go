package resp

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/shardkv/shardkv/pkg/routing"
	"github.com/tidwall/redcon"
)

// CLUSTER subcommands. Each data group is a Redis Cluster shard: its first
// node in the view (the leader when known, else the lowest replica id, so
// that every slot has a master) is the master, the others its replicas.
// Everything comes from this replica's applied config and the leaders it
// knows; clients follow MOVED when that is stale.

// endpoint splits a RESP address into host and port; hostname is the host
// if it is not an IP address ("" otherwise).
func endpoint(addr string) (host string, port int, hostname string) {
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return addr, 0, ""
	}
	port, _ = strconv.Atoi(p)
	if _, err := netip.ParseAddr(h); err != nil {
		hostname = h
	}
	return h, port, hostname
}

// master is the node a group's slots are served by in Redis terms.
func master(g *nodeGroup) *node { return &g.Nodes[0] }

func cmdClusterMyID(c *conn, p *pipeline, _ [][]byte, _ int) {
	p.reply(redcon.AppendBulkString(nil, c.s.view(c.tls).Self.ID))
}

func cmdClusterKeySlot(_ *conn, p *pipeline, args [][]byte, _ int) {
	p.reply(redcon.AppendInt(nil, int64(routing.Slot(args[2]))))
}

func cmdClusterCountKeysInSlot(c *conn, p *pipeline, args [][]byte, _ int) {
	slot, ok := parseInt(args[2])
	if !ok {
		p.reply(errReply(errNotInteger))
		return
	}
	if slot < 0 || slot >= routing.Slots {
		p.reply(errReply("ERR Invalid slot"))
		return
	}
	p.barrier()
	n, err := c.s.b.CountKeysInSlot(int(slot))
	if err != nil {
		p.reply(errReply("ERR " + err.Error()))
		return
	}
	p.reply(redcon.AppendInt(nil, int64(n)))
}

func cmdClusterGetKeysInSlot(c *conn, p *pipeline, args [][]byte, _ int) {
	slot, ok1 := parseInt(args[2])
	count, ok2 := parseInt(args[3])
	switch {
	case !ok1 || !ok2:
		p.reply(errReply(errNotInteger))
		return
	case slot < 0 || slot >= routing.Slots || count < 0:
		p.reply(errReply("ERR Invalid slot or number of keys"))
		return
	}
	p.barrier()
	keys, err := c.s.b.KeysInSlot(int(slot), int(min(count, 1<<20)))
	if err != nil {
		p.reply(errReply("ERR " + err.Error()))
		return
	}
	b := redcon.AppendArray(nil, len(keys))
	for _, k := range keys {
		b = redcon.AppendBulk(b, k)
	}
	p.reply(b)
}

// slotsOf lists gid's slot ranges.
func slotsOf(view *clusterView, gid uint64) []slotOwner {
	var out []slotOwner
	for _, so := range view.Slots {
		if so.GID == gid {
			out = append(out, so)
		}
	}
	return out
}

func cmdClusterInfo(c *conn, p *pipeline, _ [][]byte, _ int) {
	view := c.s.view(c.tls)
	assigned, size, nodes := 0, 0, 0
	for i := range view.Groups {
		g := &view.Groups[i]
		nodes += len(g.Nodes)
		if so := slotsOf(&view, g.GID); len(so) > 0 {
			size++
			for _, r := range so {
				assigned += r.End - r.Start + 1
			}
		}
	}
	state := "ok"
	if assigned < routing.Slots {
		state = "fail"
	}
	lines := []string{
		"cluster_state:" + state,
		fmt.Sprintf("cluster_slots_assigned:%d", assigned),
		fmt.Sprintf("cluster_slots_ok:%d", assigned),
		"cluster_slots_pfail:0",
		"cluster_slots_fail:0",
		fmt.Sprintf("cluster_known_nodes:%d", nodes),
		fmt.Sprintf("cluster_size:%d", size),
		fmt.Sprintf("cluster_current_epoch:%d", view.ConfigNum),
		fmt.Sprintf("cluster_my_epoch:%d", view.ConfigNum),
		"cluster_stats_messages_sent:0",
		"cluster_stats_messages_received:0",
		"total_cluster_links_buffer_limit_exceeded:0",
	}
	p.reply(c.appendVerbatim(nil, strings.Join(lines, "\r\n")+"\r\n"))
}

// cmdClusterNodes: one line per node, in Redis's format, which
// redis-benchmark --cluster and redis-cli --cluster parse:
//
//	<id> <ip:port@cport[,hostname]> <flags> <master> <ping-sent> <pong-recv> <config-epoch> <link-state> <slot>...
//
// The cluster bus port (cport) is port+10000 as in Redis; nothing listens
// there. The config epoch is the config number.
func cmdClusterNodes(c *conn, p *pipeline, _ [][]byte, _ int) {
	view := c.s.view(c.tls)
	now := time.Now().UnixMilli()
	var b strings.Builder
	for i := range view.Groups {
		g := &view.Groups[i]
		m := master(g)
		for j, n := range g.Nodes {
			host, port, hostname := endpoint(n.Addr)
			addr := fmt.Sprintf("%s:%d@%d", host, port, port+10000)
			if hostname != "" {
				addr += "," + hostname
			}
			flags, of := "master", "-"
			if j > 0 {
				flags, of = "slave", m.ID
			}
			if n.Self {
				flags = "myself," + flags
			}
			fmt.Fprintf(&b, "%s %s %s %s 0 %d %d connected", n.ID, addr, flags, of, now, view.ConfigNum)
			if j == 0 {
				for _, r := range slotsOf(&view, g.GID) {
					if r.Start == r.End {
						fmt.Fprintf(&b, " %d", r.Start)
					} else {
						fmt.Fprintf(&b, " %d-%d", r.Start, r.End)
					}
				}
			}
			b.WriteByte('\n')
		}
	}
	p.reply(c.appendVerbatim(nil, b.String()))
}

// appendSlotsNode appends a node of CLUSTER SLOTS: endpoint, port, id, and
// the metadata map (the hostname, when the endpoint is one).
func (c *conn) appendSlotsNode(b []byte, n *node) []byte {
	host, port, hostname := endpoint(n.Addr)
	b = redcon.AppendArray(b, 4)
	b = redcon.AppendBulkString(b, host)
	b = redcon.AppendInt(b, int64(port))
	b = redcon.AppendBulkString(b, n.ID)
	if hostname == "" {
		return c.appendMap(b, 0)
	}
	b = c.appendMap(b, 1)
	b = redcon.AppendBulkString(b, "hostname")
	return redcon.AppendBulkString(b, hostname)
}

// cmdClusterSlots: [start, end, master, replicas...] per slot range.
func cmdClusterSlots(c *conn, p *pipeline, _ [][]byte, _ int) {
	view := c.s.view(c.tls)
	var b []byte
	n := 0
	for _, so := range view.Slots {
		g := view.group(so.GID)
		if g == nil {
			continue // a group without RESP addresses: its slots are not served
		}
		n++
		b = redcon.AppendArray(b, 2+len(g.Nodes))
		b = redcon.AppendInt(b, int64(so.Start))
		b = redcon.AppendInt(b, int64(so.End))
		for i := range g.Nodes {
			b = c.appendSlotsNode(b, &g.Nodes[i])
		}
	}
	p.reply(append(redcon.AppendArray(nil, n), b...))
}

// cmdClusterShards: per group, "slots" (flat start/end pairs) and "nodes"
// (flat key/value arrays in RESP2), as Redis 7.
func cmdClusterShards(c *conn, p *pipeline, _ [][]byte, _ int) {
	view := c.s.view(c.tls)
	applied := int64(c.s.b.RaftStatus().GetApplied())
	b := redcon.AppendArray(nil, len(view.Groups))
	for i := range view.Groups {
		g := &view.Groups[i]
		so := slotsOf(&view, g.GID)
		b = c.appendMap(b, 2)
		b = redcon.AppendBulkString(b, "slots")
		b = redcon.AppendArray(b, 2*len(so))
		for _, r := range so {
			b = redcon.AppendInt(b, int64(r.Start))
			b = redcon.AppendInt(b, int64(r.End))
		}
		b = redcon.AppendBulkString(b, "nodes")
		b = redcon.AppendArray(b, len(g.Nodes))
		for j, n := range g.Nodes {
			host, port, hostname := endpoint(n.Addr)
			fields := 14
			if hostname != "" {
				fields += 2
			}
			role := "master"
			if j > 0 {
				role = "replica"
			}
			var offset int64
			if n.Self {
				offset = applied // others' offsets are not known here
			}
			b = c.appendMap(b, fields/2)
			b = redcon.AppendBulkString(b, "id")
			b = redcon.AppendBulkString(b, n.ID)
			b = redcon.AppendBulkString(b, "port")
			b = redcon.AppendInt(b, int64(port))
			b = redcon.AppendBulkString(b, "ip")
			b = redcon.AppendBulkString(b, host)
			b = redcon.AppendBulkString(b, "endpoint")
			b = redcon.AppendBulkString(b, host)
			if hostname != "" {
				b = redcon.AppendBulkString(b, "hostname")
				b = redcon.AppendBulkString(b, hostname)
			}
			b = redcon.AppendBulkString(b, "role")
			b = redcon.AppendBulkString(b, role)
			b = redcon.AppendBulkString(b, "replication-offset")
			b = redcon.AppendInt(b, offset)
			b = redcon.AppendBulkString(b, "health")
			b = redcon.AppendBulkString(b, "online")
		}
	}
	p.reply(b)
}
