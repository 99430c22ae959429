package main

import (
	"flag"
	"os"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
)

const getRouteMethod = "/rip18.nameserver.v1.NameServer/GetRoute"

// routeEcho answers GetRoute in Go: decodes the GetRouteRequest, and for its one topic encodes a
// GetRouteReply of the prebuilt TopicRoute bytes and an apply offset. The compiled ceiling of the spike.
type routeEcho struct {
	topic  string
	route  []byte // a serialized TopicRoute
	offset uint64
}

// getRouteTopic decodes a GetRouteRequest (topic = 1, min_offset = 2, zone_name = 3) and returns its topic.
func getRouteTopic(b []byte) (string, error) {
	topic := ""
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return "", protowire.ParseError(n)
		}
		b = b[n:]
		if num == 1 && typ == protowire.BytesType {
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return "", protowire.ParseError(m)
			}
			if !utf8.Valid(v) {
				return "", status.Error(codes.InvalidArgument, "topic: not UTF-8")
			}
			topic, b = string(v), b[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return "", protowire.ParseError(m)
		}
		b = b[m:]
	}
	return topic, nil
}

func (e *routeEcho) handle(_ any, stream grpc.ServerStream) error {
	if method, _ := grpc.MethodFromServerStream(stream); method != getRouteMethod {
		return status.Errorf(codes.Unimplemented, "method %s: only GetRoute", method)
	}
	var req []byte
	if err := stream.RecvMsg(&req); err != nil {
		return err
	}
	topic, err := getRouteTopic(req)
	if err != nil {
		return status.Error(codes.InvalidArgument, "GetRouteRequest: "+err.Error())
	}
	if topic != e.topic {
		return status.Errorf(codes.NotFound, "topic %s does not exist", topic)
	}
	reply := make([]byte, 0, len(e.route)+16)
	reply = protowire.AppendTag(reply, 1, protowire.BytesType)
	reply = protowire.AppendBytes(reply, e.route)
	reply = protowire.AppendTag(reply, 2, protowire.VarintType)
	reply = protowire.AppendVarint(reply, e.offset)
	return stream.SendMsg(&reply)
}

func runEcho(args []string) error {
	fs := flag.NewFlagSet("echo", flag.ExitOnError)
	addr := fs.String("addr", "127.0.0.1:0", "gRPC listen address")
	routeFile := fs.String("route", "", "file holding the serialized TopicRoute to answer with")
	topic := fs.String("topic", "", "the one topic that has a route")
	offset := fs.Uint64("offset", 0, "the apply offset of every reply")
	maxMessage := fs.Int("max-message", 4<<20, "largest request or reply, bytes")
	fs.Parse(args)
	route, err := os.ReadFile(*routeFile)
	if err != nil {
		return err
	}
	e := &routeEcho{topic: *topic, route: route, offset: *offset}
	server := grpc.NewServer(append(serverOptions(*maxMessage), grpc.UnknownServiceHandler(e.handle))...)
	return serve(server, *addr)
}
