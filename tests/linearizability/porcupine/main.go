// Command porcupinecheck checks queue-binding histories with porcupine, the linearizability checker
// etcd's robustness tests use, as a cross-check of our own checker (tests/linearizability/checker.py).
//
// Input (stdin): a JSON list of histories, each a list of operations as tests/linearizability/porcupine.py
// exports them. Output (stdout): one JSON line per history, {"index": i, "result": "ok"|"illegal"|"unknown"}
// ("unknown": porcupine ran out of time).
//
// The model is the one checker.py documents, per key: a binding is unbound or (owner, version), where
// the version may be one nobody has seen yet (a bind whose outcome is unknown), greater than a floor,
// until a later read or compare-and-set pins it. An operation whose outcome is unknown may take effect
// at any point after its invocation, or never: it returns after every other operation, and its step
// allows "no effect" too.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/anishathalye/porcupine"
)

type op struct {
	Process  int    `json:"process"`
	Key      string `json:"key"`
	Kind     string `json:"kind"` // bind | release | read
	Invoke   int64  `json:"invoke"`
	Complete *int64 `json:"complete"` // null: outcome unknown
	Status   string `json:"status"`   // ok | fail | unknown
	Owner    string `json:"owner"`
	Expected int64  `json:"expected"`
	Version  int64  `json:"version"`
	Found    bool   `json:"found"`
}

// binding is the model's state for one key (a comparable value: porcupine compares states with ==).
type binding struct {
	bound   bool
	owner   string
	version int64
	unknown bool // version not seen yet: some value greater than floor
	floor   int64
}

// matches: can the binding's version be `want`? The binding with its version pinned, if so.
func matches(b binding, want int64) (binding, bool) {
	if b.unknown {
		if want > b.floor {
			b.unknown, b.floor, b.version = false, 0, want
			return b, true
		}
		return b, false
	}
	return b, b.version == want
}

func differs(b binding, want int64) bool { return b.unknown || b.version != want }

// effect: every state `o` can leave `s` in when it takes effect (checker.py's step).
func effect(s binding, o op) []binding {
	cur := s
	if !s.bound {
		cur = binding{}
	}
	switch o.Kind {
	case "read":
		if o.Status != "ok" {
			return []binding{s}
		}
		if !o.Found {
			if s.bound {
				return nil
			}
			return []binding{s}
		}
		if !s.bound || s.owner != o.Owner {
			return nil
		}
		if pinned, ok := matches(cur, o.Version); ok {
			return []binding{pinned}
		}
		return nil
	case "bind":
		if o.Status == "fail" {
			if (s.bound && differs(cur, o.Expected)) || (!s.bound && o.Expected != 0) {
				return []binding{s}
			}
			return nil
		}
		var base int64
		if o.Expected == 0 {
			if s.bound {
				return nil
			}
		} else {
			if !s.bound {
				return nil
			}
			if _, ok := matches(cur, o.Expected); !ok {
				return nil
			}
			base = o.Expected
		}
		if o.Status == "ok" {
			if o.Version > base {
				return []binding{{bound: true, owner: o.Owner, version: o.Version}}
			}
			return nil
		}
		return []binding{{bound: true, owner: o.Owner, unknown: true, floor: base}}
	case "release":
		if o.Status == "fail" {
			if !s.bound || differs(cur, o.Expected) {
				return []binding{s}
			}
			return nil
		}
		if !s.bound {
			return nil
		}
		if _, ok := matches(cur, o.Expected); !ok {
			return nil
		}
		return []binding{{}}
	}
	return nil
}

var model = porcupine.NondeterministicModel{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, o := range history {
			k := o.Input.(op).Key
			if _, seen := byKey[k]; !seen {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], o)
		}
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() []interface{} { return []interface{}{binding{}} },
	Step: func(state, input, output interface{}) []interface{} {
		s, o := state.(binding), input.(op)
		var next []interface{}
		for _, n := range effect(s, o) {
			next = append(next, n)
		}
		if o.Status == "unknown" { // it may never have taken effect
			next = append(next, s)
		}
		return next
	},
	DescribeOperation: func(input, output interface{}) string {
		o := input.(op)
		return fmt.Sprintf("%s(%s owner=%q expected=%d) -> %s version=%d found=%v",
			o.Kind, o.Key, o.Owner, o.Expected, o.Status, o.Version, o.Found)
	},
}

func operations(ops []op) []porcupine.Operation {
	var last int64
	for _, o := range ops {
		if o.Complete != nil && *o.Complete > last {
			last = *o.Complete
		}
		if o.Invoke > last {
			last = o.Invoke
		}
	}
	out := make([]porcupine.Operation, 0, len(ops))
	for i, o := range ops {
		ret := last + 1 + int64(i) // outcome unknown: after every completed operation
		if o.Complete != nil {
			ret = *o.Complete
		}
		out = append(out, porcupine.Operation{ClientId: o.Process, Input: o, Call: o.Invoke, Output: nil, Return: ret})
	}
	return out
}

func main() {
	var histories [][]op
	if err := json.NewDecoder(os.Stdin).Decode(&histories); err != nil {
		fmt.Fprintln(os.Stderr, "porcupinecheck: bad input:", err)
		os.Exit(2)
	}
	timeout := 10 * time.Second
	if v := os.Getenv("PORCUPINE_TIMEOUT_S"); v != "" {
		if d, err := time.ParseDuration(v + "s"); err == nil {
			timeout = d
		}
	}
	enc := json.NewEncoder(os.Stdout)
	m := model.ToModel()
	for i, h := range histories {
		res := porcupine.CheckOperationsTimeout(m, operations(h), timeout)
		name := map[porcupine.CheckResult]string{porcupine.Ok: "ok", porcupine.Illegal: "illegal", porcupine.Unknown: "unknown"}[res]
		if err := enc.Encode(map[string]interface{}{"index": i, "result": name}); err != nil {
			os.Exit(2)
		}
	}
}
