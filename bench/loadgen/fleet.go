// The fleet mode (`loadgen fleet -config FILE`): a simulated RocketMQ fleet against a real cluster, driven by
// bench/fleet (Python), which scales the fleet's periods and writes the config. Brokers register with every
// node and re-register (unchanged) each heartbeat period over connections they keep; clients poll their
// topics' routes at the route-poll period; a scheduler restarts brokers (104, reconnect, changed 103) and
// adds or removes topics (changed 103); at one moment a fraction of the brokers fall silent with their
// connections open (a hung broker) and a probe measures when their routes are gone on each node.
// One JSON object on stdout: per operation per window count, errors and latency percentiles, the events,
// the expiry's figures and the final check of every broker's route on every node.
package main

import (
	"encoding/json"
	"fmt"
	"hash/crc32"
	"math/rand"
	"os"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

const (
	codeUnregisterBroker = 104
	codeTopicNotExist    = 17
	setupTries           = 10
)

type fleetConfig struct {
	Addrs                 []string `json:"addrs"`
	Prefix                string   `json:"prefix"`
	Brokers               int      `json:"brokers"`
	Topics                int      `json:"topics"`
	QueuesPerTopic        int      `json:"queues_per_topic"`
	Clients               int      `json:"clients"`
	TopicsPerClient       int      `json:"topics_per_client"`
	ClientConnections     int      `json:"client_connections"`
	RoutePollPeriodS      float64  `json:"route_poll_period_s"`
	HeartbeatPeriodS      float64  `json:"heartbeat_period_s"`
	HeartbeatTimeoutS     float64  `json:"heartbeat_timeout_s"`
	BrokerRestartsPerHour float64  `json:"broker_restarts_per_hour"`
	TopicChangesPerHour   float64  `json:"topic_changes_per_hour"`
	RestartDowntimeS      float64  `json:"restart_downtime_s"`
	Seconds               float64  `json:"seconds"`
	WindowS               float64  `json:"window_s"`
	MassExpiryAtS         float64  `json:"mass_expiry_at_s"` // negative: no mass expiry
	MassExpiryFraction    float64  `json:"mass_expiry_fraction"`
	ExpiryProbeBrokers    int      `json:"expiry_probe_brokers"`
	SetupConcurrency      int      `json:"setup_concurrency"`
	Seed                  int64    `json:"seed"`
}

func (c *fleetConfig) check() error {
	switch {
	case len(c.Addrs) == 0:
		return fmt.Errorf("addrs: at least one node's remoting address")
	case c.Brokers < 1 || c.Topics < c.Brokers:
		return fmt.Errorf("brokers %d, topics %d: need at least one broker and a topic per broker", c.Brokers, c.Topics)
	case c.HeartbeatPeriodS <= 0 || c.RoutePollPeriodS <= 0 || c.Seconds <= 0 || c.WindowS <= 0:
		return fmt.Errorf("heartbeat_period_s, route_poll_period_s, seconds and window_s must be positive")
	case c.HeartbeatTimeoutS <= c.HeartbeatPeriodS:
		return fmt.Errorf("heartbeat_timeout_s %g: must exceed heartbeat_period_s %g", c.HeartbeatTimeoutS, c.HeartbeatPeriodS)
	case c.MassExpiryFraction < 0 || c.MassExpiryFraction > 1:
		return fmt.Errorf("mass_expiry_fraction %g: not within 0..1", c.MassExpiryFraction)
	}
	if c.QueuesPerTopic < 1 {
		c.QueuesPerTopic = 8
	}
	if c.ClientConnections < 1 {
		c.ClientConnections = 1
	}
	if c.SetupConcurrency < 1 {
		c.SetupConcurrency = 32
	}
	return nil
}

// ---- recording ---------------------------------------------------------------------------------------

type opWindow struct {
	lat      []int64
	errors   int
	notFound int
}

// recorder keeps every call's latency by operation and by the window its call started in.
type recorder struct {
	mu       sync.Mutex
	t0       time.Time
	window   time.Duration
	windows  int
	ops      map[string][]opWindow
	firstErr map[string]string
}

func newRecorder(windows int, window time.Duration) *recorder {
	return &recorder{window: window, windows: windows, ops: map[string][]opWindow{}, firstErr: map[string]string{}}
}

// record one call that started at `start`; a reply code 17 (no such topic) counts as found-nothing, not
// as an error (a client asking for an expired broker's topic gets it from the stock NameServer too).
func (r *recorder) record(op string, start time.Time, code int, err error) {
	elapsed := time.Since(start).Nanoseconds()
	r.mu.Lock()
	defer r.mu.Unlock()
	w := int(start.Sub(r.t0) / r.window)
	if w < 0 || w >= r.windows {
		return
	}
	series := r.ops[op]
	if series == nil {
		series = make([]opWindow, r.windows)
		r.ops[op] = series
	}
	switch {
	case err != nil:
		series[w].errors++
		if r.firstErr[op] == "" {
			r.firstErr[op] = err.Error()
		}
	case code == codeTopicNotExist && op == "route":
		series[w].notFound++
		series[w].lat = append(series[w].lat, elapsed)
	case code != 0:
		series[w].errors++
		if r.firstErr[op] == "" {
			r.firstErr[op] = fmt.Sprintf("code %d", code)
		}
	default:
		series[w].lat = append(series[w].lat, elapsed)
	}
}

func summarize(ws []opWindow) map[string]any {
	var lat []int64
	errs, nf := 0, 0
	for _, w := range ws {
		lat = append(lat, w.lat...)
		errs += w.errors
		nf += w.notFound
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	out := map[string]any{"count": len(lat), "errors": errs, "p50_ms": percentile(lat, 0.50),
		"p99_ms": percentile(lat, 0.99), "max_ms": 0.0}
	if len(lat) > 0 {
		out["max_ms"] = ms(lat[len(lat)-1])
	}
	if nf > 0 {
		out["not_found"] = nf
	}
	return out
}

// ---- brokers -----------------------------------------------------------------------------------------

type broker struct {
	index   int
	name    string
	addr    string
	topics  []string // its own topics, then the churn's
	counter int      // DataVersion counter: changes with each changed registration
	conns   []*conn  // one per node, kept open between heartbeats as a broker keeps its channels
	scratch []byte
	opaque  int32
	silent  atomic.Bool
	busy    atomic.Bool // restarting or re-registering: the scheduler picks another
	cmds    chan func()
}

type fleet struct {
	cfg     *fleetConfig
	rec     *recorder
	brokers []*broker
	mu      sync.Mutex
	events  []map[string]any
	churn   []churned // topics the churn added, oldest first
	churnN  int
}

type churned struct {
	broker *broker
	topic  string
}

func (f *fleet) event(kind string, fields map[string]any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fields["kind"] = kind
	fields["t_s"] = round(time.Since(f.rec.t0).Seconds(), 3)
	f.events = append(f.events, fields)
}

func newBroker(cfg *fleetConfig, index int) *broker {
	b := &broker{index: index, counter: 1, cmds: make(chan func(), 4),
		name: fmt.Sprintf("%s-b%d", cfg.Prefix, index),
		// A distinct address per broker: liveness is kept per address. Nothing connects to it (the pushes
		// that would, 905 and 1008, are off unless configured).
		addr: fmt.Sprintf("10.%d.%d.%d:10911", (index>>16)&255, (index>>8)&255, index&255)}
	for t := index; t < cfg.Topics; t += cfg.Brokers {
		b.topics = append(b.topics, topicName(cfg, t))
	}
	return b
}

func topicName(cfg *fleetConfig, t int) string { return fmt.Sprintf("%s-t%d", cfg.Prefix, t) }

func (b *broker) registerFrame(cfg *fleetConfig) []byte {
	body := registerBrokerBody(b.counter, b.topics, cfg.QueuesPerTopic)
	b.opaque++
	return buildFrame(&b.scratch, b.opaque, codeRegisterBroker, [][2]string{
		{"bodyCrc32", strconv.FormatUint(uint64(crc32.ChecksumIEEE(body)&0x7FFFFFFF), 10)},
		{"brokerAddr", b.addr}, {"brokerId", "0"}, {"brokerName", b.name},
		{"clusterName", cfg.Prefix + "-cluster"}, {"compressed", "false"},
		{"haServerAddr", b.addr},
		{"heartbeatTimeoutMillis", strconv.Itoa(int(cfg.HeartbeatTimeoutS * 1000))},
	}, body)
}

func (b *broker) unregisterFrame(cfg *fleetConfig) []byte {
	b.opaque++
	return buildFrame(&b.scratch, b.opaque, codeUnregisterBroker, [][2]string{
		{"brokerAddr", b.addr}, {"brokerId", "0"}, {"brokerName", b.name},
		{"clusterName", cfg.Prefix + "-cluster"}}, nil)
}

// roundTrip: one call on the connection, its reply code; a code other than 0 and 17 comes back as an
// error too, with the reply's remark.
func (c *conn) roundTrip(frame []byte) (int, error) {
	c.c.SetDeadline(time.Now().Add(ioTimeout))
	if _, err := c.c.Write(frame); err != nil {
		return 0, err
	}
	rep, err := readReply(c.r)
	if err != nil {
		return 0, err
	}
	if rep.Code != 0 && rep.Code != codeTopicNotExist {
		return rep.Code, &replyError{rep.Code, rep.Remark}
	}
	return rep.Code, nil
}

type replyError struct {
	code   int
	remark string
}

func (e *replyError) Error() string { return fmt.Sprintf("code %d: %s", e.code, e.remark) }

// toEveryNode sends one frame per node, as a broker registers with each NameServer it knows; a broken
// connection is dialled again for the next call.
func (f *fleet) toEveryNode(b *broker, op string, frame func() []byte) {
	for i := range f.cfg.Addrs {
		start := time.Now()
		if b.conns[i] == nil {
			c, err := dial(f.cfg.Addrs[i])
			if err != nil {
				f.rec.record(op, start, 0, err)
				continue
			}
			b.conns[i] = c
		}
		code, err := b.conns[i].roundTrip(frame())
		if _, answered := err.(*replyError); err != nil && !answered {
			b.conns[i].c.Close()
			b.conns[i] = nil
		}
		f.rec.record(op, start, code, err)
	}
}

func (b *broker) closeConns() {
	for i, c := range b.conns {
		if c != nil {
			c.c.Close()
			b.conns[i] = nil
		}
	}
}

// runBroker heartbeats at the period from its own phase, and runs the scheduler's commands between.
func (f *fleet) runBroker(b *broker, end time.Time, wg *sync.WaitGroup) {
	defer wg.Done()
	period := time.Duration(f.cfg.HeartbeatPeriodS * float64(time.Second))
	next := f.rec.t0.Add(time.Duration(float64(period) * float64(b.index) / float64(f.cfg.Brokers)))
	timer := time.NewTimer(time.Until(next))
	defer timer.Stop()
	for {
		select {
		case cmd := <-b.cmds:
			cmd()
			b.busy.Store(false)
		case <-timer.C:
			if time.Now().After(end) {
				return
			}
			if !b.silent.Load() {
				f.toEveryNode(b, "heartbeat", func() []byte { return b.registerFrame(f.cfg) })
			}
			next = next.Add(period)
			if d := time.Until(next); d > 0 {
				timer.Reset(d)
			} else {
				next = time.Now()
				timer.Reset(0)
			}
		}
	}
}

// restart: a broker's shutdown (104 to each node, connections closed), its downtime, and its start (a new
// connection to each node and a changed registration, as a starting broker's DataVersion is new).
func (f *fleet) restart(b *broker) {
	f.toEveryNode(b, "unregister", func() []byte { return b.unregisterFrame(f.cfg) })
	b.closeConns()
	time.Sleep(time.Duration(f.cfg.RestartDowntimeS * float64(time.Second)))
	b.counter++
	f.toEveryNode(b, "register_changed", func() []byte { return b.registerFrame(f.cfg) })
}

// changeTopics adds a topic to the broker, or removes the oldest topic the churn added (alternately), and
// registers the changed table with every node, as a broker does after mqadmin updateTopic / deleteTopic.
func (f *fleet) changeTopics(b *broker, add bool, topic string) {
	if add {
		b.topics = append(b.topics, topic)
	} else {
		for i, t := range b.topics {
			if t == topic {
				b.topics = append(b.topics[:i:i], b.topics[i+1:]...)
				break
			}
		}
	}
	b.counter++
	f.toEveryNode(b, "register_changed", func() []byte { return b.registerFrame(f.cfg) })
}

// pick: a random broker that is neither silent nor busy, marked busy; nil when none is free.
func (f *fleet) pick(rng *rand.Rand) *broker {
	for tries := 0; tries < 32; tries++ {
		b := f.brokers[rng.Intn(len(f.brokers))]
		if !b.silent.Load() && b.busy.CompareAndSwap(false, true) {
			return b
		}
	}
	return nil
}

// every calls fn at the given rate per hour until end (nothing when the rate is 0).
func every(perHour float64, t0, end time.Time, fn func()) {
	if perHour <= 0 {
		return
	}
	interval := time.Duration(3600 / perHour * float64(time.Second))
	for next := t0.Add(interval / 2); next.Before(end); next = next.Add(interval) {
		time.Sleep(time.Until(next))
		fn()
	}
}

func (f *fleet) schedule(end time.Time, wg *sync.WaitGroup) {
	rng := rand.New(rand.NewSource(f.cfg.Seed))
	var rngMu sync.Mutex
	pick := func() *broker { rngMu.Lock(); defer rngMu.Unlock(); return f.pick(rng) }
	wg.Add(2)
	go func() {
		defer wg.Done()
		every(f.cfg.BrokerRestartsPerHour, f.rec.t0, end, func() {
			if b := pick(); b != nil {
				f.event("restart", map[string]any{"broker": b.name})
				b.cmds <- func() { f.restart(b) }
			}
		})
	}()
	go func() {
		defer wg.Done()
		every(f.cfg.TopicChangesPerHour, f.rec.t0, end, func() {
			f.mu.Lock()
			add := f.churnN%2 == 0 || len(f.churn) == 0
			var ch churned
			if add {
				f.mu.Unlock()
				b := pick()
				if b == nil {
					return
				}
				f.mu.Lock()
				ch = churned{b, fmt.Sprintf("%s-c%d", f.cfg.Prefix, f.churnN)}
				f.churn = append(f.churn, ch)
			} else {
				ch = f.churn[0]
				if !ch.broker.busy.CompareAndSwap(false, true) {
					f.mu.Unlock()
					return
				}
				f.churn = f.churn[1:]
			}
			f.churnN++
			f.mu.Unlock()
			kind := map[bool]string{true: "topic_added", false: "topic_removed"}[add]
			f.event(kind, map[string]any{"broker": ch.broker.name, "topic": ch.topic})
			ch.broker.cmds <- func() {
				if !ch.broker.silent.Load() { // a silent broker says nothing more
					f.changeTopics(ch.broker, add, ch.topic)
				}
			}
		})
	}()
}

// ---- clients -----------------------------------------------------------------------------------------

// runClients: the clients' route polls spread over a pool of connections (each connection serves the
// clients i with i % pool == its index, on node i % nodes), each poll at its own phase of the period.
func (f *fleet) runClients(end time.Time, wg *sync.WaitGroup) {
	cfg := f.cfg
	if cfg.Clients < 1 || cfg.TopicsPerClient < 1 {
		return
	}
	pool := cfg.ClientConnections
	if pool > cfg.Clients {
		pool = cfg.Clients
	}
	for p := 0; p < pool; p++ {
		var topics []string
		for i := p; i < cfg.Clients; i += pool {
			for k := 0; k < cfg.TopicsPerClient; k++ {
				topics = append(topics, topicName(cfg, int((int64(i)*int64(cfg.TopicsPerClient)+int64(k))*7919%int64(cfg.Topics))))
			}
		}
		wg.Add(1)
		go func(p int, topics []string) {
			defer wg.Done()
			addr := cfg.Addrs[p%len(cfg.Addrs)]
			interval := time.Duration(cfg.RoutePollPeriodS * float64(time.Second) / float64(len(topics)))
			next := f.rec.t0.Add(time.Duration(float64(interval) * float64(p) / float64(pool)))
			var c *conn
			var scratch []byte
			var opaque int32
			for n := 0; ; n++ {
				time.Sleep(time.Until(next))
				if time.Now().After(end) {
					break
				}
				next = next.Add(interval)
				start := time.Now()
				if c == nil {
					var err error
					if c, err = dial(addr); err != nil {
						f.rec.record("route", start, 0, err)
						continue
					}
				}
				opaque++
				code, err := c.roundTrip(buildFrame(&scratch, opaque, codeGetRoute,
					[][2]string{{"topic", topics[n%len(topics)]}}, nil))
				if _, answered := err.(*replyError); err != nil && !answered {
					c.c.Close()
					c = nil
				}
				f.rec.record("route", start, code, err)
			}
			if c != nil {
				c.c.Close()
			}
		}(p, topics)
	}
}

// ---- mass expiry -------------------------------------------------------------------------------------

// routed: whether each node answers the topic's route (code 0) rather than "no such topic" (17).
func routed(c *conn, scratch *[]byte, opaque *int32, topic string) (bool, error) {
	*opaque++
	code, err := c.roundTrip(buildFrame(scratch, *opaque, codeGetRoute, [][2]string{{"topic", topic}}, nil))
	if err != nil {
		return false, fmt.Errorf("route of %s: %v", topic, err)
	}
	return code == 0, nil
}

// massExpiry silences a fraction of the brokers at once (their connections stay open: nothing but the
// heartbeat timeout can tell) and probes, on every node, a sample of their topics until none is routed.
func (f *fleet) massExpiry(end time.Time) map[string]any {
	cfg := f.cfg
	at := f.rec.t0.Add(time.Duration(cfg.MassExpiryAtS * float64(time.Second)))
	time.Sleep(time.Until(at))
	rng := rand.New(rand.NewSource(cfg.Seed + 1))
	var silent []*broker
	want := int(float64(len(f.brokers)) * cfg.MassExpiryFraction)
	for _, i := range rng.Perm(len(f.brokers)) {
		// busy stays set: the scheduler leaves a silent broker alone; one restarting now is not picked
		if b := f.brokers[i]; len(silent) < want && b.busy.CompareAndSwap(false, true) {
			b.silent.Store(true)
			silent = append(silent, b)
		}
	}
	t0 := time.Now()
	f.event("mass_expiry", map[string]any{"brokers": len(silent)})
	probe := silent
	if cfg.ExpiryProbeBrokers > 0 && len(probe) > cfg.ExpiryProbeBrokers {
		probe = probe[:cfg.ExpiryProbeBrokers]
	}
	goneAfter := make([]any, len(cfg.Addrs))
	var wg sync.WaitGroup
	for n, addr := range cfg.Addrs {
		wg.Add(1)
		go func(n int, addr string) {
			defer wg.Done()
			c, err := dial(addr)
			if err != nil {
				return
			}
			defer c.c.Close()
			var scratch []byte
			var opaque int32
			left := probe
			for len(left) > 0 && time.Now().Before(end) {
				var still []*broker
				for _, b := range left {
					if ok, err := routed(c, &scratch, &opaque, b.topics[0]); err != nil || ok {
						still = append(still, b)
					}
				}
				left = still
				if len(left) == 0 {
					goneAfter[n] = round(time.Since(t0).Seconds(), 3)
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
		}(n, addr)
	}
	wg.Wait()
	return map[string]any{"at_s": round(t0.Sub(f.rec.t0).Seconds(), 3), "brokers": len(silent),
		"probed_brokers": len(probe), "gone_after_s": goneAfter, "silent": silent}
}

// finalCheck: on every node, each broker's first topic, routed or not; after the run, with nothing
// restarting. Silent brokers' topics should all be gone, every other broker's present.
func (f *fleet) finalCheck() []map[string]any {
	out := make([]map[string]any, len(f.cfg.Addrs))
	var wg sync.WaitGroup
	for n, addr := range f.cfg.Addrs {
		wg.Add(1)
		go func(n int, addr string) {
			defer wg.Done()
			res := map[string]any{"node": addr}
			out[n] = res
			c, err := dial(addr)
			if err != nil {
				res["error"] = err.Error()
				return
			}
			defer c.c.Close()
			var scratch []byte
			var opaque int32
			silentRouted, liveMissing := 0, 0
			for _, b := range f.brokers {
				ok, err := routed(c, &scratch, &opaque, b.topics[0])
				if err != nil {
					res["error"] = err.Error()
					return
				}
				if ok && b.silent.Load() {
					silentRouted++
				} else if !ok && !b.silent.Load() {
					liveMissing++
				}
			}
			res["silent_still_routed"], res["live_missing"] = silentRouted, liveMissing
		}(n, addr)
	}
	wg.Wait()
	return out
}

// ---- the run -----------------------------------------------------------------------------------------

// setup registers every broker with every node (a changed registration each: its first), a few at a time.
func (f *fleet) setup() map[string]any {
	start := time.Now()
	sem := make(chan struct{}, f.cfg.SetupConcurrency)
	var wg sync.WaitGroup
	var errs atomic.Int64
	var firstErr atomic.Value
	for _, b := range f.brokers {
		wg.Add(1)
		sem <- struct{}{}
		go func(b *broker) {
			defer wg.Done()
			defer func() { <-sem }()
			for i, addr := range f.cfg.Addrs {
				var err error
				// a refused first registration is retried, as a starting broker retries (SYSTEM_BUSY while
				// the node is loaded); only the last failure counts
				for try := 0; try < setupTries; try++ {
					if try > 0 {
						time.Sleep(time.Duration(try) * 200 * time.Millisecond)
					}
					if b.conns[i] == nil {
						if b.conns[i], err = dial(addr); err != nil {
							continue
						}
					}
					if _, err = b.conns[i].roundTrip(b.registerFrame(f.cfg)); err == nil {
						break
					} else if _, answered := err.(*replyError); !answered {
						b.conns[i].c.Close()
						b.conns[i] = nil
					}
				}
				if err != nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				}
			}
		}(b)
	}
	wg.Wait()
	out := map[string]any{"seconds": round(time.Since(start).Seconds(), 3), "registrations": len(f.brokers) * len(f.cfg.Addrs),
		"errors": errs.Load()}
	if e := firstErr.Load(); e != nil {
		out["first_error"] = e
	}
	return out
}

func fleetMain(args []string) int {
	if len(args) != 2 || args[0] != "-config" {
		fmt.Fprintln(os.Stderr, "usage: loadgen fleet -config FILE (JSON: see fleetConfig in fleet.go)")
		return 2
	}
	raw, err := os.ReadFile(args[1])
	cfg := &fleetConfig{}
	if err == nil {
		err = json.Unmarshal(raw, cfg)
	}
	if err == nil {
		err = cfg.check()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen fleet:", err)
		return 2
	}
	window := time.Duration(cfg.WindowS * float64(time.Second))
	windows := int((cfg.Seconds + cfg.WindowS - 1e-9) / cfg.WindowS)
	f := &fleet{cfg: cfg, rec: newRecorder(windows, window)}
	for i := 0; i < cfg.Brokers; i++ {
		b := newBroker(cfg, i)
		b.conns = make([]*conn, len(cfg.Addrs))
		f.brokers = append(f.brokers, b)
	}
	setup := f.setup()
	cpu0 := cpuSeconds()
	f.rec.t0 = time.Now()
	end := f.rec.t0.Add(time.Duration(cfg.Seconds * float64(time.Second)))
	// The driver aligns its samples of the nodes with this line.
	fmt.Fprintf(os.Stderr, "RUN %.6f\n", float64(f.rec.t0.UnixNano())/1e9)
	var wg sync.WaitGroup
	for _, b := range f.brokers {
		wg.Add(1)
		go f.runBroker(b, end, &wg)
	}
	f.runClients(end, &wg)
	var sched sync.WaitGroup
	f.schedule(end, &sched)
	var expiry map[string]any
	done := make(chan struct{})
	go func() {
		defer close(done)
		if cfg.MassExpiryAtS >= 0 && cfg.MassExpiryAtS < cfg.Seconds && cfg.MassExpiryFraction > 0 {
			expiry = f.massExpiry(end)
		}
	}()
	sched.Wait()
	wg.Wait() // every broker has finished its last command: nothing is restarting
	<-done
	cpu := cpuSeconds() - cpu0
	check := f.finalCheck()
	for _, b := range f.brokers {
		b.closeConns()
	}
	if expiry != nil {
		delete(expiry, "silent")
	}
	windowsOut := make([]map[string]any, windows)
	for w := range windowsOut {
		ops := map[string]any{}
		for op, series := range f.rec.ops {
			ops[op] = summarize(series[w : w+1])
		}
		windowsOut[w] = map[string]any{"t_s": round(float64(w)*cfg.WindowS, 3), "ops": ops}
	}
	totals := map[string]any{}
	for op, series := range f.rec.ops {
		totals[op] = summarize(series)
	}
	out := map[string]any{"setup": setup, "seconds": cfg.Seconds, "window_s": cfg.WindowS,
		"started_unix": float64(f.rec.t0.UnixNano()) / 1e9, "windows": windowsOut, "totals": totals,
		"first_errors": f.rec.firstErr, "events": f.events, "expiry": expiry, "final_check": check,
		"loadgen_cpu_s": round(cpu, 3)}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		return 1
	}
	return 0
}
