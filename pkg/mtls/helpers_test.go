package mtls_test

import (
	"crypto/tls"

	"google.golang.org/grpc/credentials"
)

func credentialsFrom(cfg *tls.Config) credentials.TransportCredentials {
	return credentials.NewTLS(cfg)
}
