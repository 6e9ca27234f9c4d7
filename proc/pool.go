package proc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/runcue/runcue/internal/call"

	"github.com/runcue/runcue"
)

// registry holds the handlers pool workers serve, by name. It is filled
// before Main, in the orchestrator and in workers alike (they run the same
// main).
var registry = struct {
	sync.RWMutex
	m map[string]runcue.Handler
}{m: map[string]runcue.Handler{}}

// Register makes h available to pool workers under name. Call it before
// Main, in main, so that the orchestrator and its workers (the same binary)
// register the same handlers. Registering a name twice panics: it is a
// programming error at start-up, like http.Handle.
func Register(name string, h runcue.Handler) {
	registry.Lock()
	defer registry.Unlock()
	if _, dup := registry.m[name]; dup || name == "" || h == nil {
		panic(fmt.Sprintf("proc: Register(%q): empty, nil or registered twice", name))
	}
	registry.m[name] = h
}

// request and response travel over the pipes between the pool and a worker,
// one JSON object per line. Seq tags a request and the response that
// answers it: the pool accepts only the response to the request it has
// outstanding, so a line a worker writes out of turn can never be taken for
// another unit's result.
type request struct {
	Seq      uint64          `json:"seq"`
	Handler  string          `json:"handler"`
	ID       string          `json:"id"`
	Task     string          `json:"task"`
	Target   string          `json:"target,omitempty"`
	Params   json.RawMessage `json:"params,omitempty"`
	Attempt  int             `json:"attempt"`
	Deadline int64           `json:"deadline,omitempty"` // Unix ns
}

// response is a worker's answer: the handler's end as an executor
// reports one (call.Report), so that its error means in the
// orchestrator what it meant in the worker (a Skip, a Retry-After, ...).
type response struct {
	Seq uint64 `json:"seq"`
	call.Report
}

// serveWorker is the main of a pool worker: it serves requests from fd 3
// and answers on fd 4 until fd 3 closes (the orchestrator went away).
func serveWorker() int {
	protectPipes() // processes a handler starts must not inherit fds 3 and 4
	in, out := os.NewFile(3, "requests"), os.NewFile(4, "responses")
	if in == nil || out == nil {
		fmt.Fprintln(os.Stderr, "runcue: worker started without its pipes")
		return 2
	}
	limit, _ := strconv.Atoi(os.Getenv(maxMessageEnv))
	if limit <= 0 {
		limit = DefaultMaxMessage
	}
	dec, enc := json.NewDecoder(bufio.NewReader(in)), json.NewEncoder(out)
	for {
		var req request
		if err := dec.Decode(&req); err != nil {
			return 0 // the orchestrator closed the pipe (or died)
		}
		res := handle(req)
		if len(res.Result) > limit {
			res = response{Report: call.Report{Error: fmt.Sprintf("proc: result of %d bytes is over the pool's limit of %d (PoolOptions.MaxMessage)",
				len(res.Result), limit), Permanent: true}}
		}
		res.Seq = req.Seq
		if err := enc.Encode(res); err != nil {
			return 0
		}
	}
}

// maxMessageEnv passes PoolOptions.MaxMessage to a worker.
const maxMessageEnv = "RUNCUE_POOL_MAX_MESSAGE"

func handle(req request) response {
	registry.RLock()
	h := registry.m[req.Handler]
	registry.RUnlock()
	if h == nil {
		return response{Report: call.Report{Error: fmt.Sprintf("runcue: no pool handler %q registered in the worker", req.Handler), Permanent: true}}
	}
	ctx := context.Background()
	if req.Deadline != 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, time.Unix(0, req.Deadline))
		defer cancel()
	}
	w := &runcue.Work{ID: req.ID, Task: req.Task, Target: req.Target, Params: req.Params, Attempt: req.Attempt}
	out, err := call.Invoke(ctx, func(ctx context.Context) (any, error) { return h(ctx, w) }, math.MaxInt)
	r := call.ReportOf(err)
	r.Result = out
	return response{Report: r}
}

// PoolOptions configure a Pool. The zero value is valid.
type PoolOptions struct {
	// Size is the number of worker processes. Default runtime.NumCPU().
	Size int
	// Service is the name of the service the pool registers. Default
	// "process_pool".
	Service string
	// MaxMessage bounds, in bytes, a unit's params sent to a worker and the
	// result a worker sends back. Params over it fail the unit permanently
	// without using a worker; a worker refuses a result over it (the unit
	// fails permanently), and a response line longer than it fails the unit
	// and replaces the worker. Default DefaultMaxMessage.
	MaxMessage int
}

// DefaultMaxMessage is the default PoolOptions.MaxMessage: 64 MiB.
const DefaultMaxMessage = 64 << 20

// responseOverhead is room in a response line for its JSON envelope (the
// sequence number, an error text) beyond MaxMessage bytes of result.
const responseOverhead = 64 << 10

