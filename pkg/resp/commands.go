package resp

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/shardkv/shardkv/pkg/routing"
	"github.com/tidwall/redcon"
)

// handler runs a command whose arity, authentication and key slots were
// checked. slot is the slot of its keys (-1 for a keyless command).
type handler func(c *conn, p *pipeline, args [][]byte, slot int)

// command describes a command as Redis 7's COMMAND reports it, and runs it.
type command struct {
	name              string // lower case; "container|sub" for a subcommand
	arity             int    // Redis convention: -N means at least N
	flags             []string
	first, last, step int // key positions (last < 0: from the end)
	acl               []string
	tips              []string
	keyFlags          []string                     // the key spec's flags (keyed commands)
	keyNotes          string                       // the key spec's notes, if any
	destFlags         []string                     // set for two-key commands: the second key's spec flags
	specs             []keySpec                    // the key specs, when the fields above do not describe them (keyspecs.go)
	keysOf            func(args [][]byte) [][]byte // movablekeys: the keys (none when the arguments are invalid)
	subs              []*command
	run               handler
	stats             cmdStats // INFO commandstats
}

// cmdStats counts a command's calls as Redis's INFO commandstats does:
// calls that ran (and their time from dispatch to reply), those whose reply
// was an error (failed), and those refused before running (rejected:
// arity, authentication, CROSSSLOT, a redirect).
type cmdStats struct {
	calls, usec, failed, rejected atomic.Int64
}

// record counts one call that ran and replied out after took.
func (st *cmdStats) record(out []byte, took time.Duration) {
	switch {
	case len(out) > 0 && out[0] == '-' && redirect(out):
		st.rejected.Add(1)
		return
	case len(out) > 0 && out[0] == '-':
		st.failed.Add(1)
	}
	st.calls.Add(1)
	st.usec.Add(took.Microseconds())
}

// redirect reports whether an error reply sends the client elsewhere (the
// command did not run here).
func redirect(out []byte) bool {
	for _, p := range []string{"-MOVED ", "-ASK ", "-TRYAGAIN", "-CLUSTERDOWN"} {
		if bytes.HasPrefix(out, []byte(p)) {
			return true
		}
	}
	return false
}

