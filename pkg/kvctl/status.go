package kvctl

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// statusJSON is the --json output of status.
type statusJSON struct {
	NShards      int               `json:"nshards"`
	ConfigNum    uint64            `json:"config_num"`
	OldestConfig uint64            `json:"oldest_config"`
	Settled      bool              `json:"settled"`
	Controller   controllerJSON    `json:"controller"`
	Groups       []groupStatusJSON `json:"groups"`
	Migrations   []migrationJSON   `json:"migrations"`
	// PlannedMoves are the latest config's planned moves, with the
	// target's pre-copy progress where it reports it.
	PlannedMoves []plannedStatusJSON `json:"planned_moves"`
	Config       configJSON          `json:"config"`
}

type plannedStatusJSON struct {
	Shard       uint32 `json:"shard"`
	FromGID     uint64 `json:"from_gid"`
	ToGID       uint64 `json:"to_gid"`
	SinceConfig uint64 `json:"since_config"`
	// TargetState is the target's state of the shard ("PreCopying" while
	// it copies; "" if it reports none yet).
	TargetState string `json:"target_state"`
	copyJSON
}

// copyJSON is a shard copy's progress as the receiving group reports it
// (PreCopying, Pulling, Acking); both status tables embed it.
type copyJSON struct {
	Phase        string `json:"phase"`      // snapshot, delta
	Keys         uint64 `json:"keys"`       // received so far
	TotalKeys    uint64 `json:"total_keys"` // keys in the shard at the source (0: not known yet)
	Bytes        uint64 `json:"bytes"`      // received so far
	TotalBytes   uint64 `json:"total_bytes"`
	LagEntries   uint64 `json:"lag_entries"`
	CaughtUp     bool   `json:"caught_up"`
	WritePauseUs uint64 `json:"write_pause_us"`
	// The copy's measured rate and the snapshot's time left at it (0: unknown).
	BytesPerSec uint64 `json:"copy_bytes_per_sec"`
	EtaSeconds  uint64 `json:"eta_seconds"`
}

func copyOf(s *shardkvpb.ShardState) copyJSON {
	return copyJSON{Phase: s.Phase, Keys: s.Keys, TotalKeys: s.TotalKeys, Bytes: s.Bytes, TotalBytes: s.TotalBytes,
		LagEntries: s.LagEntries, CaughtUp: s.CaughtUp, WritePauseUs: s.WritePauseUs, BytesPerSec: s.CopyBytesPerSec, EtaSeconds: s.EtaSeconds}
}

type controllerJSON struct {
	GroupID    uint64       `json:"group_id"`
	Leader     uint64       `json:"leader"`
	LeaderAddr string       `json:"leader_addr"`
	Term       uint64       `json:"term"`
	Applied    uint64       `json:"applied"`
	Members    []memberJSON `json:"members"`
}

type groupStatusJSON struct {
	GID         uint64 `json:"gid"`
	InConfig    bool   `json:"in_config"`
	Weight      uint32 `json:"weight"`
	OwnedShards int    `json:"owned_shards"`
	Leader      uint64 `json:"leader"`
	LeaderAddr  string `json:"leader_addr"`
	Term        uint64 `json:"term"`
	Applied     uint64 `json:"applied"`
	// ConfigNum is the config the group has applied.
	ConfigNum uint64 `json:"config_num"`
	// ShardStates counts the shards the group holds by state (Serving,
	// Pulling, Acking, BePulling, GCing).
	ShardStates map[string]int `json:"shard_states"`
	// InfoFrom says where leader/term/applied/config_num/shard_states come
	// from: "leader" (asked just now), "report" (the controller's copy of
	// the group's last report, ReportAgeMs old) or "none".
	InfoFrom    string       `json:"info_from"`
	ReportAgeMs int64        `json:"report_age_ms"` // -1: no report
	Members     []memberJSON `json:"members"`
	// Leaving: the group left and stays until its last shard is cut over.
	Leaving bool `json:"leaving"`
	// MigrateBytesPerSec is the group's copy rate limit for shards it
	// pulls, from its report (0: none, or not reported).
	MigrateBytesPerSec uint64 `json:"migrate_bytes_per_sec"`
	// Stranded says why the group cannot step to its next config (configs
	// it never applied were compacted and it owns shards across the gap:
	// its state went back, e.g. every disk lost); it then serves none of
	// its shards. Empty: it can step.
	Stranded string `json:"stranded"`
}

