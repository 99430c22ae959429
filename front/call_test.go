package main

import (
	"bufio"
	"context"
	"io"
	"net"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// silentWorker is a worker process's socket that takes a link and reads its records, and never answers.
func silentWorker(t *testing.T) (path string, records <-chan [][]byte) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "worker.sock")
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	got := make(chan [][]byte, 64)
	go func() {
		conn, err := lis.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		r := bufio.NewReader(conn)
		for {
			recs, err := readFrame(r, 1<<20)
			if err != nil {
				return
			}
			for _, rec := range recs {
				got <- rec
			}
		}
	}()
	return path, got
}

// unaryStream is a unary call's server stream as grpc-go hands it to the unknown-service handler: one
// request, then the end; its status is what the handler returns.
type unaryStream struct {
	ctx  context.Context
	read int
}

func (s *unaryStream) Context() context.Context     { return s.ctx }
func (s *unaryStream) SetHeader(metadata.MD) error  { return nil }
func (s *unaryStream) SendHeader(metadata.MD) error { return nil }
func (s *unaryStream) SetTrailer(metadata.MD)       {}
func (s *unaryStream) SendMsg(any) error            { return nil }
func (s *unaryStream) RecvMsg(m any) error {
	s.read++
	if s.read == 1 {
		*m.(*[]byte) = []byte("request")
		return nil
	}
	return io.EOF
}

// method names the call, as grpc-go's transport stream does in the call's context.
type method string

func (m method) Method() string               { return string(m) }
func (m method) SetHeader(metadata.MD) error  { return nil }
func (m method) SendHeader(metadata.MD) error { return nil }
func (m method) SetTrailer(metadata.MD) error { return nil }

func frontWithSilentWorker(t *testing.T) (*front, <-chan [][]byte) {
	t.Helper()
	path, records := silentWorker(t)
	f := &front{workers: newWorkers([]string{path}, 1<<20, 0, 0)}
	select {
	case <-f.workers.ready:
	case <-time.After(10 * time.Second):
		t.Fatal("the front end never linked to the worker")
	}
	return f, records
}

func callContext(parent context.Context) context.Context {
	return grpc.NewContextWithServerTransportStream(parent, method("/test.Service/Never"))
}

// slack is how far apart two conversions of one time.Time to CLOCK_MONOTONIC (monotonicNs, then
// time.Until) may be on a busy machine: a goroutine preempted between the two reads.
const slack = 5 * time.Millisecond

// next is the worker's next record of the given kind (others skipped).
func next(t *testing.T, records <-chan [][]byte, kind byte) [][]byte {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case rec := <-records:
			if rec[0][0] == kind {
				return rec
			}
		case <-timeout:
			t.Fatalf("the worker was never sent a %q record", kind)
		}
	}
}

// callWithin starts a unary call of `timeout` on f (its worker never answers): its context, what the call
// ends with, and how long before the call's deadline the worker was told its own.
func callWithin(t *testing.T, f *front, records <-chan [][]byte, timeout time.Duration) (
	context.Context, <-chan error, time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	ctx, cancel := context.WithDeadline(callContext(context.Background()), deadline)
	t.Cleanup(cancel)
	deadlineNs := monotonicNs() + int64(time.Until(deadline))
	done := make(chan error, 1)
	go func() { done <- f.handle(nil, &unaryStream{ctx: ctx}) }()
	told, err := strconv.ParseInt(string(next(t, records, kindCall)[2]), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return ctx, done, time.Duration(deadlineNs - told)
}

// A call with a deadline whose worker never answers is ended by the front end itself, with
// DEADLINE_EXCEEDED, before the deadline (grpc-go's transport resets the stream at the deadline: CANCELLED
// to the client); the worker is told the earlier deadline, and told to cancel.
func TestACallEndsAheadOfItsDeadline(t *testing.T) {
	f, records := frontWithSilentWorker(t)
	ctx, done, early := callWithin(t, f, records, time.Second)
	if early < deadlineLead-slack || early > deadlineLead+slack {
		t.Fatalf("the worker was told a deadline %v before the call's, not %v", early, deadlineLead)
	}
	err := <-done
	if ctx.Err() != nil {
		t.Fatal("the call ran to its deadline: grpc-go's transport resets such a stream (CANCELLED)")
	}
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("the call ended with %v, not DEADLINE_EXCEEDED", err)
	}
	next(t, records, kindCancel)
	if n := f.counts.calls[codes.DeadlineExceeded].Load(); n != 1 {
		t.Fatalf("%d calls counted DEADLINE_EXCEEDED, not 1", n)
	}
}

// The front end ends a call early by at most a tenth of the time it had left.
func TestAShortCallEndsATenthEarly(t *testing.T) {
	f, records := frontWithSilentWorker(t)
	_, done, early := callWithin(t, f, records, 100*time.Millisecond)
	if early < 10*time.Millisecond-slack || early > 10*time.Millisecond+slack {
		t.Fatalf("the worker was told a deadline %v before the call's (at most a tenth of 100ms)", early)
	}
	if err := <-done; status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("the call ended with %v, not DEADLINE_EXCEEDED", err)
	}
}

// A call with no deadline is not cut: it waits for its worker until its client goes away.
func TestACallWithNoDeadlineIsNotCut(t *testing.T) {
	f, records := frontWithSilentWorker(t)
	ctx, cancel := context.WithCancel(callContext(context.Background()))
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- f.handle(nil, &unaryStream{ctx: ctx}) }()

	if told := string(next(t, records, kindCall)[2]); told != "-1" {
		t.Fatalf("the worker was told deadline %s for a call with none", told)
	}
	select {
	case err := <-done:
		t.Fatalf("a call with no deadline ended by itself: %v", err)
	case <-time.After(3 * deadlineLead):
	}
	cancel()
	if err := <-done; status.Code(err) != codes.Canceled {
		t.Fatalf("a call whose client went away ended with %v, not CANCELLED", err)
	}
	next(t, records, kindCancel)
}
