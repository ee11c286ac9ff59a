package kvctl

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/shardkv/shardkv/pkg/grpcdial"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// memberJSON is one replica of a group, as seen by itself (role, term,
// indexes) and by the group's leader (learner, match).
type memberJSON struct {
	ID   uint64 `json:"id"`
	Addr string `json:"addr"`
	// Role is what the replica says it is: leader, follower, candidate,
	// learner, removed or joining; "unreachable" if it did not answer.
	Role      string `json:"role"`
	Learner   bool   `json:"learner"`
	Reachable bool   `json:"reachable"`
	Term      uint64 `json:"term"`
	Commit    uint64 `json:"commit"`
	Applied   uint64 `json:"applied"`
	// Match is the highest log index the leader knows this member has (0
	// when the leader is unknown).
	Match uint64 `json:"match"`
	// Member is false for an address that answered but is not in the
	// group's membership (a joining or removed replica).
	Member bool   `json:"member"`
	Error  string `json:"error,omitempty"`
}

// groupView is a group's membership as found by asking its replicas.
type groupView struct {
	groupID    uint64
	leader     *shardkvpb.MemberStatus // nil if no reachable leader
	leaderAddr string
	term       uint64
	members    []memberJSON
}

// viewGroup asks the seed addresses (and every member they name) for their
// status, with short timeouts, and assembles the membership. Seeds in show
// that are not members are listed too (a configured address that is no
// longer a member); other seeds only help find the group. known, if set, is
// a status already obtained from the leader (the controller's).
func (k *kvctl) viewGroup(ctx context.Context, seeds, show []string, known *shardkvpb.MemberStatus) *groupView {
	sts, errs := k.memberStatuses(ctx, seeds)
	queried := map[string]bool{}
	for _, a := range seeds {
		queried[a] = true
	}
	ask := func(addrs []string) {
		var todo []string
		for _, a := range addrs {
			if a != "" && !queried[a] {
				queried[a] = true
				todo = append(todo, a)
			}
		}
		if len(todo) == 0 {
			return
		}
		s2, e2 := k.memberStatuses(ctx, todo)
		for a, st := range s2 {
			sts[a] = st
		}
		for a, err := range e2 {
			errs[a] = err
		}
	}
	findLeader := func() (*shardkvpb.MemberStatus, string) {
		var best *shardkvpb.MemberStatus
		var bestAddr string
		for _, a := range sortedKeys(sts) {
			if st := sts[a]; st.Role == "leader" && (best == nil || st.Term > best.Term) {
				best, bestAddr = st, a
			}
		}
		return best, bestAddr
	}
	v := &groupView{}
	v.leader, v.leaderAddr = findLeader()
	if v.leader == nil && known != nil && known.Role == "leader" {
		ask([]string{known.Addr})
		v.leader, v.leaderAddr = findLeader()
		if v.leader == nil && sts[known.Addr] == nil {
			v.leader, v.leaderAddr = known, known.Addr
		}
	}
	if v.leader == nil {
		// Follow the hints of the replicas that answered.
		var hints []string
		for _, st := range sts {
			hints = append(hints, st.LeaderAddr)
		}
		slices.Sort(hints)
		ask(hints)
		v.leader, v.leaderAddr = findLeader()
	}
	// The membership: the leader's view, else the most up-to-date replica's.
	src := v.leader
	if src == nil {
		for _, a := range sortedKeys(sts) {
			st := sts[a]
			if st.Role != "removed" && st.Role != "joining" && (src == nil || st.Term > src.Term || (st.Term == src.Term && st.Applied > src.Applied)) {
				src = st
			}
		}
	}
	if src != nil {
		v.groupID, v.term = src.GroupId, src.Term
		var addrs []string
		for _, m := range src.Members {
			addrs = append(addrs, m.Addr)
		}
		ask(addrs)
	}
	inMembers := map[string]bool{}
	if src != nil {
		for _, m := range src.Members {
			row := memberJSON{ID: m.Id, Addr: m.Addr, Learner: m.Learner, Member: true}
			if v.leader != nil {
				row.Match = m.Match
			}
			inMembers[m.Addr] = true
			fill(&row, sts[m.Addr], errs[m.Addr])
			v.members = append(v.members, row)
		}
	}
	// Addresses that were given but are not members; with no membership
	// known, every seed.
	for _, a := range seeds {
		if inMembers[a] || (src != nil && !slices.Contains(show, a)) {
			continue
		}
		inMembers[a] = true
		row := memberJSON{Addr: a}
		if st := sts[a]; st != nil {
			row.ID = st.Id
		}
		fill(&row, sts[a], errs[a])
		v.members = append(v.members, row)
	}
	slices.SortFunc(v.members, func(a, b memberJSON) int {
		if c := cmp.Compare(a.ID, b.ID); c != 0 {
			return c
		}
		return strings.Compare(a.Addr, b.Addr)
	})
	return v
}