type migrationJSON struct {
	Shard     uint32 `json:"shard"`
	GID       uint64 `json:"gid"` // the group holding the shard in this state
	State     string `json:"state"`
	Source    uint64 `json:"source"`
	Target    uint64 `json:"target"`
	ConfigNum uint64 `json:"config_num"`
	copyJSON
}

func cmdStatus(k *kvctl, args []string) error {
	if _, err := k.parse(newFlags("status"), args, 0, 0); err != nil {
		return err
	}
	ctrl, ctx, cancel, err := k.ctrlerCall()
	if err != nil {
		return err
	}
	defer cancel()
	st, err := ctrl.Status(ctx)
	if err != nil {
		return k.ctrlErr(err)
	}
	out := k.buildStatus(ctx, st)
	if k.json {
		return k.printJSON(out)
	}
	return k.printStatus(out)
}

func (k *kvctl) buildStatus(ctx context.Context, st *shardkvpb.ClusterStatus) *statusJSON {
	latest := st.GetLatest()
	out := &statusJSON{NShards: int(st.Nshards), ConfigNum: latest.GetNum(), OldestConfig: st.OldestConfig,
		Config: toConfigJSON(latest), Groups: []groupStatusJSON{}, Migrations: []migrationJSON{}, PlannedMoves: []plannedStatusJSON{}}
	if out.NShards == 0 {
		out.NShards = len(latest.GetShards())
	}

	reports := map[uint64]*shardkvpb.GroupStatus{}
	var gids []uint64
	for _, g := range st.Groups {
		if g.Report == nil {
			continue
		}
		reports[g.Report.Gid] = g
		gids = append(gids, g.Report.Gid)
	}
	for _, g := range latest.GetGroups() {
		if reports[g.Gid] == nil {
			gids = append(gids, g.Gid)
		}
	}
	slices.Sort(gids)

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		out.Controller = k.controllerStatus(ctx, st.Controller)
	}()
	groups := make([]groupStatusJSON, len(gids))
	shardLists := make([][]*shardkvpb.ShardState, len(gids))
	for i, gid := range gids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			groups[i], shardLists[i] = k.groupStatus(ctx, latest, gid, reports[gid])
		}()
	}
	wg.Wait()
	out.Groups = groups

	out.Settled = len(latest.GetGroups()) > 0 && len(latest.GetMoves()) == 0
	shardOf := func(gid uint64, shard uint32) *shardkvpb.ShardState {
		for i, g := range groups {
			if g.GID == gid {
				for _, s := range shardLists[i] {
					if s.Shard == shard {
						return s
					}
				}
			}
		}
		return nil
	}
	for _, m := range latest.GetMoves() {
		p := plannedStatusJSON{Shard: m.Shard, FromGID: m.FromGid, ToGID: m.ToGid, SinceConfig: m.SinceConfig}
		if s := shardOf(m.ToGid, m.Shard); s != nil && s.State != "Serving" {
			p.TargetState, p.copyJSON = s.State, copyOf(s)
		}
		out.PlannedMoves = append(out.PlannedMoves, p)
	}
	for i, g := range groups {
		if g.Stranded != "" || (g.InConfig && (g.InfoFrom == "none" || g.ConfigNum != latest.GetNum())) {
			out.Settled = false
		}
		for _, s := range shardLists[i] {
			if s.State == "Serving" {
				continue
			}
			out.Settled = false
			m := migrationJSON{Shard: s.Shard, GID: g.GID, State: s.State, ConfigNum: s.ConfigNum, copyJSON: copyOf(s)}
			switch s.State {
			case "PreCopying", "Pulling", "Acking": // the new owner, or the planned one
				m.Source, m.Target = s.PeerGid, g.GID
			default: // BePulling, GCing: the old owner
				m.Source, m.Target = g.GID, s.PeerGid
			}
			out.Migrations = append(out.Migrations, m)
		}
	}
	slices.SortFunc(out.Migrations, func(a, b migrationJSON) int {
		if a.Shard != b.Shard {
			return cmp.Compare(uint64(a.Shard), uint64(b.Shard))
		}
		return cmp.Compare(a.GID, b.GID)
	})
	return out
}

