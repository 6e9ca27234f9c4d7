package dashboard_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/dashboard"
)

var (
	benchDB    = flag.String("dashboard.db", "", "the database of BenchmarkPages (built there if missing; default: a new one under the test's temporary directory)")
	benchUnits = flag.Int("dashboard.units", 1_000_000, "units in the database BenchmarkPages builds")
)

// buildBenchDB writes n units to a new database at path: 80% of them run
// (85% complete, 5% fail with an error naming their host, 10% are
// skipped), then 20% are left queued behind a paused queue, submitted
// last, so that they are the newest. Tasks are skewed: fetch 60%, parse
// 30%, upload 9.9%, audit 0.1%.
func buildBenchDB(b *testing.B, path string, n int) {
	b.Helper()
	start := time.Now()
	c, err := runcue.Open(path, runcue.Config{Logger: slog.New(slog.DiscardHandler), EventRetention: 365 * 24 * time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	handler := func(ctx context.Context, w *runcue.Work) (any, error) {
		switch {
		case strings.HasSuffix(w.Target, "/fail"):
			return nil, runcue.Permanent(fmt.Errorf("upstream 503 from %s", w.Target[:strings.Index(w.Target, "/item")]))
		case strings.HasSuffix(w.Target, "/skip"):
			return nil, runcue.Skip("not modified")
		}
		return nil, nil
	}
	for _, task := range []string{"fetch", "parse", "upload", "audit"} {
		if err := c.Task(task, runcue.Task{Retry: runcue.RetryPolicy{MaxAttempts: 1}, Handler: handler}); err != nil {
			b.Fatal(err)
		}
	}
	ctx := context.Background()
	if err := c.Start(ctx); err != nil {
		b.Fatal(err)
	}
	taskOf := func(i int) string {
		switch r := i % 1000; {
		case r == 0:
			return "audit"
		case r < 100:
			return "upload"
		case r < 400:
			return "parse"
		}
		return "fetch"
	}
	submit := func(from, to int) {
		for lo := from; lo < to; lo += 1000 {
			subs := make([]runcue.Submission, 0, 1000)
			for i := lo; i < min(lo+1000, to); i++ {
				target := fmt.Sprintf("https://host-%d.example/item/%d", i%500, i)
				switch i % 20 {
				case 7:
					target += "/fail"
				case 11, 13:
					target += "/skip"
				}
				subs = append(subs, runcue.Submission{Task: taskOf(i), Target: target, Params: map[string]int{"i": i}})
			}
			if _, err := c.SubmitBatch(ctx, subs); err != nil && !errors.Is(err, runcue.ErrBackpressure) {
				b.Fatal(err)
			}
		}
	}
	run := n * 8 / 10
	submit(0, run)
	if err := c.Drain(ctx); err != nil {
		b.Fatal(err)
	}
	if err := c.PauseQueue(ctx); err != nil {
		b.Fatal(err)
	}
	submit(run, n)
	if err := c.Stop(ctx); err != nil {
		b.Fatal(err)
	}
	b.Logf("built %s: %d units in %v", path, n, time.Since(start).Round(time.Second))
}

// BenchmarkPages measures the dashboard's pages on a database of a million
// units (-dashboard.units): the overview, the work list unfiltered and
// filtered by state, by task and by text within a time range, and a
// unit's page. Each op is one request, as a browser would make it.
//
//	go test -run '^$' -bench Pages -benchtime 20x ./dashboard -dashboard.db /tmp/dash1m.db
func BenchmarkPages(b *testing.B) {
	path := *benchDB
	if path == "" {
		path = filepath.Join(b.TempDir(), "dash.db")
	}
	if _, err := os.Stat(path); err != nil {
		buildBenchDB(b, path, *benchUnits)
	}
	c, err := runcue.Open(path, runcue.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	page, err := c.List(context.Background(), runcue.ListOptions{States: []runcue.State{runcue.StateFailed}, Limit: 1, Newest: true})
	if err != nil || len(page.Units) == 0 {
		b.Fatalf("no failed unit: %v", err)
	}
	unit := page.Units[0].ID
	h := dashboard.Handler(c, dashboard.Options{})
	for _, p := range []string{
		"/",
		"/services",
		"/work",
		"/work?state=queued",
		"/work?state=completed",
		"/work?state=failed",
		"/work?task=audit",
		"/work?task=audit&state=failed",
		"/work?target=https://host-7.example/&since=1h",
		"/work?error=host-7.example&since=1h",
		"/work?error=no+such+text&since=1h",
		"/work?error=no+such+text",
		"/work?target=no-such-target",
		"/work/" + unit,
	} {
		name := strings.TrimPrefix(p, "/")
		if name == "" {
			name = "overview"
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, p, nil))
				if rec.Code != http.StatusOK {
					b.Fatalf("%s: %d %s", p, rec.Code, rec.Body.String())
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/op")
		})
	}
}
