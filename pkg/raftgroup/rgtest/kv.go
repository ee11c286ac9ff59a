// Package rgtest runs Raft groups of real replicas (real badger, real gRPC on
// loopback) in one process, over a network that can drop, delay, duplicate
// and reorder messages, partition replicas and crash them. The shard
// controller and data-group tests build on it too.
package rgtest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/dgraph-io/badger/v4"
	"github.com/shardkv/shardkv/pkg/raftgroup"
)

// KV is a small key-value state machine on badger, for engine tests.
// Commands: Put and Append (see EncodePut/EncodeAppend); reads go through
// Get after Replica.ReadIndex. Append returns the value before appending, so
// tests can check exactly-once effects.
type KV struct {
	store *raftgroup.PrefixStore
}

var (
	kvPrefix   = []byte("k/")
	keyApplied = []byte("m/applied")
)

const (
	opPut    = 'P'
	opAppend = 'A'
)

// EncodePut makes a Put command.
func EncodePut(key, val string) []byte { return encode(opPut, key, val) }

// EncodeAppend makes an Append command.
func EncodeAppend(key, val string) []byte { return encode(opAppend, key, val) }

func encode(op byte, key, val string) []byte {
	b := []byte{op}
	b = binary.AppendUvarint(b, uint64(len(key)))
	b = append(b, key...)
	return append(b, val...)
}

func decode(cmd []byte) (op byte, key, val string, err error) {
	if len(cmd) < 2 {
		return 0, "", "", errors.New("short command")
	}
	n, w := binary.Uvarint(cmd[1:])
	if w <= 0 || int(n) > len(cmd)-1-w {
		return 0, "", "", errors.New("bad command")
	}
	return cmd[0], string(cmd[1+w : 1+w+int(n)]), string(cmd[1+w+int(n):]), nil
}

func (kv *KV) Open(db *badger.DB) (uint64, error) {
	kv.store = raftgroup.NewPrefixStore(keyApplied, [][]byte{kvPrefix, keyApplied}, nil)
	return kv.store.Open(db)
}

func (kv *KV) Apply(b *raftgroup.Batch, ents []raftgroup.Entry) error {
	txn := b.Txn() // small entries: the engine's share leaves room
	for i := range ents {
		e := &ents[i]
		if e.Cmd == nil {
			continue
		}
		op, key, val, err := decode(e.Cmd)
		if err != nil {
			e.Result = err
			continue
		}
		k := append(append([]byte{}, kvPrefix...), key...)
		old, err := get(txn, k)
		if err != nil {
			return err
		}
		switch op {
		case opPut:
			err = txn.Set(k, []byte(val))
		case opAppend:
			err = txn.Set(k, []byte(old+val))
		default:
			e.Result = fmt.Errorf("unknown op %q", op)
			continue
		}
		if err != nil {
			return err
		}
		e.Result = old
	}
	return raftgroup.StoreApplied(txn, keyApplied, ents[len(ents)-1].Index)
}

func get(txn *badger.Txn, k []byte) (string, error) {
	v, err := raftgroup.GetValue(txn, k)
	return string(v), err
}

// Get reads a key from local state. Call Replica.ReadIndex first for a
// linearizable read.
func (kv *KV) Get(key string) (string, error) {
	var v string
	err := kv.store.DB().View(func(txn *badger.Txn) error {
		var err error
		v, err = get(txn, append(append([]byte{}, kvPrefix...), key...))
		return err
	})
	return v, err
}

// Len counts the keys held.
func (kv *KV) Len() (int, error) {
	n := 0
	err := kv.store.DB().View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: kvPrefix})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			n++
		}
		return nil
	})
	return n, err
}

func (kv *KV) Snapshot() (raftgroup.Snapshot, error) { return kv.store.Snapshot() }

func (kv *KV) Restore(r io.Reader) (uint64, error) { return kv.store.Restore(r) }
