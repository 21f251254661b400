package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cxltier/cxltier/engram"
	"github.com/cxltier/cxltier/prefix"
	"github.com/cxltier/cxltier/tier"
)

const leaseTimeout = time.Second

// worker is one worker process; ops is its last reported count.
type worker struct {
	role     string
	cmd      *exec.Cmd
	mu       sync.Mutex
	ops      int64
	errs     int64     // errors tolerated under damage
	errsSeen int64     // of errs, already added to soak.errs
	seen     time.Time // last report
	fail     string
	done     chan struct{}
}

type soak struct {
	o        options
	device   string
	self     string
	geo      []byte
	log      io.Writer
	rng      *rand.Rand
	mu       sync.Mutex
	workers  []*worker
	dead     map[string]int64 // ops of replaced workers, by role
	kills    int
	daemon   *daemon
	restarts int
	damages  int   // bytes flipped
	errs     int64 // errors workers tolerated under damage
}

func run(args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	s := &soak{o: o, log: stderr, rng: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1)), dead: map[string]int64{},
		device: fmt.Sprintf("shm:cxltier-soak-%d", os.Getpid())}
	if s.self, err = os.Executable(); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "cxltier-soak")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	defer os.Remove(filepath.Join(tier.ShmDir, strings.TrimPrefix(s.device, "shm:")))
	if o.daemon == "" {
		o.daemon = filepath.Join(tmp, "cxltierd")
		fmt.Fprintln(stderr, "building cxltierd...")
		if out, err := exec.Command("go", "build", "-tags", daemonTags, "-o", o.daemon, "./cmd/cxltierd").CombinedOutput(); err != nil {
			return fmt.Errorf("build cxltierd (run from the repository root or give -daemon): %v\n%s", err, out)
		}
		s.o = o
	}
	if err := s.startDaemon(); err != nil {
		return err
	}
	defer s.stopDaemon()
	c, closeTier, err := s.setup()
	if err != nil {
		return err
	}
	defer closeTier()
	for role, n := range map[string]int{"prefix": o.prefixWorkers, "topk": o.topkWorkers, "engram": o.engramWorkers} {
		for range n {
			if err := s.startWorker(role); err != nil {
				return err
			}
		}
	}
	err = s.loop(c, stdout)
	s.stopWorkers()
	if err == nil {
		err = s.finalCheck(c, stdout)
	}
	return err
}

// setup attaches the supervisor and creates the shared prefix index and
// Engram table.
func (s *soak) setup() (*tier.Client, func(), error) {
	b, _ := tier.ParseBacking(s.device)
	r, err := tier.Open(tier.Options{Devices: []tier.Backing{b}})
	if err != nil {
		return nil, nil, err
	}
	c, err := r.Attach(tier.ClientOptions{Name: "soak"})
	if err != nil {
		r.Close()
		return nil, nil, err
	}
	done := func() { c.Close(); r.Close() }
	px, err := prefix.Create(c, prefix.Config{Name: prefixIndex, Blocks: prefixBlocks, BlockBytes: prefixBlock, Shards: prefixShards})
	if err != nil {
		done()
		return nil, nil, err
	}
	px.Close()
	g := soakGeometry()
	h, err := engram.NewHasher(g)
	if err == nil {
		_, err = engram.CreateTable(c, g, h, engramLayer, func(i int64, b []byte) error { engram.SyntheticRow(engramLayer, i, b); return nil }, nil)
	}
	if err != nil {
		done()
		return nil, nil, err
	}
	s.geo, _ = json.Marshal(g)
	return c, done, nil
}

func (s *soak) startWorker(role string) error {
	cmd := exec.Command(s.self)
	cmd.Env = append(os.Environ(), envRole+"="+role, envDevice+"="+s.device, envSeed+"="+strconv.FormatUint(s.rng.Uint64(), 10),
		envGeometry+"="+string(s.geo))
	if s.o.damageEvery > 0 {
		cmd.Env = append(cmd.Env, envDamage+"=1")
	}
	cmd.Stderr = s.log
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		return err
	}
	w := &worker{role: role, cmd: cmd, done: make(chan struct{}), seen: time.Now()}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			w.mu.Lock()
			if n, ok := strings.CutPrefix(line, "ops "); ok {
				w.ops, _ = strconv.ParseInt(n, 10, 64)
				w.seen = time.Now()
			} else if n, ok := strings.CutPrefix(line, "errs "); ok {
				w.errs, _ = strconv.ParseInt(n, 10, 64)
			} else if strings.HasPrefix(line, "fail ") {
				w.fail = line
			}
			w.mu.Unlock()
		}
		cmd.Wait()
		close(w.done)
	}()
	s.mu.Lock()
	s.workers = append(s.workers, w)
	s.mu.Unlock()
	return nil
}

// killOne SIGKILLs a random worker and starts another of its role.
func (s *soak) killOne() error {
	s.mu.Lock()
	i := s.rng.IntN(len(s.workers))
	w := s.workers[i]
	s.workers = append(s.workers[:i], s.workers[i+1:]...)
	s.mu.Unlock()
	w.cmd.Process.Signal(syscall.SIGKILL)
	<-w.done
	w.mu.Lock()
	s.mu.Lock()
	s.dead[w.role] += w.ops
	s.errs += w.errs - w.errsSeen // the killed worker's errors since the last tally
	s.kills++
	s.mu.Unlock()
	fail := w.fail
	w.mu.Unlock()
	if fail != "" {
		return fmt.Errorf("worker failed before it was killed: %s", fail)
	}
	return s.startWorker(w.role)
}

func (s *soak) stopWorkers() {
	s.mu.Lock()
	ws := s.workers
	s.workers = nil
	s.mu.Unlock()
	for _, w := range ws {
		w.cmd.Process.Signal(syscall.SIGKILL)
		<-w.done
	}
}

// totals are the operations of every worker so far, by role, and the
// first failure a live worker reported.
func (s *soak) totals() (map[string]int64, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := map[string]int64{}
	for role, n := range s.dead {
		t[role] = n
	}
	fail := ""
	for _, w := range s.workers {
		w.mu.Lock()
		t[w.role] += w.ops
		if w.fail != "" && fail == "" {
			fail = w.fail
		}
		select {
		case <-w.done:
			if fail == "" {
				fail = fmt.Sprintf("%s worker exited on its own (a panic?)", w.role)
			}
		default:
			// Workers report every 200 ms; silence this long is a hang.
			if quiet := time.Since(w.seen); quiet > 30*time.Second && fail == "" {
				fail = fmt.Sprintf("%s worker (pid %d) silent for %v: hung", w.role, w.cmd.Process.Pid, quiet.Round(time.Second))
			}
		}
		s.errs += w.errs - w.errsSeen
		w.errsSeen = w.errs
		w.mu.Unlock()
	}
	return t, fail
}
