// Package proto owns the wire protocol between the host's VM runtime (package
// vm/client) and the guest agent (package vm/guest): framing, message types
// and the bounds both sides hold each other to. Only those two packages (and
// their tests) import it.
//
// One byte stream (a virtio-serial port) carries frames: a 4-byte big-endian
// length L of what follows, a 4-byte big-endian stream id, a 1-byte type, then
// L-5 bytes of payload, at most MaxPayload. Stream 0 is control; every process
// has its own stream id, chosen by the host. Payloads are JSON except for the
// data frames (Stdin, Stdout, Stderr, File). Every byte from the other side is
// hostile: decoding is bounded and checked and never panics.
package proto

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
)

// MaxPayload bounds one frame's payload; a bigger frame is a protocol error
// that ends the connection (the reader cannot resynchronise after it).
const MaxPayload = 1 << 20

// headerSize is the length prefix, the stream id and the type.
const headerSize = 4 + 4 + 1

// ControlStream carries everything that is not one process's.
const ControlStream uint32 = 0

// Type says what a frame's payload is.
type Type uint8

// The frame types. Direction: G→H guest to host, H→G host to guest.
const (
	TypeHello      Type = 1  // G→H control: Hello
	TypeConfig     Type = 2  // H→G control: Config (after its files' File frames)
	TypeReady      Type = 3  // G→H control: the last control request succeeded (empty payload)
	TypeError      Type = 4  // G→H control or process stream: Error
	TypeStart      Type = 5  // H→G process stream: Process
	TypeStarted    Type = 6  // G→H process stream: Started
	TypeStdin      Type = 7  // H→G process stream: raw bytes for the process's stdin
	TypeStdinClose Type = 8  // H→G process stream: close the process's stdin (empty payload)
	TypeStdinAck   Type = 9  // G→H process stream: StdinAck, frees stdin window
	TypeStdout     Type = 10 // G→H process stream: raw bytes
	TypeStderr     Type = 11 // G→H process stream: raw bytes
	TypeExit       Type = 12 // G→H process stream: Exit, the stream's last frame
	TypeSignal     Type = 13 // H→G control: Signal, answered by Ready or Error
	TypeShutdown   Type = 14 // H→G control: power the machine off (empty payload)
	TypeFile       Type = 15 // H→G control: a chunk of a Config file, see EncodeFileChunk
	typeLimit      Type = 16
)

// String names a type for errors and logs.
func (t Type) String() string {
	names := [...]string{"", "hello", "config", "ready", "error", "start", "started", "stdin",
		"stdin-close", "stdin-ack", "stdout", "stderr", "exit", "signal", "shutdown", "file"}
	if t > 0 && t < typeLimit {
		return names[t]
	}
	return fmt.Sprintf("type(%d)", uint8(t))
}

// Frame is one decoded frame. Payload is owned by the receiver.
type Frame struct {
	Stream  uint32
	Type    Type
	Payload []byte
}

// ErrProtocol marks a malformed frame or message: the connection cannot be trusted after it.
var ErrProtocol = errors.New("vm protocol error")

// Reader decodes frames from a stream.
type Reader struct {
	r   *bufio.Reader
	hdr [headerSize]byte
}

// NewReader reads frames from r.
func NewReader(r io.Reader) *Reader { return &Reader{r: bufio.NewReaderSize(r, 64<<10)} }

// Read returns the next frame. io.EOF only at a frame boundary; a truncated
// frame is io.ErrUnexpectedEOF; an oversized or unknown one wraps ErrProtocol.
func (r *Reader) Read() (Frame, error) {
	if _, err := io.ReadFull(r.r, r.hdr[:]); err != nil {
		return Frame{}, err
	}
	n := binary.BigEndian.Uint32(r.hdr[0:4])
	if n < 5 || n-5 > MaxPayload {
		return Frame{}, fmt.Errorf("%w: frame length %d outside [5, %d]", ErrProtocol, n, MaxPayload+5)
	}
	f := Frame{Stream: binary.BigEndian.Uint32(r.hdr[4:8]), Type: Type(r.hdr[8])}
	if f.Type == 0 || f.Type >= typeLimit {
		return Frame{}, fmt.Errorf("%w: unknown frame type %d", ErrProtocol, r.hdr[8])
	}
	f.Payload = make([]byte, n-5)
	if _, err := io.ReadFull(r.r, f.Payload); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return Frame{}, err
	}
	return f, nil
}

// Writer encodes frames; it is safe for concurrent use, each frame written whole.
type Writer struct {
	mu  sync.Mutex
	w   io.Writer
	buf []byte
}

// NewWriter writes frames to w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Write sends one frame with a raw payload.
func (w *Writer) Write(stream uint32, t Type, payload []byte) error {
	if len(payload) > MaxPayload {
		return fmt.Errorf("%w: %s payload of %d bytes exceeds %d", ErrProtocol, t, len(payload), MaxPayload)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = binary.BigEndian.AppendUint32(w.buf[:0], uint32(len(payload)+5))
	w.buf = binary.BigEndian.AppendUint32(w.buf, stream)
	w.buf = append(w.buf, byte(t))
	w.buf = append(w.buf, payload...)
	_, err := w.w.Write(w.buf)
	if cap(w.buf) > 256<<10 {
		w.buf = nil // do not pin a 1 MiB buffer after one big frame
	}
	return err
}

// WriteJSON sends one frame whose payload is v as JSON.
func (w *Writer) WriteJSON(stream uint32, t Type, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s: %w", t, err)
	}
	return w.Write(stream, t, b)
}

// Decode unmarshals a JSON payload strictly (unknown fields and trailing data
// are errors, so a confused peer is noticed rather than half-understood).
func Decode(f Frame, v any) error {
	d := json.NewDecoder(bytes.NewReader(f.Payload))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return fmt.Errorf("%w: %s payload: %v", ErrProtocol, f.Type, err)
	}
	if d.More() {
		return fmt.Errorf("%w: %s payload: trailing data", ErrProtocol, f.Type)
	}
	return nil
}
