package rgtest

import (
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
