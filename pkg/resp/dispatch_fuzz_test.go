package resp_test

import (
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/raftgroup/rgtest"
	"github.com/shardkv/shardkv/pkg/resp"
	"github.com/shardkv/shardkv/pkg/shardkv"
	"github.com/shardkv/shardkv/pkg/shardkv/kvtest"
)

// Words the dispatch fuzzer builds commands from: every command and
// subcommand name, their options, keys of one hash tag and numbers at the
// edges. Other bytes come from the input itself.
var (
	fuzzCommands = []string{"get", "set", "setnx", "getset", "getdel", "append", "strlen", "incr", "decr", "incrby", "decrby",
		"incrbyfloat", "mget", "mset", "del", "unlink", "exists", "type", "expire", "pexpire", "expireat", "pexpireat", "ttl", "pttl",
		"persist", "scan", "dbsize", "ping", "echo", "hello", "auth", "select", "quit", "readonly", "readwrite", "asking", "client",
		"command", "config", "cluster", "info", "getex", "getrange", "substr", "setrange", "setex", "psetex", "touch", "expiretime",
		"pexpiretime", "rename", "renamenx", "copy", "keys", "time", "flushall", "flushdb", "function", "msetnx", "getbit", "setbit", "bitcount", "bitpos", "randomkey", "object", "dump", "restore",
		"hset", "hmset", "hsetnx", "hget", "hmget", "hgetall", "hkeys", "hvals", "hdel", "hexists", "hlen", "hstrlen", "hincrby", "hincrbyfloat", "hrandfield", "hscan",
		"zadd", "zincrby", "zrem", "zpopmin", "zpopmax", "zremrangebyrank", "zremrangebyscore", "zremrangebylex", "zcard", "zscore",
		"zmscore", "zcount", "zlexcount", "zrank", "zrevrank", "zrange", "zrevrange", "zrangebyscore", "zrevrangebyscore", "zrangebylex",
		"zrevrangebylex", "zscan", "zrandmember", "zunion", "zinter", "zdiff", "zintercard", "zrangestore", "zunionstore",
		"zinterstore", "zdiffstore",
		"sadd", "srem", "smembers", "sismember", "smismember", "scard", "spop", "srandmember", "smove", "sinter", "sunion", "sdiff",
		"sinterstore", "sunionstore", "sdiffstore", "sintercard", "sscan", "lpush", "rpush", "lpushx", "rpushx", "lpop", "rpop",
		"lrange", "llen", "lindex", "lset", "linsert", "lrem", "ltrim", "lpos", "lmove", "rpoplpush", "lmpop", "blpop", "brpop",
		"blmove", "brpoplpush", "blmpop", "zmpop", "bzmpop", "bzpopmin", "bzpopmax", "lcs",
		"multi", "exec", "discard", "watch", "unwatch", "bitop", "sort", "sort_ro"}
	// (CLIENT UNBLOCK is a subcommand: "client" above, with "unblock" among the words.)
	fuzzWords = []string{"k", "{t}a", "{t}b", "n", "", "id", "setname", "getname", "setinfo", "lib-name", "info", "list", "help",
		"count", "docs", "getkeys", "myid", "keyslot", "slots", "shards", "nodes", "countkeysinslot", "getkeysinslot", "ex", "px",
		"exat", "pxat", "nx", "xx", "gt", "lt", "get", "keepttl", "match", "*", "type", "string", "auth", "setname", "default", "persist", "replace", "db", "{t}*", "flush", "async", "sync", "bit", "byte", "encoding", "refcount", "freq", "idletime", "absttl",
		"0", "1", "-1", "2", "3", "100", "16383", "16384", "1000000000", "9223372036854775807", "-9223372036854775808", "1.5", "nan", "inf", "1e400",
		"withvalues", "hash", "f", "g", "4611686018427387904", "-4611686018427387904",
		"withscores", "byscore", "bylex", "rev", "limit", "incr", "ch", "weights", "aggregate", "sum", "min", "max", "zset",
		"-inf", "+inf", "(1", "[a", "(a", "-", "+", "0x10", " 1",
		"left", "right", "before", "after", "rank", "maxlen", "set", "list", "idx", "len", "minmatchlen", "withmatchlen", "and", "xor", "not", "alpha", "desc", "store", "by", "nosort", "unblock", "error", "timeout"}
)

