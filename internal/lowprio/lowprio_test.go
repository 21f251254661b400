package lowprio

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestParsePolicy(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Policy
		err  error
	}{
		{"", Low, nil},
		{"low", Low, nil},
		{"idle", Idle, nil},
		{"normal", Normal, nil},
		{"Low", Normal, ErrBadPolicy},
		{"nice", Normal, ErrBadPolicy},
	} {
		got, err := ParsePolicy(tc.in)
		if !errors.Is(err, tc.err) || got != tc.want {
			t.Errorf("ParsePolicy(%q) = %v, %v; want %v, %v", tc.in, got, err, tc.want, tc.err)
		}
		if err == nil && got.String() != strings.ToLower(tc.in) && tc.in != "" {
			t.Errorf("%v.String() = %q", got, got.String())
		}
	}
}

// FuzzParsePolicy: a name comes from another process (CXLTIER_BULK_PRIORITY,
// the C ABI): any string is a policy that names itself back, or an error
// wrapping ErrBadPolicy.
func FuzzParsePolicy(f *testing.F) {
	for _, s := range []string{"", "low", "idle", "normal", "LOW", "low\x00", " idle"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParsePolicy(s)
		if err != nil {
			if !errors.Is(err, ErrBadPolicy) {
				t.Fatalf("ParsePolicy(%q): %v does not wrap ErrBadPolicy", s, err)
			}
			return
		}
		if back, err := ParsePolicy(p.String()); err != nil || back != p {
			t.Fatalf("ParsePolicy(%q) = %v, which parses back as %v, %v", s, p, back, err)
		}
	})
}

func TestStartRefusesBadArguments(t *testing.T) {
	if _, err := Start(0, Low); err == nil {
		t.Error("Start(0, Low): no error")
	}
	if _, err := Start(1, Policy(9)); !errors.Is(err, ErrBadPolicy) {
		t.Errorf("Start(1, Policy(9)): %v, want ErrBadPolicy", err)
	}
}

// thisThread is the calling thread's policy and nice value.
func thisThread(t *testing.T) (policy uint32, nice int32) {
	t.Helper()
	a, err := unix.SchedGetAttr(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	return a.Policy, a.Nice
}

// lowered counts this process's threads at nice 19 or SCHED_IDLE, from
// /proc/self/task/*/stat (its 19th field is the nice value, its 41st the
// policy), all but the main thread. A pool's goroutine may lock the main
// thread; when it ends, the runtime parks the main thread for good rather
// than end it (a process whose main thread exits is a zombie), so it
// stays lowered and runs nothing more.
func lowered(t *testing.T) (others int, main bool) {
	t.Helper()
	stats, err := filepath.Glob("/proc/self/task/*/stat")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // a thread that ended since the glob
		}
		// The fields after the command's closing parenthesis, from the 3rd.
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		nice, _ := strconv.Atoi(f[19-3])
		policy, _ := strconv.Atoi(f[41-3])
		switch {
		case nice != 19 && policy != unix.SCHED_IDLE:
		case filepath.Base(filepath.Dir(p)) == strconv.Itoa(os.Getpid()):
			main = true
		default:
			others++
		}
	}
	return others, main
}

func TestAPoolsThreadsAreLoweredAndEndWithIt(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("threads are lowered on Linux")
	}
	_, nice0 := thisThread(t)
	for _, tc := range []struct {
		policy     Policy
		wantPolicy uint32
		wantNice   int32
	}{
		{Low, unix.SCHED_NORMAL, 19},
		{Idle, unix.SCHED_IDLE, nice0},
	} {
		t.Run(tc.policy.String(), func(t *testing.T) {
			n, mainBefore := lowered(t)
			if n != 0 {
				t.Fatalf("%d threads lowered before the pool", n)
			}
			pl, err := Start(3, tc.policy)
			if err != nil {
				t.Fatal(err)
			}
			var ran atomic.Int32
			fns := make([]func(), 8)
			for i := range fns {
				fns[i] = func() {
					ran.Add(1)
					if p, n := thisThread(t); p != tc.wantPolicy || n != tc.wantNice {
						t.Errorf("work ran at policy %d nice %d, want %d, %d", p, n, tc.wantPolicy, tc.wantNice)
					}
				}
			}
			pl.Run(fns...)
			if ran.Load() != 8 {
				t.Fatalf("ran %d of 8", ran.Load())
			}
			if n, main := lowered(t); n+btoi(main && !mainBefore) != 3 {
				t.Errorf("%d threads lowered while the pool runs (the main thread newly: %v), want 3", n, main && !mainBefore)
			}
			if p, n := thisThread(t); p != unix.SCHED_NORMAL || n != nice0 {
				t.Errorf("the caller's thread is at policy %d nice %d after Run", p, n)
			}
			pl.Close()
			// A thread ends just after its goroutine: wait for it, boundedly.
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
				if n, _ := lowered(t); n == 0 {
					break
				}
			}
			if n, _ := lowered(t); n != 0 {
				t.Errorf("%d threads still lowered 5 s after Close: a lowered thread outlived its pool", n)
			}
			ran.Store(0)
			count := func() { ran.Add(1) }
			pl.Run(count, count) // closed: on the caller's goroutine
			if ran.Load() != 2 {
				t.Errorf("a closed pool ran %d of 2", ran.Load())
			}
		})
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
