package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"time"

	"github.com/cxltier/cxltier/engram"
	"github.com/cxltier/cxltier/kernels"
	"github.com/cxltier/cxltier/prefix"
	"github.com/cxltier/cxltier/tier"
	"github.com/cxltier/cxltier/topk"
)

// What the supervisor tells a worker process.
const (
	envRole     = "CXLTIER_SOAK_ROLE"
	envDevice   = "CXLTIER_SOAK_DEVICE"
	envSeed     = "CXLTIER_SOAK_SEED"
	envGeometry = "CXLTIER_SOAK_GEOMETRY"
	envDamage   = "CXLTIER_SOAK_DAMAGE" // set: tolerate errors (the supervisor damages the index)
)

// The shared objects the supervisor creates.
const (
	prefixIndex  = "soak"
	prefixBlocks = 512
	prefixBlock  = 8 << 10
	prefixShards = 4 // the index is split, so kills and damage meet every shard's repair
	prefixKeys   = 3000
	engramLayer  = 1
)

// soakGeometry is a small Engram geometry (a few thousand rows).
func soakGeometry() engram.Geometry {
	g, _ := engram.Preset("demo")
	g.Name = "soak"
	g.LayerIDs = []int{engramLayer}
	for i := range g.BaseSizes {
		g.BaseSizes[i] = 500
	}
	return g
}

// payload is the deterministic content of prefix key i.
func payload(i int) []byte {
	sum := sha256.Sum256([]byte(strconv.Itoa(i)))
	n := 64 + int(binary.LittleEndian.Uint16(sum[:]))%(prefixBlock-64)
	b := make([]byte, n)
	for j := range b {
		b[j] = sum[j%32] ^ byte(j>>5)
	}
	return b
}

func prefixKey(i int) prefix.Key { return prefix.StringKey("soak-" + strconv.Itoa(i)) }

// runWorker attaches to the tier and runs role until killed, printing its
// cumulative operation count every 200 ms ("ops N").
func runWorker(role string, out io.Writer) error {
	b, err := tier.ParseBacking(os.Getenv(envDevice))
	if err != nil {
		return err
	}
	r, err := tier.Open(tier.Options{Devices: []tier.Backing{b}})
	if err != nil {
		return err
	}
	c, err := r.Attach(tier.ClientOptions{Name: "soak-" + role})
	if err != nil {
		return err
	}
	seed, _ := strconv.ParseUint(os.Getenv(envSeed), 10, 64)
	rng := rand.New(rand.NewPCG(seed, 11))
	tolerant := os.Getenv(envDamage) != ""
	var ops, errs int64
	step, err := openStep(role, c, rng, tolerant, out, &ops, &errs)
	if err != nil {
		return err
	}
	last := time.Now()
	for {
		n, err := step()
		switch {
		case errors.Is(err, tier.ErrLeaseLost):
			// Starved past the lease timeout (a loaded machine) and reaped
			// while alive: fenced, it attaches again, as a server would.
			fmt.Fprintf(os.Stderr, "soak %s worker %d: reaped while alive; attaching again: %v\n", role, os.Getpid(), err)
			if c, err = r.Attach(tier.ClientOptions{Name: "soak-" + role}); err != nil {
				return err
			}
			if step, err = openStep(role, c, rng, tolerant, out, &ops, &errs); err != nil {
				return err
			}
			continue
		case err != nil && (!tolerant || errors.Is(err, errWrongPayload)):
			return err
		case err != nil:
			errs++ // damage the index reports; a wrong payload never passes
			time.Sleep(time.Millisecond)
		}
		ops += int64(n)
		if time.Since(last) > 200*time.Millisecond {
			fmt.Fprintf(out, "ops %d\nerrs %d\n", ops, errs)
			last = time.Now()
		}
	}
}

// openStep opens what role works on through c and returns its step; under
// damage (tolerant) it retries an index that refuses to open.
func openStep(role string, c *tier.Client, rng *rand.Rand, tolerant bool, out io.Writer, ops, errs *int64) (func() (int, error), error) {
	for {
		var step func() (int, error)
		var err error
		switch role {
		case "prefix":
			step, err = prefixStep(c, rng)
		case "topk":
			step, err = topkStep(c, rng)
		case "engram":
			step, err = engramStep(c, rng)
		default:
			return nil, fmt.Errorf("unknown role %q", role)
		}
		if err == nil || !tolerant {
			return step, err
		}
		// Under damage the index may refuse to open: say so, try again.
		*errs++
		fmt.Fprintf(out, "ops %d\nerrs %d\n", *ops, *errs)
		time.Sleep(100 * time.Millisecond)
	}
}

// errWrongPayload is a read that returned bytes other than those stored:
// a failure under damage too.
var errWrongPayload = errors.New("payload differs from what was stored")

