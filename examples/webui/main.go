// Command webui runs the spec's document-processing pipeline (split a PDF,
// extract each page's text, analyse the document, upload the result) with
// fake handlers that sleep, and shows it live in the operator dashboard
// (package dashboard): counts, services and their limits, every unit with
// its attempts and events, a live tail, and the actions.
//
//	go run ./examples/webui          # then open http://localhost:8080
//	curl -X POST localhost:8080/documents    # one more document
//
// A new document arrives every -every (3s); the JSON API beside the
// dashboard is POST /documents, GET /api/services and GET /events (SSE).
//
// Follow-up work is submitted from the event stream, as the spec prescribes:
// handlers stay pure, and when a split completes the application submits the
// page extractions, the analysis that depends on all of them, and the upload.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/dashboard"
	"github.com/runcue/runcue/sse"
)

// app is the example application: a Cue, its handlers and its HTTP API.
type app struct {
	cue   *runcue.Cue
	speed float64 // multiplies every fake duration
	docs  atomic.Int64
}

type splitParams struct {
	Document string `json:"document"`
}

type splitResult struct {
	Pages int `json:"pages"`
}

type pageParams struct {
	Document string `json:"document"`
	Page     int    `json:"page"`
}

func main() {
	addr := flag.String("addr", "localhost:8080", "listen address")
	dbPath := flag.String("db", "", "database file (default: a new temporary file)")
	every := flag.Duration("every", 3*time.Second, "submit a new document this often (0: only the first two and POST /documents)")
	flag.Parse()
	if *dbPath == "" {
		dir, err := os.MkdirTemp("", "runcue-webui")
		if err != nil {
			log.Fatal(err)
		}
		defer os.RemoveAll(dir)
		*dbPath = filepath.Join(dir, "webui.db")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	if err := run(ctx, ln, *dbPath, 1, 2, *every); err != nil {
		log.Fatal(err)
	}
}

// run serves on ln until ctx ends, after submitting initial documents, and
// then one more every interval (if positive).
func run(ctx context.Context, ln net.Listener, dbPath string, speed float64, initial int, every time.Duration) error {
	cue, err := runcue.Open(dbPath, runcue.Config{Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		return err
	}
	defer cue.Close()
	a := &app{cue: cue, speed: speed}
	if err := a.register(); err != nil {
		return err
	}
	if err := cue.Start(ctx); err != nil {
		return err
	}
	go a.followUps(ctx)
	for range initial {
		if _, err := a.submitDocument(ctx); err != nil {
			return err
		}
	}
	if every > 0 {
		go a.arrivals(ctx, every)
	}
	mux := http.NewServeMux()
	mux.Handle("/", dashboard.Handler(cue, dashboard.Options{Title: "runcue · document pipeline"}))
	mux.Handle("GET /events", sse.Handler(cue, sse.Options{}))
	mux.Handle("POST /documents", http.NewCrossOriginProtection().Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := a.submitDocument(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		json.NewEncoder(w).Encode(map[string]string{"id": id})
	})))
	mux.HandleFunc("GET /api/services", func(w http.ResponseWriter, r *http.Request) {
		st, err := cue.Services(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		json.NewEncoder(w).Encode(st)
	})
	// Requests get a context that Shutdown cancels: an event stream never
	// goes idle, so without it Shutdown would wait for its timeout.
	base, endStreams := context.WithCancel(context.Background())
	defer endStreams()
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second,
		BaseContext: func(net.Listener) context.Context { return base }}
	srv.RegisterOnShutdown(endStreams)
	fmt.Printf("runcue webui: open http://%s (Ctrl-C to stop)\n", ln.Addr())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	return cue.StopAndCancel(shutdown)
}

func (a *app) register() error {
	c := a.cue
	for name, s := range map[string]runcue.Service{
		"process_pool": {MaxConcurrent: 2},
		"openai":       {MaxConcurrent: 5, RateLimit: 60, RateWindow: 10 * time.Second},
		"s3":           {MaxConcurrent: 10},
	} {
		if err := c.Service(name, s); err != nil {
			return err
		}
	}
	tasks := map[string]runcue.Task{
		"split_pdf": {Services: []string{"process_pool"}, Retry: runcue.RetryPolicy{MaxAttempts: 2},
			Handler: runcue.Handle(a.split)},
		// One call in eight fails ("model overloaded"): with three
		// attempts one page in 512 would fail for good and hold its
		// document back; eight make that one in 16 million.
		"extract_text": {Services: []string{"openai"}, Retry: runcue.RetryPolicy{MaxAttempts: 8}, Handler: runcue.Handle(a.extract)},
		"analyze":      {Services: []string{"openai"}, Handler: runcue.Handle(a.analyze)},
		"upload_result": {Services: []string{"s3"},
			Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
				return nil, a.sleep(ctx, w, 200, 400)
			}},
	}
	for name, t := range tasks {
		if err := c.Task(name, t); err != nil {
			return err
		}
	}
	return nil
}