// commandTable is the supported command set. It is built per Server (not a
// package variable) because handlers such as COMMAND read it back.
func commandTable() map[string]*command {
	// Flag and category sets (Redis 7.0's values).
	var (
		fRO      = []string{"readonly", "fast"}
		fWrite   = []string{"write", "fast"}
		fWriteDO = []string{"write", "denyoom", "fast"}
		fConn    = []string{"loading", "stale", "fast"}
		fNoAuth  = []string{"noscript", "loading", "stale", "fast", "no_auth", "allow_busy"}
		fSub     = []string{"noscript", "loading", "stale"}
		aStrR    = []string{"@read", "@string", "@fast"}
		aStrW    = []string{"@write", "@string", "@fast"}
		aStrRS   = []string{"@read", "@string", "@slow"}
		aBitR    = []string{"@read", "@bitmap", "@fast"}
		aStrWS   = []string{"@write", "@string", "@slow"}
		aHashR   = []string{"@read", "@hash", "@fast"}
		aHashRS  = []string{"@read", "@hash", "@slow"}
		aHashW   = []string{"@write", "@hash", "@fast"}
		fWriteD  = []string{"write", "denyoom"}
		aKeyR    = []string{"@keyspace", "@read", "@fast"}
		aKeyW    = []string{"@keyspace", "@write", "@fast"}
		aConn    = []string{"@fast", "@connection"}
		aSlowC   = []string{"@slow", "@connection"}
		// ACL's subcommands that read or change users.
		aclAdminF = []string{"admin", "noscript", "loading", "stale"}
		aclAdmin  = []string{"@admin", "@slow", "@dangerous"}
		aSlow     = []string{"@slow"}
	)
	key1 := func(name string, arity int, flags, acl, keyFlags []string, run handler) *command {
		return &command{name: name, arity: arity, flags: flags, first: 1, last: 1, step: 1, acl: acl, keyFlags: keyFlags, run: run}
	}
	keys := func(name string, arity int, flags, acl, tips, keyFlags []string, step int, run handler) *command {
		return &command{name: name, arity: arity, flags: flags, first: 1, last: -1, step: step, acl: acl, tips: tips, keyFlags: keyFlags, run: run}
	}
	none := func(name string, arity int, flags, acl, tips []string, run handler) *command {
		return &command{name: name, arity: arity, flags: flags, acl: acl, tips: tips, run: run}
	}
	rw := []string{"RW", "access", "update"}
	multi := []string{"request_policy:multi_shard"}
	sum := []string{"request_policy:multi_shard", "response_policy:agg_sum"}
	list := []*command{
		// Strings.
		key1("get", 2, fRO, aStrR, []string{"RO", "access"}, cmdGet),
		{name: "set", arity: -3, flags: []string{"write", "denyoom"}, first: 1, last: 1, step: 1, acl: []string{"@write", "@string", "@slow"},
			keyFlags: []string{"RW", "access", "update", "variable_flags"}, keyNotes: "RW and ACCESS due to the optional `GET` argument", run: cmdSet},
		key1("setnx", 3, fWriteDO, aStrW, []string{"OW", "insert"}, cmdSetNX),
		key1("getset", 3, fWriteDO, aStrW, rw, cmdGetSet),
		key1("getdel", 2, fWrite, aStrW, []string{"RW", "access", "delete"}, cmdGetDel),
		key1("append", 3, fWriteDO, aStrW, []string{"RW", "insert"}, cmdAppend),
		key1("strlen", 2, fRO, aStrR, []string{"RO"}, cmdStrlen),
		key1("incr", 2, fWriteDO, aStrW, rw, cmdIncr),
		key1("decr", 2, fWriteDO, aStrW, rw, cmdIncr),
		key1("incrby", 3, fWriteDO, aStrW, rw, cmdIncr),
		key1("decrby", 3, fWriteDO, aStrW, rw, cmdIncr),
		key1("incrbyfloat", 3, fWriteDO, aStrW, rw, cmdIncrByFloat),
		keys("mget", -2, fRO, aStrR, multi, []string{"RO", "access"}, 1, cmdMGet),
		key1("getex", -2, fWrite, aStrW, []string{"RW", "access", "update"}, cmdGetEx),
		key1("getrange", 4, []string{"readonly"}, aStrRS, []string{"RO", "access"}, cmdGetRange),
		key1("substr", 4, []string{"readonly"}, aStrRS, []string{"RO", "access"}, cmdGetRange),
		key1("setrange", 4, fWriteD, aStrWS, []string{"RW", "update"}, cmdSetRange),
		key1("setex", 4, fWriteD, aStrWS, []string{"OW", "update"}, cmdSetEx),
		key1("psetex", 4, fWriteD, aStrWS, []string{"OW", "update"}, cmdSetEx),
		keys("mset", -3, []string{"write", "denyoom"}, []string{"@write", "@string", "@slow"}, []string{"request_policy:multi_shard", "response_policy:all_succeeded"}, []string{"OW", "update"}, 2, cmdMSet),
		key1("getbit", 3, fRO, aBitR, []string{"RO", "access"}, cmdGetBit),
		key1("setbit", 4, fWriteD, []string{"@write", "@bitmap", "@slow"}, []string{"RW", "access", "update"}, cmdSetBit),
		key1("bitcount", -2, []string{"readonly"}, []string{"@read", "@bitmap", "@slow"}, []string{"RO", "access"}, cmdBitCount),
		key1("bitpos", -3, []string{"readonly"}, []string{"@read", "@bitmap", "@slow"}, []string{"RO", "access"}, cmdBitPos),
		{name: "bitop", arity: -4, flags: []string{"write", "denyoom"}, first: 2, last: -1, step: 1, acl: []string{"@write", "@bitmap", "@slow"},
			specs: []keySpec{{flags: []string{"OW", "update"}, index: 2, step: 1}, {flags: []string{"RO", "access"}, index: 3, lastKey: -1, step: 1}}, run: cmdBitOp},
		{name: "lcs", arity: -3, flags: []string{"readonly"}, first: 1, last: 2, step: 1, acl: aStrRS,
			specs: []keySpec{{flags: []string{"RO", "access"}, index: 1, lastKey: 1, step: 1}}, run: cmdLCS},
		keys("msetnx", -3, fWriteD, aStrWS, []string{"request_policy:multi_shard", "response_policy:agg_min"}, []string{"OW", "insert"}, 2, cmdMSetNX),
		// Hashes.
		key1("hset", -4, fWriteDO, aHashW, []string{"RW", "update"}, cmdHSet),
		key1("hmset", -4, fWriteDO, aHashW, []string{"RW", "update"}, cmdHSet),
		key1("hsetnx", 4, fWriteDO, aHashW, []string{"RW", "insert"}, cmdHSetNX),
		key1("hget", 3, fRO, aHashR, []string{"RO", "access"}, cmdHGet),
		key1("hmget", -3, fRO, aHashR, []string{"RO", "access"}, cmdHMGet),
		{name: "hgetall", arity: 2, flags: []string{"readonly"}, first: 1, last: 1, step: 1, acl: aHashRS, tips: []string{"nondeterministic_output_order"}, keyFlags: []string{"RO", "access"}, run: cmdHGetAll},
		{name: "hkeys", arity: 2, flags: []string{"readonly"}, first: 1, last: 1, step: 1, acl: aHashRS, tips: []string{"nondeterministic_output_order"}, keyFlags: []string{"RO", "access"}, run: cmdHGetAll},
		{name: "hvals", arity: 2, flags: []string{"readonly"}, first: 1, last: 1, step: 1, acl: aHashRS, tips: []string{"nondeterministic_output_order"}, keyFlags: []string{"RO", "access"}, run: cmdHGetAll},
		key1("hdel", -3, fWrite, aHashW, []string{"RW", "delete"}, cmdHDel),
		key1("hexists", 3, fRO, aHashR, []string{"RO"}, cmdHExists),
		key1("hlen", 2, fRO, aHashR, []string{"RO"}, cmdHLen),
		key1("hstrlen", 3, fRO, aHashR, []string{"RO"}, cmdHStrlen),
		key1("hincrby", 4, fWriteDO, aHashW, []string{"RW", "access", "update"}, cmdHIncrBy),
		key1("hincrbyfloat", 4, fWriteDO, aHashW, []string{"RW", "access", "update"}, cmdHIncrByFloat),
		{name: "hrandfield", arity: -2, flags: []string{"readonly"}, first: 1, last: 1, step: 1, acl: aHashRS, tips: []string{"nondeterministic_output"}, keyFlags: []string{"RO", "access"}, run: cmdHRandField},
		{name: "hscan", arity: -3, flags: []string{"readonly"}, first: 1, last: 1, step: 1, acl: aHashRS, tips: []string{"nondeterministic_output"}, keyFlags: []string{"RO", "access"}, run: cmdHScan},
		// Keys.
		keys("del", -2, []string{"write"}, []string{"@keyspace", "@write", "@slow"}, sum, []string{"RM", "delete"}, 1, cmdDel),
		keys("unlink", -2, fWrite, aKeyW, sum, []string{"RM", "delete"}, 1, cmdDel),
		keys("exists", -2, fRO, aKeyR, sum, []string{"RO"}, 1, cmdExists),
		key1("type", 2, fRO, aKeyR, []string{"RO"}, cmdType),
		key1("expire", -3, fWrite, aKeyW, []string{"RW", "update"}, cmdExpire),
		key1("pexpire", -3, fWrite, aKeyW, []string{"RW", "update"}, cmdExpire),
		key1("expireat", -3, fWrite, aKeyW, []string{"RW", "update"}, cmdExpire),
		key1("pexpireat", -3, fWrite, aKeyW, []string{"RW", "update"}, cmdExpire),
		{name: "ttl", arity: 2, flags: fRO, first: 1, last: 1, step: 1, acl: aKeyR, tips: []string{"nondeterministic_output"}, keyFlags: []string{"RO", "access"}, run: cmdTTL},
		{name: "pttl", arity: 2, flags: fRO, first: 1, last: 1, step: 1, acl: aKeyR, tips: []string{"nondeterministic_output"}, keyFlags: []string{"RO", "access"}, run: cmdTTL},
		key1("persist", 2, fWrite, aKeyW, []string{"RW", "update"}, cmdPersist),
		keys("touch", -2, fRO, aKeyR, sum, []string{"RO"}, 1, cmdExists),
		key1("expiretime", 2, fRO, aKeyR, []string{"RO", "access"}, cmdTTL),
		key1("pexpiretime", 2, fRO, aKeyR, []string{"RO", "access"}, cmdTTL),
		{name: "rename", arity: 3, flags: []string{"write"}, first: 1, last: 2, step: 1, acl: []string{"@keyspace", "@write", "@slow"},
			keyFlags: []string{"RW", "access", "delete"}, destFlags: []string{"OW", "update"}, run: cmdRename},
		{name: "renamenx", arity: 3, flags: fWrite, first: 1, last: 2, step: 1, acl: aKeyW,
			keyFlags: []string{"RW", "access", "delete"}, destFlags: []string{"OW", "insert"}, run: cmdRename},
		{name: "copy", arity: -3, flags: fWriteD, first: 1, last: 2, step: 1, acl: []string{"@keyspace", "@write", "@slow"},
			keyFlags: []string{"RO", "access"}, destFlags: []string{"OW", "update"}, run: cmdCopy},
		{name: "dump", arity: 2, flags: []string{"readonly"}, first: 1, last: 1, step: 1, acl: []string{"@keyspace", "@read", "@slow"}, tips: []string{"nondeterministic_output"}, keyFlags: []string{"RO", "access"}, run: cmdDump},
		key1("restore", -4, fWriteD, []string{"@keyspace", "@write", "@slow", "@dangerous"}, []string{"OW", "update"}, cmdRestore),
		none("randomkey", 1, []string{"readonly", "touches_arbitrary_keys"}, []string{"@keyspace", "@read", "@slow"}, []string{"request_policy:all_shards", "nondeterministic_output"}, cmdRandomKey),
		{name: "memory", arity: -2, acl: aSlow, subs: []*command{
			{name: "memory|usage", arity: -3, flags: []string{"readonly"}, first: 2, last: 2, step: 1, acl: []string{"@read", "@slow"}, keyFlags: []string{"RO"}, run: cmdMemoryUsage},
			none("memory|help", 2, []string{"loading", "stale"}, aSlow, nil, cmdHelp),
		}},
		{name: "object", arity: -2, acl: aSlow, subs: []*command{
			{name: "object|encoding", arity: 3, flags: []string{"readonly"}, first: 2, last: 2, step: 1, acl: []string{"@keyspace", "@read", "@slow"}, tips: []string{"nondeterministic_output"}, keyFlags: []string{"RO"}, run: cmdObject},
			{name: "object|refcount", arity: 3, flags: []string{"readonly"}, first: 2, last: 2, step: 1, acl: []string{"@keyspace", "@read", "@slow"}, tips: []string{"nondeterministic_output"}, keyFlags: []string{"RO"}, run: cmdObject},
			{name: "object|freq", arity: 3, flags: []string{"readonly"}, first: 2, last: 2, step: 1, acl: []string{"@keyspace", "@read", "@slow"}, tips: []string{"nondeterministic_output"}, keyFlags: []string{"RO"}, run: cmdObject},
			{name: "object|idletime", arity: 3, flags: []string{"readonly"}, first: 2, last: 2, step: 1, acl: []string{"@keyspace", "@read", "@slow"}, tips: []string{"nondeterministic_output"}, keyFlags: []string{"RO"}, run: cmdObject},
			none("object|help", 2, []string{"loading", "stale"}, []string{"@keyspace", "@slow"}, nil, cmdHelp),
		}},
		none("keys", 2, []string{"readonly"}, []string{"@keyspace", "@read", "@slow", "@dangerous"}, []string{"request_policy:all_shards", "nondeterministic_output_order"}, cmdKeys),
		none("scan", -2, []string{"readonly"}, []string{"@keyspace", "@read", "@slow"}, []string{"nondeterministic_output", "request_policy:special"}, cmdScan),
		none("dbsize", 1, fRO, aKeyR, []string{"request_policy:all_shards", "response_policy:agg_sum"}, cmdDBSize),
		none("flushall", -1, []string{"write"}, []string{"@keyspace", "@write", "@slow", "@dangerous"}, []string{"request_policy:all_shards", "response_policy:all_succeeded"}, cmdFlush),
		none("flushdb", -1, []string{"write"}, []string{"@keyspace", "@write", "@slow", "@dangerous"}, []string{"request_policy:all_shards", "response_policy:all_succeeded"}, cmdFlush),
		{name: "function", arity: -2, acl: aSlow, subs: []*command{
			none("function|flush", -2, []string{"noscript", "write"}, []string{"@write", "@slow", "@scripting"}, []string{"request_policy:all_shards", "response_policy:all_succeeded"}, cmdFunctionFlush),
			none("function|help", 2, []string{"loading", "stale"}, []string{"@slow", "@scripting"}, nil, cmdHelp),
		}},
		none("time", 1, []string{"loading", "stale", "fast"}, []string{"@fast"}, []string{"nondeterministic_output"}, cmdTime),
		// Connection.
		none("ping", -1, []string{"fast"}, aConn, []string{"request_policy:all_shards", "response_policy:all_succeeded"}, cmdPing),
		none("echo", 2, fConn, aConn, nil, cmdEcho),
		none("hello", -1, fNoAuth, aConn, nil, cmdHello),
		none("auth", -2, fNoAuth, aConn, nil, cmdAuth),
		none("select", 2, fConn, aConn, nil, cmdSelect),
		none("quit", -1, fNoAuth, aConn, nil, cmdQuit),
		{name: "acl", arity: -2, acl: aSlow, subs: []*command{
			none("acl|whoami", 2, fSub, aSlow, nil, cmdACLWhoAmI),
			none("acl|users", 2, aclAdminF, aclAdmin, nil, cmdACLUsers),
			none("acl|list", 2, aclAdminF, aclAdmin, nil, cmdACLList),
			none("acl|getuser", 3, aclAdminF, aclAdmin, nil, cmdACLGetUser),
			none("acl|setuser", -3, aclAdminF, aclAdmin, nil, cmdACLSetUser),
			none("acl|deluser", -3, aclAdminF, aclAdmin, nil, cmdACLDelUser),
			none("acl|cat", -2, fSub, aSlow, nil, cmdACLCat),
			none("acl|save", 2, aclAdminF, aclAdmin, nil, cmdACLUnsupported),
			none("acl|load", 2, aclAdminF, aclAdmin, nil, cmdACLUnsupported),
			none("acl|help", 2, []string{"loading", "stale"}, aSlow, nil, cmdHelp),
		}},
		none("readonly", 1, fConn, aConn, nil, cmdReadOnly),
		none("readwrite", 1, fConn, aConn, nil, cmdReadWrite),
		none("asking", 1, []string{"fast"}, aConn, nil, cmdAsking),
		{name: "client", arity: -2, acl: aSlow, subs: []*command{
			none("client|id", 2, fSub, aSlowC, nil, cmdClientID),
			none("client|setname", 3, fSub, aSlowC, nil, cmdClientSetName),
			none("client|getname", 2, fSub, aSlowC, nil, cmdClientGetName),
			none("client|setinfo", 4, fSub, aSlowC, nil, cmdClientSetInfo),
			none("client|info", 2, fSub, aSlowC, []string{"nondeterministic_output"}, cmdClientInfo),
			none("client|list", -2, []string{"admin", "noscript", "loading", "stale"}, []string{"@admin", "@slow", "@dangerous", "@connection"}, []string{"nondeterministic_output"}, cmdClientList),
			none("client|unblock", -3, []string{"admin", "noscript", "loading", "stale"}, []string{"@admin", "@slow", "@dangerous", "@connection"}, nil, cmdClientUnblock),
			none("client|help", 2, []string{"loading", "stale"}, aSlowC, nil, cmdHelp),
		}},
		// Server.
		none("info", -1, []string{"loading", "stale"}, []string{"@slow", "@dangerous"}, []string{"nondeterministic_output", "request_policy:all_shards", "response_policy:special"}, cmdInfo),
		{name: "command", arity: -1, flags: []string{"loading", "stale"}, acl: aSlowC, tips: []string{"nondeterministic_output_order"}, run: cmdCommand, subs: []*command{
			none("command|count", 2, []string{"loading", "stale"}, aSlowC, nil, cmdCommandCount),
			none("command|info", -2, []string{"loading", "stale"}, aSlowC, []string{"nondeterministic_output_order"}, cmdCommandInfo),
			none("command|docs", -2, []string{"loading", "stale"}, aSlowC, []string{"nondeterministic_output_order"}, cmdCommandDocs),
			none("command|list", -2, []string{"loading", "stale"}, aSlowC, []string{"nondeterministic_output_order"}, cmdCommandList),
			none("command|getkeys", -4, []string{"loading", "stale"}, aSlowC, nil, cmdCommandGetKeys),
			none("command|help", 2, []string{"loading", "stale"}, aSlowC, nil, cmdHelp),
		}},
		{name: "config", arity: -2, acl: aSlow, subs: []*command{
			none("config|get", -3, []string{"admin", "noscript", "loading", "stale"}, []string{"@admin", "@slow", "@dangerous"}, nil, cmdConfigGet),
			none("config|set", -4, []string{"admin", "noscript", "loading", "stale"}, []string{"@admin", "@slow", "@dangerous"}, []string{"request_policy:all_nodes", "response_policy:all_succeeded"}, cmdConfigSet),
			none("config|help", 2, []string{"loading", "stale"}, aSlow, nil, cmdHelp),
		}},
		// Cluster.
		{name: "cluster", arity: -2, acl: aSlow, subs: []*command{
			none("cluster|info", 2, []string{"stale"}, aSlow, []string{"nondeterministic_output"}, cmdClusterInfo),
			none("cluster|myid", 2, []string{"stale"}, aSlow, nil, cmdClusterMyID),
			none("cluster|keyslot", 3, []string{"stale"}, aSlow, nil, cmdClusterKeySlot),
			none("cluster|slots", 2, []string{"stale"}, aSlow, []string{"nondeterministic_output"}, cmdClusterSlots),
			none("cluster|shards", 2, []string{"stale"}, aSlow, []string{"nondeterministic_output"}, cmdClusterShards),
			none("cluster|nodes", 2, []string{"stale"}, aSlow, []string{"nondeterministic_output"}, cmdClusterNodes),
			none("cluster|countkeysinslot", 3, []string{"stale"}, aSlow, nil, cmdClusterCountKeysInSlot),
			none("cluster|getkeysinslot", 4, []string{"stale"}, aSlow, []string{"nondeterministic_output"}, cmdClusterGetKeysInSlot),
			none("cluster|help", 2, []string{"loading", "stale"}, aSlow, nil, cmdHelp),
		}},
	}
	list = append(list, setCommands()...)
	list = append(list, listCommands()...)
	list = append(list, zsetCommands()...)
	list = append(list, zsetPopCommands()...)
	list = append(list, transactionCommands()...)
	list = append(list, sortCommands()...)
	m := make(map[string]*command, len(list))
	for _, c := range list {
		m[c.name] = c
	}
	return m
}

