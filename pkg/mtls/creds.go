package mtls

import (
	"context"
	"crypto/tls"
	"errors"
	"net"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// ServerCredentials are gRPC server credentials that require a client
// certificate chaining to the CA bundle. A failed handshake (plain text, a
// wrong CA, an expired certificate) is logged through refusals, once per
// peer host and reason.
func (s *Source) ServerCredentials(refusals *Refusals) credentials.TransportCredentials {
	return &loggedCreds{TransportCredentials: credentials.NewTLS(s.ServerConfig(tls.RequireAndVerifyClientCert, "h2")), refusals: refusals}
}

// ClientCredentials are gRPC client credentials: this process's
// certificate, and a server that chains to the CA bundle and names an
// identity accept takes.
func (s *Source) ClientCredentials(accept Accept) credentials.TransportCredentials {
	return credentials.NewTLS(s.ClientConfig(accept))
}

type loggedCreds struct {
	credentials.TransportCredentials
	refusals *Refusals
}

func (c *loggedCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	out, info, err := c.TransportCredentials.ServerHandshake(conn)
	if err != nil {
		host, _, _ := net.SplitHostPort(conn.RemoteAddr().String())
		c.refusals.Refuse("handshake "+host+" "+RefusalKind(err), "TLS handshake refused", "peer", host, "err", err)
	}
	return out, info, err
}

func (c *loggedCreds) Clone() credentials.TransportCredentials {
	return &loggedCreds{TransportCredentials: c.TransportCredentials.Clone(), refusals: c.refusals}
}

// ErrNoPeerCertificate: the call came without a verified client
// certificate (the server is not serving TLS, or the peer sent none).
var ErrNoPeerCertificate = errors.New("no verified client certificate")

// PeerIdentity is the identity of the verified client certificate of the
// call in ctx.
func PeerIdentity(ctx context.Context) (Identity, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return Identity{}, ErrNoPeerCertificate
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return Identity{}, ErrNoPeerCertificate
	}
	return IdentityOf(info.State.VerifiedChains[0][0])
}
