package kvctl

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"

	"github.com/shardkv/shardkv/pkg/routing"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// configJSON is a config, as printed by query --json and by the commands
// that change the config (join, leave, move, unpin).
type configJSON struct {
	Num       uint64 `json:"num"`
	Placement string `json:"placement"`
	NShards   int    `json:"nshards"`
	// Shards[i] is the gid owning shard i (0: none); always NShards long.
	Shards []uint64          `json:"shards"`
	Groups []groupConfigJSON `json:"groups"`
	Pins   []pinJSON         `json:"pins"`
	// Moves are the planned moves not cut over yet, by shard; each
	// shard is still its source's in Shards.
	Moves []plannedMoveJSON `json:"moves"`
}

type plannedMoveJSON struct {
	Shard       uint32 `json:"shard"`
	FromGID     uint64 `json:"from_gid"`
	ToGID       uint64 `json:"to_gid"`
	SinceConfig uint64 `json:"since_config"`
}

type groupConfigJSON struct {
	GID         uint64       `json:"gid"`
	Weight      uint32       `json:"weight"`
	OwnedShards int          `json:"owned_shards"`
	Servers     []serverJSON `json:"servers"`
	// Leaving: the group left and is kept until its last shard is cut over.
	Leaving bool `json:"leaving"`
}

type serverJSON struct {
	ID       uint64 `json:"id"`
	Addr     string `json:"addr"`
	RespAddr string `json:"resp_addr"`
	// RespTLSAddr: the Redis-over-TLS address, if served.
	RespTLSAddr string `json:"resp_tls_addr,omitempty"`
}

type pinJSON struct {
	Shard uint32 `json:"shard"`
	GID   uint64 `json:"gid"`
}

func ownedShards(c *shardkvpb.Config, gid uint64) int {
	n := 0
	for _, g := range c.GetShards() {
		if g == gid {
			n++
		}
	}
	return n
}

func toConfigJSON(c *shardkvpb.Config) configJSON {
	out := configJSON{Num: c.GetNum(), Placement: c.GetPlacement(), NShards: len(c.GetShards()),
		Shards: slices.Clone(c.GetShards()), Groups: []groupConfigJSON{}, Pins: []pinJSON{}, Moves: []plannedMoveJSON{}}
	if out.Shards == nil {
		out.Shards = []uint64{}
	}
	for _, g := range c.GetGroups() {
		gj := groupConfigJSON{GID: g.Gid, Weight: g.Weight, OwnedShards: ownedShards(c, g.Gid), Servers: []serverJSON{}, Leaving: g.Leaving}
		for _, s := range g.Servers {
			gj.Servers = append(gj.Servers, serverJSON{ID: s.Id, Addr: s.Addr, RespAddr: s.RespAddr, RespTLSAddr: s.RespTlsAddr})
		}
		out.Groups = append(out.Groups, gj)
	}
	for _, p := range c.GetPins() {
		out.Pins = append(out.Pins, pinJSON{Shard: p.Shard, GID: p.Gid})
	}
	for _, m := range c.GetMoves() {
		out.Moves = append(out.Moves, plannedMoveJSON{Shard: m.Shard, FromGID: m.FromGid, ToGID: m.ToGid, SinceConfig: m.SinceConfig})
	}
	return out
}

// plannedMove returns c's planned move of shard, or nil.
func plannedMove(c *shardkvpb.Config, shard uint32) *shardkvpb.PlannedMove {
	for _, m := range c.GetMoves() {
		if m.Shard == shard {
			return m
		}
	}
	return nil
}

// groupLabel is a gid, marked when the group is leaving.
func groupLabel(g *shardkvpb.Group) string {
	if g.Leaving {
		return fmt.Sprintf("%d (leaving)", g.Gid)
	}
	return strconv.FormatUint(g.Gid, 10)
}

