package controllers

import "time"

// wallClock is a reconciler's clock: the wall clock, or now if a test set
// it. Planners get the time from the observation, never read it.
type wallClock struct {
	now func() time.Time
}

func (c wallClock) clock() time.Time {
	if c.now != nil {
		return c.now()
	}
	return time.Now()
}
