package main

import (
	"bytes"
	"os"
	"testing"
)

// TestPeerBenchRuns: the comparison runs end to end, small, against the
// test server (RUNCUE_TEST_POSTGRES), and prints both sides' medians.
// Its figures mean nothing at this size: the benchmark is run by hand
// (docs/performance.md).
func TestPeerBenchRuns(t *testing.T) {
	if os.Getenv("RUNCUE_TEST_POSTGRES") == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true and RUNCUE_TEST_POSTGRES is not set: scripts/test runs under scripts/with-postgres")
		}
		t.Skip("SKIP: RUNCUE_TEST_POSTGRES is not set: the peer benchmark was not run (scripts/with-postgres)")
	}
	var out bytes.Buffer
	if err := run([]string{"-n", "300", "-batch", "100", "-workers", "20", "-reps", "1", "-workload", "both"}, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{"median: runcue", "River", "CPU a 1,000"} {
		if !bytes.Contains(out.Bytes(), []byte(want)) {
			t.Errorf("the output lacks %q:\n%s", want, out.String())
		}
	}
}
