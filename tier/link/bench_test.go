package link

import (
	"testing"
	"time"

	"github.com/cxltier/cxltier/internal/tiertest"
)

// BenchmarkTurn is what a bulk piece pays to look at the link with no
// claim due (64 slots, 8 of them held), against a piece's ~40 µs.
func BenchmarkTurn(b *testing.B) {
	r, c := tiertest.Format(b, 1, 16<<20, 64<<10)
	l, err := Open(c, Config{Name: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	for i := range 7 {
		o, err := Open(attach(b, r, "other"+string(rune('a'+i))), Config{Name: "bench"})
		if err != nil {
			b.Fatal(err)
		}
		defer o.Close()
		o.Claim(time.Now().Add(-time.Second)) // past: ignored, but read
	}
	b.ResetTimer()
	for range b.N {
		l.Turn(256 << 10)
	}
}

// BenchmarkClaim is what a deadline transfer pays to claim the link and
// end its claim.
func BenchmarkClaim(b *testing.B) {
	_, c := tiertest.Format(b, 1, 16<<20, 64<<10)
	l, err := Open(c, Config{Name: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	for range b.N {
		l.Claim(time.Now().Add(56 * time.Microsecond))
		l.Done(false)
	}
}
