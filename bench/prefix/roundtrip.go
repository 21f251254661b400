package main

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"time"

	"github.com/cxltier/cxltier/kernels"
	"github.com/cxltier/cxltier/prefix"
)

// RTResult is one block-size case of one path: put is store-and-publish,
// get is find-verify-copy-release, round trip is one then the other.
type RTResult struct {
	Path       string  `json:"path"` // host, paged (engine gather/scatter) or redis
	Tokens     int     `json:"tokens"`
	BlockBytes int64   `json:"block_bytes"`
	PutP50us   float64 `json:"put_p50_us"`
	PutP99us   float64 `json:"put_p99_us"`
	GetP50us   float64 `json:"get_p50_us"`
	GetP99us   float64 `json:"get_p99_us"`
	RTP50us    float64 `json:"round_trip_p50_us"`
	GBps       float64 `json:"round_trip_gb_per_s"` // 2 × block / round trip p50
	VsRedis    float64 `json:"speedup_vs_redis"`    // redis round trip p50 / this one, same block
}

// layers is the 8B-class model's layer count: a paged block is one chunk
// per layer for K and one for V.
const layers = 32

// timings collects per-round put and get latencies.
type timings struct{ put, get, rt []time.Duration }

func (t *timings) add(put, get time.Duration) {
	t.put, t.get, t.rt = append(t.put, put), append(t.get, get), append(t.rt, put+get)
}

func (t *timings) result(path string, tokens int, block int64) RTResult {
	res := RTResult{Path: path, Tokens: tokens, BlockBytes: block,
		PutP50us: pct(t.put, 50), PutP99us: pct(t.put, 99), GetP50us: pct(t.get, 50), GetP99us: pct(t.get, 99),
		RTP50us: pct(t.rt, 50)}
	res.GBps = 2 * float64(block) / (res.RTP50us * 1e3)
	return res
}

func pct(d []time.Duration, p int) float64 {
	s := slices.Clone(d)
	slices.Sort(s)
	return float64(s[min(len(s)-1, len(s)*p/100)].Nanoseconds()) / 1e3
}

func roundTripCases(o options, eng kernels.Engine, log io.Writer) ([]RTResult, string, error) {
	var size int64
	for _, tok := range o.tokens {
		size += 4 * int64(tok) * o.bytesPerToken
	}
	dev := fmt.Sprintf("shm:cxltier-bench-prefix-rt-%d", os.Getpid())
	r, c, err := formatShm(dev, size+size/4+16<<20)
	if err != nil {
		return nil, "", err
	}
	defer removeShm(r, c, dev)
	var out []RTResult
	for _, tok := range o.tokens {
		block := int64(tok) * o.bytesPerToken
		s, err := prefix.Create(c, prefix.Config{Name: fmt.Sprintf("rt%d", tok), Blocks: 4, BlockBytes: block, PinsPerClient: 64})
		if err != nil {
			return nil, "", err
		}
		fmt.Fprintf(log, "round trips of %d-token blocks (%d KiB)...\n", tok, block>>10)
		host, err := hostRounds(s, block, o.rounds)
		if err == nil {
			out = append(out, host.result("host", tok, block))
			var paged timings
			paged, err = pagedRounds(s, eng, block, o.rounds)
			out = append(out, paged.result("paged-"+eng.Name(), tok, block))
		}
		s.Close()
		if err != nil {
			return nil, "", err
		}
	}
	if o.redis == "" {
		return out, "skipped (-redis '')", nil
	}
	srv, err := startRedis(o.redis)
	if err != nil {
		fmt.Fprintf(log, "no Redis baseline: %v\n", err)
		return out, "missing: " + err.Error(), nil
	}
	defer srv.stop()
	for _, tok := range o.tokens {
		block := int64(tok) * o.bytesPerToken
		t, err := redisRounds(srv.addr, block, o.rounds)
		if err != nil {
			return nil, "", err
		}
		base := t.result("redis", tok, block)
		for i := range out {
			if out[i].Tokens == tok {
				out[i].VsRedis = base.RTP50us / out[i].RTP50us
			}
		}
		base.VsRedis = 1
		out = append(out, base)
	}
	return out, srv.version, nil
}

