// Command gofront is issue 27's spike: is a compiled gRPC front end worth building? One binary, three
// roles, driven by bench/frontecho.py:
//
//	gofront front -addr HOST:PORT -workers SOCK[,SOCK]  grpc-go terminates HTTP/2 and gRPC and hands each
//	                                                    call's method, metadata and request bytes to Python
//	                                                    worker processes over Unix sockets (front.go)
//	gofront echo -addr HOST:PORT -route FILE            the same route read answered in Go: the compiled
//	                                                    ceiling (echo.go)
//	gofront load -addr HOST:PORT -method M -request FILE  a closed-loop gRPC load generator (load.go); with
//	                                                    -addrs, -requests, -require-field and -sum-field
//	                                                    the etcd comparison's (bench/gocompare.py)
//
// The servers print "listening on HOST:PORT" once they accept calls; the load generator prints one JSON
// object. Neither server does any proto work of its own beyond echo's decode of the request.
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: gofront front|echo|load [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "front":
		err = runFront(os.Args[2:])
	case "echo":
		err = runEcho(os.Args[2:])
	case "load":
		err = runLoad(os.Args[2:])
	default:
		err = fmt.Errorf("unknown role %q: front, echo or load", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gofront:", err)
		os.Exit(1)
	}
}
