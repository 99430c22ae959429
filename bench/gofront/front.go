package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// The worker protocol, little-endian, many calls in flight per socket, answered in any order:
//
//	call:   u32 length of the rest | u64 id | u16 len, method | u32 len, metadata | request bytes
//	        metadata: repeated (u16 len, key | u32 len, value); the front end adds ":peer" (who called)
//	answer: u32 length of the rest | u64 id | u8 gRPC status code | reply bytes (code 0) or error message
const (
	callHeader   = 4 + 8
	answerHeader = 4 + 8 + 1
	maxAnswer    = 64 << 20
	ioBuffer     = 256 << 10
	peerKey      = ":peer"
)

type callFrame struct{ buf []byte }

type answer struct {
	code uint8
	body []byte
}

// link is one Unix socket to one worker process: calls go out through one writer goroutine that batches
// whatever is queued into one write; answers come back through one reader goroutine, matched by id.
type link struct {
	conn    net.Conn
	out     chan []byte
	mu      sync.Mutex
	pending map[uint64]chan answer
	broken  error
	nextID  atomic.Uint64
}

func dialLink(path string) (*link, error) {
	conn, err := net.Dial("unix", path)
	if err != nil {
		return nil, err
	}
	l := &link{conn: conn, out: make(chan []byte, 4096), pending: map[uint64]chan answer{}}
	go l.write()
	go l.read()
	return l, nil
}

func (l *link) write() {
	w := bufio.NewWriterSize(l.conn, ioBuffer)
	for frame := range l.out {
		w.Write(frame)
	more:
		for {
			select {
			case f := <-l.out:
				w.Write(f)
			default:
				break more
			}
		}
		if err := w.Flush(); err != nil {
			l.fail(err)
			return
		}
	}
}

func (l *link) read() {
	r := bufio.NewReaderSize(l.conn, ioBuffer)
	var head [answerHeader]byte
	for {
		if _, err := io.ReadFull(r, head[:]); err != nil {
			l.fail(err)
			return
		}
		n := binary.LittleEndian.Uint32(head[0:4])
		if n < answerHeader-4 || n > maxAnswer {
			l.fail(fmt.Errorf("worker answer of %d bytes", n))
			return
		}
		body := make([]byte, n-(answerHeader-4))
		if _, err := io.ReadFull(r, body); err != nil {
			l.fail(err)
			return
		}
		id := binary.LittleEndian.Uint64(head[4:12])
		l.mu.Lock()
		ch := l.pending[id]
		delete(l.pending, id)
		l.mu.Unlock()
		if ch != nil { // nil: its caller gave up (deadline, cancel)
			ch <- answer{code: head[12], body: body}
		}
	}
}

// fail ends the link: every waiting call and every later one is answered UNAVAILABLE.
func (l *link) fail(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.broken != nil {
		return
	}
	l.broken = err
	for id, ch := range l.pending {
		ch <- answer{code: uint8(codes.Unavailable), body: []byte("worker link: " + err.Error())}
		delete(l.pending, id)
	}
	l.conn.Close()
}

func (l *link) call(ctx context.Context, frame []byte) (answer, error) {
	id := l.nextID.Add(1)
	binary.LittleEndian.PutUint32(frame[0:4], uint32(len(frame)-4))
	binary.LittleEndian.PutUint64(frame[4:12], id)
	ch := make(chan answer, 1)
	l.mu.Lock()
	if l.broken != nil {
		l.mu.Unlock()
		return answer{}, status.Error(codes.Unavailable, "worker link: "+l.broken.Error())
	}
	l.pending[id] = ch
	l.mu.Unlock()
	l.out <- frame
	select {
	case a := <-ch:
		return a, nil
	case <-ctx.Done():
		l.mu.Lock()
		delete(l.pending, id)
		l.mu.Unlock()
		return answer{}, status.FromContextError(ctx.Err()).Err()
	}
}

type front struct {
	links []*link
	next  atomic.Uint64
}

func appendString16(b []byte, s string) []byte {
	b = binary.LittleEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

func appendString32(b []byte, s string) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}

// handle serves every method (the unknown-service handler): the call becomes one frame to a worker, the
// worker's answer becomes the reply or the status.
func (f *front) handle(_ any, stream grpc.ServerStream) error {
	method, ok := grpc.MethodFromServerStream(stream)
	if !ok || len(method) > 0xFFFF {
		return status.Error(codes.Internal, "no method")
	}
	ctx := stream.Context()
	frame := callFrame{buf: make([]byte, callHeader, 512)}
	frame.buf = appendString16(frame.buf, method)
	mdAt := len(frame.buf)
	frame.buf = append(frame.buf, 0, 0, 0, 0)
	if p, ok := peer.FromContext(ctx); ok {
		frame.buf = appendString32(appendString16(frame.buf, peerKey), p.Addr.String())
	}
	md, _ := metadata.FromIncomingContext(ctx)
	for k, vs := range md {
		if len(k) > 0xFFFF || strings.HasPrefix(k, ":") {
			continue
		}
		for _, v := range vs {
			frame.buf = appendString32(appendString16(frame.buf, k), v)
		}
	}
	binary.LittleEndian.PutUint32(frame.buf[mdAt:], uint32(len(frame.buf)-mdAt-4))
	if err := stream.RecvMsg(&frame); err != nil {
		return err
	}
	l := f.links[int(f.next.Add(1)%uint64(len(f.links)))]
	a, err := l.call(ctx, frame.buf)
	if err != nil {
		return err
	}
	if a.code != 0 {
		return status.Error(codes.Code(a.code), string(a.body))
	}
	return stream.SendMsg(&a.body)
}

func runFront(args []string) error {
	fs := flag.NewFlagSet("front", flag.ExitOnError)
	addr := fs.String("addr", "127.0.0.1:0", "gRPC listen address")
	workers := fs.String("workers", "", "the workers' Unix socket paths, comma-separated")
	maxMessage := fs.Int("max-message", 4<<20, "largest request or reply, bytes")
	fs.Parse(args)
	if *workers == "" {
		return errors.New("-workers: at least one worker socket")
	}
	f := &front{}
	for _, path := range strings.Split(*workers, ",") {
		l, err := dialLink(path)
		if err != nil {
			return fmt.Errorf("worker %s: %w", path, err)
		}
		f.links = append(f.links, l)
	}
	server := grpc.NewServer(append(serverOptions(*maxMessage), grpc.UnknownServiceHandler(f.handle))...)
	return serve(server, *addr)
}
