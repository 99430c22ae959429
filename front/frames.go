package main

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Frames as nameserver/framing.py has them (the node's private sockets): a 4-byte big-endian length, then
// the number of records, each the number of its fields and each field length-prefixed (4-byte big-endian).
//
// Records, the first field one byte naming the kind and the second the call's id (8 bytes):
//
//	front -> worker  c call:     c, id, deadline ns on CLOCK_MONOTONIC ("-1": none), method, caller (the
//	                             corelink CALLER JSON: peer and TLS names), metadata key, value, ...
//	                 m message:  m, id, request bytes
//	                 h halfclose: h, id (the client sends no more)
//	                 x cancel:   x, id (the client went away, or its deadline passed)
//	                 a sent:     a, id (a streamed reply was handed to the client: the worker may send one more)
//	worker -> front  u unary:    u, id, reply bytes, trailing key, value, ... (status OK)
//	                 r reusable: r, id, generation, reply bytes, trailing key, value, ... (status OK; the
//	                             reply may answer the same call again while the worker's state generation
//	                             is this one: cache.go)
//	                 m message:  m, id, reply bytes (a server stream's)
//	                 s status:   s, id, code, details, trailing key, value, ...
//	                 g generation: g, 8 zero bytes, generation (decimal): the worker's state moved on; the
//	                             first record of every link, then one after each change (cache.go)

const (
	kindCall       = 'c'
	kindMessage    = 'm'
	kindHalfClose  = 'h'
	kindCancel     = 'x'
	kindSent       = 'a'
	kindUnary      = 'u'
	kindStatus     = 's'
	kindReusable   = 'r'
	kindGeneration = 'g'
	frameSlack     = 64 << 10 // a frame's bound past its largest message: headers and metadata
)

// frameWriter gathers records into one frame; writeTo writes it.
type frameWriter struct {
	records [][][]byte
	size    int
}

func (f *frameWriter) add(records ...[][]byte) {
	for _, record := range records {
		f.records = append(f.records, record)
		for _, field := range record {
			f.size += 4 + len(field)
		}
		f.size += 4
	}
}

// writeTo writes the records gathered to w as one frame (w's buffer: no copy of the frame of its own),
// and starts the next; the error is w's (sticky: a later write fails as well).
func (f *frameWriter) writeTo(w *bufio.Writer) error {
	number := func(v int) {
		w.Write(binary.BigEndian.AppendUint32(w.AvailableBuffer(), uint32(v)))
	}
	number(4 + f.size)
	number(len(f.records))
	for _, record := range f.records {
		number(len(record))
		for _, field := range record {
			number(len(field))
			w.Write(field)
		}
	}
	clear(f.records) // what was written is not held until its slot is taken again
	f.records, f.size = f.records[:0], 0
	_, err := w.Write(nil)
	return err
}

var errShape = errors.New("a frame of the wrong shape")

// readFrame returns the records of the next frame (io.EOF at the end of the socket between frames).
func readFrame(r *bufio.Reader, maxBytes int) ([][][]byte, error) {
	var head [4]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint32(head[:]))
	if n > maxBytes || n < 4 {
		return nil, fmt.Errorf("a %d-byte frame is past its %d-byte bound", n, maxBytes)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, err
	}
	at := 0
	number := func() (int, error) {
		if at+4 > len(body) {
			return 0, errShape
		}
		v := int(binary.BigEndian.Uint32(body[at:]))
		at += 4
		return v, nil
	}
	count, err := number()
	if err != nil {
		return nil, err
	}
	records := make([][][]byte, 0, min(count, 1024))
	for range count {
		nfields, err := number()
		if err != nil || nfields > (len(body)-at)/4 { // each field takes at least its length's 4 bytes
			return nil, errShape
		}
		fields := make([][]byte, 0, nfields)
		for range nfields {
			size, err := number()
			if err != nil || at+size > len(body) {
				return nil, errShape
			}
			fields = append(fields, body[at:at+size])
			at += size
		}
		records = append(records, fields)
	}
	if at != len(body) {
		return nil, errShape
	}
	return records, nil
}
