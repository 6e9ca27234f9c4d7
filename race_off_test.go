//go:build !race

package runcue_test

// raceEnabled: see race_on_test.go.
const raceEnabled = false
