package main

import (
	"io"
	"net"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// quietConn is a socket (a client's TCP connection, a worker's Unix socket) whose reads and writes enter the
// kernel without telling Go's scheduler: syscall.RawSyscall inside the runtime poller's RawConn, which still
// parks the goroutine on the poller when the socket has nothing to give or no room, and still honours
// deadlines and Close. Its file descriptor is non-blocking (Go's net package makes every socket so), so no
// read or write can hold the thread.
//
// Why: each system call that Go's scheduler is told of (entersyscall) wakes the runtime's monitor thread
// (sysmon) when the process was idle, and sysmon then polls every 20 µs until every P is idle again: a futex
// wake and several nanosleeps, a context switch each, for every burst of a call's work (a call that waits
// on the node has two: its request, its reply). At low load that was about a fifth of this process's CPU
// (docs/benchmarks.md, "Issue 27: the Go front end's runtime (session 25)" and "Issue 27: the Go front end
// per call (session 26)"). A raw call never puts the P in a system call either, so sysmon has none to
// retake. sysmon still wakes for the runtime's own reasons (timers, GC, the counters' write each second).
type quietConn struct {
	net.Conn
	raw syscall.RawConn
}

// quiet is conn with quiet reads and writes when it is a socket the runtime polls; else conn as it is.
func quiet(conn net.Conn) net.Conn {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return conn
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return conn
	}
	return &quietConn{Conn: conn, raw: raw}
}

func (c *quietConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	var n uintptr
	var errno syscall.Errno
	err := c.raw.Read(func(fd uintptr) bool {
		for {
			n, _, errno = syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
			switch errno {
			case syscall.EINTR:
				continue
			case syscall.EAGAIN:
				return false // the poller parks the goroutine until the socket is readable, or its deadline
			}
			return true
		}
	})
	switch {
	case err != nil:
		return 0, c.failed("read", err)
	case errno != 0:
		return 0, c.failed("read", os.NewSyscallError("read", errno))
	case n == 0:
		return 0, io.EOF
	}
	return int(n), nil
}

func (c *quietConn) Write(p []byte) (int, error) {
	done := 0
	var errno syscall.Errno
	err := c.raw.Write(func(fd uintptr) bool {
		for done < len(p) {
			n, _, e := syscall.RawSyscall6(syscall.SYS_SENDTO, fd, uintptr(unsafe.Pointer(&p[done])),
				uintptr(len(p)-done), unix.MSG_NOSIGNAL, 0, 0)
			switch e {
			case 0:
				if n == 0 { // a stream socket that takes nothing and says nothing: as the net package, no spin
					errno = syscall.EIO
					return true
				}
				done += int(n)
			case syscall.EINTR:
			case syscall.EAGAIN:
				return false // the poller parks the goroutine until the socket takes more, or its deadline
			default:
				errno = e
				return true
			}
		}
		return true
	})
	switch {
	case err != nil:
		return done, c.failed("write", err)
	case errno != 0:
		return done, c.failed("write", os.NewSyscallError("write", errno))
	}
	return done, nil
}

// failed is err as the net package's own reads and writes return it (errors.Is finds net.ErrClosed,
// os.ErrDeadlineExceeded; a timeout is a net.Error's Timeout()).
func (c *quietConn) failed(op string, err error) error {
	network := "unix" // a socket whose own address the kernel did not give has none to name its network
	if local := c.LocalAddr(); local != nil {
		network = local.Network()
	}
	return &net.OpError{Op: op, Net: network, Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}

// monotonicNs is the time now on CLOCK_MONOTONIC, Python's time.monotonic() on Linux (a call record's
// deadline): Go's own monotonic clock (the vDSO's CLOCK_MONOTONIC, no system call) from one reading of the
// kernel's at start.
func monotonicNs() int64 {
	return monotonicBase + int64(time.Since(monotonicStart))
}

var monotonicStart, monotonicBase = func() (time.Time, int64) {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return time.Now(), ts.Nano()
}()
