package main

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// workerCaller is the header a worker sets on the calls it passes to its core (nameserver/headers.py): who
// the client is. A client's own copy never reaches a worker; the caller travels in its own field.
const workerCaller = "x-rip18-worker-caller"

// window is how many messages each way may wait unacknowledged: a client stream's requests not yet taken by
// the worker's handler, and a server stream's replies not yet handed to the client (so a client that does
// not read holds at most this many replies here, and the worker's call guard sees the stall).
const window = 2

type front struct {
	workers *workers
	counts  counters
	// the reply cache (cache.go; each link's, nil when off): the methods a worker ever marked a reply of
	// reusable (only their calls are read ahead and looked up), and the counts
	cacheable sync.Map // method -> struct{}
	stats     cacheStats
}

// handle serves every method (the unknown-service handler), counted by its status.
func (f *front) handle(_ any, stream grpc.ServerStream) error {
	if d, ok := stream.Context().Deadline(); ok {
		ctx, cancel := context.WithDeadline(stream.Context(), d.Add(-min(deadlineLead, time.Until(d)/10)))
		defer cancel()
		stream = &aheadOfDeadline{ServerStream: stream, ctx: ctx}
	}
	err := f.pass(stream)
	f.counts.count(err)
	return err
}

// deadlineLead is how long before a call's deadline (at most a tenth of what the call had left when it
// came) the front end ends it itself, with DEADLINE_EXCEEDED, as grpcio's server does. At the deadline
// grpc-go's transport resets the stream (RST_STREAM CANCEL, a timer of its own: operateHeaders in
// internal/transport/http2_server.go), racing the handler's status; a client whose own deadline timer is
// late (a busy machine) then sees CANCELLED. A status written first stops that timer (the stream's cancel).
// The client's deadline is the earlier one (the server counts from the headers' arrival), so the status
// comes at most about this much before it.
const deadlineLead = 20 * time.Millisecond

// aheadOfDeadline is a call's stream whose context ends deadlineLead before the call's deadline: everything
// the call does (the worker's deadline in its call record included) ends by then.
type aheadOfDeadline struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *aheadOfDeadline) Context() context.Context { return s.ctx }

// pass answers a call from the reply cache, or hands it to a worker.
//
// A call of a method the workers mark reusable is read ahead (its request and its end) before any worker
// sees it: a unary call's request whose key has an entry of the picked worker's latest generation is
// answered from it at once; any other goes to that worker, the request with the call.
func (f *front) pass(stream grpc.ServerStream) error {
	method, ok := grpc.MethodFromServerStream(stream)
	if !ok {
		return status.Error(codes.Internal, "no method")
	}
	l := f.workers.pick()
	if l == nil {
		return status.Error(codes.Unavailable, "no worker process of this node is serving; try another node")
	}
	rec, identity, err := callRecord(nil, method, stream)
	if err != nil {
		return err
	}
	if _, known := f.cacheable.Load(method); !known || l.cache == nil {
		return f.relay(l, method, stream, rec, "", nil, nil)
	}
	ctx := stream.Context()
	pending := readAhead(stream)
	var got ahead
	select {
	case got = <-pending:
	default:
		timer := time.NewTimer(requestWait)
		select {
		case got = <-pending:
			timer.Stop()
		case <-timer.C: // a client slow to send its request: the worker's, with its progress bound
			return f.relay(l, method, stream, rec, "", nil, pending)
		case <-ctx.Done():
			timer.Stop()
			return status.FromContextError(ctx.Err()).Err()
		}
	}
	key := ""
	if got.err == nil && got.ended {
		key = cacheKey(method, identity, rec, got.msg)
		if hit := l.cache.get(key); hit != nil {
			f.stats.hit(method)
			if hit.trailer != nil {
				stream.SetTrailer(hit.trailer)
			}
			reply := hit.reply
			return stream.SendMsg(&reply)
		}
		f.stats.misses.Add(1)
	}
	return f.relay(l, method, stream, rec, key, &got, nil)
}

