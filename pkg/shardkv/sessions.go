package shardkv

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// session is a client's dedup state within one shard. Sequence numbers may
// complete out of order: Floor says every seq <= Floor is done (and
// acknowledged by the client, so forgotten); Done lists the seqs above Floor
// that were applied, with their results. Trimmed is the highest seq whose
// result was dropped to keep Done within MaxDonePerSession: a seq in
// (Floor, Trimmed] that is not in Done may or may not have been applied.
type session struct {
	Floor   uint64
	LastNS  int64
	Done    []doneOp // sorted by Seq
	Trimmed uint64
}

type doneOp struct {
	Seq       uint64
	OK        bool
	PrevFound bool
	Prev      []byte
	// The rest of the op's result: INCR's new value, APPEND's new length,
	// INCR_FLOAT's value, a refusal (OpErr*). A retry gets all of it.
	Num   int64
	Value []byte
	Err   string
	// Values: the elements a pop removed (SPOP, LPOP, RPOP, LMOVE).
	Values [][]byte
}

// result is the WriteResult the op answered with.
func (d doneOp) result() *shardkvpb.WriteResult {
	return &shardkvpb.WriteResult{Ok: d.OK, Prev: d.Prev, PrevFound: d.PrevFound, Num: d.Num, Value: d.Value, Error: d.Err, Values: d.Values}
}

func doneOf(seq uint64, res *shardkvpb.WriteResult, keepPrev bool) doneOp {
	d := doneOp{Seq: seq, OK: res.GetOk(), Num: res.GetNum(), Value: res.GetValue(), Err: res.GetError(), Values: res.GetValues()}
	if keepPrev {
		d.Prev, d.PrevFound = res.GetPrev(), res.GetPrevFound()
	}
	return d
}

// MaxDonePerSession bounds a session's remembered results. A client with
// more than this many unacknowledged writes on one shard loses the results
// of the oldest ones: a write at or below Trimmed and not in Done gets
// ResultForgotten (outcome unknown), never a silent "done". (Trimming used
// to raise Floor instead, which made the group skip, and report as done,
// writes of the session that had not arrived yet.)
const MaxDonePerSession = 4096

func (s *session) encode() []byte {
	b := binary.BigEndian.AppendUint64(nil, s.Floor)
	b = binary.BigEndian.AppendUint64(b, uint64(s.LastNS))
	b = binary.AppendUvarint(b, uint64(len(s.Done)))
	for _, d := range s.Done {
		b = binary.AppendUvarint(b, d.Seq)
		var f byte
		if d.OK {
			f |= 1
		}
		if d.PrevFound {
			f |= 2
		}
		rest := d.Num != 0 || len(d.Value) > 0 || d.Err != ""
		if rest {
			f |= 4 // records written before this flag have no rest
		}
		if len(d.Values) > 0 {
			f |= 8 // nor values
		}
		b = append(b, f)
		b = binary.AppendUvarint(b, uint64(len(d.Prev)))
		b = append(b, d.Prev...)
		if rest {
			b = binary.AppendVarint(b, d.Num)
			b = binary.AppendUvarint(b, uint64(len(d.Value)))
			b = append(b, d.Value...)
			b = binary.AppendUvarint(b, uint64(len(d.Err)))
			b = append(b, d.Err...)
		}
		if len(d.Values) > 0 {
			b = binary.AppendUvarint(b, uint64(len(d.Values)))
			for _, v := range d.Values {
				b = binary.AppendUvarint(b, uint64(len(v)))
				b = append(b, v...)
			}
		}
	}
	if s.Trimmed > s.Floor {
		b = binary.AppendUvarint(b, s.Trimmed) // optional trailer
	}
	return b
}

func decodeSession(b []byte) (*session, error) {
	if len(b) < 16 {
		return nil, errors.New("short session record")
	}
	s := &session{Floor: binary.BigEndian.Uint64(b), LastNS: int64(binary.BigEndian.Uint64(b[8:]))}
	b = b[16:]
	n, w := binary.Uvarint(b)
	if w <= 0 {
		return nil, errors.New("bad session record")
	}
	b = b[w:]
	for range n {
		seq, w := binary.Uvarint(b)
		if w <= 0 || len(b) < w+1 {
			return nil, errors.New("bad session entry")
		}
		f := b[w]
		b = b[w+1:]
		l, w := binary.Uvarint(b)
		if w <= 0 || uint64(len(b)-w) < l {
			return nil, errors.New("bad session entry")
		}
		prev := slices.Clone(b[w : w+int(l)])
		b = b[w+int(l):]
		d := doneOp{Seq: seq, OK: f&1 != 0, PrevFound: f&2 != 0, Prev: prev}
		if f&4 != 0 {
			num, w := binary.Varint(b)
			if w <= 0 {
				return nil, errors.New("bad session entry result")
			}
			d.Num, b = num, b[w:]
			var val, msg []byte
			var err error
			if val, b, err = uvarintBytes(b); err != nil {
				return nil, err
			}
			if msg, b, err = uvarintBytes(b); err != nil {
				return nil, err
			}
			d.Value, d.Err = slices.Clone(val), string(msg)
		}
		if f&8 != 0 {
			n, w := binary.Uvarint(b)
			if w <= 0 || n > uint64(len(b)) {
				return nil, errors.New("bad session entry values")
			}
			b = b[w:]
			for range n {
				var v []byte
				var err error
				if v, b, err = uvarintBytes(b); err != nil {
					return nil, err
				}
				d.Values = append(d.Values, slices.Clone(v))
			}
		}
		s.Done = append(s.Done, d)
	}
	if len(b) > 0 {
		t, w := binary.Uvarint(b)
		if w <= 0 {
			return nil, errors.New("bad session trailer")
		}
		s.Trimmed = t
	}
	return s, nil
}

