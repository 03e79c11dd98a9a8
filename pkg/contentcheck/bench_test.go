package contentcheck

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

// benchPatch is a patch of about size bytes that adds ordinary code:
// files of 2,000 lines in which words the rules look for (key, token,
// secret, auth, password) are common, as are hex digests and base64, so
// the keyword filter passes fragments on to rules and the decoder has
// work, as in real code. It holds no secret.
func benchPatch(size int) []byte {
	var b strings.Builder
	for f := 0; b.Len() < size; f++ {
		lines := make([]string, 0, 2000)
		for i := range 2000 {
			var l string
			switch i % 10 {
			case 0:
				l = fmt.Sprintf("func handle%d(w http.ResponseWriter, r *http.Request) {", i)
			case 1:
				l = fmt.Sprintf("\tkey := r.Header.Get(\"X-Request-Key-%d\")", i)
			case 2:
				l = "\tif !auth.Check(ctx, key) { http.Error(w, \"no token\", 401); return }"
			case 3:
				l = fmt.Sprintf("\tsum := \"%s\" // sha256 of the fixture", randomString(uint64(f*2000+i), "0123456789abcdef", 64))
			case 4:
				l = fmt.Sprintf("\tfixture := \"%s\"", b64(fmt.Sprintf("ordinary fixture text number %d for the handler tests", i)))
			case 5:
				l = "\tpassword := cfg.Lookup(\"db.password\") // read from the secret store at run time"
			case 6:
				l = fmt.Sprintf("\tlog.Printf(\"request %%d served in %%v\", %d, time.Since(start))", i)
			case 7:
				l = "\tfor _, item := range items { total += item.Price * float64(item.Quantity) }"
			case 8:
				l = "\treturn json.NewEncoder(w).Encode(map[string]any{\"ok\": true, \"total\": total})"
			default:
				l = "}"
			}
			lines = append(lines, l)
		}
		b.WriteString(addFile(fmt.Sprintf("internal/handlers/h%03d.go", f), ModeFile, lines...))
	}
	return []byte(b.String())
}

// BenchmarkCheck10MBPatch measures the whole check of a 10 MB patch,
// without decoding and at the default depth, so the cost of the depth
// is the ratio of the two.
func BenchmarkCheck10MBPatch(b *testing.B) {
	patch := benchPatch(10 << 20)
	for _, depth := range []int{0, DefaultDecodeDepth} {
		b.Run(fmt.Sprintf("depth=%d", depth), func(b *testing.B) {
			c := checkerAt(b, depth)
			b.SetBytes(int64(len(patch)))
			b.ResetTimer()
			for range b.N {
				fs, err := c.Check(context.Background(), Policy{}, Input{Patch: patch})
				if err != nil {
					b.Fatal(err)
				}
				if len(fs) != 0 {
					b.Fatalf("findings in the benchmark's patch:%s", show(fs[:min(len(fs), 5)]))
				}
			}
		})
	}
}
