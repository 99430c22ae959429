package main

import (
	"encoding/binary"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// The reply cache: repeated eventual unary reads (a route, the cluster info, a topic list) answered here,
// without the worker, as RocketMQ's NameServer answers route reads from its tables. Go alone serves a hit.
//
// What may be kept is the worker's decision, never this process's: a worker marks a reply reusable (record
// r, not u) only when its answer depends on nothing but the call's method, its request bytes, its metadata,
// the caller's identity as this process derived it from the connection (callerOf: the address without its
// port, and the client certificate's names), and the worker's replica state at one generation; and when no
// interceptor would treat a repeat differently (nameserver/api/frontchannel.py says which calls those are).
// Errors, streams, reads that waited, linearizable reads are never marked.
//
// Invalidation: every entry belongs to the worker (the link) whose reply it is, and carries that worker's
// state generation, read before the call ran. The worker says each new generation in a record of its own
// (g: after each apply batch of its replica, a snapshot installed, its replica turning unready, and on a new
// link before anything else; a move that voids nothing this link may hold is said just before its next
// reusable reply instead: frontchannel.py's Generations); an entry is served only while its generation is the
// link's latest. The entries of older generations are dropped at once, and a link that ends takes its cache
// with it (a restarted worker numbers its generations anew).
//
// Memory: each link holds at most maxBytes (reply, trailer and key bytes) and maxEntries entries, the
// node's [node] grpc_front_cache_mb divided among the workers; past either the oldest entries go first.

// requestWait is how long a call of a cacheable method waits here for its request message and its end
// before it goes to a worker the usual way (a client that sends its headers and then stalls meets the
// worker's call guard, as without a cache).
const requestWait = 100 * time.Millisecond

type cached struct {
	reply   []byte
	trailer metadata.MD
	size    int
}

// replyCache is one link's entries, of the worker's latest generation.
type replyCache struct {
	maxBytes, maxEntries int
	mu                   sync.RWMutex
	gen                  int64 // the worker's latest generation; -1 until it said one
	entries              map[string]*cached
	order                []string // keys, oldest first (a key put twice is there twice: a harmless early drop)
	bytes                int
}

func newReplyCache(maxBytes, maxEntries int) *replyCache {
	return &replyCache{maxBytes: maxBytes, maxEntries: maxEntries, gen: -1, entries: map[string]*cached{}}
}

// get is the reply kept for key, nil when there is none of the latest generation.
func (c *replyCache) get(key string) *cached {
	c.mu.RLock()
	e := c.entries[key]
	c.mu.RUnlock()
	return e
}

// moved takes the worker's new generation: every entry kept is of an older one, so all go.
func (c *replyCache) moved(gen int64) {
	c.mu.Lock()
	if gen > c.gen {
		c.gen = gen
		if len(c.entries) > 0 {
			c.entries, c.order, c.bytes = map[string]*cached{}, nil, 0
		}
	}
	c.mu.Unlock()
}

// put keeps a reply the worker read at generation gen; a reply of any other generation than the latest
// the worker said is not kept (an older one is void; a newer one's generation record is on its way, and
// would drop it).
func (c *replyCache) put(key string, gen int64, reply []byte, trailer metadata.MD) {
	size := len(key) + len(reply) + 64
	for k, vs := range trailer {
		size += len(k)
		for _, v := range vs {
			size += len(v)
		}
	}
	if size > c.maxBytes || c.maxEntries < 1 {
		return
	}
	e := &cached{reply: append([]byte(nil), reply...), trailer: trailer, size: size} // reply: a slice of a frame
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen != c.gen {
		return
	}
	if old := c.entries[key]; old != nil {
		c.bytes -= old.size
	}
	for len(c.order) > 0 && (c.bytes+size > c.maxBytes || len(c.entries) >= c.maxEntries) {
		oldest := c.order[0]
		c.order = c.order[1:]
		if old := c.entries[oldest]; old != nil && oldest != key {
			c.bytes -= old.size
			delete(c.entries, oldest)
		}
	}
	c.entries[key] = e
	c.order = append(c.order, key)
	c.bytes += size
}

func (c *replyCache) size() (entries, bytes int) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.entries), c.bytes
}

// cacheKey is what a kept reply answers: the method, the caller's identity, the metadata the worker gets
// (rec, the call record, from its fifth field) and the request bytes, each length-prefixed.
func cacheKey(method string, identity []byte, rec [][]byte, request []byte) string {
	size := len(method) + len(identity) + len(request) + 16
	for _, field := range rec[5:] {
		size += len(field) + 4
	}
	b := make([]byte, 0, size)
	b = binary.AppendUvarint(b, uint64(len(method)))
	b = append(b, method...)
	b = binary.AppendUvarint(b, uint64(len(identity)))
	b = append(b, identity...)
	b = binary.AppendUvarint(b, uint64(len(rec)-5))
	for _, field := range rec[5:] {
		b = binary.AppendUvarint(b, uint64(len(field)))
		b = append(b, field...)
	}
	return string(append(b, request...))
}

// cacheStats are the cache's counts for the core's /metrics: hits by method, and lookups that missed.
type cacheStats struct {
	hits   sync.Map // method -> *atomic.Int64
	misses atomic.Int64
}

func (s *cacheStats) hit(method string) {
	n, ok := s.hits.Load(method)
	if !ok {
		n, _ = s.hits.LoadOrStore(method, new(atomic.Int64))
	}
	n.(*atomic.Int64).Add(1)
}

// text is the counters file's cache lines: "hit METHOD n" each, "miss n", "entries n", "bytes n".
func (s *cacheStats) text(w *workers) string {
	var lines []string
	s.hits.Range(func(method, n any) bool {
		lines = append(lines, fmt.Sprintf("hit %s %d\n", method, n.(*atomic.Int64).Load()))
		return true
	})
	sort.Strings(lines)
	entries, bytes := 0, 0
	for i := range w.links {
		if l := w.links[i].Load(); l != nil && l.cache != nil {
			e, b := l.cache.size()
			entries, bytes = entries+e, bytes+b
		}
	}
	return strings.Join(lines, "") + fmt.Sprintf("miss %d\nentries %d\nbytes %d\n", s.misses.Load(), entries, bytes)
}

// ahead is what a call of a cacheable method sent before any worker saw it: its first message and whether
// its stream ended after it (a unary call's whole request), or a second message, or the error that ended
// the reading (io.EOF with no message: the client sent none).
type ahead struct {
	msg, second []byte
	ended       bool
	err         error
}

// readAhead reads a call's first message and the next RecvMsg's outcome, on a goroutine of its own (a
// client that stalls holds only it: the call goes to a worker after requestWait).
func readAhead(stream grpc.ServerStream) <-chan ahead {
	out := make(chan ahead, 1)
	go func() {
		var a ahead
		if err := stream.RecvMsg(&a.msg); err != nil {
			out <- ahead{err: err}
			return
		}
		var next []byte
		switch err := stream.RecvMsg(&next); err {
		case io.EOF:
			a.ended = true
		case nil:
			a.second = next
		default:
			a.err = err
		}
		out <- a
	}()
	return out
}
