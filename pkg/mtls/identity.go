// Package mtls is shardkv's mutual TLS: every process holds a certificate
// from the cluster's CA naming who it is (an Identity), both ends of every
// gRPC connection check the other's against that CA, and the files are
// re-read when they change, so certificates rotate without a restart.
//
// Identities live in a URI SAN (urn:shardkv:group:3), not in host names:
// replicas are dialed by addresses that change when a pod moves, and what
// a peer may do depends on its role, not on where it runs. The files:
//
//   - identity.go: who a certificate names;
//   - source.go: the PEM files, reloaded when they change;
//   - creds.go: gRPC transport credentials on a Source, and the peer's
//     identity in a handler;
//   - ca.go: a CA that issues certificates (kvctl cert, node local, the
//     operator);
//   - refusals.go: each kind of refusal logged once, not per attempt.
package mtls

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// Role is what a certificate's holder is.
type Role string

const (
	// RoleCtrler: a replica of the controller group.
	RoleCtrler Role = "ctrler"
	// RoleGroup: a replica of one data group (Identity.Group).
	RoleGroup Role = "group"
	// RoleAdmin: the operator or an administrator (kvctl): may change
	// membership and ownership.
	RoleAdmin Role = "admin"
	// RoleClient: an application: reads and writes data.
	RoleClient Role = "client"
)

// Identity is who a certificate names.
type Identity struct {
	Role Role
	// Group is the data group of RoleGroup; 0 otherwise.
	Group uint64
	// Name tells admins and clients apart in logs; optional.
	Name string
}

// IsNode: a replica (controller or data group).
func (id Identity) IsNode() bool { return id.Role == RoleCtrler || id.Role == RoleGroup }

// String is the form ParseIdentity reads: ctrler, group/3, admin/operator,
// client/app (the name is optional for admin and client).
func (id Identity) String() string {
	switch {
	case id.Role == RoleGroup:
		return "group/" + strconv.FormatUint(id.Group, 10)
	case id.Name != "":
		return string(id.Role) + "/" + id.Name
	}
	return string(id.Role)
}

// URI is the URI SAN that carries the identity in a certificate.
func (id Identity) URI() *url.URL {
	return &url.URL{Scheme: "urn", Opaque: "shardkv:" + strings.ReplaceAll(id.String(), "/", ":")}
}

// ParseIdentity reads the String form.
func ParseIdentity(s string) (Identity, error) {
	role, rest, _ := strings.Cut(s, "/")
	id := Identity{Role: Role(role)}
	switch id.Role {
	case RoleCtrler:
		if rest != "" {
			return Identity{}, fmt.Errorf("identity %q: ctrler takes no name", s)
		}
	case RoleGroup:
		g, err := strconv.ParseUint(rest, 10, 64)
		if err != nil || g == 0 {
			return Identity{}, fmt.Errorf("identity %q: want group/<gid>, gid >= 1", s)
		}
		id.Group = g
	case RoleAdmin, RoleClient:
		if strings.ContainsAny(rest, "/: ") {
			return Identity{}, fmt.Errorf("identity %q: a name may not hold '/', ':' or spaces", s)
		}
		id.Name = rest
	default:
		return Identity{}, fmt.Errorf("identity %q: role must be ctrler, group/<gid>, admin[/name] or client[/name]", s)
	}
	return id, nil
}

// ErrNoIdentity: a certificate from the CA that names no shardkv identity.
var ErrNoIdentity = errors.New("certificate names no shardkv identity (no urn:shardkv: URI SAN)")

// IdentityOf reads the identity a certificate names. A certificate naming
// two is refused: a CA should never issue one, and either reading would be
// a guess.
func IdentityOf(cert *x509.Certificate) (Identity, error) {
	var found []Identity
	for _, u := range cert.URIs {
		if u.Scheme != "urn" || !strings.HasPrefix(u.Opaque, "shardkv:") {
			continue
		}
		id, err := ParseIdentity(strings.Replace(strings.TrimPrefix(u.Opaque, "shardkv:"), ":", "/", 1))
		if err != nil {
			return Identity{}, fmt.Errorf("certificate %q: %w", cert.Subject.CommonName, err)
		}
		found = append(found, id)
	}
	switch len(found) {
	case 0:
		return Identity{}, fmt.Errorf("certificate %q: %w", cert.Subject.CommonName, ErrNoIdentity)
	case 1:
		return found[0], nil
	}
	return Identity{}, fmt.Errorf("certificate %q names %d shardkv identities; want one", cert.Subject.CommonName, len(found))
}

// Accept decides whether a peer's identity is the one a dialer expects.
type Accept func(Identity) error

// AnyNode accepts a replica of any group: what clients, kvctl and the
// operator dial.
func AnyNode(id Identity) error {
	if !id.IsNode() {
		return fmt.Errorf("peer is %s, not a shardkv replica", id)
	}
	return nil
}

// Exactly accepts only want (names aside).
func Exactly(want Identity) Accept {
	return func(id Identity) error {
		if id.Role != want.Role || id.Group != want.Group {
			return fmt.Errorf("peer is %s, want %s", id, want)
		}
		return nil
	}
}

// AnyGroup accepts a replica of any data group.
func AnyGroup(id Identity) error {
	if id.Role != RoleGroup {
		return fmt.Errorf("peer is %s, not a data-group replica", id)
	}
	return nil
}
