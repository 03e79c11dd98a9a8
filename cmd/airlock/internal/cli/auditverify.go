package cli

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/pki"
	"github.com/airlockhq/airlock/pkg/termtext"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
)

// verifyReport is what audit verify prints.
type verifyReport struct {
	Verified int64  `json:"verified"`
	Head     string `json:"head,omitempty"`
	BrokenAt int64  `json:"broken_at_sequence,omitempty"`
	Reason   string `json:"reason,omitempty"`
	Unbroken bool   `json:"unbroken"`
	// Checkpoints is how many signed checkpoints were checked against the
	// log; Anchored, how many it reached and agreed with, the last of them
	// at AnchoredThrough.
	Checkpoints     int    `json:"checkpoints"`
	Anchored        int    `json:"anchored"`
	AnchoredThrough int64  `json:"anchored_through,omitempty"`
	KeyID           string `json:"key_id,omitempty"`
	// NewestCheckpoint is when the newest checkpoint was signed: a kept
	// file much older than the log it checks anchors only its start.
	NewestCheckpoint string `json:"newest_checkpoint,omitempty"`
	// Disagrees names the first checkpoint the log disagrees with.
	Disagrees string `json:"disagrees,omitempty"`
	// Halted is the authority's own word that its log disagrees with its
	// checkpoints.
	Halted string `json:"halted,omitempty"`
}