func (k *kvctl) controllerStatus(ctx context.Context, leader *shardkvpb.MemberStatus) controllerJSON {
	var seeds []string
	for _, m := range leader.GetMembers() {
		seeds = append(seeds, m.Addr)
	}
	if len(seeds) == 0 {
		seeds = k.ctrlerAddrs
	}
	v := k.viewGroup(ctx, seeds, nil, leader)
	out := controllerJSON{GroupID: leader.GetGroupId(), Leader: leader.GetId(), LeaderAddr: leader.GetAddr(),
		Term: leader.GetTerm(), Applied: leader.GetApplied(), Members: v.members}
	if out.Members == nil {
		out.Members = []memberJSON{}
	}
	return out
}

func (k *kvctl) groupStatus(ctx context.Context, latest *shardkvpb.Config, gid uint64, rep *shardkvpb.GroupStatus) (groupStatusJSON, []*shardkvpb.ShardState) {
	out := groupStatusJSON{GID: gid, ReportAgeMs: -1, ShardStates: map[string]int{}, InfoFrom: "none"}
	var seeds, configured []string
	if rep != nil {
		out.MigrateBytesPerSec = rep.Report.GetMigrateBytesPerSec()
	}
	if g := findGroup(latest, gid); g != nil {
		out.InConfig, out.Weight, out.OwnedShards, out.Leaving = true, g.Weight, ownedShards(latest, gid), g.Leaving
		for _, s := range g.Servers {
			configured = append(configured, s.Addr)
		}
	}
	seeds = slices.Clone(configured)
	if rep != nil {
		out.ReportAgeMs = rep.AgeMs
		for _, m := range rep.Report.Members {
			if !slices.Contains(seeds, m.Addr) {
				seeds = append(seeds, m.Addr)
			}
		}
	}
	v := k.viewGroup(ctx, seeds, configured, nil)
	out.Members = v.members
	if out.Members == nil {
		out.Members = []memberJSON{}
	}
	var shards []*shardkvpb.ShardState
	if v.leaderAddr != "" {
		if info, err := k.groupInfo(ctx, v.leaderAddr); err == nil && info.Gid == gid {
			m := info.GetMember()
			out.InfoFrom = "leader"
			out.Leader, out.LeaderAddr, out.Term, out.Applied = m.GetId(), v.leaderAddr, m.GetTerm(), m.GetApplied()
			out.ConfigNum = info.GetConfig().GetNum()
			out.Stranded = info.GetStranded()
			shards = info.Shards
		}
	}
	if out.InfoFrom == "none" && rep != nil {
		r := rep.Report
		out.InfoFrom = "report"
		out.Leader, out.LeaderAddr, out.Term, out.Applied, out.ConfigNum = r.LeaderId, r.LeaderAddr, r.Term, r.AppliedIndex, r.ConfigNum
		out.Stranded = r.GetStranded()
		shards = r.Shards
	}
	for _, s := range shards {
		out.ShardStates[s.State]++
	}
	return out, shards
}

func (k *kvctl) groupInfo(ctx context.Context, addr string) (*shardkvpb.GroupInfoReply, error) {
	cl, err := k.kv(addr)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, min(probeTimeout, k.timeout))
	defer cancel()
	return cl.GroupInfo(ctx, &shardkvpb.GroupInfoRequest{})
}

