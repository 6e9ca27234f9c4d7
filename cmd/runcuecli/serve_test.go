package runcuecli_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/runcue/runcue"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// startServe runs `runcue serve` on a free port and returns the URL it
// prints; the server is interrupted at the test's end, and must exit 0.
func startServe(t *testing.T, db string, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"serve", "--addr", "127.0.0.1:0"}, args...)...)
	cmd.Env = append(append(os.Environ(), "RUNCUE_DB="+db), env...)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	line := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- l
		_, _ = io.Copy(io.Discard, stdout)
	}()
	var u string
	select {
	case l := <-line:
		require.True(t, strings.HasPrefix(l, "serving http://"), "%q %s", l, stderr.String())
		u = strings.TrimSpace(strings.TrimPrefix(l, "serving "))
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("serve printed nothing: %s", stderr.String())
	}
	t.Cleanup(func() {
		require.NoError(t, cmd.Process.Signal(os.Interrupt))
		assert.NoError(t, cmd.Wait(), "an interrupt ends serve cleanly, its streams too: %s", stderr.String())
	})
	return u
}

func get(t *testing.T, u string, user, password string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, u, nil)
	require.NoError(t, err)
	if user != "" {
		req.SetBasicAuth(user, password)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// TestServe: `runcue serve` serves the dashboard of a database whose owner
// runs in another process (here, the test's), and its actions reach the
// owner; with --prefix and --user it serves under a path, behind a
// password taken from the environment.
func TestServe(t *testing.T) {
	db, c := newDB(t)
	require.NoError(t, c.Service("api", runcue.Service{MaxConcurrent: 2}))
	require.NoError(t, c.Task("fetch", runcue.Task{Services: []string{"api"}, Handler: func(context.Context, *runcue.Work) (any, error) {
		return nil, nil
	}}))
	ctx := t.Context()
	require.NoError(t, c.Start(ctx))
	for _, target := range []string{"a", "b", "c"} {
		_, err := c.Submit(ctx, runcue.Submission{Task: "fetch", Target: target})
		require.NoError(t, err)
	}
	require.NoError(t, c.Drain(ctx))

	u := startServe(t, db, nil)
	code, body := get(t, u, "", "")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `data-state="completed">3<`)
	assert.Contains(t, body, "<title>runcue · work.db</title>")

	// A pause from the page's own origin reaches the owner.
	form := url.Values{"service": {"api"}, "op": {"pause"}}
	post := func(site string) int {
		req, err := http.NewRequest(http.MethodPost, u+"actions/service", strings.NewReader(form.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Sec-Fetch-Site", site)
		client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, err := client.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	assert.Equal(t, http.StatusForbidden, post("cross-site"), "a cross-origin post")
	st, err := c.ServiceStatus(ctx, "api")
	require.NoError(t, err)
	assert.False(t, st.Paused)
	assert.Equal(t, http.StatusSeeOther, post("same-origin"))
	require.Eventually(t, func() bool {
		st, err := c.ServiceStatus(ctx, "api")
		return err == nil && st.Paused
	}, 30*time.Second, 10*time.Millisecond, "the owner sees the pause")

	locked := startServe(t, db, []string{"RUNCUE_PASSWORD=s3cret"}, "--prefix", "/ops", "--user", "admin", "--read-only")
	assert.True(t, strings.HasSuffix(locked, "/ops/"), locked)
	code, _ = get(t, locked, "", "")
	assert.Equal(t, http.StatusUnauthorized, code)
	code, _ = get(t, locked, "admin", "wrong")
	assert.Equal(t, http.StatusUnauthorized, code)
	code, body = get(t, locked+"services", "admin", "s3cret")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `<base href="/ops/">`)
	assert.Contains(t, body, "read-only")

	_, errOut, code := run(t, db, "serve", "--user", "admin")
	assert.Equal(t, 2, code, "a user without a password")
	assert.Contains(t, errOut, "RUNCUE_PASSWORD")
}