func newAuditVerify(g *globals) *cobra.Command {
	var file, cpFile, keyFile string
	cmd := &cobra.Command{
		Use:   "verify [--file EXPORT --checkpoints FILE] [--key PUBKEY]",
		Short: "Walk the whole audit chain, recomputing every hash, and check it against the signed checkpoints",
		Long: `Reads the audit log from its first entry and recomputes each entry's hash
from its content and the previous entry's hash. An entry altered, removed or
reordered in the database breaks the chain there.

The chain alone cannot show a log rewritten by someone who also recomputed
every later hash. So the log is also checked against the authority's signed
checkpoints of its head (sequence, hash, time; signed with a key the database
does not hold): every checkpoint must sign the hash the log has at its
sequence, and the log must reach the last one. verify names the first
checkpoint the log disagrees with.

Online (the default) it reads the log and the checkpoints from the authority
(as an auditor: the whole log); --checkpoints adds checkpoints you kept
yourself (from 'airlock audit checkpoints --out' or a copy of the authority's
audit-checkpoints.jsonl), which a rewritten authority cannot take back.
Offline, --file EXPORT (from 'airlock audit export') with --checkpoints FILE
verifies with no authority at all. --key pins the checkpoint public key (a
PEM file: audit-checkpoint.key.pub from the authority's data directory);
without it every checkpoint must be signed by one key, the one the authority
reports online.

Exits 0 when the chain is unbroken and agrees with every checkpoint, 1 when
it does not.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file != "" && (cpFile == "" || keyFile == "") {
				return usageError{errors.New("--file: needs --checkpoints FILE and --key PUBKEY: an export checked against nothing but itself, or against checkpoints of a key you did not pin, proves nothing a rewriter could not recompute")}
			}
			var pinned ed25519.PublicKey
			if keyFile != "" {
				k, err := pki.LoadEd25519Public(keyFile)
				if err != nil {
					return usageError{fmt.Errorf("--key: %w", err)}
				}
				pinned = k
			}
			var cps []audit.Checkpoint
			if cpFile != "" {
				kept, err := readCheckpointFile(cpFile)
				if err != nil {
					return err
				}
				cps = kept
			}
			if file != "" {
				return checkLog(g, func(fn func(audit.Event) error) error { return eachExportedEvent(file, fn) }, cps, pinned, file, cpFile, "")
			}
			return withAuthority(g, func(client authorityv1.AuthorityServiceClient, _ *caller) error {
				page, served, err := fetchCheckpoints(cmd.Context(), client)
				if err != nil {
					return err
				}
				if pinned == nil && len(page.GetPublicKey()) == ed25519.PublicKeySize {
					pinned = ed25519.PublicKey(page.GetPublicKey())
				}
				return checkLog(g, func(fn func(audit.Event) error) error {
					return eachAuditEvent(cmd.Context(), client, &authorityv1.ListAuditEventsRequest{}, 0, func(e *authorityv1.AuditEvent) error {
						return fn(auditEvent(e))
					})
				}, append(cps, served...), pinned, file, cpFile, page.GetHalted())
			})
		},
	}
	cmd.Flags().StringVar(&file, "file", "", "verify this export (JSON lines from 'airlock audit export') offline, with no authority")
	cmd.Flags().StringVar(&cpFile, "checkpoints", "", "check against the signed checkpoints in FILE too (JSON lines, as the authority writes them)")
	cmd.Flags().StringVar(&keyFile, "key", "", "the checkpoint public key to pin (PEM), e.g. the authority's audit-checkpoint.key.pub")
	return cmd
}

// checkLog walks the log (an export's, or the authority's) against the
// checkpoints cps, pinned to a key when one is known, prints the report
// and turns what it found into the exit status; halted is the authority's
// own word that its log disagrees with its checkpoints.
func checkLog(g *globals, walk func(fn func(audit.Event) error) error, cps []audit.Checkpoint, pinned ed25519.PublicKey, file, cpFile, halted string) error {
	rep := verifyReport{Halted: halted}
	anchors, err := audit.NewAnchors(cps, pinned)
	if err != nil {
		return &exitError{code: 1, err: fmt.Errorf("checkpoints: %w", err)}
	}
	rep.Checkpoints = anchors.Total()
	if file != "" && rep.Checkpoints == 0 {
		return &exitError{code: 1, err: fmt.Errorf("--checkpoints %s: no checkpoints: nothing anchors the export", cpFile)}
	}
	if c, ok := anchors.Newest(); ok {
		rep.NewestCheckpoint = c.Time.UTC().Format(time.RFC3339)
	}
	if pinned != nil {
		rep.KeyID = pki.Ed25519KeyID(pinned)
	} else if len(cps) > 0 {
		rep.KeyID = cps[0].KeyID
	}
	err = verifyChain(walk, anchors, &rep)
	if err != nil && !errors.Is(err, errChainBroken) {
		return err
	}
	rep.Unbroken = err == nil
	if perr := g.Print(rep, func(w io.Writer) { printVerify(w, rep) }); perr != nil {
		return perr
	}
	switch {
	case rep.Disagrees != "":
		return &exitError{code: 1, err: fmt.Errorf("%w: %s", audit.ErrCheckpoint, rep.Disagrees)}
	case !rep.Unbroken:
		return &exitError{code: 1, err: fmt.Errorf("%w at sequence %d", errChainBroken, rep.BrokenAt)}
	case rep.Halted != "":
		return &exitError{code: 1, err: fmt.Errorf("the authority reports its log disagrees with its checkpoints: %s", rep.Halted)}
	}
	return nil
}

// verifyChain walks the log, checking the chain and the anchors, and fills
// rep; it returns errChainBroken when either fails.
func verifyChain(walk func(fn func(audit.Event) error) error, anchors *audit.Anchors, rep *verifyReport) error {
	v := audit.NewVerifier()
	fail := func(err error) error {
		var be *audit.BreakError
		var ce *audit.CheckpointError
		switch {
		case errors.As(err, &be):
			rep.BrokenAt, rep.Reason = be.Sequence, be.Reason
		case errors.As(err, &ce):
			rep.Disagrees = ce.Error()
		default:
			return err
		}
		return errChainBroken
	}
	err := walk(func(e audit.Event) error {
		if _, err := v.Check([]audit.Event{e}); err != nil {
			return fail(err)
		}
		if err := anchors.Entry(e); err != nil {
			return fail(err)
		}
		rep.Verified++
		rep.Head = e.Hash
		return nil
	})
	if err == nil {
		if err = anchors.End(); err != nil {
			err = fail(err)
		}
	}
	rep.Anchored, rep.AnchoredThrough = anchors.Matched(), anchors.LastAnchored()
	return err
}

func printVerify(w io.Writer, rep verifyReport) {
	switch {
	case rep.Disagrees != "":
		fmt.Fprintf(w, "audit log REWRITTEN: %s\n", termtext.Line(rep.Disagrees))
		fmt.Fprintf(w, "(the chain is self-consistent through %d entries: whoever changed it recomputed the hashes)\n", rep.Verified)
	case !rep.Unbroken:
		fmt.Fprintf(w, "audit chain BROKEN at sequence %d: %s (%d entries before it verified)\n", rep.BrokenAt, termtext.Line(rep.Reason), rep.Verified)
	default:
		fmt.Fprintf(w, "audit chain unbroken: %d entries, head %s\n", rep.Verified, termtext.Line(rep.Head))
		switch {
		case rep.Checkpoints == 0:
			fmt.Fprintln(w, "no signed checkpoints: the chain is only consistent with itself")
		case rep.AnchoredThrough < rep.Verified:
			fmt.Fprintf(w, "agrees with %d signed checkpoint(s) (key %s, newest signed %s) through sequence %d; the %d entries after it are not yet checkpointed\n",
				rep.Anchored, termtext.Line(rep.KeyID), rep.NewestCheckpoint, rep.AnchoredThrough, rep.Verified-rep.AnchoredThrough)
		default:
			fmt.Fprintf(w, "agrees with %d signed checkpoint(s) (key %s, newest signed %s) through its head\n", rep.Anchored, termtext.Line(rep.KeyID), rep.NewestCheckpoint)
		}
	}
	if rep.Halted != "" {
		fmt.Fprintf(w, "the authority reports: %s\n", termtext.Line(rep.Halted))
	}
}

// fetchCheckpoints reads every checkpoint the authority serves.
func fetchCheckpoints(ctx context.Context, client authorityv1.AuthorityServiceClient) (*authorityv1.ListAuditCheckpointsResponse, []audit.Checkpoint, error) {
	var (
		out  []audit.Checkpoint
		last *authorityv1.ListAuditCheckpointsResponse
	)
	req := &authorityv1.ListAuditCheckpointsRequest{PageSize: 1000}
	for {
		resp, err := client.ListAuditCheckpoints(ctx, req)
		if err != nil {
			return nil, nil, err
		}
		last = resp
		for _, c := range resp.GetCheckpoints() {
			out = append(out, audit.Checkpoint{Sequence: c.GetSequence(), Hash: c.GetHash(), Time: c.GetTime().AsTime(),
				KeyID: c.GetKeyId(), PublicKey: c.GetPublicKey(), Signature: c.GetSignature()})
		}
		n := len(resp.GetCheckpoints())
		if !resp.GetMore() || n == 0 {
			return last, out, nil
		}
		req.AfterSequence = resp.GetCheckpoints()[n-1].GetSequence()
	}
}

func readCheckpointFile(path string) ([]audit.Checkpoint, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, usageError{fmt.Errorf("--checkpoints: %w", err)}
	}
	defer f.Close()
	cps, _, err := audit.ReadCheckpoints(f)
	if err != nil {
		return nil, fmt.Errorf("--checkpoints %s: %w", path, err)
	}
	return cps, nil
}

// maxExportLine bounds one line of an export: entries are bounded, this
// is well above the largest.
const maxExportLine = 1 << 20

// eachExportedEvent reads an 'audit export' file, calling fn per event.
func eachExportedEvent(path string, fn func(audit.Event) error) error {
	f, err := os.Open(path)
	if err != nil {
		return usageError{fmt.Errorf("--file: %w", err)}
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), maxExportLine)
	for line := 1; sc.Scan(); line++ {
		if len(sc.Bytes()) == 0 {
			continue
		}
		e := &authorityv1.AuditEvent{}
		if err := protojson.Unmarshal(sc.Bytes(), e); err != nil {
			return fmt.Errorf("--file %s line %d: %v", path, line, err)
		}
		if err := fn(auditEvent(e)); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("--file %s: %w", path, err)
	}
	return nil
}

func newAuditCheckpoints(g *globals) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "checkpoints [--out FILE]",
		Short: "Write the authority's signed audit checkpoints as JSON lines, to keep for 'audit verify --checkpoints'",
		Long: `Writes every signed checkpoint of the audit log's head the authority serves,
oldest first, in the format of the authority's own checkpoint file. A monitor
that runs this now and then, and keeps what it got, can later prove a log
rewritten after that point: 'airlock audit verify --checkpoints FILE'.
With --out an existing FILE is extended with the checkpoints it lacks.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withAuthority(g, func(client authorityv1.AuthorityServiceClient, _ *caller) error {
				page, cps, err := fetchCheckpoints(cmd.Context(), client)
				if err != nil {
					return err
				}
				// Every one must be signed by the key the authority says it
				// uses; what is written is what verify will trust.
				if _, err := audit.NewAnchors(cps, ed25519.PublicKey(page.GetPublicKey())); err != nil {
					return &exitError{code: 1, err: fmt.Errorf("the authority served a checkpoint that does not verify: %w", err)}
				}
				if out == "" {
					for _, c := range cps {
						line, err := c.MarshalLine()
						if err != nil {
							return err
						}
						if _, err := termtext.Unwrap(g.Stdout).Write(line); err != nil {
							return err
						}
					}
					return nil
				}
				return appendCheckpoints(out, cps, g.Stderr)
			})
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "add to FILE (created when missing) the checkpoints it does not have yet")
	return cmd
}