var stateOrder = []string{"Serving", "PreCopying", "Pulling", "Acking", "BePulling", "GCing"}

func statesText(m map[string]int) string {
	var parts []string
	for _, s := range stateOrder {
		if m[s] > 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", s, m[s]))
		}
	}
	for _, s := range sortedKeys(m) {
		if !slices.Contains(stateOrder, s) && m[s] > 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", s, m[s]))
		}
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, " ")
}

// preCopyText is the pre-copy's progress: "snapshot: 1200 of 5000 keys,
// 1.2 MiB of 4.8 MiB copied, lag 340 entries" (", caught up"), then the
// measured rate and the snapshot's time left, when known (", 1.5 MiB/s,
// about 3s left").
func (c copyJSON) preCopyText() string {
	s := fmt.Sprintf("%s: %s, lag %d entries", orDash(c.Phase), copyProgress(c.Keys, c.TotalKeys, c.Bytes, c.TotalBytes, "copied"), c.LagEntries)
	if c.CaughtUp {
		s += ", caught up"
	}
	if c.BytesPerSec > 0 {
		s += ", " + humanBytes(c.BytesPerSec) + "/s"
	}
	if c.EtaSeconds > 0 {
		s += fmt.Sprintf(", about %s left", time.Duration(c.EtaSeconds)*time.Second)
	}
	return s
}

func humanBytes(b uint64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
	}
	return fmt.Sprintf("%d B", b)
}

func (k *kvctl) printStatus(s *statusJSON) error {
	w := k.stdout
	c := s.Controller
	fmt.Fprintf(w, "CONTROLLER  group %d, leader %d (%s), term %d; config %d (oldest kept %d), %d shards, placement %s\n",
		c.GroupID, c.Leader, c.LeaderAddr, c.Term, s.ConfigNum, s.OldestConfig, s.NShards, orDash(s.Config.Placement))
	if err := section(w, "", "ID\tADDR\tROLE\tTERM\tAPPLIED\tMATCH\tNOTE", func(tw io.Writer) {
		membersTable(tw, "", c.Members, true)
	}); err != nil {
		return err
	}
	if err := section(w, "DATA GROUPS", "GROUP\tOWNS\tLEADER\tTERM\tAPPLIED\tCONFIG\tSHARD STATES\tINFO", func(tw io.Writer) {
		groupRows(tw, s)
	}); err != nil {
		return err
	}
	if len(s.Groups) > 0 {
		if err := section(w, "DATA GROUP MEMBERS", "GROUP\tID\tADDR\tROLE\tTERM\tAPPLIED\tMATCH\tNOTE", func(tw io.Writer) {
			for _, g := range s.Groups {
				membersTable(tw, fmt.Sprint(g.GID), g.Members, g.Leader != 0 && g.InfoFrom == "leader")
			}
		}); err != nil {
			return err
		}
	}
	if len(s.Migrations) > 0 {
		if err := section(w, "MIGRATING SHARDS", "SHARD\tGROUP\tSTATE\tSOURCE\tTARGET\tCONFIG\tPROGRESS", func(tw io.Writer) {
			for _, m := range s.Migrations {
				fmt.Fprintf(tw, "%d\t%d\t%s\t%d\t%d\t%d\t%s\n", m.Shard, m.GID, m.State, m.Source, m.Target, m.ConfigNum, migrationProgress(m))
			}
		}); err != nil {
			return err
		}
	}
	if len(s.PlannedMoves) > 0 {
		if err := section(w, "PLANNED MOVES (the source serves until the cut-over)", "SHARD\tFROM\tTO\tSINCE CONFIG\tTARGET\tPROGRESS", func(tw io.Writer) {
			for _, p := range s.PlannedMoves {
				state, progress := "not started", "-"
				if p.TargetState != "" {
					state = p.TargetState
				}
				if p.TargetState == "PreCopying" {
					progress = p.preCopyText()
				}
				fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%s\t%s\n", p.Shard, p.FromGID, p.ToGID, p.SinceConfig, state, progress)
			}
		}); err != nil {
			return err
		}
	}
	fmt.Fprintln(w)
	for _, g := range s.Groups {
		if g.Stranded != "" {
			fmt.Fprintf(w, "GROUP %d CANNOT STEP, serves none of its shards: %s\n", g.GID, g.Stranded)
		}
	}
	if s.Settled {
		fmt.Fprintf(w, "settled: every group serves config %d and no shard is moving\n", s.ConfigNum)
	} else {
		fmt.Fprintf(w, "not settled: %d shard states in motion, %d moves planned, config %d\n", len(s.Migrations), len(s.PlannedMoves), s.ConfigNum)
	}
	return nil
}

