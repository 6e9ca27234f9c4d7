package runcuecli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/dashboard"
	"github.com/spf13/cobra"
)

// passwordEnv names the variable serve reads the basic-auth password from
// (never a flag: a command line is visible to every user of the machine).
const passwordEnv = "RUNCUE_PASSWORD"

func (c *cli) serveCmd() *cobra.Command {
	var addr, prefix, title, user string
	var readOnly bool
	var trusted, ancestors []string
	cmd := &cobra.Command{
		Use:         "serve [--addr 127.0.0.1:8080]",
		Annotations: map[string]string{unbounded: "yes"},
		Short:       "Serve the live dashboard of the database over HTTP until interrupted (the owner may run in another process)",
		Long: `Serve the live dashboard of the database over HTTP until interrupted:
overview, services, work, each unit, and a live tail of events. It reads and
acts on the database whether or not its owner runs in this process; actions
(pause, resume, limits, retry, cancel) are POSTs from the page's own origin
only, and --read-only refuses them.

With --user, every request needs HTTP basic authentication with that user and
the password in $` + passwordEnv + `; serve it behind TLS then (a reverse proxy).
It prints the address it serves on, then one line per request that fails.`,
		Args: args(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !strings.HasPrefix(prefix, "/") {
				return usageError{fmt.Errorf("--prefix %q: want a path starting with /", prefix)}
			}
			password := os.Getenv(passwordEnv)
			if user != "" && password == "" {
				return usageError{fmt.Errorf("--user needs a password in $%s", passwordEnv)}
			}
			return c.with(func(ctx context.Context, q *runcue.Cue) error {
				return c.serve(ctx, q, addr, prefix, user, password, dashboard.Options{Title: title, ReadOnly: readOnly, TrustedOrigins: trusted,
					FrameAncestors: ancestors})
			})
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "127.0.0.1:8080", "the address to listen on (port 0: any free port)")
	cmd.Flags().StringVar(&prefix, "prefix", "/", "the path to serve the dashboard under")
	cmd.Flags().StringVar(&title, "title", "", "the title of every page (default: the database's file name)")
	cmd.Flags().BoolVar(&readOnly, "read-only", false, "hide and refuse every action")
	cmd.Flags().StringVar(&user, "user", "", "require basic authentication as this user (password in $"+passwordEnv+")")
	cmd.Flags().StringSliceVar(&trusted, "trusted-origin", nil, "an origin (https://ops.example.com) allowed to post actions besides the request's own, behind a proxy that rewrites Host")
	cmd.Flags().StringSliceVar(&ancestors, "frame-ancestor", nil, "a source allowed to show the pages in a frame ('self', https://portal.example.com); default none")
	return cmd
}

func (c *cli) serve(ctx context.Context, q *runcue.Cue, addr, prefix, user, password string, o dashboard.Options) (err error) {
	if o.Title == "" {
		o.Title = "runcue · " + baseName(c.db)
	}
	for _, origin := range o.TrustedOrigins {
		if err := http.NewCrossOriginProtection().AddTrustedOrigin(origin); err != nil {
			return usageError{fmt.Errorf("--trusted-origin %q: %v", origin, err)}
		}
	}
	prefix = "/" + strings.Trim(prefix, "/")
	var h http.Handler = dashboard.Handler(q, o)
	mux := http.NewServeMux()
	if prefix == "/" {
		mux.Handle("/", h)
	} else {
		mux.Handle(prefix+"/", http.StripPrefix(prefix, h))
		mux.Handle(prefix, http.RedirectHandler(prefix+"/", http.StatusMovedPermanently))
	}
	h = mux
	if user != "" {
		h = dashboard.BasicAuth(h, user, password, o.Title)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	// The dashboard's streams never go idle: Shutdown ends them through the
	// base context.
	base, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second,
		BaseContext: func(net.Listener) context.Context { return base }}
	url := "http://" + ln.Addr().String() + strings.TrimSuffix(prefix, "/") + "/"
	fmt.Fprintf(c.out, "serving %s\n", url)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	cancel()
	shutdown, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	if err := srv.Shutdown(shutdown); err != nil {
		return err
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// baseName is the file name of a path, for titles.
func baseName(path string) string {
	if isPostgresURL(path) {
		// The database's name and host, never the URL's credentials.
		if u, err := url.Parse(path); err == nil {
			return strings.TrimPrefix(u.Path, "/") + "@" + u.Hostname()
		}
		return "postgres"
	}
	if i := strings.LastIndexAny(path, `/\`); i >= 0 {
		return path[i+1:]
	}
	return path
}
