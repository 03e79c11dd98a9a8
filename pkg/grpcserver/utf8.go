package grpcserver

import (
	"context"
	"fmt"
	"strings"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// A request whose string field is not valid UTF-8 fails to decode, and
// gRPC reports every decoding failure as Internal, before any interceptor
// runs, naming nothing. This codec decodes such a request without the bad
// fields and marks it with the path of the first; the interceptor below
// then refuses it as InvalidArgument naming that field. A caller that sends
// the mark itself only gets its own call refused.

// utf8Mark is the field number of the mark: the largest there is, which no
// message of ours uses.
const utf8Mark = protowire.MaxValidNumber

type utf8Codec struct{}

func (utf8Codec) Name() string { return "proto" }

func (utf8Codec) Marshal(v any) ([]byte, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("grpcserver: cannot marshal %T", v)
	}
	return proto.Marshal(m)
}

func (utf8Codec) Unmarshal(data []byte, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("grpcserver: cannot unmarshal into %T", v)
	}
	err := proto.Unmarshal(data, m)
	if err == nil || !strings.Contains(err.Error(), "invalid UTF-8") {
		return err
	}
	var path string
	clean := scrubUTF8(data, m.ProtoReflect().Descriptor(), "", &path)
	if err := proto.Unmarshal(clean, m); err != nil || path == "" {
		return err
	}
	r := m.ProtoReflect()
	r.SetUnknown(append(r.GetUnknown(), protowire.AppendBytes(protowire.AppendTag(nil, utf8Mark, protowire.BytesType), []byte(path))...))
	return nil
}

var _ encoding.Codec = utf8Codec{}

// scrubUTF8 returns data without the string fields (at any depth) that are
// not valid UTF-8, and sets *first to the path of the first one.
func scrubUTF8(data []byte, md protoreflect.MessageDescriptor, prefix string, first *string) []byte {
	var out []byte
	for len(data) > 0 {
		num, typ, n := protowire.ConsumeTag(data)
		if n < 0 {
			return append(out, data...) // let proto.Unmarshal say what is wrong
		}
		m := protowire.ConsumeFieldValue(num, typ, data[n:])
		if m < 0 {
			return append(out, data...)
		}
		field := data[:n+m]
		data = data[n+m:]
		fd := md.Fields().ByNumber(num)
		if fd == nil || typ != protowire.BytesType {
			out = append(out, field...)
			continue
		}
		value, _ := protowire.ConsumeBytes(field[n:])
		name := prefix + string(fd.Name())
		switch fd.Kind() {
		case protoreflect.StringKind:
			if !utf8.Valid(value) {
				if *first == "" {
					*first = name
				}
				continue
			}
		case protoreflect.MessageKind:
			inner := scrubUTF8(value, fd.Message(), name+".", first)
			out = protowire.AppendBytes(protowire.AppendTag(out, num, protowire.BytesType), inner)
			continue
		}
		out = append(out, field...)
	}
	return out
}

// utf8Path returns the mark's path if req carries one.
func utf8Path(req any) string {
	m, ok := req.(proto.Message)
	if !ok {
		return ""
	}
	b := m.ProtoReflect().GetUnknown()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return ""
		}
		if num == utf8Mark && typ == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(b[n:])
			return string(v)
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return ""
		}
		b = b[n+m:]
	}
	return ""
}

func utf8Error(path string) error {
	// A caller can send the mark itself: what it says is bounded and quoted
	// unless it is a field path we wrote.
	if len(path) > 256 || strings.ContainsFunc(path, func(r rune) bool {
		return !(r == '.' || r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9')
	}) {
		return status.Error(codes.InvalidArgument, "a request field is not valid UTF-8")
	}
	return status.Errorf(codes.InvalidArgument, "%s: not valid UTF-8", path)
}

func unaryUTF8(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if p := utf8Path(req); p != "" {
		return nil, utf8Error(p)
	}
	return h(ctx, req)
}

func streamUTF8(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	return h(srv, utf8Stream{ss})
}

type utf8Stream struct{ grpc.ServerStream }

func (s utf8Stream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if p := utf8Path(m); p != "" {
		return utf8Error(p)
	}
	return nil
}