// sub returns the subcommand name (lower case) of a container command.
func (cmd *command) sub(name string) *command {
	for _, s := range cmd.subs {
		if s.name[strings.IndexByte(s.name, '|')+1:] == name {
			return s
		}
	}
	return nil
}

func (cmd *command) arityOK(argc int) bool {
	if cmd.arity >= 0 {
		return argc == cmd.arity
	}
	return argc >= -cmd.arity
}

func (cmd *command) noAuth() bool { return slices.Contains(cmd.flags, "no_auth") }

// keys returns the key arguments, by first/last/step as Redis does.
func (cmd *command) keys(args [][]byte) [][]byte {
	if cmd.keysOf != nil {
		return cmd.keysOf(args)
	}
	if cmd.first == 0 {
		return nil
	}
	last := cmd.last
	if last < 0 {
		last += len(args)
	}
	var out [][]byte
	for i := cmd.first; i <= last && i < len(args); i += cmd.step {
		out = append(out, args[i])
	}
	return out
}

// execute runs the connection's commands as the reader queues them, until
// the reader is done, QUIT, or the client can take no more replies.
func (c *conn) execute() {
	defer c.out.close()
	defer c.unwatch()
	for {
		cmds, end, done := c.q.take()
		if len(cmds) > 0 {
			c.run(cmds)
		}
		if c.quit || c.out.broken() {
			c.q.stop()
			return
		}
		if done {
			if end != nil {
				c.out.put(end, 0, 0)
			}
			return
		}
	}
}

