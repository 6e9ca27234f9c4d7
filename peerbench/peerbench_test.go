package main

import (
	"bytes"
	"fmt"
	"os"
	"testing"
)

// TestMain runs this test binary as a child of the latency measures
// across processes when its environment names the role.
func TestMain(m *testing.M) {
	if ok, err := maybeChild(); ok {
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestPeerBenchRuns: the comparison runs end to end, small, against the
// test server (RUNCUE_TEST_POSTGRES), and prints both sides' medians.
// Its figures mean nothing at this size: the benchmark is run by hand
// (docs/performance.md).
func TestPeerBenchRuns(t *testing.T) {
	needServer(t)
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

// TestLatencyRuns: the latency measures run end to end, small: in one
// process, from a submitter in another (a child), and through 3 executors
// (children); each prints its percentiles.
func TestLatencyRuns(t *testing.T) {
	needServer(t)
	var out bytes.Buffer
	if err := run([]string{"-latency", "-latency-n", "20", "-latency-rate", "100", "-timeout", "2m"}, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{"latency, no-op", "latency, limited", "latency, from another process", "latency, through 3 executors of 33"} {
		if !bytes.Contains(out.Bytes(), []byte(want)) {
			t.Errorf("the output lacks %q:\n%s", want, out.String())
		}
	}
}

// needServer skips (fails, with CI=true) without a test server.
func needServer(t *testing.T) {
	t.Helper()
	if os.Getenv("RUNCUE_TEST_POSTGRES") == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true and RUNCUE_TEST_POSTGRES is not set: scripts/test runs under scripts/with-postgres")
		}
		t.Skip("SKIP: RUNCUE_TEST_POSTGRES is not set: the peer benchmark was not run (scripts/with-postgres)")
	}
}