// relay hands a call to worker l: the call's records go to it, its records back become the replies, the
// status and the trailing metadata. `got`: what was read ahead of it (sent with the call record); `pending`:
// a read ahead still under way (its outcome sent when it comes); neither: the stream is read as it comes.
// `key`: the reply's key in l's cache, when the worker marks it reusable ("": not kept).
func (f *front) relay(l *link, method string, stream grpc.ServerStream, rec [][]byte, key string, got *ahead,
	pending <-chan ahead) error {
	c := l.open()
	if c == nil {
		return status.Error(codes.Unavailable, "no worker process of this node is serving; try another node")
	}
	defer l.forget(c)
	ctx := stream.Context()
	rec[1] = c.key
	taken := make(chan struct{}, window+inbox)
	for range window {
		taken <- struct{}{}
	}
	switch {
	case got != nil:
		recs, next, err := aheadRecords(c, *got)
		if err != nil {
			return err
		}
		if !l.send(append([][][]byte{rec}, recs...)...) {
			return status.Error(codes.Unavailable, "the node's worker process went away")
		}
		if next != nil {
			<-taken // the window is full: nothing was sent before
			go pumpRequests(l, c, stream, taken, next)
		}
	default:
		if !l.send(rec) {
			return status.Error(codes.Unavailable, "the node's worker process went away")
		}
		if pending == nil {
			go pumpRequests(l, c, stream, taken, nil)
		}
	}
	var replies *replySender
	defer func() {
		if replies != nil {
			close(replies.queue)
		}
	}()
	for {
		select {
		case late := <-pending:
			pending = nil
			recs, next, err := aheadRecords(c, late)
			if err != nil {
				l.send([][]byte{{kindCancel}, c.key})
				return err
			}
			l.send(recs...)
			if next != nil {
				<-taken
				go pumpRequests(l, c, stream, taken, next)
			}
		case rec := <-c.in:
			switch rec[0][0] {
			case kindUnary:
				if len(rec) < 3 {
					return status.Error(codes.Internal, "a worker's answer of the wrong shape")
				}
				stream.SetTrailer(trailer(rec[3:]))
				reply := rec[2]
				return stream.SendMsg(&reply)
			case kindReusable:
				if len(rec) < 4 {
					return status.Error(codes.Internal, "a worker's answer of the wrong shape")
				}
				gen, err := strconv.ParseInt(string(rec[2]), 10, 64)
				if err != nil {
					return status.Error(codes.Internal, "a worker's answer of the wrong shape")
				}
				f.cacheable.LoadOrStore(method, struct{}{})
				md := trailer(rec[4:])
				if key != "" {
					l.cache.put(key, gen, rec[3], md)
				}
				stream.SetTrailer(md)
				reply := rec[3]
				return stream.SendMsg(&reply)
			case kindMessage:
				if len(rec) < 3 {
					return status.Error(codes.Internal, "a worker's message of the wrong shape")
				}
				if replies == nil {
					replies = startReplies(l, c, stream)
				}
				replies.queue <- rec[2]
			case kindSent:
				taken <- struct{}{}
			case kindStatus:
				code, details := statusOf(rec)
				stream.SetTrailer(trailer(rec[4:]))
				if code == codes.OK && replies != nil { // every reply before the status
					close(replies.queue)
					select {
					case <-replies.done:
					case <-ctx.Done():
					}
					replies = nil
				}
				if code == codes.OK {
					return nil
				}
				return status.Error(code, details)
			}
		case <-l.done:
			if len(c.in) > 0 {
				continue // what the worker sent before its link ended comes first
			}
			return status.Error(codes.Unavailable, "the node's worker process went away")
		case <-ctx.Done():
			l.send([][]byte{{kindCancel}, c.key})
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}

// aheadRecords are the records for the worker of what was read ahead of a call (after its call record),
// and the message the pump holds back when the client sent a second one (the pump goes on from it, as it
// would have); an error when reading failed (grpc-go answered the client).
func aheadRecords(c *call, got ahead) (recs [][][]byte, next [][]byte, err error) {
	switch {
	case got.err == io.EOF:
		return [][][]byte{{{kindHalfClose}, c.key}}, nil, nil
	case got.err != nil:
		return nil, nil, got.err
	case got.ended:
		return [][][]byte{{{kindMessage}, c.key, got.msg}, {{kindHalfClose}, c.key}}, nil, nil
	default:
		return [][][]byte{{{kindMessage}, c.key, got.msg}}, [][]byte{{kindMessage}, c.key, got.second}, nil
	}
}

// callRecord is the call's first record: its deadline, method, caller and metadata. A text header whose value
// is not UTF-8 (grpc-go passes such bytes through; a worker reads text values as UTF-8) refuses the call.
//
// Also the caller's identity (callerOf), for the reply cache's key.
func callRecord(key []byte, method string, stream grpc.ServerStream) ([][]byte, []byte, error) {
	ctx := stream.Context()
	deadline := "-1"
	if d, ok := ctx.Deadline(); ok {
		deadline = strconv.FormatInt(monotonicNs()+int64(time.Until(d)), 10)
	}
	said, identity := callerOf(ctx)
	rec := [][]byte{{kindCall}, key, []byte(deadline), []byte(method), said}
	md, _ := metadata.FromIncomingContext(ctx)
	keys := make([]string, 0, len(md))
	for k := range md {
		if strings.HasPrefix(k, ":") || k == workerCaller || k == "content-type" || k == "grpc-accept-encoding" {
			continue // pseudo-headers, a client's attempt at naming the caller, and what grpcio keeps to itself
		}
		keys = append(keys, k)
	}
	// in one order (a map's is random): the worker keeps a handler per method and metadata
	slices.Sort(keys)
	for _, k := range keys {
		for _, v := range md[k] {
			if !strings.HasSuffix(k, "-bin") && !utf8.ValidString(v) {
				return nil, nil, status.Errorf(codes.InvalidArgument, "metadata: %s's value is not UTF-8", k)
			}
			rec = append(rec, []byte(k), []byte(v))
		}
	}
	return rec, identity, nil
}

// pumpRequests passes the client's messages on, at most `window` ahead of the worker's handler, then the
// end of the client's stream. It ends with the call (RecvMsg fails once the handler returned).
//
// A message waits here until the next RecvMsg says whether the stream ended, so that a unary call's request
// and its end go to the worker as one item. The first message takes no credit (the worker acknowledges the
// later ones only): a unary call costs the worker no acknowledgement. `waiting`: a message read ahead and
// held back (past the first, its credit taken), else nil.
func pumpRequests(l *link, c *call, stream grpc.ServerStream, taken chan struct{}, waiting [][]byte) {
	ctx := stream.Context()
	for first := waiting == nil; ; first = false {
		var msg []byte
		err := stream.RecvMsg(&msg)
		if err == io.EOF {
			end := [][]byte{{kindHalfClose}, c.key}
			if waiting != nil {
				l.send(waiting, end)
			} else {
				l.send(end)
			}
			return
		}
		if err != nil {
			return // a request grpc-go could not take (too large): it answers the client, and the call's
			// context ends, which cancels the worker's call (pass)
		}
		if waiting != nil && !l.send(waiting) {
			return
		}
		if !first {
			select {
			case <-taken:
			case <-ctx.Done():
				return
			}
		}
		waiting = [][]byte{{kindMessage}, c.key, msg}
	}
}

// replySender hands a server stream's replies to the client on a goroutine of its own, telling the worker
// of each one sent, so that a client that does not read stalls only this goroutine: the call still ends when
// the worker says so (its call guard's progress bound).
type replySender struct {
	queue chan []byte
	done  chan struct{}
}

func startReplies(l *link, c *call, stream grpc.ServerStream) *replySender {
	r := &replySender{queue: make(chan []byte, inbox), done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for msg := range r.queue {
			if err := stream.SendMsg(&msg); err != nil {
				return
			}
			l.send([][]byte{{kindSent}, c.key})
		}
	}()
	return r
}

func statusOf(rec [][]byte) (codes.Code, string) {
	if len(rec) < 4 {
		return codes.Internal, "a worker's status of the wrong shape"
	}
	n, err := strconv.Atoi(string(rec[2]))
	if err != nil || n < 0 || n > 16 {
		return codes.Unknown, string(rec[3])
	}
	return codes.Code(n), string(rec[3])
}

func trailer(fields [][]byte) metadata.MD {
	if len(fields) < 2 {
		return nil
	}
	md := metadata.MD{}
	for i := 0; i+1 < len(fields); i += 2 {
		md.Append(string(fields[i]), string(fields[i+1]))
	}
	return md
}

// callerOf is who the client is, as nameserver/api/corelink.py's CALLER says it: the address as grpcio
// writes a peer ("ipv4:HOST:PORT", "ipv6:[HOST]:PORT") and, over TLS, the names of its verified
// certificate as grpcio's auth context has them (hex-encoded values). Also its identity for the reply cache:
// the same without the port (one host's connections are one caller, as the call guard's per-caller bounds
// count them; nothing a reusable reply's call runs reads the port).
func callerOf(ctx context.Context) (said, identity []byte) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return describeCaller(nil)
	}
	// one connection's calls all have the same caller; a later connection from the same address (a port
	// reused behind NAT or a balancer) may be another, so its certificate is part of the key
	key := p.Addr.String()
	if info, isTLS := p.AuthInfo.(credentials.TLSInfo); isTLS && len(info.State.PeerCertificates) > 0 {
		leaf := sha256.Sum256(info.State.PeerCertificates[0].Raw)
		key += " " + string(leaf[:])
	}
	if found, ok := callers.Load(key); ok {
		both := found.(*[2][]byte)
		return both[0], both[1]
	}
	said, identity = describeCaller(p)
	if callersKept.Add(1) > maxCallersKept { // a bound, not an eviction order: start again
		callers.Clear()
		callersKept.Store(0)
	}
	callers.Store(key, &[2][]byte{said, identity})
	return said, identity
}

