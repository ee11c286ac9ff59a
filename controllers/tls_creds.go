package controllers

import (
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
	"github.com/shardkv/shardkv/pkg/mtls"
)

// TLSCredentials are the operator's own certificates, one per ShardMap with
// TLS on: the admin certificate in Secret <sm>-admin-tls, read through the
// cache and re-read as it changes (renewals, CA rotations), as node does
// with its files. Both reconcilers share one.
type TLSCredentials struct {
	// Reader reads the Secrets (the manager's cached client).
	Reader client.Reader

	mu sync.Mutex
	m  map[types.NamespacedName]*mtls.Source
}

// For is the client certificate to reach ShardMap sm's pods with; nil (and
// no error) when its TLS is off. An error says what is missing.
func (c *TLSCredentials) For(sm *shardkvv1.ShardMap) (*mtls.Source, error) {
	if !sm.Spec.TLSEnabled() {
		return nil, nil
	}
	key := types.NamespacedName{Namespace: sm.Namespace, Name: sm.Name}
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.m[key]; ok {
		return s, nil
	}
	secret := types.NamespacedName{Namespace: sm.Namespace, Name: AdminTLSSecretName(sm.Name)}
	read := func() (certPEM, keyPEM, caPEM []byte, err error) {
		ctx, cancel := context.WithTimeout(context.Background(), defaultCallTimeout)
		defer cancel()
		s := &corev1.Secret{}
		if err := c.Reader.Get(ctx, secret, s); err != nil {
			return nil, nil, nil, err
		}
		return s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey], s.Data[corev1.ServiceAccountRootCAKey], nil
	}
	src, err := mtls.LoadFunc(read, nil)
	if err != nil {
		return nil, fmt.Errorf("the operator's certificate (Secret %s) is not ready: %w", secret, err)
	}
	if c.m == nil {
		c.m = map[types.NamespacedName]*mtls.Source{}
	}
	c.m[key] = src
	return src, nil
}

// Forget drops ShardMap key's certificate (the ShardMap is gone).
func (c *TLSCredentials) Forget(key types.NamespacedName) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, key)
}
