package controllers

// The copy rate and time left of migrations, from the bytes copied seen
// by two passes at least rateWindow apart. The only thing the ShardMap
// reconciler remembers between passes besides its Watch streams: losing
// it (an operator restart) only hides the estimate for one window.

import (
	"time"

	"k8s.io/apimachinery/pkg/types"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
)

// rateWindow is the shortest time a copy rate is measured over: groups
// report every 500 ms and passes run every second while shards move, so
// shorter windows would jitter.
const rateWindow = 5 * time.Second

// rateSample is a migration's bytes copied at the start of the current
// window, and the rate of the last full window (0: none yet).
type rateSample struct {
	bytes int64
	at    time.Time
	rate  int64 // bytes/s
}

// estimateMigrationRates fills BytesPerSecond and EstimatedTimeLeft of
// each migration (keyed by source and target) at time now from the
// samples of earlier passes, and returns the samples to keep (those of the
// migrations in ms only). A window closes once it is rateWindow long; a
// migration whose bytes went down (a shard of it finished, or its copy
// started over) starts a new window and keeps the last rate.
func estimateMigrationRates(prev map[string]rateSample, ms []shardkvv1.Migration, now time.Time) map[string]rateSample {
	next := make(map[string]rateSample, len(ms))
	for i := range ms {
		m := &ms[i]
		k := m.Source + "->" + m.Target
		s, ok := prev[k]
		switch {
		case !ok:
			s = rateSample{bytes: m.Bytes, at: now}
		case m.Bytes < s.bytes:
			s = rateSample{bytes: m.Bytes, at: now, rate: s.rate}
		case now.Sub(s.at) >= rateWindow:
			s.rate = int64(float64(m.Bytes-s.bytes) / now.Sub(s.at).Seconds())
			s.bytes, s.at = m.Bytes, now
		}
		next[k] = s
		m.BytesPerSecond, m.EstimatedTimeLeft = s.rate, ""
		if s.rate > 0 && m.TotalBytes > m.Bytes {
			left := time.Duration(float64(m.TotalBytes-m.Bytes) / float64(s.rate) * float64(time.Second))
			m.EstimatedTimeLeft = max(left.Round(time.Second), time.Second).String()
		}
	}
	return next
}

// estimateRates fills the rates and times left of ShardMap key's
// migrations, remembering this pass's samples.
func (r *ShardMapReconciler) estimateRates(key types.NamespacedName, ms []shardkvv1.Migration) {
	now := r.clock()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.rates == nil {
		r.rates = map[types.NamespacedName]map[string]rateSample{}
	}
	if next := estimateMigrationRates(r.rates[key], ms, now); len(next) > 0 {
		r.rates[key] = next
	} else {
		delete(r.rates, key)
	}
}

// forgetRates drops the samples of ShardMap key (deleted).
func (r *ShardMapReconciler) forgetRates(key types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.rates, key)
}
