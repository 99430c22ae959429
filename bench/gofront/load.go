package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protowire"
)

// loadResult is the load generator's one JSON object.
type loadResult struct {
	Clients      int            `json:"clients"`
	Conns        int            `json:"conns"`
	Seconds      float64        `json:"seconds"`
	Calls        int            `json:"calls"`
	Errors       int            `json:"errors"`
	Mismatches   int            `json:"mismatches"` // answered, but not with the expected reply (bytes or field)
	FirstError   string         `json:"first_error"`
	CallsPerS    float64        `json:"calls_per_s"`
	P50Ms        float64        `json:"p50_ms"`
	P99Ms        float64        `json:"p99_ms"`
	CPUS         float64        `json:"cpu_s"` // this process, user + system, over the measured window
	CPUUsPerCall float64        `json:"cpu_us_per_call"`
	CPUCoresBusy float64        `json:"cpu_cores"`
	FieldSum     int64          `json:"field_sum"`      // -sum-field's varint summed over the timed calls' replies
	CallsPerAddr map[string]int `json:"calls_per_addr"` // timed calls answered, per server address
	UntimedOK    int            `json:"untimed_ok"`     // the untimed first calls (one per client) answered
	UntimedSum   int64          `json:"untimed_field_sum"`
}

type clientResult struct {
	lat        []int64
	errors     int
	mismatches int
	firstError string
	fieldSum   int64
	untimedOK  bool
	untimedSum int64
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

func percentile(sorted []int64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q * float64(len(sorted)-1))
	return float64(sorted[i]) / 1e6
}

// readRequests: a file of requests, each a uvarint length and that many bytes.
func readRequests(path string) ([][]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out [][]byte
	for len(data) > 0 {
		n, k := binary.Uvarint(data)
		if k <= 0 || uint64(len(data)-k) < n {
			return nil, fmt.Errorf("%s: request %d is cut short or its length is not a uvarint", path, len(out)+1)
		}
		out = append(out, data[k:k+int(n)])
		data = data[k+int(n):]
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no requests", path)
	}
	return out, nil
}

// scanField: whether the message has top-level field `num`, and its value when that is a varint.
func scanField(msg []byte, num protowire.Number) (bool, uint64, error) {
	found, value := false, uint64(0)
	for len(msg) > 0 {
		n, typ, k := protowire.ConsumeTag(msg)
		if k < 0 {
			return false, 0, protowire.ParseError(k)
		}
		msg = msg[k:]
		if n == num {
			found = true
			if typ == protowire.VarintType {
				v, m := protowire.ConsumeVarint(msg)
				if m < 0 {
					return false, 0, protowire.ParseError(m)
				}
				value += v // a repeated field's values add up; a singular one appears once
			}
		}
		k = protowire.ConsumeFieldValue(n, typ, msg)
		if k < 0 {
			return false, 0, protowire.ParseError(k)
		}
		msg = msg[k:]
	}
	return found, value, nil
}

// clientRequests: the requests client i cycles through, and where it starts. The requests are cut into
// groups of `group` (the last one may be shorter); client i takes group i mod groups, starting at i mod group.
func clientRequests(requests [][]byte, group, i int) ([][]byte, int) {
	if group < 1 || group > len(requests) {
		group = len(requests)
	}
	groups := (len(requests) + group - 1) / group
	g := i % groups
	end := (g + 1) * group
	if end > len(requests) {
		end = len(requests)
	}
	mine := requests[g*group : end]
	return mine, i % len(mine)
}

