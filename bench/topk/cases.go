package main

import (
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/cxltier/cxltier/kernels"
	"github.com/cxltier/cxltier/tier"
	"github.com/cxltier/cxltier/topk"
)

// measureEngine measures the three engine figures the baselines use, on a
// 256 MiB host range: random-row gather bandwidth, one-row launch floor,
// and bulk copy bandwidth.
func measureEngine(eng kernels.Engine, o options, rep *Report, log io.Writer) error {
	fmt.Fprintln(log, "measuring the engine...")
	const span = 256 << 20
	mem := make([]byte, span)
	id, err := eng.Register(mem)
	if err != nil {
		return err
	}
	defer eng.Unregister(id)
	const rows = 32768
	buf, err := eng.Alloc(max(rows*o.entry, 64<<20))
	if err != nil {
		return err
	}
	defer buf.Free()
	rng := rand.New(rand.NewPCG(5, 6))
	r := kernels.Rows{RowBytes: o.entry, Buf: buf}
	for range rows {
		r.Tier = append(r.Tier, kernels.At(id, rng.Int64N(span/o.entry)*o.entry))
	}
	d, err := median(9, func() error { return wait(eng.Gather(r)) })
	if err != nil {
		return err
	}
	rep.GatherGBps = float64(rows*o.entry) / d.Seconds() / 1e9
	one := kernels.Rows{RowBytes: o.entry, Buf: buf, Tier: r.Tier[:1]}
	if d, err = median(201, func() error { return wait(eng.Gather(one)) }); err != nil {
		return err
	}
	rep.LaunchFloor = float64(d.Nanoseconds()) / 1e3
	if b, ok := eng.(kernels.Baseline); ok {
		d, err = median(9, func() error { return b.BulkCopy(buf, 0, kernels.At(id, 0), 64<<20) })
		if err != nil {
			return err
		}
		rep.BulkGBps = float64(64<<20) / d.Seconds() / 1e9
	}
	return nil
}

func wait(h kernels.Handle, err error) error {
	if err != nil {
		return err
	}
	return h.Wait()
}

func median(n int, fn func() error) (time.Duration, error) {
	var d []time.Duration
	for range n {
		t := time.Now()
		if err := fn(); err != nil {
			return 0, err
		}
		d = append(d, time.Since(t))
	}
	slices.Sort(d)
	return d[n/2], nil
}

// runCases fills one tier with batch sequences of ctx tokens (one layer:
// latency is per layer) and runs every overlap on them.
func runCases(eng kernels.Engine, o options, planner topk.Planner, batch int, ctx int64, rep *Report, log io.Writer) ([]Result, error) {
	length := ctx + int64(o.warm+o.steps) + 1
	fmt.Fprintf(log, "batch %d, context %d, %v planner: appending %d entries per request...\n", batch, ctx, planner, length)
	b, _ := tier.ParseBacking("anon")
	g := tier.DefaultGeometry()
	chunkEntries := g.ChunkSize / o.entry
	g.DeviceSize = (int64(batch)*((length+chunkEntries-1)/chunkEntries)+64)*g.ChunkSize + 64<<20
	r, err := tier.Format(tier.Options{Devices: []tier.Backing{b}, Geometry: g})
	if err != nil {
		return nil, err
	}
	defer r.Close()
	c, err := r.Attach(tier.ClientOptions{Name: "bench-topk"})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	p, err := topk.New(c, eng, nil, topk.Config{Layers: 1, EntryBytes: o.entry, Slots: o.slots, TopK: o.k, MaxRequests: batch,
		Planner: planner, MaxContext: length})
	if err != nil {
		return nil, err
	}
	defer p.Close()
	var sel, slots kernels.Buffer // engine planning: selections and slots in engine memory
	reqs := make([]int, batch)
	block := make([]byte, 4096*o.entry)
	for req := range reqs {
		reqs[req] = req
		if err := p.Register(req, topk.Sequence{Layers: 1, EntryBytes: o.entry, Capacity: length}); err != nil {
			return nil, err
		}
		for n := int64(0); n < length; n += 4096 {
			if err := p.Append(req, 0, block[:min(4096, length-n)*o.entry]); err != nil {
				return nil, err
			}
		}
	}
	var out []Result
	if planner == topk.PlanEngine {
		if sel, err = eng.Alloc(int64(batch) * int64(o.k) * 4); err != nil {
			return nil, err
		}
		defer sel.Free()
		if slots, err = eng.Alloc(int64(batch) * int64(o.k) * 4); err != nil {
			return nil, err
		}
		defer slots.Free()
	}
	for _, ov := range o.overlaps {
		res, err := runCase(p, eng, o, reqs, ctx, ov, sel, slots)
		if err != nil {
			return nil, err
		}
		res.WholeLayerUs = float64(int64(batch)*ctx*o.entry) / (rep.BulkGBps * 1e3)
		res.BoundUs = rep.LaunchFloor + res.BytesPerStep/(rep.GatherGBps*1e3)
		res.VsBound = res.P50us / res.BoundUs
		out = append(out, res)
	}
	return out, nil
}

