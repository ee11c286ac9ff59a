package kvctl

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/shardkv/shardkv/pkg/client"
)

// keyJSON is the --json output of get, put, append and del.
type keyJSON struct {
	Key   string `json:"key"`
	Found *bool  `json:"found,omitempty"` // get
	// Value is the value (get); a value that is not valid UTF-8 is given
	// as ValueBase64 instead.
	Value       *string `json:"value,omitempty"`
	ValueBase64 string  `json:"value_base64,omitempty"`
	OK          *bool   `json:"ok,omitempty"`      // put, append
	Deleted     *bool   `json:"deleted,omitempty"` // del: whether the key existed
}

func ptr[T any](v T) *T { return &v }

// dataCommand parses a data command's n arguments and runs fn with them,
// the data client and a context bounded by --timeout.
func (k *kvctl) dataCommand(op string, n int, args []string, fn func(ctx context.Context, cl *client.Client, pos []string) error) error {
	pos, err := k.parse(newFlags(op), args, n, n)
	if err != nil {
		return err
	}
	cl, err := k.dataClient()
	if err != nil {
		return err
	}
	ctx, cancel := k.ctx()
	defer cancel()
	return fn(ctx, cl, pos)
}

func (k *kvctl) dataErr(op, key string, err error) error {
	switch {
	case errors.Is(err, client.ErrOutcomeUnknown):
		return fmt.Errorf("%s %q: no answer within %v; the write may or may not have been applied; last error: %s%s", op, key, k.timeout, lastError(err), k.staleLocal())
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%s %q: no answer within %v; last error: %s%s", op, key, k.timeout, lastError(err), k.staleLocal())
	}
	return fmt.Errorf("%s %q: %s", op, key, oneLine(err))
}

func cmdGet(k *kvctl, args []string) error {
	return k.dataCommand("get", 1, args, func(ctx context.Context, cl *client.Client, pos []string) error {
		v, found, err := cl.Get(ctx, pos[0])
		if err != nil {
			return k.dataErr("get", pos[0], err)
		}
		if k.json {
			out := keyJSON{Key: pos[0], Found: ptr(found)}
			if found {
				if utf8.ValidString(v) {
					out.Value = ptr(v)
				} else {
					out.ValueBase64 = base64.StdEncoding.EncodeToString([]byte(v))
				}
			}
			if err := k.printJSON(out); err != nil {
				return err
			}
			if !found {
				return &silentExit{ExitNotFound}
			}
			return nil
		}
		if !found {
			return &notFoundError{key: pos[0]}
		}
		_, err = fmt.Fprintln(k.stdout, v)
		return err
	})
}

func cmdPut(k *kvctl, args []string) error { return write(k, "put", args) }

func cmdAppend(k *kvctl, args []string) error { return write(k, "append", args) }

func write(k *kvctl, op string, args []string) error {
	return k.dataCommand(op, 2, args, func(ctx context.Context, cl *client.Client, pos []string) error {
		var err error
		if op == "put" {
			err = cl.Put(ctx, pos[0], pos[1])
		} else {
			err = cl.Append(ctx, pos[0], pos[1])
		}
		if err != nil {
			return k.dataErr(op, pos[0], err)
		}
		if k.json {
			return k.printJSON(keyJSON{Key: pos[0], OK: ptr(true)})
		}
		_, err = fmt.Fprintln(k.stdout, "OK")
		return err
	})
}

func cmdDel(k *kvctl, args []string) error {
	return k.dataCommand("del", 1, args, func(ctx context.Context, cl *client.Client, pos []string) error {
		existed, err := cl.Delete(ctx, pos[0])
		if err != nil {
			return k.dataErr("del", pos[0], err)
		}
		if k.json {
			if err := k.printJSON(keyJSON{Key: pos[0], Deleted: ptr(existed)}); err != nil {
				return err
			}
			if !existed {
				return &silentExit{ExitNotFound}
			}
			return nil
		}
		if !existed {
			return &notFoundError{key: pos[0], what: "did not exist"}
		}
		_, err = fmt.Fprintln(k.stdout, "deleted")
		return err
	})
}