func fill(row *memberJSON, st *shardkvpb.MemberStatus, err error) {
	switch {
	case st != nil:
		row.Reachable = true
		row.Role, row.Term, row.Commit, row.Applied = st.Role, st.Term, st.Commit, st.Applied
		if row.ID != 0 && st.Id != row.ID {
			row.Error = fmt.Sprintf("the address answers as replica %d", st.Id)
		}
	case err != nil:
		row.Role, row.Error = "unreachable", oneLine(err)
	default:
		row.Role, row.Error = "unreachable", "not asked"
	}
}

func num(v uint64, known bool) string {
	if !known {
		return "-"
	}
	return strconv.FormatUint(v, 10)
}

// membersTable writes rows as a table; withGroup prefixes a GROUP column.
func membersTable(tw io.Writer, group string, rows []memberJSON, leaderKnown bool) {
	for _, m := range rows {
		role := m.Role
		if !m.Member && m.Reachable {
			role += " (not a member)"
		}
		note := ""
		if m.Error != "" {
			note = m.Error
		}
		prefix := ""
		if group != "" {
			prefix = group + "\t"
		}
		fmt.Fprintf(tw, "%s%s\t%s\t%s\t%s\t%s\t%s\t%s\n", prefix, num(m.ID, m.ID != 0), m.Addr, role,
			num(m.Term, m.Reachable), num(m.Applied, m.Reachable), num(m.Match, leaderKnown && m.Member), note)
	}
}

// --- addressing a group ---

type target struct {
	desc   string // for messages: "group 3", "the controller group", "127.0.0.1:7000"
	addrs  []string
	gid    uint64            // the data group, with --group <gid>
	config *shardkvpb.Config // the latest config, with --group <gid>
	group  *shardkvpb.Group  // the group's entry in it (nil if not joined)
}

func targetFlags(fs *flag.FlagSet) (group, server *string) {
	return fs.String("group", "", ""), fs.String("server", "", "")
}

func (k *kvctl) resolveTarget(ctx context.Context, group, server string) (*target, error) {
	switch {
	case group != "" && server != "":
		return nil, usagef(nil, "give --group or --server, not both")
	case server != "":
		var addrs []string
		for _, a := range strings.Split(server, ",") {
			if a = strings.TrimSpace(a); a != "" {
				addrs = append(addrs, a)
			}
		}
		if len(addrs) == 0 {
			return nil, usagef(nil, "--server needs an address")
		}
		return &target{desc: strings.Join(addrs, ","), addrs: addrs}, nil
	case group == "ctrler" || group == "controller":
		addrs, err := k.resolveCtrler()
		if err != nil {
			return nil, err
		}
		return &target{desc: "the controller group", addrs: addrs}, nil
	case group != "":
		gid, err := strconv.ParseUint(group, 10, 64)
		if err != nil || gid == 0 {
			return nil, usagef(nil, "--group must be a gid or \"ctrler\", not %q", group)
		}
		ctrl, err := k.ctrler()
		if err != nil {
			return nil, err
		}
		conf, err := ctrl.Query(ctx, -1)
		if err != nil {
			return nil, k.ctrlErr(err)
		}
		t := &target{desc: fmt.Sprintf("group %d", gid), gid: gid, config: conf, group: findGroup(conf, gid)}
		if t.group != nil {
			for _, s := range t.group.Servers {
				t.addrs = append(t.addrs, s.Addr)
			}
			return t, nil
		}
		// Not in the config (never joined, or left): maybe it still reports.
		st, err := ctrl.Status(ctx)
		if err != nil {
			return nil, k.ctrlErr(err)
		}
		for _, g := range st.Groups {
			if g.Report.GetGid() == gid {
				for _, m := range g.Report.Members {
					t.addrs = append(t.addrs, m.Addr)
				}
			}
		}
		if len(t.addrs) == 0 {
			return nil, fmt.Errorf("group %d is not in config %d and has not reported to the controller; address its replicas with --server HOST:PORT[,...]", gid, conf.Num)
		}
		return t, nil
	}
	return nil, usagef(nil, "give --group <gid>, --group ctrler or --server <addr>")
}

