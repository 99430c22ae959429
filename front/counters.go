package main

import (
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// countEvery is how often the call counts are written for the core's /metrics (nameserver/ops/gofront.py).
const countEvery = time.Second

// counters are the calls this front end answered, by status code (a call the worker answered, or one it
// answered itself: UNAVAILABLE with no worker, a cancel).
type counters struct {
	calls [codes.Unauthenticated + 1]atomic.Int64
}

func (c *counters) count(err error) {
	if code := status.Code(err); int(code) < len(c.calls) {
		c.calls[code].Add(1)
	}
}

// text is one "code count" line (the code's number) a code answered at least once.
func (c *counters) text() string {
	var b strings.Builder
	for code := range c.calls {
		if n := c.calls[code].Load(); n > 0 {
			fmt.Fprintf(&b, "%d %d\n", code, n)
		}
	}
	return b.String()
}

// keep writes the counts to path every countEvery (a new file renamed over the last: a reader sees whole
// ones), and after them what `more` says (the reply cache's lines).
func (c *counters) keep(path string, more func() string) {
	last := ""
	for range time.Tick(countEvery) {
		if now := c.text() + more(); now != last {
			tmp := path + ".tmp"
			if os.WriteFile(tmp, []byte(now), 0o600) == nil && os.Rename(tmp, path) == nil {
				last = now
			}
		}
	}
}
