// Command loadgen drives a RocketMQ nameserver over its remoting protocol (JSON-header frames) from
// compiled code, so that the load generator is not what bounds the measurement. One goroutine per
// connection, each keeping `-inflight` requests outstanding; one JSON object on stdout at the end.
//
// Workloads: reads (GET_ROUTEINFO_BY_TOPIC over -topics), register (REGISTER_BROKER whose DataVersion
// changes on every call: each is a write), unchanged (REGISTER_BROKER with the same DataVersion every time;
// its one changing call is made before the clock starts). `loadgen fleet -config FILE` runs a whole simulated
// fleet instead (fleet.go).
package main

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

const (
	codeRegisterBroker = 103
	codeGetRoute       = 105
	maxFrame           = 16 << 20 // RocketMQ's own frame limit
	headerLengthMask   = 0xFFFFFF
	ioTimeout          = 30 * time.Second
)

type options struct {
	addrs        []string
	conns        int
	seconds      float64
	inflight     int
	workload     string
	topics       []string
	brokerTopics int
	prefix       string
}

// result is one connection's share of the run.
type result struct {
	lat        []int64 // nanoseconds, successful calls only
	bytesOut   int64   // frames written and read in the measured window (the capacity model's bytes per call)
	bytesIn    int64
	errors     int
	firstError string
}

func (r *result) fail(err error) {
	r.errors++
	if r.firstError == "" {
		r.firstError = err.Error()
	}
}

// request builds the frames of one connection's calls. A connection with several calls in flight
// registers one broker per slot, each slot's calls one at a time, as a broker does: concurrent
// registrations of one broker are no broker's traffic.
type request struct {
	opts   *options
	index  int
	opaque int32
	counts []int // per slot: DataVersion counter of its last registration
	topic  int
	buf    []byte
}

func newRequest(opts *options, index int) *request {
	return &request{opts: opts, index: index, topic: index, counts: make([]int, opts.inflight)}
}

func appendJSONString(b []byte, s string) []byte {
	q, _ := json.Marshal(s)
	return append(b, q...)
}

func (q *request) frame(code int, ext [][2]string, body []byte) []byte {
	q.opaque++
	return buildFrame(&q.buf, q.opaque, code, ext, body)
}

// buildFrame: int32 total length (without itself), int32 serialize type (top byte, 0 = JSON) and header
// length, the JSON header, the body. `scratch` is reused for the header between calls.
func buildFrame(scratch *[]byte, opaque int32, code int, ext [][2]string, body []byte) []byte {
	h := (*scratch)[:0]
	h = append(h, `{"code":`...)
	h = strconv.AppendInt(h, int64(code), 10)
	h = append(h, `,"extFields":{`...)
	for i, kv := range ext {
		if i > 0 {
			h = append(h, ',')
		}
		h = appendJSONString(h, kv[0])
		h = append(h, ':')
		h = appendJSONString(h, kv[1])
	}
	h = append(h, `},"flag":0,"language":"JAVA","opaque":`...)
	h = strconv.AppendInt(h, int64(opaque), 10)
	h = append(h, `,"serializeTypeCurrentRPC":"JSON","version":479}`...)
	*scratch = h
	out := make([]byte, 8, 8+len(h)+len(body))
	binary.BigEndian.PutUint32(out[0:4], uint32(4+len(h)+len(body)))
	binary.BigEndian.PutUint32(out[4:8], uint32(len(h)))
	out = append(out, h...)
	return append(out, body...)
}

func (q *request) brokerName(slot int) string {
	if slot == 0 {
		return fmt.Sprintf("%s-%d", q.opts.prefix, q.index)
	}
	return fmt.Sprintf("%s-%d-%d", q.opts.prefix, q.index, slot)
}

func (q *request) registerBody(slot, counter int) []byte {
	name := q.brokerName(slot)
	topics := make([]string, q.opts.brokerTopics)
	for t := range topics {
		topics[t] = fmt.Sprintf("%s-T%d", name, t)
	}
	return registerBrokerBody(counter, topics, 4)
}

// registerBrokerBody is a RegisterBrokerBody as a RocketMQ 5 broker writes it uncompressed (JSON).
func registerBrokerBody(counter int, topics []string, queues int) []byte {
	var b strings.Builder
	b.WriteString(`{"filterServerList":[],"topicConfigSerializeWrapper":{"dataVersion":{"counter":`)
	b.WriteString(strconv.Itoa(counter))
	b.WriteString(`,"stateVersion":0,"timestamp":1700000000000},"topicConfigTable":{`)
	for t, topic := range topics {
		if t > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `%q:{"attributes":{},"order":false,"perm":6,"readQueueNums":%d,"topicFilterType":"SINGLE_TAG","topicName":%q,"topicSysFlag":0,"writeQueueNums":%d}`, topic, queues, topic, queues)
	}
	b.WriteString(`}}}`)
	return []byte(b.String())
}