// dispatchServer starts one data group of one replica with its RESP
// server (once per fuzzing process: the workers run the target's body too)
// and returns the server's address.
func dispatchServer(f *testing.F) string {
	w := kvtest.New(f, kvtest.Options{Shards: 16, Replicas: 1,
		RaftConfig: func(c *raftgroup.Config) { c.ElectionTicks = 100 },
		RESP: func(addr string, grp *shardkv.Group) func() {
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				f.Errorf("listen %s: %v", addr, err)
				return func() {}
			}
			s := resp.New(resp.Config{WriteTimeout: slow, ReadTimeout: slow, Logger: rgtest.Logger()}, grp)
			go s.Serve(ln)
			return func() { s.Close() }
		}})
	w.StartGroup(gA)
	w.Join(gA)
	w.WaitSettled(60 * time.Second)
	return w.RESPAddr(gA, w.Groups[gA].WaitLeader(10*time.Second))
}

// decodeCommands turns fuzz bytes into at most 16 commands.
func decodeCommands(data []byte) [][]string {
	next := func() (byte, bool) {
		if len(data) == 0 {
			return 0, false
		}
		b := data[0]
		data = data[1:]
		return b, true
	}
	var cmds [][]string
	for len(cmds) < 16 {
		b, ok := next()
		if !ok {
			break
		}
		cmd := []string{fuzzCommands[int(b)%len(fuzzCommands)]}
		n, _ := next()
		for range int(n % 7) {
			a, ok := next()
			if !ok {
				break
			}
			if a&0x80 == 0 {
				cmd = append(cmd, fuzzWords[int(a)%len(fuzzWords)])
				continue
			}
			l := min(int(a&0x1f), len(data))
			cmd = append(cmd, string(data[:l]))
			data = data[l:]
		}
		cmds = append(cmds, shortTimeout(cmd))
	}
	return cmds
}

// shortTimeout makes a blocking command's timeout, if it is one, 10 ms:
// the fuzzer waits for every reply.
func shortTimeout(cmd []string) []string {
	at := len(cmd) - 1
	switch {
	case (cmd[0] == "blmpop" || cmd[0] == "bzmpop") && len(cmd) > 1:
		at = 1
	case cmd[0] == "blpop", cmd[0] == "brpop", cmd[0] == "blmove", cmd[0] == "brpoplpush", cmd[0] == "bzpopmin", cmd[0] == "bzpopmax":
	default:
		return cmd
	}
	if _, err := strconv.ParseFloat(cmd[at], 64); err == nil || strings.Contains(strings.ToLower(cmd[at]), "0x") {
		cmd[at] = "0.01"
	}
	return cmd
}

// FuzzRESPDispatch: random commands with random arguments, pipelined to a
// real data group, each get a reply, and the server answers PING after;
// random raw frames never stop it either.
func FuzzRESPDispatch(f *testing.F) {
	f.Add([]byte("\x00\x01\x00"), false)                     // GET k
	f.Add([]byte("\x01\x02\x00\x80\x03abc"), false)          // SET k abc
	f.Add([]byte("\x27\x03\x16\x2c\x35"), false)             // CLUSTER getkeysinslot 0 1000000000
	f.Add([]byte("\x0a\x03\x00\x3a\x01\x07\x01\x00"), false) // INCRBY / INCR
	f.Add([]byte("*1\r\n$9223372036854775807\r\n"), true)
	f.Add([]byte("*3000000000\r\n"), true)
	f.Add([]byte("SET k \"a\r\n"), true)
	addr := dispatchServer(f)
	f.Fuzz(func(t *testing.T, data []byte, raw bool) {
		if raw {
			c := dial(t, addr)
			c.write(data)
			_ = c.c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
			buf := make([]byte, 4096)
			for {
				if _, err := c.c.Read(buf); err != nil {
					break
				}
			}
			c.c.Close()
		} else {
			c := dial(t, addr)
			cmds := decodeCommands(data)
			var pipe []byte
			for _, cmd := range cmds {
				pipe = append(pipe, encode(cmd...)...)
				if cmd[0] == "quit" {
					break
				}
			}
			c.write(pipe)
			for _, cmd := range cmds {
				if _, err := c.tryRead(); err != nil {
					t.Fatalf("%q: no reply: %v", cmd, err)
				}
				if cmd[0] == "quit" {
					break
				}
			}
			c.c.Close()
		}
		p := dial(t, addr)
		defer p.c.Close()
		p.write(encode("ping"))
		if r, err := p.tryRead(); err != nil || r != status("PONG") {
			t.Fatalf("PING after: %#v, %v", r, err)
		}
	})
}
