package main

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

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
	go func() { done <- run(ctx, ln, filepath.Join(t.TempDir(), "webui.db"), 0.01, 2) }()
	base := "http://" + ln.Addr().String()

	resp, err := http.Get(base + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("index: %d", resp.StatusCode)
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
	resp, err = http.Get(base + "/services")
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
