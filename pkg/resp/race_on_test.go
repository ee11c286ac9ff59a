//go:build race

package resp_test

// raceEnabled: the race detector multiplies the CPU cost of every command
// (5-10x measured), so tests that need a command done within the shipped
// timeouts check that only in the build without it.
const raceEnabled = true
