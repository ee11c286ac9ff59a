package mtls

import (
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// Refusals logs a refusal the first time its key is seen, then at most
// once per period with the count of those not logged: a misconfigured
// peer retrying every 100 ms must not flood the log, and must still show.
type Refusals struct {
	log    *slog.Logger
	period time.Duration

	mu   sync.Mutex
	seen map[string]*refusal
}

type refusal struct {
	logged time.Time
	quiet  int // refusals since logged
}

// maxRefusalKeys bounds the memory a stream of distinct peers can take.
const maxRefusalKeys = 4096

// NewRefusals logs through log, each key at most once per period.
func NewRefusals(log *slog.Logger, period time.Duration) *Refusals {
	return &Refusals{log: log, period: period, seen: map[string]*refusal{}}
}

// Refuse records one refusal of kind key (say, peer host and reason).
func (r *Refusals) Refuse(key, msg string, attrs ...any) {
	if r == nil || r.log == nil {
		return
	}
	now := time.Now()
	r.mu.Lock()
	e := r.seen[key]
	if e == nil {
		if len(r.seen) >= maxRefusalKeys {
			clear(r.seen)
		}
		e = &refusal{}
		r.seen[key] = e
	} else if now.Sub(e.logged) < r.period {
		e.quiet++
		r.mu.Unlock()
		return
	}
	quiet := e.quiet
	e.logged, e.quiet = now, 0
	r.mu.Unlock()
	if quiet > 0 {
		attrs = append(attrs, "more_since_last_logged", quiet)
	}
	r.log.Warn(msg, attrs...)
}

// RefusalKind is what a refused handshake's error says, without what
// changes from one attempt to the next (an expired certificate's error
// names the current time): the part of a refusal's key that says why.
func RefusalKind(err error) string {
	var invalid x509.CertificateInvalidError
	if errors.As(err, &invalid) {
		return fmt.Sprintf("invalid certificate (x509 reason %d)", invalid.Reason)
	}
	return err.Error()
}
