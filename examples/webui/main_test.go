package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestMain runs the program itself when the test binary is started as
// the example (see TestInterruptWithClient).
func TestMain(m *testing.M) {
	if os.Getenv("RUNCUE_WEBUI_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestInterruptWithClient: Ctrl-C (SIGINT) with a browser's event stream
// attached ends the stream and the program exits 0 promptly (it used to
// wait out its 5 s shutdown timeout and exit 1).
func TestInterruptWithClient(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("sends SIGINT")
	}
	cmd := exec.Command(os.Args[0], "-addr", "127.0.0.1:0", "-db", filepath.Join(t.TempDir(), "webui.db"))
	cmd.Env = append(os.Environ(), "RUNCUE_WEBUI_MAIN=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	sc := bufio.NewScanner(out)
	var base string
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "runcue webui: open "); ok {
			base = strings.Fields(rest)[0]
			break
		}
	}
	if base == "" {
		t.Fatal("the program did not say where it listens")
	}
	resp, err := http.Get(base + "/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit after SIGINT: %v", err)
		}
	case <-time.After(30 * time.Second): // a guard against a hang, not a measurement
		t.Fatal("the program did not exit after SIGINT")
	}
}

// TestPipeline runs the example end to end, fast, and follows it over SSE
// until both initial documents are uploaded.
func TestPipeline(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- run(ctx, ln, filepath.Join(t.TempDir(), "webui.db"), 0.01, 2, 0) }()
	base := "http://" + ln.Addr().String()

	resp, err := http.Get(base + "/")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(page), "<title>runcue · document pipeline</title>") {
		t.Fatalf("the dashboard's overview: %d %s", resp.StatusCode, page)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/events?after=0&task=upload_result&type=work_completed", nil)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	uploads := 0
	sc := bufio.NewScanner(resp.Body)
	for uploads < 2 && sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			var ev struct{ Type, Task string }
			if err := json.Unmarshal([]byte(data), &ev); err != nil {
				t.Fatal(err)
			}
			if ev.Type == "work_completed" && ev.Task == "upload_result" {
				uploads++
			}
		}
	}
	if uploads != 2 {
		t.Fatalf("%d uploads completed: %v", uploads, sc.Err())
	}
	resp, err = http.Get(base + "/api/services")
	if err != nil {
		t.Fatal(err)
	}
	var svcs []map[string]any
	json.NewDecoder(resp.Body).Decode(&svcs)
	resp.Body.Close()
	if len(svcs) != 3 {
		t.Fatalf("services: %v", svcs)
	}
	cancel()
	if err := <-done; err != nil && err != context.Canceled {
		t.Fatal(err)
	}
}