// appendCheckpoints adds to path the checkpoints after its last one. What
// the file has is never rewritten.
func appendCheckpoints(path string, cps []audit.Checkpoint, progress io.Writer) error {
	var have []audit.Checkpoint
	if data, err := os.ReadFile(path); err == nil {
		if len(data) > 0 && data[len(data)-1] != '\n' {
			return fmt.Errorf("--out %s: its last line is torn (no newline); cut it off before adding to the file", path)
		}
		if have, err = readCheckpointFile(path); err != nil {
			return err
		}
	}
	// What the file has and what is served must be one series: one key,
	// and one hash for each sequence.
	if _, err := audit.NewAnchors(append(slices.Clone(have), cps...), nil); err != nil {
		return &exitError{code: 1, err: fmt.Errorf("--out %s: the checkpoints served and those kept are not of one key: %w", path, err)}
	}
	kept := map[int64]string{}
	for _, c := range have {
		kept[c.Sequence] = c.Hash
	}
	for _, c := range cps {
		if h, ok := kept[c.Sequence]; ok && h != c.Hash {
			return &exitError{code: 1, err: fmt.Errorf("--out %s: the authority now signs hash %s for sequence %d, the kept checkpoint says %s: its log was rewritten", path, c.Hash, c.Sequence, h)}
		}
	}
	var last int64
	if n := len(have); n > 0 {
		last = have[n-1].Sequence
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	added := 0
	for _, c := range cps {
		if c.Sequence <= last {
			continue
		}
		line, err := c.MarshalLine()
		if err == nil {
			_, err = f.Write(line)
		}
		if err != nil {
			f.Close()
			return err
		}
		added++
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	fmt.Fprintf(progress, "%d checkpoints added to %s (%d already there)\n", added, path, len(have))
	return nil
}
