//go:build unix

package postgres_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// cluster is a PostgreSQL server of a test's own (Debian's package), which
// the test may restart, stop, start and restore: the shared test server
// (scripts/with-postgres) serves the tests beside it.
type cluster struct {
	t    *testing.T
	bin  string
	dir  string // holds data/ and the socket
	port int
	as   []string // runuser -u postgres -- as root
}

// privateCluster starts a cluster for t, stopped and removed at its end.
// Without Debian's PostgreSQL server t is skipped, or fails under CI=true.
func privateCluster(t *testing.T) *cluster {
	t.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(bins) == 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true and no PostgreSQL server (initdb) is installed: .ci/run installs postgresql")
		}
		t.Skip("SKIP: no PostgreSQL server (initdb): apt-get install postgresql")
	}
	sort.Strings(bins)
	c := &cluster{t: t, bin: filepath.Dir(bins[len(bins)-1])}
	dir, err := os.MkdirTemp("", "runcue-pgfault-")
	require.NoError(t, err)
	c.dir = dir
	if os.Getuid() == 0 {
		u, err := user.Lookup("postgres")
		require.NoError(t, err, "the postgres user (Debian's package makes it)")
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		require.NoError(t, os.Chown(dir, uid, gid))
		c.as = []string{"runuser", "-u", "postgres", "--"}
	}
	t.Cleanup(func() {
		_ = c.run("pg_ctl", "-D", c.data(), "-m", "immediate", "stop")
		_ = os.RemoveAll(dir)
	})
	c.port = freePort(t)
	require.NoError(t, c.run("initdb", "-D", c.data(), "-U", "postgres", "-A", "trust", "--no-sync"))
	c.start()
	return c
}

func (c *cluster) data() string { return filepath.Join(c.dir, "data") }

// run runs a program of the server's as its user, from /.
func (c *cluster) run(prog string, args ...string) error {
	argv := append(append(append([]string{}, c.as...), filepath.Join(c.bin, prog)), args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = "/"
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", prog, err, out)
	}
	return nil
}

func (c *cluster) opts() string {
	return fmt.Sprintf("-c listen_addresses=127.0.0.1 -p %d -k %s -c fsync=off -c max_connections=200", c.port, c.dir)
}

// start starts the server and waits until it answers.
func (c *cluster) start() {
	c.t.Helper()
	require.NoError(c.t, c.run("pg_ctl", "-D", c.data(), "-l", filepath.Join(c.dir, "server.log"), "-w", "-o", c.opts(), "start"))
}

// stop stops the server at once (as a crash would).
func (c *cluster) stop() {
	c.t.Helper()
	require.NoError(c.t, c.run("pg_ctl", "-D", c.data(), "-m", "immediate", "-w", "stop"))
}

// restart is pg_ctl restart -m immediate: a crash and a restart.
func (c *cluster) restart() {
	c.t.Helper()
	require.NoError(c.t, c.run("pg_ctl", "-D", c.data(), "-l", filepath.Join(c.dir, "server.log"), "-m", "immediate", "-w", "-o", c.opts(), "restart"))
}

// backup copies the data directory of the stopped server to name.
func (c *cluster) backup(name string) {
	c.t.Helper()
	out, err := exec.Command("cp", "-a", c.data(), filepath.Join(c.dir, name)).CombinedOutput()
	require.NoError(c.t, err, "%s", out)
}

// restore replaces the stopped server's data directory with backup name.
func (c *cluster) restore(name string) {
	c.t.Helper()
	require.NoError(c.t, os.RemoveAll(c.data()))
	out, err := exec.Command("cp", "-a", filepath.Join(c.dir, name), c.data()).CombinedOutput()
	require.NoError(c.t, err, "%s", out)
}

// addr is the server's address.
func (c *cluster) addr() string { return "127.0.0.1:" + strconv.Itoa(c.port) }

// url is a URL of the server's postgres database at addr (the server's,
// or a proxy's in front of it), in schema.
func (c *cluster) url(addr, schema string) string {
	return fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable&search_path=%s", addr, schema)
}

// createSchema creates schema on the server.
func (c *cluster) createSchema(schema string) {
	c.t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, c.url(c.addr(), "public"))
	require.NoError(c.t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `CREATE SCHEMA `+schema)
	require.NoError(c.t, err)
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// proxy is a TCP proxy on 127.0.0.1 in front of a server: it passes
// traffic, drops every connection (and refuses new ones for a while), or
// blackholes it (connections are accepted and kept, and no byte passes
// either way until it passes again, as a network partition that heals).
type proxy struct {
	t        *testing.T
	l        net.Listener
	upstream string

	mu    sync.Mutex
	cond  *sync.Cond
	hole  bool // blackholing
	conns map[net.Conn]struct{}
	// cutAfter, when set, cuts the connection that carries the next
	// client message whose bytes contain it, right after forwarding it
	// (the server gets the message; the client never gets the answer).
	cutAfter []byte
	cuts     int
	closed   bool
	wg       sync.WaitGroup
}

func startProxy(t *testing.T, upstream string) *proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &proxy{t: t, l: l, upstream: upstream, conns: map[net.Conn]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *proxy) addr() string { return p.l.Addr().String() }

func (p *proxy) close() {
	p.mu.Lock()
	p.closed, p.hole = true, false
	for c := range p.conns {
		c.Close()
	}
	p.cond.Broadcast()
	p.mu.Unlock()
	p.l.Close()
	p.wg.Wait()
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *proxy) serve(c net.Conn) {
	defer p.wg.Done()
	up, err := net.DialTimeout("tcp", p.upstream, 5*time.Second)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		c.Close()
		up.Close()
		return
	}
	p.conns[c], p.conns[up] = struct{}{}, struct{}{}
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { p.pipe(up, c, true); done <- struct{}{} }()
	go func() { p.pipe(c, up, false); done <- struct{}{} }()
	<-done
	c.Close()
	up.Close()
	<-done
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}

// pipe copies from src to dst, holding each chunk while blackholing.
func (p *proxy) pipe(dst, src net.Conn, fromClient bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.hole && !p.closed {
				p.cond.Wait()
			}
			cut := fromClient && p.cutAfter != nil && contains(buf[:n], p.cutAfter)
			if cut {
				p.cutAfter = nil
				p.cuts++
			}
			p.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
			if cut {
				src.Close()
				dst.Close()
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				return
			}
			return
		}
	}
}

func contains(b, sub []byte) bool {
	for i := 0; i+len(sub) <= len(b); i++ {
		if string(b[i:i+len(sub)]) == string(sub) {
			return true
		}
	}
	return false
}

// drop closes every connection through the proxy.
func (p *proxy) drop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

// blackhole stops all traffic (on) or lets it pass again (off).
func (p *proxy) blackhole(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hole = on
	p.cond.Broadcast()
}

// cutAfterMessage arms a cut (see proxy.cutAfter).
func (p *proxy) cutAfterMessage(sub []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cutAfter = sub
}

func (p *proxy) cutCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cuts
}