// uvarintBytes splits a length-prefixed field off b.
func uvarintBytes(b []byte) (field, rest []byte, err error) {
	l, w := binary.Uvarint(b)
	if w <= 0 || uint64(len(b)-w) < l {
		return nil, nil, errors.New("bad session entry field")
	}
	return b[w : w+int(l)], b[w+int(l):], nil
}

// find returns the stored result of seq, if it was applied.
func (s *session) find(seq uint64) (doneOp, bool) {
	i, ok := slices.BinarySearchFunc(s.Done, seq, func(d doneOp, q uint64) int { return cmp.Compare(d.Seq, q) })
	if !ok {
		return doneOp{}, false
	}
	return s.Done[i], true
}

// ack forgets every result the client has acknowledged.
func (s *session) ack(upTo uint64) {
	if upTo <= s.Floor {
		return
	}
	s.Floor = upTo
	i := 0
	for i < len(s.Done) && s.Done[i].Seq <= upTo {
		i++
	}
	s.Done = s.Done[i:]
}

func (s *session) add(d doneOp) {
	i, _ := slices.BinarySearchFunc(s.Done, d.Seq, func(x doneOp, q uint64) int { return cmp.Compare(x.Seq, q) })
	s.Done = slices.Insert(s.Done, i, d)
	for len(s.Done) > MaxDonePerSession {
		s.Trimmed = max(s.Trimmed, s.Done[0].Seq)
		s.Done = s.Done[1:]
	}
}

// MaxSessionBytes bounds a stored session record (its results' Prev values
// above all), and EntrySessionBytes the session records one entry writes
// together: without them one session's record grew with every ReturnPrev
// result kept, up to MaxDonePerSession values, and was rewritten whole by
// each write. 4096 results without Prev take under 50 KiB.
const (
	MaxSessionBytes   = 64 << 10
	EntrySessionBytes = 512 << 10
)

// fit drops the oldest results until the record encodes in limit bytes;
// their seqs count as Trimmed (a retry of one gets ResultForgotten).
func (s *session) fit(limit int) {
	size := len(s.encode())
	for size > limit && len(s.Done) > 0 {
		d := s.Done[0]
		size -= uvarintLen(d.Seq) + 1 + uvarintLen(uint64(len(d.Prev))) + len(d.Prev)
		for _, v := range d.Values {
			size -= len(v)
		}
		s.Trimmed = max(s.Trimmed, d.Seq)
		s.Done = s.Done[1:]
		if size <= limit {
			// The count's and the trailer's lengths may have changed.
			size = len(s.encode())
		}
	}
}

func uvarintLen(v uint64) int { return len(binary.AppendUvarint(nil, v)) }

// stagedSession is a client session as one entry changes it. A MultiWrite
// entry carries many ops of one session; rewriting the whole record (up to
// MaxDonePerSession results) for each op made the entry's transaction grow
// quadratically: 500 keys of one shard in one MultiPut, from a client with
// other batches in flight, passed badger's transaction limit, a fatal apply
// error that stopped every replica of the group.
type stagedSession struct {
	shard  int
	client uint64
	sess   *session
	stored int64 // LastNS as stored (the expiry index key), 0 if none
	dirty  bool
}

// session returns client's session in shard s, read once per entry.
func (a *applyCtx) session(s int, client uint64) (*stagedSession, error) {
	sk := sessionKey(s, client)
	if st, ok := a.sessions[string(sk)]; ok {
		return st, nil
	}
	st := &stagedSession{shard: s, client: client, sess: &session{}}
	v, err := a.value(sk)
	if err != nil {
		return nil, err
	}
	if v != nil {
		if st.sess, err = decodeSession(v); err != nil {
			return nil, fmt.Errorf("%w: %v", errBadRecord, err)
		}
		st.stored = st.sess.LastNS
	}
	a.sessions[string(sk)] = st
	return st, nil
}

// flushSessions writes the sessions the current entry changed, with their
// expiry index entries. It runs after every entry, so no other command ever
// sees a session older than the transaction's.
func (a *applyCtx) flushSessions() error {
	dirty := 0
	for _, st := range a.sessions {
		if st.dirty {
			dirty++
		}
	}
	if dirty == 0 {
		clear(a.sessions)
		return nil
	}
	// The entry's session records share EntrySessionBytes (worstCase
	// counts on it): a command touching many shards keeps fewer results
	// per session. Trimming is always safe (see MaxDonePerSession).
	limit := min(MaxSessionBytes, EntrySessionBytes/dirty)
	for sk, st := range a.sessions {
		if !st.dirty {
			continue
		}
		st.sess.fit(limit)
		if st.stored != 0 && st.stored != st.sess.LastNS {
			if err := a.del(expiryKey(st.stored, st.shard, st.client)); err != nil {
				return err
			}
		}
		if err := a.set(expiryKey(st.sess.LastNS, st.shard, st.client), nil); err != nil {
			return err
		}
		if err := a.set([]byte(sk), st.sess.encode()); err != nil {
			return err
		}
	}
	clear(a.sessions)
	return nil
}
