// Command release-proxy writes a Go module proxy (GOPROXY=file://DIR)
// holding the repository's modules as they are in the working tree, at one
// version: a release checked before it exists upstream, and the way to run
// go mod tidy or go get in a module whose go.mod requires another of the
// repository's modules at a version not published yet.
//
//	go -C cmd run ./release-proxy -out /tmp/proxy -version v0.1.0
//	GOWORK=off GOFLAGS=-mod=mod GONOSUMDB=github.com/runcue \
//	  GOPROXY=file:///tmp/proxy,https://proxy.golang.org go -C store/postgres mod tidy
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/runcue/runcue/cmd/internal/modproxy"
)

func main() {
	out := flag.String("out", "", "the proxy's directory (made if missing)")
	version := flag.String("version", "v0.1.0", "the version every module gets")
	root := flag.String("root", "..", "the repository's root (from cmd/)")
	flag.Parse()
	if *out == "" {
		log.Fatal("release-proxy: -out is required")
	}
	abs, err := filepath.Abs(*root)
	if err != nil {
		log.Fatal(err)
	}
	paths, err := modproxy.Build(abs, *out, *version, modproxy.Modules)
	if err != nil {
		log.Fatal(err)
	}
	for _, p := range paths {
		fmt.Fprintf(os.Stdout, "%s@%s\n", p, *version)
	}
	fmt.Fprintln(os.Stdout, "GOPROXY="+modproxy.URL(*out)+",https://proxy.golang.org")
}