// leaderCall runs a membership call on the group's leader: it starts with
// the replica that says it leads, follows NOT_LEADER hints, and retries
// calls that were not executed until ctx ends.
func (k *kvctl) leaderCall(ctx context.Context, t *target, call func(context.Context, shardkvpb.AdminClient) error) (string, error) {
	v := k.viewGroup(ctx, t.addrs, t.addrs, nil)
	order := []string{}
	if v.leaderAddr != "" {
		order = append(order, v.leaderAddr)
	}
	for _, a := range t.addrs {
		if !slices.Contains(order, a) {
			order = append(order, a)
		}
	}
	notExecuted := 0
	opts := grpcdial.CallOptions{
		Backoff: grpcdial.Backoff{Base: 50 * time.Millisecond, Max: time.Second},
		// NOT_EXECUTED also carries refusals that will not change
		// (removing the leader, promoting a voter): give up after a few
		// tries and show the replica's reason.
		Final: func(err error) bool {
			return !retryable(err) || shardkvpb.Reason(err) == shardkvpb.ReasonNotExecuted && notExecuted >= maxNotExecuted
		},
	}
	var at string // the replica of the last attempt
	err := grpcdial.NewCaller(k.pool).Call(ctx, 0, order, opts, func(ctx context.Context, addr string, cc *grpc.ClientConn) error {
		at = addr
		err := call(ctx, shardkvpb.NewAdminClient(cc))
		if shardkvpb.Reason(err) == shardkvpb.ReasonNotExecuted {
			notExecuted++
		}
		return err
	})
	if err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return "", fmt.Errorf("no leader of %s took the request within %v (last error: %s: %s)", t.desc, k.timeout, at, lastError(err))
	}
	return at, err
}

// maxNotExecuted bounds the retries of a membership call its leader
// answered NOT_EXECUTED (about a second with the backoff).
const maxNotExecuted = 5

func retryable(err error) bool {
	if shardkvpb.Retryable(err) {
		return true
	}
	// A transport failure (connection refused) carries no reason: the
	// request never reached the replica.
	return shardkvpb.Reason(err) == "" && status.Code(err) == codes.Unavailable
}

// --- commands ---

