package testutil

import (
	"testing"
	"time"
	_ "time/tzdata" // the zones tests name, whatever the machine has
)

// Zone loads the time zone name, failing t if it cannot.
func Zone(t testing.TB, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}