func (q *request) register(slot, counter int) []byte {
	body := q.registerBody(slot, counter)
	addr := fmt.Sprintf("127.0.0.1:%d", 20000+q.index*q.opts.inflight+slot)
	ext := [][2]string{
		{"bodyCrc32", strconv.FormatUint(uint64(crc32.ChecksumIEEE(body)&0x7FFFFFFF), 10)},
		{"brokerAddr", addr}, {"brokerId", "0"}, {"brokerName", q.brokerName(slot)},
		{"clusterName", q.opts.prefix + "-cluster"}, {"compressed", "false"},
		{"haServerAddr", "127.0.0.1:10912"},
	}
	return q.frame(codeRegisterBroker, ext, body)
}

// next is the frame of the workload's next call in the given slot.
func (q *request) next(slot int) []byte {
	switch q.opts.workload {
	case "reads":
		t := q.opts.topics[q.topic%len(q.opts.topics)]
		q.topic++
		return q.frame(codeGetRoute, [][2]string{{"topic", t}}, nil)
	case "register":
		q.counts[slot]++
		return q.register(slot, q.counts[slot])
	default: // unchanged
		return q.register(slot, 1)
	}
}

type reply struct {
	Code   int    `json:"code"`
	Opaque int32  `json:"opaque"`
	Remark string `json:"remark"`
	size   int    // bytes of the whole frame on the wire
}

func readReply(r *bufio.Reader) (reply, error) {
	var rep reply
	var prefix [8]byte
	if _, err := io.ReadFull(r, prefix[:]); err != nil {
		return rep, err
	}
	total := int(binary.BigEndian.Uint32(prefix[0:4]))
	word := binary.BigEndian.Uint32(prefix[4:8])
	if total < 4 || total > maxFrame {
		return rep, fmt.Errorf("frame length %d out of range", total)
	}
	headLen := int(word & headerLengthMask)
	if headLen > total-4 {
		return rep, fmt.Errorf("header length %d exceeds the frame's %d bytes", headLen, total-4)
	}
	if word>>24 != 0 {
		return rep, fmt.Errorf("reply header serialized as type %d, not JSON", word>>24)
	}
	payload := make([]byte, total-4)
	if _, err := io.ReadFull(r, payload); err != nil {
		return rep, err
	}
	if err := json.Unmarshal(payload[:headLen], &rep); err != nil {
		return rep, fmt.Errorf("reply header: %v", err)
	}
	rep.size = 4 + total
	return rep, nil
}

type conn struct {
	c net.Conn
	r *bufio.Reader
}

func dial(addr string) (*conn, error) {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	return &conn{c: c, r: bufio.NewReaderSize(c, 64<<10)}, nil
}

// call sends one frame and waits for its reply (set-up calls, outside the measured window).
func (c *conn) call(frame []byte) error {
	c.c.SetDeadline(time.Now().Add(ioTimeout))
	if _, err := c.c.Write(frame); err != nil {
		return err
	}
	rep, err := readReply(c.r)
	if err != nil {
		return err
	}
	if rep.Code != 0 {
		return fmt.Errorf("code %d: %s", rep.Code, rep.Remark)
	}
	return nil
}

// drive runs one connection from start to end, keeping opts.inflight calls outstanding; a reply that
// arrives after end is not counted. A broken connection is counted as an error and dialled again.
func drive(opts *options, index int, c *conn, start <-chan struct{}, end *time.Time, res *result) {
	addr := opts.addrs[index%len(opts.addrs)]
	q := newRequest(opts, index)
	<-start
	type call struct {
		t0   time.Time
		slot int
	}
	sent := map[int32]call{}
	free := make([]int, 0, opts.inflight)
	reset := func() {
		sent = map[int32]call{}
		free = free[:0]
		for s := opts.inflight - 1; s >= 0; s-- {
			free = append(free, s)
		}
	}
	reset()
	for time.Now().Before(*end) {
		if c == nil {
			var err error
			if c, err = dial(addr); err != nil {
				res.fail(err)
				time.Sleep(50 * time.Millisecond)
				continue
			}
			reset()
		}
		err := func() error {
			c.c.SetDeadline(time.Now().Add(ioTimeout))
			for len(free) > 0 && time.Now().Before(*end) {
				slot := free[len(free)-1]
				free = free[:len(free)-1]
				frame := q.next(slot)
				sent[q.opaque] = call{time.Now(), slot}
				if _, err := c.c.Write(frame); err != nil {
					return err
				}
				res.bytesOut += int64(len(frame))
			}
			if len(sent) == 0 {
				return nil
			}
			rep, err := readReply(c.r)
			if err != nil {
				return err
			}
			c0, ok := sent[rep.Opaque]
			if !ok {
				return fmt.Errorf("reply with unknown opaque %d", rep.Opaque)
			}
			delete(sent, rep.Opaque)
			free = append(free, c0.slot)
			res.bytesIn += int64(rep.size)
			now := time.Now()
			if now.After(*end) {
				return nil
			}
			if rep.Code != 0 {
				res.fail(fmt.Errorf("code %d: %s", rep.Code, rep.Remark))
			} else {
				res.lat = append(res.lat, now.Sub(c0.t0).Nanoseconds())
			}
			return nil
		}()
		if err != nil {
			res.fail(err)
			c.c.Close()
			c = nil
		}
	}
	if c != nil {
		c.c.Close()
	}
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Sec+ru.Stime.Sec) + float64(ru.Utime.Usec+ru.Stime.Usec)/1e6
}

