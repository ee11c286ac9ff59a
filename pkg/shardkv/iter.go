package shardkv

import (
	"bytes"

	"github.com/dgraph-io/badger/v4"
)

// startAfter positions it at the first key after `after` (resume) or at
// its start. A resumed scan seeks and never rewinds first: a Rewind steps
// over every delete marker before the first live key, so a chunked
// deletion that rewound on each chunk took time quadratic in the keys it
// had deleted (BenchmarkShardGC).
func startAfter(it *badger.Iterator, after []byte, resume bool) {
	if !resume {
		it.Rewind()
		return
	}
	it.Seek(after)
	if it.Valid() && bytes.Equal(it.Item().Key(), after) {
		it.Next()
	}
}
