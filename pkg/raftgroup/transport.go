package raftgroup

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

const (
	peerQueueLen   = 4096
	maxBatchBytes  = 4 << 20
	snapshotChunk  = 1 << 20
	maxBackoff     = 5 * time.Second
	initialBackoff = 50 * time.Millisecond
)

// transport sends Raft messages to peers over gRPC streams. Each peer has its
// own bounded queue and sender goroutine: a slow or dead peer fills its own
// queue and loses messages (Raft retransmits), but never blocks the Ready loop
// or the other peers.
type transport struct {
	r     *Replica
	mu    sync.Mutex
	peers map[uint64]*peerSender
	snaps map[uint64]bool // peers with a snapshot in flight
	stopc chan struct{}
	wg    sync.WaitGroup
}

func newTransport(r *Replica) *transport {
	return &transport{r: r, peers: map[uint64]*peerSender{}, snaps: map[uint64]bool{}, stopc: make(chan struct{})}
}

func (t *transport) stop() {
	t.mu.Lock()
	select {
	case <-t.stopc:
	default:
		close(t.stopc)
	}
	t.mu.Unlock()
	t.wg.Wait()
}

func (t *transport) send(msgs []*pb.Message) {
	for _, m := range msgs {
		to := m.GetTo()
		copies, delay := 1, time.Duration(0)
		if f := t.r.cfg.Filter; f != nil {
			copies, delay = f.Outgoing(t.r.cfg.ID, to, m)
		}
		if copies == 0 {
			t.r.metrics.MessagesDropped.Add(1)
			if m.GetType() == pb.MsgSnap {
				t.r.node.ReportSnapshot(to, raft.SnapshotFailure)
			}
			continue
		}
		if m.GetType() == pb.MsgSnap {
			t.startSnapshot(m)
			continue
		}
		p := t.peer(to)
		if p == nil {
			continue
		}
		for range copies {
			if delay > 0 {
				time.AfterFunc(delay, func() { p.enqueue(m) })
			} else {
				p.enqueue(m)
			}
		}
	}
}

func (t *transport) peer(id uint64) *peerSender {
	t.mu.Lock()
	defer t.mu.Unlock()
	select {
	case <-t.stopc:
		return nil
	default:
	}
	p, ok := t.peers[id]
	if !ok {
		p = &peerSender{t: t, id: id, q: make(chan *pb.Message, peerQueueLen), stopc: make(chan struct{})}
		t.peers[id] = p
		t.wg.Add(1)
		go p.run()
	}
	return p
}

func (t *transport) removePeer(id uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p, ok := t.peers[id]; ok {
		delete(t.peers, id)
		// Stop the sender only after a grace period: the messages already
		// queued include the one carrying the commit of this removal, and
		// without it the removed replica never learns it was removed (it
		// keeps campaigning and reports itself a follower forever).
		grace := time.Duration(t.r.cfg.ElectionTicks) * t.r.cfg.TickInterval
		time.AfterFunc(grace, func() { close(p.stopc) })
	}
}

type peerSender struct {
	t     *transport
	id    uint64
	q     chan *pb.Message
	stopc chan struct{}
}

func (p *peerSender) enqueue(m *pb.Message) {
	select {
	case p.q <- m:
	default:
		p.t.r.metrics.MessagesDropped.Add(1)
		p.t.r.node.ReportUnreachable(p.id)
	}
}

func (p *peerSender) run() {
	defer p.t.wg.Done()
	r := p.t.r
	backoff := initialBackoff
	for {
		err := p.stream()
		select {
		case <-p.t.stopc:
			return
		case <-p.stopc:
			return
		default:
		}
		if err != nil {
			r.log.Debug("raft stream to peer broken", "peer", p.id, "err", err)
			r.node.ReportUnreachable(p.id)
		}
		// Messages queued while disconnected are stale; raft will resend.
		for len(p.q) > 0 {
			<-p.q
			r.metrics.MessagesDropped.Add(1)
		}
		sleep := backoff/2 + rand.N(backoff/2+1)
		select {
		case <-time.After(sleep):
		case <-p.t.stopc:
			return
		case <-p.stopc:
			return
		}
		backoff = min(2*backoff, maxBackoff)
		if err == nil {
			backoff = initialBackoff
		}
	}
}