func cmdMemberList(k *kvctl, args []string) error {
	fs := newFlags("member list")
	group, server := targetFlags(fs)
	if _, err := k.parse(fs, args, 0, 0); err != nil {
		return err
	}
	ctx, cancel := k.ctx()
	defer cancel()
	t, err := k.resolveTarget(ctx, *group, *server)
	if err != nil {
		return err
	}
	v := k.viewGroup(ctx, t.addrs, t.addrs, nil)
	reachable := false
	for _, m := range v.members {
		reachable = reachable || m.Reachable
	}
	if !reachable {
		return fmt.Errorf("no replica of %s answered (%s)", t.desc, strings.Join(t.addrs, ","))
	}
	if k.json {
		out := struct {
			GroupID    uint64       `json:"group_id"`
			Leader     uint64       `json:"leader"`
			LeaderAddr string       `json:"leader_addr"`
			Term       uint64       `json:"term"`
			Members    []memberJSON `json:"members"`
		}{GroupID: v.groupID, Term: v.term, LeaderAddr: v.leaderAddr, Members: v.members}
		if v.leader != nil {
			out.Leader = v.leader.Id
		}
		return k.printJSON(out)
	}
	if v.leader != nil {
		fmt.Fprintf(k.stdout, "group %d: leader %d (%s), term %d\n", v.groupID, v.leader.Id, v.leaderAddr, v.term)
	} else {
		fmt.Fprintf(k.stdout, "group %d: no reachable leader\n", v.groupID)
	}
	tw := tabwriter.NewWriter(k.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tADDR\tROLE\tTERM\tAPPLIED\tMATCH\tNOTE")
	membersTable(tw, "", v.members, v.leader != nil)
	return tw.Flush()
}

// membershipJSON is the --json output of member add, promote and remove.
type membershipJSON struct {
	GroupID uint64             `json:"group_id"`
	Members []membershipMember `json:"members"`
	// Config is the config made to route to the new voters (member promote
	// and remove with --group <gid>), if one was made.
	Config *configJSON `json:"config,omitempty"`
}

type membershipMember struct {
	ID      uint64 `json:"id"`
	Addr    string `json:"addr"`
	Learner bool   `json:"learner"`
}

func (k *kvctl) membershipOutput(ctx context.Context, t *target, leaderAddr, done string, ms []*shardkvpb.Member, conf *shardkvpb.Config) error {
	var gid uint64
	if st, err := k.memberStatus(ctx, leaderAddr); err == nil {
		gid = st.GroupId
	} else if t.gid != 0 {
		gid = t.gid
	}
	if k.json {
		out := membershipJSON{GroupID: gid, Members: []membershipMember{}}
		for _, m := range ms {
			out.Members = append(out.Members, membershipMember{ID: m.Id, Addr: m.Addr, Learner: m.Learner})
		}
		if conf != nil {
			c := toConfigJSON(conf)
			out.Config = &c
		}
		return k.printJSON(out)
	}
	fmt.Fprintln(k.stdout, done)
	tw := tabwriter.NewWriter(k.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tADDR\tVOTER")
	for _, m := range ms {
		fmt.Fprintf(tw, "%d\t%s\t%v\n", m.Id, m.Addr, !m.Learner)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if conf != nil {
		g := findGroup(conf, t.gid)
		gs, _ := serversText(g)
		fmt.Fprintf(k.stdout, "config %d: clients of group %d now use %s\n", conf.Num, t.gid, gs)
	}
	return nil
}

func memberArgs(k *kvctl, name string, args []string, n int, update bool) (pos []string, t *target, upd bool, ctx context.Context, cancel context.CancelFunc, err error) {
	fs := newFlags(name)
	group, server := targetFlags(fs)
	var updateConfig *bool
	if update {
		updateConfig = fs.Bool("update-config", true, "")
	}
	if pos, err = k.parse(fs, args, n, n); err != nil {
		return
	}
	if _, err = parseUint("replica id", pos[0]); err != nil {
		return
	}
	ctx, cancel = k.ctx()
	if t, err = k.resolveTarget(ctx, *group, *server); err != nil {
		cancel()
		return
	}
	upd = updateConfig != nil && *updateConfig
	return
}

func cmdMemberAdd(k *kvctl, args []string) error {
	pos, t, _, ctx, cancel, err := memberArgs(k, "member add", args, 2, false)
	if err != nil {
		return err
	}
	defer cancel()
	id, _ := strconv.ParseUint(pos[0], 10, 64)
	var rep *shardkvpb.MembershipResponse
	leader, err := k.leaderCall(ctx, t, func(ctx context.Context, cl shardkvpb.AdminClient) (err error) {
		rep, err = cl.AddLearner(ctx, &shardkvpb.AddLearnerRequest{Id: id, Addr: pos[1]})
		return err
	})
	if err != nil {
		return fmt.Errorf("member add %d to %s: %s", id, t.desc, oneLine(err))
	}
	how := "--server " + strings.Join(t.addrs, ",")
	if t.gid != 0 {
		how = fmt.Sprintf("--group %d", t.gid)
	} else if t.desc == "the controller group" {
		how = "--group ctrler"
	}
	return k.membershipOutput(ctx, t, leader, fmt.Sprintf("replica %d (%s) added to %s as a learner; once it has caught up (see kvctl member list %s): kvctl member promote %d %s",
		id, pos[1], t.desc, how, id, how), rep.Members, nil)
}

func cmdMemberPromote(k *kvctl, args []string) error {
	return changeVoters(k, "member promote", args, func(ctx context.Context, cl shardkvpb.AdminClient, id uint64) (*shardkvpb.MembershipResponse, error) {
		return cl.Promote(ctx, &shardkvpb.PromoteRequest{Id: id})
	}, "promoted to a voter")
}

func cmdMemberRemove(k *kvctl, args []string) error {
	return changeVoters(k, "member remove", args, func(ctx context.Context, cl shardkvpb.AdminClient, id uint64) (*shardkvpb.MembershipResponse, error) {
		return cl.RemoveMember(ctx, &shardkvpb.RemoveMemberRequest{Id: id})
	}, "removed")
}

// changeVoters runs promote or remove; for a data group in the config it
// then updates the group's servers in the config (a re-Join with the same
// weight), so clients route to the new set of voters.
func changeVoters(k *kvctl, name string, args []string, op func(context.Context, shardkvpb.AdminClient, uint64) (*shardkvpb.MembershipResponse, error), did string) error {
	pos, t, upd, ctx, cancel, err := memberArgs(k, name, args, 1, true)
	if err != nil {
		return err
	}
	defer cancel()
	id, _ := strconv.ParseUint(pos[0], 10, 64)
	var rep *shardkvpb.MembershipResponse
	leader, err := k.leaderCall(ctx, t, func(ctx context.Context, cl shardkvpb.AdminClient) (err error) {
		rep, err = op(ctx, cl, id)
		return err
	})
	if err != nil {
		return fmt.Errorf("%s %d in %s: %s", name, id, t.desc, oneLine(err))
	}
	done := fmt.Sprintf("replica %d of %s %s", id, t.desc, did)
	var conf *shardkvpb.Config
	if upd && t.group != nil {
		if conf, err = k.routeToVoters(ctx, t, rep.Members); err != nil {
			k.membershipOutput(ctx, t, leader, done, rep.Members, nil)
			return fmt.Errorf("%s, but updating group %d's servers in the config failed: %s (retry with kvctl join)", done, t.gid, oneLine(err))
		}
	}
	return k.membershipOutput(ctx, t, leader, done, rep.Members, conf)
}

// routeToVoters re-joins group t.gid with its voters as servers, keeping its
// weight. It returns nil if the config already lists exactly those.
func (k *kvctl) routeToVoters(ctx context.Context, t *target, ms []*shardkvpb.Member) (*shardkvpb.Config, error) {
	old := map[uint64]*shardkvpb.Server{}
	for _, s := range t.group.Servers {
		old[s.Id] = s
	}
	g := &shardkvpb.Group{Gid: t.gid, Weight: t.group.Weight}
	for _, m := range ms {
		if m.Learner {
			continue
		}
		if s, ok := old[m.Id]; ok {
			g.Servers = append(g.Servers, &shardkvpb.Server{Id: s.Id, Addr: s.Addr, RespAddr: s.RespAddr, RespTlsAddr: s.RespTlsAddr})
			continue
		}
		s := &shardkvpb.Server{Id: m.Id, Addr: m.Addr}
		if st, err := k.memberStatus(ctx, m.Addr); err == nil {
			s.RespAddr, s.RespTlsAddr = st.RespAddr, st.RespTlsAddr
		}
		g.Servers = append(g.Servers, s)
	}
	slices.SortFunc(g.Servers, func(a, b *shardkvpb.Server) int { return cmp.Compare(a.Id, b.Id) })
	same := len(g.Servers) == len(t.group.Servers)
	for i := 0; same && i < len(g.Servers); i++ {
		a, b := g.Servers[i], t.group.Servers[i]
		same = a.Id == b.Id && a.Addr == b.Addr && a.RespAddr == b.RespAddr && a.RespTlsAddr == b.RespTlsAddr
	}
	if same {
		return nil, nil
	}
	if t.group.Leaving {
		// A Join of a leaving group takes it back: not what a member
		// change means.
		return nil, fmt.Errorf("group %d is leaving: a Join with its new servers would take it back (until its last shard is cut over, the config keeps its old servers)", t.gid)
	}
	if len(g.Servers) == 0 {
		return nil, errors.New("the group has no voters")
	}
	ctrl, err := k.ctrler()
	if err != nil {
		return nil, err
	}
	c, err := ctrl.Join(ctx, g)
	return c, k.ctrlErr(err)
}

func cmdTransferLeader(k *kvctl, args []string) error {
	pos, t, _, ctx, cancel, err := memberArgs(k, "transfer-leader", args, 1, false)
	if err != nil {
		return err
	}
	defer cancel()
	id, _ := strconv.ParseUint(pos[0], 10, 64)
	var rep *shardkvpb.TransferLeaderResponse
	_, err = k.leaderCall(ctx, t, func(ctx context.Context, cl shardkvpb.AdminClient) (err error) {
		rep, err = cl.TransferLeader(ctx, &shardkvpb.TransferLeaderRequest{To: id})
		return err
	})
	if err != nil {
		return fmt.Errorf("transfer-leader to %d in %s: %s", id, t.desc, oneLine(err))
	}
	if k.json {
		return k.printJSON(struct {
			Leader uint64 `json:"leader"`
		}{rep.Leader})
	}
	_, err = fmt.Fprintf(k.stdout, "replica %d now leads %s\n", rep.Leader, t.desc)
	return err
}
