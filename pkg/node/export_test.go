package node

import "log/slog"

// CheckIdentity is checkIdentity, for the power-cut test's child process.
func CheckIdentity(o *Options, log *slog.Logger) (bool, error) { return checkIdentity(o, log) }
