// Command front is a node's compiled gRPC front end ([node] grpc_front = "go"; docs/architecture.md,
// "Processes"): grpc-go owns the node's gRPC port (TLS, HTTP/2, message and stream limits, keepalive
// enforcement) and hands each call, as bytes, to the node's worker processes over their Unix sockets
// (round-robin over the live ones), where the node's own service code answers it
// (nameserver/api/frontchannel.py). Repeated eventual reads whose replies a worker marked reusable are
// answered here from a reply cache while that worker's state has not moved (cache.go). The core starts it (nameserver/ops/gofront.py) and it exits when its
// stdin ends (the core is gone). It prints "listening on HOST:PORT" once it serves: after a worker's
// socket took its first link, so a starting node refuses connections rather than calls.
package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	_ "google.golang.org/grpc/encoding/gzip" // grpcio's server takes gzip-compressed calls: so does this one
	"google.golang.org/grpc/keepalive"
)

// rawCodec leaves messages as bytes: the worker decodes requests and encodes replies.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	if b, ok := v.(*[]byte); ok {
		return *b, nil
	}
	return nil, fmt.Errorf("front: cannot marshal %T", v)
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	b, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("front: cannot unmarshal into %T", v)
	}
	*b = append((*b)[:0], data...) // data is gRPC's buffer, reused after this returns
	return nil
}

func (rawCodec) Name() string { return "proto" }

type settings struct {
	addr, workers, cert, key, ca, clientAuth string
	maxMessage, maxConnections, maxStreams   int
	maxHeaderBytes                           int
	counters                                 string
	cacheBytes, cacheEntries                 int
	handshake, idle, minPing, stopGrace      time.Duration
}

func parse(args []string) (settings, error) {
	var s settings
	fs := flag.NewFlagSet("front", flag.ContinueOnError)
	fs.StringVar(&s.addr, "addr", "", "the node's gRPC address ([node] grpc_addr)")
	fs.StringVar(&s.workers, "workers", "", "the workers' Unix socket paths, comma-separated")
	fs.IntVar(&s.maxMessage, "max-message", 8<<20, "largest request or reply message ([grpc] max_message_bytes)")
	fs.IntVar(&s.maxConnections, "max-connections", 4096, "connections at once (limits.grpc_max_connections)")
	fs.IntVar(&s.maxStreams, "max-streams", 100, "streams per connection (limits.grpc_max_streams_per_connection)")
	fs.IntVar(&s.maxHeaderBytes, "max-header-bytes", 8<<10, "a call's headers, bytes (grpcio's bound)")
	fs.DurationVar(&s.handshake, "handshake-timeout", 10*time.Second, "limits.grpc_handshake_timeout_ms")
	fs.DurationVar(&s.idle, "idle-timeout", 5*time.Minute, "limits.grpc_idle_timeout_ms")
	fs.DurationVar(&s.minPing, "min-ping-interval", 5*time.Minute, "pings closer than this are strikes (grpcio's)")
	fs.DurationVar(&s.stopGrace, "stop-grace", time.Second, "how long calls may finish at SIGTERM")
	fs.StringVar(&s.cert, "tls-cert", "", "the node's certificate ([tls] cert_file); empty: plaintext")
	fs.StringVar(&s.key, "tls-key", "", "its key ([tls] key_file)")
	fs.StringVar(&s.ca, "tls-ca", "", "the CA client certificates chain to ([tls] ca_file)")
	fs.StringVar(&s.clientAuth, "client-auth", "none", `"require": mutual TLS ([tls] client_auth)`)
	fs.StringVar(&s.counters, "counters", "", "a file the call counts by status code are written to, each second")
	fs.IntVar(&s.cacheBytes, "cache-bytes", 0, "the reply cache's bound, bytes, over all workers ([node] grpc_front_cache_mb); 0: no cache")
	fs.IntVar(&s.cacheEntries, "cache-entries", 1<<16, "the reply cache's bound, entries, over all workers")
	if err := fs.Parse(args); err != nil {
		return s, err
	}
	if s.addr == "" || s.workers == "" {
		return s, errors.New("-addr and -workers are required")
	}
	if (s.cert == "") != (s.key == "") {
		return s, errors.New("-tls-cert and -tls-key go together")
	}
	return s, nil
}