// run runs queued commands, in order; their replies go to the outbox as
// each round of the pipeline completes.
func (c *conn) run(cmds []queued) {
	p := &pipeline{c: c}
	defer p.release()
	c.lockShared()
	defer c.unlockShared()
	for _, cmd := range cmds {
		if c.quit || c.out.broken() {
			break // QUIT: Redis ignores what follows; a gone client: stop
		}
		if cmd.first {
			c.burst = burst{}
		}
		c.s.stats.commands.Add(1)
		p.deadline, p.arrived, p.seq = cmd.deadline, cmd.arrived, cmd.seq
		before := p.last
		c.dispatch(p, cmd.args)
		if !cmd.first || p.last == before {
			continue
		}
		// The first command of a burst runs alone, so its outcome is known
		// before anything after it runs: see burst.
		p.barrier()
		if retryable(p.last.out) {
			c.burst.refuseUntil = cmd.deadline.Add(c.s.cfg.PipelineTimeout)
		}
	}
	p.barrier()
	p.emit()
}

// dispatch checks a command as Redis does, in Redis's order (lookup,
// arity, authentication, cross-slot keys), then runs it.
func (c *conn) dispatch(p *pipeline, args [][]byte) {
	name := strings.ToLower(string(args[0]))
	// A command refused here inside MULTI makes EXEC answer EXECABORT.
	refuse := func(e []byte) {
		if c.tx != nil {
			c.tx.dirty = true
		}
		if name == "exec" {
			e = c.execAbort(e)
		}
		p.reply(e)
	}
	cmd := c.s.cmds[name]
	if cmd == nil {
		refuse(unknownCommand(args))
		return
	}
	if len(cmd.subs) > 0 && len(args) >= 2 {
		sub := cmd.sub(strings.ToLower(string(args[1])))
		if sub == nil {
			refuse(errReply(fmt.Sprintf("ERR unknown subcommand '%s'. Try %s HELP.", trunc(args[1], 128), strings.ToUpper(name))))
			return
		}
		cmd = sub
	}
	if !cmd.arityOK(len(args)) || cmd.run == nil {
		cmd.stats.rejected.Add(1)
		refuse(wrongArgs(cmd.name))
		return
	}
	if !c.authed.Load() && !cmd.noAuth() {
		c.startUser() // the default user may have lost its password since
		if !c.authed.Load() {
			cmd.stats.rejected.Add(1)
			if !c.s.users().loaded {
				refuse(errReply(errUsersLoading))
			} else {
				refuse(errReply("NOAUTH Authentication required."))
			}
			return
		}
	}
	slot := -1
	keys := cmd.keys(args)
	if !cmd.noAuth() {
		if e, closeConn := c.checkAccess(cmd, keys); e != nil {
			cmd.stats.rejected.Add(1)
			refuse(e)
			c.quit = c.quit || closeConn
			return
		}
	}
	if len(keys) > 0 {
		slot = routing.Slot(keys[0])
		for _, k := range keys[1:] {
			if routing.Slot(k) != slot {
				cmd.stats.rejected.Add(1)
				refuse(errReply("CROSSSLOT Keys in request don't hash to the same slot"))
				return
			}
		}
	}
	if c.tx != nil && !txControl(name) {
		c.queue(p, args, slot)
		return
	}
	if slot >= 0 && c.burst.refuses(p.deadline) {
		cmd.stats.rejected.Add(1)
		c.s.stats.refused.Add(1)
		p.reply(errReply(errEarlierRefused))
		return
	}
	c.noteCommand(cmd.name)
	p.cmd, p.started = cmd, time.Now()
	cmd.run(c, p, args, slot)
	p.cmd = nil
}

