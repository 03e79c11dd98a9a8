package runs

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"

	"github.com/airlockhq/airlock/pkg/egress"
)

// maxEgressLine is the longest line of egress.jsonl a watch sends: a
// bounded record is far shorter, so a longer line is not one.
const maxEgressLine = 64 << 10

// egressTail follows a run's egress.jsonl for a watch as it grows: each
// whole line is one decision, sent with its index; a line not yet whole
// waits for the next wake-up. Its state is two counts and an offset, so a
// job that makes huge numbers of connections costs a watcher nothing
// beyond the file the record keeps (itself capped: egressLog).
type egressTail struct {
	path string
	from int64 // the first index to send
	next int64 // the index of the line at off
	off  int64 // where the next line starts
	// long: the line at off is longer than maxEgressLine; it is skipped
	// up to its end.
	long bool
}

// send sends every whole line past what was sent before.
func (t *egressTail) send(send func(Event) error) error {
	f, err := os.Open(t.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.Seek(t.off, io.SeekStart); err != nil {
		return err
	}
	br := bufio.NewReaderSize(f, maxEgressLine)
	for {
		line, err := br.ReadSlice('\n')
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			t.off += int64(len(line))
			t.long = true
			continue
		case err != nil:
			return nil // no whole line more (yet)
		}
		t.off += int64(len(line))
		at, long := t.next, t.long
		t.next, t.long = t.next+1, false
		var r egress.Record
		if at < t.from || long || json.Unmarshal(bytes.TrimSpace(line), &r) != nil {
			continue // not a record: ScanRecords counts it and skips it too
		}
		r = r.Bounded()
		if err := send(Event{Egress: &r, EgressIndex: at}); err != nil {
			return err
		}
	}
}