// runLoad: `clients` goroutines, client i on server address i mod len(addrs) over connection i mod conns,
// each making one unary call at a time (closed loop) for `seconds`, after one untimed call each.
func runLoad(args []string) error {
	fs := flag.NewFlagSet("load", flag.ExitOnError)
	addr := fs.String("addr", "", "the server's gRPC address")
	addrList := fs.String("addrs", "", "several servers' addresses, comma-separated: clients spread round-robin")
	method := fs.String("method", getRouteMethod, "full method name, /package.Service/Method")
	requestFile := fs.String("request", "", "file holding the serialized request")
	requestsFile := fs.String("requests", "", "file of requests, each a uvarint length and its bytes (instead of -request)")
	group := fs.Int("group", 0, "-requests: requests per group; client i cycles through group i mod groups (0: one group)")
	expectFile := fs.String("expect", "", "file holding the reply every call must get (optional)")
	requireField := fs.Int("require-field", 0, "a reply without this top-level field number is a mismatch (0: none)")
	sumField := fs.Int("sum-field", 0, "sum this top-level varint field over the timed replies (0: none)")
	announce := fs.Bool("announce", false, "print {\"phase\":\"start\"} on its own line when the clock starts")
	clients := fs.Int("clients", 1, "closed-loop callers")
	conns := fs.Int("conns", 0, "HTTP/2 connections (0: one per client)")
	seconds := fs.Float64("seconds", 5, "measured seconds")
	timeout := fs.Duration("timeout", 10*time.Second, "each call's deadline")
	fs.Parse(args)
	addrs := []string{}
	for _, a := range strings.Split(*addrList, ",") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	if *addr != "" {
		addrs = append([]string{*addr}, addrs...)
	}
	if len(addrs) == 0 || *clients < 1 || *seconds <= 0 {
		return errors.New("-addr or -addrs, -clients >= 1 and -seconds > 0 are required")
	}
	if (*requestFile == "") == (*requestsFile == "") {
		return errors.New("one of -request and -requests is required")
	}
	if *conns < 1 || *conns > *clients {
		*conns = *clients
	}
	var requests [][]byte
	var err error
	if *requestFile != "" {
		request, err := os.ReadFile(*requestFile)
		if err != nil {
			return err
		}
		requests = [][]byte{request}
	} else if requests, err = readRequests(*requestsFile); err != nil {
		return err
	}
	var expect []byte
	if *expectFile != "" {
		if expect, err = os.ReadFile(*expectFile); err != nil {
			return err
		}
	}
	channels := make([]*grpc.ClientConn, *conns)
	for i := range channels {
		channels[i], err = grpc.NewClient(addrs[i%len(addrs)], grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{}), grpc.MaxCallRecvMsgSize(64<<20)))
		if err != nil {
			return err
		}
		defer channels[i].Close()
	}
	call := func(conn *grpc.ClientConn, request []byte, reply *[]byte) error {
		ctx, cancel := context.WithTimeout(context.Background(), *timeout)
		defer cancel()
		return conn.Invoke(ctx, *method, &request, reply)
	}
	// check: "" when the reply is what the load asks for, else why not; and -sum-field's value
	check := func(reply []byte) (string, uint64) {
		if expect != nil && !bytes.Equal(reply, expect) {
			return fmt.Sprintf("reply of %d bytes is not the expected %d", len(reply), len(expect)), 0
		}
		var sum uint64
		if *sumField > 0 {
			_, v, err := scanField(reply, protowire.Number(*sumField))
			if err != nil {
				return "reply does not parse: " + err.Error(), 0
			}
			sum = v
		}
		if *requireField > 0 {
			found, _, err := scanField(reply, protowire.Number(*requireField))
			if err != nil {
				return "reply does not parse: " + err.Error(), 0
			}
			if !found {
				return fmt.Sprintf("reply of %d bytes has no field %d", len(reply), *requireField), 0
			}
		}
		return "", sum
	}
	results := make([]clientResult, *clients)
	var ready, done sync.WaitGroup
	start := make(chan struct{})
	var deadline time.Time
	for i := range results {
		ready.Add(1)
		done.Add(1)
		mine, next := clientRequests(requests, *group, i)
		go func(r *clientResult, conn *grpc.ClientConn) {
			defer done.Done()
			var reply []byte
			err := call(conn, mine[next], &reply) // connects; not timed
			next = (next + 1) % len(mine)
			ready.Done()
			if err != nil {
				r.errors, r.firstError = 1, err.Error()
				return
			}
			_, sum := check(reply)
			r.untimedOK, r.untimedSum = true, int64(sum)
			<-start
			for time.Now().Before(deadline) {
				t0 := time.Now()
				err := call(conn, mine[next], &reply)
				next = (next + 1) % len(mine)
				if err != nil {
					r.errors++
					if r.firstError == "" {
						r.firstError = err.Error()
					}
					continue
				}
				elapsed := int64(time.Since(t0))
				if why, sum := check(reply); why != "" {
					r.mismatches++
					if r.firstError == "" {
						r.firstError = why
					}
				} else {
					r.lat = append(r.lat, elapsed)
					r.fieldSum += int64(sum)
				}
			}
		}(&results[i], channels[i%*conns])
	}
	ready.Wait()
	cpu0, t0 := cpuSeconds(), time.Now()
	deadline = t0.Add(time.Duration(*seconds * float64(time.Second)))
	if *announce {
		fmt.Println(`{"phase":"start"}`)
		os.Stdout.Sync()
	}
	close(start)
	done.Wait()
	elapsed, cpu := time.Since(t0).Seconds(), cpuSeconds()-cpu0
	out := loadResult{Clients: *clients, Conns: *conns, Seconds: elapsed, CPUS: cpu, CPUCoresBusy: cpu / elapsed,
		CallsPerAddr: map[string]int{}}
	var lat []int64
	for i, r := range results {
		lat = append(lat, r.lat...)
		out.Errors += r.errors
		out.Mismatches += r.mismatches
		out.FieldSum += r.fieldSum
		out.UntimedSum += r.untimedSum
		if r.untimedOK {
			out.UntimedOK++
		}
		out.CallsPerAddr[addrs[(i%*conns)%len(addrs)]] += len(r.lat)
		if out.FirstError == "" {
			out.FirstError = r.firstError
		}
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	out.Calls = len(lat)
	out.CallsPerS = float64(len(lat)) / elapsed
	out.P50Ms, out.P99Ms = percentile(lat, 0.50), percentile(lat, 0.99)
	if out.Calls > 0 {
		out.CPUUsPerCall = cpu / float64(out.Calls) * 1e6
	}
	return json.NewEncoder(os.Stdout).Encode(out)
}
