package main

import (
	"bufio"
	"encoding/binary"
	"net"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
)

const (
	batchBytes  = 1 << 20                // a frame to a worker gathers records up to about this many bytes
	ioBuffer    = 256 << 10              // each link's read and write buffers
	redialEvery = 100 * time.Millisecond // how soon a gone worker's socket is tried again
	inbox       = 16                     // records a call can have waiting; the windows keep it under 4
)

// link is one Unix socket to one worker process. Records to the worker go through one writer goroutine,
// which puts whatever is queued into one frame; the worker's records come back through one reader goroutine
// and are handed to their calls by id. A link that breaks answers its calls UNAVAILABLE and takes no more.
type link struct {
	conn   net.Conn
	out    chan [][][]byte
	done   chan struct{}
	mu     sync.Mutex
	calls  map[uint64]*call
	broken bool
	nextID atomic.Uint64
	max    int         // the largest frame the worker may send
	cache  *replyCache // the replies of this worker kept (cache.go); nil: no cache
}

// call is one gRPC call's end on a link: the worker's records for it arrive on `in`.
type call struct {
	id  uint64
	key []byte
	in  chan [][]byte
}

func dial(path string, maxFrame int, cache *replyCache) (*link, error) {
	conn, err := net.Dial("unix", path)
	if err != nil {
		return nil, err
	}
	conn = quiet(conn)
	l := &link{conn: conn, out: make(chan [][][]byte, 4096), done: make(chan struct{}), calls: map[uint64]*call{},
		max: maxFrame, cache: cache}
	go l.write()
	go l.read()
	return l, nil
}

func (l *link) write() {
	w := bufio.NewWriterSize(l.conn, ioBuffer)
	var frame frameWriter
	for {
		select {
		case recs := <-l.out:
			frame.add(recs...)
		case <-l.done:
			return
		}
		// the calls already runnable (the rest of a pass over the connections the poller woke, each readied
		// after this goroutine) queue their records before this frame goes: one frame, one system call here
		// and one wake of the worker for all of them, not one each
		runtime.Gosched()
	more:
		for frame.size < batchBytes {
			select {
			case recs := <-l.out:
				frame.add(recs...)
			default:
				break more
			}
		}
		if err := frame.writeTo(w); err != nil {
			l.fail("writing to the worker: " + err.Error())
			return
		}
		if len(l.out) == 0 {
			if err := w.Flush(); err != nil {
				l.fail("writing to the worker: " + err.Error())
				return
			}
		}
	}
}

func (l *link) read() {
	r := bufio.NewReaderSize(l.conn, ioBuffer)
	for {
		records, err := readFrame(r, l.max)
		if err != nil {
			l.fail("the worker's socket: " + err.Error())
			return
		}
		for _, rec := range records {
			if len(rec) < 2 || len(rec[0]) != 1 || len(rec[1]) != 8 {
				l.fail("the worker sent a record of the wrong shape")
				return
			}
			if rec[0][0] == kindGeneration { // the worker's state moved: its kept replies are void
				if !l.moved(rec) {
					l.fail("the worker sent a generation of the wrong shape")
					return
				}
				continue
			}
			id := binary.BigEndian.Uint64(rec[1])
			l.mu.Lock()
			c := l.calls[id]
			if c != nil && (rec[0][0] == kindUnary || rec[0][0] == kindReusable || rec[0][0] == kindStatus) {
				delete(l.calls, id)
			}
			l.mu.Unlock()
			if c != nil { // nil: the call ended already (its client went away)
				c.in <- rec
			}
		}
	}
}

// moved takes a generation record: the worker's state moved on (cache.go); false when it is malformed.
func (l *link) moved(rec [][]byte) bool {
	if len(rec) != 3 {
		return false
	}
	gen, err := strconv.ParseInt(string(rec[2]), 10, 64)
	if err != nil {
		return false
	}
	if l.cache != nil {
		l.cache.moved(gen)
	}
	return true
}

// fail ends the link: every call on it is answered UNAVAILABLE, and it takes no more.
func (l *link) fail(why string) {
	l.mu.Lock()
	if l.broken {
		l.mu.Unlock()
		return
	}
	l.broken = true
	calls := l.calls
	l.calls = map[uint64]*call{}
	l.mu.Unlock()
	close(l.done)
	l.conn.Close()
	for _, c := range calls {
		select { // never blocks: a call whose records are not taken sees l.done instead
		case c.in <- statusRecord(c.key, codes.Unavailable, "the node's worker process went away: "+why):
		default:
		}
	}
}

func statusRecord(key []byte, code codes.Code, details string) [][]byte {
	return [][]byte{{kindStatus}, key, []byte(strconv.Itoa(int(code))), []byte(details)}
}

// open registers a new call; nil when the link is broken.
func (l *link) open() *call {
	id := l.nextID.Add(1)
	c := &call{id: id, key: binary.BigEndian.AppendUint64(nil, id), in: make(chan [][]byte, inbox)}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.broken {
		return nil
	}
	l.calls[id] = c
	return c
}

func (l *link) forget(c *call) {
	l.mu.Lock()
	delete(l.calls, c.id)
	l.mu.Unlock()
}

// send queues records for the worker, to go in one frame; false when the link is broken.
func (l *link) send(recs ...[][]byte) bool {
	select {
	case l.out <- recs:
		return true
	case <-l.done:
		return false
	}
}

// workers are the node's worker processes, one socket each: dialled again whenever a worker restarts.
type workers struct {
	// each link's reply cache bounds (cache.go): the front end's divided among the workers; 0 bytes: none
	cacheBytes, cacheEntries int
	links                    []atomic.Pointer[link]
	next                     atomic.Uint64
	ready                    chan struct{} // closed once the first link is up
	readyMu                  sync.Once
}

func newWorkers(paths []string, maxFrame, cacheBytes, cacheEntries int) *workers {
	w := &workers{links: make([]atomic.Pointer[link], len(paths)), ready: make(chan struct{}),
		cacheBytes: cacheBytes / len(paths), cacheEntries: cacheEntries / len(paths)}
	for i, path := range paths {
		go w.keep(i, path, maxFrame)
	}
	return w
}

// keep holds a link to worker i's socket: dialled, and dialled again once it breaks.
func (w *workers) keep(i int, path string, maxFrame int) {
	for {
		var cache *replyCache // a new link, a new cache: a restarted worker numbers its generations anew
		if w.cacheBytes > 0 {
			cache = newReplyCache(w.cacheBytes, w.cacheEntries)
		}
		l, err := dial(path, maxFrame, cache)
		if err != nil {
			time.Sleep(redialEvery)
			continue
		}
		w.links[i].Store(l)
		w.readyMu.Do(func() { close(w.ready) })
		<-l.done
		w.links[i].CompareAndSwap(l, nil)
	}
}

// pick is the next live link, round-robin; nil when no worker serves.
func (w *workers) pick() *link {
	n := uint64(len(w.links))
	start := w.next.Add(1)
	for i := range n {
		if l := w.links[(start+i)%n].Load(); l != nil {
			return l
		}
	}
	return nil
}