// transport is the node's TLS as nameserver/tlsconf.py's server_credentials makes it; nil for plaintext.
func transport(s settings) (credentials.TransportCredentials, error) {
	if s.cert == "" {
		return nil, nil
	}
	pair, err := tls.LoadX509KeyPair(s.cert, s.key)
	if err != nil {
		return nil, fmt.Errorf("[tls] cert_file/key_file: %w", err)
	}
	conf := &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	if s.clientAuth == "require" && s.ca != "" {
		pem, err := os.ReadFile(s.ca)
		if err != nil {
			return nil, fmt.Errorf("[tls] ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("[tls] ca_file %s: no PEM certificate", s.ca)
		}
		conf.ClientCAs, conf.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return credentials.NewTLS(conf), nil
}

// streamWorkers is how many goroutines serve calls (grpc.NumStreamWorkers).
const streamWorkers = 64

func serverOptions(s settings, f *front) ([]grpc.ServerOption, error) {
	opts := []grpc.ServerOption{
		grpc.ForceServerCodec(rawCodec{}),
		grpc.UnknownServiceHandler(f.handle),
		// calls run on long-lived goroutines, whose stacks have grown already: a goroutine a call grows its
		// stack (copies it) each time, about a tenth of this process's CPU (perf, docs/benchmarks.md); past
		// these, a call gets a goroutine of its own, as without them
		grpc.NumStreamWorkers(streamWorkers),
		grpc.MaxRecvMsgSize(s.maxMessage),
		grpc.MaxSendMsgSize(s.maxMessage),
		grpc.MaxConcurrentStreams(uint32(s.maxStreams)),
		grpc.MaxHeaderListSize(uint32(s.maxHeaderBytes)),
		grpc.ConnectionTimeout(s.handshake),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: s.idle}),
		// a client pinging more often than this, or with no call open, is sent GOAWAY (grpcio's defaults)
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: s.minPing, PermitWithoutStream: false}),
	}
	creds, err := transport(s)
	if err != nil {
		return nil, err
	}
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
	}
	return opts, nil
}

// capped closes connections past its bound at once (as grpcio's max_allowed_incoming_connections).
type capped struct {
	net.Listener
	slots chan struct{}
}

type cappedConn struct {
	net.Conn
	once  sync.Once
	slots chan struct{}
}

func (c *cappedConn) Close() error {
	c.once.Do(func() { <-c.slots })
	return c.Conn.Close()
}

func (l *capped) Accept() (net.Conn, error) {
	for {
		conn, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
			return &cappedConn{Conn: quiet(conn), slots: l.slots}, nil
		default:
			conn.Close()
		}
	}
}

func run(args []string) error {
	s, err := parse(args)
	if err != nil {
		return err
	}
	maxFrame := s.maxMessage + batchBytes + frameSlack
	f := &front{workers: newWorkers(strings.Split(s.workers, ","), maxFrame, s.cacheBytes, s.cacheEntries)}
	if s.counters != "" {
		go f.counts.keep(s.counters, func() string { return f.stats.text(f.workers) })
	}
	opts, err := serverOptions(s, f)
	if err != nil {
		return err
	}
	server := grpc.NewServer(opts...)
	go func() { // the core holds our stdin: its end is the core's
		io.Copy(io.Discard, os.Stdin)
		server.Stop()
		os.Exit(0)
	}()
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-f.workers.ready:
	case <-stop:
		return nil
	}
	lis, err := net.Listen("tcp", s.addr)
	if err != nil {
		return fmt.Errorf("cannot listen on [node] grpc_addr %s: %w", s.addr, err)
	}
	fmt.Printf("listening on %s\n", lis.Addr())
	go func() {
		<-stop
		timer := time.AfterFunc(s.stopGrace, server.Stop)
		server.GracefulStop()
		timer.Stop()
	}()
	return server.Serve(&capped{Listener: lis, slots: make(chan struct{}, s.maxConnections)})
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "front:", err)
		os.Exit(1)
	}
}