func randomBlock(n int64, seed uint64) []byte {
	b := make([]byte, n)
	rng := rand.New(rand.NewPCG(seed, 3))
	for i := 0; i+8 <= len(b); i += 8 {
		v := rng.Uint64()
		copy(b[i:], []byte{byte(v), byte(v >> 8), byte(v >> 16), byte(v >> 24), byte(v >> 32), byte(v >> 40), byte(v >> 48), byte(v >> 56)})
	}
	return b
}

// hostRounds puts a block from host memory under a fresh key and gets it
// back, every round; the first and last rounds compare the bytes.
func hostRounds(s *prefix.Store, block int64, rounds int) (timings, error) {
	src, dst := randomBlock(block, 1), make([]byte, block)
	var t timings
	for i := range rounds {
		k := []prefix.Key{benchKey(9, uint64(i))}
		t0 := time.Now()
		st, err := s.Set(k, [][]byte{src})
		t1 := time.Now()
		if err != nil || st[0] != prefix.Reserved {
			return t, fmt.Errorf("host put: %v %v", st, err)
		}
		n, err := s.Get(k, [][]byte{dst})
		t.add(t1.Sub(t0), time.Since(t1))
		if err != nil || n != 1 {
			return t, fmt.Errorf("host get: %d, %v (exists %d, %+v)", n, err, s.Exists(k), s.Stats())
		}
		if (i == 0 || i == rounds-1) && !bytes.Equal(src, dst) {
			return t, fmt.Errorf("host round %d: block came back different", i)
		}
	}
	return t, nil
}

// pagedRounds does the same from a paged pool: 2 × layers chunk buffers of
// two pages; page 0 goes out, comes back into page 1.
func pagedRounds(s *prefix.Store, eng kernels.Engine, block int64, rounds int) (timings, error) {
	var t timings
	l := prefix.Layout{ChunkBytes: block / (2 * layers)}
	if l.ChunkBytes%64 != 0 {
		return t, fmt.Errorf("a %d-byte block does not split into %d chunks of whole lines", block, 2*layers)
	}
	var want [][]byte
	for c := range 2 * layers {
		buf, err := eng.Alloc(2 * l.ChunkBytes)
		if err != nil {
			return t, err
		}
		defer buf.Free()
		l.Chunks = append(l.Chunks, kernels.Span{Buf: buf})
		want = append(want, randomBlock(l.ChunkBytes, uint64(c)))
		if err := eng.Upload(buf, 0, want[c]); err != nil {
			return t, err
		}
	}
	got := make([]byte, l.ChunkBytes)
	m, err := prefix.NewMover(s, eng, nil)
	if err != nil {
		return t, err
	}
	defer m.Close()
	for i := range rounds {
		k := []prefix.Key{benchKey(10, uint64(i))}
		t0 := time.Now()
		st, err := m.Put(k, l, []int64{0})
		t1 := time.Now()
		if err != nil || st[0] != prefix.Reserved {
			return t, fmt.Errorf("paged put: %v %v", st, err)
		}
		n, err := m.Get(k, l, []int64{1})
		t.add(t1.Sub(t0), time.Since(t1))
		if err != nil || n != 1 {
			return t, fmt.Errorf("paged get: %d, %v", n, err)
		}
		if i == 0 || i == rounds-1 {
			for c := range want {
				if err := eng.Download(got, l.Chunks[c].Buf, l.ChunkBytes); err != nil {
					return t, err
				}
				if !bytes.Equal(got, want[c]) {
					return t, fmt.Errorf("paged round %d: chunk %d came back different", i, c)
				}
			}
		}
	}
	return t, nil
}

// redisRounds is hostRounds through Redis: SET then GET of a fresh key.
func redisRounds(addr string, block int64, rounds int) (timings, error) {
	var t timings
	c, err := dialRedis(addr)
	if err != nil {
		return t, err
	}
	defer c.Close()
	src, dst := randomBlock(block, 1), make([]byte, block+2)
	for i := range rounds {
		key := fmt.Sprintf("kv:%d:%d", block, i)
		t0 := time.Now()
		if _, err := c.do("SET", key, src); err != nil {
			return t, err
		}
		t1 := time.Now()
		got, err := c.doInto(dst, "GET", key)
		t.add(t1.Sub(t0), time.Since(t1))
		if err != nil {
			return t, err
		}
		if (i == 0 || i == rounds-1) && !bytes.Equal(src, got) {
			return t, fmt.Errorf("redis round %d: block came back different", i)
		}
		if _, err := c.do("DEL", key); err != nil {
			return t, err
		}
	}
	return t, nil
}