// arrivals submits a document every interval until ctx ends.
func (a *app) arrivals(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := a.submitDocument(ctx); err != nil && ctx.Err() == nil {
				log.Print("arrivals: ", err)
			}
		}
	}
}

func (a *app) submitDocument(ctx context.Context) (string, error) {
	n := a.docs.Add(1)
	s, err := a.cue.Submit(ctx, runcue.Submission{Task: "split_pdf", Target: fmt.Sprintf("document-%d.pdf", n),
		Params: splitParams{Document: fmt.Sprintf("doc-%d", n)}})
	return s.ID, err
}

// sleep stands in for real work: it takes lo..hi milliseconds (scaled),
// reporting progress, and honours cancellation.
func (a *app) sleep(ctx context.Context, w *runcue.Work, lo, hi int) error {
	total := time.Duration(float64(lo+rand.IntN(hi-lo+1))*a.speed) * time.Millisecond
	const steps = 5
	for i := 1; i <= steps; i++ {
		select {
		case <-time.After(total / steps):
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		w.Progress(map[string]int{"percent": i * 100 / steps})
	}
	return nil
}

func (a *app) split(ctx context.Context, w *runcue.Work, p splitParams) (splitResult, error) {
	if err := a.sleep(ctx, w, 400, 900); err != nil {
		return splitResult{}, err
	}
	return splitResult{Pages: 2 + rand.IntN(5)}, nil
}

func (a *app) extract(ctx context.Context, w *runcue.Work, p pageParams) (map[string]any, error) {
	if err := a.sleep(ctx, w, 300, 1200); err != nil {
		return nil, err
	}
	if rand.IntN(8) == 0 {
		return nil, errors.New("model overloaded") // retried with backoff
	}
	return map[string]any{"page": p.Page, "words": 200 + rand.IntN(400)}, nil
}

func (a *app) analyze(ctx context.Context, w *runcue.Work, p splitParams) (map[string]any, error) {
	if err := a.sleep(ctx, w, 500, 1000); err != nil {
		return nil, err
	}
	return map[string]any{"document": p.Document, "summary": "a fine document"}, nil
}

// followUps submits each split document's next steps when its split
// completes: one extraction per page, the analysis depending on all of them,
// and the upload depending on the analysis, in one batch.
func (a *app) followUps(ctx context.Context) {
	evs, cancel, err := a.cue.Subscribe(ctx, runcue.SubscribeOptions{After: runcue.SeqNow,
		Types: []runcue.EventType{runcue.EventWorkCompleted}, Tasks: []string{"split_pdf"}})
	if err != nil {
		log.Print("follow-ups: ", err)
		return
	}
	defer cancel()
	for ev := range evs {
		var res splitResult
		if json.Unmarshal(ev.Result, &res) != nil {
			continue
		}
		info, err := a.cue.Get(ctx, ev.WorkID)
		if err != nil {
			continue
		}
		var p splitParams
		_ = json.Unmarshal(info.Params, &p)
		var subs []runcue.Submission
		var pages []string
		for page := 1; page <= res.Pages; page++ {
			id := fmt.Sprintf("%s/page-%d", ev.WorkID, page)
			pages = append(pages, id)
			subs = append(subs, runcue.Submission{Task: "extract_text", ID: id, Target: fmt.Sprintf("%s page %d", info.Target, page),
				Params: pageParams{Document: p.Document, Page: page}, DependsOn: []string{ev.WorkID},
				IdempotencyKey: id})
		}
		analysis := ev.WorkID + "/analyze"
		subs = append(subs,
			runcue.Submission{Task: "analyze", ID: analysis, Target: info.Target, Params: p, DependsOn: pages, IdempotencyKey: analysis},
			runcue.Submission{Task: "upload_result", ID: ev.WorkID + "/upload", Target: info.Target, DependsOn: []string{analysis},
				IdempotencyKey: ev.WorkID + "/upload"})
		if _, err := a.cue.SubmitBatch(ctx, subs); err != nil && ctx.Err() == nil {
			log.Printf("follow-ups of %s: %v", ev.WorkID, err)
		}
	}
}
