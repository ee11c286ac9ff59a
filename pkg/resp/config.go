package resp

import (
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/tidwall/redcon"
)

// tunable is a parameter CONFIG SET changes on this node, as in Redis
// Cluster (each node has its own configuration). Only the encoding
// thresholds are tunable: they decide what OBJECT ENCODING answers, never
// how data is stored (docs/types.md), so a change is always safe. Names
// take Redis 7.0's aliases (the 6.x "ziplist" names).
type tunable struct {
	name, alias string
	def, min    int64
	v           atomic.Int64
}

// maxEncodingRead bounds what OBJECT ENCODING and a first SCAN page read
// to judge a collection by the tunables (a threshold set higher reads no
// more than this).
const maxEncodingRead = 4096

// tunables are the node's CONFIG SET parameters, in CONFIG GET's order.
type tunables struct{ list []*tunable }

func newTunables() *tunables {
	t := &tunables{}
	for _, p := range []struct {
		name, alias string
		def, min    int64
	}{
		{"hash-max-listpack-entries", "hash-max-ziplist-entries", 128, 0},
		{"hash-max-listpack-value", "hash-max-ziplist-value", 64, 0},
		{"list-compress-depth", "", 0, 0},
		{"list-max-listpack-size", "list-max-ziplist-size", -2, -5},
		{"set-max-intset-entries", "", 512, 0},
		{"zset-max-listpack-entries", "zset-max-ziplist-entries", 128, 0},
		{"zset-max-listpack-value", "zset-max-ziplist-value", 64, 0},
	} {
		x := &tunable{name: p.name, alias: p.alias, def: p.def, min: p.min}
		x.v.Store(p.def)
		t.list = append(t.list, x)
	}
	return t
}

// get is a tunable's current value by name or alias (0 if unknown).
func (t *tunables) get(name string) int64 {
	if x := t.find(name); x != nil {
		return x.v.Load()
	}
	return 0
}

func (t *tunables) find(name string) *tunable {
	name = strings.ToLower(name)
	for _, x := range t.list {
		if x.name == name || (x.alias != "" && x.alias == name) {
			return x
		}
	}
	return nil
}

// params are the tunables as CONFIG GET reports them (aliases too, as
// Redis 7.0 does).
func (t *tunables) params() [][2]string {
	var out [][2]string
	for _, x := range t.list {
		v := strconv.FormatInt(x.v.Load(), 10)
		out = append(out, [2]string{x.name, v})
		if x.alias != "" {
			out = append(out, [2]string{x.alias, v})
		}
	}
	return out
}

// cmdConfigSet: CONFIG SET parameter value [parameter value ...], all or
// nothing as in Redis 7.0. The tunables change; a parameter CONFIG GET
// reports but this node fixes at start is refused naming it; any other is
// unknown.
func cmdConfigSet(c *conn, p *pipeline, args [][]byte, _ int) {
	if len(args)%2 != 0 {
		p.reply(errReply("ERR wrong number of arguments for 'config|set' command"))
		return
	}
	type change struct {
		x *tunable
		v int64
	}
	var changes []change
	seen := map[*tunable]bool{}
next:
	for i := 2; i < len(args); i += 2 {
		name, val := string(args[i]), string(args[i+1])
		x := c.s.tun.find(name)
		if x == nil {
			for _, kv := range c.s.configParams() {
				if strings.EqualFold(kv[0], name) && kv[1] == val {
					continue next // already so (the Tcl suite sets save "")
				}
				if strings.EqualFold(kv[0], name) {
					p.reply(errReply(fmt.Sprintf("ERR CONFIG SET failed (possibly related to argument '%s') - shardkv sets this at start (node flags), not at run time", name)))
					return
				}
			}
			p.reply(errReply(fmt.Sprintf("ERR Unknown option or number of arguments for CONFIG SET - '%s'", name)))
			return
		}
		if seen[x] {
			p.reply(errReply(fmt.Sprintf("ERR CONFIG SET failed (possibly related to argument '%s') - duplicate parameter", name)))
			return
		}
		seen[x] = true
		n, err := strconv.ParseInt(val, 10, 64)
		if err != nil || n < x.min {
			p.reply(errReply(fmt.Sprintf("ERR CONFIG SET failed (possibly related to argument '%s') - argument couldn't be parsed into an integer", name)))
			return
		}
		changes = append(changes, change{x, n})
	}
	for _, ch := range changes {
		ch.x.v.Store(ch.v)
	}
	p.reply(redcon.AppendOK(nil))
}
