package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// loadResult is the load generator's one JSON object.
type loadResult struct {
	Clients      int     `json:"clients"`
	Conns        int     `json:"conns"`
	Seconds      float64 `json:"seconds"`
	Calls        int     `json:"calls"`
	Errors       int     `json:"errors"`
	Mismatches   int     `json:"mismatches"` // answered, but not with the expected reply bytes
	FirstError   string  `json:"first_error"`
	CallsPerS    float64 `json:"calls_per_s"`
	P50Ms        float64 `json:"p50_ms"`
	P99Ms        float64 `json:"p99_ms"`
	CPUS         float64 `json:"cpu_s"` // this process, user + system, over the measured window
	CPUUsPerCall float64 `json:"cpu_us_per_call"`
	CPUCoresBusy float64 `json:"cpu_cores"`
}

type clientResult struct {
	lat        []int64
	errors     int
	mismatches int
	firstError string
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

// runLoad: `clients` goroutines over `conns` connections (client i on connection i mod conns), each making
// one unary call at a time (closed loop) for `seconds`, after one untimed call each.
func runLoad(args []string) error {
	fs := flag.NewFlagSet("load", flag.ExitOnError)
	addr := fs.String("addr", "", "the server's gRPC address")
	method := fs.String("method", getRouteMethod, "full method name, /package.Service/Method")
	requestFile := fs.String("request", "", "file holding the serialized request")
	expectFile := fs.String("expect", "", "file holding the reply every call must get (optional)")
	clients := fs.Int("clients", 1, "closed-loop callers")
	conns := fs.Int("conns", 0, "HTTP/2 connections (0: one per client)")
	seconds := fs.Float64("seconds", 5, "measured seconds")
	timeout := fs.Duration("timeout", 10*time.Second, "each call's deadline")
	fs.Parse(args)
	if *addr == "" || *clients < 1 || *seconds <= 0 {
		return errors.New("-addr, -clients >= 1 and -seconds > 0 are required")
	}
	if *conns < 1 || *conns > *clients {
		*conns = *clients
	}
	request, err := os.ReadFile(*requestFile)
	if err != nil {
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
		channels[i], err = grpc.NewClient(*addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{}), grpc.MaxCallRecvMsgSize(64<<20)))
		if err != nil {
			return err
		}
		defer channels[i].Close()
	}
	call := func(conn *grpc.ClientConn, reply *[]byte) error {
		ctx, cancel := context.WithTimeout(context.Background(), *timeout)
		defer cancel()
		return conn.Invoke(ctx, *method, &request, reply)
	}
	results := make([]clientResult, *clients)
	var ready, done sync.WaitGroup
	start := make(chan struct{})
	var deadline time.Time
	for i := range results {
		ready.Add(1)
		done.Add(1)
		go func(r *clientResult, conn *grpc.ClientConn) {
			defer done.Done()
			var reply []byte
			err := call(conn, &reply) // connects; not timed
			ready.Done()
			if err != nil {
				r.errors, r.firstError = 1, err.Error()
				return
			}
			<-start
			for time.Now().Before(deadline) {
				t0 := time.Now()
				err := call(conn, &reply)
				switch {
				case err != nil:
					r.errors++
					if r.firstError == "" {
						r.firstError = err.Error()
					}
				case expect != nil && !bytes.Equal(reply, expect):
					r.mismatches++
					if r.firstError == "" {
						r.firstError = fmt.Sprintf("reply of %d bytes is not the expected %d", len(reply), len(expect))
					}
				default:
					r.lat = append(r.lat, int64(time.Since(t0)))
				}
			}
		}(&results[i], channels[i%*conns])
	}
	ready.Wait()
	cpu0, t0 := cpuSeconds(), time.Now()
	deadline = t0.Add(time.Duration(*seconds * float64(time.Second)))
	close(start)
	done.Wait()
	elapsed, cpu := time.Since(t0).Seconds(), cpuSeconds()-cpu0
	out := loadResult{Clients: *clients, Conns: *conns, Seconds: elapsed, CPUS: cpu, CPUCoresBusy: cpu / elapsed}
	var lat []int64
	for _, r := range results {
		lat = append(lat, r.lat...)
		out.Errors += r.errors
		out.Mismatches += r.mismatches
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