func prefixStep(c *tier.Client, rng *rand.Rand) (func() (int, error), error) {
	s, err := prefix.Open(c, prefixIndex)
	if err != nil {
		return nil, err
	}
	dst := [][]byte{make([]byte, prefixBlock)}
	return func() (int, error) {
		i := rng.IntN(prefixKeys)
		k := []prefix.Key{prefixKey(i)}
		switch op := rng.IntN(10); {
		case op < 5:
			dst[0] = dst[0][:cap(dst[0])]
			n, err := s.Get(k, dst)
			if err != nil {
				return 0, fmt.Errorf("get key %d: %w", i, err)
			}
			if n == 1 && !bytes.Equal(dst[0], payload(i)) {
				return 0, fmt.Errorf("get key %d: %d bytes: %w", i, len(dst[0]), errWrongPayload)
			}
		case op < 8:
			if _, err := s.Set(k, [][]byte{payload(i)}); err != nil && !errors.Is(err, prefix.ErrLost) {
				return 0, fmt.Errorf("set key %d: %w", i, err)
			}
		case op < 9:
			s.Exists(k)
		default:
			if _, err := s.Delete(k); err != nil && !errors.Is(err, prefix.ErrPinned) {
				return 0, fmt.Errorf("delete key %d: %w", i, err)
			}
		}
		return 1, nil
	}, nil
}

// topk worker: 4 requests, 2 layers, 16 of 64 slots selected per step.
func topkStep(c *tier.Client, rng *rand.Rand) (func() (int, error), error) {
	const layers, entry, slots, k, reqs = 2, 64, 64, 16, 4
	eng := kernels.NewCPU(1)
	p, err := topk.New(c, eng, nil, topk.Config{Layers: layers, EntryBytes: entry, Slots: slots, TopK: k, MaxRequests: reqs})
	if err != nil {
		return nil, err
	}
	ids := []int{0, 1, 2, 3}
	var tr *topk.Trace
	appended := make([]int64, reqs)
	restart := func() error {
		for _, req := range ids {
			p.Free(req) // not registered on the first call
			if err := p.Register(req, topk.Sequence{Layers: layers, EntryBytes: entry, Capacity: 256}); err != nil {
				return err
			}
			appended[req] = 0
		}
		tr, err = topk.NewTrace(topk.TraceConfig{Batch: reqs, Context: 100 + rng.Int64N(200), TopK: k, Overlap: 0.8, Seed: rng.Uint64()})
		return err
	}
	if err := restart(); err != nil {
		return nil, err
	}
	steps := 0
	out := make([]int32, reqs*k)
	return func() (int, error) {
		if steps++; steps%400 == 0 {
			if err := restart(); err != nil {
				return 0, err
			}
		}
		sel := tr.Next()
		lens := tr.Lens()
		for b, req := range ids {
			for l := range layers {
				var buf []byte
				for pos := appended[req]; pos < lens[b]; pos++ {
					buf = append(buf, topkEntry(req, l, pos, entry)...)
				}
				if err := p.Append(req, l, buf); err != nil {
					return 0, err
				}
			}
			appended[req] = lens[b]
		}
		for l := range layers {
			if _, err := p.Resolve(l, ids, lens, sel, out); err != nil {
				return 0, err
			}
			mem, _ := eng.Bytes(p.Buffer(l))
			for b, req := range ids {
				for i := range k {
					pos, slot := sel[b*k+i], out[b*k+i]
					row := p.Row(req, int(slot))
					if pos >= 0 && !bytes.Equal(mem[row*entry:(row+1)*entry], topkEntry(req, l, int64(pos), entry)) {
						return 0, fmt.Errorf("request %d layer %d: slot %d does not hold position %d: %w", req, l, slot, pos, errWrongPayload)
					}
				}
			}
		}
		return 1, nil
	}, nil
}

func topkEntry(req, layer int, pos, size int64) []byte {
	b := make([]byte, size)
	for i := int64(0); i < size; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], uint64(req)<<48^uint64(layer)<<40^uint64(pos)<<8^uint64(i))
	}
	return b
}

func engramStep(c *tier.Client, rng *rand.Rand) (func() (int, error), error) {
	var g engram.Geometry
	if err := json.Unmarshal([]byte(os.Getenv(envGeometry)), &g); err != nil {
		return nil, err
	}
	h, err := engram.NewHasher(g)
	if err != nil {
		return nil, err
	}
	t, err := engram.OpenTable(c.Region(), g, h, engramLayer, false)
	if err != nil {
		return nil, err
	}
	eng := kernels.NewCPU(1)
	// Half the workers plan on the engine (the Go twin of engram.cu).
	planner := engram.PlanHost
	if rng.IntN(2) == 0 {
		planner = engram.PlanEngine
	}
	pf, err := engram.NewPrefetcher(eng, c, h, []*engram.Table{t}, engram.PrefetchOptions{Slots: 2048, Cache: true, Planner: planner})
	if err != nil {
		return nil, err
	}
	buf, _ := pf.CacheBuffer(engramLayer)
	mem, _ := eng.Bytes(buf)
	want := make([]byte, g.RowBytes)
	return func() (int, error) {
		seqs := make([][]int64, 8)
		var rows []int64
		for b := range seqs {
			for range 4 {
				seqs[b] = append(seqs[b], rng.Int64N(g.Vocab))
			}
			rows, _ = h.Hash(rows, engramLayer, nil, seqs[b])
		}
		pd, err := pf.Prefetch(engramLayer, nil, seqs)
		if err != nil {
			return 0, err
		}
		if _, err := pd.Wait(); err != nil {
			return 0, err
		}
		for i, row := range rows {
			engram.SyntheticRow(engramLayer, row, want)
			s := int64(pd.Slots[i])
			if !bytes.Equal(mem[s*g.RowBytes:(s+1)*g.RowBytes], want) {
				return 0, fmt.Errorf("row %d in slot %d differs from the table: %w", row, s, errWrongPayload)
			}
		}
		return len(rows), nil
	}, nil
}
