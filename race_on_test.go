//go:build race

package runcue_test

// raceEnabled is true when the tests run under the race detector, which
// slows the volume tests about tenfold: they shrink to stay within the CI
// budget, and keep their full size in plain `go test`.
const raceEnabled = true
