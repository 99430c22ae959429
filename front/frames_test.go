package main

import (
	"bufio"
	"bytes"
	"slices"
	"testing"
)

func TestFramesWrittenAreReadBack(t *testing.T) {
	var out bytes.Buffer
	w := bufio.NewWriterSize(&out, 64) // smaller than a frame: the frame goes out in pieces
	var f frameWriter
	big := bytes.Repeat([]byte("r"), 1000)
	sent := [][][][]byte{
		{{{kindCall}, []byte("12345678"), []byte("-1"), []byte("/a.B/C"), []byte("{}")}, {{kindHalfClose}, []byte("12345678")}},
		{{{kindMessage}, []byte("87654321"), big}, {{kindCancel}, {}}},
	}
	for _, frame := range sent {
		f.add(frame...)
		if err := f.writeTo(w); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(&out)
	for i, frame := range sent {
		got, err := readFrame(r, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.EqualFunc(got, frame, func(a, b [][]byte) bool { return slices.EqualFunc(a, b, bytes.Equal) }) {
			t.Fatalf("frame %d: read %q, wrote %q", i, got, frame)
		}
	}
	if _, err := readFrame(r, 1<<20); err == nil {
		t.Fatal("a frame after the last one written")
	}
}
