package rgtest

import (
	"fmt"
	"strings"

	"github.com/dgraph-io/badger/v4"
)

// Dump returns every key and value the KV holds, read from local state (call
// Replica.ReadIndex first for a linearizable view). Tests use it to compare
// replicas' whole state.
func (kv *KV) Dump() (map[string]string, error) {
	out := map[string]string{}
	err := kv.store.DB().View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: kvPrefix, PrefetchValues: true})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			v, err := it.Item().ValueCopy(nil)
			if err != nil {
				return err
			}
			out[string(it.Item().Key()[len(kvPrefix):])] = string(v)
		}
		return nil
	})
	return out, err
}

// DumpDB renders every key and value of db, in key order, one "key=value"
// line each (hex): for comparing two state machines' whole stored state.
func DumpDB(db *badger.DB) (string, error) {
	var b strings.Builder
	err := db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			v, err := it.Item().ValueCopy(nil)
			if err != nil {
				return err
			}
			fmt.Fprintf(&b, "%x=%x\n", it.Item().Key(), v)
		}
		return nil
	})
	return b.String(), err
}