func percentile(sorted []int64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)) * p)
	if i >= len(sorted) {
		i = len(sorted) - 1
	}
	return ms(sorted[i])
}

func ms(ns int64) float64 { return float64(ns/1000) / 1000 }

func round(x float64, digits int) float64 {
	s := strconv.FormatFloat(x, 'f', digits, 64)
	v, _ := strconv.ParseFloat(s, 64)
	return v
}

func parseOptions() (*options, error) {
	o := &options{}
	addrs := flag.String("addrs", "127.0.0.1:9876", "nameserver addresses, comma-separated; connections are spread over them")
	flag.IntVar(&o.conns, "connections", 1, "connections (one goroutine each)")
	flag.Float64Var(&o.seconds, "seconds", 5, "length of the measured window")
	flag.IntVar(&o.inflight, "inflight", 1, "requests outstanding per connection (1: one at a time)")
	flag.StringVar(&o.workload, "workload", "reads", "reads, register or unchanged")
	topics := flag.String("topics", "", "topics that reads ask for, comma-separated (registered beforehand)")
	flag.IntVar(&o.brokerTopics, "broker-topics", 8, "topics of each registering broker")
	flag.StringVar(&o.prefix, "prefix", fmt.Sprintf("loadgen-%d", os.Getpid()), "broker names' prefix (one broker per connection)")
	flag.Parse()
	o.addrs = strings.Split(*addrs, ",")
	if *topics != "" {
		o.topics = strings.Split(*topics, ",")
	}
	switch {
	case o.workload != "reads" && o.workload != "register" && o.workload != "unchanged":
		return nil, fmt.Errorf("-workload %q: not reads, register or unchanged", o.workload)
	case o.workload == "reads" && len(o.topics) == 0:
		return nil, errors.New("-topics: reads need at least one topic")
	case o.conns < 1 || o.inflight < 1 || o.seconds <= 0:
		return nil, errors.New("-connections, -inflight and -seconds must be positive")
	}
	return o, nil
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "fleet" {
		os.Exit(fleetMain(os.Args[2:]))
	}
	opts, err := parseOptions()
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(2)
	}
	// Every connection is open (and an unchanged workload's broker registered once) before the clock starts.
	conns := make([]*conn, opts.conns)
	for i := range conns {
		if conns[i], err = dial(opts.addrs[i%len(opts.addrs)]); err != nil {
			fmt.Fprintln(os.Stderr, "loadgen: connect:", err)
			os.Exit(1)
		}
		for slot := 0; opts.workload == "unchanged" && slot < opts.inflight; slot++ {
			if err := conns[i].call(newRequest(opts, i).register(slot, 1)); err != nil {
				fmt.Fprintln(os.Stderr, "loadgen: first registration:", err)
				os.Exit(1)
			}
		}
	}
	results := make([]result, opts.conns)
	start := make(chan struct{})
	var end time.Time
	var wg sync.WaitGroup
	for i := range conns {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			drive(opts, i, conns[i], start, &end, &results[i])
		}(i)
	}
	cpu0 := cpuSeconds()
	t0 := time.Now()
	end = t0.Add(time.Duration(opts.seconds * float64(time.Second)))
	close(start)
	wg.Wait()
	elapsed := time.Since(t0).Seconds()
	cpu := cpuSeconds() - cpu0

	var lat []int64
	var bytesOut, bytesIn int64
	errCount, firstError := 0, ""
	for _, r := range results {
		lat = append(lat, r.lat...)
		bytesOut += r.bytesOut
		bytesIn += r.bytesIn
		errCount += r.errors
		if firstError == "" {
			firstError = r.firstError
		}
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	ops := len(lat)
	perOp := 0.0
	if ops > 0 {
		perOp = cpu / float64(ops) * 1e6
	}
	maxMs := 0.0
	if ops > 0 {
		maxMs = ms(lat[ops-1])
	}
	out := map[string]any{
		"workload": opts.workload, "connections": opts.conns, "inflight": opts.inflight,
		"seconds": round(opts.seconds, 3), "elapsed_s": round(elapsed, 3),
		"ops": ops, "errors": errCount, "first_error": firstError,
		"ops_per_s": round(float64(ops)/opts.seconds, 1),
		"p50_ms":    percentile(lat, 0.50), "p90_ms": percentile(lat, 0.90), "p99_ms": percentile(lat, 0.99),
		"max_ms": maxMs, "cpu_s": round(cpu, 3), "cpu_us_per_op": round(perOp, 1),
		"bytes_sent": bytesOut, "bytes_received": bytesIn,
	}
	enc := json.NewEncoder(os.Stdout)
	if err := enc.Encode(out); err != nil {
		os.Exit(1)
	}
}