// Pool is a pool of worker processes. It is safe for simultaneous use by
// multiple goroutines.
type Pool struct {
	service string
	size    int
	exe     string
	max     int

	mu      sync.Mutex
	idle    []*worker
	live    map[*worker]struct{}
	workers int // started and not yet dead
	closed  bool
	room    chan struct{} // signalled when a worker becomes idle or dies
	all     sync.WaitGroup
}

// ErrPoolClosed is returned for work given to a closed pool.
var ErrPoolClosed = errors.New("proc: pool closed")

// NewPool returns a pool whose workers are this binary, re-executed: the
// program must call Main at the top of main. It registers with c a service
// (PoolOptions.Service) whose MaxConcurrent is the pool's size; tasks run on
// the pool list it in their Services. Workers start on demand.
func NewPool(c *runcue.Cue, o PoolOptions) (*Pool, error) {
	if !canSupervise {
		return nil, errors.New("proc: the process pool needs Unix (its pipes are inherited file descriptors)")
	}
	if o.Size <= 0 {
		o.Size = runtime.NumCPU()
	}
	if o.Service == "" {
		o.Service = "process_pool"
	}
	if o.MaxMessage < 0 {
		return nil, fmt.Errorf("proc: negative PoolOptions.MaxMessage %d", o.MaxMessage)
	}
	if o.MaxMessage == 0 {
		o.MaxMessage = DefaultMaxMessage
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("proc: find this binary: %w", err)
	}
	if err := c.Service(o.Service, runcue.Service{MaxConcurrent: o.Size}); err != nil {
		return nil, err
	}
	return &Pool{service: o.Service, size: o.Size, exe: exe, max: o.MaxMessage, room: make(chan struct{}, 1), live: map[*worker]struct{}{}}, nil
}

// Service returns the name of the pool's service.
func (p *Pool) Service() string { return p.service }

// Handler returns a runcue.Handler that runs the handler registered under
// name in a worker. A worker that dies during the run (a crash, os.Exit) or
// breaks the protocol (a line that is not the answer to its request: out of
// turn, undecodable, or longer than MaxMessage) fails the run with an error
// naming the cause, which the task's retry policy may retry, and is
// replaced at once; a timeout or cancellation kills the worker. Either way
// the pool starts a new worker for the next unit, and a worker's output is
// never attached to a unit it was not answering.
func (p *Pool) Handler(name string) runcue.Handler {
	return func(ctx context.Context, w *runcue.Work) (any, error) {
		if len(w.Params) > p.max {
			return nil, runcue.Permanent(fmt.Errorf("proc: params of %d bytes are over the pool's limit of %d (PoolOptions.MaxMessage)",
				len(w.Params), p.max))
		}
		wk, err := p.acquire(ctx)
		if err != nil {
			return nil, err
		}
		req := request{Handler: name, ID: w.ID, Task: w.Task, Target: w.Target, Params: w.Params, Attempt: w.Attempt}
		if dl, ok := ctx.Deadline(); ok {
			req.Deadline = dl.UnixNano()
		}
		res, err := wk.call(ctx, req, p.max+responseOverhead)
		if err != nil {
			p.discard(wk)
			return nil, err
		}
		if wk.out.Buffered() > 0 {
			p.discard(wk) // it wrote more than its answer: do not trust it again
		} else {
			p.putBack(wk)
		}
		if err := res.Err(); err != nil {
			return nil, err
		}
		return res.Result, nil
	}
}

// acquire returns an idle worker, starting one if the pool has room.
func (p *Pool) acquire(ctx context.Context) (*worker, error) {
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, ErrPoolClosed
		}
		if n := len(p.idle); n > 0 {
			wk := p.idle[n-1]
			p.idle = p.idle[:n-1]
			p.mu.Unlock()
			return wk, nil
		}
		if p.workers < p.size {
			p.workers++
			p.mu.Unlock()
			wk, err := p.startWorker()
			if err != nil {
				p.mu.Lock()
				p.workers--
				p.mu.Unlock()
				return nil, err
			}
			return wk, nil
		}
		p.mu.Unlock()
		select {
		case <-p.room:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

func (p *Pool) signalRoom() {
	select {
	case p.room <- struct{}{}:
	default:
	}
}

func (p *Pool) putBack(wk *worker) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		wk.kill()
		return
	}
	p.idle = append(p.idle, wk)
	p.mu.Unlock()
	p.signalRoom()
}

// discard kills a worker that died or must die; a new one replaces it on
// demand.
func (p *Pool) discard(wk *worker) {
	wk.kill()
	p.mu.Lock()
	p.workers--
	p.mu.Unlock()
	p.signalRoom()
}

// Close stops every worker, busy or idle, and waits for them. Runs in
// flight fail; work given afterwards fails with ErrPoolClosed.
func (p *Pool) Close() error {
	p.mu.Lock()
	p.closed = true
	p.idle = nil
	var all []*worker
	for wk := range p.live {
		all = append(all, wk)
	}
	p.mu.Unlock()
	for _, wk := range all {
		wk.kill()
	}
	p.all.Wait()
	return nil
}

