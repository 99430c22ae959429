package main

import (
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"google.golang.org/grpc"
)

// rawCodec passes message bytes through untouched: the front end does no proto work, the Python worker
// decodes and encodes (and the load generator sends prebuilt bytes).
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, fmt.Errorf("rawCodec: cannot marshal %T", v)
	}
	return *b, nil
}

// Unmarshal copies (data is gRPC's buffer, reused after we return); into a *callFrame it appends the bytes
// to the worker frame being built, so a request is copied once, into the frame that goes to the worker.
func (rawCodec) Unmarshal(data []byte, v any) error {
	switch b := v.(type) {
	case *[]byte:
		*b = append((*b)[:0], data...)
	case *callFrame:
		b.buf = append(b.buf, data...)
	default:
		return fmt.Errorf("rawCodec: cannot unmarshal into %T", v)
	}
	return nil
}

func (rawCodec) Name() string { return "proto" }

// serverOptions are a node's (nameserver/server.py): the same message size bound both ways.
func serverOptions(maxMessage int) []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ForceServerCodec(rawCodec{}), grpc.MaxRecvMsgSize(maxMessage),
		grpc.MaxSendMsgSize(maxMessage)}
}

// serve listens on addr, says where, and serves until SIGTERM or SIGINT.
func serve(server *grpc.Server, addr string) error {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	fmt.Printf("listening on %s\n", lis.Addr())
	os.Stdout.Sync()
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		server.Stop()
	}()
	return server.Serve(lis)
}
