package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/runcue/runcue/proc"
)

func TestMain(m *testing.M) {
	registerPoolHandlers()
	proc.Main()
	os.Exit(m.Run())
}

// TestServerTool runs the flow to completion and checks every host got its
// configuration.
func TestServerTool(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := os.CreateTemp(dir, "out")
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if err := run(ctx, dir, out); err != nil {
		b, _ := os.ReadFile(out.Name())
		t.Fatalf("%v\n%s", err, b)
	}
	for _, h := range hosts {
		if _, err := os.Stat(filepath.Join(dir, "hosts", h, "etc", "app.json")); err != nil {
			t.Errorf("%s: %v", h, err)
		}
	}
}