// section writes one table of the status: a blank line and the title
// (unless title is empty), then the header and the rows fill writes.
func section(w io.Writer, title, header string, fill func(tw io.Writer)) error {
	if title != "" {
		fmt.Fprintln(w)
		fmt.Fprintln(w, title)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	fill(tw)
	return tw.Flush()
}

// groupRows writes the DATA GROUPS rows.
func groupRows(tw io.Writer, s *statusJSON) {
	for _, g := range s.Groups {
		owns := fmt.Sprint(g.OwnedShards)
		if !g.InConfig {
			owns = "not in config"
		} else if g.Leaving {
			owns += " (leaving)"
		}
		info := g.InfoFrom
		switch {
		case g.InfoFrom == "report":
			info = fmt.Sprintf("report %s old", (time.Duration(g.ReportAgeMs) * time.Millisecond).Round(100*time.Millisecond))
		case g.InfoFrom == "none":
			info = "unknown (no reachable leader, no report)"
		}
		if g.MigrateBytesPerSec > 0 {
			info += fmt.Sprintf("; copy limit %s/s", humanBytes(g.MigrateBytesPerSec))
		}
		if g.InfoFrom == "none" {
			fmt.Fprintf(tw, "%d\t%s\t-\t-\t-\t-\t-\t%s\n", g.GID, owns, info)
			continue
		}
		cfg := fmt.Sprint(g.ConfigNum)
		switch {
		case g.Stranded != "":
			cfg += " (STRANDED)"
		case g.ConfigNum < s.ConfigNum:
			cfg += fmt.Sprintf(" (behind %d)", s.ConfigNum)
		}
		fmt.Fprintf(tw, "%d\t%s\t%d (%s)\t%d\t%d\t%s\t%s\t%s\n", g.GID, owns, g.Leader, g.LeaderAddr, g.Term, g.Applied, cfg, statesText(g.ShardStates), info)
	}
	if len(s.Groups) == 0 {
		fmt.Fprintln(tw, "(none)")
	}
}

// migrationProgress is the PROGRESS column of a migrating shard.
func migrationProgress(m migrationJSON) string {
	progress := "-"
	switch m.State {
	case "PreCopying":
		progress = m.preCopyText()
	case "Pulling":
		progress = fmt.Sprintf("%d keys, %s received", m.Keys, humanBytes(m.Bytes))
		if m.TotalKeys > 0 {
			progress = fmt.Sprintf("%d of %d keys (%d%%), %s received", m.Keys, m.TotalKeys, 100*m.Keys/m.TotalKeys, humanBytes(m.Bytes))
		}
		if m.Phase != "" {
			progress = m.Phase + ": " + progress
		}
		if m.WritePauseUs > 0 {
			progress += ", writes paused " + (time.Duration(m.WritePauseUs) * time.Microsecond).String()
		}
	case "Acking":
		progress = fmt.Sprintf("installed (%d keys, %s); waiting for the source to confirm", m.Keys, humanBytes(m.Bytes))
	case "BePulling":
		progress = "frozen, being pulled"
	case "GCing":
		progress = "deleting the old copy"
	}
	return progress
}
