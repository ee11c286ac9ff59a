package node

import (
	"context"
	"time"

	"github.com/shardkv/shardkv/pkg/shardkv"
)

// handoverGrace is how long a replica that led stays up, redirecting, after
// the controller names another leader of its group: every front end polls
// the controller within LeaderPollInterval, and a client that loaded the old
// topology before then has another interval to send here and be redirected.
const handoverGrace = 2*shardkv.LeaderPollInterval + 500*time.Millisecond

// handOverClients keeps a stopping data-group replica that led its group
// (led), or that the controller still names as its leader, serving as a
// follower until the cluster's front ends name the new leader, and
// handoverGrace after, bounded by deadline. Until then other front ends'
// CLUSTER SLOTS still send clients here, and a client that finds the port
// closed gets no redirect to correct it: go-redis, for one, retries a dead
// master until its topology is a minute old. A follower the controller does
// not name returns at once, as does a replica that cannot reach the
// controller (nothing anyone learns by waiting) or that still leads (its
// transfer failed: only its exit lets another take over).
func (n *Node) handOverClients(deadline time.Time, led bool) {
	if n.resp == nil || n.ctrl == nil {
		return
	}
	var elsewhere time.Time // when the controller first named another leader
	for time.Now().Before(deadline) && !n.replica.IsLeader() {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		st, err := n.ctrl.StatusStale(ctx)
		cancel()
		if err != nil {
			return
		}
		var named uint64
		for _, g := range st.GetGroups() {
			if r := g.GetReport(); r.GetGid() == n.opts.Group {
				named = r.GetLeaderId()
			}
		}
		switch {
		case named == n.replica.ID():
			led, elsewhere = true, time.Time{}
		case !led:
			return
		case elsewhere.IsZero():
			elsewhere = time.Now()
			n.log.Info("handing over: the controller names another leader; redirecting clients a while longer", "leader", named, "for", handoverGrace)
		case time.Since(elsewhere) >= handoverGrace:
			return
		}
		time.Sleep(min(100*time.Millisecond, time.Until(deadline)))
	}
}