// printMoves prints c's planned moves, if any.
func (k *kvctl) printMoves(c *shardkvpb.Config) error {
	if len(c.GetMoves()) == 0 {
		return nil
	}
	fmt.Fprintln(k.stdout)
	fmt.Fprintf(k.stdout, "PLANNED MOVES (pre-copy, then cut-over; the source serves until then)\n")
	tw := tabwriter.NewWriter(k.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SHARD\tFROM\tTO\tSINCE CONFIG")
	for _, m := range c.Moves {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%d\n", m.Shard, m.FromGid, m.ToGid, m.SinceConfig)
	}
	return tw.Flush()
}

func serversText(g *shardkvpb.Group) (grpcList, respList string) {
	var gs, rs []string
	for _, s := range g.Servers {
		gs = append(gs, fmt.Sprintf("%d=%s", s.Id, s.Addr))
		if s.RespAddr != "" {
			rs = append(rs, fmt.Sprintf("%d=%s", s.Id, s.RespAddr))
		}
		if s.RespTlsAddr != "" {
			rs = append(rs, fmt.Sprintf("%d=%s (tls)", s.Id, s.RespTlsAddr))
		}
	}
	return strings.Join(gs, ","), strings.Join(rs, ",")
}

func rangeText(first, last int) string {
	if first == last {
		return strconv.Itoa(first)
	}
	return fmt.Sprintf("%d-%d", first, last)
}

// printConfig prints a config as tables (or JSON).
func (k *kvctl) printConfig(c *shardkvpb.Config, full bool) error {
	if k.json {
		return k.printJSON(toConfigJSON(c))
	}
	fmt.Fprintf(k.stdout, "config %d (placement %s, %d shards)\n\n", c.Num, orDash(c.Placement), len(c.Shards))
	tw := tabwriter.NewWriter(k.stdout, 0, 4, 2, ' ', 0)
	hasResp := false
	for _, g := range c.Groups {
		if _, r := serversText(g); r != "" {
			hasResp = true
		}
	}
	if hasResp {
		fmt.Fprintln(tw, "GROUP\tWEIGHT\tSHARDS\tSERVERS\tRESP")
	} else {
		fmt.Fprintln(tw, "GROUP\tWEIGHT\tSHARDS\tSERVERS")
	}
	for _, g := range c.Groups {
		gs, rs := serversText(g)
		if hasResp {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\n", groupLabel(g), g.Weight, ownedShards(c, g.Gid), gs, orDash(rs))
		} else {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\n", groupLabel(g), g.Weight, ownedShards(c, g.Gid), gs)
		}
	}
	if len(c.Groups) == 0 {
		fmt.Fprintln(tw, "(no groups)")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if err := k.printMoves(c); err != nil {
		return err
	}
	if !full {
		return nil
	}
	pinned := map[int]uint64{}
	for _, p := range c.Pins {
		pinned[int(p.Shard)] = p.Gid
	}
	fmt.Fprintln(k.stdout)
	tw = tabwriter.NewWriter(k.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SHARDS\tGROUP\tPINNED")
	for _, r := range routing.Ranges(c.Shards) {
		var pins []string
		for s := r.First; s <= r.Last; s++ {
			if _, ok := pinned[s]; ok {
				pins = append(pins, strconv.Itoa(s))
			}
		}
		p := "-"
		if len(pins) > 0 {
			p = strings.Join(pins, ",")
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\n", rangeText(r.First, r.Last), r.GID, p)
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func cmdQuery(k *kvctl, args []string) error {
	pos, err := k.parse(newFlags("query"), args, 0, 1)
	if err != nil {
		return err
	}
	num := int64(-1)
	if len(pos) == 1 {
		if num, err = strconv.ParseInt(pos[0], 10, 64); err != nil {
			return usagef(nil, "config number must be an integer, not %q", pos[0])
		}
	}
	ctrl, ctx, cancel, err := k.ctrlerCall()
	if err != nil {
		return err
	}
	defer cancel()
	c, err := ctrl.Query(ctx, num)
	if err != nil {
		return k.ctrlErr(err)
	}
	return k.printConfig(c, true)
}

// mutated prints the config a mutation produced.
func (k *kvctl) mutated(what string, c *shardkvpb.Config, err error) error {
	if err != nil {
		return k.ctrlErr(err)
	}
	if !k.json {
		fmt.Fprintf(k.stdout, "%s: ", what)
	}
	return k.printConfig(c, false)
}

func cmdJoin(k *kvctl, args []string) error {
	fs := newFlags("join")
	weight := fs.Uint("weight", 0, "")
	pos, err := k.parse(fs, args, 1, -1)
	if err != nil {
		return err
	}
	type spec struct {
		gid   uint64
		addrs []string
	}
	var specs []spec
	for _, a := range pos {
		gidS, addrS, ok := strings.Cut(a, "=")
		if !ok {
			return usagef(nil, "expected <gid>=<addr>[,<addr>...], not %q", a)
		}
		gid, err := strconv.ParseUint(gidS, 10, 64)
		if err != nil || gid == 0 {
			return usagef(nil, "gid must be a positive integer, not %q", gidS)
		}
		var addrs []string
		for _, ad := range strings.Split(addrS, ",") {
			if ad = strings.TrimSpace(ad); ad != "" {
				addrs = append(addrs, ad)
			}
		}
		if len(addrs) == 0 {
			return usagef(nil, "group %d: no addresses", gid)
		}
		specs = append(specs, spec{gid, addrs})
	}
	if *weight > 1<<32-1 {
		return usagef(nil, "--weight is too large")
	}
	ctrl, ctx, cancel, err := k.ctrlerCall()
	if err != nil {
		return err
	}
	defer cancel()
	// Keep the weight of a group that is already in the config unless
	// --weight is given (a Join without a weight would reset it to 1).
	latest, err := ctrl.Query(ctx, -1)
	if err != nil {
		return k.ctrlErr(err)
	}
	groups := make([]*shardkvpb.Group, len(specs))
	errs := make([]error, len(specs))
	var wg sync.WaitGroup
	for i, s := range specs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			groups[i], errs[i] = k.describeGroup(ctx, s.gid, s.addrs)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	var gids []string
	for _, g := range groups {
		g.Weight = uint32(*weight)
		old := findGroup(latest, g.Gid)
		if g.Weight == 0 && old != nil {
			g.Weight = old.Weight
		}
		id := strconv.FormatUint(g.Gid, 10)
		if old != nil && old.Leaving {
			id += " (it was leaving: taken back)"
		}
		gids = append(gids, id)
	}
	c, err := ctrl.Join(ctx, groups...)
	return k.mutated("joined group "+strings.Join(gids, ", "), c, err)
}

// describeGroup asks each member for its replica id and RESP address, and
// checks that it belongs to group gid.
func (k *kvctl) describeGroup(ctx context.Context, gid uint64, addrs []string) (*shardkvpb.Group, error) {
	sts, errs := k.memberStatuses(ctx, addrs)
	g := &shardkvpb.Group{Gid: gid}
	for _, a := range addrs {
		if err := errs[a]; err != nil {
			return nil, fmt.Errorf("group %d: cannot reach %s to learn its replica id: %s", gid, a, oneLine(err))
		}
		st := sts[a]
		if st.GroupId != gid {
			return nil, fmt.Errorf("group %d: %s is replica %d of group %d, not of group %d", gid, a, st.Id, st.GroupId, gid)
		}
		if st.Role == "removed" {
			return nil, fmt.Errorf("group %d: %s (replica %d) was removed from its group", gid, a, st.Id)
		}
		g.Servers = append(g.Servers, &shardkvpb.Server{Id: st.Id, Addr: a, RespAddr: st.RespAddr, RespTlsAddr: st.RespTlsAddr})
	}
	slices.SortFunc(g.Servers, func(a, b *shardkvpb.Server) int { return cmp.Compare(a.Id, b.Id) })
	return g, nil
}

func findGroup(c *shardkvpb.Config, gid uint64) *shardkvpb.Group {
	for _, g := range c.GetGroups() {
		if g.Gid == gid {
			return g
		}
	}
	return nil
}

func cmdLeave(k *kvctl, args []string) error {
	pos, err := k.parse(newFlags("leave"), args, 1, -1)
	if err != nil {
		return err
	}
	var gids []uint64
	for _, a := range pos {
		gid, err := parseUint("gid", a)
		if err != nil {
			return err
		}
		gids = append(gids, gid)
	}
	ctrl, ctx, cancel, err := k.ctrlerCall()
	if err != nil {
		return err
	}
	defer cancel()
	c, err := ctrl.Leave(ctx, gids...)
	return k.mutated("group "+strings.Join(pos, ", ")+" left", c, err)
}

// parseShard parses a shard number argument.
func parseShard(s string) (uint64, error) {
	shard, err := parseUint("shard", s)
	if err == nil && shard > 1<<31 {
		return 0, usagef(nil, "shard %d is out of range", shard)
	}
	return shard, err
}

func cmdUnpin(k *kvctl, args []string) error {
	pos, err := k.parse(newFlags("unpin"), args, 1, 1)
	if err != nil {
		return err
	}
	shard, err := parseShard(pos[0])
	if err != nil {
		return err
	}
	ctrl, ctx, cancel, err := k.ctrlerCall()
	if err != nil {
		return err
	}
	defer cancel()
	c, err := ctrl.Unpin(ctx, int(shard))
	return k.mutated(fmt.Sprintf("shard %d unpinned", shard), c, err)
}