var (
	callers     sync.Map // address and leaf certificate's hash -> caller JSON and identity
	callersKept atomic.Int64
)

const maxCallersKept = 1 << 16

func describeCaller(p *peer.Peer) (said, identity []byte) {
	caller := struct {
		Peer string              `json:"peer"`
		Auth map[string][]string `json:"auth"`
	}{Peer: "unknown", Auth: map[string][]string{}}
	host := caller.Peer
	if p != nil {
		if tcp, isTCP := p.Addr.(*net.TCPAddr); isTCP {
			if ip4 := tcp.IP.To4(); ip4 != nil {
				host = "ipv4:" + ip4.String()
			} else {
				host = "ipv6:[" + tcp.IP.String() + "]"
			}
			caller.Peer = host + ":" + strconv.Itoa(tcp.Port)
		}
		if info, isTLS := p.AuthInfo.(credentials.TLSInfo); isTLS {
			caller.Auth["transport_security_type"] = []string{hex.EncodeToString([]byte("ssl"))}
			if len(info.State.PeerCertificates) > 0 {
				addNames(caller.Auth, info.State.PeerCertificates[0])
			}
		}
	}
	said, _ = json.Marshal(caller)
	caller.Peer = host
	identity, _ = json.Marshal(caller)
	return said, identity
}

func addNames(auth map[string][]string, cert *x509.Certificate) {
	hexed := func(s string) string { return hex.EncodeToString([]byte(s)) }
	if cert.Subject.CommonName != "" {
		auth["x509_common_name"] = []string{hexed(cert.Subject.CommonName)}
	}
	var sans []string
	for _, name := range cert.DNSNames {
		sans = append(sans, hexed(name))
	}
	for _, ip := range cert.IPAddresses {
		sans = append(sans, hexed(ip.String()))
	}
	for _, mail := range cert.EmailAddresses {
		sans = append(sans, hexed(mail))
	}
	for _, uri := range cert.URIs {
		sans = append(sans, hexed(uri.String()))
	}
	if len(sans) > 0 {
		auth["x509_subject_alternative_name"] = sans
	}
}
