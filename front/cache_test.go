package main

import (
	"fmt"
	"testing"
)

func TestAnEntryServesOnlyItsGeneration(t *testing.T) {
	c := newReplyCache(1<<20, 100)
	c.put("k", 0, []byte("before the worker said a generation"), nil)
	if c.get("k") != nil {
		t.Fatal("an entry kept before the worker's first generation record")
	}
	c.moved(3)
	c.put("k", 2, []byte("an older generation's"), nil)
	c.put("j", 4, []byte("a newer generation's: its record is on the way"), nil)
	if c.get("k") != nil || c.get("j") != nil {
		t.Fatal("an entry of another generation than the latest")
	}
	c.put("k", 3, []byte("now"), nil)
	if e := c.get("k"); e == nil || string(e.reply) != "now" {
		t.Fatal("the latest generation's entry is not served")
	}
	c.moved(2) // generations only move on
	if c.get("k") == nil {
		t.Fatal("an older generation record voided the entries")
	}
	c.moved(4)
	if c.get("k") != nil {
		t.Fatal("an entry served after its generation moved")
	}
}

func TestTheBoundsEvictTheOldest(t *testing.T) {
	c := newReplyCache(1<<20, 10)
	c.moved(1)
	for i := range 25 {
		c.put(fmt.Sprint(i), 1, []byte("reply"), nil)
	}
	if n, _ := c.size(); n != 10 {
		t.Fatalf("%d entries past a bound of 10", n)
	}
	if c.get("14") != nil || c.get("15") == nil || c.get("24") == nil {
		t.Fatal("not the oldest evicted")
	}
	small := newReplyCache(1000, 1000)
	small.moved(1)
	for i := range 100 {
		small.put(fmt.Sprint(i), 1, make([]byte, 100), nil)
	}
	if _, bytes := small.size(); bytes > 1000 {
		t.Fatalf("%d bytes past a bound of 1000", bytes)
	}
	small.put("huge", 1, make([]byte, 2000), nil)
	if small.get("huge") != nil {
		t.Fatal("a reply past the whole bound kept")
	}
	if small.get("99") == nil {
		t.Fatal("the newest entry evicted")
	}
}

func TestTheKeyTellsItsPartsApart(t *testing.T) {
	rec := [][]byte{{kindCall}, nil, []byte("-1"), []byte("/m"), []byte("{}"), []byte("a"), []byte("b")}
	keys := map[string]bool{
		cacheKey("/m", []byte("x"), rec, []byte("r")):                    true,
		cacheKey("/m", []byte("x"), rec, []byte("s")):                    true,
		cacheKey("/m", []byte("y"), rec, []byte("r")):                    true,
		cacheKey("/n", []byte("x"), rec, []byte("r")):                    true,
		cacheKey("/m", []byte("x"), append(rec[:6:6], []byte("c")), nil): true,
		cacheKey("/m", []byte("x"), rec[:5], []byte("\x01a\x01br")):      true,
	}
	if len(keys) != 6 {
		t.Fatal("two calls that differ in method, caller, metadata or request share a key")
	}
}