// unknownCommand is Redis's error for an unknown command: the name and the
// start of the arguments, each quoted and followed by a space, 128 bytes at
// most.
func unknownCommand(args [][]byte) []byte {
	var b strings.Builder
	for i := 1; i < len(args) && b.Len() < 128; i++ {
		fmt.Fprintf(&b, "'%s' ", trunc(args[i], 128-b.Len()))
	}
	return errReply(fmt.Sprintf("ERR unknown command '%s', with args beginning with: %s", trunc(args[0], 128), b.String()))
}

func trunc(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

func wrongArgs(name string) []byte {
	return errReply(fmt.Sprintf("ERR wrong number of arguments for '%s' command", name))
}

// appendCommandInfo appends cmd's COMMAND entry: the 10 fields of Redis 7
// (name, arity, flags, first key, last key, step, ACL categories, tips, key
// specs, subcommands).
func (c *conn) appendCommandInfo(b []byte, cmd *command) []byte {
	b = redcon.AppendArray(b, 10)
	b = redcon.AppendBulkString(b, cmd.name)
	b = redcon.AppendInt(b, int64(cmd.arity))
	b = c.appendSet(b, cmd.flags, redcon.AppendString)
	b = redcon.AppendInt(b, int64(cmd.first))
	b = redcon.AppendInt(b, int64(cmd.last))
	b = redcon.AppendInt(b, int64(cmd.step))
	b = c.appendSet(b, cmd.acl, redcon.AppendString)
	b = c.appendSet(b, cmd.tips, redcon.AppendBulkString)
	switch {
	case cmd.specs != nil:
		b = c.appendSetLen(b, len(cmd.specs))
		for _, ks := range cmd.specs {
			b = c.appendSpec(b, ks)
		}
	case cmd.first == 0:
		b = c.appendSetLen(b, 0)
	case cmd.destFlags != nil:
		// Two keys, each its own spec (RENAME, COPY).
		b = c.appendSetLen(b, 2)
		b = c.appendKeySpec(b, cmd.keyFlags, cmd.keyNotes, cmd.first, 0, 1)
		b = c.appendKeySpec(b, cmd.destFlags, "", cmd.first+1, 0, 1)
	default:
		// One key spec: keys start at index `first` and run to `last`
		// (relative to it, or from the end) every `step`.
		lastKey := 0
		if cmd.last < 0 {
			lastKey = cmd.last
		}
		b = c.appendSetLen(b, 1)
		b = c.appendKeySpec(b, cmd.keyFlags, cmd.keyNotes, cmd.first, lastKey, cmd.step)
	}
	if len(cmd.subs) == 0 {
		return c.appendSetLen(b, 0) // Redis: an empty set, else an array
	}
	b = redcon.AppendArray(b, len(cmd.subs))
	for _, s := range cmd.subs {
		b = c.appendCommandInfo(b, s)
	}
	return b
}

// appendKeySpec appends a key spec of Redis 7: an index begin_search and a
// range find_keys.
func (c *conn) appendKeySpec(b []byte, flags []string, notes string, index, lastKey, step int) []byte {
	if notes != "" {
		b = c.appendMap(b, 4)
		b = redcon.AppendBulkString(b, "notes")
		b = redcon.AppendBulkString(b, notes)
	} else {
		b = c.appendMap(b, 3)
	}
	b = redcon.AppendBulkString(b, "flags")
	b = c.appendSet(b, flags, redcon.AppendString)
	b = redcon.AppendBulkString(b, "begin_search")
	b = c.appendMap(b, 2)
	b = redcon.AppendBulkString(b, "type")
	b = redcon.AppendBulkString(b, "index")
	b = redcon.AppendBulkString(b, "spec")
	b = c.appendMap(b, 1)
	b = redcon.AppendBulkString(b, "index")
	b = redcon.AppendInt(b, int64(index))
	b = redcon.AppendBulkString(b, "find_keys")
	b = c.appendMap(b, 2)
	b = redcon.AppendBulkString(b, "type")
	b = redcon.AppendBulkString(b, "range")
	b = redcon.AppendBulkString(b, "spec")
	b = c.appendMap(b, 3)
	b = redcon.AppendBulkString(b, "lastkey")
	b = redcon.AppendInt(b, int64(lastKey))
	b = redcon.AppendBulkString(b, "keystep")
	b = redcon.AppendInt(b, int64(step))
	b = redcon.AppendBulkString(b, "limit")
	b = redcon.AppendInt(b, 0)
	return b
}

func appendBulkList(b []byte, l []string) []byte {
	b = redcon.AppendArray(b, len(l))
	for _, s := range l {
		b = redcon.AppendBulkString(b, s)
	}
	return b
}

// sortedCommands lists the top-level commands by name.
func (s *Server) sortedCommands() []*command {
	out := make([]*command, 0, len(s.cmds))
	for _, c := range s.cmds {
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b *command) int { return strings.Compare(a.name, b.name) })
	return out
}

