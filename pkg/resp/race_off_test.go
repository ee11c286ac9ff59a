//go:build !race

package resp_test

// raceEnabled: see race_on_test.go.
const raceEnabled = false
