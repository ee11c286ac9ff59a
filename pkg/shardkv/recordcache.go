package shardkv

// recordCache keeps the small values apply wrote last, by key, so that the
// next write of the same key reads them from memory: badger's point read
// searches every level of the LSM tree for the newest version (it stops
// early only on an exact version), and under a write load that was a
// quarter of a follower's CPU. It holds exactly what the open transaction
// would return (apply's own writes, deletes as known-absent), so it changes
// no result, only where the bytes come from; its eviction order (Go's map
// order) therefore does not make apply nondeterministic.
//
// Only Apply and Restore use it, and the engine calls both from one
// goroutine.
type recordCache struct {
	m     map[string][]byte // nil value: known absent
	bytes int
}

const (
	// cacheMaxValue: larger values are not cached (their read is rare
	// next to their write, and they would crowd out the rest).
	cacheMaxValue = 4 << 10
	// cacheMaxBytes bounds one replica's cache, keys and values; a
	// machine hosts 10 to 20 replicas.
	cacheMaxBytes = 8 << 20
	cacheOverhead = 64 // per entry: map slot and slice headers, roughly
)

// get returns a copy: callers may change what they read in place, and
// what a read returns must not depend on whether it was cached.
func (c *recordCache) get(k []byte) (v []byte, ok bool) {
	v, ok = c.m[string(k)]
	if v != nil {
		v = append([]byte(nil), v...)
	}
	return v, ok
}

// put records that k now holds v (nil: deleted). A value too large to
// cache drops any older one.
func (c *recordCache) put(k, v []byte) {
	c.drop(k)
	if len(v) > cacheMaxValue {
		return
	}
	if c.m == nil {
		c.m = map[string][]byte{}
	}
	c.m[string(k)] = v
	c.bytes += len(k) + len(v) + cacheOverhead
	for c.bytes > cacheMaxBytes {
		for ks, vs := range c.m {
			delete(c.m, ks)
			c.bytes -= len(ks) + len(vs) + cacheOverhead
			break
		}
	}
}

func (c *recordCache) drop(k []byte) {
	if old, ok := c.m[string(k)]; ok {
		delete(c.m, string(k))
		c.bytes -= len(k) + len(old) + cacheOverhead
	}
}

// reset forgets everything: the state was replaced (Restore).
func (c *recordCache) reset() { c.m, c.bytes = nil, 0 }