// lookup finds a command or subcommand by "name" or "container|sub".
func (s *Server) lookup(name string) *command {
	name = strings.ToLower(name)
	top, sub, ok := strings.Cut(name, "|")
	cmd := s.cmds[top]
	if cmd == nil || !ok {
		return cmd
	}
	return cmd.sub(sub)
}

func cmdCommand(c *conn, p *pipeline, args [][]byte, _ int) {
	cmds := c.s.sortedCommands()
	b := redcon.AppendArray(nil, len(cmds))
	for _, cmd := range cmds {
		b = c.appendCommandInfo(b, cmd)
	}
	p.reply(b)
}

func cmdCommandCount(c *conn, p *pipeline, _ [][]byte, _ int) {
	p.reply(redcon.AppendInt(nil, int64(len(c.s.cmds))))
}

func cmdCommandInfo(c *conn, p *pipeline, args [][]byte, _ int) {
	if len(args) == 2 {
		cmdCommand(c, p, args, -1)
		return
	}
	b := redcon.AppendArray(nil, len(args)-2)
	for _, a := range args[2:] {
		if cmd := c.s.lookup(string(a)); cmd != nil {
			b = c.appendCommandInfo(b, cmd)
		} else {
			b = c.appendNull(b)
		}
	}
	p.reply(b)
}