// Workers returns the number of live worker processes.
func (p *Pool) Workers() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.live)
}

type worker struct {
	seq    uint64 // the last request's; used by the goroutine holding the worker
	cmd    *exec.Cmd
	in     *os.File // requests
	out    *bufio.Reader
	outF   *os.File
	enc    *json.Encoder
	exited chan struct{} // closed once the process has been waited for
	err    error         // how it exited
	once   sync.Once
}

func (p *Pool) startWorker() (*worker, error) {
	reqR, reqW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	resR, resW, err := os.Pipe()
	if err != nil {
		reqR.Close()
		reqW.Close()
		return nil, err
	}
	cmd := exec.Command(p.exe)
	cmd.Env = append(os.Environ(), modeEnv+"="+modeWorker, maxMessageEnv+"="+strconv.Itoa(p.max))
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr // the handlers' own output
	cmd.ExtraFiles = []*os.File{reqR, resW}
	err = start(cmd, syscall.SIGKILL)
	reqR.Close()
	resW.Close()
	if err != nil {
		reqW.Close()
		resR.Close()
		return nil, fmt.Errorf("proc: start worker: %w", err)
	}
	wk := &worker{cmd: cmd, in: reqW, outF: resR, out: bufio.NewReader(resR), enc: json.NewEncoder(reqW), exited: make(chan struct{})}
	p.mu.Lock()
	p.live[wk] = struct{}{}
	p.mu.Unlock()
	p.all.Go(func() {
		wk.err = cmd.Wait()
		release()
		p.mu.Lock()
		delete(p.live, wk)
		p.mu.Unlock()
		close(wk.exited)
	})
	return wk, nil
}

// call sends one request and waits for its response, the worker's death or
// ctx. A line longer than limit, one that does not decode, or one that
// answers another request is a protocol error: the caller discards the
// worker.
func (wk *worker) call(ctx context.Context, req request, limit int) (response, error) {
	wk.seq++
	req.Seq = wk.seq
	if err := wk.enc.Encode(req); err != nil {
		return response{}, wk.death(err)
	}
	type reply struct {
		res response
		err error // a protocol error; the worker is alive
		eof error // the pipe failed: the worker died
	}
	ch := make(chan reply, 1)
	go func() {
		line, err := readLine(wk.out, limit)
		switch {
		case errors.Is(err, errLineTooLong):
			ch <- reply{err: fmt.Errorf("proc: worker protocol error: a response line over %d bytes (PoolOptions.MaxMessage)", limit)}
			return
		case err != nil:
			ch <- reply{eof: err}
			return
		}
		var res response
		if err := json.Unmarshal(line, &res); err != nil {
			ch <- reply{err: fmt.Errorf("proc: worker protocol error: undecodable response %q: %v", abbreviate(line), err)}
			return
		}
		if res.Seq != req.Seq {
			ch <- reply{err: fmt.Errorf("proc: worker protocol error: response tagged %d to request %d (the worker wrote a line out of turn: %q)",
				res.Seq, req.Seq, abbreviate(line))}
			return
		}
		ch <- reply{res: res}
	}()
	select {
	case r := <-ch:
		switch {
		case r.eof != nil:
			return response{}, wk.death(r.eof)
		case r.err != nil:
			wk.kill()
			return response{}, r.err
		}
		return r.res, nil
	case <-ctx.Done():
		wk.kill() // the read above ends with the pipe
		<-ch
		return response{}, fmt.Errorf("%w (worker killed)", context.Cause(ctx))
	}
}

var errLineTooLong = errors.New("line too long")

// readLine reads one line of at most limit bytes (its newline included).
// Past the limit it stops reading and returns errLineTooLong.
func readLine(r *bufio.Reader, limit int) ([]byte, error) {
	var line []byte
	for {
		chunk, err := r.ReadSlice('\n')
		if len(line)+len(chunk) > limit {
			return nil, errLineTooLong
		}
		line = append(line, chunk...)
		if err != bufio.ErrBufferFull {
			return line, err
		}
	}
}

// abbreviate shortens a protocol line for an error message.
func abbreviate(line []byte) string {
	line = bytes.TrimRight(line, "\n")
	if len(line) > 200 {
		return string(line[:200]) + "..."
	}
	return string(line)
}

// death describes how a worker that stopped answering ended.
func (wk *worker) death(cause error) error {
	select {
	case <-wk.exited:
	case <-time.After(5 * time.Second):
		wk.kill()
		<-wk.exited
	}
	if wk.err != nil {
		return fmt.Errorf("proc: worker died: %v", wk.err)
	}
	return fmt.Errorf("proc: worker stopped answering: %v", cause)
}

// kill ends the worker and its process group, and waits for it.
func (wk *worker) kill() {
	wk.once.Do(func() {
		wk.in.Close()
		signalGroup(wk.cmd.Process.Pid, syscall.SIGKILL)
		<-wk.exited
		wk.outF.Close()
	})
}
