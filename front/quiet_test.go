package main

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// socketPair is a connected pair of real sockets of `network` ("tcp" or "unix"): the accepted end quiet.
func socketPair(t *testing.T, network string) (quietEnd, other net.Conn) {
	t.Helper()
	addr := "127.0.0.1:0"
	if network == "unix" {
		addr = filepath.Join(t.TempDir(), "pair.sock")
	}
	lis, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	other, err = net.Dial(network, lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	accepted, err := lis.Accept()
	if err != nil {
		t.Fatal(err)
	}
	quietEnd = quiet(accepted)
	if _, ok := quietEnd.(*quietConn); !ok {
		t.Fatalf("a %s socket was not made quiet: %T", network, quietEnd)
	}
	t.Cleanup(func() { quietEnd.Close(); other.Close() })
	return quietEnd, other
}

func TestAQuietSocketCarriesMoreThanItsBuffersEachWay(t *testing.T) {
	for _, network := range []string{"tcp", "unix"} {
		t.Run(network, func(t *testing.T) {
			q, other := socketPair(t, network)
			payload := make([]byte, 8<<20) // past the kernel's buffers: writes wait for room, reads for data
			for i := range payload {
				payload[i] = byte(i * 7)
			}
			written := make(chan error, 1)
			go func() {
				n, err := q.Write(payload)
				if err == nil && n != len(payload) {
					err = io.ErrShortWrite
				}
				written <- err
			}()
			got := make([]byte, len(payload))
			if _, err := io.ReadFull(other, got); err != nil {
				t.Fatal(err)
			}
			if err := <-written; err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, payload) {
				t.Fatal("the bytes written quietly are not the bytes read")
			}
			go func() { other.Write(payload); other.Close() }()
			back, err := io.ReadAll(q) // to the peer's end: io.EOF, as net's own reads say it
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(back, payload) {
				t.Fatal("the bytes read quietly are not the bytes written")
			}
		})
	}
}

func TestAQuietSocketKeepsItsDeadlinesAndClose(t *testing.T) {
	q, _ := socketPair(t, "tcp")
	q.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	_, err := q.Read(make([]byte, 10))
	var ne net.Error
	if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("a read past its deadline: %v", err)
	}
	q.SetReadDeadline(time.Time{})
	done := make(chan error, 1)
	go func() { _, err := q.Read(make([]byte, 10)); done <- err }()
	time.Sleep(20 * time.Millisecond)
	q.Close() // a read waiting on the poller ends with the socket
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("a read when the socket closed: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a read went on waiting on a closed socket")
	}
	if _, err := q.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("a write to a closed socket: %v", err)
	}
}

func TestAWriteToAPeerThatWentAwayFailsWithoutASignal(t *testing.T) {
	q, other := socketPair(t, "unix")
	other.Close()
	var err error
	for range 100 { // the first writes may still be taken by the kernel
		if _, err = q.Write(make([]byte, 64<<10)); err != nil {
			break
		}
	}
	if !errors.Is(err, unix.EPIPE) && !errors.Is(err, unix.ECONNRESET) {
		t.Fatalf("a write to a peer that went away: %v", err)
	}
}

func TestMonotonicNsIsTheKernelsMonotonicClock(t *testing.T) {
	var ts unix.Timespec
	for range 3 {
		unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
		before := ts.Nano()
		now := monotonicNs()
		unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
		if now < before-int64(time.Millisecond) || now > ts.Nano()+int64(time.Millisecond) {
			t.Fatalf("monotonicNs %d is not between the kernel's %d and %d", now, before, ts.Nano())
		}
	}
}