// cmdCommandDocs answers an empty map: documentation is optional, and
// clients (redis-cli's hints) do without it.
func cmdCommandDocs(c *conn, p *pipeline, _ [][]byte, _ int) {
	p.reply(c.appendMap(nil, 0))
}

func cmdCommandList(c *conn, p *pipeline, args [][]byte, _ int) {
	if len(args) > 2 {
		p.reply(errReply("ERR syntax error"))
		return
	}
	cmds := c.s.sortedCommands()
	var names []string
	for _, cmd := range cmds {
		names = append(names, cmd.name)
		for _, s := range cmd.subs {
			names = append(names, s.name)
		}
	}
	p.reply(appendBulkList(nil, names))
}

func cmdCommandGetKeys(c *conn, p *pipeline, args [][]byte, _ int) {
	target := args[2:]
	cmd := c.s.cmds[strings.ToLower(string(target[0]))]
	if cmd != nil && len(cmd.subs) > 0 && len(target) >= 2 {
		cmd = cmd.sub(strings.ToLower(string(target[1])))
	}
	switch {
	case cmd == nil:
		p.reply(errReply("ERR Invalid command specified"))
	case !cmd.arityOK(len(target)):
		p.reply(errReply("ERR Invalid number of arguments specified for command"))
	case cmd.first == 0 && cmd.keysOf == nil:
		p.reply(errReply("ERR The command has no key arguments"))
	case len(cmd.keys(target)) == 0:
		p.reply(errReply("ERR Invalid arguments specified for command"))
	default:
		keys := cmd.keys(target)
		b := redcon.AppendArray(nil, len(keys))
		for _, k := range keys {
			b = redcon.AppendBulk(b, k)
		}
		p.reply(b)
	}
}