// stream opens one Send stream and pumps batches into it until it fails.
func (p *peerSender) stream() error {
	r := p.t.r
	addr := r.memberAddr(p.id)
	if addr == "" {
		// Wait for a message so we do not spin; without an address it is lost.
		select {
		case <-p.q:
			r.metrics.MessagesDropped.Add(1)
			return fmt.Errorf("no address known for replica %d", p.id)
		case <-p.t.stopc:
			return nil
		case <-p.stopc:
			return nil
		}
	}
	conn, err := r.dialPeer(addr)
	if err != nil {
		return fmt.Errorf("dial %s: %w", addr, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-p.t.stopc:
		case <-p.stopc:
		case <-ctx.Done():
		}
		cancel()
	}()
	stream, err := shardkvpb.NewRaftClient(conn).Send(ctx)
	if err != nil {
		return fmt.Errorf("open stream to %s: %w", addr, err)
	}
	batch := &shardkvpb.RaftBatch{GroupId: r.cfg.GroupID, From: r.cfg.ID, To: p.id, FromAddr: r.cfg.Addr}
	limit := MessageBytesFor(r.cfg.MaxCommandBytes) - messageOverhead/2
	var next []byte // a message that did not fit the previous batch
	for {
		batch.Messages = batch.Messages[:0]
		size := 0
		if next != nil {
			batch.Messages, size, next = append(batch.Messages, next), len(next), nil
		}
		for size < maxBatchBytes {
			var m *pb.Message
			if len(batch.Messages) == 0 {
				select {
				case m = <-p.q:
				case <-ctx.Done():
					return nil
				}
			} else {
				select {
				case m = <-p.q:
				default:
				}
			}
			if m == nil {
				break
			}
			b, err := proto.Marshal(m)
			if err != nil {
				return err
			}
			if len(b) > limit {
				r.log.Error("raft message exceeds the transport limit; dropped", "peer", p.id, "bytes", len(b), "limit", limit)
				r.metrics.MessagesDropped.Add(1)
				continue
			}
			if len(batch.Messages) > 0 && size+len(b) > limit {
				// Sent first in the next batch: a batch never exceeds the
				// message limit, whatever the mix of big and small messages.
				next = b
				break
			}
			batch.Messages = append(batch.Messages, b)
			size += len(b)
		}
		if len(batch.Messages) == 0 {
			continue
		}
		batch.SentUnixNanos = unixNanos(r.cfg.Now())
		if err := stream.Send(batch); err != nil {
			if err == io.EOF {
				_, err = stream.CloseAndRecv()
			}
			return err
		}
	}
}

// raftServer receives other replicas' traffic.
type raftServer struct {
	shardkvpb.UnimplementedRaftServer
	r *Replica
}

func (s *raftServer) check(group, to, from uint64, fromAddr string) error {
	r := s.r
	if group != r.cfg.GroupID || to != r.cfg.ID {
		return status.Errorf(codes.FailedPrecondition,
			"message for group %d replica %d reached group %d replica %d (stale address?)", group, to, r.cfg.GroupID, r.cfg.ID)
	}
	if fromAddr != "" && from != 0 {
		// Learn addresses we do not know yet (a joining replica does not
		// know its peers until it sees its first snapshot or entries).
		r.membersMu.Lock()
		if _, ok := r.members[from]; !ok {
			r.members[from] = fromAddr
		}
		r.membersMu.Unlock()
	}
	return nil
}

// implausible reports a message no correct peer sends and that would make
// raft panic (stopping the process): a heartbeat whose commit is past the
// end of our durable log (a leader sends min(match, committed), and match
// is durable here). Peers are not authenticated yet; this guard closes only
// the simplest forgery, see docs/shardkv.md.
func (s *raftServer) implausible(m *pb.Message) bool {
	if m.GetType() != pb.MsgHeartbeat {
		return false
	}
	last, err := s.r.store.LastIndex()
	return err == nil && m.GetCommit() > last
}

func (s *raftServer) Send(stream shardkvpb.Raft_SendServer) error {
	ctx := stream.Context()
	for {
		batch, err := stream.Recv()
		if err == io.EOF {
			return stream.SendAndClose(&shardkvpb.RaftAck{})
		}
		if err != nil {
			return err
		}
		if err := s.check(batch.GroupId, batch.To, batch.From, batch.FromAddr); err != nil {
			return err
		}
		s.r.heard.note(batch.From)
		s.r.clock.report(batch.From, batch.SentUnixNanos)
		for _, b := range batch.Messages {
			m := &pb.Message{}
			if err := proto.Unmarshal(b, m); err != nil {
				return status.Errorf(codes.InvalidArgument, "bad raft message: %v", err)
			}
			if s.implausible(m) {
				s.r.metrics.MessagesDropped.Add(1)
				continue
			}
			if t := m.GetType(); t == pb.MsgApp || t == pb.MsgHeartbeat {
				storeMax(&s.r.leaderCommit, m.GetCommit())
			}
			if err := s.r.node.Step(ctx, m); err != nil {
				if err == raft.ErrStopped {
					return status.Error(codes.Unavailable, "replica stopped")
				}
				return err
			}
		}
	}
}

// storeMax raises v to x if x is larger.
func storeMax(v *atomic.Uint64, x uint64) {
	for {
		old := v.Load()
		if x <= old || v.CompareAndSwap(old, x) {
			return
		}
	}
}