// runCase times the steps of one trace. With engine planning the
// selections are put in engine memory before each step's clock starts, as
// a sparse-attention indexer leaves them on the GPU, and the slots stay
// there.
func runCase(p *topk.Pool, eng kernels.Engine, o options, reqs []int, ctx int64, overlap float64, selBuf, outBuf kernels.Buffer) (Result, error) {
	tr, err := topk.NewTrace(topk.TraceConfig{Batch: len(reqs), Context: ctx, TopK: o.k, Overlap: overlap, Seed: uint64(ctx)})
	if err != nil {
		return Result{}, err
	}
	res := Result{Batch: len(reqs), Context: ctx, Overlap: overlap, Planner: p.Planner().String()}
	out := make([]int32, len(reqs)*o.k)
	var lat []time.Duration
	var bytes, hits, misses int64
	var plan time.Duration
	var steps [][]int32
	for s := range o.warm + o.steps {
		sel := tr.Next()
		if selBuf != nil {
			if err := eng.Upload(selBuf, 0, kernels.AsBytes(sel)); err != nil {
				return res, err
			}
		}
		t := time.Now()
		var st topk.Step
		if selBuf != nil {
			st, err = p.ResolveIn(0, reqs, tr.Lens(), kernels.Span{Buf: selBuf}, kernels.Span{Buf: outBuf})
		} else {
			st, err = p.Resolve(0, reqs, tr.Lens(), sel, out)
		}
		if err != nil {
			return res, err
		}
		if s >= o.warm {
			lat = append(lat, time.Since(t))
			bytes += st.Bytes
			plan += st.Plan
			hits += int64(st.Hits)
			misses += int64(st.Misses)
			steps = append(steps, sel)
		}
	}
	slices.Sort(lat)
	res.P50us = float64(lat[len(lat)/2].Nanoseconds()) / 1e3
	res.P99us = float64(lat[min(len(lat)-1, len(lat)*99/100)].Nanoseconds()) / 1e3
	res.BytesPerStep = float64(bytes) / float64(o.steps)
	res.PlanUs = float64(plan.Nanoseconds()) / 1e3 / float64(o.steps)
	res.HitRate = float64(hits) / float64(max(hits+misses, 1))
	nb, err := noBuffer(p, eng, o, reqs, tr.Lens(), steps)
	res.NoBufferUs = nb
	res.VsNoBuffer = nb / res.P50us
	return res, err
}

// noBuffer times (a): every selected entry of the step gathered into the
// layer's buffer in one call, with no slot table.
func noBuffer(p *topk.Pool, eng kernels.Engine, o options, reqs []int, lens []int64, steps [][]int32) (float64, error) {
	var lat []time.Duration
	for _, sel := range steps {
		rows, err := p.SelectionRows(0, reqs, sel)
		if err != nil {
			return 0, err
		}
		t := time.Now()
		if err := wait(eng.Gather(rows)); err != nil {
			return 0, err
		}
		lat = append(lat, time.Since(t))
	}
	slices.Sort(lat)
	return float64(lat[len(lat)/2].Nanoseconds()) / 1e3, nil
}