// helpText is the HELP reply of a container command.
func helpText(name string) []string {
	return map[string][]string{
		"client": {
			"CLIENT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
			"GETNAME", "    Return the name of the current connection.",
			"ID", "    Return the ID of the current connection.",
			"INFO", "    Return information about the current client connection.",
			"LIST", "    Return information about client connections.",
			"SETNAME <name>", "    Assign the name <name> to the current connection.",
			"SETINFO <option> <value>", "    Set client meta attr (LIB-NAME, LIB-VER).",
			"HELP", "    Print this help.",
		},
		"command": {
			"COMMAND <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
			"(no subcommand)", "    Return details about all commands.",
			"COUNT", "    Return the total number of commands in this server.",
			"LIST", "    Return a list of all commands in this server.",
			"INFO [<command-name> ...]", "    Return details about the given commands, or all of them.",
			"DOCS [<command-name> ...]", "    Return documentation (none is served).",
			"GETKEYS <full-command>", "    Return the keys from a full command.",
			"HELP", "    Print this help.",
		},
		"acl": {
			"ACL <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
			"CAT [<category>]", "    List all commands that belong to <category>, or all command categories.",
			"DELUSER <username> [<username> ...]", "    Delete a list of users.",
			"GETUSER <username>", "    Get the user's details.",
			"LIST", "    Show users details in config file format.",
			"SETUSER <username> <attribute> [<attribute> ...]", "    Create or modify a user with the specified attributes (docs/security.md).",
			"USERS", "    List all the registered usernames.",
			"WHOAMI", "    Return the current connection username.",
			"HELP", "    Print this help.",
		},
		"config": {
			"CONFIG <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
			"GET <pattern>", "    Return parameters matching the glob-like <pattern> and their values.",
			"HELP", "    Print this help.",
		},
		"memory": {
			"MEMORY <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
			"USAGE <key> [SAMPLES <count>]", "    Return an estimate of the bytes <key> takes (storage is badger's, not an",
			"    allocator's). For nested types, the first <count> elements are sampled",
			"    (default 5; 0 samples all).",
			"HELP", "    Print this help.",
		},
		"object": {
			"OBJECT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
			"ENCODING <key>", "    Return the kind of internal representation used in order to store the value",
			"    associated with a <key>.",
			"FREQ <key>", "    Return the access frequency index of the <key> (not tracked here).",
			"IDLETIME <key>", "    Return the idle time of the <key> (not tracked here).",
			"REFCOUNT <key>", "    Return the number of references of the value associated with the specified",
			"    <key>.",
			"HELP", "    Print this help.",
		},
		"function": {
			"FUNCTION <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
			"FLUSH [ASYNC|SYNC]", "    Delete all the libraries (shardkv runs no functions: there are none).",
			"HELP", "    Print this help.",
		},
		"cluster": {
			"CLUSTER <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
			"COUNTKEYSINSLOT <slot>", "    Return the number of keys in <slot>.",
			"GETKEYSINSLOT <slot> <count>", "    Return key names stored by this replica in a slot.",
			"INFO", "    Return information about the cluster.",
			"KEYSLOT <key>", "    Return the hash slot for <key>.",
			"MYID", "    Return the node id.",
			"NODES", "    Return cluster configuration seen by node.",
			"SHARDS", "    Return information about slot range mappings and the nodes of each shard.",
			"SLOTS", "    Return information about slots range mappings.",
			"HELP", "    Print this help.",
		},
	}[name]
}

func cmdHelp(_ *conn, p *pipeline, args [][]byte, _ int) {
	lines := helpText(strings.ToLower(string(args[0])))
	b := redcon.AppendArray(nil, len(lines))
	for _, l := range lines {
		b = redcon.AppendString(b, l)
	}
	p.reply(b)
}

func errReply(msg string) []byte { return redcon.AppendError(nil, msg) }

func okReply() []byte { return redcon.AppendOK(nil) }
